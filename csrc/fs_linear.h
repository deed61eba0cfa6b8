/* Dense row-major products for the fused transformer runner (fastspec._model).
 *
 * fs_linear_f64:   y (n, out) [+]= x (n, in) @ W (in, out) [+ bias (out,)], W C-contiguous
 * fs_linear_f32:   the same in float, with W packed by fs_pack_f32 (panels of 32 columns)
 * fs_linear_f32h:  the same as fs_linear_f32 with W stored as IEEE binary16 bits (uint16_t,
 *                  packed by fs_pack_f32h): weights are widened to float in registers (exact,
 *                  vcvtph2ps) and every product and sum is fs_linear_f32's, so the result is
 *                  bit-identical to fs_linear_f32 on the widened W while a decode step streams
 *                  half the bytes.
 * fs_linear_f32b:  the same with W stored as bfloat16 bits (uint16_t, packed by fs_pack_f32h,
 *                  which packs any 16-bit type), widened by a 16-bit shift in registers; x
 *                  must hold bf16 values (fs_linear_f32b_round rounds x into a scratch
 *                  buffer first: the bf16 compute rule). Each product of two bf16 values is
 *                  exact in float, so the result is bit-identical to fs_linear_f32 on the
 *                  widened W and the rounded x.
 *
 * Float kernels (the hot path): W is packed once, when a runner is built, into panels of 32
 * columns stored k after k, so that a register tile of up to FS_LIN_MAXR rows x 32 columns
 * (AVX-512; AVX2: up to 6 rows x 16 columns, FS_LIN_MAXR_AVX2, to fit its 16 registers)
 * reads its weights as one sequential stream and keeps its sums in registers over the whole
 * `in` axis. One row (a decode step) streams several panels at once and is bandwidth bound; a
 * verification block of up to one tile of rows reads W once and is bound by the multiply-adds,
 * which overlap the stream instead of following it. Every output takes its products in
 * k order, one multiply-add at a time, for any row count: decode and verification agree bit
 * for bit.
 *
 * Double kernel: unpacked W; inner loops over `out` (contiguous in W and y) vectorise without
 * reassociating sums; one row streams W row after row, several rows use register tiles swept
 * over blocks of FS_LIN_KB rows of W.
 *
 * With OpenMP (FASTSPEC_HAVE_OPENMP, probed by setup.py) large products can split their
 * columns between threads: opt in with fs_linear_set_threads (default 1 thread).
 *
 * With GCC on x86-64 Linux the entry points are compiled three times (AVX-512, AVX2, baseline)
 * and one is picked from the CPU flags: a portable wheel without -march=native still gets wide
 * vectors. Other compilers get the baseline build (and scalar loops without GCC vectors).
 * Define FS_NO_CLONES to turn multi-versioning off. fs_linear_set_path (fs_isa.h's FS_ISA_*
 * values) forces the packed float kernels onto one variant (the FASTSPEC_ISA switch); the
 * caller checks that the CPU runs it.
 *
 * Bit-identical float16 weights: the float kernels (f32, f32h, f32b) come from ONE macro body
 * that differs only in how 16 weights are loaded, and all their arithmetic is on the variant's
 * float vectors (16 lanes; two 8-lane ymm vectors in the AVX2 variant, whose 64-byte generic
 * vectors spilled every accumulator; the last, partial vector of a row too: packing pads it
 * with zero weights). GCC
 * contracts a*b+c into FMA where the target has it; with identical statements on identical
 * vector types the two instantiations are contracted identically, so f32h == f32 on widened
 * weights in every variant (the AVX2 variant is AVX2+FMA+F16C). The float16 variants need F16C,
 * which target_clones cannot add to its "avx2" clone, so the float kernels use explicit target
 * attributes and a dispatch on __builtin_cpu_supports.
 */
#ifndef FS_LINEAR_H
#define FS_LINEAR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fs_isa.h"

#if defined(FASTSPEC_HAVE_OPENMP) && defined(_OPENMP)
#include <omp.h>
#define FS_LIN_OMP 1
#else
#define FS_LIN_OMP 0
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && !defined(FS_NO_CLONES)
#define FS_LIN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FS_LIN_CLONES
#endif

#if defined(__GNUC__)
#define FS_LIN_INLINE static inline __attribute__((always_inline))
#define FS_LIN_RESTRICT __restrict__
#else
#define FS_LIN_INLINE static inline
#define FS_LIN_RESTRICT
#endif

/* The packed float kernels' variant: -1 (default) the widest the CPU runs, else FS_ISA_PORTABLE,
 * FS_ISA_AVX2 or FS_ISA_AVX512 (fs_linear_set_path). Process-wide; set it while no product
 * runs. */
static int fs_lin_path = -1;

/* Most rows of x handled in one pass over W (accumulators: rows x 2 vectors <= 20 zmm). */
#define FS_LIN_MAXR 10
/* ... in the AVX2 variants (16 registers; see FS_LINF_V8). */
#ifndef FS_LIN_MAXR_AVX2
#define FS_LIN_MAXR_AVX2 6
#endif
/* Products with at least this many weights are split between OpenMP threads. */
#ifndef FS_LIN_PARALLEL_MIN
#define FS_LIN_PARALLEL_MIN 65536
#endif

/* binary16 bits -> float, exactly (normals, subnormals, zeros, infinities, NaNs). */
static inline float fs_h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    float f;
    if (e == 0) {  /* zero or subnormal: m * 2^-24, exact in float */
        f = (float)m * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    bits = sign | (e == 0x1f ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* bfloat16 bits -> float: the upper half of the float's bits (exact). */
static inline float fs_bf2f(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float -> the nearest bfloat16 value (ties to even), as a float; NaN stays NaN (quieted),
 * values past the largest bf16 become infinite. The NumPy twin (fastspec._bf16) is the same
 * integer arithmetic. */
static inline uint32_t fs_f2bf_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    return u & 0xffff0000u;
}

/* xr[i] = x[i] rounded to bf16, i < count (xr may be x). */
static void fs_round_bf16(const float *x, float *xr, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t u = fs_f2bf_bits(x[i]);
        memcpy(xr + i, &u, sizeof u);
    }
}

/* Packed layout of the float kernels' W (in, out): columns zero-padded to a multiple of 16
 * and cut into panels of 32 (the last one 16 wide when the padded width is an odd multiple of
 * 16); panel c0 / 32 holds W[k, c0:c0 + width] for every k, contiguously, from P + c0 * in.
 * A tile of rows then reads its weights as one sequential stream per panel. */
static inline size_t fs_packed_len(int in, int out) { return (size_t)in * ((out + 15) / 16 * 16); }
#define FS_DEFINE_PACK(WT, SFX)                                                                \
static void fs_pack_##SFX(const WT *W, int in, int out, WT *P)                                 \
{                                                                                              \
    int outp = (out + 15) / 16 * 16;                                                           \
    for (int c0 = 0; c0 < outp; c0 += 32) {                                                    \
        int width = outp - c0 >= 32 ? 32 : 16;                                                 \
        for (int k = 0; k < in; k++)                                                           \
            for (int j = 0; j < width; j++)                                                    \
                *P++ = c0 + j < out ? W[(size_t)k * out + c0 + j] : (WT)0;                     \
    }                                                                                          \
}
FS_DEFINE_PACK(float, f32)
FS_DEFINE_PACK(uint16_t, f32h)

#if defined(__GNUC__)
/* Software prefetch this many tiles ahead along the rows of W being swept (measured: ~15%
 * off a 9-row product whose weights come from L3/DRAM). */
#ifndef FS_LIN_PF_TILES
#define FS_LIN_PF_TILES 2
#endif
#ifndef FS_LIN_KB
#define FS_LIN_KB 32
#endif
/* Packed float kernels: software prefetch this many k steps ahead in each panel stream
 * (measured on a 9-row product from L3: ~20% off without it). */
#ifndef FS_LIN_PF_K
#define FS_LIN_PF_K 8
#endif
/* Full unrolling keeps every accumulator in a register. */
#define FS_LIN_UNROLL _Pragma("GCC unroll 16")
/* 64-byte vectors (one zmm; two ymm or four xmm in the narrower clones), unaligned access. */
typedef float fs_lin_vf32 __attribute__((vector_size(64), aligned(4)));
typedef double fs_lin_vf64 __attribute__((vector_size(64), aligned(8)));

/* A tile of R rows x NV vectors of y at column c0, accumulated in registers over the whole
 * `in` axis. R and NV are compile-time constants after inlining. */
#define FS_DEFINE_TILE(T, SFX, VT, VL)                                                         \
FS_LIN_INLINE void fs_lin_tile_##SFX(const T *FS_LIN_RESTRICT x, const T *FS_LIN_RESTRICT W,   \
                                     T *FS_LIN_RESTRICT y, const int R, const int NV, int in,  \
                                     int out, int c0, int k0, int k1, int accumulate)          \
{                                                                                              \
    VT acc[FS_LIN_MAXR * 8];                                                                   \
    FS_LIN_UNROLL for (int r = 0; r < R; r++)                                                  \
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)                                             \
            acc[r * NV + v] = (accumulate || k0 > 0)                                           \
                              ? *(const VT *)(y + (size_t)r * out + c0 + v * VL) : (VT){0};    \
    for (int k = k0; k < k1; k++) {                                                            \
        const T *w = W + (size_t)k * out + c0;                                                 \
        if (FS_LIN_PF_TILES)                                                                   \
            FS_LIN_UNROLL for (int v = 0; v < NV; v++)                                         \
                __builtin_prefetch(w + (FS_LIN_PF_TILES * NV + v) * VL, 0, 3);                 \
        VT wv[8];                                                                              \
        FS_LIN_UNROLL for (int v = 0; v < NV; v++) wv[v] = *(const VT *)(w + v * VL);          \
        FS_LIN_UNROLL for (int r = 0; r < R; r++) {                                            \
            const T a = x[(size_t)r * in + k];                                                 \
            FS_LIN_UNROLL for (int v = 0; v < NV; v++) acc[r * NV + v] += a * wv[v];           \
        }                                                                                      \
    }                                                                                          \
    FS_LIN_UNROLL for (int r = 0; r < R; r++)                                                  \
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)                                             \
            *(VT *)(y + (size_t)r * out + c0 + v * VL) = acc[r * NV + v];                      \
}                                                                                              \
                                                                                               \
/* Columns [lo, hi): full tiles of NV vectors, then single vectors; returns the first column  \
 * not covered. */                                                                             \
FS_LIN_INLINE int fs_lin_cols_##SFX(const T *x, const T *W, T *y, const int R, const int NV,   \
                                    int in, int out, int lo, int hi, int accumulate)           \
{                                                                                              \
    /* Blocks of FS_LIN_KB rows of W, each swept across all columns: W is read as a few      \
     * sequential streams (prefetcher-friendly) and y is reloaded once per block (from L1). */ \
    int c0 = lo;                                                                               \
    for (int k0 = 0; k0 < in; k0 += FS_LIN_KB) {                                               \
        int k1 = k0 + FS_LIN_KB < in ? k0 + FS_LIN_KB : in;                                    \
        for (c0 = lo; c0 + NV * VL <= hi; c0 += NV * VL)                                       \
            fs_lin_tile_##SFX(x, W, y, R, NV, in, out, c0, k0, k1, accumulate);                \
        for (; c0 + VL <= hi; c0 += VL)                                                        \
            fs_lin_tile_##SFX(x, W, y, R, 1, in, out, c0, k0, k1, accumulate);                 \
    }                                                                                          \
    return c0;                                                                                 \
}                                                                                              \
                                                                                               \
FS_LIN_INLINE int fs_lin_vec_##SFX(const T *x, const T *W, T *y, int R, int in, int out,       \
                                   int lo, int hi, int accumulate)                             \
{                                                                                              \
    switch (R) {                                                                               \
    case 2: return fs_lin_cols_##SFX(x, W, y, 2, 4, in, out, lo, hi, accumulate);              \
    case 3: return fs_lin_cols_##SFX(x, W, y, 3, 2, in, out, lo, hi, accumulate);              \
    case 4: return fs_lin_cols_##SFX(x, W, y, 4, 2, in, out, lo, hi, accumulate);              \
    case 5: return fs_lin_cols_##SFX(x, W, y, 5, 2, in, out, lo, hi, accumulate);              \
    case 6: return fs_lin_cols_##SFX(x, W, y, 6, 2, in, out, lo, hi, accumulate);              \
    case 7: return fs_lin_cols_##SFX(x, W, y, 7, 2, in, out, lo, hi, accumulate);              \
    case 8: return fs_lin_cols_##SFX(x, W, y, 8, 2, in, out, lo, hi, accumulate);              \
    case 9: return fs_lin_cols_##SFX(x, W, y, 9, 2, in, out, lo, hi, accumulate);              \
    default: return fs_lin_cols_##SFX(x, W, y, 10, 2, in, out, lo, hi, accumulate);            \
    }                                                                                          \
}
FS_DEFINE_TILE(double, f64, fs_lin_vf64, 8)
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, lo, hi, acc) \
    fs_lin_vec_##SFX(x, W, y, R, in, out, lo, hi, acc)

/* --- float kernels: f32 (float weights) and f32h (binary16 weights) ------------------------- */

#if defined(__GNUC__)
#if defined(__x86_64__) && !defined(__clang__) && defined(__linux__) && !defined(FS_NO_CLONES)
#define FS_LINF_SIMD 1
#include <immintrin.h>
#define FS_LINF_AVX512_F32 __attribute__((target("avx512f")))
#define FS_LINF_AVX2_F32 __attribute__((target("avx2,fma")))
#define FS_LINF_AVX512_F32H __attribute__((target("avx512f,f16c")))
#define FS_LINF_AVX2_F32H __attribute__((target("avx2,fma,f16c")))
#else
#define FS_LINF_SIMD 0
#endif

typedef union { fs_lin_vf32 v; float f[16]; } fs_linf_u;
typedef float fs_lin_vf8 __attribute__((vector_size(32), aligned(4)));

/* Loads of 16 weights into *dst (LOADW). */
#define FS_LINF_LOAD_F32(dst, p) (*(dst) = *(const fs_lin_vf32 *)(const void *)(p))
/* The first min(m, 16) floats at p, zero-padded. */
FS_LIN_INLINE void fs_linf_part_f32(fs_lin_vf32 *dst, const float *p, int m)
{
    fs_linf_u u = {{0}};
    memcpy(u.f, p, (size_t)(m < 16 ? m : 16) * sizeof(float));
    *dst = u.v;
}
#define FS_LINF_LOAD_F32H_DEF(dst, p) fs_linf_load_h_def(dst, p)
FS_LIN_INLINE void fs_linf_load_h_def(fs_lin_vf32 *dst, const uint16_t *p)
{
    fs_linf_u u;
    for (int i = 0; i < 16; i++) u.f[i] = fs_h2f(p[i]);
    *dst = u.v;
}
#if FS_LINF_SIMD
#define FS_LINF_LOAD_F32H_AVX512(dst, p) \
    (*(dst) = (fs_lin_vf32)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p))))
/* AVX2 variants work on native 8-lane vectors (fs_lin_vf8): 16 weights are two of them. */
#define FS_LINF_LOAD_F32_AVX2(dst, p)                                                          \
    ((dst)[0] = *(const fs_lin_vf8 *)(const void *)(p),                                        \
     (dst)[1] = *(const fs_lin_vf8 *)(const void *)((p) + 8))
#define FS_LINF_LOAD_F32H_AVX2(dst, p)                                                         \
    ((dst)[0] = (fs_lin_vf8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p))), \
     (dst)[1] = (fs_lin_vf8)_mm256_cvtph_ps(                                                   \
         _mm_loadu_si128((const __m128i *)(const void *)((p) + 8))))
#endif
/* bfloat16: 16 bits up into the float's upper half. */
#define FS_LINF_LOAD_BF16_DEF(dst, p) fs_linf_load_b_def(dst, p)
FS_LIN_INLINE void fs_linf_load_b_def(fs_lin_vf32 *dst, const uint16_t *p)
{
    fs_linf_u u;
    for (int i = 0; i < 16; i++) u.f[i] = fs_bf2f(p[i]);
    *dst = u.v;
}
#if FS_LINF_SIMD
#define FS_LINF_LOAD_BF16_AVX512(dst, p)                                                      \
    (*(dst) = (fs_lin_vf32)_mm512_castsi512_ps(_mm512_slli_epi32(                             \
         _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)))
#define FS_LINF_WIDEN_B8(q)                                                                    \
    ((fs_lin_vf8)_mm256_castsi256_ps(_mm256_slli_epi32(                                        \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(q))), 16)))
#define FS_LINF_LOAD_BF16_AVX2(dst, p)                                                         \
    ((dst)[0] = FS_LINF_WIDEN_B8(p), (dst)[1] = FS_LINF_WIDEN_B8((p) + 8))
#endif
/* The float kernels for weight type WT, variant V (name suffix), target attribute ATTR, on a
 * packed W (see fs_pack_f32). Arithmetic on vectors of type VT, NL of them per 16 columns
 * (64-byte vectors: NL = 1; AVX2's 8-lane vectors: NL = 2, so that every accumulator is a
 * register). LOADW(dst, p) loads 16 weights into dst[0 .. NL-1]. Rows pass through in tiles
 * of at most MAXR; a tile of 1 row reads NP1 panels at once, of 2 rows NP2, of more rows 1,
 * and tiles of more than HALFR rows take each panel as two halves of 16 columns (the second
 * half re-reads the panel from L2: the weights still stream from memory once per tile). */
#define FS_DEFINE_LINEAR_F(V, WT, ATTR, LOADW, VT, NL, MAXR, NP1, NP2, HALFR)                          \
/* y[c0 + i] for i < min(m, lanes), zero past m (m may be <= 0), and its inverse. */           \
FS_LIN_INLINE ATTR void fs_linf_ld_##V(VT *dst, const float *p, int m)                          \
{                                                                                              \
    union { VT v; float f[sizeof(VT) / sizeof(float)]; } u;                                    \
    const int lanes = (int)(sizeof(VT) / sizeof(float));                                       \
    memset(&u, 0, sizeof u);                                                                   \
    if (m > 0) memcpy(u.f, p, (size_t)(m < lanes ? m : lanes) * sizeof(float));                \
    *dst = u.v;                                                                                \
}                                                                                              \
FS_LIN_INLINE ATTR void fs_linf_st_##V(float *p, VT v, int m)                                  \
{                                                                                              \
    union { VT v; float f[sizeof(VT) / sizeof(float)]; } u = {v};                              \
    const int lanes = (int)(sizeof(VT) / sizeof(float));                                       \
    if (m > 0) memcpy(p, u.f, (size_t)(m < lanes ? m : lanes) * sizeof(float));                \
}                                                                                              \
                                                                                               \
/* A tile of R rows x NP panels x NV vectors of 16 columns at column c0 + 16 V0 (NP consecutive \
 * panels of PW = 32 columns, or one of 16; NP = 1 when NV * 16 < PW), accumulated in          \
 * registers over the whole `in` axis while \
 * the panels stream in sequentially. Each y[c] takes its products in k order, one            \
 * multiply-add at a time, whatever R and NP are: a row gives the same bits alone (decode) as  \
 * inside a block (verification). */                                                          \
FS_LIN_INLINE ATTR void fs_linf_tile_##V(const float *FS_LIN_RESTRICT x,                       \
                                         const WT *FS_LIN_RESTRICT P,                          \
                                         float *FS_LIN_RESTRICT y, const int R, const int NP,  \
                                         const int NV, const int PW, const int V0, int in,     \
                                         int out, int c0, int accumulate)                      \
{                                                                                              \
    VT acc[FS_LIN_MAXR * 2 * (NL)];                                                            \
    const int VL = (int)(sizeof(VT) / sizeof(float)), NJ = NP * NV * (NL);                     \
    const size_t ps = (size_t)in * 32;                                                         \
    FS_LIN_UNROLL for (int r = 0; r < R; r++)                                                  \
        FS_LIN_UNROLL for (int j = 0; j < NJ; j++) {                                           \
            int c = c0 + V0 * 16 + j * VL;                                                     \
            if (accumulate) fs_linf_ld_##V(&acc[r * NJ + j], y + (size_t)r * out + c, out - c);\
            else acc[r * NJ + j] = (VT){0};                                                    \
        }                                                                                      \
    for (int k = 0; k < in; k++) {                                                             \
        VT wv[8 * (NL)];                                                                       \
        FS_LIN_UNROLL for (int p = 0; p < NP; p++) {                                           \
            const WT *w = P + p * ps + (size_t)k * PW + V0 * 16;                               \
            FS_LIN_UNROLL for (int v = 0; v < NV; v++) {                                       \
                if (FS_LIN_PF_K) __builtin_prefetch(w + FS_LIN_PF_K * PW + v * 16, 0, 3);     \
                LOADW(&wv[(p * NV + v) * (NL)], w + v * 16);                                   \
            }                                                                                  \
        }                                                                                      \
        FS_LIN_UNROLL for (int r = 0; r < R; r++) {                                            \
            const float a = x[(size_t)r * in + k];                                             \
            FS_LIN_UNROLL for (int j = 0; j < NJ; j++) acc[r * NJ + j] += a * wv[j];           \
        }                                                                                      \
    }                                                                                          \
    FS_LIN_UNROLL for (int r = 0; r < R; r++)                                                  \
        FS_LIN_UNROLL for (int j = 0; j < NJ; j++) {                                           \
            int c = c0 + V0 * 16 + j * VL;                                                     \
            fs_linf_st_##V(y + (size_t)r * out + c, acc[r * NJ + j], out - c);                 \
        }                                                                                      \
}                                                                                              \
                                                                                               \
/* R rows, columns [lo, hi) (lo a multiple of 32; hi == out or a multiple of 32): NP panels   \
 * at a time, then single panels, then the last half panel. */                                 \
FS_LIN_INLINE ATTR void fs_linf_rows_##V(const float *x, const WT *P, float *y, const int R,   \
                                         const int NP, int in, int out, int lo, int hi,        \
                                         int accumulate)                                       \
{                                                                                              \
    int end = hi == out ? (out + 15) / 16 * 16 : hi, c0 = lo;                                  \
    if (R > (HALFR)) {                                                                         \
        for (; c0 + 32 <= end; c0 += 32) {                                                     \
            fs_linf_tile_##V(x, P + (size_t)c0 * in, y, R, 1, 1, 32, 0, in, out, c0, accumulate);\
            fs_linf_tile_##V(x, P + (size_t)c0 * in, y, R, 1, 1, 32, 1, in, out, c0, accumulate);\
        }                                                                                      \
    }                                                                                          \
    for (; c0 + 32 * NP <= end; c0 += 32 * NP)                                                 \
        fs_linf_tile_##V(x, P + (size_t)c0 * in, y, R, NP, 2, 32, 0, in, out, c0, accumulate); \
    for (; c0 + 32 <= end; c0 += 32)                                                           \
        fs_linf_tile_##V(x, P + (size_t)c0 * in, y, R, 1, 2, 32, 0, in, out, c0, accumulate);  \
    if (c0 < end)                                                                              \
        fs_linf_tile_##V(x, P + (size_t)c0 * in, y, R, 1, 1, 16, 0, in, out, c0, accumulate);  \
}                                                                                              \
                                                                                               \
/* All n rows, columns [lo, hi), in passes of at most MAXR rows (as even as possible). With   \
 * 64-byte vectors one row reads four panels at once (eight independent sums hide the         \
 * multiply-add latency), two rows two panels, more rows one panel. */                         \
static ATTR void fs_linf_part_##V(const float *x, const WT *P, float *y, int n, int in,        \
                                  int out, int lo, int hi, int accumulate)                     \
{                                                                                              \
    int passes = (n + (MAXR) - 1) / (MAXR);                                                    \
    int r0 = 0;                                                                                \
    for (int p = 0; p < passes; p++) {                                                         \
        int R = (n - r0 + (passes - p) - 1) / (passes - p);                                    \
        const float *xp = x + (size_t)r0 * in;                                                 \
        float *yp = y + (size_t)r0 * out;                                                      \
        switch (R) {                                                                           \
        case 1: fs_linf_rows_##V(xp, P, yp, 1, NP1, in, out, lo, hi, accumulate); break;       \
        case 2: fs_linf_rows_##V(xp, P, yp, 2, NP2, in, out, lo, hi, accumulate); break;       \
        FS_LINF_CASE(V, 3, MAXR) FS_LINF_CASE(V, 4, MAXR) FS_LINF_CASE(V, 5, MAXR)              \
        FS_LINF_CASE(V, 6, MAXR) FS_LINF_CASE(V, 7, MAXR) FS_LINF_CASE(V, 8, MAXR)              \
        FS_LINF_CASE(V, 9, MAXR)                                                               \
        default: fs_linf_rows_##V(xp, P, yp, (MAXR) < 10 ? (MAXR) : 10, 1, in, out, lo, hi,    \
                                  accumulate); break;                                          \
        }                                                                                      \
        r0 += R;                                                                               \
    }                                                                                          \
}

/* A tile of R rows, compiled only where R <= MAXR (else the default case, never reached). */
#define FS_LINF_CASE(V, R, MAXR)                                                               \
    case R: if ((R) <= (MAXR)) { fs_linf_rows_##V(xp, P, yp, (R) <= (MAXR) ? (R) : 1, 1, in,    \
                                                  out, lo, hi, accumulate); break; }

/* (the vector parameters come as one macro: expand it before FS_DEFINE_LINEAR_F counts them) */
#define FS_DEFINE_LINEAR_FX(...) FS_DEFINE_LINEAR_F(__VA_ARGS__)
#define FS_LINF_V64 fs_lin_vf32, 1, FS_LIN_MAXR, 4, 2, FS_LIN_MAXR
FS_DEFINE_LINEAR_FX(f32_def, float, , FS_LINF_LOAD_F32, FS_LINF_V64)
FS_DEFINE_LINEAR_FX(f32h_def, uint16_t, , FS_LINF_LOAD_F32H_DEF, FS_LINF_V64)
FS_DEFINE_LINEAR_FX(f32b_def, uint16_t, , FS_LINF_LOAD_BF16_DEF, FS_LINF_V64)
#if FS_LINF_SIMD
/* AVX2: 16 ymm registers hold at most 12 accumulators beside the broadcast input (2 x 8-lane
 * vectors per 16 columns): one row reads two panels, 2-3 rows one panel, 4-6 rows half a
 * panel. */
#define FS_LINF_V8 fs_lin_vf8, 2, FS_LIN_MAXR_AVX2, 2, 1, 3
FS_DEFINE_LINEAR_FX(f32_avx2, float, FS_LINF_AVX2_F32, FS_LINF_LOAD_F32_AVX2, FS_LINF_V8)
FS_DEFINE_LINEAR_FX(f32_avx512, float, FS_LINF_AVX512_F32, FS_LINF_LOAD_F32, FS_LINF_V64)
FS_DEFINE_LINEAR_FX(f32h_avx2, uint16_t, FS_LINF_AVX2_F32H, FS_LINF_LOAD_F32H_AVX2, FS_LINF_V8)
FS_DEFINE_LINEAR_FX(f32h_avx512, uint16_t, FS_LINF_AVX512_F32H, FS_LINF_LOAD_F32H_AVX512,
                   FS_LINF_V64)
FS_DEFINE_LINEAR_FX(f32b_avx2, uint16_t, FS_LINF_AVX2_F32, FS_LINF_LOAD_BF16_AVX2, FS_LINF_V8)
FS_DEFINE_LINEAR_FX(f32b_avx512, uint16_t, FS_LINF_AVX512_F32, FS_LINF_LOAD_BF16_AVX512,
                   FS_LINF_V64)
#endif

/* The widest variant the CPU runs (same choice for every weight type: AVX-512F CPUs all have
 * F16C, so f32, f32h and f32b always run the same arithmetic), unless fs_linear_set_path
 * forced one. */
#if FS_LINF_SIMD
static inline int fs_linf_auto(void)
{
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c")) return FS_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && __builtin_cpu_supports("f16c"))
        return FS_ISA_AVX2;
    return FS_ISA_PORTABLE;
}
#define FS_LINF_DISPATCH(SFX, args)                                                            \
    do {                                                                                       \
        int path_ = fs_lin_path < 0 ? fs_linf_auto() : fs_lin_path;                            \
        if (path_ == FS_ISA_AVX512)                                                            \
            fs_linf_part_##SFX##_avx512 args;                                                  \
        else if (path_ == FS_ISA_AVX2)                                                         \
            fs_linf_part_##SFX##_avx2 args;                                                    \
        else                                                                                   \
            fs_linf_part_##SFX##_def args;                                                     \
    } while (0)
#else
static inline int fs_linf_auto(void) { return FS_ISA_PORTABLE; }
#define FS_LINF_DISPATCH(SFX, args) fs_linf_part_##SFX##_def args
#endif
static void fs_linear_part_f32(const float *x, const float *W, float *y, int n, int in, int out,
                               int lo, int hi, int accumulate)
{
    FS_LINF_DISPATCH(f32, (x, W, y, n, in, out, lo, hi, accumulate));
}
static void fs_linear_part_f32h(const float *x, const uint16_t *W, float *y, int n, int in,
                                int out, int lo, int hi, int accumulate)
{
    FS_LINF_DISPATCH(f32h, (x, W, y, n, in, out, lo, hi, accumulate));
}
static void fs_linear_part_f32b(const float *x, const uint16_t *W, float *y, int n, int in,
                                int out, int lo, int hi, int accumulate)
{
    FS_LINF_DISPATCH(f32b, (x, W, y, n, in, out, lo, hi, accumulate));
}
#endif /* __GNUC__ */
#else
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, lo, hi, acc) (lo)
static inline int fs_linf_auto(void) { return FS_ISA_PORTABLE; }
#endif

/* Force path p (-1: automatic); returns 0, or -1 when this build or CPU cannot run it. */
static inline int fs_linear_set_path(int p)
{
    if (p < -1 || p > FS_ISA_AVX512 || (p > fs_linf_auto())) return -1;
    fs_lin_path = p;
    return 0;
}
/* The variant the next product runs. */
static inline int fs_linear_get_path(void) { return fs_lin_path < 0 ? fs_linf_auto() : fs_lin_path; }

#define FS_DEFINE_LINEAR(T, SFX)                                                               \
/* One row, columns [lo, hi): four rows of W per pass over y (which stays in L1). */           \
FS_LIN_INLINE void fs_lin_row_##SFX(const T *FS_LIN_RESTRICT x, const T *FS_LIN_RESTRICT W,    \
                                    T *FS_LIN_RESTRICT y, int in, int out, int lo, int hi,     \
                                    int accumulate)                                            \
{                                                                                              \
    if (!accumulate)                                                                           \
        for (int c = lo; c < hi; c++) y[c] = (T)0;                                             \
    int k = 0;                                                                                 \
    for (; k + 4 <= in; k += 4) {                                                              \
        const T a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];                       \
        const T *w0 = W + (size_t)k * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;     \
        for (int c = lo; c < hi; c++)                                                          \
            y[c] += (a0 * w0[c] + a1 * w1[c]) + (a2 * w2[c] + a3 * w3[c]);                     \
    }                                                                                          \
    for (; k < in; k++) {                                                                      \
        const T a = x[k];                                                                      \
        const T *w = W + (size_t)k * out;                                                      \
        for (int c = lo; c < hi; c++) y[c] += a * w[c];                                        \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* Columns [c0, hi) not covered by vector tiles: plain axpy rows. */                           \
FS_LIN_INLINE void fs_lin_tail_##SFX(const T *FS_LIN_RESTRICT x, const T *FS_LIN_RESTRICT W,   \
                                     T *FS_LIN_RESTRICT y, int R, int in, int out, int c0,     \
                                     int hi, int accumulate)                                   \
{                                                                                              \
    for (int r = 0; r < R; r++) {                                                              \
        T *yr = y + (size_t)r * out;                                                           \
        if (!accumulate)                                                                       \
            for (int c = c0; c < hi; c++) yr[c] = (T)0;                                        \
        for (int k = 0; k < in; k++) {                                                         \
            const T a = x[(size_t)r * in + k];                                                 \
            const T *w = W + (size_t)k * out;                                                  \
            for (int c = c0; c < hi; c++) yr[c] += a * w[c];                                   \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* All n rows, columns [lo, hi). */                                                            \
FS_LIN_CLONES static void fs_linear_part_##SFX(const T *x, const T *W, T *y, int n, int in,    \
                                               int out, int lo, int hi, int accumulate)        \
{                                                                                              \
    /* Split n rows into passes of at most FS_LIN_MAXR, as even as possible. */                \
    int passes = (n + FS_LIN_MAXR - 1) / FS_LIN_MAXR;                                          \
    int r0 = 0;                                                                                \
    for (int p = 0; p < passes; p++) {                                                         \
        int R = (n - r0 + (passes - p) - 1) / (passes - p);                                    \
        const T *xp = x + (size_t)r0 * in;                                                     \
        T *yp = y + (size_t)r0 * out;                                                          \
        if (R == 1) {                                                                          \
            fs_lin_row_##SFX(xp, W, yp, in, out, lo, hi, accumulate);                          \
        } else {                                                                               \
            int c0 = FS_LIN_VEC(SFX, xp, W, yp, R, in, out, lo, hi, accumulate);               \
            if (c0 < hi) fs_lin_tail_##SFX(xp, W, yp, R, in, out, c0, hi, accumulate);         \
        }                                                                                      \
        r0 += R;                                                                               \
    }                                                                                          \
}                                                                                              \
                                                                                               \

#define FS_DEFINE_LINEAR_API(T, WT, SFX)                                                       \
static void fs_linear_##SFX(const T *x, const WT *W, const T *bias, T *y, int n, int in,       \
                            int out, int accumulate)                                           \
{                                                                                              \
    int parts = 1;                                                                             \
    if (FS_LIN_OMP && (size_t)in * out >= FS_LIN_PARALLEL_MIN && out >= 128)                   \
        parts = fs_lin_threads();                                                              \
    if (parts <= 1) {                                                                          \
        fs_linear_part_##SFX(x, W, y, n, in, out, 0, out, accumulate);                         \
    } else {                                                                                   \
        /* Column blocks on 32-element boundaries, so every thread runs whole tiles. */        \
        int chunk = ((out + parts - 1) / parts + 31) / 32 * 32;                                \
        FS_LIN_PRAGMA_PARALLEL                                                                 \
        for (int p = 0; p < parts; p++) {                                                      \
            int lo = p * chunk, hi = lo + chunk < out ? lo + chunk : out;                      \
            if (lo < hi) fs_linear_part_##SFX(x, W, y, n, in, out, lo, hi, accumulate);        \
        }                                                                                      \
    }                                                                                          \
    if (bias != NULL)                                                                          \
        for (int r = 0; r < n; r++)                                                            \
            for (int c = 0; c < out; c++) y[(size_t)r * out + c] += bias[c];                   \
}

/* Threads for large products: 1 by default. On a loaded machine (or one shared with other
 * BLAS/OpenMP users) a descheduled worker stalls every barrier, which costs far more than
 * the bandwidth a second core adds to a decode step; callers opt in. */
static int fs_lin_nthreads = 1;
static inline void fs_linear_set_threads(int n) { fs_lin_nthreads = n < 1 ? 1 : n; }
static inline int fs_linear_get_threads(void) { return fs_lin_nthreads; }
#if FS_LIN_OMP
#define FS_LIN_PRAGMA_PARALLEL _Pragma("omp parallel for num_threads(parts) schedule(static, 1)")
static inline int fs_lin_threads(void) { return fs_lin_nthreads; }
#else
#define FS_LIN_PRAGMA_PARALLEL
static inline int fs_lin_threads(void) { return 1; }
#endif

FS_DEFINE_LINEAR(double, f64)
FS_DEFINE_LINEAR_API(double, double, f64)
#if !defined(__GNUC__)
/* The float kernels of the scalar build: the packed layout, products in k order. */
#define FS_DEFINE_LINEAR_F_SCALAR(WT, SFX, WIDEN)                                              \
static void fs_linear_part_##SFX(const float *x, const WT *P, float *y, int n, int in,         \
                                 int out, int lo, int hi, int accumulate)                      \
{                                                                                              \
    int outp = (out + 15) / 16 * 16;                                                           \
    for (int c = lo; c < hi; c++) {                                                            \
        int c0 = c / 32 * 32, width = outp - c0 >= 32 ? 32 : 16;                               \
        const WT *w = P + (size_t)c0 * in + (c - c0);                                          \
        for (int r = 0; r < n; r++) {                                                          \
            float s = accumulate ? y[(size_t)r * out + c] : 0.0f;                              \
            for (int k = 0; k < in; k++) s += x[(size_t)r * in + k] * WIDEN(w[(size_t)k * width]);\
            y[(size_t)r * out + c] = s;                                                        \
        }                                                                                      \
    }                                                                                          \
}
#define FS_LIN_SAME(w) (w)
FS_DEFINE_LINEAR_F_SCALAR(float, f32, FS_LIN_SAME)
FS_DEFINE_LINEAR_F_SCALAR(uint16_t, f32h, fs_h2f)
FS_DEFINE_LINEAR_F_SCALAR(uint16_t, f32b, fs_bf2f)
#endif
FS_DEFINE_LINEAR_API(float, float, f32)
FS_DEFINE_LINEAR_API(float, uint16_t, f32h)
FS_DEFINE_LINEAR_API(float, uint16_t, f32b)

/* The bf16 compute rule: y (n, out) [+]= round_bf16(x) @ W for bf16 W (packed), the rounded
 * rows written to xr (n * in floats, may be x itself) once, before any thread starts. */
static void fs_linear_f32b_round(const float *x, const uint16_t *W, const float *bias, float *y,
                                 int n, int in, int out, int accumulate, float *xr)
{
    fs_round_bf16(x, xr, (size_t)n * in);
    fs_linear_f32b(xr, W, bias, y, n, in, out, accumulate);
}

#endif /* FS_LINEAR_H */
