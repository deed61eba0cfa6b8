/* fs_attention_f32.h -- the float32 attention kernel: float arithmetic in registers inside
 * tiles of keys, double across tiles. Included by fs_attention.h (not on its own).
 *
 * Why a separate float32 kernel: the double-accumulating template spends most of its time
 * converting floats to doubles (one conversion per multiply), ~7 GMAC/s. Here the products
 * and their sums stay in float vectors, so one fused multiply-add does 8 or 16 MACs:
 *
 *   scores:   s[r][j] = scale * dot(q[r], k[j]), two query rows and four keys per pass,
 *             each key's partial sums reduced by one fixed shuffle tree (fs_f32_reduce4);
 *   softmax:  online over tiles of FS_F32_TILE keys (a running maximum m, and the sum of
 *             weights l in double, rescaled by exp(m_old - m_new) when m grows), exp in float;
 *   values:   per tile, acc[r][:] += w[r][j] * v[j][:] in float registers, then the tile's
 *             sum is added to a double accumulator.
 *
 * Variants (fs_attention_f32_impl.h, one per vector width): with GCC on x86-64 glibc Linux
 * the kernel exists for AVX-512 (16-lane vectors, one zmm each), AVX2 + FMA (8-lane vectors:
 * every sum a ymm register; 16-lane ones would be two registers each and spill) and the
 * baseline, picked once from the CPU flags; elsewhere the build's own target, 8 lanes when it
 * is AVX2 without AVX-512.
 *
 * Error: float sums run over at most head_dim / W chunks (dot products, W lanes) or
 * FS_F32_TILE keys (weighted values); tiles are added in double, so the result is within
 * ~1e-6 relative of the float64 formula at any length (tests: 1e-5).
 *
 * Determinism across n: the arithmetic of one query row (the order of every sum, the tile
 * boundaries, the reduction tree) does not depend on which other rows share its block or its
 * pass, so a position's output is bit-identical whether it is computed alone (decode, n = 1)
 * or inside a block of queries (verification). Greedy speculative decoding relies on this.
 *
 * Handles head_dim a multiple of 16 up to 128 (fs_f32_supported); others use the double
 * template.
 */
#ifndef FS_ATTENTION_F32_H
#define FS_ATTENTION_F32_H

#include "fs_common.h"

#if FS_HAVE_VEC

#define FS_F32_TILE 128
#define FS_F32_ROWS 4
#define FS_F32_MAXD 128

static inline int fs_f32_supported(int head_dim)
{
    return head_dim % 16 == 0 && head_dim <= FS_F32_MAXD;
}

typedef void (*fs_f32_block_fn)(const float *const *qrows, float *const *orows,
                                const int *count, int rows, const float *kh, const float *vh,
                                int head_dim, float scale, int base, const int32_t *anc);

/* Row of key j in a kv head's (capacity, D) keys or values: j itself, or for a tree node
 * (anc != NULL) the context row j below base and the node row base + anc[j - base] from
 * there (its ancestors in order, itself last). */
FS_ALWAYS_INLINE const float *fs_f32_key(const float *k, int j, int D, int base,
                                         const int32_t *anc)
{
    size_t row = anc && j >= base ? (size_t)base + (size_t)anc[j - base] : (size_t)j;
    return k + row * (size_t)D;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && defined(__GLIBC__) && !defined(FS_NO_CLONES) && !defined(__AVX512F__)
#define FS_SFX avx512
#define FS_ATTR __attribute__((target("arch=x86-64-v4")))
#define FS_W 16
#include "fs_attention_f32_impl.h"

#define FS_SFX avx2
#define FS_ATTR __attribute__((target("arch=x86-64-v3")))
#define FS_W 8
#include "fs_attention_f32_impl.h"

#define FS_SFX def
#define FS_ATTR
#define FS_W 16
#include "fs_attention_f32_impl.h"

/* The widest variant the CPU runs (its choice never depends on n). */
static fs_f32_block_fn fs_f32_pick(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        return fs_f32_block_avx512;
    if (__builtin_cpu_supports("x86-64-v3"))
        return fs_f32_block_avx2;
    return fs_f32_block_def;
}
#else
#define FS_SFX def
#define FS_ATTR
#if defined(__AVX2__) && !defined(__AVX512F__)
#define FS_W 8
#else
#define FS_W 16
#endif
#include "fs_attention_f32_impl.h"

static fs_f32_block_fn fs_f32_pick(void) { return fs_f32_block_def; }
#endif

/* One block of `rows` query rows of kv head kv: query and output row r at q + at[r] and
 * out + at[r]. */
static void fs_f32_run_block(fs_f32_block_fn block, const float *q, const float *k,
                             const float *v, float *out, const size_t *at, const int *count,
                             int rows, int kv, int capacity, int head_dim, float scale,
                             int base, const int32_t *anc)
{
    const float *qrows[FS_F32_ROWS];
    float *orows[FS_F32_ROWS];
    for (int r = 0; r < rows; r++) {
        qrows[r] = q + at[r];
        orows[r] = out + at[r];
    }
    size_t head = (size_t)kv * capacity * head_dim;
    block(qrows, orows, count, rows, k + head, v + head, head_dim, scale, base, anc);
}

/* Same contract as fs_attention_f64 (see fs_attention.h); head_dim must pass
 * fs_f32_supported. Query rows of a kv head are taken FS_F32_ROWS at a time. */
static void fs_attention_f32_tiled(const float *q, const float *k, const float *v, float *out,
                                   int n, int n_heads, int n_kv_heads, int head_dim,
                                   int capacity, int length, int causal)
{
    fs_f32_block_fn block = fs_f32_pick();
    int group = n_heads / n_kv_heads;
    int rows_per_kv = n * group; /* row t = i * group + g reads query i, head kv * group + g */
    float scale = (float)(1.0 / sqrt((double)head_dim));
    for (int kv = 0; kv < n_kv_heads; kv++)
        for (int t0 = 0; t0 < rows_per_kv; t0 += FS_F32_ROWS) {
            size_t at[FS_F32_ROWS];
            int count[FS_F32_ROWS];
            int rows = rows_per_kv - t0 < FS_F32_ROWS ? rows_per_kv - t0 : FS_F32_ROWS;
            for (int r = 0; r < rows; r++)
                count[r] = fs_attn_row(kv, t0 + r, group, n, n_heads, head_dim, length, causal,
                                       &at[r]);
            fs_f32_run_block(block, q, k, v, out, at, count, rows, kv, capacity, head_dim,
                             scale, 0, NULL);
        }
}

/* Tree attention on the tiled kernel (contract of fs_attention_masked_f32, fs_attention.h):
 * node i reads its visible keys as one contiguous range, the context then the node rows j
 * with mask[i * n + j] in order, so a node whose visible nodes are its path computes exactly
 * what a decode step of that path computes (same keys in the same order: the same bits).
 * anc: n ints of scratch. A block holds the heads of one node (its keys are its own). */
static void fs_attention_f32_tree(const float *q, const float *k, const float *v, float *out,
                                  int n, int n_heads, int n_kv_heads, int head_dim,
                                  int capacity, int length, const uint8_t *mask, int32_t *anc)
{
    fs_f32_block_fn block = fs_f32_pick();
    int group = n_heads / n_kv_heads, base = length - n;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < n; j++)
            if (mask[(size_t)i * n + j])
                anc[seen++] = j;
        for (int kv = 0; kv < n_kv_heads; kv++)
            for (int g0 = 0; g0 < group; g0 += FS_F32_ROWS) {
                size_t at[FS_F32_ROWS];
                int count[FS_F32_ROWS];
                int rows = group - g0 < FS_F32_ROWS ? group - g0 : FS_F32_ROWS;
                for (int r = 0; r < rows; r++) {
                    at[r] = ((size_t)i * n_heads + kv * group + g0 + r) * head_dim;
                    count[r] = base + seen;
                }
                fs_f32_run_block(block, q, k, v, out, at, count, rows, kv, capacity, head_dim,
                                 scale, base, anc);
            }
    }
}

#endif /* FS_HAVE_VEC */
#endif /* FS_ATTENTION_F32_H */
