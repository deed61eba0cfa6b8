/* q8k.c -- issue 29 prototype: AVX2 (no VNNI) q8_0 x q8 and q4_1 x q8 products on column
 * groups of 8 interleaved output columns, R activation rows (1..16) per pass over the weights.
 *
 * Build: gcc -O2 -mavx2 -mfma -mf16c -ffp-contract=off -o q8k q8k.c -lm
 * Run:   taskset -c 1 ./q8k [hot|cold]
 *
 * Packed q8_0 panel (8 output columns c, nb = in/32 blocks b), one per column group g:
 *   d  : nb x 8 f16     d[b*8 + c]                      = scale of W[:, g*8+c] block b
 *   qs : nb x 256 int8  qs[((b*8 + j)*8 + c)*4 + t]       = W[b*32 + 4j + t][g*8 + c]
 * so ymm j of block b holds inputs 4j..4j+3 of the 8 columns (ik_llama Q8_0_R8 order).
 * Packed q4_1 panel: d, m : nb x 8 f16; qs : nb x 128 bytes,
 *   byte ((b*4 + j)*8 + c)*4 + t = q[b*32+4j+t] | q[b*32+16+4j+t] << 4   (q in 0..15)
 * Activation row: int8 a[in], float da[nb] (d = amax/127, q = rne(x * 127/amax)),
 *   int32 sa[nb] = sum of the block's a (for q4_1's min term).
 * Per (row, column), blocks in order b = 0..nb-1:
 *   q8_0: acc = fma(dw*da, (float)isum_b, acc)
 *   q4_1: acc = fma(dw*da, (float)isum_b, acc); acc = fma(mw, da*(float)sa_b, acc)
 * Each lane is one output column: no horizontal sums, so any row tile gives the same bits. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AI static inline __attribute__((always_inline))
#ifndef RT
#define RT 4 /* rows per register tile (16 ymm: RT int sums + RT float sums + 4) */
#endif
#ifndef PF
#define PF 4 /* prefetch this many blocks ahead (256 B of qs per block) */
#endif

static uint16_t f2h(float f) { return (uint16_t)_cvtss_sh(f, 0); }
static float h2f(uint16_t h) { return _cvtsh_ss(h); }

typedef struct { int in, nb; int8_t *a; float *da; int32_t *sa; } qrow_t;

static void quant_rows(const float *x, int R, int in, qrow_t *q) {
    q->in = in; q->nb = in / 32;
    for (int r = 0; r < R; r++)
        for (int b = 0; b < q->nb; b++) {
            const float *xb = x + (size_t)r * in + b * 32;
            float amax = 0; for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            float id = amax > 0 ? 127.f / amax : 0.f;
            int s = 0;
            for (int i = 0; i < 32; i++) {
                int v = (int)nearbyintf(xb[i] * id); /* round half to even, like cvtps2dq */
                q->a[(size_t)r * in + b * 32 + i] = (int8_t)v; s += v;
            }
            q->da[r * q->nb + b] = amax / 127.f; q->sa[r * q->nb + b] = s;
        }
}

/* ---------------- q8_0 ---------------- */
static void pack_q8(const int8_t *W, const uint16_t *dW, int in, int out, uint8_t *P) {
    int nb = in / 32; size_t psz = (size_t)nb * (16 + 256);
    for (int g = 0; g < out / 8; g++) {
        uint16_t *d = (uint16_t *)(P + g * psz); int8_t *qs = (int8_t *)(P + g * psz + nb * 16);
        for (int b = 0; b < nb; b++)
            for (int c = 0; c < 8; c++) {
                int col = g * 8 + c;
                d[b * 8 + c] = dW[(size_t)col * nb + b];
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < 4; t++)
                        qs[((b * 8 + j) * 8 + c) * 4 + t] = W[(size_t)col * in + b * 32 + 4 * j + t];
            }
    }
}

AI void tile_q8(const uint8_t *panel, int nb, const qrow_t *q, int r0, int rt, float *y, int out,
                int g) {
    const uint16_t *d = (const uint16_t *)panel;
    const __m256i *qs = (const __m256i *)(panel + nb * 16);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[RT];
    _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        _mm_prefetch((const char *)(qs + (b + PF) * 8), _MM_HINT_T0);
        _mm_prefetch((const char *)(qs + (b + PF) * 8) + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(qs + (b + PF) * 8) + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)(qs + (b + PF) * 8) + 192, _MM_HINT_T0);
        __m256i isum[RT];
        _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) isum[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            __m256i w = _mm256_loadu_si256(qs + b * 8 + j);
            __m256i aw = _mm256_sign_epi8(w, w); /* |w| (unsigned operand), once per tile */
            _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) {
                const int8_t *ar = q->a + (size_t)(r0 + r) * q->in + b * 32 + 4 * j;
                int32_t a4; memcpy(&a4, ar, 4);
                __m256i s = _mm256_sign_epi8(_mm256_set1_epi32(a4), w); /* a * sign(w) */
                isum[r] = _mm256_add_epi32(isum[r],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(aw, s), ones));
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * 8)));
        _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) {
            __m256 sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(q->da + (r0 + r) * nb + b));
            acc[r] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) _mm256_storeu_ps(y + (size_t)(r0 + r) * out + g * 8, acc[r]);
}

#define TC(FN, k) case k: FN((k) < RT ? (k) : RT); break;
#define TILE_CASES(FN)                                                                         \
    switch (rt) {                                                                              \
    TC(FN, 1) TC(FN, 2) TC(FN, 3) TC(FN, 4) TC(FN, 5) TC(FN, 6) TC(FN, 7)                      \
    default: FN(RT); break;                                                                    \
    }

static void __attribute__((noinline)) mm_q8(const uint8_t *P, const qrow_t *q, int R, int out,
                                            float *y) {
    int nb = q->nb; size_t psz = (size_t)nb * (16 + 256);
    for (int g = 0; g < out / 8; g++)
        for (int r0 = 0; r0 < R; r0 += RT) {
            int rt = R - r0 < RT ? R - r0 : RT;
#define F8(n) tile_q8(P + g * psz, nb, q, r0, n, y, out, g)
            if (rt == RT) F8(RT); else { TILE_CASES(F8) }
        }
}

static void ref_q8(const int8_t *W, const uint16_t *dW, const qrow_t *q, int R, int out,
                   float *y) {
    int in = q->in, nb = q->nb;
    for (int r = 0; r < R; r++)
        for (int col = 0; col < out; col++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int i = 0; i < 32; i++)
                    s += (int)W[(size_t)col * in + b * 32 + i] * q->a[(size_t)r * in + b * 32 + i];
                float sc = h2f(dW[(size_t)col * nb + b]) * q->da[r * nb + b];
                acc = fmaf(sc, (float)s, acc);
            }
            y[(size_t)r * out + col] = acc;
        }
}

/* ---------------- q4_1 ---------------- */
static void pack_q41(const uint8_t *Q, const uint16_t *dW, const uint16_t *mW, int in, int out,
                     uint8_t *P) {
    int nb = in / 32; size_t psz = (size_t)nb * (32 + 128);
    for (int g = 0; g < out / 8; g++) {
        uint16_t *d = (uint16_t *)(P + g * psz), *m = d + nb * 8;
        uint8_t *qs = P + g * psz + nb * 32;
        for (int b = 0; b < nb; b++)
            for (int c = 0; c < 8; c++) {
                int col = g * 8 + c;
                d[b * 8 + c] = dW[(size_t)col * nb + b]; m[b * 8 + c] = mW[(size_t)col * nb + b];
                const uint8_t *qc = Q + (size_t)col * in + b * 32;
                for (int j = 0; j < 4; j++)
                    for (int t = 0; t < 4; t++)
                        qs[((b * 4 + j) * 8 + c) * 4 + t] =
                            (uint8_t)(qc[4 * j + t] | qc[16 + 4 * j + t] << 4);
            }
    }
}

AI void tile_q41(const uint8_t *panel, int nb, const qrow_t *q, int r0, int rt, float *y,
                 int out, int g) {
    const uint16_t *d = (const uint16_t *)panel, *m = d + nb * 8;
    const __m256i *qs = (const __m256i *)(panel + nb * 32);
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    __m256 acc[RT];
    _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        _mm_prefetch((const char *)(qs + (b + PF) * 4), _MM_HINT_T0);
        _mm_prefetch((const char *)(qs + (b + PF) * 4) + 64, _MM_HINT_T0);
        __m256i s16[RT];
        _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) s16[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            __m256i bits = _mm256_loadu_si256(qs + b * 4 + j);
            __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) {
                const int8_t *ar = q->a + (size_t)(r0 + r) * q->in + b * 32;
                int32_t al, ah; memcpy(&al, ar + 4 * j, 4); memcpy(&ah, ar + 16 + 4 * j, 4);
                /* 8 maddubs of (0..15) x (-127..127) pairs: |sum| <= 8*3810 < 32768 in int16 */
                s16[r] = _mm256_add_epi16(s16[r], _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_set1_epi32(al)),
                    _mm256_maddubs_epi16(hi, _mm256_set1_epi32(ah))));
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * 8)));
        __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + b * 8)));
        _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) {
            float da = q->da[(r0 + r) * nb + b];
            __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(da));
            __m256i isum = _mm256_madd_epi16(s16[r], ones);
            acc[r] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum), acc[r]);
            acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(da * (float)q->sa[(r0 + r) * nb + b]), acc[r]);
        }
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < rt; r++) _mm256_storeu_ps(y + (size_t)(r0 + r) * out + g * 8, acc[r]);
}

static void __attribute__((noinline)) mm_q41(const uint8_t *P, const qrow_t *q, int R, int out,
                                             float *y) {
    int nb = q->nb; size_t psz = (size_t)nb * (32 + 128);
    for (int g = 0; g < out / 8; g++)
        for (int r0 = 0; r0 < R; r0 += RT) {
            int rt = R - r0 < RT ? R - r0 : RT;
#define F4(n) tile_q41(P + g * psz, nb, q, r0, n, y, out, g)
            if (rt == RT) F4(RT); else { TILE_CASES(F4) }
        }
}

static void ref_q41(const uint8_t *Q, const uint16_t *dW, const uint16_t *mW, const qrow_t *q,
                    int R, int out, float *y) {
    int in = q->in, nb = q->nb;
    for (int r = 0; r < R; r++)
        for (int col = 0; col < out; col++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int i = 0; i < 32; i++)
                    s += (int)Q[(size_t)col * in + b * 32 + i] * q->a[(size_t)r * in + b * 32 + i];
                float da = q->da[r * nb + b];
                acc = fmaf(h2f(dW[(size_t)col * nb + b]) * da, (float)s, acc);
                acc = fmaf(h2f(mW[(size_t)col * nb + b]), da * (float)q->sa[r * nb + b], acc);
            }
            y[(size_t)r * out + col] = acc;
        }
}

/* ---------------- driver ---------------- */
static double now(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y);
}
static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float rndf(void) { return (rnd() >> 8) * (1.f / 16777216.f) * 2.f - 1.f; }

int main(int argc, char **argv) {
    int cold = argc > 1 && !strcmp(argv[1], "cold");
    double ghz = 2.45;
    int shapes[3][2] = {{576, 1536}, {1536, 576}, {576, 49152}};
    int Rs[5] = {1, 2, 4, 8, 16};
    printf("RT=%d PF=%d mode=%s (MAC/cycle at %.2f GHz)\n", RT, PF, cold ? "cold" : "hot", ghz);
    for (int fmt = 0; fmt < 2; fmt++)
        for (int si = 0; si < 3; si++) {
            int in = shapes[si][0], out = shapes[si][1], nb = in / 32;
            int8_t *W = malloc((size_t)in * out); uint8_t *Q = malloc((size_t)in * out);
            uint16_t *dW = malloc((size_t)out * nb * 2), *mW = malloc((size_t)out * nb * 2);
            for (size_t i = 0; i < (size_t)in * out; i++) { W[i] = (int8_t)(rnd() % 255 - 127); Q[i] = rnd() & 15; }
            for (size_t i = 0; i < (size_t)out * nb; i++) { dW[i] = f2h(0.01f * (1 + rndf())); mW[i] = f2h(-0.08f * (1 + rndf())); }
            size_t psz = (size_t)(out / 8) * nb * (fmt ? 160 : 272);
            /* cold: a ring of copies, > 1 GiB, so the weights stream from DRAM (L3 is large) */
            int ncopy = cold ? (int)((1100ull << 20) / psz) + 1 : 1;
            uint8_t *P = aligned_alloc(64, psz * ncopy + 4096);
            if (fmt) pack_q41(Q, dW, mW, in, out, P); else pack_q8(W, dW, in, out, P);
            for (int c = 1; c < ncopy; c++) memcpy(P + c * psz, P, psz);
            float *x = malloc(sizeof(float) * 16 * in);
            for (int i = 0; i < 16 * in; i++) x[i] = rndf() * (i % 7 == 0 ? 4.f : 1.f);
            qrow_t q = {in, nb, malloc(16 * in), malloc(16 * nb * 4), malloc(16 * nb * 4)};
            quant_rows(x, 16, in, &q);
            float *y = malloc(sizeof(float) * 16 * out), *yr = malloc(sizeof(float) * 16 * out);
            float *y1 = malloc(sizeof(float) * 16 * out);
            /* correctness: 16 rows vs scalar reference; rows alone vs inside the block */
            if (!cold) {
                if (fmt) { ref_q41(Q, dW, mW, &q, 16, out, yr); mm_q41(P, &q, 16, out, y); }
                else { ref_q8(W, dW, &q, 16, out, yr); mm_q8(P, &q, 16, out, y); }
                int bad = memcmp(y, yr, sizeof(float) * 16 * out) != 0;
                for (int R = 1; R <= 16; R++) {
                    if (fmt) mm_q41(P, &q, R, out, y1); else mm_q8(P, &q, R, out, y1);
                    bad |= memcmp(y1, y, sizeof(float) * R * out) != 0;
                }
                printf("%s %5dx%-5d bit-identical vs scalar ref and for R=1..16: %s\n",
                       fmt ? "q4_1" : "q8_0", in, out, bad ? "FAIL" : "ok");
            }
            for (int ri = 0; ri < 5; ri++) {
                int R = Rs[ri];
                double macs = (double)in * out * R, t[7];
                int reps = cold ? ncopy : (int)(3e8 / macs) + 1;
                if (cold && reps < 8) reps = 8 * ncopy;
                for (int k = 0; k < 7; k++) {
                    double t0 = now();
                    for (int it = 0; it < reps; it++) {
                        const uint8_t *Pc = P + (size_t)(it % ncopy) * psz;
                        if (fmt) mm_q41(Pc, &q, R, out, y); else mm_q8(Pc, &q, R, out, y);
                    }
                    t[k] = (now() - t0) / reps;
                }
                qsort(t, 7, sizeof(double), cmpd);
                printf("%s %5dx%-5d R=%2d  %8.1f us  %6.2f MAC/cycle  %6.2f GB/s weights\n",
                       fmt ? "q4_1" : "q8_0", in, out, R, t[3] * 1e6, macs / t[3] / (ghz * 1e9),
                       psz / t[3] / 1e9);
            }
            free(W); free(Q); free(dW); free(mW); free(P); free(x); free(q.a); free(q.da);
            free(q.sa); free(y); free(yr); free(y1);
        }
    return 0;
}
