/* fs_attention.h -- attention over a KV cache: plain C inner loops, float and double.
 *
 * SHARED: this header is #included by fastspec/_kernels.pyx (the `attention` kernel) AND by
 * the fused Cython model forward. Keep the two public signatures below stable (the tree
 * entries fs_attention_masked_<sfx>, at the end, serve `tree_attention` and tree steps):
 *
 *   q (n, n_heads, head_dim); k, v (n_kv_heads, capacity, head_dim); out (n, n_heads, head_dim)
 *   keys [0, length) are valid; query i sits at position length - n + i; causal: it sees keys
 *   <= that position, non-causal: every valid key. Grouped-query: head h reads kv head
 *   h / (n_heads / n_kv_heads). scratch: caller-provided, at least `length` doubles.
 *   Preconditions (checked by the caller, never here): 1 <= n <= length <= capacity,
 *   n_heads % n_kv_heads == 0, head_dim >= 1, all arrays C-contiguous. Cannot fail.
 *
 * Numerics: float64 inputs, and float32 inputs whose head_dim is not a multiple of 16 (or is
 * over 128), go through the template fs_attention_impl.h: scores, softmax and the weighted
 * sum of values accumulated in double. Other float32 inputs use the tiled float kernel of
 * fs_attention_f32.h (float inside tiles of 128 keys, double across them). Either way a
 * float32 result is within ~1e-6 relative of the float64 computation (the NumPy twin).
 *
 * Speed: the hot loops are written so that GCC vectorises them, and compiled in AVX-512, AVX2
 * and baseline variants (FS_CLONES, fs_common.h).
 */
#ifndef FS_ATTENTION_H
#define FS_ATTENTION_H

#include "fs_common.h"

/* Number of queries of one kv head handled together: their dot products share each key row
 * load, and their weighted sums share each value row load. */
#define FS_ATTN_ROWS 4
/* Values are accumulated in chunks of this many dimensions (the double accumulators live on
 * the stack; any head_dim works). */
#define FS_ATTN_DCHUNK 128

/* Keys are processed in tiles that stay in L1 while every row of a block reads them. */
#define FS_ATTN_TILE 64
/* Keys per step of the online softmax (long ranges, several rows). */
#define FS_ATTN_ONLINE_TILE 256

/* Row t of the n * group query rows that read kv head kv (t = i * group + g: query i, head
 * kv * group + g): sets *offset to the start of its query and output rows in the (n, n_heads,
 * head_dim) arrays and returns the number of keys it sees. Both kernels take their rows so. */
static inline int fs_attn_row(int kv, int t, int group, int n, int n_heads, int head_dim,
                              int length, int causal, size_t *offset)
{
    int i = t / group, h = kv * group + t % group;
    *offset = ((size_t)i * n_heads + h) * head_dim;
    return causal ? length - n + i + 1 : length;
}

/* Tree mask: s[j - j0] <- -inf (a zero weight after the softmax) for every key j in [j0, j1)
 * that the row does not see: key j >= base is node j - base, seen iff mrow[j - base]; the
 * context keys, below base, are always seen. */
static inline void fs_attn_hide(double *s, int j0, int j1, const uint8_t *mrow, int base)
{
    for (int j = j0 > base ? j0 : base; j < j1; j++)
        if (!mrow[j - base])
            s[j - j0] = -HUGE_VAL;
}

/* ---- the double-accumulating kernel, float and double inputs (fs_attention_impl.h) ---- */

#define FS_T float
#define FS_SFX f32
#include "fs_attention_impl.h"

#define FS_T double
#define FS_SFX f64
#include "fs_attention_impl.h"

#include "fs_attention_f32.h"

static void fs_attention_f64(const double *q, const double *k, const double *v, double *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, int causal, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                         causal, NULL, scratch);
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
                         causal, NULL, scratch);
}

/* Tree attention: the n queries are tree nodes at cache rows length - n + i; query i sees
 * every context key [0, length - n) and the node keys length - n + j with
 * mask[i * n + j] != 0 (its ancestors and itself). Same contract as fs_attention_f64
 * otherwise, plus: mask (n, n) C-contiguous with a nonzero diagonal (checked by the caller;
 * a tree's mask is also lower-triangular, which these kernels do not need).
 * float32 with a head size of the tiled kernel: each node reads its visible keys as one
 * range (fs_attention_f32_tree), so its output is bit-identical to a decode step of its
 * path. Otherwise the double template hides the other node keys (-inf scores): within
 * rounding of the float64 formula, not bit-identical to a decode step. */
static void fs_attention_masked_f32(const float *q, const float *k, const float *v, float *out,
                                    int n, int n_heads, int n_kv_heads, int head_dim,
                                    int capacity, int length, const uint8_t *mask,
                                    double *scratch)
{
#if FS_HAVE_VEC
    if (fs_f32_supported(head_dim)) {  /* n ints of the caller's >= length doubles */
        fs_attention_f32_tree(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                              mask, (int32_t *)scratch);
        return;
    }
#endif
    fs_attention_dbl_f32(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, 0,
                         mask, scratch);
}

static void fs_attention_masked_f64(const double *q, const double *k, const double *v,
                                    double *out, int n, int n_heads, int n_kv_heads,
                                    int head_dim, int capacity, int length,
                                    const uint8_t *mask, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, 0,
                         mask, scratch);
}

#endif /* FS_ATTENTION_H */
