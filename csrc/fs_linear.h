/* Dense row-major products for the fused transformer runner (fastspec._model).
 *
 * fs_linear_f32 / fs_linear_f64:  y (n, out) [+]= x (n, in) @ W (in, out) [+ bias (out,)]
 * fs_linear_f32h:                 the same as fs_linear_f32 with W stored as IEEE binary16 bits
 *                                 (uint16_t): weights are widened to float in registers (exact,
 *                                 vcvtph2ps) and every product and sum is fs_linear_f32's, so the
 *                                 result is bit-identical to fs_linear_f32 on the widened W while
 *                                 a decode step streams half the bytes.
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
 * and one is picked from the CPU flags: a portable wheel without -march=native still gets wide
 * vectors. Other compilers get the baseline build (and scalar tiles without GCC vectors).
 * Define FS_NO_CLONES to turn multi-versioning off.
 *
 * Bit-identical float16 weights: the float kernels (f32 and f32h) come from ONE macro body that
 * differs only in how 16 weights are loaded, and all their arithmetic is on 16-lane float
 * vectors (column remainders too, through zero-padded vectors). GCC contracts a*b+c into FMA
 * where the target has it (AVX-512F has it for 16-lane vectors, not for scalars/narrower
 * vectors without AVX512VL); with identical statements on identical vector types the two
 * instantiations are contracted identically, so f32h == f32 on widened weights in every variant.
 * The float16 variants need F16C, which target_clones cannot add to its "avx2" clone, so both
 * float kernels use explicit target attributes and a dispatch on __builtin_cpu_supports.
 */
#ifndef FS_LINEAR_H
#define FS_LINEAR_H

#include <stddef.h>
#include <stdint.h>
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
FS_DEFINE_TILE(double, f64, fs_lin_vf64, 8)
#define FS_LIN_VEC(SFX, x, W, y, R, in, out, lo, hi, acc) \
    fs_lin_vec_##SFX(x, W, y, R, in, out, lo, hi, acc)

/* --- float kernels: f32 (float weights) and f32h (binary16 weights) ------------------------- */

#if defined(__GNUC__)
#if defined(__x86_64__) && !defined(__clang__) && defined(__linux__) && !defined(FS_NO_CLONES)
#define FS_LINF_SIMD 1
#include <immintrin.h>
#define FS_LINF_AVX512_F32 __attribute__((target("avx512f")))
#define FS_LINF_AVX2_F32 __attribute__((target("avx2")))
#define FS_LINF_AVX512_F32H __attribute__((target("avx512f,f16c")))
#define FS_LINF_AVX2_F32H __attribute__((target("avx2,f16c")))
#else
#define FS_LINF_SIMD 0
#endif

typedef union { fs_lin_vf32 v; float f[16]; } fs_linf_u;

/* Loads of 16 weights into *dst (LOADW), or of m < 16 of them zero-padded (LOADW_PART). */
#define FS_LINF_LOAD_F32(dst, p) (*(dst) = *(const fs_lin_vf32 *)(const void *)(p))
#define FS_LINF_PART_F32(dst, p, m) fs_linf_part_f32(dst, p, m)
FS_LIN_INLINE void fs_linf_part_f32(fs_lin_vf32 *dst, const float *p, int m)
{
    fs_linf_u u = {{0}};
    memcpy(u.f, p, (size_t)m * sizeof(float));
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
#define FS_LINF_LOAD_F32H_AVX2(dst, p) fs_linf_load_h_avx2(dst, p)
FS_LIN_INLINE FS_LINF_AVX2_F32H void fs_linf_load_h_avx2(fs_lin_vf32 *dst, const uint16_t *p)
{
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)));
    *dst = (fs_lin_vf32)__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                12, 13, 14, 15);
}
#endif
/* m < 16 binary16 weights, zero-padded, widened with the variant's full load. */
#define FS_LINF_PART_F32H(LOADW, dst, p, m)                                                    \
    do {                                                                                       \
        uint16_t hb_[16] = {0};                                                                \
        memcpy(hb_, p, (size_t)(m) * sizeof(uint16_t));                                        \
        LOADW(dst, hb_);                                                                       \
    } while (0)

/* The float kernels for weight type WT, variant V (name suffix), target attribute ATTR.
 * LOADW(dst, p) loads 16 weights; LOADP(dst, p, m) loads m < 16 of them zero-padded. */
#define FS_DEFINE_LINEAR_F(V, WT, ATTR, LOADW, LOADP)                                          \
/* A tile of R rows x NV vectors of y at column c0 over rows [k0, k1) of W, in registers. */   \
FS_LIN_INLINE ATTR void fs_linf_tile_##V(const float *FS_LIN_RESTRICT x,                       \
                                         const WT *FS_LIN_RESTRICT W,                          \
                                         float *FS_LIN_RESTRICT y, const int R, const int NV,  \
                                         int in, int out, int c0, int k0, int k1,              \
                                         int accumulate)                                       \
{                                                                                              \
    fs_lin_vf32 acc[FS_LIN_MAXR * 8];                                                          \
    FS_LIN_UNROLL for (int r = 0; r < R; r++)                                                  \
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)                                             \
            acc[r * NV + v] = (accumulate || k0 > 0)                                           \
                ? *(const fs_lin_vf32 *)(y + (size_t)r * out + c0 + v * 16) : (fs_lin_vf32){0};\
    for (int k = k0; k < k1; k++) {                                                            \
        const WT *w = W + (size_t)k * out + c0;                                                \
        if (FS_LIN_PF_TILES)                                                                   \
            FS_LIN_UNROLL for (int v = 0; v < NV; v++)                                         \
                __builtin_prefetch(w + (FS_LIN_PF_TILES * NV + v) * 16, 0, 3);                 \
        fs_lin_vf32 wv[8];                                                                     \
        FS_LIN_UNROLL for (int v = 0; v < NV; v++) LOADW(&wv[v], w + v * 16);                  \
        FS_LIN_UNROLL for (int r = 0; r < R; r++) {                                            \
            const float a = x[(size_t)r * in + k];                                             \
            FS_LIN_UNROLL for (int v = 0; v < NV; v++) acc[r * NV + v] += a * wv[v];           \
        }                                                                                      \
    }                                                                                          \
    FS_LIN_UNROLL for (int r = 0; r < R; r++)                                                  \
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)                                             \
            *(fs_lin_vf32 *)(y + (size_t)r * out + c0 + v * 16) = acc[r * NV + v];             \
}                                                                                              \
                                                                                               \
/* Columns [lo, hi): full tiles of NV vectors, then single vectors; returns the first column  \
 * not covered. Blocks of FS_LIN_KB rows of W, each swept across all columns: W is read as a  \
 * few sequential streams and y is reloaded once per block (from L1). */                       \
FS_LIN_INLINE ATTR int fs_linf_cols_##V(const float *x, const WT *W, float *y, const int R,    \
                                        const int NV, int in, int out, int lo, int hi,         \
                                        int accumulate)                                        \
{                                                                                              \
    int c0 = lo;                                                                               \
    for (int k0 = 0; k0 < in; k0 += FS_LIN_KB) {                                               \
        int k1 = k0 + FS_LIN_KB < in ? k0 + FS_LIN_KB : in;                                    \
        for (c0 = lo; c0 + NV * 16 <= hi; c0 += NV * 16)                                       \
            fs_linf_tile_##V(x, W, y, R, NV, in, out, c0, k0, k1, accumulate);                 \
        for (; c0 + 16 <= hi; c0 += 16)                                                        \
            fs_linf_tile_##V(x, W, y, R, 1, in, out, c0, k0, k1, accumulate);                  \
    }                                                                                          \
    return c0;                                                                                 \
}                                                                                              \
                                                                                               \
FS_LIN_INLINE ATTR int fs_linf_vec_##V(const float *x, const WT *W, float *y, int R, int in,   \
                                       int out, int lo, int hi, int accumulate)                \
{                                                                                              \
    switch (R) {                                                                               \
    case 2: return fs_linf_cols_##V(x, W, y, 2, 4, in, out, lo, hi, accumulate);               \
    case 3: return fs_linf_cols_##V(x, W, y, 3, 2, in, out, lo, hi, accumulate);               \
    case 4: return fs_linf_cols_##V(x, W, y, 4, 2, in, out, lo, hi, accumulate);               \
    case 5: return fs_linf_cols_##V(x, W, y, 5, 2, in, out, lo, hi, accumulate);               \
    case 6: return fs_linf_cols_##V(x, W, y, 6, 2, in, out, lo, hi, accumulate);               \
    case 7: return fs_linf_cols_##V(x, W, y, 7, 2, in, out, lo, hi, accumulate);               \
    case 8: return fs_linf_cols_##V(x, W, y, 8, 2, in, out, lo, hi, accumulate);               \
    case 9: return fs_linf_cols_##V(x, W, y, 9, 2, in, out, lo, hi, accumulate);               \
    default: return fs_linf_cols_##V(x, W, y, 10, 2, in, out, lo, hi, accumulate);             \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* One row, columns [lo, hi): four rows of W per pass over y (which stays in L1); the last     \
 * m < 16 columns go through zero-padded vectors (the same arithmetic as full ones). Each     \
 * y[c] takes its products in k order, one multiply-add at a time, exactly as in a tile, so a \
 * row gives the same bits alone (decode) as inside a block (verification). */               \
FS_LIN_INLINE ATTR void fs_linf_row_##V(const float *FS_LIN_RESTRICT x,                        \
                                        const WT *FS_LIN_RESTRICT W,                           \
                                        float *FS_LIN_RESTRICT y, int in, int out, int lo,     \
                                        int hi, int accumulate)                                \
{                                                                                              \
    if (!accumulate)                                                                           \
        for (int c = lo; c < hi; c++) y[c] = 0.0f;                                             \
    int cv = lo + (hi - lo) / 16 * 16, m = hi - cv;                                            \
    fs_linf_u yt;                                                                              \
    if (m) fs_linf_part_f32(&yt.v, y + cv, m);                                                 \
    int k = 0;                                                                                 \
    for (; k + 4 <= in; k += 4) {                                                              \
        const float a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];                   \
        const WT *w0 = W + (size_t)k * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;    \
        fs_lin_vf32 v0, v1, v2, v3;                                                            \
        for (int c = lo; c < cv; c += 16) {                                                    \
            LOADW(&v0, w0 + c); LOADW(&v1, w1 + c); LOADW(&v2, w2 + c); LOADW(&v3, w3 + c);    \
            fs_lin_vf32 t = *(fs_lin_vf32 *)(y + c);                                           \
            t += a0 * v0; t += a1 * v1; t += a2 * v2; t += a3 * v3;                            \
            *(fs_lin_vf32 *)(y + c) = t;                                                       \
        }                                                                                      \
        if (m) {                                                                               \
            LOADP(&v0, w0 + cv, m); LOADP(&v1, w1 + cv, m);                                    \
            LOADP(&v2, w2 + cv, m); LOADP(&v3, w3 + cv, m);                                    \
            yt.v += a0 * v0; yt.v += a1 * v1; yt.v += a2 * v2; yt.v += a3 * v3;                \
        }                                                                                      \
    }                                                                                          \
    for (; k < in; k++) {                                                                      \
        const float a = x[k];                                                                  \
        const WT *w = W + (size_t)k * out;                                                     \
        fs_lin_vf32 v0;                                                                        \
        for (int c = lo; c < cv; c += 16) {                                                    \
            LOADW(&v0, w + c);                                                                 \
            *(fs_lin_vf32 *)(y + c) += a * v0;                                                 \
        }                                                                                      \
        if (m) {                                                                               \
            LOADP(&v0, w + cv, m);                                                             \
            yt.v += a * v0;                                                                    \
        }                                                                                      \
    }                                                                                          \
    if (m) memcpy(y + cv, yt.f, (size_t)m * sizeof(float));                                    \
}                                                                                              \
                                                                                               \
/* Columns [c0, hi), c0 + 16 > hi, not covered by tiles: zero-padded vector axpy per row. */   \
FS_LIN_INLINE ATTR void fs_linf_tail_##V(const float *FS_LIN_RESTRICT x,                       \
                                         const WT *FS_LIN_RESTRICT W,                          \
                                         float *FS_LIN_RESTRICT y, int R, int in, int out,     \
                                         int c0, int hi, int accumulate)                       \
{                                                                                              \
    int m = hi - c0;                                                                           \
    for (int r = 0; r < R; r++) {                                                              \
        float *yr = y + (size_t)r * out;                                                       \
        fs_linf_u yt = {{0}};                                                                  \
        if (accumulate) fs_linf_part_f32(&yt.v, yr + c0, m);                                   \
        for (int k = 0; k < in; k++) {                                                         \
            const float a = x[(size_t)r * in + k];                                             \
            fs_lin_vf32 v0;                                                                    \
            LOADP(&v0, W + (size_t)k * out + c0, m);                                           \
            yt.v += a * v0;                                                                    \
        }                                                                                      \
        memcpy(yr + c0, yt.f, (size_t)m * sizeof(float));                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* All n rows, columns [lo, hi). */                                                            \
static ATTR void fs_linf_part_##V(const float *x, const WT *W, float *y, int n, int in,        \
                                  int out, int lo, int hi, int accumulate)                     \
{                                                                                              \
    /* Split n rows into passes of at most FS_LIN_MAXR, as even as possible. */                \
    int passes = (n + FS_LIN_MAXR - 1) / FS_LIN_MAXR;                                          \
    int r0 = 0;                                                                                \
    for (int p = 0; p < passes; p++) {                                                         \
        int R = (n - r0 + (passes - p) - 1) / (passes - p);                                    \
        const float *xp = x + (size_t)r0 * in;                                                 \
        float *yp = y + (size_t)r0 * out;                                                      \
        if (R == 1) {                                                                          \
            fs_linf_row_##V(xp, W, yp, in, out, lo, hi, accumulate);                           \
        } else {                                                                               \
            int c0 = fs_linf_vec_##V(xp, W, yp, R, in, out, lo, hi, accumulate);               \
            if (c0 < hi) fs_linf_tail_##V(xp, W, yp, R, in, out, c0, hi, accumulate);         \
        }                                                                                      \
        r0 += R;                                                                               \
    }                                                                                          \
}

#define FS_LINF_PART_F32H_DEF(dst, p, m) FS_LINF_PART_F32H(FS_LINF_LOAD_F32H_DEF, dst, p, m)
FS_DEFINE_LINEAR_F(f32_def, float, , FS_LINF_LOAD_F32, FS_LINF_PART_F32)
FS_DEFINE_LINEAR_F(f32h_def, uint16_t, , FS_LINF_LOAD_F32H_DEF, FS_LINF_PART_F32H_DEF)
#if FS_LINF_SIMD
#define FS_LINF_PART_F32H_AVX2(dst, p, m) FS_LINF_PART_F32H(FS_LINF_LOAD_F32H_AVX2, dst, p, m)
#define FS_LINF_PART_F32H_AVX512(dst, p, m) FS_LINF_PART_F32H(FS_LINF_LOAD_F32H_AVX512, dst, p, m)
FS_DEFINE_LINEAR_F(f32_avx2, float, FS_LINF_AVX2_F32, FS_LINF_LOAD_F32, FS_LINF_PART_F32)
FS_DEFINE_LINEAR_F(f32_avx512, float, FS_LINF_AVX512_F32, FS_LINF_LOAD_F32, FS_LINF_PART_F32)
FS_DEFINE_LINEAR_F(f32h_avx2, uint16_t, FS_LINF_AVX2_F32H, FS_LINF_LOAD_F32H_AVX2,
                   FS_LINF_PART_F32H_AVX2)
FS_DEFINE_LINEAR_F(f32h_avx512, uint16_t, FS_LINF_AVX512_F32H, FS_LINF_LOAD_F32H_AVX512,
                   FS_LINF_PART_F32H_AVX512)
#endif

/* The widest variant the CPU runs (same choice for both weight types: AVX-512F CPUs all have
 * F16C, so f32 and f32h always run the same arithmetic). */
#if FS_LINF_SIMD
#define FS_LINF_DISPATCH(SFX, args)                                                            \
    do {                                                                                       \
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c"))               \
            fs_linf_part_##SFX##_avx512 args;                                                  \
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))             \
            fs_linf_part_##SFX##_avx2 args;                                                    \
        else                                                                                   \
            fs_linf_part_##SFX##_def args;                                                     \
    } while (0)
#else
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
#endif /* __GNUC__ */
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
FS_DEFINE_LINEAR(float, f32)
/* fs_linear_part_f32 of the scalar build on widened weights. */
static void fs_linear_part_f32h(const float *x, const uint16_t *W, float *y, int n, int in,
                                int out, int lo, int hi, int accumulate)
{
    int passes = (n + FS_LIN_MAXR - 1) / FS_LIN_MAXR;
    int r0 = 0;
    for (int p = 0; p < passes; p++) {
        int R = (n - r0 + (passes - p) - 1) / (passes - p);
        const float *xp = x + (size_t)r0 * in;
        float *yp = y + (size_t)r0 * out;
        for (int r = 0; r < R; r++) {
            float *yr = yp + (size_t)r * out;
            if (!accumulate)
                for (int c = lo; c < hi; c++) yr[c] = 0.0f;
        }
        if (R == 1) {
            int k = 0;
            for (; k + 4 <= in; k += 4) {
                const float a0 = xp[k], a1 = xp[k + 1], a2 = xp[k + 2], a3 = xp[k + 3];
                const uint16_t *w0 = W + (size_t)k * out, *w1 = w0 + out, *w2 = w1 + out,
                               *w3 = w2 + out;
                for (int c = lo; c < hi; c++)
                    yp[c] += (a0 * fs_h2f(w0[c]) + a1 * fs_h2f(w1[c]))
                             + (a2 * fs_h2f(w2[c]) + a3 * fs_h2f(w3[c]));
            }
            for (; k < in; k++)
                for (int c = lo; c < hi; c++) yp[c] += xp[k] * fs_h2f(W[(size_t)k * out + c]);
        } else {
            for (int r = 0; r < R; r++)
                for (int k = 0; k < in; k++)
                    for (int c = lo; c < hi; c++)
                        yp[(size_t)r * out + c] += xp[(size_t)r * in + k]
                                                   * fs_h2f(W[(size_t)k * out + c]);
        }
        r0 += R;
    }
}
#endif
FS_DEFINE_LINEAR_API(float, float, f32)
FS_DEFINE_LINEAR_API(float, uint16_t, f32h)

#endif /* FS_LINEAR_H */
