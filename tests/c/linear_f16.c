/* Checks fs_linear.h's float kernels on packed weights: every variant this CPU runs (baseline,
 * AVX2+F16C, AVX-512F+F16C) gives fs_linear_f32h == fs_linear_f32 bit for bit on widened
 * float16 weights, and both agree with a double-precision product on the unpacked weights
 * (which catches a packing error common to both), over row counts 1..12 and 23, widths with and
 * without column remainders (half panels, partial vectors), with and without accumulation; fs_h2f matches the compiler's _Float16 conversion on all 65536 inputs (when the
 * compiler has _Float16). With -DFS_TEST_PORTABLE the header is compiled as by a compiler
 * without GNU C (scalar kernels only) and the public entry points are compared instead.
 * Built and run by tests/test_linear_f16_c.py; exit status = failures. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FS_TEST_PORTABLE
#undef __GNUC__ /* after the system headers, which need it */
#endif
#include "fs_isa.h"
#include "fs_linear.h"
#include "fs_variants.h"

typedef void (*part_f32)(const float *, const float *, float *, int, int, int, int, int, int);
typedef void (*part_f32h)(const float *, const uint16_t *, float *, int, int, int, int, int, int);

int main(void)
{
#ifdef FS_TEST_PORTABLE
    part_f32 F[3] = {fs_linear_part_f32, 0, 0};
    part_f32h H[3] = {fs_linear_part_f32h, 0, 0};
#else
    part_f32 F[3] = {fs_linf_part_f32_def, 0, 0};
    part_f32h H[3] = {fs_linf_part_f32h_def, 0, 0};
#endif
    const char *names[3] = {"baseline", "avx2", "avx512"};
    int variants = 1, fails = 0;
#if !defined(FS_TEST_PORTABLE) && FS_LINF_SIMD
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        F[variants] = fs_linf_part_f32_avx2; H[variants] = fs_linf_part_f32h_avx2;
        names[variants++] = "avx2";
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c")) {
        F[variants] = fs_linf_part_f32_avx512; H[variants] = fs_linf_part_f32h_avx512;
        names[variants++] = "avx512";
    }
#endif
    const int ins[] = {3, 70, 256}, outs[] = {5, 16, 20, 48, 83, 260, 704};
    for (int v = 0; v < variants; v++)
        for (int ii = 0; ii < 3; ii++)
            for (int oo = 0; oo < 7; oo++)
                for (int n = 1; n <= 23; n += n < 12 ? 1 : 11)
                    for (int acc = 0; acc < 2; acc++) {
                        int in = ins[ii], out = outs[oo];
                        float *x = malloc(sizeof(float) * n * in);
                        float *y1 = malloc(sizeof(float) * n * out);
                        float *y2 = malloc(sizeof(float) * n * out);
                        float *Wf = malloc(sizeof(float) * in * out);
                        uint16_t *Wh = malloc(sizeof(uint16_t) * in * out);
                        float *Pf = malloc(sizeof(float) * fs_packed_len(in, out));
                        uint16_t *Ph = malloc(sizeof(uint16_t) * fs_packed_len(in, out));
                        double *ref = malloc(sizeof(double) * n * out);
                        srand(1000 * v + 100 * ii + 10 * oo + n);
                        for (int i = 0; i < n * in; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
                        for (int i = 0; i < in * out; i++) {
                            Wh[i] = (uint16_t)(rand() & 0xffff);
                            if (((Wh[i] >> 10) & 31) >= 20) Wh[i] &= 0xbfff;  /* |w| < 32 */
                            Wf[i] = fs_h2f(Wh[i]);
                        }
                        fs_pack_f32(Wf, in, out, Pf);
                        fs_pack_f32h(Wh, in, out, Ph);
                        for (int i = 0; i < n * out; i++) y1[i] = y2[i] = 0.01f * i;
                        for (int r = 0; r < n; r++)
                            for (int c = 0; c < out; c++) {
                                double s = acc ? y1[r * out + c] : 0.0;
                                for (int k = 0; k < in; k++)
                                    s += (double)x[r * in + k] * Wf[k * out + c];
                                ref[r * out + c] = s;
                            }
                        F[v](x, Pf, y1, n, in, out, 0, out, acc);
                        H[v](x, Ph, y2, n, in, out, 0, out, acc);
                        if (memcmp(y1, y2, sizeof(float) * n * out)) {
                            printf("%s: in=%d out=%d n=%d accumulate=%d differ\n", names[v], in,
                                   out, n, acc);
                            fails++;
                        }
                        for (int i = 0; i < n * out; i++) {
                            double scale = 1.0;  /* |x| < 0.5, |w| < 32: sums of in products */
                            for (int k = 0; k < in; k++) scale += 16.0;
                            if (fabs(y1[i] - ref[i]) > 1e-5 * scale) {
                                printf("%s: in=%d out=%d n=%d accumulate=%d: y[%d] = %g, "
                                       "expected %g\n", names[v], in, out, n, acc, i, y1[i], ref[i]);
                                fails++;
                                break;
                            }
                        }
                        free(x); free(y1); free(y2); free(Wf); free(Wh); free(Pf); free(Ph);
                        free(ref);
                    }
#if defined(__FLT16_MAX__) && !defined(FS_TEST_PORTABLE)
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t bits = (uint16_t)h;
        _Float16 f;
        memcpy(&f, &bits, sizeof f);
        float a = (float)f, b = fs_h2f(bits);
        if (memcmp(&a, &b, sizeof a) && !(a != a && b != b)) {
            printf("fs_h2f(0x%04x) = %a, expected %a\n", h, b, a);
            fails++;
            break;
        }
    }
#endif
    printf("%d variants checked, %d failures\n", variants, fails);
    return fails;
}
