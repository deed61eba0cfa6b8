/* fs_linear_avx512.c -- the AVX-512F (+ F16C for binary16 weights) variant of the packed
 * float products (fs_linear_f32.inc), one zmm register per 64-byte vector (32 registers). */
#include "fs_variants.h"

#if FS_LINF_SIMD
#include <immintrin.h>

#define FS_LINF_AVX512_F32 __attribute__((target("avx512f")))
#define FS_LINF_AVX512_F32H __attribute__((target("avx512f,f16c")))

/* 16 weights as one 16-lane vector (bfloat16: 16 bits up into the float's upper half). */
#define FS_LINF_LOAD_F32(p) (*(const fs_v16f_u *)(const void *)(p))
#define FS_LINF_LOAD_F32H_AVX512(p) \
    ((fs_v16f_u)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p))))
#define FS_LINF_LOAD_BF16_AVX512(p)                                                           \
    ((fs_v16f_u)_mm512_castsi512_ps(_mm512_slli_epi32(                                      \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)))

#define FS_SFX f32_avx512
#define FS_WT float
#define FS_ATTR FS_LINF_AVX512_F32
#define FS_LOADV FS_LINF_LOAD_F32
#define FS_YMM 0
#include "fs_linear_f32.inc"
#define FS_SFX f32h_avx512
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX512_F32H
#define FS_LOADV FS_LINF_LOAD_F32H_AVX512
#define FS_YMM 0
#include "fs_linear_f32.inc"
#define FS_SFX f32b_avx512
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX512_F32
#define FS_LOADV FS_LINF_LOAD_BF16_AVX512
#define FS_YMM 0
#include "fs_linear_f32.inc"
#endif /* FS_LINF_SIMD */
