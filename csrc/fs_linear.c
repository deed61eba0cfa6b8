/* fs_linear.c -- the products' entry points (fs_linear.h): thread chunks, bias, the bf16 rounding,
 * the double kernel, packing; the packed float kernels are ISA variants (fs_variants.h)
 * reached through fs_disp. */
#include "fs_linear.h"

#include <time.h>

#include "fs_isa.h"
#include "fs_pool.h"
#include "fs_variants.h"

/* Thread chunks of a product: whole groups of FS_LIN_CHUNK_ALIGN columns, at least this many
 * per chunk (fs_pool_chunks sizes them from the thread count and the weights). */
#ifndef FS_LIN_CHUNK_PANELS
#define FS_LIN_CHUNK_PANELS 4
#endif

/* How many chunks the columns of an (in, out) product of n rows are cut into: 1 (run on the
 * caller) when FS_LIN_PARALLEL (fs_variants.h) finds it small, or at one thread. `unit`
 * columns per unit of work (a multiple of the kernels' panels); at least min_cols columns per
 * chunk for one row, which streams W (blocks of FS_LIN_ROWS_COMPUTE rows or more are compute
 * bound: a chunk of one unit keeps a thread busy long enough); a chunk's cost counts at most
 * FS_LIN_CHUNK_ROWS rows. */
static int fs_lin_chunks(int in, int out, int n, int unit, int min_cols)
{
    if (!FS_LIN_PARALLEL(in, out, n)) return 1;
    if (n >= FS_LIN_ROWS_COMPUTE) min_cols = unit;
    size_t rows = n < FS_LIN_CHUNK_ROWS ? (size_t)n : FS_LIN_CHUNK_ROWS;
    return fs_pool_chunks((out + unit - 1) / unit, (size_t)in * unit * rows,
                          (min_cols + unit - 1) / unit);
}

/* Chunk c of n over `units` units: units [*lo, *hi). */
static inline void fs_lin_chunk_range(int c, int n, int units, int *lo, int *hi)
{
    *lo = (int)((long long)c * units / n);
    *hi = (int)((long long)(c + 1) * units / n);
}

void fs_round_bf16(const float *x, float *xr, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t u = fs_f2bf_bits(x[i]);
        memcpy(xr + i, &u, sizeof u);
    }
}

double fs_clock_hz(int bursts)
{
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
    double best = 0.0;
    for (int b = 0; b < bursts; b++) {
        struct timespec t0, t1;
        long n = 1L << 20, acc = 0, one = 1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        /* 4 dependent adds per iteration (the loop counter is a second, parallel chain) */
        __asm__ volatile("1:\n\taddq %2, %0\n\taddq %2, %0\n\taddq %2, %0\n\taddq %2, %0\n"
                         "\tsubq $4, %1\n\tjnz 1b"
                         : "+r"(acc), "+r"(n) : "r"(one) : "cc");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (dt > 0 && (double)(1L << 20) / dt > best) best = (double)(1L << 20) / dt;
    }
    return best;
#else
    (void)bursts;
    return 0.0;
#endif
}

size_t fs_packed_len(int in, int out)
{
    return (size_t)in * ((out + 15) / 16 * 16);
}

void fs_pack_strided(const void *W, size_t esz, int in, int out, size_t rs, size_t cs,
                            void *P)
{
    const char *w = (const char *)W;
    char *p = (char *)P;
    for (int c0 = 0; c0 < out; c0 += FS_LIN_PW) {
        int width = FS_LIN_TAIL_WIDTH(out - c0), real = out - c0 < width ? out - c0 : width;
        for (int k = 0; k < in; k++) {
            const char *row = w + ((size_t)k * rs + (size_t)c0 * cs) * esz;
            if (cs == 1)
                memcpy(p, row, (size_t)real * esz);
            else if (esz == 2)
                for (int c = 0; c < real; c++)
                    ((uint16_t *)p)[c] = ((const uint16_t *)row)[(size_t)c * cs];
            else
                for (int c = 0; c < real; c++)
                    ((float *)p)[c] = ((const float *)row)[(size_t)c * cs];
            memset(p + (size_t)real * esz, 0, (size_t)(width - real) * esz);
            p += (size_t)width * esz;
        }
    }
}
void fs_pack_f32(const float *W, int in, int out, float *P)
{
    fs_pack_strided(W, sizeof *W, in, out, (size_t)out, 1, P);
}
/* any 16-bit weights (float16 or bfloat16 bits) */
void fs_pack_f32h(const uint16_t *W, int in, int out, uint16_t *P)
{
    fs_pack_strided(W, sizeof *W, in, out, (size_t)out, 1, P);
}

#if defined(__GNUC__)
/* --- the double kernel (unpacked W) --------------------------------------------------------- */

/* A tile of R rows x NV vectors of y at column c0, accumulated in registers over the whole
 * `in` axis. R and NV are compile-time constants after inlining. */
FS_ALWAYS_INLINE void fs_lin_tile_f64(const double *FS_RESTRICT x, const double *FS_RESTRICT W,
                                     double *FS_RESTRICT y, const int R, const int NV, int in,
                                     int out, int c0, int k0, int k1, int accumulate)
{
    fs_v8d_u acc[FS_LIN_MAXR * 8];
    FS_LIN_UNROLL for (int r = 0; r < R; r++)
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)
            acc[r * NV + v] = (accumulate || k0 > 0)
                              ? *(const fs_v8d_u *)(y + (size_t)r * out + c0 + v * 8)
                              : (fs_v8d_u){0};
    for (int k = k0; k < k1; k++) {
        const double *w = W + (size_t)k * out + c0;
        if (FS_LIN_PF_TILES)
            FS_LIN_UNROLL for (int v = 0; v < NV; v++)
                __builtin_prefetch(w + (FS_LIN_PF_TILES * NV + v) * 8, 0, 3);
        fs_v8d_u wv[8];
        FS_LIN_UNROLL for (int v = 0; v < NV; v++) wv[v] = *(const fs_v8d_u *)(w + v * 8);
        FS_LIN_UNROLL for (int r = 0; r < R; r++) {
            const double a = x[(size_t)r * in + k];
            FS_LIN_UNROLL for (int v = 0; v < NV; v++) acc[r * NV + v] += a * wv[v];
        }
    }
    FS_LIN_UNROLL for (int r = 0; r < R; r++)
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)
            *(fs_v8d_u *)(y + (size_t)r * out + c0 + v * 8) = acc[r * NV + v];
}

/* Columns [lo, hi): full tiles of NV vectors, then single vectors; returns the first column
 * not covered. */
FS_ALWAYS_INLINE int fs_lin_cols_f64(const double *x, const double *W, double *y, const int R,
                                     const int NV,
                                    int in, int out, int lo, int hi, int accumulate)
{
    /* Blocks of FS_LIN_KB rows of W, each swept across all columns: W is read as a few
     * sequential streams (prefetcher-friendly) and y is reloaded once per block (from L1). */
    int c0 = lo;
    for (int k0 = 0; k0 < in; k0 += FS_LIN_KB) {
        int k1 = k0 + FS_LIN_KB < in ? k0 + FS_LIN_KB : in;
        for (c0 = lo; c0 + NV * 8 <= hi; c0 += NV * 8)
            fs_lin_tile_f64(x, W, y, R, NV, in, out, c0, k0, k1, accumulate);
        for (; c0 + 8 <= hi; c0 += 8)
            fs_lin_tile_f64(x, W, y, R, 1, in, out, c0, k0, k1, accumulate);
    }
    return c0;
}

FS_ALWAYS_INLINE int fs_lin_vec_f64(const double *x, const double *W, double *y, int R, int in,
                                    int out,
                                   int lo, int hi, int accumulate)
{
    switch (R) {
    case 2: return fs_lin_cols_f64(x, W, y, 2, 4, in, out, lo, hi, accumulate);
    case 3: return fs_lin_cols_f64(x, W, y, 3, 2, in, out, lo, hi, accumulate);
    case 4: return fs_lin_cols_f64(x, W, y, 4, 2, in, out, lo, hi, accumulate);
    case 5: return fs_lin_cols_f64(x, W, y, 5, 2, in, out, lo, hi, accumulate);
    case 6: return fs_lin_cols_f64(x, W, y, 6, 2, in, out, lo, hi, accumulate);
    case 7: return fs_lin_cols_f64(x, W, y, 7, 2, in, out, lo, hi, accumulate);
    case 8: return fs_lin_cols_f64(x, W, y, 8, 2, in, out, lo, hi, accumulate);
    case 9: return fs_lin_cols_f64(x, W, y, 9, 2, in, out, lo, hi, accumulate);
    default: return fs_lin_cols_f64(x, W, y, 10, 2, in, out, lo, hi, accumulate);
    }
}

#define FS_LIN_VEC_F64(x, W, y, R, in, out, lo, hi, acc) \
    fs_lin_vec_f64(x, W, y, R, in, out, lo, hi, acc)
#else
#define FS_LIN_VEC_F64(x, W, y, R, in, out, lo, hi, acc) (lo)
#endif /* __GNUC__ */

/* One row, columns [lo, hi): four rows of W per pass over y (which stays in L1). */
FS_ALWAYS_INLINE void fs_lin_row_f64(const double *FS_RESTRICT x, const double *FS_RESTRICT W,
                                    double *FS_RESTRICT y, int in, int out, int lo, int hi,
                                    int accumulate)
{
    if (!accumulate)
        for (int c = lo; c < hi; c++) y[c] = (double)0;
    int k = 0;
    for (; k + 4 <= in; k += 4) {
        const double a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
        const double *w0 = W + (size_t)k * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;
        for (int c = lo; c < hi; c++)
            y[c] += (a0 * w0[c] + a1 * w1[c]) + (a2 * w2[c] + a3 * w3[c]);
    }
    for (; k < in; k++) {
        const double a = x[k];
        const double *w = W + (size_t)k * out;
        for (int c = lo; c < hi; c++) y[c] += a * w[c];
    }
}

/* Columns [c0, hi) not covered by vector tiles: plain axpy rows. */
FS_ALWAYS_INLINE void fs_lin_tail_f64(const double *FS_RESTRICT x, const double *FS_RESTRICT W,
                                     double *FS_RESTRICT y, int R, int in, int out, int c0,
                                     int hi, int accumulate)
{
    for (int r = 0; r < R; r++) {
        double *yr = y + (size_t)r * out;
        if (!accumulate)
            for (int c = c0; c < hi; c++) yr[c] = (double)0;
        for (int k = 0; k < in; k++) {
            const double a = x[(size_t)r * in + k];
            const double *w = W + (size_t)k * out;
            for (int c = c0; c < hi; c++) yr[c] += a * w[c];
        }
    }
}

/* All n rows, columns [lo, hi). */
FS_CLONES static void fs_linear_part_f64(const double *x, const double *W, double *y, int n,
                                          int in, int out, int lo, int hi, int accumulate)
{
    /* Split n rows into passes of at most FS_LIN_MAXR, as even as possible. */
    int passes = (n + FS_LIN_MAXR - 1) / FS_LIN_MAXR;
    int r0 = 0;
    for (int p = 0; p < passes; p++) {
        int R = (n - r0 + (passes - p) - 1) / (passes - p);
        const double *xp = x + (size_t)r0 * in;
        double *yp = y + (size_t)r0 * out;
        if (R == 1) {
            fs_lin_row_f64(xp, W, yp, in, out, lo, hi, accumulate);
        } else {
            int c0 = FS_LIN_VEC_F64(xp, W, yp, R, in, out, lo, hi, accumulate);
            if (c0 < hi) fs_lin_tail_f64(xp, W, yp, R, in, out, c0, hi, accumulate);
        }
        r0 += R;
    }
}

/* The packed float kernels' columns [lo, hi): the path's variant. */
void fs_linear_part_f32(const float *x, const float *W, float *y, int n, int in, int out,
                        int lo, int hi, int accumulate)
{
    fs_disp->linf_f32(x, W, y, n, in, out, lo, hi, accumulate);
}
void fs_linear_part_f32h(const float *x, const uint16_t *W, float *y, int n, int in, int out,
                         int lo, int hi, int accumulate)
{
    fs_disp->linf_f32h(x, W, y, n, in, out, lo, hi, accumulate);
}
void fs_linear_part_f32b(const float *x, const uint16_t *W, float *y, int n, int in, int out,
                         int lo, int hi, int accumulate)
{
    fs_disp->linf_f32b(x, W, y, n, in, out, lo, hi, accumulate);
}

#if !defined(__GNUC__)
/* A build without GCC vectors: the baseline "variants" are scalar loops in k order. */
#define FS_WT float
#define FS_SFX f32_def
#define FS_WIDEN(w) (w)
#include "fs_linear_scalar.inc"
#define FS_WT uint16_t
#define FS_SFX f32h_def
#define FS_WIDEN(w) fs_h2f(w)
#include "fs_linear_scalar.inc"
#define FS_WT uint16_t
#define FS_SFX f32b_def
#define FS_WIDEN(w) fs_bf2f(w)
#include "fs_linear_scalar.inc"
#endif

#define FS_T double
#define FS_WT double
#define FS_SFX f64
#include "fs_linear_api.inc"

#define FS_T float
#define FS_WT float
#define FS_SFX f32
#include "fs_linear_api.inc"

#define FS_T float
#define FS_WT uint16_t
#define FS_SFX f32h
#include "fs_linear_api.inc"

#define FS_T float
#define FS_WT uint16_t
#define FS_SFX f32b
#include "fs_linear_api.inc"

#if FS_AMX_BUILD
typedef void (*fs_tiles_fn)(const uint16_t *xa, int kp, const uint16_t *P, float *y, int n,
                            int out, int t_lo, int t_hi, int accumulate);

typedef struct {
    fs_tiles_fn part;
    const uint16_t *xa, *P;
    float *y;
    int kp, n, out, nt, accumulate, units, nchunks;
} fs_tiles_job;

static void fs_tiles_chunk(void *arg, int c)
{
    const fs_tiles_job *j = (const fs_tiles_job *)arg;
    int lo, hi;
    fs_lin_chunk_range(c, j->nchunks, j->units, &lo, &hi);
    lo *= FS_AMX_G;
    hi = hi * FS_AMX_G < j->nt ? hi * FS_AMX_G : j->nt;
    if (lo < hi) j->part(j->xa, j->kp, j->P, j->y, j->n, j->out, lo, hi, j->accumulate);
}

/* The job of y (n, out) [+]= xa @ W in the tile layout (no bias) for fs_pool_run_jobs: the
 * column tiles cut into chunks of whole groups of FS_AMX_G tiles (on AMX each thread
 * configures its own tiles); the part is fs_amx_part on AMX tiles, fs_bf16dp_part with
 * AVX512-BF16, by the path. */
static fs_pool_job fs_tiles_plan(fs_tiles_job *j, const uint16_t *xa, const uint16_t *P,
                                 float *y, int n, int in, int out, int accumulate)
{
    j->part = fs_disp->path == FS_ISA_AMX ? fs_amx_part : fs_bf16dp_part;
    j->xa = xa, j->P = P, j->y = y, j->kp = fs_amx_kp(in), j->n = n, j->out = out;
    j->nt = (out + 15) / 16, j->accumulate = accumulate;
    j->units = (j->nt + FS_AMX_G - 1) / FS_AMX_G;
    j->nchunks = out > 0 ? fs_lin_chunks(in, out, n, 16 * FS_AMX_G,
                                         FS_LIN_CHUNK_PANELS * FS_LIN_CHUNK_ALIGN)
                         : 0;
    return (fs_pool_job){fs_tiles_chunk, j, j->nchunks};
}
#endif

void fs_linear_f32b_round_many(int count, const float *x, const uint16_t *const *W,
                               const float *const *bias, float *const *y, int n, int in,
                               const int *out, int accumulate, float *xr)
{
    if (count < 1 || count > FS_POOL_JOBS_MAX || n <= 0) return;
#if FS_AMX_BUILD
    if (fs_linear_bf16_amx()) {  /* W in the tile layout; xr holds the rows as bf16 bits */
        uint16_t *xa = (uint16_t *)(void *)xr;
        if (x)
            fs_amx_round_rows(x, n, in, fs_amx_kp(in), xa);
        fs_tiles_job j[FS_POOL_JOBS_MAX];
        fs_pool_job run[FS_POOL_JOBS_MAX] = {{0}};
        for (int i = 0; i < count; i++)
            run[i] = fs_tiles_plan(&j[i], xa, W[i], y[i], n, in, out[i], accumulate);
        fs_pool_run_jobs(run, count);
        for (int i = 0; i < count; i++)
            if (bias != NULL && bias[i] != NULL)
                for (int r = 0; r < n; r++)
                    for (int c = 0; c < out[i]; c++)
                        y[i][(size_t)r * out[i] + c] += bias[i][c];
        return;
    }
#endif
    if (x)
        fs_round_bf16(x, xr, (size_t)n * in);
    fs_linear_many_f32b(count, xr, W, bias, y, n, in, out, accumulate);
}

void fs_linear_f32b_round(const float *x, const uint16_t *W, const float *bias, float *y,
                                 int n, int in, int out, int accumulate, float *xr)
{
    fs_linear_f32b_round_many(1, x, &W, &bias, &y, n, in, &out, accumulate, xr);
}
