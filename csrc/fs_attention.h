/* fs_attention.h -- attention over a KV cache: plain C inner loops, float and double.
 *
 * SHARED: this header is #included by fastspec/_kernels.pyx (the `attention` kernel) AND by
 * the fused Cython model forward. Keep the two public signatures below stable:
 *
 *   q (n, n_heads, head_dim); k, v (n_kv_heads, capacity, head_dim); out (n, n_heads, head_dim)
 *   keys [0, length) are valid; query i sits at position length - n + i; causal: it sees keys
 *   <= that position, non-causal: every valid key. Grouped-query: head h reads kv head
 *   h / (n_heads / n_kv_heads). scratch: caller-provided, at least `length` doubles.
 *   Preconditions (checked by the caller, never here): 1 <= n <= length <= capacity,
 *   n_heads % n_kv_heads == 0, head_dim >= 1, all arrays C-contiguous. Cannot fail.
 *
 * Numerics: float64 inputs, and float32 inputs whose head_dim is not a multiple of 16 (or is
 * over 128), go through the template below: scores, softmax and the weighted sum of values
 * accumulated in double. Other float32 inputs use the tiled float kernel of
 * fs_attention_f32.h (float inside tiles of 128 keys, double across them). Either way a
 * float32 result is within ~1e-6 relative of the float64 computation (the NumPy twin).
 *
 * Speed: the hot loops are written so that GCC vectorises them; with GCC on x86-64 Linux they
 * are compiled in AVX-512, AVX2 and baseline variants (function multi-versioning, picked at
 * load time), which gives wide SIMD in a portable wheel without -march=native. Other compilers
 * get the baseline code. Define FS_NO_CLONES to turn multi-versioning off.
 */
#ifndef FS_ATTENTION_H
#define FS_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ifunc-based multi-versioning needs GCC, x86-64 and glibc; already building for AVX-512
 * (FASTSPEC_NATIVE=1) makes it pointless. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && defined(__GLIBC__) && !defined(FS_NO_CLONES) && !defined(__AVX512F__)
#define FS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FS_CLONES
#endif

#if defined(__GNUC__)
#define FS_RESTRICT __restrict__
#else
#define FS_RESTRICT
#endif

/* Number of queries of one kv head handled together: their dot products share each key row
 * load, and their weighted sums share each value row load. */
#define FS_ATTN_ROWS 4
/* Values are accumulated in chunks of this many dimensions (the double accumulators live on
 * the stack; any head_dim works). */
#define FS_ATTN_DCHUNK 128

/* exp(x) for x <= 0 in double, branch-free so loops over it vectorise. Relative error
 * ~1e-15; x < -708 gives 0 (those weights are below 1e-307 of the row maximum, which is 1). */
static inline double fs_exp_nonpos(double x)
{
    const double log2e = 1.4426950408889634074;
    const double ln2_hi = 6.93147180369123816490e-01;
    const double ln2_lo = 1.90821492927058770002e-10;
    const double shifter = 6755399441055744.0; /* 1.5 * 2^52: rounds to integer in the low bits */
    double xc = x < -708.0 ? -708.0 : x;
    double kd = xc * log2e + shifter;
    uint64_t kbits;
    memcpy(&kbits, &kd, sizeof kbits);
    kd -= shifter;
    double r = (xc - kd * ln2_hi) - kd * ln2_lo; /* |r| <= ln2 / 2 */
    /* Taylor polynomial of degree 12 in Horner form: error < 2e-16 on |r| <= 0.347 */
    double p = 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t sbits = (kbits + 1023u) << 52; /* 2^k, k in [-1022, 0] */
    double scale;
    memcpy(&scale, &sbits, sizeof scale);
    return x < -708.0 ? 0.0 : p * scale;
}

/* s[j] <- exp(s[j] - m) for j < count; return the sum (double). */
FS_CLONES static double fs_attn_exp_sum(double *FS_RESTRICT s, int count, double m)
{
    double total = 0.0;
    for (int j = 0; j < count; j++) {
        double e = fs_exp_nonpos(s[j] - m);
        s[j] = e;
        total += e;
    }
    return total;
}

/* ---- float / double variants, generated from one template ---------------------------- */

#if defined(__GNUC__)
#define FS_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define FS_ALWAYS_INLINE static inline
#endif

/* Keys are processed in tiles that stay in L1 while every row of a block reads them. */
#define FS_ATTN_TILE 64
/* Keys per step of the online softmax (long ranges, several rows). */
#define FS_ATTN_ONLINE_TILE 256

#if defined(__GNUC__) && !defined(__clang__)
/* The vector helpers below are always inlined, so the ABI note about passing 64-byte
 * vectors by value does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#if defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 9) && !defined(FS_DISABLE_VEC)
/* Explicit 8-wide double vectors: GCC/clang map them to one zmm, two ymm or four xmm
 * registers depending on the clone; loads go through memcpy (unaligned, alias-safe). */
typedef double fs_v8d __attribute__((vector_size(64)));
typedef float fs_v8f __attribute__((vector_size(32)));
FS_ALWAYS_INLINE fs_v8d fs_load8_f64(const double *p)
{
    fs_v8d x;
    memcpy(&x, p, sizeof x);
    return x;
}
FS_ALWAYS_INLINE fs_v8d fs_load8_f32(const float *p)
{
    fs_v8f x;
    memcpy(&x, p, sizeof x);
    return __builtin_convertvector(x, fs_v8d);
}
#define FS_HSUM8(a) ((((a)[0] + (a)[4]) + ((a)[1] + (a)[5])) + (((a)[2] + (a)[6]) + ((a)[3] + (a)[7])))
#define FS_HAVE_VEC 1
#else
#define FS_HAVE_VEC 0
#endif

#if FS_HAVE_VEC
#define FS_ATTN_DOT4(SFX, T)                                                                   \
        fs_v8d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                         \
        int d = 0;                                                                             \
        for (; d + 8 <= D; d += 8) {                                                           \
            fs_v8d x = fs_load8_##SFX(qr + d);                                                 \
            a0 += x * fs_load8_##SFX(k0 + d);                                                  \
            a1 += x * fs_load8_##SFX(k1 + d);                                                  \
            a2 += x * fs_load8_##SFX(k2 + d);                                                  \
            a3 += x * fs_load8_##SFX(k3 + d);                                                  \
        }                                                                                      \
        double t0 = FS_HSUM8(a0), t1 = FS_HSUM8(a1), t2 = FS_HSUM8(a2), t3 = FS_HSUM8(a3);
#else
#define FS_ATTN_DOT4(SFX, T)                                                                   \
        double t0 = 0.0, t1 = 0.0, t2 = 0.0, t3 = 0.0;                                         \
        int d = 0;
#endif

#define FS_ATTN_DEFINE(SFX, T)                                                                 \
/* sr[j] = scale * dot(qr, k[j]) for j in [j0, j1), in double (products of two floats are     \
 * exact in double). Four keys at a time keep independent accumulator chains in flight. */    \
FS_ALWAYS_INLINE void fs_attn_dots_##SFX(const T *FS_RESTRICT qr, const T *FS_RESTRICT k,      \
                                         int j0, int j1, int D, double scale,                 \
                                         double *FS_RESTRICT sr)                              \
{                                                                                              \
    int j = j0;                                                                                \
    for (; j + 4 <= j1; j += 4) {                                                              \
        const T *k0 = k + (size_t)j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;             \
        FS_ATTN_DOT4(SFX, T)                                                                   \
        for (; d < D; d++) {                                                                   \
            double x = (double)qr[d];                                                          \
            t0 += x * (double)k0[d];                                                           \
            t1 += x * (double)k1[d];                                                           \
            t2 += x * (double)k2[d];                                                           \
            t3 += x * (double)k3[d];                                                           \
        }                                                                                      \
        sr[j] = scale * t0;                                                                    \
        sr[j + 1] = scale * t1;                                                                \
        sr[j + 2] = scale * t2;                                                                \
        sr[j + 3] = scale * t3;                                                                \
    }                                                                                          \
    for (; j < j1; j++) {                                                                      \
        const T *k0 = k + (size_t)j * D;                                                       \
        double t0 = 0.0;                                                                       \
        for (int d = 0; d < D; d++)                                                            \
            t0 += (double)qr[d] * (double)k0[d];                                               \
        sr[j] = scale * t0;                                                                    \
    }                                                                                          \
}                                                                                              \
                                                                                               \
FS_ALWAYS_INLINE void fs_attn_scores_body_##SFX(const T *const *q, int rows,                   \
                                                const T *FS_RESTRICT k, int count, int D,     \
                                                double scale, double *s, int stride)          \
{                                                                                              \
    for (int j0 = 0; j0 < count; j0 += FS_ATTN_TILE) {                                         \
        int j1 = count - j0 < FS_ATTN_TILE ? count : j0 + FS_ATTN_TILE;                        \
        for (int r = 0; r < rows; r++)                                                         \
            fs_attn_dots_##SFX(q[r], k, j0, j1, D, scale, s + (size_t)r * stride);             \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* Scores of `rows` queries against keys [0, count), into s + r * stride. Common head        \
 * sizes get their own compiled body (loops fully unrolled, accumulators in registers). */    \
FS_CLONES static void fs_attn_scores_##SFX(const T *const *q, int rows, const T *FS_RESTRICT k, \
                                           int count, int D, double scale, double *s,         \
                                           int stride)                                        \
{                                                                                              \
    if (D == 64)                                                                               \
        fs_attn_scores_body_##SFX(q, rows, k, count, 64, scale, s, stride);                    \
    else if (D == 128)                                                                         \
        fs_attn_scores_body_##SFX(q, rows, k, count, 128, scale, s, stride);                   \
    else if (D == 32)                                                                          \
        fs_attn_scores_body_##SFX(q, rows, k, count, 32, scale, s, stride);                    \
    else                                                                                       \
        fs_attn_scores_body_##SFX(q, rows, k, count, D, scale, s, stride);                     \
}                                                                                              \
                                                                                               \
/* ar[0:W) += sum_j wr[j] * v[j][d0:d0+W) for j in [j0, j1), four keys per pass over ar. */  \
FS_ALWAYS_INLINE void fs_attn_axpy_##SFX(const double *FS_RESTRICT wr, const T *FS_RESTRICT v, \
                                         int j0, int j1, int D, int d0, int W,                \
                                         double *FS_RESTRICT ar)                              \
{                                                                                              \
    int j = j0;                                                                                \
    for (; j + 4 <= j1; j += 4) {                                                              \
        const T *v0 = v + (size_t)j * D + d0, *v1 = v0 + D, *v2 = v1 + D, *v3 = v2 + D;        \
        double w0 = wr[j], w1 = wr[j + 1], w2 = wr[j + 2], w3 = wr[j + 3];                     \
        for (int d = 0; d < W; d++)                                                            \
            ar[d] += (w0 * (double)v0[d] + w1 * (double)v1[d])                                 \
                     + (w2 * (double)v2[d] + w3 * (double)v3[d]);                              \
    }                                                                                          \
    for (; j < j1; j++) {                                                                      \
        const T *v0 = v + (size_t)j * D + d0;                                                  \
        double w0 = wr[j];                                                                     \
        for (int d = 0; d < W; d++)                                                            \
            ar[d] += w0 * (double)v0[d];                                                       \
    }                                                                                          \
}                                                                                              \
                                                                                               \
FS_ALWAYS_INLINE void fs_attn_wsum_body_##SFX(const double *w, int stride, const int *count,   \
                                              int rows, const T *FS_RESTRICT v, int D,        \
                                              int d0, int W, double *FS_RESTRICT acc)         \
{                                                                                              \
    int most = 0;                                                                              \
    for (int r = 0; r < rows; r++)                                                             \
        most = count[r] > most ? count[r] : most;                                              \
    for (int j0 = 0; j0 < most; j0 += FS_ATTN_TILE) {                                          \
        int j1 = most - j0 < FS_ATTN_TILE ? most : j0 + FS_ATTN_TILE;                          \
        for (int r = 0; r < rows; r++) {                                                       \
            int end = count[r] < j1 ? count[r] : j1;                                           \
            if (end > j0)                                                                      \
                fs_attn_axpy_##SFX(w + (size_t)r * stride, v, j0, end, D, d0, W,               \
                                   acc + (size_t)r * FS_ATTN_DCHUNK);                          \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* acc[r][0:W) += sum_j w[r][j] * v[j][d0:d0+W) for j < count[r]. */                         \
FS_CLONES static void fs_attn_wsum_##SFX(const double *w, int stride, const int *count,        \
                                         int rows, const T *FS_RESTRICT v, int D,             \
                                         int d0, int W, double *FS_RESTRICT acc)              \
{                                                                                              \
    if (D == 64 && W == 64)                                                                    \
        fs_attn_wsum_body_##SFX(w, stride, count, rows, v, 64, 0, 64, acc);                    \
    else if (D == 128 && W == 128)                                                             \
        fs_attn_wsum_body_##SFX(w, stride, count, rows, v, 128, 0, 128, acc);                  \
    else if (D == 32 && W == 32)                                                               \
        fs_attn_wsum_body_##SFX(w, stride, count, rows, v, 32, 0, 32, acc);                    \
    else                                                                                       \
        fs_attn_wsum_body_##SFX(w, stride, count, rows, v, D, d0, W, acc);                     \
}                                                                                              \
                                                                                               \
/* One block of `rows` queries that read the same kv head; w holds rows * stride doubles. */  \
static void fs_attn_block_##SFX(const T *const *qrows, T *const *orows, const int *count,      \
                                int rows, const T *kh, const T *vh, int head_dim,            \
                                double scale, double *w, int stride)                          \
{                                                                                              \
    double total[FS_ATTN_ROWS];                                                                \
    double acc[FS_ATTN_ROWS * FS_ATTN_DCHUNK];                                                 \
    int most = 0;                                                                              \
    for (int r = 0; r < rows; r++)                                                             \
        if (count[r] > most)                                                                   \
            most = count[r];                                                                   \
    fs_attn_scores_##SFX(qrows, rows, kh, most, head_dim, scale, w, stride);                   \
    for (int r = 0; r < rows; r++) {                                                           \
        double *wr = w + (size_t)r * stride;                                                   \
        double m = wr[0];                                                                      \
        for (int j = 1; j < count[r]; j++)                                                     \
            m = wr[j] > m ? wr[j] : m;                                                         \
        total[r] = fs_attn_exp_sum(wr, count[r], m);                                           \
    }                                                                                          \
    for (int d0 = 0; d0 < head_dim; d0 += FS_ATTN_DCHUNK) {                                    \
        int width = head_dim - d0 < FS_ATTN_DCHUNK ? head_dim - d0 : FS_ATTN_DCHUNK;           \
        for (int i = 0; i < rows * FS_ATTN_DCHUNK; i++)                                        \
            acc[i] = 0.0;                                                                      \
        fs_attn_wsum_##SFX(w, stride, count, rows, vh, head_dim, d0, width, acc);              \
        for (int r = 0; r < rows; r++) {                                                       \
            double inv = 1.0 / total[r];                                                       \
            for (int d = 0; d < width; d++)                                                    \
                orows[r][d0 + d] = (T)(acc[(size_t)r * FS_ATTN_DCHUNK + d] * inv);             \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* Several rows over a long key range with an online softmax (flash-attention style): keys   \
 * come in tiles of FS_ATTN_ONLINE_TILE, each row keeps its running maximum m, its sum of     \
 * weights l and its weighted sum of values, rescaled by exp(m_old - m_new) when the maximum  \
 * grows. The K/V tiles are read once for the whole block; head_dim <= FS_ATTN_DCHUNK. */     \
static void fs_attn_online_##SFX(const T *const *qrows, T *const *orows, const int *count,     \
                                 int rows, const T *kh, const T *vh, int head_dim,           \
                                 double scale)                                                \
{                                                                                              \
    double s[FS_ATTN_ROWS * FS_ATTN_ONLINE_TILE];                                              \
    double acc[FS_ATTN_ROWS * FS_ATTN_DCHUNK];                                                 \
    double m[FS_ATTN_ROWS], l[FS_ATTN_ROWS];                                                   \
    int most = 0;                                                                              \
    for (int r = 0; r < rows; r++) {                                                           \
        m[r] = -HUGE_VAL;                                                                      \
        l[r] = 0.0;                                                                            \
        most = count[r] > most ? count[r] : most;                                              \
    }                                                                                          \
    for (int i = 0; i < rows * FS_ATTN_DCHUNK; i++)                                            \
        acc[i] = 0.0;                                                                          \
    for (int j0 = 0; j0 < most; j0 += FS_ATTN_ONLINE_TILE) {                                   \
        int width = most - j0 < FS_ATTN_ONLINE_TILE ? most - j0 : FS_ATTN_ONLINE_TILE;         \
        int visible[FS_ATTN_ROWS];                                                             \
        fs_attn_scores_##SFX(qrows, rows, kh + (size_t)j0 * head_dim, width, head_dim, scale,  \
                             s, FS_ATTN_ONLINE_TILE);                                          \
        for (int r = 0; r < rows; r++) {                                                       \
            int c = count[r] - j0;                                                             \
            c = c < 0 ? 0 : (c > width ? width : c);                                           \
            visible[r] = c;                                                                    \
            if (c == 0)                                                                        \
                continue;                                                                      \
            double *sr = s + (size_t)r * FS_ATTN_ONLINE_TILE;                                  \
            double top = sr[0];                                                                \
            for (int j = 1; j < c; j++)                                                        \
                top = sr[j] > top ? sr[j] : top;                                               \
            if (top > m[r]) {                                                                  \
                double shrink = m[r] == -HUGE_VAL ? 0.0 : exp(m[r] - top);                     \
                l[r] *= shrink;                                                                \
                for (int d = 0; d < head_dim; d++)                                             \
                    acc[(size_t)r * FS_ATTN_DCHUNK + d] *= shrink;                             \
                m[r] = top;                                                                    \
            }                                                                                  \
            l[r] += fs_attn_exp_sum(sr, c, m[r]);                                              \
        }                                                                                      \
        fs_attn_wsum_##SFX(s, FS_ATTN_ONLINE_TILE, visible, rows,                              \
                           vh + (size_t)j0 * head_dim, head_dim, 0, head_dim, acc);            \
    }                                                                                          \
    for (int r = 0; r < rows; r++) {                                                           \
        double inv = 1.0 / l[r];                                                               \
        for (int d = 0; d < head_dim; d++)                                                     \
            orows[r][d] = (T)(acc[(size_t)r * FS_ATTN_DCHUNK + d] * inv);                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
static void fs_attention_dbl_##SFX(const T *q, const T *k, const T *v, T *out,                 \
                                   int n, int n_heads, int n_kv_heads, int head_dim,           \
                                   int capacity, int length, int causal, double *scratch)      \
{                                                                                              \
    int group = n_heads / n_kv_heads;                                                          \
    int rows_per_kv = n * group; /* row index t = i * group + g, head h = kv * group + g */   \
    double scale = 1.0 / sqrt((double)head_dim);                                               \
    /* Short ranges: exact two-pass softmax, scores of a block of rows in a stack buffer.      \
     * Long ranges, one row per kv head (decode): two passes with the caller's scratch.        \
     * Long ranges, several rows: online softmax over key tiles, K/V read once per block. */   \
    double stack_w[FS_ATTN_ROWS * 1024];                                                       \
    int online = length > 1024 && rows_per_kv > 1 && head_dim <= FS_ATTN_DCHUNK;               \
    int block = length <= 1024 || online ? FS_ATTN_ROWS : 1;                                   \
    double *w = length <= 1024 ? stack_w : scratch;                                            \
    int stride = length <= 1024 ? 1024 : length;                                               \
    for (int kv = 0; kv < n_kv_heads; kv++) {                                                  \
        const T *kh = k + (size_t)kv * capacity * head_dim;                                    \
        const T *vh = v + (size_t)kv * capacity * head_dim;                                    \
        for (int t0 = 0; t0 < rows_per_kv; t0 += block) {                                      \
            const T *qrows[FS_ATTN_ROWS];                                                      \
            T *orows[FS_ATTN_ROWS];                                                            \
            int count[FS_ATTN_ROWS];                                                           \
            int rows = rows_per_kv - t0 < block ? rows_per_kv - t0 : block;                    \
            for (int r = 0; r < rows; r++) {                                                   \
                int i = (t0 + r) / group, h = kv * group + (t0 + r) % group;                   \
                qrows[r] = q + ((size_t)i * n_heads + h) * head_dim;                           \
                orows[r] = out + ((size_t)i * n_heads + h) * head_dim;                         \
                count[r] = causal ? length - n + i + 1 : length;                               \
            }                                                                                  \
            if (online)                                                                        \
                fs_attn_online_##SFX(qrows, orows, count, rows, kh, vh, head_dim, scale);      \
            else                                                                               \
                fs_attn_block_##SFX(qrows, orows, count, rows, kh, vh, head_dim, scale, w,     \
                                    stride);                                                   \
        }                                                                                      \
    }                                                                                          \
}

FS_ATTN_DEFINE(f32, float)
FS_ATTN_DEFINE(f64, double)

#undef FS_ATTN_DEFINE

#include "fs_attention_f32.h"

static void fs_attention_f64(const double *q, const double *k, const double *v, double *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, int causal, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                         causal, scratch);
}

/* float32: the tiled float kernel where the head size allows it (the choice depends on
 * head_dim only, never on n, so decode and verification agree bit for bit). */
static void fs_attention_f32(const float *q, const float *k, const float *v, float *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, int causal, double *scratch)
{
#if FS_HAVE_VEC
    if (fs_f32_supported(head_dim)) {
        fs_attention_f32_tiled(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity,
                               length, causal);
        return;
    }
#endif
    fs_attention_dbl_f32(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                         causal, scratch);
}

#endif /* FS_ATTENTION_H */
