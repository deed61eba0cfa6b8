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

/* The attention kernel shared with fastspec._kernels; a local fallback keeps this file
 * building on its own. */
#if defined(__has_include)
#if __has_include("fs_attention.h")
#include "fs_attention.h"
#define FS_HAVE_ATTENTION_H 1
#endif
#endif

enum { FS_ACT_SWIGLU = 0, FS_ACT_TANH = 1, FS_ACT_GELU = 2 };

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
