/* fs_attention.c -- attention over a KV cache (fs_attention.h): the double-accumulating
 * template for both input types, and the drivers of the tiled float kernel, whose block is an
 * ISA variant (fs_attention_f32.inc) taken from fs_disp. */
#include "fs_attention.h"

#include <stdlib.h>

#include "fs_isa.h"
#include "fs_kernels.h"
#include "fs_pool.h"
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

/* First key a query at position pos sees through a sliding window of `window` keys (0: no
 * window): keys (pos - window, pos] are seen. */
static inline int fs_attn_lo(int pos, int window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

/* Position of query i of a call: its cache row for a chain, the context length plus its
 * depth (its ancestors before it, mask row sum - 1) for a tree node. */
static inline int fs_attn_pos(int i, int n, int length, const uint8_t *mask)
{
    if (!mask)
        return length - n + i;
    int seen = 0;
    for (int t = 0; t < n; t++)
        seen += mask[(size_t)i * n + t] != 0;
    return length - n + seen - 1;
}

/* Whether the window hides a key from some query of the call (else the call runs as one
 * without a window: the same bits). */
static int fs_attn_cuts(int n, int length, const uint8_t *mask, int window)
{
    if (window <= 0 || length <= window)
        return 0;
    for (int i = 0; i < n; i++)
        if (fs_attn_lo(fs_attn_pos(i, n, length, mask), window) > 0)
            return 1;
    return 0;
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
 *   scores:   s[r][j] = scale * dot(q[r], k[j]), 3 (AVX2) or 4 query rows and four keys a pass,
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
 * Handles head_dim a multiple of 16 up to 256 (FS_F32_SUPPORTED); others use the double
 * template.
 */
#if FS_HAVE_VEC
/* ---- transposed keys ----
 * A call whose kv heads each serve at least FS_ATTN_KT_ROWS query rows first transposes each
 * head's keys (fs_disp->attn_f32_keys), and its blocks compute their scores from those: the
 * same bits (fs_attention_f32.inc), with no horizontal sums. Measured on the Xeon guest
 * (2026-12-02, AVX-512, 1 thread, head_dim 64, 300 keys before the rows; us a call, keys as
 * they are -> transposed): 9 heads on 3 kv heads, 16 rows (48 a kv head) 143 -> 130, 8 rows
 * (24) 66 -> 66, 6 rows (18) 50 -> 54, 3 rows (9) 30 -> 31; 4 heads on 2, 16 rows (32)
 * 67.5 -> 60, 12 rows (24) 48 -> 47, 8 rows (16) 32.5 -> 35. Below 24 rows a kv head the
 * transposition costs more than it saves.
 * Only calls that run on the caller alone transpose: the pool's workers would read the copy
 * from the caller's cache. Measured on the Xeon guest (2026-12-06, AMX build, 2 threads, head_dim
 * 64, 300 keys; us a call, transposed -> as they are): 9 heads on 3, 8 rows 63-70 -> 39-44,
 * 16 rows 100-107 -> 81-90; 4 heads on 2, 16 rows 54-56 -> 40; the real SmolLM2 q4_1 file's
 * 8-row step at 2 threads (context 64) 6.7-7.0 -> 6.1-6.5 ms. With blocks of 12 rows
 * (FS_F32_ROWS) the threshold still holds at 1 thread (as they are -> transposed, same day):
 * 9 heads on 3, 300 keys, 8 rows 75-79 -> 72-73, 16 rows 146-147 -> 131-139; 4 heads on 2,
 * 400 keys, 8 and 16 rows the same.
 * Only an AVX-512 variant transposes (fs_isa_select_attn leaves the others' keys function
 * out; a build for an AVX-512 target keeps its baseline's), only copies of at most
 * FS_ATTN_KT_MAX floats, and only head sizes up to FS_ATTN_KT_MAXD. */
#ifndef FS_ATTN_KT_ROWS
#define FS_ATTN_KT_ROWS 24
#endif
/* Largest head size that transposes. A row's dot product over 256 inputs is 16 AVX-512
 * multiply-adds before its one horizontal sum, so there is little left for the copy to save.
 * Measured on an Intel Xeon guest without AMX (family 6 model 207, 2026-12-07, 1 thread,
 * AVX-512; a C program calling two builds of this file in turn, min of 40 calls each, us a
 * call, transposed -> as they are): head_dim 256, 4 heads on 1, 300 keys, 8 rows 107-157 ->
 * 86-119 (0.76-0.80 of the time), 16 rows 0.80 (and 1.04 once, beside a busy core); 1024
 * keys, 8 rows 489-685 -> 363-502 (0.73-0.75), 16 rows 0.80; 8 heads on 1, 1024 keys, 8 rows
 * 0.79-0.80. Head size 128 (16 heads on 8, 16 rows, 300 and 1024 keys) transposed takes
 * 0.96-1.01 of the time of its keys as they are: it keeps transposing. On the Zen 4 EPYC head
 * 256 was within 4% either way (2026-12-07). */
#ifndef FS_ATTN_KT_MAXD
#define FS_ATTN_KT_MAXD 128
#endif
/* Largest transposed copy (floats, all heads) a call makes; larger calls read the keys. 256K
 * floats (1 MiB) since 2026-12-07, 4M before: every head's copy is made before the first block
 * reads it, so a larger one is read back from L3 or memory. Measured on the Zen 4 EPYC (1
 * thread, AVX-512, blocks of 6-16 queries; us a call, min of 3 processes, transposed ->
 * as they are): head_dim 128, 8 heads on 2, 4096 keys (1M floats), 6 rows 1492 -> 1178,
 * 8 rows 1935 -> 1606, 16 rows 3433 -> 3307; head_dim 256, 4 heads on 1, 4096 keys, 1152 ->
 * 1056, 1618 -> 1421, 3086 -> 2927; at 300 and 1024 keys (at most 256K floats: they still
 * transposed; head 256 no longer does, FS_ATTN_KT_MAXD) within 4% either way. The Intel Xeon
 * guest agrees (2026-12-07, script, min of 5 processes a build, 4096 keys, 4M -> 256K):
 * head_dim 64, 9 heads on 3, 8 rows 1136 -> 968; head_dim 128, 16 heads on 8, 16 rows 9670
 * -> 7659. */
#ifndef FS_ATTN_KT_MAX
#define FS_ATTN_KT_MAX ((size_t)256 << 10)
#endif

/* The calling thread's buffer for transposed keys, grown as needed (kept for the thread's
 * life: one call's worth, at most FS_ATTN_KT_MAX floats). */
static float *fs_attn_kt_buffer(size_t floats)
{
    static __thread float *buf;
    static __thread size_t cap;
    if (floats > cap) {
        void *p = NULL;
        if (posix_memalign(&p, 64, floats * sizeof(float)) != 0)
            return NULL;
        free(buf);
        buf = p;
        cap = floats;
    }
    return buf;
}

/* Transposed keys [0, keys) of every kv head (head kv at the result + kv * *stride), or NULL
 * (*stride 0) when the call runs in nchunks > 1 pool chunks, is too small to gain from them,
 * too large, its head size is over FS_ATTN_KT_MAXD, or out of memory. */
static const float *fs_attn_transpose(const float *k, int n_kv_heads, int head_dim,
                                      int capacity, int keys, int rows_per_kv, int nchunks,
                                      size_t *stride)
{
    fs_attn_keys_fn keys_fn = fs_disp->attn_f32_keys;
    *stride = 0;
    if (!keys_fn || nchunks > 1 || keys <= 0 || rows_per_kv < FS_ATTN_KT_ROWS
        || head_dim > FS_ATTN_KT_MAXD)
        return NULL;
    *stride = (size_t)(keys + FS_F32_PANEL - 1) / FS_F32_PANEL * FS_F32_PANEL * head_dim;
    if (*stride * n_kv_heads > FS_ATTN_KT_MAX)
        return NULL;
    float *kt = fs_attn_kt_buffer(*stride * n_kv_heads);
    if (kt)
        for (int kv = 0; kv < n_kv_heads; kv++)
            keys_fn(k + (size_t)kv * capacity * head_dim, keys, head_dim, kt + kv * *stride);
    return kt;
}

/* One block of `rows` query rows of kv head kv: query and output row r at q + at[r] and
 * out + at[r]; kt: the transposed keys of every head (stride floats apart) or NULL. The cache:
 * k, v (float32) or k16, v16 (float16), the others NULL. */
static void fs_f32_run_block(fs_attn_block_fn block, const float *q, const float *k,
                             const float *v, const uint16_t *k16, const uint16_t *v16,
                             float *out, const size_t *at, const int *count, int rows, int kv,
                             int capacity, int head_dim, float scale, int base,
                             const int32_t *anc, const float *kt, size_t kt_stride, int kt_keys)
{
    const float *qrows[FS_F32_ROWS];
    float *orows[FS_F32_ROWS];
    for (int r = 0; r < rows; r++) {
        qrows[r] = q + at[r];
        orows[r] = out + at[r];
    }
    size_t head = (size_t)kv * capacity * head_dim;
    if (k16)
        block(qrows, orows, count, rows, NULL, NULL, head_dim, scale, base, anc, NULL, 0,
              k16 + head, v16 + head);
    else
        block(qrows, orows, count, rows, k + head, v + head, head_dim, scale, base, anc,
              kt ? kt + kv * kt_stride : NULL, kt_keys, NULL, NULL);
}

/* Attention this small (multiply-adds of scores and values together) runs on the caller
 * unless the pool's workers are awake (FS_ATTN_PARALLEL_AWAKE): waking them costs more than
 * it saves. Measured on the Xeon guest (2026-12-02): at 262144
 * the embedded target's 2-row block (2 blocks of ~150k) took 1.7 decode steps at 2 threads
 * against 1.1 at 1; a 16-row block of the SmolLM-135M shape at context 300 is 5.5M. */
#ifndef FS_ATTN_PARALLEL_MIN
#define FS_ATTN_PARALLEL_MIN 1048576
#endif
/* From this many multiply-adds attention goes to the pool when its workers are awake
 * (fs_pool_awake: they spin after the layer's split products), so no wake-up is paid. The
 * SmolLM-135M shape's decode step at context 300 has 345k per layer: on the Xeon guest at 2
 * threads its step went from 11.4 to 9.7 ms (bf16) and the real q4_1 file's from 6.0 to 4.3
 * ms; the embedded target's (products too small to split, workers asleep) did not move. */
#ifndef FS_ATTN_PARALLEL_AWAKE
#define FS_ATTN_PARALLEL_AWAKE 262144
#endif

/* Whether `macs` multiply-adds of attention are worth the pool. */
static int fs_attn_parallel(double macs)
{
    return macs >= FS_ATTN_PARALLEL_MIN || (macs >= FS_ATTN_PARALLEL_AWAKE && fs_pool_awake());
}

/* The blocks of one causal call: block b is kv head b / per_kv, rows [t0, t0 + FS_F32_ROWS)
 * of its n * group query rows, t0 = (b % per_kv) * FS_F32_ROWS. Blocks are independent (each
 * writes its own output rows), so the pool may run them in any order on any thread. */
typedef struct {
    fs_attn_block_fn block;
    const float *q, *k, *v, *kt;
    const uint16_t *k16, *v16;  /* a float16 cache (k, v NULL), else NULL */
    float *out;
    int n, n_heads, head_dim, capacity, length, causal, group, per_kv, nblocks, nchunks;
    int window; /* > 0: a sliding window that cuts the call (blocks of one query each) */
    size_t kt_stride;
    float scale;
} fs_f32_job;

/* The blocks of a call the sliding window cuts: block b holds rows [g0, g0 + FS_F32_ROWS) of
 * the heads of query i on kv head kv (b = (i * n_kv_heads + kv) * per_kv + g0 / FS_F32_ROWS),
 * its keys and values from the window's first key: a query's rows are computed as in a call
 * of that query alone. */
static void fs_f32_window_blocks(const fs_f32_job *j, int b_lo, int b_hi)
{
    int n_kv_heads = j->n_heads / j->group;
    for (int b = b_lo; b < b_hi; b++) {
        int i = b / j->per_kv / n_kv_heads, kv = b / j->per_kv % n_kv_heads;
        int g0 = b % j->per_kv * FS_F32_ROWS;
        int pos = j->length - j->n + i, lo = fs_attn_lo(pos, j->window);
        size_t at[FS_F32_ROWS], shift = (size_t)lo * j->head_dim;
        int count[FS_F32_ROWS];
        int rows = j->group - g0 < FS_F32_ROWS ? j->group - g0 : FS_F32_ROWS;
        for (int r = 0; r < rows; r++) {
            at[r] = ((size_t)i * j->n_heads + kv * j->group + g0 + r) * j->head_dim;
            count[r] = pos + 1 - lo;
        }
        if (j->k16)
            fs_f32_run_block(j->block, j->q, NULL, NULL, j->k16 + shift, j->v16 + shift, j->out,
                             at, count, rows, kv, j->capacity, j->head_dim, j->scale, 0, NULL,
                             NULL, 0, 0);
        else
            fs_f32_run_block(j->block, j->q, j->k + shift, j->v + shift, NULL, NULL, j->out, at,
                             count, rows, kv, j->capacity, j->head_dim, j->scale, 0, NULL, NULL,
                             0, 0);
    }
}

static void fs_f32_blocks(const fs_f32_job *j, int b_lo, int b_hi)
{
    int rows_per_kv = j->n * j->group;
    if (j->window > 0) {
        fs_f32_window_blocks(j, b_lo, b_hi);
        return;
    }
    for (int b = b_lo; b < b_hi; b++) {
        int kv = b / j->per_kv, t0 = (b % j->per_kv) * FS_F32_ROWS;
        size_t at[FS_F32_ROWS];
        int count[FS_F32_ROWS];
        int rows = rows_per_kv - t0 < FS_F32_ROWS ? rows_per_kv - t0 : FS_F32_ROWS;
        for (int r = 0; r < rows; r++)
            count[r] = fs_attn_row(kv, t0 + r, j->group, j->n, j->n_heads, j->head_dim,
                                   j->length, j->causal, &at[r]);
        fs_f32_run_block(j->block, j->q, j->k, j->v, j->k16, j->v16, j->out, at, count, rows, kv,
                         j->capacity, j->head_dim, j->scale, 0, NULL, j->kt, j->kt_stride,
                         j->length);
    }
}

static void fs_f32_chunk(void *ctx, int c)
{
    const fs_f32_job *j = (const fs_f32_job *)ctx;
    fs_f32_blocks(j, (int)((long long)c * j->nblocks / j->nchunks),
                  (int)((long long)(c + 1) * j->nblocks / j->nchunks));
}

/* Same contract as fs_attention_f64 (fs_attention.h); head_dim must pass FS_F32_SUPPORTED.
 * The blocks go to the thread pool when the call is large enough; a block's arithmetic does
 * not depend on the thread that runs it, so the output bits do not depend on the thread
 * count. A float16 cache (k16, v16) never transposes its keys (the row path: the same bits). */
void fs_attention_f32_tiled(const float *q, const float *k, const float *v,
                            const uint16_t *k16, const uint16_t *v16, float *out, int n,
                            int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                            int causal, int window)
{
    fs_f32_job j;
    j.block = fs_disp->attn_f32;
    j.q = q; j.k = k; j.v = v; j.k16 = k16; j.v16 = v16; j.out = out;
    j.n = n; j.n_heads = n_heads; j.head_dim = head_dim; j.capacity = capacity;
    j.length = length; j.causal = causal;
    j.group = n_heads / n_kv_heads;
    /* a window is the causal calls' (the callers refuse it otherwise) */
    j.window = causal && fs_attn_cuts(n, length, NULL, window) ? window : 0;
    /* blocks of a kv head (of a query and kv head with a window) */
    j.per_kv = ((j.window ? 1 : n) * j.group + FS_F32_ROWS - 1) / FS_F32_ROWS;
    j.nblocks = (j.window ? n : 1) * n_kv_heads * j.per_kv;
    j.scale = (float)(1.0 / sqrt((double)head_dim));
    /* cost of a block ~ its multiply-adds: up to FS_F32_ROWS rows x keys x head_dim x 2 */
    double macs = 2.0 * n * n_heads * (double)(j.window ? window : length) * head_dim;
    j.nchunks = fs_attn_parallel(macs) ? fs_pool_chunks(j.nblocks, (size_t)(macs / j.nblocks), 1)
                                       : 1;
    j.kt_stride = 0;
    j.kt = j.window || k16 ? NULL : fs_attn_transpose(k, n_kv_heads, head_dim, capacity, length,
                                                      n * j.group, j.nchunks, &j.kt_stride);
    if (j.nchunks <= 1)
        fs_f32_blocks(&j, 0, j.nblocks);
    else
        fs_pool_run(fs_f32_chunk, &j, j.nchunks);
}

/* Tree attention on the tiled kernel (contract of fs_attention_masked_f32, fs_attention.h):
 * node i reads its visible keys as one contiguous range, the context then the node rows j
 * with mask[i * n + j] in order, so a node whose visible nodes are its path computes exactly
 * what a decode step of that path computes (same keys in the same order: the same bits).
 * anc: n ints of scratch. A block holds the heads of one node (its keys are its own).
 *
 * Nodes go to the thread pool in chunks when the call is large enough; a chunk keeps its
 * nodes' ancestor lists on its own stack, so trees up to FS_ATTN_TREE_POOL_MAX nodes (larger
 * ones, never built by the drafters, run on the caller with the caller's scratch). */
#define FS_ATTN_TREE_POOL_MAX 256

typedef struct {
    fs_attn_block_fn block;
    const float *q, *k, *v, *kt;
    const uint16_t *k16, *v16;  /* a float16 cache (k, v NULL), else NULL */
    float *out;
    const uint8_t *mask;
    int n, n_heads, n_kv_heads, head_dim, capacity, length, window, nchunks;
    size_t kt_stride;
    float scale;
} fs_f32_tree_job;

/* Nodes [i_lo, i_hi) of a tree call, with anc (n ints) as the ancestor list's storage. */
static void fs_f32_tree_nodes(const fs_f32_tree_job *j, int i_lo, int i_hi, int32_t *anc)
{
    int n = j->n, group = j->n_heads / j->n_kv_heads, base = j->length - n;
    for (int i = i_lo; i < i_hi; i++) {
        int seen = 0;
        for (int t = 0; t < n; t++)
            if (j->mask[(size_t)i * n + t])
                anc[seen++] = t;
        /* a sliding window (seen <= window): the context keys from its first one */
        int lo = fs_attn_lo(base + seen - 1, j->window);
        size_t shift = (size_t)lo * j->head_dim;
        const float *k = j->k16 ? NULL : j->k + shift, *v = j->v16 ? NULL : j->v + shift;
        const uint16_t *k16 = j->k16 ? j->k16 + shift : NULL;
        const uint16_t *v16 = j->v16 ? j->v16 + shift : NULL;
        for (int kv = 0; kv < j->n_kv_heads; kv++)
            for (int g0 = 0; g0 < group; g0 += FS_F32_ROWS) {
                size_t at[FS_F32_ROWS];
                int count[FS_F32_ROWS];
                int rows = group - g0 < FS_F32_ROWS ? group - g0 : FS_F32_ROWS;
                for (int r = 0; r < rows; r++) {
                    at[r] = ((size_t)i * j->n_heads + kv * group + g0 + r) * j->head_dim;
                    count[r] = base - lo + seen;
                }
                fs_f32_run_block(j->block, j->q, k, v, k16, v16, j->out, at, count, rows, kv,
                                 j->capacity, j->head_dim, j->scale, base - lo, anc,
                                 j->kt, j->kt_stride, base);
            }
    }
}

static void fs_f32_tree_chunk(void *ctx, int c)
{
    const fs_f32_tree_job *j = (const fs_f32_tree_job *)ctx;
    int32_t anc[FS_ATTN_TREE_POOL_MAX];
    fs_f32_tree_nodes(j, (int)((long long)c * j->n / j->nchunks),
                      (int)((long long)(c + 1) * j->n / j->nchunks), anc);
}

void fs_attention_f32_tree(const float *q, const float *k, const float *v,
                           const uint16_t *k16, const uint16_t *v16, float *out, int n,
                           int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                           const uint8_t *mask, int window, int32_t *anc)
{
    fs_f32_tree_job j;
    j.block = fs_disp->attn_f32;
    j.q = q; j.k = k; j.v = v; j.k16 = k16; j.v16 = v16; j.out = out; j.mask = mask;
    j.n = n; j.n_heads = n_heads; j.n_kv_heads = n_kv_heads; j.head_dim = head_dim;
    j.capacity = capacity; j.length = length;
    j.window = fs_attn_cuts(n, length, mask, window) ? window : 0;
    j.scale = (float)(1.0 / sqrt((double)head_dim));
    double macs = 2.0 * n * n_heads * (double)(j.window ? window : length) * head_dim;
    j.nchunks = fs_attn_parallel(macs) && n <= FS_ATTN_TREE_POOL_MAX
                ? fs_pool_chunks(n, (size_t)(macs / n), 1) : 1;
    /* the context keys, below the nodes, are every node's (without a window that cuts) */
    j.kt_stride = 0;
    j.kt = j.window || k16 ? NULL
                           : fs_attn_transpose(k, n_kv_heads, head_dim, capacity, length - n,
                                               n * (n_heads / n_kv_heads), j.nchunks,
                                               &j.kt_stride);
    if (j.nchunks <= 1)
        fs_f32_tree_nodes(&j, 0, n, anc);
    else
        fs_pool_run(fs_f32_tree_chunk, &j, j.nchunks);
}

#endif /* FS_HAVE_VEC */

/* ---- entry points ---------------------------------------------------------------------------- */

void fs_attention_f64(const double *q, const double *k, const double *v, double *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, int causal, int window, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                         causal, NULL, window, scratch);
}

/* float32: the tiled float kernel where the head size allows it (the choice depends on
 * head_dim only, never on n, so decode and verification agree bit for bit). */
void fs_attention_f32(const float *q, const float *k, const float *v, float *out,
                             int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                             int length, int causal, int window, double *scratch)
{
#if FS_HAVE_VEC
    if (FS_F32_SUPPORTED(head_dim)) {
        fs_attention_f32_tiled(q, k, v, NULL, NULL, out, n, n_heads, n_kv_heads, head_dim,
                               capacity, length, causal, window);
        return;
    }
#endif
    fs_attention_dbl_f32(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length,
                         causal, NULL, window, scratch);
}

void fs_attention_masked_f32(const float *q, const float *k, const float *v, float *out,
                                    int n, int n_heads, int n_kv_heads, int head_dim,
                                    int capacity, int length, const uint8_t *mask,
                                    int window, double *scratch)
{
#if FS_HAVE_VEC
    if (FS_F32_SUPPORTED(head_dim)) {  /* n ints of the caller's >= length doubles */
        fs_attention_f32_tree(q, k, v, NULL, NULL, out, n, n_heads, n_kv_heads, head_dim,
                              capacity, length, mask, window, (int32_t *)scratch);
        return;
    }
#endif
    fs_attention_dbl_f32(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, 0,
                         mask, window, scratch);
}

void fs_attention_masked_f64(const double *q, const double *k, const double *v,
                                    double *out, int n, int n_heads, int n_kv_heads,
                                    int head_dim, int capacity, int length,
                                    const uint8_t *mask, int window, double *scratch)
{
    fs_attention_dbl_f64(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, 0,
                         mask, window, scratch);
}
