/* fs_quant_amx.c -- the AMX-INT8 variant of the quantized products (fs_quant_kern.h), for
 * blocks of rows (the amx path runs it from FS_Q_AMX_MIN_ROWS rows up).
 *
 * Tiles, per block of 32 inputs: A = up to 16 quantized rows (int8, 32 bytes a row, read in
 * place from the activations); B = two panels' block side by side, widened to 8 rows of 64
 * bytes: input group k (4 inputs) x 16 columns x 4 bytes (q8_0: the panels' qs rows
 * interleaved; q4_*: nibbles widened to bytes, low nibbles = inputs 0..15 first);
 * C = (rows x 16 columns) int32 = the block's exact integer sums (tdpbssd: signed x signed).
 * Each block's C tile is stored to a ring and scaled FS_QA_LAG blocks later on 16-lane zmm
 * vectors, one per row (acc = fma(d_w * d_a, (float)isum, acc), q4_1's min fma after it):
 * every lane runs the arithmetic of fs_quant.h in block order, so the results equal the
 * other paths' bits.
 *
 * Measured on the Xeon (1 core, 16 rows, the SmolLM2 layer's products hot in L2): tile
 * instructions and the vector scaling do not overlap (tiles ~26 cycles a block, scaling ~27,
 * together ~53), so the kernel keeps both short: one tile product and one tile store per 16
 * columns (two 8-column products before: 331 -> 267 us a layer for q8_0), the widening
 * spread over the block loop, and the activation scales transposed so that a block's 16 are
 * adjacent. The pairs of panels run in interleaved streams, like the VNNI kernels' panels
 * (FS_QSTREAMS, fs_quant_kern.h), each prefetching the pair that runs next.
 * A lone last panel is read twice (its copy's lanes are not stored) rather than tested for in
 * every block: 16 rows of q8_0 hot, 31 -> 29 ns a block x 16 columns; the real SmolLM2 file's
 * q8_0 verify_16 at 1 thread 12.8-13.1 -> 11.5-12.0 ms (2026-12-05, docs/PERFORMANCE.md).
 * A call of 32 rows or more (a prompt) of rows of at most FS_QA_PRE_NB blocks widens each
 * pair once for up to FS_QA_PRE_TILES tiles of 16 rows (the widening was a quarter of a
 * block's time): the embedded q8_0 target's 255-row prompt at 1 thread 8.3-8.4 -> 6.9-7.1 ms,
 * 64 rows 1.80-1.85 -> 1.51-1.61 ms; the real SmolLM2 file's 256-row q8_0 prompt 192-193 ->
 * 188-192 ms (2026-12-06).
 */
#include "fs_quant.h"
#include "fs_quant_kern.h"

#include <stdlib.h>

#if FS_Q_AMX
#include <immintrin.h>

#define FS_QA_ATTR \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512vl,avx512bw,avx2,fma,f16c")))
#define FS_QA_UNROLL _Pragma("GCC unroll 16")
#ifndef FS_QA_AHEAD
#define FS_QA_AHEAD 8
#endif
#define FS_QA_WRING 16
/* Blocks between a block's tile store and its scaling (a vector load right after the tile
 * store that wrote its bytes waits for it), and the ring of sums buffers that allows it. */
#ifndef FS_QA_LAG
#define FS_QA_LAG 2
#endif
#define FS_QA_RING 4
/* Calls of 32 rows or more whose rows have at most FS_QA_PRE_NB blocks run their full tiles of
 * 16 rows FS_QA_PRE_TILES at a time (fs_qa_run): the scales of those rows by block fill dt,
 * each pair widened once for them. */
#ifndef FS_QA_PRE_TILES
#define FS_QA_PRE_TILES 4
#endif
#define FS_QA_PRE_NB 128
_Static_assert(FS_QA_RING > FS_QA_LAG, "a block's sums must outlive its lag");

FS_QA_ATTR static void fs_qa_config(int m)
{
    fs_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[0] = (uint8_t)m;  /* A: m rows x 32 int8 */
    cfg.colsb[0] = 32;
    cfg.rows[1] = 8;  /* B: 8 input groups x 16 columns x 4 int8 */
    cfg.colsb[1] = 64;
    cfg.rows[4] = (uint8_t)m;  /* C: m rows x 16 columns int32 */
    cfg.colsb[4] = 64;
    _tile_loadconfig(&cfg);
}

/* One 8-column half of a widened block: row k of the 16-column B tile is 64 bytes, the
 * first panel's 32 in [0, 32) and the second's in [32, 64). */
FS_QA_ATTR static inline __attribute__((always_inline)) __m512i fs_qa_join(__m256i lo,
                                                                            __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Block b of panels q0 and q1 widened to the 16-column B layout in buf
 * (512 bytes). q8_0: the qs rows interleaved; q4_*: nibbles widened to bytes, the low nibbles
 * of the 32-byte group j being input group j and the high ones group 4 + j. */
FS_QA_ATTR static inline __attribute__((always_inline)) void fs_qa_widen(const int KIND,
                                                                         const uint8_t *q0,
                                                                         const uint8_t *q1,
                                                                         uint8_t *buf)
{
    if (KIND == FS_Q8_0) {
        FS_QA_UNROLL for (int k = 0; k < 8; k++) {
            __m256i lo = _mm256_loadu_si256((const __m256i *)(q0 + k * 32));
            __m256i hi = _mm256_loadu_si256((const __m256i *)(q1 + k * 32));
            _mm512_store_si512((void *)(buf + k * 64), fs_qa_join(lo, hi));
        }
    } else {
        const __m256i m4 = _mm256_set1_epi8(15);
        FS_QA_UNROLL for (int j = 0; j < 4; j++) {
            __m256i b0 = _mm256_loadu_si256((const __m256i *)(q0 + j * 32));
            __m256i b1 = _mm256_loadu_si256((const __m256i *)(q1 + j * 32));
            _mm512_store_si512((void *)(buf + j * 64),
                               fs_qa_join(_mm256_and_si256(b0, m4), _mm256_and_si256(b1, m4)));
            _mm512_store_si512((void *)(buf + (4 + j) * 64),
                               fs_qa_join(_mm256_and_si256(_mm256_srli_epi16(b0, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4)));
        }
    }
}

/* 16 f16 scales: 8 of panel p0, 8 of panel p1. */
FS_QA_ATTR static inline __attribute__((always_inline)) __m512 fs_qa_h16(const uint8_t *p0,
                                                                         const uint8_t *p1)
{
    __m128i lo = _mm_loadu_si128((const __m128i *)p0);
    __m128i hi = _mm_loadu_si128((const __m128i *)p1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* Rows [r0, r0 + m) (m <= 16; M: m when known at compile time, else 0) x panels g, g + 1
 * (two: whether g + 1 exists; if not, the lanes of the second panel compute panel g again and
 * are not stored). PRE: ub holds every block of the pair widened (block b at b * 512; fill:
 * widen them there first), else ub is the ring the blocks are widened into on the way. dt,
 * dst, st: the rows' block scales, d * s and 8 * s (q4_0) by block, 16 a block. */
#define FS_QA_WIDEN(W)                                                                        \
    fs_qa_widen(KIND, q0 + (size_t)(W) * qb, q1 + (size_t)(W) * qb,                          \
                ub + (size_t)(PRE ? (W) : (W) % FS_QA_WRING) * 512)
FS_QA_ATTR static inline __attribute__((always_inline)) void fs_qa_pair(
    const int KIND, const int M, const int PRE, int fill, const fs_qact *a, const uint8_t *P,
    size_t psz, float *y, int out, int g, int two, const uint8_t *pnext, int r0, int m,
    int accumulate, const float *dt, const float *dst, const int32_t *st, int32_t *cbuf,
    uint8_t *ub)
{
    const int nb = a->nb, in = a->in, mm = M ? M : m;
    const size_t qoff = FS_Q_PANEL_QS(KIND, nb), moff = FS_Q_PANEL_M(nb);
    const size_t qb = KIND == FS_Q8_0 ? 256 : 128;
    const size_t pstep = FS_Q_PANEL_PSTEP(KIND, in); /* prefetched a block */
    const uint8_t *pan0 = P + (size_t)g * psz, *pan1 = two ? pan0 + psz : pan0;
    const uint8_t *q0 = pan0 + qoff, *q1 = pan1 + qoff;
    int col0 = g * FS_Q_COLS, wide = (two ? 2 : 1) * FS_Q_COLS;
    int nc = out - col0 < wide ? out - col0 : wide; /* the columns of [g_lo, g_hi) only */
    __mmask16 mask = (__mmask16)((1u << nc) - 1u);
    __m512 acc[16];
    FS_QA_UNROLL for (int r = 0; r < 16; r++)
        acc[r] = r < mm && accumulate
                 ? _mm512_maskz_loadu_ps(mask, y + (size_t)(r0 + r) * out + col0)
                 : _mm512_setzero_ps();
    const int8_t *qa = a->q + (size_t)r0 * in;
    /* Each block is widened FS_QA_AHEAD blocks before its tile load, into a ring of
     * FS_QA_WRING blocks: a tile load right after the vector stores that wrote its bytes
     * stalls (measured 5x slower per block). PRE: every block before the first (fill). */
    for (int b = 0; b < nb && (PRE ? fill : b < FS_QA_AHEAD); b++) FS_QA_WIDEN(b);
    for (int b = 0; b < nb + FS_QA_LAG; b++) {
        if (b < nb) {
            if (!PRE && b + FS_QA_AHEAD < nb) FS_QA_WIDEN(b + FS_QA_AHEAD);
            /* the same share of the pair that runs next (its scales and mins included: pstep
             * bytes a block, as in fs_quant_x86.inc), while this pair computes (pnext NULL:
             * another tile of rows of this pair prefetches it) */
            if (pnext) {
                const uint8_t *pf = pnext + (size_t)b * pstep;
                for (size_t l = 0; l < pstep; l += 64) {
                    _mm_prefetch((const char *)(pf + l), _MM_HINT_T0);
                    _mm_prefetch((const char *)(pf + psz + l), _MM_HINT_T0);
                }
                _mm_prefetch((const char *)(pf + pstep - 1), _MM_HINT_T0);
                _mm_prefetch((const char *)(pf + psz + pstep - 1), _MM_HINT_T0);
            }
            _tile_loadd(0, qa + (size_t)b * FS_Q_BLOCK, in);
            _tile_loadd(1, ub + (size_t)(PRE ? b : b % FS_QA_WRING) * 512, 64);
            _tile_zero(4);
            _tile_dpbssd(4, 0, 1);
            _tile_stored(4, cbuf + (b % FS_QA_RING) * 256, 64);
        }
        /* the block scaled now: its sums were stored FS_QA_LAG blocks ago (a vector load
         * right after the tile store that wrote its bytes waits for it) */
        int e = b - FS_QA_LAG;
        if (e < 0) continue;
        const int32_t *ce = cbuf + (e % FS_QA_RING) * 256;
        const float *de = dt + (size_t)e * 16;
        const float *dse = KIND == FS_Q4_1 ? dst + (size_t)e * 16 : dst;
        const int32_t *se = KIND == FS_Q4_0 ? st + (size_t)e * 16 : st;
        __m512 dw = fs_qa_h16(pan0 + (size_t)e * 16, pan1 + (size_t)e * 16);
        __m512 mw = KIND == FS_Q4_1 ? fs_qa_h16(pan0 + moff + (size_t)e * 16,
                                                 pan1 + moff + (size_t)e * 16)
                                    : _mm512_setzero_ps();
        FS_QA_UNROLL for (int r = 0; r < 16; r++)
            if (r < mm) {
                __m512i isum = _mm512_load_si512((const void *)(ce + r * 16));
                if (KIND == FS_Q4_0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(se[r]));
                __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(de[r]));
                acc[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(isum), acc[r]);
                if (KIND == FS_Q4_1)
                    acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(dse[r]), acc[r]);
            }
    }
    FS_QA_UNROLL for (int r = 0; r < 16; r++)
        if (r < mm) _mm512_mask_storeu_ps(y + (size_t)(r0 + r) * out + col0, mask, acc[r]);
}

#undef FS_QA_WIDEN

FS_QA_ATTR static inline __attribute__((always_inline)) void fs_qa_run(
    const int KIND, const fs_qact *a, const uint8_t *P, float *y, int out, int g_lo, int g_hi,
    int accumulate)
{
    _Alignas(64) int32_t cbuf[FS_QA_RING * 16 * 16];
    _Alignas(64) uint8_t ub[FS_QA_WRING * 512];
    const int nb = a->nb;
    size_t psz = fs_quant_panel_bytes(KIND, a->in);
    int configured = 0;
    int np = (g_hi - g_lo + 1) / 2, slots = FS_Q_STREAM_SLOTS(np, FS_QSTREAMS);
    /* Many rows (a prompt): full tiles of 16 rows up to FS_QA_PRE_TILES at a time, each pair of
     * panels widened once for all of them (wb); a last partial tile, and every tile without
     * the memory, one by one, widening into the ring ub. The activation scales by block (16
     * rows a block, so that a block's 16 are adjacent) of up to that many tiles: dt, and dst
     * (q4_1) or st (q4_0). All on the heap, one block a call: on the stack they took this
     * frame to 46 KB (q8_0) and 79 KB (q4), and a 16-row product of 16384-input rows crashed
     * a Python thread of 80 KiB stack. Without the memory, the portable kernel (same bits). */
    int tmax = a->n >= 2 * 16 && nb <= FS_QA_PRE_NB ? FS_QA_PRE_TILES : 1;
    size_t nsc = (size_t)tmax * (size_t)nb * 16, scb = FS_Q_UP64(nsc * 4);
    size_t wbb = tmax > 1 ? (size_t)nb * 512 : 0;
    uint8_t *heap = (uint8_t *)aligned_alloc(64, (KIND == FS_Q8_0 ? 1 : 2) * scb + wbb);
    if (heap == NULL) {
        fs_qpart_def(KIND, a, P, y, out, g_lo, g_hi, accumulate);
        return;
    }
    float *dt = (float *)heap;
    float *dst = (float *)(heap + scb);   /* q4_1 */
    int32_t *st = (int32_t *)(heap + scb); /* q4_0 */
    uint8_t *wb = tmax > 1 ? heap + (KIND == FS_Q8_0 ? 1 : 2) * scb : NULL;
    for (int r0 = 0; r0 < a->n;) {
        int m = a->n - r0 < 16 ? a->n - r0 : 16, pre = wb && m == 16;
        int tiles = pre ? (a->n - r0) / 16 : 1;
        tiles = tiles < FS_QA_PRE_TILES ? tiles : FS_QA_PRE_TILES;
        if (m != configured) {
            fs_qa_config(m);
            configured = m;
        }
        for (int t = 0; t < tiles; t++)
            for (int r = 0; r < m; r++)
                for (int b = 0; b < nb; b++) {
                    size_t i = (size_t)(r0 + 16 * t + r) * nb + b;
                    size_t o = ((size_t)t * nb + b) * 16 + r;
                    dt[o] = a->d[i];
                    if (KIND == FS_Q4_1) dst[o] = a->ds[i];
                    if (KIND == FS_Q4_0) st[o] = 8 * a->s[i];
                }
        /* the pairs in the interleaved streams of FS_Q_STREAM_UNIT, each prefetching the
         * one that runs next (in its first tile of rows) */
        for (int i = 0; i < slots; i++) {
            int p = FS_Q_STREAM_UNIT(i, np, FS_QSTREAMS), pn = -1;
            if (p < 0) continue;
            for (int k = i + 1; k < slots && pn < 0; k++)
                pn = FS_Q_STREAM_UNIT(k, np, FS_QSTREAMS);
            int g = g_lo + 2 * p, two = g + 1 < g_hi;
            const uint8_t *pnext = P + (size_t)(pn < 0 ? g : g_lo + 2 * pn) * psz;
            for (int t = 0; t < tiles; t++) {
                size_t o = (size_t)t * nb * 16;
                const uint8_t *pf = t == 0 ? pnext : NULL;
                const float *dto = dt + o, *dsto = KIND == FS_Q4_1 ? dst + o : dst;
                const int32_t *sto = KIND == FS_Q4_0 ? st + o : st;
                if (pre)
                    fs_qa_pair(KIND, 16, 1, t == 0, a, P, psz, y, out, g, two, pf,
                               r0 + 16 * t, 16, accumulate, dto, dsto, sto, cbuf, wb);
                else if (m == 16)
                    fs_qa_pair(KIND, 16, 0, 0, a, P, psz, y, out, g, two, pf, r0, m,
                               accumulate, dto, dsto, sto, cbuf, ub);
                else
                    fs_qa_pair(KIND, 0, 0, 0, a, P, psz, y, out, g, two, pf, r0, m,
                               accumulate, dto, dsto, sto, cbuf, ub);
            }
        }
        r0 += tiles * m; /* tiles > 1 only with m = 16 */
    }
    free(heap);
    _tile_release();
}

#define FS_QA_KIND(NAME, KIND)                                                                \
    FS_QA_ATTR __attribute__((noinline)) static void NAME(const fs_qact *a, const uint8_t *P,  \
                                                          float *y, int out, int g_lo,        \
                                                          int g_hi, int accumulate)           \
    {                                                                                          \
        fs_qa_run(KIND, a, P, y, out, g_lo, g_hi, accumulate);                                 \
    }
FS_QA_KIND(fs_qa_run8, FS_Q8_0)
FS_QA_KIND(fs_qa_run40, FS_Q4_0)
FS_QA_KIND(fs_qa_run41, FS_Q4_1)

void fs_qpart_amx(int kind, const fs_qact *a, const uint8_t *P, float *y, int out, int g_lo,
                  int g_hi, int accumulate)
{
    /* the dispatch (fs_isa.c) sends these to qpart_mid / qpart; called directly (the C
     * harness, which fills the interleaved copies the VNNI kernels read), the same bits */
    if (a->nb > FS_Q_AMX_MAX_NB) {
        fs_qpart_avx512vnni(kind, a, P, y, out, g_lo, g_hi, accumulate);
        return;
    }
    if (kind == FS_Q8_0)
        fs_qa_run8(a, P, y, out, g_lo, g_hi, accumulate);
    else if (kind == FS_Q4_0)
        fs_qa_run40(a, P, y, out, g_lo, g_hi, accumulate);
    else
        fs_qa_run41(a, P, y, out, g_lo, g_hi, accumulate);
}
#endif /* FS_Q_AMX */
