/* fs_model.h -- fused decoder forward for fastspec.model._model (toy and Llama/Qwen families).
 *
 * Everything here runs without the GIL and cannot fail: the Cython runner checks shapes,
 * ranges and capacity first and hands over raw pointers to weights, cache and scratch.
 * The float, double, float-on-float16-weights, float-on-bfloat16-weights and
 * float-on-quantized-weights (f32q: Q8_0/Q4_0/Q4_1, fs_quant.h) versions are generated from
 * fs_model.inc (fs_model.c); their structs and entry points are declared here by
 * FS_MODEL_DECLARE.
 *
 * Layouts (all C-contiguous):
 *   linear weights (in, out) so that a projection is x @ W   (fastspec's internal layout)
 *   KV cache of one layer (n_kv_heads, capacity, head_dim); layer l starts at l * layer_stride
 *   rope tables (max_pos, head_dim / 2)
 */
#ifndef FS_MODEL_H
#define FS_MODEL_H

#include <stddef.h>
#include <stdint.h>

enum { FS_ACT_SWIGLU = 0, FS_ACT_TANH = 1, FS_ACT_GELU = 2, FS_ACT_GEGLU = 3 };
/* A layer's RoPE tables (fs_layer.rope): the model's, none (SmolLM3's NoPE layers), or the
 * model's local ones (Gemma 3's sliding-window layers, their own base). */
enum { FS_ROPE_MODEL = 0, FS_ROPE_NONE = 1, FS_ROPE_LOCAL = 2 };

/* One quantized matrix of the f32q model: W (out, in) packed by fs_quant_pack, its kind
 * (FS_Q8_0, FS_Q4_0, FS_Q4_1; each matrix its own: a q4_1 file's embedding may be q8_0).
 * The f32q structs point at these (the runner owns them). */
typedef struct {
    const uint8_t *p;
    int kind;
} fs_qmat;

typedef struct {
    int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, max_pos;
    int rmsnorm;   /* 1: RMSNorm with weights; 0: LayerNorm without affine parameters */
    int rope;      /* 1: rotary positions; 0: learned absolute positions (pos_embed) */
    int act;       /* FS_ACT_* */
    int qk_norm;   /* per-head RMSNorm of q and k (Qwen3) */
    double eps;
} fs_dims;

/* Scratch rows per position, in elements of the model dtype:
 * x, h (dim each); q, att (H*D each); k, v (Hkv*D each); f1, f2 (ffn each); xb. */
size_t fs_scratch_row(const fs_dims *d);

#define FS_MODEL_TYPES(SFX, T, W)                                                              \
    typedef struct {                                                                           \
        const W *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;                                   \
        const T *attn_norm, *mlp_norm, *q_norm, *k_norm;                                       \
        const T *bq, *bk, *bv;                                                                 \
        const T *attn_post_norm, *mlp_post_norm; /* Gemma's sandwich norms, or NULL */         \
        int rope; /* FS_ROPE_*: the tables that turn the layer's q and k */                    \
        int window; /* > 0: its attention's sliding window (Gemma 3's local layers) */         \
    } fs_layer_##SFX;                                                                          \
    typedef struct {                                                                           \
        fs_dims d;                                                                             \
        const W *embed;              /* (vocab, dim) */                                        \
        const T *pos_embed;          /* (max_pos, dim) or NULL */                              \
        const W *head;               /* (dim, vocab) */                                        \
        const T *final_norm;         /* (dim,) or NULL */                                      \
        const T *rope_cos, *rope_sin; /* (max_pos, head_dim/2) or NULL */                      \
        const T *rope_cos_local, *rope_sin_local; /* the same for FS_ROPE_LOCAL layers */      \
        const fs_layer_##SFX *layers;                                                          \
    } fs_model_##SFX;

/* Views into one preallocated buffer of rows * fs_scratch_row(d) elements (xb: (rows,
 * fs_scratch_in), a product's input rounded to bf16 for bf16 weights), plus a double buffer
 * of at least capacity doubles for attention scores. qs: the quantized products' scratch
 * (f32q: at least fs_quant_scratch_bytes(kind, rows, widest input) bytes for every kind of
 * the model; NULL after fs_scratch_init, set by the caller). */
#define FS_SCRATCH_TYPE(TSFX, T)                                                               \
    typedef struct {                                                                           \
        T *x, *h, *q, *k, *v, *att, *f1, *f2;                                                  \
        T *xb;                                                                                 \
        double *scores;                                                                        \
        void *qs;                                                                              \
    } fs_scratch_##TSFX;                                                                       \
    void fs_scratch_init_##TSFX(fs_scratch_##TSFX *s, const fs_dims *d, T *buf, size_t rows,   \
                                double *dbuf, size_t capacity);

/* The entry points of one variant (fs_model.inc documents them). */
#define FS_MODEL_DECLARE(SFX, T, TSFX)                                                         \
    void fs_layer_set_##SFX(fs_layer_##SFX *L, void *const *p, int rope, int window);          \
    void fs_model_set_##SFX(fs_model_##SFX *m, const fs_dims *d, void *const *p,               \
                            const fs_layer_##SFX *layers);                                     \
    void fs_embed_##SFX(const fs_model_##SFX *m, const int64_t *ids, int n, int pos0,          \
                        const int32_t *positions, T *x);                                       \
    void fs_layers_##SFX(const fs_model_##SFX *m, fs_scratch_##TSFX *s, int n, int pos0,       \
                         int causal, void *k_cache, void *v_cache, int kv16,                   \
                         size_t layer_stride, int capacity, T *const *hidden,                  \
                         const int32_t *positions, const uint8_t *tree_mask);                  \
    void fs_head_##SFX(const fs_model_##SFX *m, fs_scratch_##TSFX *s, int r0, int n,          \
                       T *logits);                                                        \
    void fs_context_kv_##SFX(const fs_model_##SFX *m, fs_scratch_##TSFX *s, const T *feat,     \
                             int n, int pos0, T *k_cache, T *v_cache, size_t layer_stride,     \
                             int capacity, int l0, int l1);                                    \
    void fs_context_kv_taps_##SFX(const fs_model_##SFX *m, fs_scratch_##TSFX *s,               \
                                  const T *taps, int n, int n_in, const T *fc,                 \
                                  const T *hidden_norm, int pos0, T *k_cache, T *v_cache,      \
                                  size_t layer_stride, int capacity);

/* float and double compute on weights of their own type; float compute on float16 (f32h) and
 * bfloat16 (f32b) weights, the matrices as uint16_t bits; float compute on quantized weights
 * (f32q), the matrices as fs_qmat. */
FS_SCRATCH_TYPE(f32, float)
FS_SCRATCH_TYPE(f64, double)
FS_MODEL_TYPES(f32, float, float)
FS_MODEL_TYPES(f64, double, double)
FS_MODEL_TYPES(f32h, float, uint16_t)
FS_MODEL_TYPES(f32b, float, uint16_t)
FS_MODEL_TYPES(f32q, float, fs_qmat)
FS_MODEL_DECLARE(f32, float, f32)
FS_MODEL_DECLARE(f64, double, f64)
FS_MODEL_DECLARE(f32h, float, f32)
FS_MODEL_DECLARE(f32b, float, f32)
FS_MODEL_DECLARE(f32q, float, f32)

/* The float-compute variants behind one set of entry points, chosen by FS_MV_* and a pointer
 * to that variant's model struct (the runner's dispatch in one place). */
enum { FS_MV_F32 = 0, FS_MV_F32H = 1, FS_MV_F32B = 2, FS_MV_F32Q = 3 };
void fs_model_embed(int variant, const void *m, const int64_t *ids, int n, int pos0,
                    const int32_t *positions, float *x);
void fs_model_layers(int variant, const void *m, fs_scratch_f32 *s, int n, int pos0,
                     int causal, void *k_cache, void *v_cache, int kv16, size_t layer_stride,
                     int capacity, float *const *hidden, const int32_t *positions,
                     const uint8_t *tree_mask);
void fs_model_head(int variant, const void *m, fs_scratch_f32 *s, int r0, int n,
                   float *logits);
void fs_model_context_kv(int variant, const void *m, fs_scratch_f32 *s, const float *feat,
                         int n, int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                         int capacity, int l0, int l1);
void fs_model_context_kv_taps(int variant, const void *m, fs_scratch_f32 *s, const float *taps,
                              int n, int n_in, const float *fc, const float *hidden_norm,
                              int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                              int capacity);

#endif /* FS_MODEL_H */
