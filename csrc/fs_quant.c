/* fs_quant.c -- the quantized products' entry points (fs_quant.h): packing, the activation
 * rule, the split between threads and the dequantized rows; the products themselves are ISA
 * variants (fs_quant_kern.h) reached through fs_disp. */
#include "fs_quant.h"

#include <float.h>
#include <string.h>

#include "fs_isa.h"
#include "fs_pool.h"
#include "fs_quant_kern.h"
#include "fs_variants.h"

int fs_quant_block_bytes(int kind)
{
    switch (kind) {
    case FS_Q8_0: return 34;
    case FS_Q4_0: return 18;
    case FS_Q4_1: return 20;
    default: return 0;
    }
}

size_t fs_quant_panel_bytes(int kind, int in) { return FS_Q_PANEL_BYTES(kind, in); }

size_t fs_quant_packed_bytes(int kind, int in, int out)
{
    return fs_quant_panel_bytes(kind, in) * (size_t)((out + FS_Q_COLS - 1) / FS_Q_COLS);
}

/* A value the compiler must not fuse into a following addition (q4_1's d * nib + m is two
 * roundings, as GGUF's dequantization does it). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FS_Q_NOFUSE(v) __asm__("" : "+x"(v))
#else
#define FS_Q_NOFUSE(v) ((void)0)
#endif

int fs_quant_pack_panel(int kind, const uint8_t *rows, int in, int ncols, uint8_t *pan)
{
    int bb = fs_quant_block_bytes(kind), nb = in / FS_Q_BLOCK, bad = 0;
    size_t qoff = FS_Q_PANEL_QS(kind, nb), moff = FS_Q_PANEL_M(nb);
    size_t qb = kind == FS_Q8_0 ? 256 : 128;
    int groups = kind == FS_Q8_0 ? 8 : 4;  /* 4-byte groups a block: 32 int8, 16 nibble pairs */
    memset(pan, 0, fs_quant_panel_bytes(kind, in));
    for (int c = 0; c < ncols; c++) {
        const uint8_t *row = rows + (size_t)c * nb * bb;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * bb, *q = blk + 2;
            uint16_t d = fs_rd16le(blk);
            bad |= fs_h_nonfinite(d);
            fs_wr16le(pan + (size_t)(b * FS_Q_COLS + c) * 2, d);
            if (kind == FS_Q4_1) {
                uint16_t m = fs_rd16le(blk + 2);
                bad |= fs_h_nonfinite(m);
                fs_wr16le(pan + moff + (size_t)(b * FS_Q_COLS + c) * 2, m);
                q = blk + 4;
            }
            /* group j (inputs 4j..4j+3; for q4_*, GGUF's byte i holds elements i (low) and
             * i + 16 (high): the same pair as the panel's byte, so bytes move whole) */
            uint8_t *qs = pan + qoff + (size_t)b * qb + (size_t)c * 4;
            for (int j = 0; j < groups; j++) memcpy(qs + (size_t)j * FS_Q_COLS * 4, q + 4 * j, 4);
        }
    }
    return bad;
}

/* Panels [g0, g1) of fs_quant_pack (arguments checked); returns 1 if a scale is bad. */
static int fs_q_pack_panels(int kind, const uint8_t *blocks, int in, int out, uint8_t *P,
                            int g0, int g1)
{
    size_t psz = fs_quant_panel_bytes(kind, in);
    size_t row = (size_t)(in / FS_Q_BLOCK) * (size_t)fs_quant_block_bytes(kind);
    int bad = 0;
    for (int g = g0; g < g1; g++) {
        int c0 = g * FS_Q_COLS, ncols = out - c0 < FS_Q_COLS ? out - c0 : FS_Q_COLS;
        bad |= fs_quant_pack_panel(kind, blocks + (size_t)c0 * row, in, ncols,
                                   P + (size_t)g * psz);
    }
    return bad;
}

/* A pack shared out by the core's pool in chunks of whole panels (fs_pool_run_ranges: a load
 * packs gigabytes, most of it the first touch of the destination's pages). */
typedef struct {
    const uint8_t *blocks;
    uint8_t *P;
    int kind, in, out;
} fs_q_pack_job;

static int fs_q_pack_range(void *ctx, size_t g0, size_t g1)
{
    const fs_q_pack_job *j = (const fs_q_pack_job *)ctx;
    return fs_q_pack_panels(j->kind, j->blocks, j->in, j->out, j->P, (int)g0, (int)g1);
}

int fs_quant_pack(int kind, const uint8_t *blocks, int in, int out, uint8_t *P)
{
    fs_q_pack_job j = {blocks, P, kind, in, out};
    if (fs_quant_block_bytes(kind) == 0 || in <= 0 || in % FS_Q_BLOCK != 0 || out < 1)
        return FS_Q_EARG;
    return fs_pool_run_ranges(fs_q_pack_range, &j, (size_t)((out + FS_Q_COLS - 1) / FS_Q_COLS),
                              (size_t)in * FS_Q_COLS) ? FS_Q_EBADSCALE : 0;
}

void fs_quant_unpack(int kind, const uint8_t *P, int in, int out, uint8_t *blocks)
{
    int bb = fs_quant_block_bytes(kind), nb = in / FS_Q_BLOCK;
    size_t psz = fs_quant_panel_bytes(kind, in), qoff = FS_Q_PANEL_QS(kind, nb);
    size_t moff = FS_Q_PANEL_M(nb), qb = kind == FS_Q8_0 ? 256 : 128;
    for (int col = 0; col < out; col++) {
        const uint8_t *pan = P + (size_t)(col / FS_Q_COLS) * psz;
        int c = col % FS_Q_COLS;
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = blocks + ((size_t)col * nb + b) * bb;
            const uint8_t *qs = pan + qoff + (size_t)b * qb;
            memcpy(blk, pan + (size_t)(b * FS_Q_COLS + c) * 2, 2);
            uint8_t *dst = blk + 2;
            if (kind == FS_Q4_1) {
                memcpy(blk + 2, pan + moff + (size_t)(b * FS_Q_COLS + c) * 2, 2);
                dst = blk + 4;
            }
            int nq = kind == FS_Q8_0 ? 32 : 16;
            for (int i = 0; i < nq; i++) dst[i] = qs[((i / 4) * FS_Q_COLS + c) * 4 + i % 4];
        }
    }
}

void fs_quant_rows_f32(int kind, const uint8_t *P, int in, int out, const int32_t *cols,
                       int count, float *dst)
{
    int nb = in / FS_Q_BLOCK;
    size_t psz = fs_quant_panel_bytes(kind, in), qoff = FS_Q_PANEL_QS(kind, nb);
    size_t moff = FS_Q_PANEL_M(nb), qb = kind == FS_Q8_0 ? 256 : 128;
    (void)out;
    for (int k = 0; k < count; k++) {
        const uint8_t *pan = P + (size_t)(cols[k] / FS_Q_COLS) * psz;
        int c = cols[k] % FS_Q_COLS;
        float *o = dst + (size_t)k * in;
        for (int b = 0; b < nb; b++) {
            const uint8_t *qs = pan + qoff + (size_t)b * qb;
            float d = fs_h2f(fs_rd16le(pan + (size_t)(b * FS_Q_COLS + c) * 2));
            float m = kind == FS_Q4_1
                      ? fs_h2f(fs_rd16le(pan + moff + (size_t)(b * FS_Q_COLS + c) * 2)) : 0.0f;
            for (int i = 0; i < FS_Q_BLOCK; i++) {
                float v;
                if (kind == FS_Q8_0) {
                    v = d * (float)(int8_t)qs[((i / 4) * FS_Q_COLS + c) * 4 + i % 4];
                } else {
                    int j = i % 16;
                    uint8_t byte = qs[((j / 4) * FS_Q_COLS + c) * 4 + j % 4];
                    int nib = i < 16 ? byte & 15 : byte >> 4;
                    v = d * (float)(kind == FS_Q4_0 ? nib - 8 : nib);
                    if (kind == FS_Q4_1) {
                        FS_Q_NOFUSE(v);
                        v += m;
                    }
                }
                o[b * FS_Q_BLOCK + i] = v;
            }
        }
    }
}

/* ---- activations ----------------------------------------------------------------------- */

/* The statement of the rule in C (fs_quant_rows runs fs_quant_rows_avx2 where the CPU has
 * AVX2: the same max, division, products and nearest-even rounding, so the same bytes). */
void fs_quant_rows_ref(const float *x, int n, int in, int8_t *q, float *d, int32_t *s)
{
    int nb = in / FS_Q_BLOCK;
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)r * in + (size_t)b * FS_Q_BLOCK;
            int8_t *qb = q + (size_t)r * in + (size_t)b * FS_Q_BLOCK;
            float amax = 0.0f;
            int bad = 0;
            for (int i = 0; i < FS_Q_BLOCK; i++) {
                float a = fabsf(xb[i]);
                bad |= !(a <= FLT_MAX);
                amax = a > amax ? a : amax;
            }
            int32_t sum = 0;
            float db;
            if (bad || amax < FS_Q_TINY) {
                memset(qb, 0, FS_Q_BLOCK);
                db = bad ? NAN : 0.0f;
            } else {
                float id = 127.0f / amax;
                for (int i = 0; i < FS_Q_BLOCK; i++) {
                    float v = nearbyintf(xb[i] * id);
                    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                    int iv = (int)v;
                    qb[i] = (int8_t)iv;
                    sum += iv;
                }
                db = amax / 127.0f;
            }
            d[(size_t)r * nb + b] = db;
            s[(size_t)r * nb + b] = sum;
        }
}

void fs_quant_rows(const float *x, int n, int in, int8_t *q, float *d, int32_t *s)
{
#if FS_Q_SIMD
    static int avx2 = -1;
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
               && __builtin_cpu_supports("f16c");
    }
    if (avx2) {
        fs_quant_rows_avx2(x, n, in, q, d, s);
        return;
    }
#endif
    fs_quant_rows_ref(x, n, in, q, d, s);
}

/* ---- the product ------------------------------------------------------------------------ */

size_t fs_quant_scratch_bytes(int kind, int n, int in)
{
    (void)kind;
    size_t nb = (size_t)(in / FS_Q_BLOCK);
    return 64 + 4 * FS_Q_UP64((size_t)n * in) + 6 * FS_Q_UP64((size_t)n * nb * 4);
}

/* fs_quant_interleave of rows [r0, r1) (each row's copies depend on that row alone). */
static void fs_quant_interleave_rows(const fs_qact *a, int with_unsigned, int r0, int r1)
{
    int n = a->n, in = a->in, nb = a->nb;
    int8_t *qi = (int8_t *)a->qi;
    uint8_t *qui = (uint8_t *)a->qui;
    float *dt = (float *)a->dt, *dst = (float *)a->dst;
    int32_t *st = (int32_t *)a->st;
    for (int r = r0; r < r1; r++)
        for (int b = 0; b < nb; b++) {
            size_t i = (size_t)b * n + r, k = (size_t)r * nb + b;
            memcpy(qi + i * FS_Q_BLOCK, a->q + (size_t)r * in + (size_t)b * FS_Q_BLOCK, FS_Q_BLOCK);
            if (with_unsigned)
                memcpy(qui + i * FS_Q_BLOCK, a->qu + (size_t)r * in + (size_t)b * FS_Q_BLOCK,
                       FS_Q_BLOCK);
            dt[i] = a->d[k];
            dst[i] = a->ds[k];
            st[i] = a->s[k];
        }
}

void fs_quant_interleave(const fs_qact *a, int with_unsigned)
{
    fs_quant_interleave_rows(a, with_unsigned, 0, a->n);
}

typedef struct {
    int kind, out, accumulate, ng, chunk;
    const fs_qact *a;
    const uint8_t *P;
    const float *bias;
    float *y;
    fs_qpart_fn fn;
} fs_q_job;

static void fs_q_chunk(void *ctx, int c)
{
    const fs_q_job *j = (const fs_q_job *)ctx;
    int g_lo = c * j->chunk, g_hi = g_lo + j->chunk < j->ng ? g_lo + j->chunk : j->ng;
    if (g_lo >= g_hi) return;
    j->fn(j->kind, j->a, j->P, j->y, j->out, g_lo, g_hi, j->accumulate);
    if (j->bias != NULL) {
        int lo = g_lo * FS_Q_COLS, hi = g_hi * FS_Q_COLS < j->out ? g_hi * FS_Q_COLS : j->out;
        for (int r = 0; r < j->a->n; r++) {
            float *yr = j->y + (size_t)r * j->out;
            for (int col = lo; col < hi; col++) yr[col] += j->bias[col];
        }
    }
}

/* The activations of rows [r0, r1): quantized (fs_quant_rows), d x s, and the unsigned and
 * block-interleaved copies where a product reads them; each row's bytes depend on that row
 * alone, so any cut of the rows gives the same bytes. From FS_QROWS_PARALLEL_MIN rows (a
 * prompt, a 16-row block), while the pool's workers are awake (fs_pool_awake, as for the
 * layers' row-wise phases), the rows are cut over the threads: before, the caller quantized
 * alone and the worker waited (3.6% of a 2-thread 256-row prompt's `perf` samples on the real
 * SmolLM2 q8_0 file, Intel Xeon with AMX). Script figures, 2 threads, processes alternated
 * (2026-12-06): the embedded q8_0 target's 255-row prompt 5.34-5.83 -> 5.17-5.50 ms (amx),
 * 11.75-11.94 -> 10.91-11.47 ms (forced avx2, which also reads the unsigned copy); its 16-row
 * step 679-686 -> 663-670 us; 1 thread the same. */
#ifndef FS_QROWS_PARALLEL_MIN
#define FS_QROWS_PARALLEL_MIN 16
#endif
typedef struct {
    const float *x;
    int8_t *q;
    uint8_t *qu;
    float *d, *ds;
    int32_t *s;
    int n, in, nb, with_unsigned, nchunks;
    const fs_qact *interleave; /* NULL: no block-interleaved copies */
} fs_qrows_job;

static void fs_qrows_part(const fs_qrows_job *j, int r0, int r1)
{
    size_t in = (size_t)j->in, nb = (size_t)j->nb;
    if (j->x) { /* else the previous call's rows, still in scratch: the copies only */
        fs_quant_rows(j->x + r0 * in, r1 - r0, j->in, j->q + r0 * in, j->d + r0 * nb,
                      j->s + r0 * nb);
        for (size_t i = r0 * nb; i < r1 * nb; i++) j->ds[i] = j->d[i] * (float)j->s[i];
    }
    if (j->with_unsigned)
        for (size_t i = r0 * in; i < r1 * in; i++) j->qu[i] = (uint8_t)(j->q[i] ^ 0x80);
    if (j->interleave) fs_quant_interleave_rows(j->interleave, j->with_unsigned, r0, r1);
}

static void fs_qrows_chunk(void *ctx, int c)
{
    const fs_qrows_job *j = (const fs_qrows_job *)ctx;
    fs_qrows_part(j, (int)((long long)c * j->n / j->nchunks),
                  (int)((long long)(c + 1) * j->n / j->nchunks));
}

void fs_linear_q_many(int count, const int *kind, const float *x, const uint8_t *const *P,
                      const float *const *bias, float *const *y, int n, int in, const int *out,
                      int accumulate, void *scratch)
{
    if (n <= 0 || count <= 0 || count > FS_Q_MANY_MAX) return;
    int nb = in / FS_Q_BLOCK;
    uint8_t *base = (uint8_t *)scratch;
    base += (64 - (uintptr_t)base % 64) % 64;
    int8_t *q = (int8_t *)base;
    uint8_t *qu = base + FS_Q_UP64((size_t)n * in);
    float *d = (float *)(qu + FS_Q_UP64((size_t)n * in));
    float *ds = (float *)((uint8_t *)d + FS_Q_UP64((size_t)n * nb * 4));
    int32_t *s = (int32_t *)((uint8_t *)ds + FS_Q_UP64((size_t)n * nb * 4));
    fs_qact a = {q, qu, d, ds, s, n, in, nb, q, qu, d, ds, s, n == 1 ? fs_disp->qpf_one : 0, 0};
    if (n > 1) { /* one row: the interleaved layout is the row's own, no copy (decode) */
        a.qi = (int8_t *)((uint8_t *)s + FS_Q_UP64((size_t)n * nb * 4));
        a.qui = (uint8_t *)a.qi + FS_Q_UP64((size_t)n * in);
        a.dt = (float *)(a.qui + FS_Q_UP64((size_t)n * in));
        a.dst = (float *)((uint8_t *)a.dt + FS_Q_UP64((size_t)n * nb * 4));
        a.st = (int32_t *)((uint8_t *)a.dst + FS_Q_UP64((size_t)n * nb * 4));
    }
    /* Each matrix is cut as fs_linear_q alone would cut it (threads when FS_LIN_PARALLEL finds
     * it worth them, chunks of whole groups of FS_LIN_CHUNK_ALIGN columns), so a column's bits
     * do not depend on its neighbours; the job runs on the threads when one of them is cut. A
     * matrix too small to split (k or v at one row) is one chunk, run beside the others. */
    int threads = fs_pool_threads();
    if (threads < 1) threads = 1;
    int align = FS_LIN_CHUNK_ALIGN / FS_Q_COLS > 0 ? FS_LIN_CHUNK_ALIGN / FS_Q_COLS : 1;
    fs_q_job job[FS_Q_MANY_MAX];
    fs_qact aj[FS_Q_MANY_MAX];  /* a, with each matrix's stream flag */
    fs_pool_job run[FS_Q_MANY_MAX] = {{0}};
    int reads = 0;
    for (int i = 0; i < count; i++) {
        job[i].kind = kind[i];
        job[i].out = out[i];
        job[i].accumulate = accumulate;
        job[i].ng = out[i] > 0 ? (out[i] + FS_Q_COLS - 1) / FS_Q_COLS : 0;
        aj[i] = a;
        aj[i].stream = n == 1 && !a.pf_one && kind[i] == FS_Q8_0
                       && fs_quant_packed_bytes(FS_Q8_0, in, out[i]) >= FS_Q_STREAM_MIN_BYTES;
        job[i].a = &aj[i];
        job[i].P = P[i];
        job[i].bias = bias ? bias[i] : NULL;
        job[i].y = y[i];
        int big = FS_Q_USE_BIG(n, nb, fs_disp->qbig_rows[kind[i]], fs_disp->qbig_max_nb);
        int mid = !big && FS_Q_USE_MID(n, fs_disp->qmid_rows[kind[i]]);
        fs_qpart_fn one_wide = FS_Q_USE_ONE_WIDE(n, in, a.pf_one) ? fs_disp->qpart_one_wide
                                                                   : NULL;
        job[i].fn = one_wide ? one_wide
                    : big    ? fs_disp->qpart_big
                    : mid    ? fs_disp->qpart_mid
                             : fs_disp->qpart;
        int r = big && !one_wide ? fs_disp->qreads_big : fs_disp->qreads;
        reads |= kind[i] == FS_Q8_0 ? r : r & ~FS_QREAD_UNSIGNED;
        int units = (job[i].ng + align - 1) / align;
        int parts = FS_LIN_PARALLEL(in, out[i], n) ? (threads < units ? threads : units) : 1;
        job[i].chunk = parts > 0 ? (units + parts - 1) / parts * align : 1;
        run[i] = (fs_pool_job){fs_q_chunk, &job[i], (job[i].ng + job[i].chunk - 1) / job[i].chunk};
    }
    /* The activations: the row-major arrays, unless x is NULL (the previous call's, still in
     * scratch), then only the copies these products read (the AMX tiles read none: a 16-row
     * step of the real SmolLM2 q8_0 file on the Intel Xeon spent ~10% of its time here at 2
     * threads, ~4 points of it in the copies). */
    fs_qrows_job qr = {x, q, qu, d, ds, s, n, in, nb, (reads & FS_QREAD_UNSIGNED) != 0, 1,
                       n > 1 && (reads & FS_QREAD_INTERLEAVED) ? &a : NULL};
    qr.nchunks = x && n >= FS_QROWS_PARALLEL_MIN && fs_pool_awake()
                     ? fs_pool_chunks(n, (size_t)in * 4, 1) : 1;
    if (qr.nchunks > 1)
        fs_pool_run(fs_qrows_chunk, &qr, qr.nchunks);
    else
        fs_qrows_part(&qr, 0, n);
    fs_pool_run_jobs(run, count);
}

void fs_linear_q(int kind, const float *x, const uint8_t *P, const float *bias, float *y, int n,
                 int in, int out, int accumulate, void *scratch)
{
    fs_linear_q_many(1, &kind, x, &P, &bias, &y, n, in, &out, accumulate, scratch);
}

const char *fs_quant_kernel_name(int kind, int n, int in)
{
    return fs_isa_quant_kernel(fs_isa_table()->path, kind, n, in);
}
