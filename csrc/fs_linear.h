/* Dense row-major products for the fused transformer runner.
 *
 * fs_linear_f32 / fs_linear_f64:  y (n, out) [+]= x (n, in) @ W (in, out) [+ bias (out,)]
 *
 * All matrices are C-contiguous. The inner loop runs over `out` (contiguous in W and y), so it
 * vectorises without reassociating sums. Up to FS_LIN_MAXR rows of x are handled per pass
 * over W with their accumulators held in registers: a 9-token verification step reads each
 * weight matrix once instead of nine times, which is what keeps it close to the cost of a
 * 1-token decode step (weights stream from cache/DRAM; the FMAs are nearly free).
 *
 * With GCC on x86-64 Linux the entry points are compiled three times (AVX-512, AVX2, baseline)
 * and the loader picks one (ifunc): a portable wheel without -march=native still gets wide
 * vectors. Other compilers get the baseline build.
 */
#ifndef FS_LINEAR_H
#define FS_LINEAR_H

#include <stddef.h>
#include <string.h>

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

/* Most rows of x handled in one pass over W (accumulators: rows x 2 vectors <= 20 zmm). */
#define FS_LIN_MAXR 10

#if defined(__GNUC__)
/* 64-byte vectors (one zmm; two ymm or four xmm in the narrower clones), unaligned access. */
typedef float fs_lin_vf32 __attribute__((vector_size(64), aligned(4)));
typedef double fs_lin_vf64 __attribute__((vector_size(64), aligned(8)));

/* A tile of R rows x NV vectors of y, accumulated in registers over the whole `in` axis.
 * R and NV are compile-time constants after inlining. */
#define FS_DEFINE_TILE(T, SFX, VT, VL)                                                         \
FS_LIN_INLINE void fs_lin_tile_##SFX(const T *FS_LIN_RESTRICT x, const T *FS_LIN_RESTRICT W,   \
                                     T *FS_LIN_RESTRICT y, const int R, const int NV, int in,  \
                                     int out, int c0, int accumulate)                          \
{                                                                                              \
    VT acc[FS_LIN_MAXR * 8];                                                                   \
    for (int r = 0; r < R; r++)                                                                \
        for (int v = 0; v < NV; v++)                                                           \
            acc[r * NV + v] = accumulate ? *(const VT *)(y + (size_t)r * out + c0 + v * VL)    \
                                         : (VT){0};                                            \
    for (int k = 0; k < in; k++) {                                                             \
        const T *w = W + (size_t)k * out + c0;                                                 \
        VT wv[8];                                                                              \
        for (int v = 0; v < NV; v++) wv[v] = *(const VT *)(w + v * VL);                        \
        for (int r = 0; r < R; r++) {                                                          \
            const T a = x[(size_t)r * in + k];                                                 \
            for (int v = 0; v < NV; v++) acc[r * NV + v] += a * wv[v];                         \
        }                                                                                      \
    }                                                                                          \
    for (int r = 0; r < R; r++)                                                                \
        for (int v = 0; v < NV; v++)                                                           \
            *(VT *)(y + (size_t)r * out + c0 + v * VL) = acc[r * NV + v];                      \
}                                                                                              \
                                                                                               \
/* Columns [c0, out): full tiles of NV vectors, then single vectors; returns the first        \
 * column not covered. */                                                                      \
FS_LIN_INLINE int fs_lin_cols_##SFX(const T *x, const T *W, T *y, const int R, const int NV,   \
                                    int in, int out, int accumulate)                           \
{                                                                                              \
    int c0 = 0;                                                                                \
    for (; c0 + NV * VL <= out; c0 += NV * VL)                                                 \
        fs_lin_tile_##SFX(x, W, y, R, NV, in, out, c0, accumulate);                            \
    for (; c0 + VL <= out; c0 += VL)                                                           \
        fs_lin_tile_##SFX(x, W, y, R, 1, in, out, c0, accumulate);                             \
    return c0;                                                                                 \
}                                                                                              \
                                                                                               \
FS_LIN_INLINE int fs_lin_vec_##SFX(const T *x, const T *W, T *y, int R, int in, int out,       \
                                   int accumulate)                                             \
{                                                                                              \
    switch (R) {                                                                               \
    case 1: return fs_lin_cols_##SFX(x, W, y, 1, 8, in, out, accumulate);                      \
    case 2: return fs_lin_cols_##SFX(x, W, y, 2, 4, in, out, accumulate);                      \
    case 3: return fs_lin_cols_##SFX(x, W, y, 3, 2, in, out, accumulate);                      \
    case 4: return fs_lin_cols_##SFX(x, W, y, 4, 2, in, out, accumulate);                      \
    case 5: return fs_lin_cols_##SFX(x, W, y, 5, 2, in, out, accumulate);                      \
    case 6: return fs_lin_cols_##SFX(x, W, y, 6, 2, in, out, accumulate);                      \
    case 7: return fs_lin_cols_##SFX(x, W, y, 7, 2, in, out, accumulate);                      \
    case 8: return fs_lin_cols_##SFX(x, W, y, 8, 2, in, out, accumulate);                      \
    case 9: return fs_lin_cols_##SFX(x, W, y, 9, 2, in, out, accumulate);                      \
    default: return fs_lin_cols_##SFX(x, W, y, 10, 2, in, out, accumulate);                    \
    }                                                                                          \
}
FS_DEFINE_TILE(float, f32, fs_lin_vf32, 16)
FS_DEFINE_TILE(double, f64, fs_lin_vf64, 8)
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, acc) fs_lin_vec_##SFX(x, W, y, R, in, out, acc)
#else
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, acc) 0
#endif

/* Columns [c0, out) not covered by vector tiles: plain axpy rows. */
#define FS_DEFINE_LINEAR(T, SFX)                                                               \
FS_LIN_INLINE void fs_lin_tail_##SFX(const T *FS_LIN_RESTRICT x, const T *FS_LIN_RESTRICT W,   \
                                     T *FS_LIN_RESTRICT y, int R, int in, int out, int c0,     \
                                     int accumulate)                                           \
{                                                                                              \
    for (int r = 0; r < R; r++) {                                                              \
        T *yr = y + (size_t)r * out;                                                           \
        if (!accumulate)                                                                       \
            for (int c = c0; c < out; c++) yr[c] = (T)0;                                       \
        for (int k = 0; k < in; k++) {                                                         \
            const T a = x[(size_t)r * in + k];                                                 \
            const T *w = W + (size_t)k * out;                                                  \
            for (int c = c0; c < out; c++) yr[c] += a * w[c];                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
FS_LIN_CLONES static void fs_linear_##SFX(const T *x, const T *W, const T *bias, T *y,         \
                                          int n, int in, int out, int accumulate)              \
{                                                                                              \
    /* Split n rows into passes of at most FS_LIN_MAXR, as even as possible. */                \
    int passes = (n + FS_LIN_MAXR - 1) / FS_LIN_MAXR;                                          \
    int r0 = 0;                                                                                \
    for (int p = 0; p < passes; p++) {                                                         \
        int R = (n - r0 + (passes - p) - 1) / (passes - p);                                    \
        const T *xp = x + (size_t)r0 * in;                                                     \
        T *yp = y + (size_t)r0 * out;                                                          \
        int c0 = FS_LIN_VEC(SFX, xp, W, yp, R, in, out, accumulate);                           \
        if (c0 < out) fs_lin_tail_##SFX(xp, W, yp, R, in, out, c0, accumulate);                \
        r0 += R;                                                                               \
    }                                                                                          \
    if (bias != NULL)                                                                          \
        for (int r = 0; r < n; r++)                                                            \
            for (int c = 0; c < out; c++) y[(size_t)r * out + c] += bias[c];                   \
}

FS_DEFINE_LINEAR(float, f32)
FS_DEFINE_LINEAR(double, f64)

#endif /* FS_LINEAR_H */
