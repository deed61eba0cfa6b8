"""C declarations of the csrc/ headers, for every extension of fastspec (cimport them from here).

One ``cdef extern from`` block per header. The headers only declare: the C core is compiled
once into a static library that every extension links (setup.py, csrc/README.md). Variant
choice and the path state live in ONE dispatch table, owned by :mod:`fastspec.kernels._isa`;
an extension that links the core shares it at import (``_isa.share_table``).
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint64_t


cdef extern from "fs_isa.h" nogil:
    ctypedef struct fs_isa_features:
        int avx2, fma, f16c, avx512f, avx512bf16, amx_cpu, amx_tile, amx_bf16
        int avx512vnni, avx_vnni, amx_int8
    void fs_isa_detect(fs_isa_features *f)
    int fs_isa_supported(const fs_isa_features *f, int p)
    ctypedef struct fs_dispatch:
        pass
    void fs_isa_init()
    fs_dispatch *fs_isa_table()
    void fs_isa_share(fs_dispatch *owner)
    int fs_linear_bf16_amx()
    int fs_linear_amx_built()
    int fs_linear_bf16dp_built()
    void fs_linear_set_threads(int n)
    int fs_linear_get_threads()
    int fs_linear_set_path(int p)
    int fs_linear_get_path()
    const char *fs_isa_quant_kernel(int p, int kind, int n, int in_)
    int fs_isa_quant_max_in(int p)


cdef extern from "fs_pool.h" nogil:
    enum: FS_POOL_MAX
    void fs_pool_set_threads(int n)
    int fs_pool_threads()
    void fs_pool_keep_awake(int on)
    long fs_pool_spin_limit_ns()
    int fs_pool_awake()


cdef extern from "fs_linear.h" nogil:
    void fs_linear_f32(const float *x, const float *W, const float *bias, float *y, int n,
                       int rows, int cols, int accumulate)
    void fs_linear_f32h(const float *x, const uint16_t *W, const float *bias, float *y, int n,
                        int rows, int cols, int accumulate)
    void fs_linear_f32b(const float *x, const uint16_t *W, const float *bias, float *y, int n,
                        int rows, int cols, int accumulate)
    void fs_linear_f32b_round(const float *x, const uint16_t *W, const float *bias, float *y,
                              int n, int rows, int cols, int accumulate, float *xr)
    double fs_clock_hz(int bursts)
    size_t fs_packed_len(int rows, int cols)
    void fs_pack_f32(const float *W, int rows, int cols, float *P)
    void fs_pack_f32h(const uint16_t *W, int rows, int cols, uint16_t *P)
    void fs_pack_strided(const void *W, size_t esz, int rows, int cols, size_t rs, size_t cs,
                         void *P)
    size_t fs_amx_packed_len(int rows, int cols)
    void fs_pack_bf16_amx(const uint16_t *W, int rows, int cols, uint16_t *P)
    void fs_pack_bf16_amx_strided(const uint16_t *W, int rows, int cols, size_t rs, size_t cs,
                                  uint16_t *P)


cdef extern from "fs_model.h" nogil:
    ctypedef struct fs_dims:
        int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, max_pos
        int rmsnorm, rope, act, qk_norm
        double eps

    size_t fs_scratch_row(const fs_dims *d)

    # The weight structs are filled in C (fs_layer_set_*, fs_model_set_*) from untyped pointers;
    # Cython only stores them and passes their addresses.
    ctypedef struct fs_layer_f32:
        pass
    ctypedef struct fs_layer_f64:
        pass
    ctypedef struct fs_layer_f32h:
        pass
    ctypedef struct fs_model_f32:
        pass
    ctypedef struct fs_model_f64:
        pass
    ctypedef struct fs_model_f32h:
        pass

    void fs_layer_set_f32(fs_layer_f32 *L, void **p, int rope, int window)
    void fs_layer_set_f64(fs_layer_f64 *L, void **p, int rope, int window)
    void fs_layer_set_f32h(fs_layer_f32h *L, void **p, int rope, int window)
    void fs_model_set_f32(fs_model_f32 *m, const fs_dims *d, void **p, const fs_layer_f32 *layers)
    void fs_model_set_f64(fs_model_f64 *m, const fs_dims *d, void **p, const fs_layer_f64 *layers)
    void fs_model_set_f32h(fs_model_f32h *m, const fs_dims *d, void **p,
                           const fs_layer_f32h *layers)

    ctypedef struct fs_scratch_f32:
        float *x
        float *h
        void *qs
    ctypedef struct fs_scratch_f64:
        double *x
        double *h

    void fs_scratch_init_f32(fs_scratch_f32 *s, const fs_dims *d, float *buf, size_t rows,
                             double *dbuf, size_t capacity)
    void fs_scratch_init_f64(fs_scratch_f64 *s, const fs_dims *d, double *buf, size_t rows,
                             double *dbuf, size_t capacity)
    void fs_embed_f32(const fs_model_f32 *m, const int64_t *ids, int n, int pos0,
                      const int32_t *positions, float *x)
    void fs_embed_f64(const fs_model_f64 *m, const int64_t *ids, int n, int pos0,
                      const int32_t *positions, double *x)
    void fs_embed_f32h(const fs_model_f32h *m, const int64_t *ids, int n, int pos0,
                       const int32_t *positions, float *x)
    # bfloat16 storage: the same layout as f32h (uint16_t matrices), another instantiation
    ctypedef struct fs_model_f32b:
        pass
    void fs_embed_f32b(const fs_model_f32b *m, const int64_t *ids, int n, int pos0,
                       const int32_t *positions, float *x)
    void fs_layers_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, int n, int pos0, int causal,
                        void *k_cache, void *v_cache, int kv16, size_t layer_stride,
                        int capacity, float **hidden, const int32_t *positions,
                        const uint8_t *tree_mask)
    void fs_head_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, int r0, int n, float *logits)
    void fs_context_kv_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, const float *feat,
                            int n, int pos0, float *k_cache, float *v_cache,
                            size_t layer_stride, int capacity, int l0, int l1)
    void fs_context_kv_taps_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, const float *taps,
                                 int n, int n_in, const float *fc, const float *hidden_norm,
                                 int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                                 int capacity)
    # quantized storage (f32q): every matrix an fs_qmat (packed blocks and their kind)
    ctypedef struct fs_qmat:
        const uint8_t *p
        int kind
    ctypedef struct fs_layer_f32q:
        pass
    ctypedef struct fs_model_f32q:
        pass
    void fs_layer_set_f32q(fs_layer_f32q *L, void **p, int rope, int window)
    void fs_model_set_f32q(fs_model_f32q *m, const fs_dims *d, void **p,
                           const fs_layer_f32q *layers)
    # the float-compute variants behind one entry point each (FS_MV_*, the model struct)
    enum:
        FS_MV_F32
        FS_MV_F32H
        FS_MV_F32B
        FS_MV_F32Q
    void fs_model_embed(int variant, const void *m, const int64_t *ids, int n, int pos0,
                        const int32_t *positions, float *x)
    void fs_model_layers(int variant, const void *m, fs_scratch_f32 *s, int n, int pos0,
                         int causal, void *k_cache, void *v_cache, int kv16,
                         size_t layer_stride, int capacity, float **hidden,
                         const int32_t *positions, const uint8_t *tree_mask)
    void fs_model_head(int variant, const void *m, fs_scratch_f32 *s, int r0, int n, float *logits)
    void fs_model_context_kv(int variant, const void *m, fs_scratch_f32 *s, const float *feat,
                             int n, int pos0, float *k_cache, float *v_cache,
                             size_t layer_stride, int capacity, int l0, int l1)
    void fs_model_context_kv_taps(int variant, const void *m, fs_scratch_f32 *s,
                                  const float *taps, int n, int n_in, const float *fc,
                                  const float *hidden_norm, int pos0, float *k_cache,
                                  float *v_cache, size_t layer_stride, int capacity)
    void fs_layers_f32(const fs_model_f32 *m, fs_scratch_f32 *s, int n, int pos0, int causal,
                       void *k_cache, void *v_cache, int kv16, size_t layer_stride,
                       int capacity, float **hidden, const int32_t *positions,
                       const uint8_t *tree_mask)
    void fs_layers_f64(const fs_model_f64 *m, fs_scratch_f64 *s, int n, int pos0, int causal,
                       void *k_cache, void *v_cache, int kv16, size_t layer_stride,
                       int capacity, double **hidden, const int32_t *positions,
                       const uint8_t *tree_mask)
    void fs_layers_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, int n, int pos0, int causal,
                        void *k_cache, void *v_cache, int kv16, size_t layer_stride,
                        int capacity, float **hidden, const int32_t *positions,
                        const uint8_t *tree_mask)
    void fs_head_f32(const fs_model_f32 *m, fs_scratch_f32 *s, int r0, int n, float *logits)
    void fs_head_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, int r0, int n, float *logits)
    void fs_head_f64(const fs_model_f64 *m, fs_scratch_f64 *s, int r0, int n, double *logits)
    void fs_context_kv_f32(const fs_model_f32 *m, fs_scratch_f32 *s, const float *feat, int n,
                           int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                           int capacity, int l0, int l1)
    void fs_context_kv_f64(const fs_model_f64 *m, fs_scratch_f64 *s, const double *feat, int n,
                           int pos0, double *k_cache, double *v_cache, size_t layer_stride,
                           int capacity, int l0, int l1)
    void fs_context_kv_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, const float *feat,
                            int n, int pos0, float *k_cache, float *v_cache,
                            size_t layer_stride, int capacity, int l0, int l1)
    void fs_context_kv_taps_f32(const fs_model_f32 *m, fs_scratch_f32 *s, const float *taps,
                                int n, int n_in, const float *fc, const float *hidden_norm,
                                int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                                int capacity)
    void fs_context_kv_taps_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, const float *taps,
                                 int n, int n_in, const float *fc, const float *hidden_norm,
                                 int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                                 int capacity)
    void fs_context_kv_taps_f64(const fs_model_f64 *m, fs_scratch_f64 *s, const double *taps,
                                int n, int n_in, const double *fc, const double *hidden_norm,
                                int pos0, double *k_cache, double *v_cache, size_t layer_stride,
                                int capacity)


cdef extern from "fs_attention.h" nogil:
    void fs_attention_f32(const float *q, const float *k, const float *v, float *out,
                          int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                          int length, int causal, int window, double *scratch)
    void fs_attention_f64(const double *q, const double *k, const double *v, double *out,
                          int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                          int length, int causal, int window, double *scratch)
    void fs_attention_masked_f32(const float *q, const float *k, const float *v, float *out,
                                 int n, int n_heads, int n_kv_heads, int head_dim,
                                 int capacity, int length, const uint8_t *mask, int window,
                                 double *scratch)
    void fs_attention_masked_f64(const double *q, const double *k, const double *v,
                                 double *out, int n, int n_heads, int n_kv_heads, int head_dim,
                                 int capacity, int length, const uint8_t *mask, int window,
                                 double *scratch)
    void fs_attention_f32h(const float *q, const uint16_t *k, const uint16_t *v, float *out,
                           int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                           int length, int causal, int window, double *scratch)
    void fs_attention_masked_f32h(const float *q, const uint16_t *k, const uint16_t *v,
                                  float *out, int n, int n_heads, int n_kv_heads, int head_dim,
                                  int capacity, int length, const uint8_t *mask, int window,
                                  double *scratch)
    void fs_f32_to_f16(const float *x, uint16_t *h, size_t count)


cdef extern from "fs_kernels.h" nogil:
    double fs_exp_sum(double *s, int count, double m)
    int fs_scan_f32(const float *x, long n, double *total)
    int fs_scan_f64(const double *x, long n, double *total)
    int fs_all_finite_f32(const float *x, long n)
    int fs_all_finite_f64(const double *x, long n)
    long fs_argmax_f32(const float *x, long n)
    long fs_argmax_f64(const double *x, long n)
    long fs_inverse_cdf_f32(const float *x, long n, long skip, double u, double *cum)
    long fs_inverse_cdf_f64(const double *x, long n, long skip, double u, double *cum)
    long fs_residual_draw_f32(const float *p, const float *q, long n, double u, double *cum)
    long fs_residual_draw_f64(const double *p, const double *q, long n, double u,
                              double *cum)
    long fs_top_k_scaled_f32(const float *x, long n, long k, double t, int32_t *kept, double *z,
                             double *scratch, double *zmax)
    long fs_top_k_scaled_f64(const double *x, long n, long k, double t, int32_t *kept,
                             double *z, double *scratch, double *zmax)
    double fs_scale_row_f32(const float *x, long n, double temperature, double *z)
    double fs_scale_row_f64(const double *x, long n, double temperature, double *z)
    void fs_store_scaled_f32(const double *z, long n, double total, float *out)
    void fs_store_scaled_f64(const double *z, long n, double total, double *out)
    double fs_select_kth(double *a, long n, long k)
    void fs_top_p(double *p, long n, double top_p, uint64_t *key, int32_t *idx,
                  uint64_t *tmp_key, int32_t *tmp_idx)
    long FS_CDF_CHECKPOINTS(long n)


cdef extern from "fs_transcode.h" nogil:
    # GGUF K-quant super-blocks and Q5_0 blocks into native Q4_1 / Q8_0 blocks, at load
    # FS_T_* conversion numbers and errors; fs_transcode_pack: the conversion packed straight
    # into fs_quant_pack's layout
    enum:
        FS_T_Q4_K_Q4_1
        FS_T_Q4_K_Q8_0
        FS_T_Q6_K_Q8_0
        FS_T_Q5_0_Q8_0
        FS_T_EBADSCALE
        FS_T_ENOMEM
        FS_T_EARG
    int fs_transcode(int conv, const uint8_t *src, size_t n, uint8_t *dst)
    int fs_transcode_pack(int conv, const uint8_t *src, int inp, int out, uint8_t *P)


cdef extern from "fs_quant.h" nogil:
    # Quantized products (GGUF's Q8_0 / Q4_0 / Q4_1 weights, int8 activations); the numerics
    # are docs/FORMATS.md's "Quantized products". Kinds in QUANT_KINDS order.
    enum:
        FS_Q8_0
        FS_Q4_0
        FS_Q4_1
        FS_Q_EBADSCALE
        FS_Q_EARG
    int fs_quant_block_bytes(int kind)
    size_t fs_quant_packed_bytes(int kind, int inp, int out)
    int fs_quant_pack(int kind, const uint8_t *blocks, int inp, int out, uint8_t *P)
    void fs_quant_unpack(int kind, const uint8_t *P, int inp, int out, uint8_t *blocks)
    void fs_quant_rows_f32(int kind, const uint8_t *P, int inp, int out, const int32_t *cols,
                           int count, float *dst)
    size_t fs_quant_scratch_bytes(int kind, int n, int inp)
    # y (n, out) [+]= x (n, inp) @ W^T [+ bias]; W packed by fs_quant_pack; checks nothing
    void fs_linear_q(int kind, const float *x, const uint8_t *P, const float *bias, float *y,
                     int n, int inp, int out, int accumulate, void *scratch)
    void fs_quant_rows(const float *x, int n, int inp, int8_t *q, float *d, int32_t *s)
    const char *fs_quant_kernel_name(int kind, int n, int in_)
