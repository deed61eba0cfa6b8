/* Template body of fs_model.h: included once per variant with FS_T (float/double), FS_W (the
 * matrices' element type), FS_SFX, FS_TSFX, FS_WHALF, FS_WBF16 (and FS_WIDEN when FS_WHALF)
 * defined (see fs_model.h and fs_common.h). No include guard on purpose. */

#define FS_TFN(name) FS_CAT(name, FS_TSFX)
/* A product y (n, out) [+]= x (n, in) @ W of a weight-dtype matrix (s: the scratch). */
#if FS_WBF16
#define FS_LINEAR(s, x, W, b, y, n, in, out, acc) \
    fs_linear_f32b_round(x, W, b, y, n, in, out, acc, (s)->xb)
#else
#define FS_LINEAR(s, x, W, b, y, n, in, out, acc) FS_FN(fs_linear)(x, W, b, y, n, in, out, acc)
#endif

/* Weights of one decoder layer; absent ones are NULL. */
typedef struct {
    const FS_W *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
    const FS_T *attn_norm, *mlp_norm, *q_norm, *k_norm;
    const FS_T *bq, *bk, *bv;
} FS_FN(fs_layer);

typedef struct {
    fs_dims d;
    const FS_W *embed;       /* (vocab, dim) */
    const FS_T *pos_embed;   /* (max_pos, dim) or NULL */
    const FS_W *head;        /* (dim, vocab) */
    const FS_T *final_norm;  /* (dim,) or NULL */
    const FS_T *rope_cos, *rope_sin;  /* (max_pos, head_dim/2) or NULL */
    const FS_FN(fs_layer) *layers;
} FS_FN(fs_model);

/* Fill a layer from its 14 weight pointers in field order (NULL: absent), and a model from its
 * dims, its six arrays (embed, pos_embed, head, final_norm, rope_cos, rope_sin) and its layers:
 * the runner gathers the pointers untyped (fastspec/_model_weights.pyx). */
static void FS_FN(fs_layer_set)(FS_FN(fs_layer) *L, void *const *p)
{
    L->wq = p[0], L->wk = p[1], L->wv = p[2], L->wo = p[3];
    L->w_gate = p[4], L->w_up = p[5], L->w_down = p[6];
    L->attn_norm = p[7], L->mlp_norm = p[8], L->q_norm = p[9], L->k_norm = p[10];
    L->bq = p[11], L->bk = p[12], L->bv = p[13];
}

static void FS_FN(fs_model_set)(FS_FN(fs_model) *m, const fs_dims *d, void *const *p,
                                const FS_FN(fs_layer) *layers)
{
    m->d = *d;
    m->embed = p[0], m->pos_embed = p[1], m->head = p[2], m->final_norm = p[3];
    m->rope_cos = p[4], m->rope_sin = p[5];
    m->layers = layers;
}

#if !FS_WHALF
/* Views into one preallocated buffer of rows * fs_scratch_row(d) elements, plus a double
 * buffer of at least capacity doubles for attention scores. */
typedef struct {
    FS_T *x, *h, *q, *k, *v, *att, *f1, *f2;
    FS_T *xb;  /* (rows, fs_scratch_in): a product's input rounded to bf16 (bf16 weights) */
    double *scores;
} FS_TFN(fs_scratch);

static inline void FS_TFN(fs_scratch_init)(FS_TFN(fs_scratch) *s, const fs_dims *d, FS_T *buf,
                                           size_t rows, double *dbuf, size_t capacity)
{
    size_t HD = (size_t)d->n_heads * d->head_dim, KD = (size_t)d->n_kv_heads * d->head_dim;
    s->x = buf;             buf += rows * d->dim;
    s->h = buf;             buf += rows * d->dim;
    s->q = buf;             buf += rows * HD;
    s->att = buf;           buf += rows * HD;
    s->k = buf;             buf += rows * KD;
    s->v = buf;             buf += rows * KD;
    s->f1 = buf;            buf += rows * d->ffn_dim;
    s->f2 = buf;            buf += rows * d->ffn_dim;
    s->xb = buf;
    s->scores = dbuf;
}

/* out (n, dim) = norm(x) [* w]; statistics in double like the NumPy twin. */
FS_ALWAYS_INLINE void FS_TFN(fs_norm_rows)(const fs_dims *d, const FS_T *x, const FS_T *w,
                                           FS_T *out, int n, int width, int rms)
{
    for (int i = 0; i < n; i++) {
        const FS_T *xi = x + (size_t)i * width;
        FS_T *oi = out + (size_t)i * width;
        if (rms) {
            double ss = 0.0;
            for (int j = 0; j < width; j++) ss += (double)xi[j] * (double)xi[j];
            double r = sqrt(ss / width + d->eps);
            for (int j = 0; j < width; j++) {
                FS_T y = (FS_T)((double)xi[j] / r);
                oi[j] = w ? y * w[j] : y;
            }
        } else {
            double mu = 0.0, var = 0.0;
            for (int j = 0; j < width; j++) mu += (double)xi[j];
            mu /= width;
            for (int j = 0; j < width; j++) {
                double t = (double)xi[j] - mu;
                var += t * t;
            }
            double r = sqrt(var / width + d->eps);
            for (int j = 0; j < width; j++) oi[j] = (FS_T)(((double)xi[j] - mu) / r);
        }
    }
}

#endif

/* Rotate-half RoPE on (n, heads, D) rows at positions pos0 + i (or positions[i]). */
FS_ALWAYS_INLINE void FS_FN(fs_rope)(const FS_FN(fs_model) *m, FS_T *x, int n, int heads,
                                     int pos0, const int32_t *positions)
{
    int D = m->d.head_dim, half = D / 2;
    for (int i = 0; i < n; i++) {
        size_t p = (size_t)fs_model_pos(positions, pos0, i);
        const FS_T *c = m->rope_cos + p * half;
        const FS_T *s = m->rope_sin + p * half;
        for (int h = 0; h < heads; h++) {
            FS_T *x1 = x + ((size_t)i * heads + h) * D, *x2 = x1 + half;
            for (int j = 0; j < half; j++) {
                FS_T a = x1[j], b = x2[j];
                x1[j] = a * c[j] - b * s[j];
                x2[j] = b * c[j] + a * s[j];
            }
        }
    }
}

/* k-norm (optional), RoPE and cache write of n new key/value rows at cache rows pos0 + i
 * (rotated at positions pos0 + i, or positions[i]). */
FS_ALWAYS_INLINE void FS_FN(fs_store_kv)(const FS_FN(fs_model) *m, const FS_FN(fs_layer) *L,
                                         FS_T *k, const FS_T *v, int n, int pos0,
                                         const int32_t *positions, FS_T *kc, FS_T *vc,
                                         int capacity)
{
    const fs_dims *d = &m->d;
    int Hkv = d->n_kv_heads, D = d->head_dim;
    if (d->qk_norm) FS_TFN(fs_norm_rows)(d, k, L->k_norm, k, n * Hkv, D, 1);
    if (d->rope) FS_FN(fs_rope)(m, k, n, Hkv, pos0, positions);
    for (int i = 0; i < n; i++)
        for (int g = 0; g < Hkv; g++) {
            size_t src = ((size_t)i * Hkv + g) * D;
            size_t dst = ((size_t)g * capacity + pos0 + i) * D;
            memcpy(kc + dst, k + src, (size_t)D * sizeof(FS_T));
            memcpy(vc + dst, v + src, (size_t)D * sizeof(FS_T));
        }
}

#if !FS_WHALF
/* f1 <- silu(f1) * f2, elementwise over nf values. */
FS_CLONES static void FS_TFN(fs_swiglu)(FS_T *FS_RESTRICT f1,
                                           const FS_T *FS_RESTRICT f2, size_t nf)
{
    for (size_t j = 0; j < nf; j++) f1[j] = (FS_T)fs_model_silu((double)f1[j]) * f2[j];
}

/* f <- tanh(f) or gelu_tanh(f), elementwise. */
FS_CLONES static void FS_TFN(fs_act)(FS_T *f, size_t nf, int gelu)
{
    const double c = 0.7978845608028654; /* sqrt(2 / pi) */
    if (gelu)
        for (size_t j = 0; j < nf; j++) {
            double t = (double)f[j];
            f[j] = (FS_T)(0.5 * t * (1.0 + fs_model_tanh(c * (t + 0.044715 * t * t * t))));
        }
    else
        for (size_t j = 0; j < nf; j++) f[j] = (FS_T)fs_model_tanh((double)f[j]);
}

#endif

/* x (n, dim) <- embed[ids] (+ pos_embed[pos0 + i], or pos_embed[positions[i]]). */
static void FS_FN(fs_embed)(const FS_FN(fs_model) *m, const int64_t *ids, int n, int pos0,
                            const int32_t *positions, FS_T *x)
{
    int dim = m->d.dim;
    for (int i = 0; i < n; i++) {
        FS_T *xi = x + (size_t)i * dim;
#if FS_WHALF
        const FS_W *e = m->embed + (size_t)ids[i] * dim;
        for (int j = 0; j < dim; j++) xi[j] = FS_WIDEN(e[j]);
#else
        memcpy(xi, m->embed + (size_t)ids[i] * dim, (size_t)dim * sizeof(FS_T));
#endif
        if (m->pos_embed) {
            const FS_T *p = m->pos_embed + (size_t)fs_model_pos(positions, pos0, i) * dim;
            for (int j = 0; j < dim; j++) xi[j] += p[j];
        }
    }
}

/* Run every layer on s->x (n, dim) in place for positions pos0 .. pos0+n-1, writing their
 * K/V into the cache and attending over [0, pos0 + n). hidden[l], when not NULL, receives a
 * copy of layer l's output (n, dim).
 * Tree step (both NULL otherwise): positions (n,) replace pos0 + i in RoPE (the caller's
 * fs_embed takes the same array) while rows stay at cache rows pos0 + i; tree_mask (n, n),
 * causal 1: row i sees the keys [0, pos0) and pos0 + j where tree_mask[i * n + j]. */
static void FS_FN(fs_layers)(const FS_FN(fs_model) *m, FS_TFN(fs_scratch) *s, int n, int pos0,
                             int causal, FS_T *k_cache, FS_T *v_cache, size_t layer_stride,
                             int capacity, FS_T *const *hidden, const int32_t *positions,
                             const uint8_t *tree_mask)
{
    const fs_dims *d = &m->d;
    int dim = d->dim, H = d->n_heads, Hkv = d->n_kv_heads, D = d->head_dim, F = d->ffn_dim;
    int HD = H * D, KD = Hkv * D;
    for (int l = 0; l < d->n_layers; l++) {
        const FS_FN(fs_layer) *L = &m->layers[l];
        FS_T *kc = k_cache + (size_t)l * layer_stride, *vc = v_cache + (size_t)l * layer_stride;
        FS_TFN(fs_norm_rows)(d, s->x, L->attn_norm, s->h, n, dim, d->rmsnorm);
        FS_LINEAR(s, s->h, L->wq, L->bq, s->q, n, dim, HD, 0);
        FS_LINEAR(s, s->h, L->wk, L->bk, s->k, n, dim, KD, 0);
        FS_LINEAR(s, s->h, L->wv, L->bv, s->v, n, dim, KD, 0);
        if (d->qk_norm) FS_TFN(fs_norm_rows)(d, s->q, L->q_norm, s->q, n * H, D, 1);
        if (d->rope) FS_FN(fs_rope)(m, s->q, n, H, pos0, positions);
        FS_FN(fs_store_kv)(m, L, s->k, s->v, n, pos0, positions, kc, vc, capacity);
        if (tree_mask)
            FS_TFN(fs_attention_masked)(s->q, kc, vc, s->att, n, H, Hkv, D, capacity, pos0 + n,
                                        tree_mask, s->scores);
        else
            FS_TFN(fs_attention)(s->q, kc, vc, s->att, n, H, Hkv, D, capacity, pos0 + n,
                                 causal, s->scores);
        FS_LINEAR(s, s->att, L->wo, NULL, s->x, n, HD, dim, 1);
        FS_TFN(fs_norm_rows)(d, s->x, L->mlp_norm, s->h, n, dim, d->rmsnorm);
        size_t nf = (size_t)n * F;
        if (d->act == FS_ACT_SWIGLU) {
            FS_LINEAR(s, s->h, L->w_gate, NULL, s->f1, n, dim, F, 0);
            FS_LINEAR(s, s->h, L->w_up, NULL, s->f2, n, dim, F, 0);
            FS_TFN(fs_swiglu)(s->f1, s->f2, nf);
        } else {
            FS_LINEAR(s, s->h, L->w_up, NULL, s->f1, n, dim, F, 0);
            FS_TFN(fs_act)(s->f1, nf, d->act == FS_ACT_GELU);
        }
        FS_LINEAR(s, s->f1, L->w_down, NULL, s->x, n, F, dim, 1);
        if (hidden && hidden[l])
            memcpy(hidden[l], s->x, (size_t)n * dim * sizeof(FS_T));
    }
}

/* logits (n, vocab) = final_norm(s->x) @ head. */
static void FS_FN(fs_head)(const FS_FN(fs_model) *m, FS_TFN(fs_scratch) *s, int n, FS_T *logits)
{
    const fs_dims *d = &m->d;
    FS_TFN(fs_norm_rows)(d, s->x, m->final_norm, s->h, n, d->dim, d->rmsnorm);
    FS_LINEAR(s, s->h, m->head, NULL, logits, n, d->dim, d->vocab, 0);
}

/* DFlash context injection: for layers [l0, l1), k = feat @ Wk (+bk) -> k-norm -> RoPE,
 * v = feat @ Wv (+bv), written at positions pos0 .. pos0+n-1. No input norm on feat. */
static void FS_FN(fs_context_kv)(const FS_FN(fs_model) *m, FS_TFN(fs_scratch) *s,
                                 const FS_T *feat, int n, int pos0, FS_T *k_cache,
                                 FS_T *v_cache, size_t layer_stride, int capacity, int l0, int l1)
{
    const fs_dims *d = &m->d;
    int KD = d->n_kv_heads * d->head_dim;
    for (int l = l0; l < l1; l++) {
        const FS_FN(fs_layer) *L = &m->layers[l];
        FS_LINEAR(s, feat, L->wk, L->bk, s->k, n, d->dim, KD, 0);
        FS_LINEAR(s, feat, L->wv, L->bv, s->v, n, d->dim, KD, 0);
        FS_FN(fs_store_kv)(m, L, s->k, s->v, n, pos0, NULL,
                           k_cache + (size_t)l * layer_stride,
                           v_cache + (size_t)l * layer_stride, capacity);
    }
}

/* DFlash context features and their injection in one call: feat = rmsnorm(taps @ fc) *
 * hidden_norm (eps of the model), then fs_context_kv. taps (n, n_in); fc (n_in, dim) in the
 * layout of the compute dtype's linear kernel (packed for float, plain for double). */
static void FS_FN(fs_context_kv_taps)(const FS_FN(fs_model) *m, FS_TFN(fs_scratch) *s,
                                      const FS_T *taps, int n, int n_in, const FS_T *fc,
                                      const FS_T *hidden_norm, int pos0, FS_T *k_cache,
                                      FS_T *v_cache, size_t layer_stride, int capacity)
{
    const fs_dims *d = &m->d;
    FS_TFN(fs_linear)(taps, fc, NULL, s->x, n, n_in, d->dim, 0);
    FS_TFN(fs_norm_rows)(d, s->x, hidden_norm, s->h, n, d->dim, 1);
    FS_FN(fs_context_kv)(m, s, s->h, n, pos0, k_cache, v_cache, layer_stride, capacity, 0,
                         d->n_layers);
}

#undef FS_TFN
/* The template parameters end with the template. */
#undef FS_T
#undef FS_W
#undef FS_SFX
#undef FS_TSFX
#undef FS_WHALF
#undef FS_WBF16
#undef FS_WIDEN
#undef FS_LINEAR
