/* Checks the packed float products (fs_linear_f32.inc) against a scalar reference, bit for
 * bit: in every variant this CPU runs, for float32, float16 and bfloat16 weights, every
 * output equals ONE chain in k order from +0 (or from y when accumulating) -- fmaf for the
 * AVX2 and AVX-512 variants (so they agree with each other), a rounded product then a rounded
 * sum for the baseline build -- over row counts 1..17 and 23, `in` across the k blocks (1 ..
 * 577), `out` around the panel width (5 .. 200), and column ranges split at panel
 * boundaries (the thread chunks). A row's result therefore does not depend on the block it
 * is in. Also: fs_packed_len and the packed layout (panel c0 / FS_LIN_PW at P + c0 * in,
 * k after k; the last panel 16 or 32 wide, zero-padded). Built and run by tests/test_linear_block.py; exit status =
 * failures. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fs_linear.h"
#include "fs_variants.h"

typedef void (*part_f32)(const float *, const float *, float *, int, int, int, int, int, int);
typedef void (*part_h)(const float *, const uint16_t *, float *, int, int, int, int, int, int);

static float ref_mul_add(float s, float a, float b)
{
    volatile float p = a * b;  /* rounded product, then a rounded sum */
    return s + p;
}

/* y = chain over k of x[r, k] * Wf[k, c], from y (acc) or +0 */
static void reference(const float *x, const float *Wf, float *y, int n, int in, int out,
                      int acc, int fused)
{
    for (int r = 0; r < n; r++)
        for (int c = 0; c < out; c++) {
            float s = acc ? y[(size_t)r * out + c] : 0.0f;
            for (int k = 0; k < in; k++) {
                float a = x[(size_t)r * in + k], b = Wf[(size_t)k * out + c];
                s = fused ? fmaf(a, b, s) : ref_mul_add(s, a, b);
            }
            y[(size_t)r * out + c] = s;
        }
}

static int check_layout(void)
{
    int fails = 0, in = 5;
    const int outs[] = {53, 48, 80, 100, 7};
    for (int oi = 0; oi < 5; oi++) {
        int out = outs[oi], padded = (out + 15) / 16 * 16;
        if (fs_packed_len(in, out) != (size_t)in * padded) {
            printf("fs_packed_len(%d, %d) = %zu\n", in, out, fs_packed_len(in, out));
            fails++;
        }
        float *W = malloc(sizeof(float) * in * out), *P = malloc(sizeof(float) * in * padded);
        for (int i = 0; i < in * out; i++) W[i] = (float)(i + 1);
        fs_pack_f32(W, in, out, P);
        for (int c = 0; c < padded; c++)
            for (int k = 0; k < in; k++) {
                int c0 = c / FS_LIN_PW * FS_LIN_PW;
                int width = padded - c0 >= FS_LIN_PW ? FS_LIN_PW : padded - c0;
                float got = P[(size_t)c0 * in + (size_t)k * width + (c - c0)];
                float want = c < out ? W[k * out + c] : 0.0f;
                if (got != want && fails < 5) {
                    printf("out=%d: packed (%d, %d) = %g, expected %g\n", out, k, c, got, want);
                    fails++;
                }
            }
        free(W);
        free(P);
    }
    return fails;
}

int main(void)
{
    const char *names[3] = {"baseline", "avx2", "avx512"};
    part_f32 F[3] = {fs_linf_part_f32_def, 0, 0};
    part_h H[3] = {fs_linf_part_f32h_def, 0, 0};
    part_h B[3] = {fs_linf_part_f32b_def, 0, 0};
    int have[3] = {1, 0, 0}, fails = check_layout(), checked = 0;
#if FS_LINF_SIMD
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && __builtin_cpu_supports("f16c")) {
        F[1] = fs_linf_part_f32_avx2; H[1] = fs_linf_part_f32h_avx2;
        B[1] = fs_linf_part_f32b_avx2; have[1] = 1;
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c")) {
        F[2] = fs_linf_part_f32_avx512; H[2] = fs_linf_part_f32h_avx512;
        B[2] = fs_linf_part_f32b_avx512; have[2] = 1;
    }
#endif
    const int ins[] = {1, 3, 70, 129, 300, 577}, outs[] = {5, 47, 48, 49, 100, 200, 80, 130};
    const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 23};
    for (int ii = 0; ii < 6; ii++)
        for (int oo = 0; oo < 8; oo++)
            for (int ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++)
                for (int wt = 0; wt < 3; wt++)
                    for (int acc = 0; acc < 2; acc++) {
                        int in = ins[ii], out = outs[oo], n = ns[ni];
                        /* smaller sweep for the big in: every n, but one width */
                        if (in >= 300 && oo != 5 && oo != 1) continue;
                        size_t len = fs_packed_len(in, out);
                        float *x = malloc(sizeof(float) * n * in);
                        float *y0 = malloc(sizeof(float) * n * out);
                        float *ref = malloc(sizeof(float) * n * out);
                        float *y = malloc(sizeof(float) * n * out);
                        float *Wf = malloc(sizeof(float) * in * out);
                        uint16_t *Wh = malloc(sizeof(uint16_t) * in * out);
                        float *Pf = malloc(sizeof(float) * len);
                        uint16_t *Ph = malloc(sizeof(uint16_t) * len);
                        srand(7919 * ii + 97 * oo + 13 * n + wt);
                        for (int i = 0; i < n * in; i++) {
                            x[i] = rand() / (float)RAND_MAX - 0.5f;
                            if (wt == 2) fs_round_bf16(x + i, x + i, 1);
                            if (i % 11 == 3) x[i] = -0.0f;
                        }
                        for (int i = 0; i < in * out; i++) {
                            float w = (rand() / (float)RAND_MAX - 0.5f) * 4.0f;
                            if (i % 13 == 5) w = 0.0f;
                            if (wt == 1) {  /* any binary16 below 4, subnormals too */
                                uint16_t h = (uint16_t)(rand() & 0xffff);
                                if (((h >> 10) & 31) > 16)
                                    h = (uint16_t)((h & 0x83ff) | (14 << 10));
                                Wh[i] = h; Wf[i] = fs_h2f(h);
                            }
                            else if (wt == 2) { Wh[i] = (uint16_t)(fs_f2bf_bits(w) >> 16);
                                                Wf[i] = fs_bf2f(Wh[i]); }
                            else Wf[i] = w;
                        }
                        if (wt == 0) fs_pack_f32(Wf, in, out, Pf);
                        else fs_pack_f32h(Wh, in, out, Ph);
                        for (int i = 0; i < n * out; i++)
                            y0[i] = acc ? (rand() / (float)RAND_MAX - 0.5f) : NAN;
                        for (int v = 0; v < 3; v++) {
                            if (!have[v]) continue;
                            memcpy(ref, y0, sizeof(float) * n * out);
                            reference(x, Wf, ref, n, in, out, acc, v > 0);
                            /* whole, then split at panel boundaries (thread chunks) */
                            for (int split = 0; split < 2; split++) {
                                memcpy(y, y0, sizeof(float) * n * out);
                                int mid = split ? (out / 2) / FS_LIN_PW * FS_LIN_PW : 0;
                                if (split && mid == 0) continue;
                                if (wt == 0) {
                                    if (mid) F[v](x, Pf, y, n, in, out, 0, mid, acc);
                                    F[v](x, Pf, y, n, in, out, mid, out, acc);
                                } else {
                                    part_h fn = wt == 1 ? H[v] : B[v];
                                    if (mid) fn(x, Ph, y, n, in, out, 0, mid, acc);
                                    fn(x, Ph, y, n, in, out, mid, out, acc);
                                }
                                checked++;
                                if (memcmp(y, ref, sizeof(float) * n * out)) {
                                    int i = 0;
                                    while (!(memcmp(y + i, ref + i, sizeof(float)) != 0)) i++;
                                    printf("%s %s: in=%d out=%d n=%d acc=%d split=%d: y[%d, %d] "
                                           "= %a, chain %a\n", names[v],
                                           wt == 0 ? "f32" : wt == 1 ? "f16" : "bf16", in, out,
                                           n, acc, split, i / out, i % out, y[i], ref[i]);
                                    fails++;
                                }
                            }
                        }
                        free(x); free(y0); free(ref); free(y); free(Wf); free(Wh); free(Pf);
                        free(Ph);
                    }
    printf("variants:%s%s%s, %d products checked, %d failures\n", " baseline",
           have[1] ? " avx2" : "", have[2] ? " avx512" : "", checked, fails);
    return fails;
}
