/* fs_quant_kern.h -- the quantized products' ISA variants (fs_quant.h): which ones this build
 * has, what they read and their declarations. Internal to the core (and tests/c, which runs
 * the variants side by side); the extensions call fs_linear_q, which goes through fs_disp.
 *
 *   fs_quant_def.c    portable C, one output at a time (the reference of the others' bits)
 *   fs_quant_avx2.c   AVX2: vpmaddubsw with the sign trick (q8_0), nibbles as the unsigned
 *                     operand (q4_*)                                   (fs_quant_x86.inc)
 *   fs_quant_vnni.c   vpdpbusd on 8-column ymm vectors: AVX-VNNI (VEX, 16 registers) and
 *                     AVX512-VNNI (EVEX, 32 registers); AVX512-VNNI on 16-column zmm
 *                     vectors (pairs of panels, blocks of rows)        (fs_quant_x86.inc)
 *   fs_quant_amx.c    AMX-INT8 tiles (tdpbssd) for blocks of rows, AVX-512 for the scaling
 */
#ifndef FS_QUANT_KERN_H
#define FS_QUANT_KERN_H

#include "fs_common.h"
#include "fs_quant.h"

/* The x86 variants (explicit targets, like fs_variants.h's FS_LINF_SIMD). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__linux__) \
    && !defined(FS_NO_CLONES)
#define FS_Q_SIMD 1
#else
#define FS_Q_SIMD 0
#endif
/* AMX-INT8 intrinsics (GCC >= 11). */
#if FS_Q_SIMD && __GNUC__ >= 11
#define FS_Q_AMX 1
#else
#define FS_Q_AMX 0
#endif

/* Software prefetch this many bytes ahead of the weight block being read in a panel (the
 * panels of a stream lie one after another, and a model's matrices in forward order in its
 * arena, so the address runs on into what the stream reads next). Measured on an AMD EPYC
 * (Zen 5, 1 thread, the real SmolLM2 file, decode step medians, builds alternated): 4 blocks
 * (512 bytes for q4_*, 1 KiB for q8_0) -> 4 KiB, q4_1 6.4-7.5 -> 3.9-4.4 ms, q8_0 5.0-5.6
 * -> 4.5-5.2 ms; 2 KiB: q4_1 4.3-4.5 against 3.8-4.2 ms at 4 KiB; 8 KiB the same as 4. On the
 * Xeon (before the weight arena) 2 KiB ahead gave nothing and 6 KiB cost 12% for q4_1; for one
 * row, measured there again with the L2 prefetch below: FS_Q_PF_ONE_INTEL.
 * What a block prefetches covers the panel's bytes, its scales and mins included (pstep bytes
 * a block: FS_Q_PANEL_PSTEP). Before, it covered the weights only, and a q4_1
 * panel's scales and mins (a fifth of its bytes) came from memory on demand: measured on an
 * AMD EPYC (Zen 4, 1 thread, pinned, builds alternated), one row of a 1536 x 576 product
 * streamed from memory 48-51 -> 24-27 us (q8_0 42-61 -> 42-52), and the real SmolLM2 file's
 * decode step 9.9-10.3 -> 5.7-5.9 ms (q4_1) and 10.9-11.9 -> 7.2-7.5 ms (q8_0) medians. */
#ifndef FS_Q_PF_BYTES
#define FS_Q_PF_BYTES 4096
#endif

/* And this many bytes ahead into L2 (prefetcht1), the same share a block (fs_quant_x86.inc's
 * fs_qpf and fs_qz_pf). Measured on the Zen 4 EPYC (1 thread, pinned, builds alternated, two
 * rounds), without -> with (and only a panel's first tile of rows prefetching): one 1536 x 576
 * product streamed from memory, q8_0 1 row 40.3-44.8 -> 37.3-39.2 us, 4 rows 48.3 ->
 * 41.3-41.6, 8 rows (zmm pairs) 77.7-81.6 -> 50.6-51.0 (hot 48.5-49.1), 16 rows 103.3-104.5
 * -> 95.5-96.8; q4_1 1 row 22.1-24.3 -> 21.3-21.6; the real SmolLM2 file (context 64), q8_0
 * verify_8 13.3-14.2 -> 8.95-9.1 ms and verify_16 18.5-20.6 -> 17.2-17.4 ms, decode the same;
 * the forced AVX2 path the same within the noise. A build with 2 KiB into L1 and 8 KiB into
 * L2 did as well for 8 and 16 rows. */
#ifndef FS_Q_PF_FAR
#define FS_Q_PF_FAR 12288
#endif

/* One-row products (decode) on an Intel CPU prefetch this many bytes ahead into L1 and nothing
 * into L2 (fs_qact.pf_one, from fs_dispatch.qpf_one); elsewhere they prefetch as blocks do.
 * Measured on the Intel Xeon (Sapphire Rapids class, 1 thread, the decode step against a read
 * of as many bytes, bench/_quant.py's decode_vs_stream, builds alternated, two rounds of
 * three): 4 KiB into L1 and 12 KiB into L2 (as blocks) -> 2 KiB into L1 alone, the real
 * SmolLM2 file q4_1 0.85-0.89 -> 0.98-1.01 of the stream bound, q8_0 0.88-0.97 -> 0.94-1.03;
 * the Qwen3-0.6B shape q4_1 0.76-0.78 -> 0.85-0.88, q8_0 0.85-0.88 -> 0.89-0.90. 4 KiB alone:
 * 0.94-1.04, 0.91-0.96, 0.83-0.86, 0.86-0.87; 1 KiB alone: 0.93-0.96, 0.94-0.98, 0.79-0.80,
 * 0.84-0.88; no prefetch at all: Qwen3 q4_1 0.67-0.69 (docs/PERFORMANCE.md). The L2 prefetch
 * at one row is what cost (`perf`: 68% of the q4_1 kernel's samples on the prefetch
 * instructions at the Qwen3 shape; a guess: they wait for fill buffers whatever their level).
 * Not applied to AMD CPUs, where 4 KiB beat 2 KiB (Zen 5, decode, before the L2 prefetch) and
 * the L2 prefetch left the decode step as it was (Zen 4): untested there. Define FS_Q_PF_ONE
 * to force a distance on every CPU (0: as blocks). */
#define FS_Q_PF_ONE_INTEL 2048

/* Fewest rows for which the amx path runs its tiles (fewer: AVX512-VNNI). Measured on a
 * Xeon (Sapphire Rapids class, 1 core, the real SmolLM2 file, context 300, verify cost in
 * decode steps, builds alternated): from 6 rows -> from 2 rows, q4_1 verify_2 1.12-1.16 ->
 * 1.05-1.10 and verify_4 1.33-1.35 -> 1.15-1.17; q8_0 verify_4 1.21-1.23 -> 1.11-1.13.
 * In the model the weights come from memory, and the tiles (with the next panel pair
 * prefetched) keep the stream going better; with the weights hot in L2 the VNNI kernel is
 * faster up to 4-5 rows (q8_0, us a layer: 2 rows 87 vs 146). One row stays on VNNI (AMX
 * there: within the noise of the decode step). */
#ifndef FS_Q_AMX_MIN_ROWS
#define FS_Q_AMX_MIN_ROWS 2
#endif
#ifndef FS_Q_AMX_MIN_ROWS_Q4
#define FS_Q_AMX_MIN_ROWS_Q4 2
#endif
/* The most blocks a row may have on the AMX tiles (16384 inputs: the limit of the activation
 * scales by block when they were on the stack, now on the heap; not measured beyond it);
 * longer rows run the path's qpart_mid (avx512_vnni_x16) from
 * FS_Q_X16_MIN_ROWS rows, else its qpart (fs_qpart_amx itself, called directly, falls back
 * to AVX512-VNNI, which reads the interleaved copies). */
#define FS_Q_AMX_MAX_NB 512

/* Fewest rows for which the AVX512-VNNI path runs its 16-column zmm tiles of panel pairs
 * (fewer: the 8-column ymm tiles, whose stream of single panels keeps the weights coming
 * better where the arithmetic is light). Measured on an AMD EPYC (Zen 5, 1 thread, the real
 * SmolLM2 file, context 100, step medians in ms, ymm -> zmm, builds alternated, 3 rounds):
 * q4_1 1 row 3.9-4.6 -> 4.6-5.5, 3 rows 4.95-6.5 -> 4.7-4.9, 4 rows 5.3-5.6 -> 4.4-4.9, 5 rows
 * 6.0-6.35 -> 4.7-5.25; q8_0 4 rows 5.4-5.5 -> 5.9-6.0, 5 rows 6.3-6.5 -> 6.85-7.0 (another
 * round: equal), 6 rows 6.5-6.8 -> 5.6-6.0, 7 rows 7.4-7.6 -> 5.65-6.1.
 * Once the 8-column tiles prefetched their panels' scales and mins (FS_Q_PF_BYTES), q4_*
 * moved from 3 rows to 5: measured on an AMD EPYC (Zen 4, 1 thread, pinned, the real SmolLM2
 * file, context 64, verify cost in decode steps, two rounds, zmm from 3 rows -> ymm up to 16):
 * 3 rows 1.55-1.65 -> 1.29-1.32, 4 rows 1.66-1.71 -> 1.55-1.57, 5 rows 1.73-1.85 ->
 * 1.78-1.82, 6 rows 1.93-1.96 -> 2.01-2.09, 8 rows 2.12-2.25 -> 2.39-2.53. q8_0 there: 6 rows
 * ymm 5% faster, 8 rows zmm 10% faster; left at 6. Not measured again on the Zen 5. */
#ifndef FS_Q_X16_MIN_ROWS
#define FS_Q_X16_MIN_ROWS 6
#endif
#ifndef FS_Q_X16_MIN_ROWS_Q4
#define FS_Q_X16_MIN_ROWS_Q4 5
#endif

/* The panels (or pairs of panels) of a call run in FS_QSTREAMS interleaved streams: unit 0,
 * then the first unit of the second part, ..., then unit 1, ...: a few sequential reads keep
 * the weight stream going better than one. Measured on the Xeon (1 thread, the real SmolLM2
 * file, decode step medians, builds alternated): one stream -> two, q4_1 10.5-10.6 -> 9.7-9.9
 * ms, q8_0 14.3-14.5 -> 13.1-13.6 ms (the forced AVX2 path: q4_1 10.4 -> 9.5-10.2, q8_0
 * 14.3-14.5 -> 13.7-14.0); three and four streams gave less than two. Any order gives the
 * same bits: a panel's columns are its own. */
#ifndef FS_QSTREAMS
#define FS_QSTREAMS 2
#endif
/* Except that a one-row product on an Intel CPU (fs_qact.pf_one) of rows of at least this many
 * inputs reads its panels in one stream, in order. Measured on the Intel Xeon (Sapphire Rapids
 * class, 1 thread, decode_vs_stream as for FS_Q_PF_ONE_INTEL, builds alternated, two rounds of
 * three, two streams -> one from 1024 inputs): the Qwen3-0.6B shape q8_0 0.88-0.89 ->
 * 0.93-0.95 of the stream bound, q4_1 0.84-0.85 -> 0.85-0.86; the real SmolLM2 file (only its
 * 1536-input down projection changes) q8_0 0.96-1.01 -> 0.99-1.01, q4_1 0.99-1.06 ->
 * 1.00-1.02. One stream for every width: the real file q4_1 0.92-0.94 against 0.98-1.01. */
#define FS_Q_ONE_STREAM_MIN_IN 1024
/* And such a product (one row, pf_one set, at least FS_Q_ONE_STREAM_MIN_IN inputs) runs the
 * path's zmm tiles of panel pairs (fs_dispatch.qpart_one_wide: avx512_vnni_x16, pairs in order,
 * one stream, prefetching like the ymm tiles' one row) where the path has them. Measured on the
 * Intel Xeon (1 thread, decode_vs_stream, builds alternated, rounds of three; fraction of the
 * stream bound, ymm -> zmm pairs): the Qwen3-0.6B shape q4_1 0.86-0.88 -> 0.91-0.93, q8_0
 * 0.91-0.92 -> 0.95-0.96; the real SmolLM2 file (only its 1536-input down projection changes)
 * q4_1 0.97-1.05 -> 0.98-1.03 (five rounds), q8_0 0.94-0.97 -> 0.96-1.04. The zmm pairs for
 * one row at every width: the real file q4_1 0.93-0.96 against 0.99-1.02; on a Zen 5 they were
 * slower at one row of the real file too (AMD CPUs do not set pf_one). */
#define FS_Q_USE_ONE_WIDE(n, in, pf_one) \
    ((n) == 1 && (pf_one) > 0 && (in) >= FS_Q_ONE_STREAM_MIN_IN)
/* A one-row q8_0 product of a matrix of at least this many packed bytes, on a CPU whose
 * one-row products prefetch as blocks do (fs_qact.pf_one 0: not Intel), runs the VNNI ymm
 * tile's eight k steps a block two at a time in a loop instead of fully unrolled
 * (fs_qact.stream): the weights then come from beyond L2 (a decode step of a model larger than
 * the L3), where the unrolled block streamed slower. Measured on an AMD EPYC (Zen 4, 1 thread,
 * default build; docs/PERFORMANCE.md, 2026-12-06): the Qwen3-0.6B shape's q8_0 decode step on
 * the avx512bf16 path against the avx2 path in one process (paths alternated), 1.08-1.19 times
 * as long unrolled (nine runs), 0.98-1.03 with the steps in a loop (five runs: as with the
 * AVX2 tile); the real SmolLM2 file 0.99-1.13 -> 0.98-1.03 (not established). Hot in L2
 * (576 x 1536) one row took 24-25 us unrolled and 31-32 us with the steps two at a time, so
 * smaller matrices (all of the embedded models', whose decode step reads 3 MB from L3: 121-126
 * against 141-142 us with the loop everywhere) stay unrolled. Same bits: the same exact
 * integer sums. */
#ifndef FS_Q_STREAM_MIN_BYTES
#define FS_Q_STREAM_MIN_BYTES (512 * 1024)
#endif

/* Slots of N units in S streams, and the unit slot I runs (-1: a hole of the last). */
#define FS_Q_STREAM_SLOTS(N, S) ((S) * (((N) + (S) - 1) / (S)))
#define FS_Q_STREAM_UNIT(I, N, S)                                              \
    ((I) / (S) + (I) % (S) * (((N) + (S) - 1) / (S)) < (N)                     \
         ? (I) / (S) + (I) % (S) * (((N) + (S) - 1) / (S))                     \
         : -1)

/* Blocks of activations with amax below this (2^-96) quantize to zero (fs_quant.h). */
#define FS_Q_TINY 1.2621774483536188887e-29f

/* The quantized activations of n rows (fs_quant_rows, done once per product). */
typedef struct fs_qact {
    const int8_t *q;    /* (n, in) */
    const uint8_t *qu;  /* (n, in) q + 128 (the unsigned operand of vpdpbusd for q8_0) */
    const float *d;     /* (n, nb) scales */
    const float *ds;    /* (n, nb) d * (float)s, q4_1's min factor */
    const int32_t *s;   /* (n, nb) exact block sums */
    int n, in, nb;
    /* The same, block-interleaved (fs_quant_interleave; the x86 variants read these): block b
     * of row r at (b * n + r) * 32 of qi / qui, and at b * n + r of dt / dst / st. For one row
     * that is the row-major layout: they may point at q ... s. */
    const int8_t *qi;
    const uint8_t *qui;
    const float *dt, *dst;
    const int32_t *st;
    /* set only for a product of one row: > 0, its tiles prefetch this many bytes ahead into L1
     * and nothing into L2 (FS_Q_PF_ONE_INTEL); 0: as blocks (FS_Q_PF_BYTES, FS_Q_PF_FAR) */
    int pf_one;
    /* set only for a one-row q8_0 product of at least FS_Q_STREAM_MIN_BYTES on a CPU without
     * pf_one: the VNNI tiles run their block's k steps two at a time (FS_Q_STREAM_MIN_BYTES) */
    int stream;
} fs_qact;

/* Fill a's interleaved copies (qi ... st, n * in bytes and n * nb values each, which a's
 * pointers must name) from its row-major arrays; qui only with_unsigned. */
void fs_quant_interleave(const fs_qact *a, int with_unsigned);

/* Whether a product of n rows of nb blocks runs a path's big kernel (qpart_big): from `rows`
 * rows (its qbig_rows for the kind) and for rows of at most max_nb blocks (qbig_max_nb). The
 * dispatch (fs_linear_q_many) and the names (fs_isa_quant_kernel, which fs_quant_kernel_name
 * asks for the current path) follow this one rule. */
#define FS_Q_USE_BIG(n, nb, rows, max_nb) ((n) >= (rows) && (nb) <= (max_nb))
/* Where big does not run: whether the path's mid kernel (qpart_mid) does, from mid_rows rows
 * (qmid_rows for the kind), else qpart; the same two callers follow it. */
#define FS_Q_USE_MID(n, mid_rows) ((n) >= (mid_rows))

/* Panel layout (fs_quant.h), as macros: the tiles ask per call (as functions of fs_quant.c,
 * out of line, the calls took ~1.5% of a 16-row q8_0 step's samples on the forced AVX2 path,
 * Intel Xeon). x rounded up to a multiple of 64: */
#define FS_Q_UP64(x) (((size_t)(x) + 63) / 64 * 64)
/* byte offset of qs in a panel of nb blocks */
#define FS_Q_PANEL_QS(kind, nb) (FS_Q_UP64((size_t)(nb) * 16) * ((kind) == FS_Q4_1 ? 2 : 1))
/* byte offset of q4_1's mins */
#define FS_Q_PANEL_M(nb) FS_Q_UP64((size_t)(nb) * 16)
/* a panel's bytes (fs_quant_panel_bytes) for rows of in inputs */
#define FS_Q_PANEL_BYTES(kind, in)                  \
    (FS_Q_PANEL_QS(kind, (in) / FS_Q_BLOCK)         \
     + (size_t)((in) / FS_Q_BLOCK) * ((kind) == FS_Q8_0 ? 256 : 128))
/* A panel's bytes over its blocks, rounded up: what a tile prefetches a block (FS_Q_PF_BYTES). */
#define FS_Q_PANEL_PSTEP(kind, in) \
    ((FS_Q_PANEL_BYTES(kind, in) + (size_t)((in) / FS_Q_BLOCK) - 1) / (size_t)((in) / FS_Q_BLOCK))

/* The activation rule (fs_quant.h's fs_quant_rows): plain C, and AVX2 (the same bytes). */
void fs_quant_rows_ref(const float *x, int n, int in, int8_t *q, float *d, int32_t *s);
#if FS_Q_SIMD
void fs_quant_rows_avx2(const float *x, int n, int in, int8_t *q, float *d, int32_t *s);
#endif

/* Every variant: the output columns of panels [g_lo, g_hi) of y (n, out) for all n rows, with
 * the same per-output arithmetic (fs_quant.h); no bias. */
#define FS_QPART_DECLARE(SFX)                                                                  \
    void fs_qpart_##SFX(int kind, const fs_qact *a, const uint8_t *P, float *y, int out,       \
                        int g_lo, int g_hi, int accumulate);
FS_QPART_DECLARE(def)
#if FS_Q_SIMD
FS_QPART_DECLARE(avx2)
FS_QPART_DECLARE(avxvnni)
FS_QPART_DECLARE(avx512vnni)
FS_QPART_DECLARE(avx512vnni16)
#endif
#if FS_Q_AMX
FS_QPART_DECLARE(amx)
#endif

#endif /* FS_QUANT_KERN_H */
