/* Checks fs_linear.h's bfloat16 kernels: in every variant this CPU runs (baseline, AVX2,
 * AVX-512F), fs_linear_f32b on bf16 weights and bf16-valued inputs == fs_linear_f32 on the
 * widened weights and the same inputs, bit for bit, and both agree with a double-precision
 * product (which catches a packing error common to both), over row counts 1..16 and 23,
 * widths with and without column remainders, with and without accumulation. Also:
 * fs_f2bf_bits (round to nearest even) on known values and against a wide-integer reference
 * on a sweep of bit patterns; fs_linear_set_path picks the variant the public entry point runs
 * and refuses one the CPU (or the build) lacks. With -DFS_TEST_PORTABLE the header is
 * compiled as by a compiler without GNU C (scalar kernels only). Built and run by
 * tests/test_model_bf16.py; exit status = failures. */
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
typedef void (*part_b)(const float *, const uint16_t *, float *, int, int, int, int, int, int);

static float from_bits(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

/* Round-to-nearest-even of the top 16 bits, written the long way (reference). */
static uint32_t ref_round(uint32_t u)
{
    uint32_t exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0xff && man) return (u | 0x400000u) & 0xffff0000u;  /* NaN, quieted */
    uint64_t hi = u >> 16, lo = u & 0xffff;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi++;
    return (uint32_t)(hi << 16);
}

static int check_rounding(void)
{
    int fails = 0;
    struct { uint32_t in, out; } known[] = {
        {0x3f800000u, 0x3f800000u},   /* 1.0 exact */
        {0x3f808000u, 0x3f800000u},   /* tie, even below: down */
        {0x3f818000u, 0x3f820000u},   /* tie, odd below: up */
        {0x3f808001u, 0x3f810000u},   /* above the tie: up */
        {0x7f7fffffu, 0x7f800000u},   /* FLT_MAX: past the largest bf16 -> inf */
        {0x7f800000u, 0x7f800000u},   /* inf */
        {0xff800000u, 0xff800000u},   /* -inf */
        {0x7f800001u, 0x7fc00000u},   /* signalling NaN with a low payload: stays NaN */
        {0xffc12345u, 0xffc10000u},   /* negative quiet NaN */
        {0x80000000u, 0x80000000u},   /* -0 */
        {0x00008000u, 0x00000000u},   /* subnormal tie, even: down */
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint32_t got = fs_f2bf_bits(from_bits(known[i].in));
        if (got != known[i].out) {
            printf("fs_f2bf_bits(0x%08x) = 0x%08x, expected 0x%08x\n", known[i].in, got,
                   known[i].out);
            fails++;
        }
    }
    for (uint64_t u = 0; u < 0x100000000ull; u += 0x10001ull * 7 + 3) {
        uint32_t got = fs_f2bf_bits(from_bits((uint32_t)u)), want = ref_round((uint32_t)u);
        if (got != want) {
            printf("fs_f2bf_bits(0x%08x) = 0x%08x, expected 0x%08x\n", (uint32_t)u, got, want);
            fails++;
            break;
        }
    }
    return fails;
}

int main(void)
{
#ifdef FS_TEST_PORTABLE
    part_f32 F[3] = {fs_linear_part_f32, 0, 0};
    part_b B[3] = {fs_linear_part_f32b, 0, 0};
#else
    part_f32 F[3] = {fs_linf_part_f32_def, 0, 0};
    part_b B[3] = {fs_linf_part_f32b_def, 0, 0};
#endif
    const char *names[3] = {"baseline", "avx2", "avx512"};
    int variants = 1, fails = check_rounding();
#if !defined(FS_TEST_PORTABLE) && FS_LINF_SIMD
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        F[variants] = fs_linf_part_f32_avx2; B[variants] = fs_linf_part_f32b_avx2;
        names[variants++] = "avx2";
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c")) {
        F[variants] = fs_linf_part_f32_avx512; B[variants] = fs_linf_part_f32b_avx512;
        names[variants++] = "avx512";
    }
#endif
    const int ins[] = {3, 70, 256}, outs[] = {5, 16, 20, 48, 83, 260};
    for (int v = 0; v < variants; v++)
        for (int ii = 0; ii < 3; ii++)
            for (int oo = 0; oo < 6; oo++)
                for (int n = 1; n <= 23; n += n < 16 ? 1 : 7)
                    for (int acc = 0; acc < 2; acc++) {
                        int in = ins[ii], out = outs[oo];
                        float *x = malloc(sizeof(float) * n * in);
                        float *xr = malloc(sizeof(float) * n * in);
                        float *y1 = malloc(sizeof(float) * n * out);
                        float *y2 = malloc(sizeof(float) * n * out);
                        float *y3 = malloc(sizeof(float) * n * out);
                        float *Wf = malloc(sizeof(float) * in * out);
                        uint16_t *Wb = malloc(sizeof(uint16_t) * in * out);
                        float *Pf = malloc(sizeof(float) * fs_packed_len(in, out));
                        uint16_t *Pb = malloc(sizeof(uint16_t) * fs_packed_len(in, out));
                        double *ref = malloc(sizeof(double) * n * out);
                        srand(1000 * v + 100 * ii + 10 * oo + n);
                        for (int i = 0; i < n * in; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
                        fs_round_bf16(x, xr, (size_t)n * in);
                        for (int i = 0; i < in * out; i++) {
                            /* |w| < 32: exponent field below 127 + 5 */
                            uint16_t b = (uint16_t)(rand() & 0xffff);
                            if (((b >> 7) & 0xff) >= 132) b = (uint16_t)((b & 0x807f) | (120 << 7));
                            Wb[i] = b;
                            Wf[i] = fs_bf2f(b);
                        }
                        fs_pack_f32(Wf, in, out, Pf);
                        fs_pack_f32h(Wb, in, out, Pb);
                        for (int i = 0; i < n * out; i++) y1[i] = y2[i] = y3[i] = 0.01f * i;
                        for (int r = 0; r < n; r++)
                            for (int c = 0; c < out; c++) {
                                double s = acc ? y1[r * out + c] : 0.0;
                                for (int k = 0; k < in; k++)
                                    s += (double)xr[r * in + k] * Wf[k * out + c];
                                ref[r * out + c] = s;
                            }
                        F[v](xr, Pf, y1, n, in, out, 0, out, acc);
                        B[v](xr, Pb, y2, n, in, out, 0, out, acc);
                        if (memcmp(y1, y2, sizeof(float) * n * out)) {
                            printf("%s: in=%d out=%d n=%d accumulate=%d differ\n", names[v], in,
                                   out, n, acc);
                            fails++;
                        }
#ifndef FS_TEST_PORTABLE
                        /* the public entry point, forced onto this variant, rounds x itself */
                        int path = v == 0 ? FS_ISA_PORTABLE : v == 1 ? FS_ISA_AVX2 : FS_ISA_AVX512;
                        if (!strcmp(names[v], "avx512")) path = FS_ISA_AVX512;
                        if (fs_linear_set_path(path) != 0 || fs_linear_get_path() != path) {
                            printf("%s: fs_linear_set_path refused\n", names[v]);
                            fails++;
                        }
                        fs_linear_f32b_round(x, Pb, NULL, y3, n, in, out, acc, x);
                        fs_linear_set_path(-1);
                        if (memcmp(y1, y3, sizeof(float) * n * out)) {
                            printf("%s: in=%d out=%d n=%d: fs_linear_f32b_round differs\n",
                                   names[v], in, out, n);
                            fails++;
                        }
#endif
                        for (int i = 0; i < n * out; i++) {
                            double scale = 1.0 + 16.0 * in;  /* |x| < 0.5, |w| < 32 */
                            if (fabs(y1[i] - ref[i]) > 1e-5 * scale) {
                                printf("%s: in=%d out=%d n=%d accumulate=%d: y[%d] = %g, "
                                       "expected %g\n", names[v], in, out, n, acc, i, y1[i], ref[i]);
                                fails++;
                                break;
                            }
                        }
                        free(x); free(xr); free(y1); free(y2); free(y3); free(Wf); free(Wb);
                        free(Pf); free(Pb); free(ref);
                    }
#ifndef FS_TEST_PORTABLE
    if (fs_linear_set_path(7) != -1) {
        printf("fs_linear_set_path accepted a path that does not exist\n");
        fails++;
    }
    {
        fs_isa_features f;
        fs_isa_detect(&f);
        int bf16dp = fs_linear_bf16dp_built() && fs_isa_supported(&f, FS_ISA_AVX512BF16);
        if ((fs_linear_set_path(FS_ISA_AVX512BF16) == 0) != bf16dp) {
            printf("fs_linear_set_path(FS_ISA_AVX512BF16) disagrees with the CPU and build\n");
            fails++;
        }
    }
    if ((fs_linear_set_path(FS_ISA_AMX) == 0) != fs_linf_amx()) {
        printf("fs_linear_set_path(FS_ISA_AMX) disagrees with the CPU's AMX grant\n");
        fails++;
    }
    if (variants < 3 && fs_linear_set_path(FS_ISA_AVX512) != -1) {
        printf("fs_linear_set_path accepted AVX-512 on a CPU without it\n");
        fails++;
    }
    fs_linear_set_path(-1);
#endif
    printf("%d variants checked, %d failures\n", variants, fails);
    return fails;
}
