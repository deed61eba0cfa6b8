/* Checks the bf16 products in the tile layout on both paths that read it: AMX tiles
 * (fs_linear_amx.c, FS_ISA_AMX) and AVX512-BF16 dot products (fs_linear_bf16dp.c,
 * FS_ISA_AVX512BF16), through fs_linear.h's public entry point forced onto each: against a
 * double-precision product of the bf16-rounded inputs and the weights (which catches a
 * packing error), over row counts 1..16, 17, 23, 25 and 40 (passes of 16 rows on AMX; groups
 * of up to 12 rows, tiles of 4 and 2 column tiles with AVX512-BF16), widths with and without
 * remainders of 16 columns and of 32 inputs, with and without accumulation and bias, on one
 * and two threads; every row alone gives the bits it gets inside the block (the decode ==
 * verification guarantee); the rounded rows equal fs_f2bf_bits; a NaN or an infinity in one
 * input row stays in that row. On a CPU without a path (or, for AMX, without the Linux
 * tile-data grant) it checks that the path is refused. Built and run by
 * tests/test_model_bf16.py; exit status = failures. */
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

/* The checks on the path set now; returns the failures. */
static int check_path(void)
{
    int fails = 0;
#if FS_AMX_BUILD
    const int shapes[][2] = {{32, 16}, {33, 17}, {5, 3}, {64, 64}, {100, 70}, {77, 129},
                             {576, 192}, {40, 300}};
    const int rows[] = {1, 2, 3, 5, 7, 8, 12, 13, 16, 17, 23, 25, 40};
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
    return fails;
}

int main(void)
{
    int fails = 0;
    const int paths[] = {FS_ISA_AMX, FS_ISA_AVX512BF16};
    const char *names[] = {"amx", "avx512bf16"};
    fs_isa_features f;
    fs_isa_detect(&f);
    for (int i = 0; i < 2; i++) {
        int can = i == 0 ? fs_linf_amx()
                         : fs_linear_bf16dp_built() && fs_isa_supported(&f, FS_ISA_AVX512BF16);
        if (fs_linear_set_path(paths[i]) != 0) {
            if (can) {
                printf("%s: the CPU runs it but fs_linear_set_path refused\n", names[i]);
                fails++;
            } else {
                printf("%s: not here, path refused as it should be\n", names[i]);
            }
            continue;
        }
        if (!can) {
            printf("%s: path accepted on a CPU or build without it\n", names[i]);
            fails++;
            continue;
        }
        int n = check_path();
        printf("%s: %d failures\n", names[i], n);
        fails += n;
        fs_linear_set_path(-1);
    }
    printf("%d failures\n", fails);
    return fails;
}
