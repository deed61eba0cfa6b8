/* fs_linear_avx2.c -- the AVX2 + FMA (+ F16C for binary16 weights) variant of the packed
 * float products (fs_linear_f32.inc), on native 8-lane vectors (16 ymm registers). */
#include "fs_variants.h"

#if FS_LINF_SIMD
#include <immintrin.h>

#define FS_LINF_AVX2_F32 __attribute__((target("avx2,fma")))
#define FS_LINF_AVX2_F32H __attribute__((target("avx2,fma,f16c")))

/* 8 weights as one 8-lane vector: float32 as is, binary16 by vcvtph2ps, bfloat16 moved into
 * the float's upper half (zero-extend, shift by 16: exact). */
#define FS_LINF_LOAD_F32_AVX2(p) (*(const fs_v8f_u *)(const void *)(p))
#define FS_LINF_LOAD_F32H_AVX2(p) \
    ((fs_v8f_u)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p))))
#define FS_LINF_LOAD_BF16_AVX2(p)                                                              \
    ((fs_v8f_u)_mm256_castsi256_ps(_mm256_slli_epi32(                                        \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16)))

/* 16 bfloat16 weights as two vectors, each 16-bit unpacked with zeros below it (one shuffle
 * per 8 weights, port 5 on Intel; no shift on the multiply-add ports), in the lane order of
 * fs_linf_ld2 (fs_linear_f32.inc). */
#define FS_LINF_LOAD2_BF16_AVX2(p, lo, hi)                                                     \
    do {                                                                                       \
        const __m256i v_ = _mm256_loadu_si256((const __m256i *)(const void *)(p));             \
        const __m256i z_ = _mm256_setzero_si256();                                             \
        (lo) = (fs_v8f_u)_mm256_castsi256_ps(_mm256_unpacklo_epi16(z_, v_));                   \
        (hi) = (fs_v8f_u)_mm256_castsi256_ps(_mm256_unpackhi_epi16(z_, v_));                   \
    } while (0)

#define FS_SFX f32_avx2
#define FS_WT float
#define FS_ATTR FS_LINF_AVX2_F32
#define FS_LOADV FS_LINF_LOAD_F32_AVX2
#define FS_YMM 1
#include "fs_linear_f32.inc"
#define FS_SFX f32h_avx2
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX2_F32H
#define FS_LOADV FS_LINF_LOAD_F32H_AVX2
#define FS_YMM 1
#include "fs_linear_f32.inc"
#define FS_SFX f32b_avx2
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX2_F32
#define FS_LOADV FS_LINF_LOAD_BF16_AVX2
#define FS_LOADV2 FS_LINF_LOAD2_BF16_AVX2
#define FS_YMM 1
#include "fs_linear_f32.inc"
#endif /* FS_LINF_SIMD */
