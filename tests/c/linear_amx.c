/* Checks fs_linear_amx.h's bf16 products on AMX tiles, through fs_linear.h's public entry point
 * forced onto FS_ISA_AMX: against a double-precision product of the bf16-rounded inputs and the
 * weights (which catches a packing error), over row counts 1..16, 17, 23 and 40 (passes of 16
 * rows), widths with and without remainders of 16 columns and of 32 inputs, with and without
 * accumulation and bias, on one and two threads; every row alone gives the bits it gets inside
 * the block (the decode == verification guarantee); the rounded rows equal fs_f2bf_bits; a
 * NaN or an infinity in one input row stays in that row. On a CPU without AMX (or without the
 * Linux tile-data grant) it checks that the path is refused and reports 0 failures. Built and
 * run by tests/test_model_bf16.py; exit status = failures. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fs_isa.h"
#include "fs_linear.h"
#include "fs_variants.h"

static uint32_t state = 12345;
static float uniform(void)
{
    state = state * 1664525u + 1013904223u;
    return (float)((state >> 8) / 16777216.0) * 2.0f - 1.0f;
}

int main(void)
{
    int fails = 0;
    if (fs_linear_set_path(FS_ISA_AMX) != 0) {
        if (fs_linf_amx()) {
            printf("AMX granted but fs_linear_set_path(FS_ISA_AMX) refused\n");
            fails++;
        }
        printf("no AMX here: path refused as it should be\n%d failures\n", fails);
        return fails;
    }
#if FS_AMX_BUILD
    const int shapes[][2] = {{32, 16}, {33, 17}, {5, 3}, {64, 64}, {100, 70}, {77, 129},
                             {576, 192}, {40, 300}};
    const int rows[] = {1, 2, 3, 5, 8, 13, 16, 17, 23, 40};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int in = shapes[s][0], out = shapes[s][1], kp = fs_amx_kp(in);
        uint16_t *W = malloc(sizeof(uint16_t) * in * out);
        uint16_t *P = malloc(sizeof(uint16_t) * fs_amx_packed_len(in, out));
        float *bias = malloc(sizeof(float) * out);
        for (int i = 0; i < in * out; i++) W[i] = (uint16_t)(fs_f2bf_bits(uniform()) >> 16);
        for (int c = 0; c < out; c++) bias[c] = uniform();
        fs_pack_bf16_amx(W, in, out, P);
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (int mode = 0; mode < 6; mode++) {
                int n = rows[ri], acc = mode & 1, with_bias = (mode >> 1) & 1;
                int threads = mode >= 4 ? 2 : 1;
                size_t xlen = (size_t)n * (in > 16 ? in : 16);
                float *x = malloc(sizeof(float) * n * in), *xr = malloc(sizeof(float) * xlen);
                float *y = malloc(sizeof(float) * n * out), *y0 = malloc(sizeof(float) * n * out);
                float *y1 = malloc(sizeof(float) * out);
                for (int i = 0; i < n * in; i++) x[i] = 3.0f * uniform();
                for (int i = 0; i < n * out; i++) y[i] = y0[i] = acc ? uniform() : 0.0f;
                fs_linear_set_threads(threads);
                fs_linear_f32b_round(x, P, with_bias ? bias : NULL, y, n, in, out, acc, xr);
                const uint16_t *xa = (const uint16_t *)(const void *)xr;
                for (int r = 0; r < n; r++)
                    for (int k = 0; k < kp; k++) {
                        uint16_t want = k < in ? (uint16_t)(fs_f2bf_bits(x[r * in + k]) >> 16) : 0;
                        if (xa[(size_t)r * kp + k] != want) {
                            printf("in=%d n=%d: rounded row %d differs at %d\n", in, n, r, k);
                            fails++;
                            r = n;
                            break;
                        }
                    }
                double worst = 0.0;
                for (int r = 0; r < n; r++)
                    for (int c = 0; c < out; c++) {
                        double sum = acc ? y0[r * out + c] : 0.0, mag = fabs(sum);
                        for (int k = 0; k < in; k++) {
                            uint32_t u = fs_f2bf_bits(x[r * in + k]);
                            float xb;
                            memcpy(&xb, &u, sizeof xb);
                            double t = (double)xb * fs_bf2f(W[(size_t)k * out + c]);
                            sum += t;
                            mag += fabs(t);
                        }
                        if (with_bias) {
                            sum += bias[c];
                            mag += fabs(bias[c]);
                        }
                        double e = fabs(sum - y[r * out + c]) / (mag + 1e-30);
                        if (!(e <= worst)) worst = e;
                    }
                if (!(worst < 1e-5)) {
                    printf("in=%d out=%d n=%d acc=%d bias=%d threads=%d: relative error %g\n",
                           in, out, n, acc, with_bias, threads, worst);
                    fails++;
                }
                /* each row alone: the same bits as inside the block */
                for (int r = 0; r < n; r += (n > 4 ? n / 4 : 1)) {
                    memcpy(y1, y0 + (size_t)r * out, sizeof(float) * out);
                    fs_linear_f32b_round(x + (size_t)r * in, P, with_bias ? bias : NULL, y1, 1, in,
                                         out, acc, xr);
                    if (memcmp(y1, y + (size_t)r * out, sizeof(float) * out)) {
                        printf("in=%d out=%d n=%d acc=%d: row %d alone differs from the block\n",
                               in, out, n, acc, r);
                        fails++;
                    }
                }
                free(x); free(xr); free(y); free(y0); free(y1);
            }
        free(W); free(P); free(bias);
    }
    fs_linear_set_threads(1);
    /* a NaN and an infinity stay in their own rows */
    {
        int in = 64, out = 32, n = 3;
        uint16_t W[64 * 32], P[64 * 32];
        float x[3 * 64], xr[3 * 64], y[3 * 32];
        for (int i = 0; i < in * out; i++) W[i] = (uint16_t)(fs_f2bf_bits(uniform()) >> 16);
        for (int i = 0; i < n * in; i++) x[i] = uniform();
        x[0 * in + 5] = NAN;
        x[2 * in + 9] = INFINITY;
        fs_pack_bf16_amx(W, in, out, P);
        fs_linear_f32b_round(x, P, NULL, y, n, in, out, 0, xr);
        for (int c = 0; c < out; c++)
            if (!isnan(y[c]) || !isfinite(y[out + c]) || isfinite(y[2 * out + c])) {
                printf("NaN / inf leaked between rows at column %d\n", c);
                fails++;
                break;
            }
    }
#endif
    fs_linear_set_path(-1);
    printf("%d failures\n", fails);
    return fails;
}
