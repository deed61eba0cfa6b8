/* fs_variants.h -- the ISA variants behind fs_isa.h's dispatch table: which ones this build
 * has, their declarations and the tunables the variant files share. Internal to the core (and
 * tests/c, which runs the variants side by side); the extensions call the entry points of
 * fs_linear.h and fs_attention.h, which go through fs_disp.
 *
 * Each variant lives in its own file, compiled once with its target attribute on every
 * function (never -march: the wheel runs on any x86-64):
 *
 *   fs_linear_def.c, fs_linear_avx2.c, fs_linear_avx512.c   packed float products
 *                                                             (fs_linear_f32.inc, 3 weight types)
 *   fs_linear_amx.c                                          bf16 products on AMX tiles
 *   fs_attention_def.c, fs_attention_avx2.c,                 tiled float attention blocks
 *   fs_attention_avx512.c                                    (fs_attention_f32.inc)
 */
#ifndef FS_VARIANTS_H
#define FS_VARIANTS_H

#include "fs_common.h"

/* ---- which variants exist ---------------------------------------------------------------- */

/* AVX2 and AVX-512 products (explicit targets; the float16 ones need F16C, which
 * target_clones cannot add to its "avx2" clone). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__linux__) \
    && !defined(FS_NO_CLONES)
#define FS_LINF_SIMD 1
#else
#define FS_LINF_SIMD 0
#endif

/* The AMX kernel (GCC >= 11 on x86-64 Linux); it runs only when fs_isa.h reports AMX with the
 * tile-data grant. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) \
    && defined(__linux__) && !defined(FS_NO_CLONES)
#define FS_AMX_BUILD 1
#else
#define FS_AMX_BUILD 0
#endif
/* The AVX512-BF16 kernel (fs_linear_bf16dp.c): the same compilers; it runs only when fs_isa.h
 * reports AVX512-BF16. */
#define FS_BF16DP_BUILD FS_AMX_BUILD

/* AVX2 and AVX-512 float attention blocks (else the build's own target only: 8 lanes when it
 * is AVX2 without AVX-512, 16 otherwise). */
#if FS_HAVE_VEC && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) \
    && defined(__linux__) && defined(__GLIBC__) && !defined(FS_NO_CLONES) && !defined(__AVX512F__)
#define FS_ATTN_VARIANTS 1
#else
#define FS_ATTN_VARIANTS 0
#endif

/* ---- packed float products (fs_linear_f32.inc) ------------------------------------------- */

/* Most rows of x in one register tile of the double kernel (fs_linear.c). */
#define FS_LIN_MAXR 10
#ifndef FS_LIN_KB
#define FS_LIN_KB 32
#endif
/* Software prefetch this many tiles ahead along the rows of W (double kernel; measured: ~15%
 * off a 9-row product whose weights come from L3/DRAM). */
#ifndef FS_LIN_PF_TILES
#define FS_LIN_PF_TILES 2
#endif

/* Packed float kernels (fs_linear_f32.inc): the panel width in columns, 6 ymm or 3 zmm of
 * float lanes (fs_pack_strided's layout). */
#define FS_LIN_PW 48
/* Width of the panel at c0 when out - c0 < FS_LIN_PW columns are left (the last panel): a
 * multiple of 16, so that a width like 256 streams no zero padding (with 48-column panels it
 * streamed 12% more bytes, measured 6-8% on a bandwidth-bound decode step). */
#define FS_LIN_TAIL_WIDTH(rem) ((rem) >= FS_LIN_PW ? FS_LIN_PW : ((rem) + 15) / 16 * 16)
/* Threads split a product's columns into chunks whose bounds are multiples of this (a whole
 * number of the packed float kernels' panels, so every chunk runs whole tiles). */
#ifndef FS_LIN_CHUNK_ALIGN
#define FS_LIN_CHUNK_ALIGN 48
#endif
/* Products with at least this many weights are split between the pool's threads (fs_pool.h;
 * fs_linear.c and fs_quant.c size the chunks); smaller ones run on the caller. Measured on the
 * Xeon guest (2026-12-02): at 65536 the embedded target's decode step (products of 256 x 704
 * and less, cache-resident) took 0.35 ms at 2 threads against 0.22 ms at 1; at 262144 the two
 * are equal, and the SmolLM-135M shape's step still gains (17.0 -> 12.9 ms, bf16). */
#ifndef FS_LIN_PARALLEL_MIN
#define FS_LIN_PARALLEL_MIN 262144
#endif
/* A block of this many rows is compute bound: its products are split from
 * FS_LIN_PARALLEL_MACS multiply-adds (in x out x rows), not FS_LIN_PARALLEL_MIN weights, in
 * chunks down to one column group. Measured on the Xeon guest (2026-12-02, 2 threads): the
 * SmolLM-135M shape's 576 x 576 product at 16 rows (bf16, forced AVX2) gained 1.28x in 3
 * chunks of 4 groups and 1.60x in chunks of one, its 576 x 192 ones 1.51x (serial before);
 * the embedded target's 4-row block (products of 256 x 704 and less: 0.72M multiply-adds)
 * went from 1.3 to 2.0 decode steps when split, so the bar was 4x the weights'. Since blocks
 * keep the pool's workers awake (FS_KEEP_MIN_ROWS, fs_model.c) it is the weights' number of
 * multiply-adds (so from 4 rows a product of 65536 weights splits, below 4 rows one of
 * 262144): the embedded target's steps at 2 threads (Xeon guest, 2026-12-05, medians of 15
 * rounds, two processes a build) float16 forced avx2 6 rows 0.58-0.59 -> 0.48-0.49 ms, 8 rows
 * 0.66 -> 0.55, amx 6 rows 0.40-0.42 -> 0.31-0.35; q8_0 forced avx2 6 rows 0.50-0.54 ->
 * 0.39-0.43, amx 6 rows 0.28-0.31 -> 0.27-0.28 but 4 rows 0.22-0.25 -> 0.26-0.27 (and 16
 * rows 0.51-0.55 -> 0.55). The SmolLM-135M shape's 576 x 192 products (k, v) now split from 4
 * rows too: its 4- to 16-row steps (bf16, amx and forced avx2) and the real SmolLM2 file's
 * (q8_0) were the same or 1-7% faster. Products of 262144 weights or more split as before. */
#ifndef FS_LIN_ROWS_COMPUTE
#define FS_LIN_ROWS_COMPUTE 4
#endif
#ifndef FS_LIN_PARALLEL_MACS
#define FS_LIN_PARALLEL_MACS ((size_t)FS_LIN_PARALLEL_MIN)
#endif
/* A chunk's cost counts at most this many rows of a block (fs_lin_chunks): counted in full, a
 * 16-row block's chunk held one column group, 2-3 us, and the big products (gate, up, the head)
 * were cut into twice as many chunks as now, each claimed and each starting its stream cold.
 * In-process A/B at 2 threads (Zen 4 EPYC KVM guest, medians of 9-11 rounds, SmolLM-135M
 * shape, 4 / 8 / 16-row steps): bf16 9.79 / 10.84 / 16.84 -> 9.33 / 10.53 / 16.31 ms, forced
 * avx2 bf16 10.22 / 16.48 / 28.56 -> 9.95 / 16.23 / 27.76, float16 9.04 / 12.90 / 24.80 ->
 * 8.89 / 12.42 / 24.22, float32 16.81 / 17.21 / 29.88 -> 16.93 / 17.26 / 28.92; beside a busy
 * loop bf16 13.76 / 17.17 / 29.59 -> 13.93 / 16.94 / 29.05. Products of up to 576 columns are
 * cut as before (one group a chunk). */
#ifndef FS_LIN_CHUNK_ROWS
#define FS_LIN_CHUNK_ROWS 4
#endif
/* Whether an (in, out) product of n rows is worth splitting between threads. */
#define FS_LIN_PARALLEL(in, out, n)                                               \
    ((n) >= FS_LIN_ROWS_COMPUTE                                                   \
         ? (size_t)(in) * (size_t)(out) * (size_t)(n) >= FS_LIN_PARALLEL_MACS     \
         : (size_t)(in) * (size_t)(out) >= FS_LIN_PARALLEL_MIN)
/* Rows of one register tile of a block (AVX2: 4 rows x 3 ymm + 3 weights + 1 broadcast fill
 * the 16 ymm; AVX-512: 8 rows x 3 zmm, 24 of the 32). */
#ifndef FS_LINF_MR_AVX2
#define FS_LINF_MR_AVX2 4
#endif
#ifndef FS_LINF_MR_AVX512
#define FS_LINF_MR_AVX512 8
#endif
/* k blocks of a block of several row groups: this many bytes of weights per panel (a block
 * of one panel stays in L1 while every group sweeps it: 128 k steps of float32, 256 of
 * 16-bit weights). */
#ifndef FS_LIN_KB_BYTES
#define FS_LIN_KB_BYTES 24576
#endif
/* Software prefetch this many bytes ahead in each panel stream (rounded up to whole k
 * steps; measured with 32-column panels on a 9-row product from L3: ~20% off without it). */
#ifndef FS_LIN_PF_BYTES
#define FS_LIN_PF_BYTES 1024
#endif
/* The AVX2 float32 kernel's distance for one row (decode): 384 bytes per panel stream
 * (measured on Zen 3 with 32-column panels, the SmolLM-shape float32 decode products: 0.71-0.78
 * of a two-stream dot's rate at 1 KiB, 0.90-0.96 at 384 B; 16-bit weights were best at 1 KiB
 * among 64 B - 2 KiB). */
/* The AVX-512 kernels' distance (one and more rows): 4 KiB. Measured on an AMD EPYC Zen 5
 * (1 thread, bench/test_bench_linear.py's layer products streamed from memory, builds
 * alternated, 3 runs each): 1 KiB -> 4 KiB, bf16 and f16 1 row 1.06-1.12 -> 0.81-0.86 ms,
 * 2 rows 1.35-1.42 -> 0.90-0.96 ms, 4 rows 1.48-1.55 -> 0.98-1.03 ms; f32 2 and 4 rows
 * 2.24-2.44 -> 2.01-2.08 ms, 1 row unchanged. The same change in the AVX2 kernels there gave
 * 16-bit weights 1.31-1.34 -> 0.90-0.93 ms at 1 row, but they keep 1 KiB, tuned on the Zen 3
 * machines (above) and not measured there since; the Intel Xeon's AVX-512 decode is not
 * measured with 4 KiB either. */
#ifndef FS_LIN_PF_BYTES_AVX512
#define FS_LIN_PF_BYTES_AVX512 4096
#endif
#ifndef FS_LIN_PF_BYTES_F32_AVX2
#define FS_LIN_PF_BYTES_F32_AVX2 384
#endif
/* Measured on an AMD EPYC (Zen 4, forced AVX2 path, 1 thread, pinned; builds alternated; the
 * seven SmolLM2-shape products of a layer over 6 copies streamed from memory, best of 15, five
 * rounds; and a random SmolLM-135M-shape bf16 model, verify cost at context 64, two rounds):
 *
 * FS_LIN_PAIR_MIN_ROWS: tiles of one row, or of at least this many rows, load bfloat16 weights
 * in pairs of vectors (FS_LOADV2: one load and one 16-bit unpack per 8 weights, instead of a
 * zero-extension and a shift). 4 x 3 tiles: hot 12.5-12.9 -> 13.2-14.4 multiply-adds a cycle
 * at 4-16 rows, streamed 16 rows 8.2-8.9 -> 7.6-8.1 ms; the SmolLM shape's verify_16 53.9-54.2
 * -> 48.7-49.2 ms and verify_4 17.9-18.0 -> 15.4-15.7 ms (with the two below). The 2 x 6 tile
 * lost (hot 10.6 -> 6.6), and on the Intel Xeon (Sapphire Rapids class, whose AVX2 path runs
 * only when forced) the 4 x 3 and 2 x 6 tiles lost 25% (their shuffles share port 5). */
#ifndef FS_LIN_PAIR_MIN_ROWS
#define FS_LIN_PAIR_MIN_ROWS 3
#endif
/* FS_LIN_PF_BYTES_BLOCK_AVX2: the AVX2 kernels' distance for blocks of rows (one row keeps
 * FS_LIN_PF_BYTES). 1 KiB -> 4 KiB: 2 rows 1.71-1.90 -> 1.52-1.65 ms (bf16), 1.69-2.03 ->
 * 1.41-1.57 (f16), 3.89-4.46 -> 3.53-4.01 (f32); 4 rows 2.70-2.89 -> 2.35-2.58 (bf16),
 * 2.57-2.85 -> 2.32-2.58 (f16); 8 and 16 rows of 16-bit weights the same; not measured on a
 * Zen 3. */
#ifndef FS_LIN_PF_BYTES_BLOCK_AVX2
#define FS_LIN_PF_BYTES_BLOCK_AVX2 4096
#endif
/* FS_LIN_PF_LAST: 1, a tile of several rows also prefetches the last weight of each k step
 * (fs_linear_f32.inc); 0, one prefetch a line from the step's first vector only. float32
 * (AVX2): 8 rows 8.5-9.2 -> 6.6-7.3 ms, 16 rows 11.6-13.2 -> 10.0-11.2 ms, although in its 4 x 3
 * tiles that line was already asked for; 16-bit weights within 5% either way (the gap it fills:
 * a 4 x 3 tile's step reads 48 bytes at 96 k or 96 k + 48, and every other step crosses into a
 * line the first vector's prefetch does not name). AVX-512 the same within the noise (float32
 * 16 rows 7.99-8.25 -> 7.67-8.01 ms). */
#ifndef FS_LIN_PF_LAST
#define FS_LIN_PF_LAST 1
#endif
/* Full unrolling keeps every accumulator in a register. */
#define FS_LIN_UNROLL _Pragma("GCC unroll 16")

#define FS_LINF_DECLARE(SFX)                                                                   \
    void fs_linf_part_f32_##SFX(const float *x, const float *P, float *y, int n, int in,      \
                                int out, int lo, int hi, int accumulate);                      \
    void fs_linf_part_f32h_##SFX(const float *x, const uint16_t *P, float *y, int n, int in,  \
                                 int out, int lo, int hi, int accumulate);                     \
    void fs_linf_part_f32b_##SFX(const float *x, const uint16_t *P, float *y, int n, int in,  \
                                 int out, int lo, int hi, int accumulate);
FS_LINF_DECLARE(def)
#if FS_LINF_SIMD
FS_LINF_DECLARE(avx2)
FS_LINF_DECLARE(avx512)
#endif

/* The entry points' column parts, through fs_disp (the variant of the path). */
void fs_linear_part_f32(const float *x, const float *P, float *y, int n, int in, int out,
                        int lo, int hi, int accumulate);
void fs_linear_part_f32h(const float *x, const uint16_t *P, float *y, int n, int in, int out,
                         int lo, int hi, int accumulate);
void fs_linear_part_f32b(const float *x, const uint16_t *P, float *y, int n, int in, int out,
                         int lo, int hi, int accumulate);

/* ---- bf16 in the tile layout: AMX (fs_linear_amx.c), AVX512-BF16 (fs_linear_bf16dp.c) -- */

/* Column tiles that share one input tile per k step (4 sums + 1 input + 3 weight tiles of the
 * 8 tile registers). */
#define FS_AMX_G 4
#if FS_AMX_BUILD
/* xa (m, kp) = x (m, in) rounded to bf16 bits (fs_f2bf_bits' rule), zero past in. */
void fs_amx_round_rows(const float *x, int m, int in, int kp, uint16_t *xa);
/* Column tiles [t_lo, t_hi) (t_lo a multiple of FS_AMX_G) of all n rows of xa (n, kp), in
 * passes of up to 16 rows; configures this thread's tiles and releases them. */
void fs_amx_part(const uint16_t *xa, int kp, const uint16_t *P, float *y, int n, int out,
                 int t_lo, int t_hi, int accumulate);
#endif
#if FS_BF16DP_BUILD
/* fs_amx_part's product with VDPBF16PS (fs_linear_bf16dp.c): the same layout, inputs and
 * column tiles, any t_lo. */
void fs_bf16dp_part(const uint16_t *xa, int kp, const uint16_t *P, float *y, int n, int out,
                    int t_lo, int t_hi, int accumulate);
#endif
/* 1 when the bf16 products run on AMX tiles in this process (built, detected, granted). */
int fs_linf_amx(void);

/* ---- tiled float attention (fs_attention_f32.inc) ---------------------------------------- */

#if FS_HAVE_VEC
#define FS_F32_TILE 128
/* Query rows of one kv head per block: each key and value row loaded once for all of them
 * (values passes of 6 rows over a tile of keys in L1/L2; the SmolLM group of 3 heads fits four
 * times). 6 before: a 6-row step of the embedded target (12 rows a kv head) read each head's
 * keys and values twice, from L3 after the weights' stream. Measured on the Xeon guest
 * (2026-12-06, AMX build, head_dim 64, us a call, 6 -> 12): 4 heads on 2, 400 keys, 1 thread,
 * 4 rows 24-26 -> 21, 6 rows 31-37 -> 29, 8 rows 45-49 -> 40; 9 heads on 3, 300 keys, 1 thread,
 * 8 rows 82 -> 74-76, 16 rows 148-149 -> 135-139, 2 threads 16 rows 95-101 -> 87-90; forced
 * AVX2 the same (compute bound there); 24 rows: no better, and fewer blocks for two threads. */
#define FS_F32_ROWS 12
/* Largest head size of the tiled kernel: it sizes a block's stack buffers (tile and acc: 12 x
 * 256 floats and doubles, 36 KiB; the whole frame ~45 KiB, ~78 KiB in the baseline variant);
 * the loops over a row's chunks take any multiple of 16. 256 is Gemma's head size (2, 3 and
 * 3n): 128 before, when those heads ran the double template at ~7.7 G multiply-adds a second
 * against the tiles' ~40 (a Zen 4 EPYC, 1 thread, 4096 keys). */
#define FS_F32_MAXD 256

/* Key panels of the transposed layout are allocated in multiples of this many keys (every
 * variant's panel width divides it). */
#define FS_F32_PANEL 16

#define FS_F32_VARIANT(SFX)                                                                    \
    void fs_f32_block_##SFX(const float *const *qrows, float *const *orows, const int *count,  \
                            int rows, const float *kh, const float *vh, int head_dim,          \
                            float scale, int base, const int32_t *anc, const float *kt,        \
                            int kt_keys, const uint16_t *kh16, const uint16_t *vh16);          \
    void fs_f32_keys_##SFX(const float *k, int keys, int head_dim, float *kt);
FS_F32_VARIANT(def)
#if FS_ATTN_VARIANTS
FS_F32_VARIANT(avx2)
FS_F32_VARIANT(avx512)
#endif
#undef FS_F32_VARIANT

/* Head sizes of the tiled kernel (the double template takes the others). */
#define FS_F32_SUPPORTED(head_dim) ((head_dim) % 16 == 0 && (head_dim) <= FS_F32_MAXD)

/* The tiled kernel's drivers (fs_attention.c), for the float32 entries and the float16 ones
 * of fs_attention_f16.c: k, v float32 (k16, v16 NULL) or k16, v16 binary16 (k, v NULL). */
void fs_attention_f32_tiled(const float *q, const float *k, const float *v,
                            const uint16_t *k16, const uint16_t *v16, float *out, int n,
                            int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                            int causal, int window);
void fs_attention_f32_tree(const float *q, const float *k, const float *v,
                           const uint16_t *k16, const uint16_t *v16, float *out, int n,
                           int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                           const uint8_t *mask, int window, int32_t *anc);
#endif

#endif /* FS_VARIANTS_H */
