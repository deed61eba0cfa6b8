/* fs_quant_avx2.c -- the AVX2 variant of the quantized products (fs_quant_x86.inc with
 * vpmaddubsw): what an AVX2-only CPU (Zen 3) runs; and the activation rule on AVX2.
 *
 * Measured on the Xeon (1 core, hot L2, best of 9; SmolLM2 shapes 576x1536 and 1536x576):
 * q8_0 22.4 int8 MAC/cycle from 2 rows (4 vector uops per 32 MACs and row: vpsignb,
 * vpmaddubsw, vpmaddwd, vpaddd; this core's three vector ports cap it at 24), q4_0 / q4_1
 * 28; row tiles of 3, 5 or 6 rows measured the same as 4. */
#include "fs_quant.h"
#include "fs_quant_kern.h"

#if FS_Q_SIMD
#define FS_SFX avx2
#define FS_QATTR __attribute__((target("avx2,fma,f16c")))
#define FS_QRT 4
#define FS_QVNNI 0
#define FS_QZMM 0
#include "fs_quant_x86.inc"
#endif

#if FS_Q_SIMD
#include <float.h>
#include <immintrin.h>

/* The activation rule of fs_quant.h on AVX2 (fs_quant_rows picks it on a CPU with AVX2): the
 * same operations as fs_quant_rows_ref -- a max of |x| (exact in any order), one float
 * division, float products rounded to nearest even by vcvtps2dq under the default MXCSR --
 * so the same bytes (tests/c/quant.c compares the two). Eight blocks of a row at a time: their
 * maxima and sums reduced side by side (one lane a block), one vector division each for the
 * eight scales and their inverses, instead of three shuffles, a scalar division and a sum per
 * block (0.24 -> 0.17-0.18 ns an element on the Intel Xeon, 16 rows of 1536, hot). */
#define FS_QR_ATTR __attribute__((target("avx2,fma,f16c")))

/* Per 128-bit half, lanes (max(a0, a1), max(a2, a3), max(b0, b1), max(b2, b3)). */
FS_QR_ATTR static inline __m256 fs_qr_pairmax(__m256 a, __m256 b)
{
    return _mm256_max_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xdd));
}

/* Blocks [0, t) of xb (t <= 8; 32 floats each) into qb, d[0..t) and s[0..t). */
FS_QR_ATTR static inline __attribute__((always_inline)) void fs_qr_blocks(const float *xb,
                                                                          int8_t *qb, float *d,
                                                                          int32_t *s, int t)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256 m[8];
    int okbits = 0;
    for (int j = t; j < 8; j++) m[j] = _mm256_setzero_ps();
    for (int j = 0; j < t; j++) {
        const float *x = xb + j * FS_Q_BLOCK;
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x), absmask);
        __m256 ok = _mm256_cmp_ps(a, big, _CMP_LE_OQ), mj = a;
        for (int k = 1; k < 4; k++) {
            a = _mm256_and_ps(_mm256_loadu_ps(x + 8 * k), absmask);
            ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
            mj = _mm256_max_ps(mj, a);
        }
        m[j] = mj;
        okbits |= (_mm256_movemask_ps(ok) == 0xff) << j;
    }
    /* lane j: the max of m[j]'s eight lanes */
    __m256 q0 = fs_qr_pairmax(fs_qr_pairmax(m[0], m[1]), fs_qr_pairmax(m[2], m[3]));
    __m256 q1 = fs_qr_pairmax(fs_qr_pairmax(m[4], m[5]), fs_qr_pairmax(m[6], m[7]));
    __m256 amax = _mm256_max_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
                                _mm256_permute2f128_ps(q0, q1, 0x31));
    __m256 c127 = _mm256_set1_ps(127.0f);
    __m256 tiny = _mm256_cmp_ps(amax, _mm256_set1_ps(FS_Q_TINY), _CMP_LT_OQ);
    int special = (~okbits | _mm256_movemask_ps(tiny)) & ((1 << t) - 1);
    /* tiny blocks (zeros) and the lanes past t (zeroed maxima) divide as 127 / 127: no
     * division by zero; their outputs are overwritten below */
    amax = _mm256_blendv_ps(amax, c127, tiny);
    _Alignas(32) float ids[8], dd[8];
    _mm256_store_ps(ids, _mm256_div_ps(c127, amax));
    _mm256_store_ps(dd, _mm256_div_ps(amax, c127));
    __m256i sums[8];
    for (int j = t; j < 8; j++) sums[j] = _mm256_setzero_si256();
    for (int j = 0; j < t; j++) {
        const float *x = xb + j * FS_Q_BLOCK;
        __m256 id = _mm256_set1_ps(ids[j]);
        __m256i iv[4];
        for (int k = 0; k < 4; k++)
            iv[k] = _mm256_min_epi32(
                hi, _mm256_max_epi32(
                        lo, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id))));
        sums[j] = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]),
                                       _mm256_packs_epi32(iv[2], iv[3]));
        _mm256_storeu_si256((__m256i *)(void *)(qb + j * FS_Q_BLOCK),
                            _mm256_permutevar8x32_epi32(p, order));
    }
    /* lane j: the sum of sums[j]'s eight lanes (exact in any order) */
    __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[0], sums[1]),
                                   _mm256_hadd_epi32(sums[2], sums[3]));
    __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[4], sums[5]),
                                   _mm256_hadd_epi32(sums[6], sums[7]));
    __m256i tot = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                   _mm256_permute2x128_si256(h0, h1, 0x31));
    _Alignas(32) int32_t ss[8];
    _mm256_store_si256((__m256i *)(void *)ss, tot);
    memcpy(d, dd, sizeof(float) * (size_t)t);
    memcpy(s, ss, sizeof(int32_t) * (size_t)t);
    for (int j = 0; j < t; j++)
        if (special >> j & 1) {
            int bad = !(okbits >> j & 1);
            memset(qb + j * FS_Q_BLOCK, 0, FS_Q_BLOCK);
            d[j] = bad ? NAN : 0.0f;
            s[j] = 0;
        }
}

FS_QR_ATTR void fs_quant_rows_avx2(const float *x, int n, int in, int8_t *q, float *d, int32_t *s)
{
    const int nb = in / FS_Q_BLOCK;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * in;
        int8_t *qr = q + (size_t)r * in;
        float *dr = d + (size_t)r * nb;
        int32_t *sr = s + (size_t)r * nb;
        int b = 0;
        for (; b + 8 <= nb; b += 8)
            fs_qr_blocks(xr + (size_t)b * FS_Q_BLOCK, qr + (size_t)b * FS_Q_BLOCK, dr + b, sr + b,
                         8);
        if (b < nb) /* the last 1-7 blocks */
            fs_qr_blocks(xr + (size_t)b * FS_Q_BLOCK, qr + (size_t)b * FS_Q_BLOCK, dr + b, sr + b,
                         nb - b);
    }
}
#endif
