/* blk.c -- issue 30 prototype: AVX2 block products (f32 / bf16 weights, 1..16 rows), k-blocked
 * packed layout, bit-identity vs a scalar fmaf reference, and a spin-then-futex thread pool.
 *
 * gcc -O3 -march=x86-64-v2 -fno-math-errno -fno-trapping-math -fopenmp blk.c -o blk -lpthread
 * ./blk peak | check | bench | pool | cur
 *
 * Layout (f32): panels of PC = 24 columns (3 ymm), panel p = W[k][24p .. 24p+23] for k in 0..in-1,
 * contiguous (in * 24 floats). bf16: same panels but k taken in pairs: for k pair q, 24 dwords,
 * dword c = W[2q][c] | W[2q+1][c] << 16: one 256-bit load widens to 8 columns of two k steps with
 * one shift (k even) and one AND (k odd) -- no shuffle port.
 *
 * Tile: 4 rows x 3 ymm = 12 accumulators + 1 weight + 1 broadcast (+ the AND mask); per k step
 * 3 weight loads (bf16: 1.5 loads + 1.5 shift/AND), 4 broadcasts, 12 FMAs. 1 row: 1 x 12 (4 panels
 * at once), 2 rows: 2 x 6 (2 panels). 4r rows: for each panel group, for each k block of KB, r
 * passes of 4 rows: W streams from memory once per panel; the passes 2..r re-read the k block from
 * L1/L2. Every output is one fma chain over k = 0..in-1 from 0, whatever the tile: bit-identical.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <linux/futex.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline))
#define PC 24
#ifndef PF
#define PF 1
#endif
#ifndef MINT
#define MINT 0
#endif
#ifndef KB
#define KB 256 /* k block (even) */
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------- packing ---------------- */
static size_t plen(int in, int out) { return (size_t)((in + 1) & ~1) * ((out + PC - 1) / PC * PC); }
static void pack_f32(const float *W, int in, int out, float *P)
{
    int np = (out + PC - 1) / PC;
    for (int p = 0; p < np; p++)
        for (int k = 0; k < in; k++)
            for (int c = 0; c < PC; c++) {
                int col = p * PC + c;
                P[((size_t)p * in + k) * PC + c] = col < out ? W[(size_t)k * out + col] : 0.f;
            }
}
static void pack_bf16(const uint16_t *W, int in, int out, uint32_t *P)
{
    int np = (out + PC - 1) / PC, kq = (in + 1) / 2;
    for (int p = 0; p < np; p++)
        for (int q = 0; q < kq; q++)
            for (int c = 0; c < PC; c++) {
                int col = p * PC + c;
                uint32_t lo = col < out ? W[(size_t)(2 * q) * out + col] : 0;
                uint32_t hi = col < out && 2 * q + 1 < in ? W[(size_t)(2 * q + 1) * out + col] : 0;
                P[((size_t)p * kq + q) * PC + c] = lo | hi << 16;
            }
}

/* ---------------- tiles ---------------- */
/* R rows x NV ymm (NV/3 consecutive panels), k in [k0, k1), accumulators from y (k0 > 0) or 0. */
AI T2 void tile_f32(const float *x, int in, const float *P, float *y, int out, int c0, const int R,
                    const int NV, int k0, int k1, int pf, int pg, int kb)
{
    __m256 acc[4][12];
    const float *pp[4];
    for (int g = 0; g < NV / 3; g++) pp[g] = P + (size_t)(c0 / PC + g) * in * PC;
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++)
            acc[r][j] = k0 ? _mm256_loadu_ps(y + (size_t)r * out + c0 + 8 * j) : _mm256_setzero_ps();
    for (int k = k0; k < k1; k++) {
        if (PF && pf && (k - k0) % pf == pg) { /* pass pg of pf: its share of the next k block */
            __builtin_prefetch(pp[0] + (size_t)(k + kb) * PC, 0, 3);
            __builtin_prefetch(pp[0] + (size_t)(k + kb) * PC + 16, 0, 3);
        }
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) {
            __m256 w = _mm256_loadu_ps(pp[j / 3] + (size_t)k * PC + 8 * (j % 3));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++)
                acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * in + k), w, acc[r][j]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) _mm256_storeu_ps(y + (size_t)r * out + c0 + 8 * j, acc[r][j]);
}
/* bf16: k even and k1 even or == in (odd in: the last pair's high half is a zero weight, skipped). */
AI T2 void tile_bf16(const float *x, int in, const uint32_t *P, float *y, int out, int c0,
                     const int R, const int NV, int k0, int k1, int pf, int pg, int kb)
{
    __m256 acc[4][12];
    const uint32_t *pp[4];
    const int kq = (in + 1) / 2;
    const __m256i mask = _mm256_set1_epi32((int)0xffff0000u);
    for (int g = 0; g < NV / 3; g++) pp[g] = P + (size_t)(c0 / PC + g) * kq * PC;
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++)
            acc[r][j] = k0 ? _mm256_loadu_ps(y + (size_t)r * out + c0 + 8 * j) : _mm256_setzero_ps();
    int k = k0;
    for (; k + 2 <= k1; k += 2) {
        if (PF && pf && ((k - k0) / 2) % pf == pg) {
            __builtin_prefetch(pp[0] + (size_t)(k / 2 + kb / 2) * PC, 0, 3);
            __builtin_prefetch(pp[0] + (size_t)(k / 2 + kb / 2) * PC + 16, 0, 3);
        }
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(pp[j / 3] + (size_t)(k / 2) * PC + 8 * (j % 3)));
            __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++)
                acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * in + k), w0, acc[r][j]);
            __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++)
                acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * in + k + 1), w1, acc[r][j]);
        }
    }
    if (k < k1) /* odd in: last k */
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(pp[j / 3] + (size_t)(k / 2) * PC + 8 * (j % 3)));
            __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++)
                acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * in + k), w0, acc[r][j]);
        }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) _mm256_storeu_ps(y + (size_t)r * out + c0 + 8 * j, acc[r][j]);
}

/* Columns [lo, hi) in panels (lo, hi multiples of PC, hi may be padded), n rows. y has ldy = outp
 * (padded to PC) columns: the prototype writes whole panels. */
#define DEF_PART(NAME, TILE, WT)                                                                   \
    T2 void NAME(const float *x, const WT *P, float *y, int n, int in, int outp, int lo, int hi) \
    {                                                                                              \
        int c = lo;                                                                                \
        if (n == 1) {                                                                              \
            for (; c + 4 * PC <= hi; c += 4 * PC) TILE(x, in, P, y, outp, c, 1, 12, 0, in, 0, 0, 0);        \
            for (; c < hi; c += PC) TILE(x, in, P, y, outp, c, 1, 3, 0, in, 0, 0, 0);                       \
            return;                                                                                \
        }                                                                                          \
        if (n == 2) {                                                                              \
            for (; c + 2 * PC <= hi; c += 2 * PC) TILE(x, in, P, y, outp, c, 2, 6, 0, in, 0, 0, 0);         \
            for (; c < hi; c += PC) TILE(x, in, P, y, outp, c, 2, 3, 0, in, 0, 0, 0);                       \
            return;                                                                                \
        }                                                                                          \
        int nb = (in + KB - 1) / KB, kb = ((in + nb - 1) / nb + 1) & ~1, npass = (n + 3) / 4;       \
        for (; c < hi; c += PC)                                                                    \
            for (int k0 = 0; k0 < in; k0 += kb) {                                                  \
                int k1 = k0 + kb < in ? k0 + kb : in;                                              \
                int r = 0;                                                                         \
                for (; r + 4 <= n; r += 4)                                                         \
                    TILE(x + (size_t)r * in, in, P, y + (size_t)r * outp, outp, c, 4, 3, k0, k1, npass, r / 4, kb);  \
                switch (n - r) {                                                                   \
                case 3: TILE(x + (size_t)r * in, in, P, y + (size_t)r * outp, outp, c, 3, 3, k0, k1, npass, r / 4, kb); break; \
                case 2: TILE(x + (size_t)r * in, in, P, y + (size_t)r * outp, outp, c, 2, 3, k0, k1, npass, r / 4, kb); break; \
                case 1: TILE(x + (size_t)r * in, in, P, y + (size_t)r * outp, outp, c, 1, 3, k0, k1, npass, r / 4, kb); break; \
                }                                                                                  \
            }                                                                                      \
    }
DEF_PART(part_f32, tile_f32, float)
DEF_PART(part_bf16, tile_bf16, uint32_t)

/* scalar reference: one fma chain per output, k order */
T2 void ref(const float *x, const float *Wf, float *y, int n, int in, int out, int outp)
{
    for (int r = 0; r < n; r++)
        for (int c = 0; c < out; c++) {
            float a = 0.f;
            for (int k = 0; k < in; k++) a = fmaf(x[(size_t)r * in + k], Wf[(size_t)k * out + c], a);
            y[(size_t)r * outp + c] = a;
        }
}

/* ---------------- thread pool: spin then futex ---------------- */
typedef void (*job_fn)(void *arg, int chunk);
static struct {
    int nth;
    _Atomic unsigned gen;        /* job generation; futex word */
    _Atomic int next, done;      /* chunk claim counter, chunks finished */
    int nchunks;
    job_fn fn;
    void *arg;
    double spin_s;
    pthread_t tid[16];
} pool;

static void futex_wait(_Atomic unsigned *a, unsigned v) { syscall(SYS_futex, a, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0); }
static void futex_wake(_Atomic unsigned *a) { syscall(SYS_futex, a, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0); }

static void run_chunks(void)
{
    int c;
    while ((c = atomic_fetch_add(&pool.next, 1)) < pool.nchunks) {
        pool.fn(pool.arg, c);
        atomic_fetch_add(&pool.done, 1);
    }
}
static void *worker(void *unused)
{
    (void)unused;
    unsigned seen = 0;
    for (;;) {
        double t0 = now();
        unsigned g;
        int it = 0;
        while ((g = atomic_load(&pool.gen)) == seen) {
            _mm_pause();
            if ((++it & 63) == 0 && now() - t0 > pool.spin_s) {
                futex_wait(&pool.gen, seen);
                t0 = now();
            }
        }
        seen = g;
        run_chunks();
    }
    return NULL;
}
static void pool_init(int nth, double spin_s)
{
    pool.nth = nth;
    pool.spin_s = spin_s;
    for (int i = 1; i < nth; i++) pthread_create(&pool.tid[i], NULL, worker, NULL);
}
/* Dynamic chunks: a worker that is not running (busy neighbour) simply claims nothing; the
 * caller does the rest. Column chunks -> bits independent of who computes what. */
static void pool_run(job_fn fn, void *arg, int nchunks)
{
    if (pool.nth <= 1) {
        for (int c = 0; c < nchunks; c++) fn(arg, c);
        return;
    }
    pool.fn = fn;
    pool.arg = arg;
    pool.nchunks = nchunks;
    atomic_store(&pool.done, 0);
    atomic_store(&pool.next, 0);
    atomic_fetch_add(&pool.gen, 1);
    futex_wake(&pool.gen); /* a real pool keeps a "sleepers" count to skip this syscall */
    run_chunks();
    while (atomic_load(&pool.done) < nchunks) _mm_pause();
}

/* ---------------- benchmark plumbing ---------------- */
typedef struct { const float *x; const void *P; float *y; int n, in, outp, cw; int bf; } lin_t;
static void lin_chunk(void *a, int ch)
{
    lin_t *l = a;
    int lo = ch * l->cw, hi = lo + l->cw < l->outp ? lo + l->cw : l->outp;
    if (l->bf) part_bf16(l->x, l->P, l->y, l->n, l->in, l->outp, lo, hi);
    else part_f32(l->x, l->P, l->y, l->n, l->in, l->outp, lo, hi);
}
static void lin(int mode, const float *x, const void *P, float *y, int n, int in, int outp, int bf, int nchunks)
{
    /* mode 0: pool; 1: OpenMP static split (like today's fs_linear) */
    int np = outp / PC;
    if (nchunks > np) nchunks = np;
    int per = (np + nchunks - 1) / nchunks;
    nchunks = (np + per - 1) / per;
    lin_t l = {x, P, y, n, in, outp, per * PC, bf};
    if (mode == 0) pool_run(lin_chunk, &l, nchunks);
    else {
        int nt = pool.nth;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int c = 0; c < nchunks; c++) lin_chunk(&l, c);
    }
}

static float bfr(float f) /* round to bf16 (RNE), as a float */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
static float frand(void) { return (float)rand() / RAND_MAX * 2.f - 1.f; }

typedef struct { int in, out; const char *name; } shape_t;
static const shape_t shapes[] = {{576, 576, "576x576"}, {576, 192, "576x192"}, {576, 1536, "576x1536"},
                                 {1536, 576, "1536x576"}, {576, 49152, "576x49152"}};

T2 double peak_n(long N, int reps, int quiet)
{
    __m256 a[12], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    double best = 1e9, t;
    for (int rep = 0; rep < reps; rep++) {
    t = now();
    for (long it = 0; it < N; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
        __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]), "+x"(a[5]));
        __asm__ volatile("" : "+x"(a[6]), "+x"(a[7]), "+x"(a[8]), "+x"(a[9]), "+x"(a[10]), "+x"(a[11]));
    }
    t = now() - t;
    if (t < best) best = t;
    }
    t = best;
    float s = 0;
    for (int i = 0; i < 12; i++) s += a[i][0];
    double g = N * 12.0 * 8 / t / 1e9;
    if (!quiet) printf("peak: %.1f G mul-adds/s (ymm FMA, 12 chains) [%g]\n", g, s);
    return g;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "check";
    int nth = argc > 2 ? atoi(argv[2]) : 1;
    double spin_us = argc > 3 ? atof(argv[3]) : 30;
    pool_init(nth, spin_us * 1e-6);
    if (!strcmp(cmd, "peak")) { peak_n(2000000, 40, 0); return 0; }
    int maxin = 1536, maxout = 49152, maxoutp = (maxout + PC - 1) / PC * PC;
    float *x = malloc(sizeof(float) * 16 * maxin), *Wf = malloc(sizeof(float) * (size_t)maxin * maxout);
    uint16_t *Wb = malloc(2 * (size_t)maxin * maxout);
    float *P = aligned_alloc(64, sizeof(float) * plen(maxin, maxoutp) + 64);
    uint32_t *Pb = aligned_alloc(64, sizeof(uint32_t) * plen(maxin, maxoutp) / 2 + 64);
    float *y = malloc(sizeof(float) * 16 * maxoutp), *yr = malloc(sizeof(float) * 16 * maxoutp);
    for (int i = 0; i < 16 * maxin; i++) x[i] = bfr(frand());
    if (!strcmp(cmd, "check")) {
        int bad = 0;
        for (int s = 0; s < 5; s++) {
            int in = shapes[s].in, out = shapes[s].out, outp = (out + PC - 1) / PC * PC;
            if (out > 2000) { in = 577; out = 1000; outp = 1008; } /* odd in, ragged out */
            for (size_t i = 0; i < (size_t)in * out; i++) {
                float f = bfr(frand());
                uint32_t u;
                memcpy(&u, &f, 4);
                Wb[i] = u >> 16;
                Wf[i] = f;
            }
            pack_f32(Wf, in, out, P);
            pack_bf16(Wb, in, out, Pb);
            ref(x, Wf, yr, 16, in, out, outp);
            for (int n = 1; n <= 16; n++)
                for (int bf = 0; bf < 2; bf++) {
                    memset(y, 0xff, sizeof(float) * 16 * outp);
                    lin(0, x, bf ? (void *)Pb : (void *)P, y, n, in, outp, bf, 7);
                    for (int r = 0; r < n; r++)
                        if (memcmp(y + (size_t)r * outp, yr + (size_t)r * outp, 4 * out)) {
                            bad++;
                            printf("MISMATCH %dx%d n=%d bf=%d row %d\n", in, out, n, bf, r);
                            break;
                        }
                }
        }
        printf("check (n = 1..16, f32 + bf16, %d threads, vs scalar fmaf chain): %s\n", nth, bad ? "FAIL" : "bit-identical");
        return bad != 0;
    }
    for (size_t i = 0; i < (size_t)maxin * maxout; i++) { Wf[i] = bfr(frand()); Wb[i] = 0x3f80; }
    if (!strcmp(cmd, "bench")) {
        double pk = argc > 4 ? atof(argv[4]) : 0;
        int reps = 15;
        for (int s = 0; s < 5; s++) {
            int in = shapes[s].in, out = shapes[s].out, outp = (out + PC - 1) / PC * PC;
            pack_f32(Wf, in, out, P);
            for (size_t i = 0; i < plen(in, outp) / 2; i++) Pb[i] = 0x3f803f80u ^ (i & 0x00ff00ffu);
            for (int bf = 0; bf < 2; bf++) {
                double t1 = 0;
                pk = peak_n(200000, 20, 1);
                printf("%-10s %s pk%4.1f:", shapes[s].name, bf ? "bf16" : "f32 ", pk);
                int Rs[] = {1, 2, 4, 8, 16};
                for (int ri = 0; ri < 5; ri++) {
                    int n = Rs[ri];
                    double ts[64];
                    int nr = reps * (s == 4 ? 1 : 8);
                    for (int i = 0; i < nr && i < 64; i++) {
                        double t = now();
                        lin(0, x, bf ? (void *)Pb : (void *)P, y, n, in, outp, bf, 64);
                        ts[i] = now() - t;
                    }
                    if (nr > 64) nr = 64;
                    qsort(ts, nr, sizeof(double), cmpd);
                    double t = MINT ? ts[0] : ts[nr / 2];
                    if (n == 1) t1 = t;
                    double g = (double)n * in * out / t / 1e9;
                    printf("  R%-2d %6.1f G (%3.0f%%) %4.1fx", n, g, pk ? 100 * g / pk : 0, t / t1);
                }
                printf("\n");
            }
        }
        return 0;
    }
    if (!strcmp(cmd, "pool")) {
        /* args: nth spin_us mode(0 pool,1 omp) bf  */
        int mode = argc > 4 ? atoi(argv[4]) : 0, bf = argc > 5 ? atoi(argv[5]) : 1, n = argc > 6 ? atoi(argv[6]) : 1;
        /* one decode step of SmolLM2-135M: 30 layers x (q,k,v,o,gate,up,down) + head; each weight its own buffer */
        for (size_t i = 0; i < plen(576, maxoutp) / 2; i++) Pb[i] = 0x3f803f80u ^ (i & 0x00ff00ffu);
        int L = 30;
        int lay[7][2] = {{576, 576}, {576, 192}, {576, 192}, {576, 576}, {576, 1536}, {576, 1536}, {1536, 576}};
        size_t tot = 0;
        for (int j = 0; j < 7; j++) tot += plen(lay[j][0], lay[j][1]);
        float *big = aligned_alloc(64, sizeof(float) * (tot * L + 64));
        for (size_t i = 0; i < tot * L; i++) big[i] = 0.001f * (i & 1023);
        double ts[41], th[41];
        for (int it = 0; it < 41; it++) {
            double t = now();
            size_t off = 0;
            for (int l = 0; l < L; l++)
                for (int j = 0; j < 7; j++) {
                    int in = lay[j][0], outp = (lay[j][1] + PC - 1) / PC * PC;
                    lin(mode, x, big + off, y, n, in, outp, bf, 16);
                    off += bf ? plen(in, outp) / 2 : plen(in, outp);
                }
            ts[it] = now() - t;
            t = now();
            lin(mode, x, bf ? (void *)Pb : (void *)P, y, n, 576, maxoutp, bf, 64);
            th[it] = now() - t;
        }
        qsort(ts, 41, sizeof(double), cmpd);
        qsort(th, 41, sizeof(double), cmpd);
        printf("%s nth=%d spin=%gus bf=%d rows=%d: layers(210 products) %.0f us  head %.0f us\n",
               mode ? "omp " : "pool", nth, spin_us, bf, n, ts[20] * 1e6, th[20] * 1e6);
        return 0;
    }
    return 0;
}
