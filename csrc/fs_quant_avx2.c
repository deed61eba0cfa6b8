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
 * so the same bytes (tests/c/quant.c compares the two). */
__attribute__((target("avx2,fma,f16c"))) void fs_quant_rows_avx2(const float *x, int n, int in,
                                                                  int8_t *q, float *d,
                                                                  int32_t *s)
{
    const int nb = in / FS_Q_BLOCK;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)r * in + (size_t)b * FS_Q_BLOCK;
            int8_t *qb = q + (size_t)r * in + (size_t)b * FS_Q_BLOCK;
            __m256 v[4], m, ok;
            for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
            m = _mm256_and_ps(v[0], absmask);
            ok = _mm256_cmp_ps(m, big, _CMP_LE_OQ);
            for (int k = 1; k < 4; k++) {
                __m256 a = _mm256_and_ps(v[k], absmask);
                ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
                m = _mm256_max_ps(m, a);
            }
            int bad = _mm256_movemask_ps(ok) != 0xff;
            m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
            m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
            m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
            float amax = _mm256_cvtss_f32(m);
            size_t rb = (size_t)r * nb + b;
            if (bad || amax < FS_Q_TINY) {
                memset(qb, 0, FS_Q_BLOCK);
                d[rb] = bad ? NAN : 0.0f;
                s[rb] = 0;
                continue;
            }
            __m256 id = _mm256_set1_ps(127.0f / amax);
            __m256i iv[4];
            for (int k = 0; k < 4; k++)
                iv[k] = _mm256_min_epi32(
                    hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id))));
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]),
                                           _mm256_add_epi32(iv[2], iv[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum),
                                       _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]),
                                           _mm256_packs_epi32(iv[2], iv[3]));
            _mm256_storeu_si256((__m256i *)(void *)qb, _mm256_permutevar8x32_epi32(p, order));
            d[rb] = amax / 127.0f;
            s[rb] = _mm_cvtsi128_si32(s4);
        }
}
#endif
