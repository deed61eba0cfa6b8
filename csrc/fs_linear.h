/* Dense row-major products for the fused transformer runner (fastspec._model).
 *
 * fs_linear_f32 / fs_linear_f64:  y (n, out) [+]= x (n, in) @ W (in, out) [+ bias (out,)]
 *
 * All matrices are C-contiguous. The inner loops run over `out` (contiguous in W and y), so
 * they vectorise without reassociating sums.
 * - One row (a decode step) streams W row after row: purely sequential reads, which is what
 *   the hardware prefetcher serves at full bandwidth (a decode step is bandwidth bound).
 * - Several rows (a verification step) use register tiles of up to FS_LIN_MAXR rows x 2
 *   vectors accumulated over the whole `in` axis, so W is read once for up to 10 rows: a
 *   9-token verification step then costs about one weight pass plus nearly free FMAs.
 * - With OpenMP (FASTSPEC_HAVE_OPENMP, probed by setup.py) large products can split their
 *   columns between threads: opt in with fs_linear_set_threads (default 1 thread).
 *
 * With GCC on x86-64 Linux the entry points are compiled three times (AVX-512, AVX2, baseline)
 * and the loader picks one (ifunc): a portable wheel without -march=native still gets wide
 * vectors. Other compilers get the baseline build (and scalar tiles without GCC vectors).
 * Define FS_NO_CLONES to turn multi-versioning off.
 */
#ifndef FS_LINEAR_H
#define FS_LINEAR_H

#include <stddef.h>
#include <string.h>

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

/* Most rows of x handled in one pass over W (accumulators: rows x 2 vectors <= 20 zmm). */
#define FS_LIN_MAXR 10
/* Products with at least this many weights are split between OpenMP threads. */
#ifndef FS_LIN_PARALLEL_MIN
#define FS_LIN_PARALLEL_MIN 65536
#endif

#if defined(__GNUC__)
/* Software prefetch this many tiles ahead along the rows of W being swept (measured: ~15%
 * off a 9-row product whose weights come from L3/DRAM). */
#ifndef FS_LIN_PF_TILES
#define FS_LIN_PF_TILES 2
#endif
#ifndef FS_LIN_KB
#define FS_LIN_KB 32
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
FS_DEFINE_TILE(float, f32, fs_lin_vf32, 16)
FS_DEFINE_TILE(double, f64, fs_lin_vf64, 8)
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, lo, hi, acc) \
    fs_lin_vec_##SFX(x, W, y, R, in, out, lo, hi, acc)
#else
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, lo, hi, acc) (lo)
#endif

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
static void fs_linear_##SFX(const T *x, const T *W, const T *bias, T *y, int n, int in,        \
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

FS_DEFINE_LINEAR(float, f32)
FS_DEFINE_LINEAR(double, f64)

#endif /* FS_LINEAR_H */
