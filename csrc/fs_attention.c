/* fs_attention.c -- attention over a KV cache (fs_attention.h): the double-accumulating
 * template for both input types, and the drivers of the tiled float kernel, whose block is an
 * ISA variant (fs_attention_f32.inc) taken from fs_disp. */
#include "fs_attention.h"

#include "fs_isa.h"
#include "fs_kernels.h"
#include "fs_variants.h"

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

/* ---- the double-accumulating kernel, float and double inputs (fs_attention_dbl.inc) ---- */

#define FS_T float
#define FS_SFX f32
#include "fs_attention_dbl.inc"

#define FS_T double
#define FS_SFX f64
#include "fs_attention_dbl.inc"

/* ---- the tiled float kernel's drivers ------------------------------------------------------ */
/* The float32 attention kernel: float arithmetic in registers inside tiles of keys, double
 * across tiles.
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
 * Variants (fs_attention_f32.inc, one file per vector width): with GCC on x86-64 glibc Linux
 * the block kernel exists for AVX-512 (16-lane vectors, one zmm each), AVX2 + FMA (8-lane
 * vectors: every sum a ymm register; 16-lane ones would be two registers each and spill) and
 * the baseline, picked once from the CPU flags (fs_isa.c); elsewhere the build's own target,
 * 8 lanes when it is AVX2 without AVX-512.
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
#if FS_HAVE_VEC
static inline int fs_f32_supported(int head_dim)
{
    return head_dim % 16 == 0 && head_dim <= FS_F32_MAXD;
}

/* One block of `rows` query rows of kv head kv: query and output row r at q + at[r] and
 * out + at[r]. */
static void fs_f32_run_block(fs_attn_block_fn block, const float *q, const float *k,
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

/* Same contract as fs_attention_f64 (fs_attention.h); head_dim must pass
 * fs_f32_supported. Query rows of a kv head are taken FS_F32_ROWS at a time. */
static void fs_attention_f32_tiled(const float *q, const float *k, const float *v, float *out,
                                   int n, int n_heads, int n_kv_heads, int head_dim,
                                   int capacity, int length, int causal)
{
    fs_attn_block_fn block = fs_disp->attn_f32;
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
    fs_attn_block_fn block = fs_disp->attn_f32;
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

/* ---- entry points ---------------------------------------------------------------------------- */

void fs_attention_f64(const double *q, const double *k, const double *v, double *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, int causal, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                         causal, NULL, scratch);
}

/* float32: the tiled float kernel where the head size allows it (the choice depends on
 * head_dim only, never on n, so decode and verification agree bit for bit). */
void fs_attention_f32(const float *q, const float *k, const float *v, float *out,
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

void fs_attention_masked_f32(const float *q, const float *k, const float *v, float *out,
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

void fs_attention_masked_f64(const double *q, const double *k, const double *v,
                                    double *out, int n, int n_heads, int n_kv_heads,
                                    int head_dim, int capacity, int length,
                                    const uint8_t *mask, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, 0,
                         mask, scratch);
}

