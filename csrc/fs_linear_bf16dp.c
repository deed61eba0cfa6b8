/* fs_linear_bf16dp.c -- bf16 products with AVX512-BF16 (VDPBF16PS), for fs_linear.h's
 * FS_ISA_AVX512BF16 path: the CPUs with AVX512-BF16 and no AMX (AMD Zen 4 and Zen 5, Intel
 * Cooper Lake).
 *
 * fs_bf16dp_part: y (n, out) [+]= xa (n, kp) @ W (in, out) on column tiles [t_lo, t_hi), in
 * exactly fs_amx_part's terms: W bf16 bits packed by fs_pack_bf16_amx (the AMX tile layout,
 * which is also VDPBF16PS's: pair q of column tile t, (W[2q][16t + c], W[2q + 1][16t + c]) for
 * its 16 columns c, is one 64-byte vector at P + 16 t kp + 32 q) and xa the input rows rounded
 * to bf16 bits (fs_amx_round_rows). fs_linear.c's fs_linear_f32b_tiles is the entry point of
 * both tile paths (threads, bias).
 *
 * Why: one VDPBF16PS does 32 multiply-adds (16 columns x a pair of inputs), twice a float32
 * FMA's 16. Measured on an AMD EPYC Zen 4 (1 thread, 12 independent chains): 31.6
 * multiply-adds a cycle against 15.9 for VFMADD231PS on zmm.
 *
 * Register tiles: R rows x NT column tiles of sums (zmm), the NT weight vectors of a pair loaded
 * once and used by every row, each row's pair broadcast once: up to 6 rows with 4 tiles (24
 * sums; the weights stream as 4 sequential reads, as on AMX), 7-8 rows with 3, 9-12 with 2;
 * more rows run in groups of at most 12, as even as possible, every group over one strip of
 * tiles before the next strip (a prefill streams the weights once). Measured on the Zen 4
 * (SmolLM-135M shape, bf16, 1 thread, random weights, builds alternated):
 *   - one row, the decode step against a read of its bytes (paired): 8 streams reached
 *     0.69-0.72 of the stream bound, 4 streams 0.78-0.79 (the avx512 path's panels: 0.79-0.80);
 *   - 8 rows as 8 x 3 tiles rather than 8 x 2: 15.9-16.7 -> 15.0-15.3 ms a step of 8 rows, and
 *     16 rows (two groups of 8) 28.7-28.9 -> 27.0-27.5 ms;
 *   - 8 rows as two groups of 4 x 4 tiles: 19.7-20.3 ms (the strip read twice);
 *   - groups of up to 16 rows, one tile wide, and every group prefetching: no change.
 *
 * Numerics: each output is one chain of VDPBF16PS over the pairs in k order, starting from +0
 * (or from y when accumulating), whatever the rows, tiles or groups: a row gives the same bits
 * alone (decode) as inside a block of any size. Inside one instruction the order of the pair's
 * two products and the denormal handling (bf16 denormal inputs read as zero, float32 denormal
 * results flushed, round to nearest even whatever MXCSR says) are the hardware's: like the amx
 * path, this path equals the FMA paths within the float32 rounding of the sums, not bit for
 * bit.
 */
#include "fs_linear.h"
#include "fs_variants.h"

#if FS_BF16DP_BUILD
#include <immintrin.h>

#define FS_DP_ATTR __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define FS_DP_INL static inline __attribute__((always_inline)) FS_DP_ATTR
#define FS_DP_UNROLL _Pragma("GCC unroll 16")

/* Software prefetch this many bytes ahead in each weight stream (the first row group of a
 * strip only; the others find the strip in cache), past a stream's end into the same tile of
 * the next strip. */
#ifndef FS_DP_PF
#define FS_DP_PF 1024
#endif

/* The lanes of column tile j holding real columns, of `cols` from the tile group's start. */
FS_DP_INL __mmask16 fs_dp_live(int cols, int j)
{
    int live = cols - 16 * j;
    return live >= 16 ? (__mmask16)0xffff : live > 0 ? (__mmask16)((1u << live) - 1) : 0;
}

/* R rows (xa, kp bf16 each) x NT column tiles from B (tile j at B + j * len), columns c0 ..
 * c0 + cols of y (rows out floats apart). */
FS_DP_INL void fs_dp_tile(const uint16_t *xa, int kp, const uint16_t *B, size_t len, float *y,
                          int out, int c0, int cols, const int R, const int NT, int accumulate,
                          int pf)
{
    __m512 acc[12][4];
    FS_DP_UNROLL for (int j = 0; j < NT; j++) {
        const __mmask16 m = fs_dp_live(cols, j);
        FS_DP_UNROLL for (int r = 0; r < R; r++)
            acc[r][j] = accumulate ? _mm512_maskz_loadu_ps(m, y + (size_t)r * out + c0 + 16 * j)
                                   : _mm512_setzero_ps();
    }
    const int nq = kp / 2;
    for (int q = 0; q < nq; q++) {
        const size_t o = (size_t)q * 32;
        if (pf) {
            size_t a = o + FS_DP_PF / 2;
            if (a >= len) a += (size_t)(NT - 1) * len;  /* the next strip's same tile */
            FS_DP_UNROLL for (int j = 0; j < NT; j++) _mm_prefetch((const char *)(B + j * len + a),
                                                                   _MM_HINT_T0);
        }
        __m512bh w[4];
        FS_DP_UNROLL for (int j = 0; j < NT; j++)
            w[j] = (__m512bh)_mm512_loadu_si512((const void *)(B + j * len + o));
        FS_DP_UNROLL for (int r = 0; r < R; r++) {
            uint32_t pair;
            memcpy(&pair, xa + (size_t)r * kp + 2 * q, sizeof pair);
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)pair);
            FS_DP_UNROLL for (int j = 0; j < NT; j++)
                acc[r][j] = _mm512_dpbf16_ps(acc[r][j], b, w[j]);
        }
    }
    FS_DP_UNROLL for (int j = 0; j < NT; j++) {
        const __mmask16 m = fs_dp_live(cols, j);
        FS_DP_UNROLL for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + (size_t)r * out + c0 + 16 * j, m, acc[r][j]);
    }
}

/* Column tiles [t, te) of one group of R rows: one tile call of the strip's width when it
 * fits the rows' registers, else narrower ones (the same arithmetic per column). */
FS_DP_INL void fs_dp_strip(const uint16_t *xa, int kp, const uint16_t *P, float *y, int out,
                           int t, int te, const int R, int accumulate, int pf)
{
    const size_t len = (size_t)16 * kp;
    while (t < te) {
        const int w = te - t, c0 = 16 * t;
        const uint16_t *B = P + (size_t)t * len;
#define FS_DP_TILE(NT)                                                                      \
    do {                                                                                    \
        int cols = out - c0 < 16 * (NT) ? out - c0 : 16 * (NT);                             \
        fs_dp_tile(xa, kp, B, len, y, out, c0, cols, R, NT, accumulate, pf);               \
        t += (NT);                                                                          \
    } while (0)
        if (R <= 6 && w >= 4)
            FS_DP_TILE(4);
        else if (R <= 8 && w >= 3)
            FS_DP_TILE(3);
        else if (w >= 2)
            FS_DP_TILE(2);
        else
            FS_DP_TILE(1);
#undef FS_DP_TILE
    }
}

FS_DP_ATTR void fs_bf16dp_part(const uint16_t *xa, int kp, const uint16_t *P, float *y, int n,
                               int out, int t_lo, int t_hi, int accumulate)
{
    /* rows in groups of at most 12, as even as possible; strips of the widest group's tile
     * width outside, so that every group reads a strip while it is in cache */
    const int groups = (n + 11) / 12, most = (n + groups - 1) / groups;
    const int width = most <= 6 ? 4 : most <= 8 ? 3 : 2;
    for (int t = t_lo; t < t_hi; t += width) {
        const int te = t + width < t_hi ? t + width : t_hi;
        for (int g = 0, r0 = 0; g < groups; g++) {
            const int rows = (n - r0) / (groups - g);
            const uint16_t *xg = xa + (size_t)r0 * kp;
            float *yg = y + (size_t)r0 * out;
            const int pf = g == 0;
#define FS_DP_CASE(R) \
    case R: fs_dp_strip(xg, kp, P, yg, out, t, te, R, accumulate, pf); break;
            switch (rows) {
                FS_DP_CASE(1) FS_DP_CASE(2) FS_DP_CASE(3) FS_DP_CASE(4) FS_DP_CASE(5)
                FS_DP_CASE(6) FS_DP_CASE(7) FS_DP_CASE(8) FS_DP_CASE(9) FS_DP_CASE(10)
                FS_DP_CASE(11) FS_DP_CASE(12)
                default: break;
            }
#undef FS_DP_CASE
            r0 += rows;
        }
    }
}
#endif /* FS_BF16DP_BUILD */
