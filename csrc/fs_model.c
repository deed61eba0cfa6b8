/* fs_model.c -- the fused decoder forward (fs_model.h): four instantiations of fs_model.inc. */
#include "fs_model.h"

#include "fs_attention.h"
#include "fs_common.h"
#include "fs_linear.h"
#include "fs_pool.h"
#include "fs_quant.h"

/* Activations go through fs_exp_nonpos (fs_common.h): branch-free, so their loops
 * vectorise (glibc's exp does not, and SwiGLU needs n * ffn_dim of them per layer). */

/* silu(g) = g / (1 + exp(-g)), through exp(-|g|) only. */
static inline double fs_model_silu(double g)
{
    double e = fs_exp_nonpos(g < 0 ? g : -g);
    return (g >= 0 ? g : g * e) / (1.0 + e); /* one division: the vector loop's slowest op */
}

/* tanh(t) = sign(t) (1 - e) / (1 + e) with e = exp(-2|t|). */
static inline double fs_model_tanh(double t)
{
    double a = t < 0 ? -t : t;
    double e = fs_exp_nonpos(-2.0 * a);
    double y = (1.0 - e) / (1.0 + e);
    return t < 0 ? -y : y;
}

/* The phases of a layer's row-wise work (fs_rows_part, fs_model.inc). */
enum { FS_ROWS_ATTN_NORM, FS_ROWS_QKV, FS_ROWS_ATTN_POST, FS_ROWS_MLP_NORM, FS_ROWS_ACT,
       FS_ROWS_MLP_POST };
/* From this many rows (a prompt, a 16-row block) that work goes to the pool's threads
 * (fs_rows_run). The real SmolLM2 file's 256-row prefill at 2 threads, q8_0, in-process A/B
 * (Zen 4 EPYC, 2 vCPUs): 0.95-0.96 of the time with the phases on the caller, and 0.96-0.99
 * beside a busy loop; idle, a first version without the awake check: q4_1 0.91, bf16 0.95,
 * f16 0.98. Since blocks keep the workers awake (FS_KEEP_MIN_ROWS), from 16 rows rather than
 * 32 (in-process A/B at 2 threads, medians of 9 rounds): 16-row steps of the real file q8_0
 * 10.24-10.40 -> 9.79-9.99 ms, q4_1 10.39 -> 10.02, the SmolLM-135M shape float16 24.32 ->
 * 23.84 and bf16 20.45 -> 20.29; 12-row steps the same; beside a busy loop the same (q8_0
 * 17.56 -> 17.55). From 8 rows, 8-row steps gained nothing (q8_0 5.76 -> 5.81 ms). */
#ifndef FS_ROWS_PARALLEL_MIN
#define FS_ROWS_PARALLEL_MIN 16
#endif
/* From this many rows (every step but a decode step: a verification block, a tree, a drafter's
 * block, a prompt) the layers keep the pool's workers awake (fs_pool_keep_awake, fs_pool.h).
 * Between a block's jobs the caller works alone (attention, the row-wise work), at 16 rows
 * often longer than the 30 us spin, and a worker that slept is woken late or, by the wake-gap
 * rule (fs_pool.c), not at all: a scratch count over 40 16-row steps of the SmolLM-135M shape
 * with bf16 weights at 2 threads found 1617-2990 of 3050-4423 jobs run on the caller alone
 * (0-3 of 6040 with the keeping). In-process A/B at 2 threads (Zen 4 EPYC KVM guest, 2 vCPUs,
 * medians of 7-11 rounds, keeping from 2 rows against from 32), 16-row steps: that shape
 * 18.9-23.3 -> 16.3-20.4 ms on the avx512bf16 path (four processes), 42.0 -> 38.2 ms on the
 * forced avx2 path; the real SmolLM2 file q8_0 10.1 -> 10.2, 10.5 -> 10.6 and 14.5 -> 13.5 ms
 * (three processes). 2-8 rows, q4_1, float16 and `fastspec demo` the same within 3%, and
 * beside a busy loop too. Decode steps do not keep: beside a busy loop their 2-thread goal
 * needs the worker asleep. */
#ifndef FS_KEEP_MIN_ROWS
#define FS_KEEP_MIN_ROWS 2
#endif

/* Sequence position of new row i: positions[i] for a tree step, else pos0 + i. */
static inline int fs_model_pos(const int32_t *positions, int pos0, int i)
{
    return positions ? positions[i] : pos0 + i;
}

/* Widest input of a product, and at least 16: the rows of xb, the bf16-rounded copy of a
 * product's input (on the tile paths, amx and avx512bf16, fs_amx_kp(in) bf16 bits a row,
 * which fit in max(in, 16) floats). */
static inline size_t fs_scratch_in(const fs_dims *d)
{
    size_t w = (size_t)d->dim, hd = (size_t)d->n_heads * d->head_dim;
    if (hd > w) w = hd;
    if ((size_t)d->ffn_dim > w) w = (size_t)d->ffn_dim;
    return w > 16 ? w : 16;
}

size_t fs_scratch_row(const fs_dims *d)
{
    return 2 * (size_t)d->dim + 2 * (size_t)d->n_heads * d->head_dim
           + 2 * (size_t)d->n_kv_heads * d->head_dim + 2 * (size_t)d->ffn_dim
           + fs_scratch_in(d);
}

/* FS_T: compute dtype; FS_W: dtype of the big matrices (wq .. w_down, embed, head); FS_SFX:
 * suffix of the model functions; FS_TSFX: suffix of what depends on FS_T only (scratch, norms,
 * activations, attention), defined by the FS_W == FS_T instantiation. FS_WHALF: FS_W is
 * 16-bit storage (uint16_t) widened by FS_WIDEN (embedding rows) and the fs_linear_<FS_SFX>
 * kernel; FS_WBF16: that storage is bfloat16 and every product rounds its input rows to bf16
 * first (fs_linear_f32b_round, into the scratch rows xb). FS_WQUANT: FS_W is fs_qmat, every
 * product is fs_linear_q (activations quantized per block, fs_quant.h) and the embedding
 * lookup dequantizes rows (fs_quant_rows_f32). */
#define FS_T float
#define FS_W float
#define FS_SFX f32
#define FS_TSFX f32
#define FS_WHALF 0
#define FS_WBF16 0
#include "fs_model.inc"

#define FS_T double
#define FS_W double
#define FS_SFX f64
#define FS_TSFX f64
#define FS_TDOUBLE 1
#define FS_WHALF 0
#define FS_WBF16 0
#include "fs_model.inc"

/* float compute on float16 weights: bit-identical to the f32 model on the widened weights. */
#define FS_T float
#define FS_W uint16_t
#define FS_SFX f32h
#define FS_TSFX f32
#define FS_WHALF 1
#define FS_WBF16 0
#define FS_WIDEN fs_h2f
#include "fs_model.inc"

/* float compute on bfloat16 weights, inputs of every product rounded to bf16: bit-identical to
 * the f32 model on the widened weights whose products' inputs are rounded the same way. */
#define FS_T float
#define FS_W uint16_t
#define FS_SFX f32b
#define FS_TSFX f32
#define FS_WHALF 1
#define FS_WBF16 1
#define FS_WIDEN fs_bf2f
#include "fs_model.inc"


/* fs_linear_q_many over the model's quantized matrices (each its own kind), no accumulation;
 * the quantized variant's FS_LINEAR_MANY. */
static void fs_linear_qmat_many(int count, const float *x, const fs_qmat *const *W,
                                const float *const *bias, float *const *y, int n, int in,
                                const int *out, void *qs)
{
    int kind[FS_Q_MANY_MAX];
    const uint8_t *P[FS_Q_MANY_MAX];
    if (count < 1 || count > FS_Q_MANY_MAX) return;
    for (int i = 0; i < count; i++) kind[i] = W[i]->kind, P[i] = W[i]->p;
    fs_linear_q_many(count, kind, x, P, bias, y, n, in, out, 0, qs);
}

/* float compute on quantized weights (Q8_0/Q4_0/Q4_1 blocks, each matrix its own kind):
 * integer block products (fs_linear_q), so a row's bits do not depend on its block. */
#define FS_T float
#define FS_W fs_qmat
#define FS_SFX f32q
#define FS_TSFX f32
#define FS_WHALF 0
#define FS_WBF16 0
#define FS_WQUANT 1
#include "fs_model.inc"

/* One switch per entry point over the float-compute variants (fs_model.h). */
#define FS_MODEL_SWITCH(variant, call, ...)                                                    \
    switch (variant) {                                                                         \
    case FS_MV_F32H: call##_f32h((const fs_model_f32h *)m, __VA_ARGS__); break;               \
    case FS_MV_F32B: call##_f32b((const fs_model_f32b *)m, __VA_ARGS__); break;               \
    case FS_MV_F32Q: call##_f32q((const fs_model_f32q *)m, __VA_ARGS__); break;               \
    default: call##_f32((const fs_model_f32 *)m, __VA_ARGS__); break;                         \
    }

void fs_model_embed(int variant, const void *m, const int64_t *ids, int n, int pos0,
                    const int32_t *positions, float *x)
{
    FS_MODEL_SWITCH(variant, fs_embed, ids, n, pos0, positions, x)
}

void fs_model_layers(int variant, const void *m, fs_scratch_f32 *s, int n, int pos0,
                     int causal, void *k_cache, void *v_cache, int kv16, size_t layer_stride,
                     int capacity, float *const *hidden, const int32_t *positions,
                     const uint8_t *tree_mask)
{
    FS_MODEL_SWITCH(variant, fs_layers, s, n, pos0, causal, k_cache, v_cache, kv16,
                    layer_stride, capacity, hidden, positions, tree_mask)
}

void fs_model_head(int variant, const void *m, fs_scratch_f32 *s, int r0, int n,
                   float *logits)
{
    FS_MODEL_SWITCH(variant, fs_head, s, r0, n, logits)
}

void fs_model_context_kv(int variant, const void *m, fs_scratch_f32 *s, const float *feat,
                         int n, int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                         int capacity, int l0, int l1)
{
    FS_MODEL_SWITCH(variant, fs_context_kv, s, feat, n, pos0, k_cache, v_cache, layer_stride,
                    capacity, l0, l1)
}

void fs_model_context_kv_taps(int variant, const void *m, fs_scratch_f32 *s, const float *taps,
                              int n, int n_in, const float *fc, const float *hidden_norm,
                              int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                              int capacity)
{
    FS_MODEL_SWITCH(variant, fs_context_kv_taps, s, taps, n, n_in, fc, hidden_norm, pos0,
                    k_cache, v_cache, layer_stride, capacity)
}
#undef FS_MODEL_SWITCH
