/* Fused decoder forward for fastspec._model (toy and Llama/Qwen families).
 *
 * Everything here runs without the GIL and cannot fail: the Cython runner checks shapes,
 * ranges and capacity first and hands over raw pointers to weights, cache and scratch.
 * The float and double versions are generated from fs_model_impl.h.
 *
 * Layouts (all C-contiguous):
 *   linear weights (in, out) so that a projection is x @ W   (fastspec's internal layout)
 *   KV cache of one layer (n_kv_heads, capacity, head_dim); layer l starts at l * layer_stride
 *   rope tables (max_pos, head_dim / 2)
 */
#ifndef FS_MODEL_H
#define FS_MODEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fs_linear.h"

/* The attention kernel shared with fastspec._kernels (one implementation of attention). */
#include "fs_attention.h"

enum { FS_ACT_SWIGLU = 0, FS_ACT_TANH = 1, FS_ACT_GELU = 2 };

/* exp(x) for x <= 0 in double, branch-free so that the activation loops vectorise (glibc's
 * exp does not, and SwiGLU needs n * ffn_dim of them per layer). Relative error ~1e-15;
 * x < -708 gives 0. */
static inline double fs_model_exp_nonpos(double x)
{
    const double log2e = 1.4426950408889634074;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double shifter = 6755399441055744.0; /* 1.5 * 2^52: rounds to an integer */
    double xc = x < -708.0 ? -708.0 : x;
    double kd = xc * log2e + shifter;
    uint64_t kbits;
    memcpy(&kbits, &kd, sizeof kbits);
    kd -= shifter;
    double r = (xc - kd * ln2_hi) - kd * ln2_lo; /* |r| <= ln2 / 2 */
    double p = 1.0 / 479001600.0;                /* Taylor, degree 12: error < 2e-16 */
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

/* silu(g) = g / (1 + exp(-g)), through exp(-|g|) only. */
static inline double fs_model_silu(double g)
{
    double e = fs_model_exp_nonpos(g < 0 ? g : -g);
    return g >= 0 ? g / (1.0 + e) : g * e / (1.0 + e);
}

/* tanh(t) = sign(t) (1 - e) / (1 + e) with e = exp(-2|t|). */
static inline double fs_model_tanh(double t)
{
    double a = t < 0 ? -t : t;
    double e = fs_model_exp_nonpos(-2.0 * a);
    double y = (1.0 - e) / (1.0 + e);
    return t < 0 ? -y : y;
}

typedef struct {
    int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, max_pos;
    int rmsnorm;   /* 1: RMSNorm with weights; 0: LayerNorm without affine parameters */
    int rope;      /* 1: rotary positions; 0: learned absolute positions (pos_embed) */
    int act;       /* FS_ACT_* */
    int qk_norm;   /* per-head RMSNorm of q and k (Qwen3) */
    double eps;
} fs_dims;

/* Scratch rows per position, in elements of the model dtype:
 * x, h (dim each); q, att (H*D each); k, v (Hkv*D each); f1, f2 (ffn each). */
static inline size_t fs_scratch_row(const fs_dims *d)
{
    return 2 * (size_t)d->dim + 2 * (size_t)d->n_heads * d->head_dim
           + 2 * (size_t)d->n_kv_heads * d->head_dim + 2 * (size_t)d->ffn_dim;
}

#define FS_CAT_(a, b) a##_##b
#define FS_CAT(a, b) FS_CAT_(a, b)

#define FS_T float
#define FS_SFX f32
#include "fs_model_impl.h"
#undef FS_T
#undef FS_SFX

#define FS_T double
#define FS_SFX f64
#include "fs_model_impl.h"
#undef FS_T
#undef FS_SFX

#endif /* FS_MODEL_H */
