/* fs_attention.h -- attention over a KV cache: plain C inner loops, float and double.
 *
 * SHARED: the `attention` kernel (fastspec/kernels/_kernels_attention.pyx) AND the fused
 * model forward (fs_model.c) call it. Keep the public signatures below stable (the tree
 * entries fs_attention_masked_<sfx> serve `tree_attention` and tree steps):
 *
 *   q (n, n_heads, head_dim); k, v (n_kv_heads, capacity, head_dim); out (n, n_heads, head_dim)
 *   keys [0, length) are valid; query i sits at position length - n + i; causal: it sees keys
 *   <= that position, non-causal: every valid key. Grouped-query: head h reads kv head
 *   h / (n_heads / n_kv_heads). scratch: caller-provided, at least `length` doubles.
 *   Preconditions (checked by the caller, never here): 1 <= n <= length <= capacity,
 *   n_heads % n_kv_heads == 0, head_dim >= 1, all arrays C-contiguous. Cannot fail.
 *
 * Sliding window: window > 0 (causal calls and trees; ignored otherwise, and refused by every
 * caller) hides every key at window positions or more before the query's: query i of a chain
 * (position p = length - n + i) sees
 * keys (p - window, p]; a tree node at depth d (position length - n + d) sees the context keys
 * from length - n + d + 1 - window and its ancestors, every one of which must lie inside the
 * window (d < window: checked by the caller). window = 0: none. A call the window cuts
 * computes each query as a call of that query alone would (its keys from the window's
 * first), so a position's output is the same bits alone or inside a block; a call it does not
 * cut is the call without a window.
 *
 * Numerics: float64 inputs, and float32 inputs whose head_dim is not a multiple of 16 (or is
 * over 256, FS_F32_MAXD), go through the template fs_attention_dbl.inc: scores, softmax and
 * the weighted sum of values accumulated in double. Other float32 inputs use the tiled float
 * kernel of fs_attention_f32.inc (float inside tiles of 128 keys, double across them), an ISA
 * variant per file (fs_variants.h) reached through fs_isa.h's table. Either way a float32 result
 * is within ~1e-6 relative of the float64 computation (the NumPy twin).
 *
 * Speed: the hot loops are written so that GCC vectorises them, and compiled in AVX-512, AVX2
 * and baseline variants (FS_CLONES, fs_common.h; the float tiles: explicit variants).
 */
#ifndef FS_ATTENTION_H
#define FS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

void fs_attention_f32(const float *q, const float *k, const float *v, float *out, int n,
                      int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                      int causal, int window, double *scratch);
void fs_attention_f64(const double *q, const double *k, const double *v, double *out, int n,
                      int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                      int causal, int window, double *scratch);

/* Tree attention: the n queries are tree nodes at cache rows length - n + i; query i sees
 * every context key [0, length - n) and the node keys length - n + j with
 * mask[i * n + j] != 0 (its ancestors and itself). Same contract as fs_attention_f64
 * otherwise, plus: mask (n, n) C-contiguous with a nonzero diagonal (checked by the caller;
 * a tree's mask is also lower-triangular, which these kernels do not need).
 * float32 with a head size of the tiled kernel: each node reads its visible keys as one
 * range (fs_attention_f32_tree), so its output is bit-identical to a decode step of its
 * path. Otherwise the double template hides the other node keys (-inf scores): within
 * rounding of the float64 formula, not bit-identical to a decode step. */
void fs_attention_masked_f32(const float *q, const float *k, const float *v, float *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, const uint8_t *mask, int window, double *scratch);
void fs_attention_masked_f64(const double *q, const double *k, const double *v, double *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, const uint8_t *mask, int window, double *scratch);

/* float32 queries over a float16 cache (k, v: IEEE binary16 bit patterns, same layout
 * (n_kv_heads, capacity, head_dim)): the same contract as fs_attention_f32 /
 * fs_attention_masked_f32, and the same output bits as those called on the cache widened to
 * float32 (widening is exact). Half the cache bytes a call reads (fs_attention_f16.c: the
 * tiled kernel widens each vector as it loads it; other head sizes widen each kv head's valid
 * rows into a buffer of the calling thread first: if the allocator refuses that buffer, one kv
 * head's valid rows and the call's queries, the outputs are NaN instead of a crash). */
void fs_attention_f32h(const float *q, const uint16_t *k, const uint16_t *v, float *out, int n,
                       int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                       int causal, int window, double *scratch);
void fs_attention_masked_f32h(const float *q, const uint16_t *k, const uint16_t *v, float *out,
                              int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                              int length, const uint8_t *mask, int window, double *scratch);

/* h[i] = x[i] rounded to binary16, nearest with ties to even (numpy's astype(float16): past
 * the largest binary16 an infinity, NaN stays NaN), for writes into a float16 cache. */
void fs_f32_to_f16(const float *x, uint16_t *h, size_t count);

#endif /* FS_ATTENTION_H */
