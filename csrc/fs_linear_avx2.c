/* fs_linear_avx2.c -- the AVX2 + FMA (+ F16C for binary16 weights) variant of the packed
 * float products (fs_linear_f32.inc), on native 8-lane vectors: 64-byte generic vectors
 * spilled every accumulator there (16 ymm registers). */
#include "fs_variants.h"

#if FS_LINF_SIMD
#include <immintrin.h>

#define FS_LINF_AVX2_F32 __attribute__((target("avx2,fma")))
#define FS_LINF_AVX2_F32H __attribute__((target("avx2,fma,f16c")))

/* 16 weights are two 8-lane vectors. */
#define FS_LINF_LOAD_F32_AVX2(dst, p)                                                          \
    ((dst)[0] = *(const fs_v8f_u *)(const void *)(p),                                        \
     (dst)[1] = *(const fs_v8f_u *)(const void *)((p) + 8))
#define FS_LINF_LOAD_F32H_AVX2(dst, p)                                                         \
    ((dst)[0] = (fs_v8f_u)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p))), \
     (dst)[1] = (fs_v8f_u)_mm256_cvtph_ps(                                                   \
         _mm_loadu_si128((const __m128i *)(const void *)((p) + 8))))
#define FS_LINF_WIDEN_B8(q)                                                                    \
    ((fs_v8f_u)_mm256_castsi256_ps(_mm256_slli_epi32(                                        \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(q))), 16)))
#define FS_LINF_LOAD_BF16_AVX2(dst, p)                                                         \
    ((dst)[0] = FS_LINF_WIDEN_B8(p), (dst)[1] = FS_LINF_WIDEN_B8((p) + 8))

#define FS_SFX f32_avx2
#define FS_WT float
#define FS_ATTR FS_LINF_AVX2_F32
#define FS_LOADW FS_LINF_LOAD_F32_AVX2
#define FS_YMM 1
#include "fs_linear_f32.inc"
#define FS_SFX f32h_avx2
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX2_F32H
#define FS_LOADW FS_LINF_LOAD_F32H_AVX2
#define FS_YMM 1
#include "fs_linear_f32.inc"
#define FS_SFX f32b_avx2
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX2_F32
#define FS_LOADW FS_LINF_LOAD_BF16_AVX2
#define FS_YMM 1
#include "fs_linear_f32.inc"
#endif /* FS_LINF_SIMD */
