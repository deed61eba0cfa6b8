/* Checks the quantized products of fs_quant.h: every ISA variant the CPU runs (portable,
 * AVX2, AVX-VNNI, AVX512-VNNI, AMX-INT8), called directly on the same quantized activations,
 * gives the bits of a scalar reference computed from the GGUF blocks themselves (memcmp), for
 * q8_0, q4_0 and q4_1, awkward widths, rows 1..17 and 33, with and without accumulation; every
 * row alone equals the same row inside the block; fs_linear_q through each forced path (and 2
 * threads) equals the reference plus bias; pack/unpack round-trips the blocks; fs_quant_rows_f32
 * equals the blocks' dequantization; NaN/inf scales and bad shapes are refused. Built and run
 * by tests/test_quant_kernels.py; exit status = failures. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_isa.h"
#include "fs_quant.h"
#include "fs_quant_kern.h"

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}
static float rndf(void) { return (float)((rnd() >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* float -> f16 bits, for test data only (values well inside the normal range). */
static uint16_t f2h(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    if (f == 0.0f || e <= 0) return (uint16_t)sign;
    return (uint16_t)(sign | (uint32_t)e << 10 | ((u >> 13) & 0x3ffu));
}

static void random_blocks(int kind, int in, int out, uint8_t *B)
{
    int bb = fs_quant_block_bytes(kind), nb = in / 32;
    for (int i = 0; i < out * nb; i++) {
        uint8_t *blk = B + (size_t)i * bb;
        uint16_t d = i % 17 == 5 ? 0 : f2h(0.02f * (1.0f + rndf()));
        memcpy(blk, &d, 2);
        if (kind == FS_Q4_1) {
            uint16_t m = f2h(-0.1f * (1.0f + rndf()));
            memcpy(blk + 2, &m, 2);
        }
        for (int k = kind == FS_Q4_1 ? 4 : 2; k < bb; k++) blk[k] = (uint8_t)rnd();
    }
}

/* The statement of fs_quant.h on the GGUF blocks (not the packed layout). */
static void reference(int kind, const uint8_t *B, const fs_qact *a, int out, float *y,
                      int accumulate)
{
    int bb = fs_quant_block_bytes(kind), nb = a->nb;
    for (int r = 0; r < a->n; r++)
        for (int c = 0; c < out; c++) {
            float acc = accumulate ? y[(size_t)r * out + c] : 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = B + ((size_t)c * nb + b) * bb;
                const int8_t *q = a->q + (size_t)r * a->in + b * 32;
                uint16_t dh, mh = 0;
                memcpy(&dh, blk, 2);
                int32_t isum = 0;
                if (kind == FS_Q8_0) {
                    for (int i = 0; i < 32; i++) isum += (int8_t)blk[2 + i] * q[i];
                } else {
                    const uint8_t *nib = blk + (kind == FS_Q4_1 ? 4 : 2);
                    if (kind == FS_Q4_1) memcpy(&mh, blk + 2, 2);
                    for (int i = 0; i < 16; i++) {
                        int lo = nib[i] & 15, hi = nib[i] >> 4;
                        if (kind == FS_Q4_0) {
                            lo -= 8;
                            hi -= 8;
                        }
                        isum += lo * q[i] + hi * q[16 + i];
                    }
                }
                float da = a->d[(size_t)r * nb + b];
                acc = fmaf(fs_h2f(dh) * da, (float)isum, acc);
                if (kind == FS_Q4_1)
                    acc = fmaf(fs_h2f(mh), da * (float)a->s[(size_t)r * nb + b], acc);
            }
            y[(size_t)r * out + c] = acc;
        }
}

typedef struct {
    const char *name;
    fs_qpart_fn fn;
} variant;

/* fs_linear_q_many: matrices of the three kinds (two with a bias) in one call equal
 * fs_linear_q on each (the same bits on every path), through every path at 1 and 2 threads,
 * from poisoned scratch; then a call with x NULL (the activations the first call left) on two
 * of the kinds in another order, on the next path the CPU runs: its kernels may read copies
 * the first path's did not fill (the AMX tiles fill none). Returns the failures. */
static int check_many(int *checks)
{
    const int in = 576, nb = in / 32, kinds[3] = {FS_Q8_0, FS_Q4_1, FS_Q4_0};
    const int outs[3] = {33, 40, 9};
    int fails = 0;
    uint8_t *P[3];
    float *bias[3];
    for (int i = 0; i < 3; i++) {
        uint8_t *B = malloc((size_t)outs[i] * nb * fs_quant_block_bytes(kinds[i]));
        random_blocks(kinds[i], in, outs[i], B);
        P[i] = malloc(fs_quant_packed_bytes(kinds[i], in, outs[i]));
        fs_quant_pack(kinds[i], B, in, outs[i], P[i]);
        free(B);
        bias[i] = NULL;
        if (i != 1) {
            bias[i] = malloc(sizeof(float) * outs[i]);
            for (int c = 0; c < outs[i]; c++) bias[i][c] = rndf();
        }
    }
    const int rows[] = {1, 3, 16};
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
        int n = rows[ri];
        float *x = malloc(sizeof(float) * n * in);
        for (int i = 0; i < n * in; i++) x[i] = rndf();
        size_t sb = fs_quant_scratch_bytes(FS_Q8_0, n, in);
        void *scratch = malloc(sb), *scratch1 = malloc(sb);
        float *want[3], *got[3];
        for (int i = 0; i < 3; i++) {
            want[i] = malloc(sizeof(float) * n * outs[i]);
            got[i] = malloc(sizeof(float) * n * outs[i]);
        }
        for (int p = 0; p <= FS_ISA_AMX; p++) {
            if (fs_linear_set_path(p) != 0) continue;
            for (int th = 1; th <= 2; th++) {
                fs_linear_set_threads(th);
                for (int i = 0; i < 3; i++) {
                    memset(scratch1, 0x5a, sb);
                    fs_linear_q(kinds[i], x, P[i], bias[i], want[i], n, in, outs[i], 0,
                                scratch1);
                }
                /* all three, then q4_0 and q8_0 again from the activations left in scratch */
                const int order[2][3] = {{0, 1, 2}, {2, 0, -1}};
                for (int call = 0; call < 2; call++) {
                    int cnt = call ? 2 : 3, k[3], o[3];
                    const uint8_t *pp[3];
                    const float *bb[3];
                    float *yy[3];
                    for (int j = 0; j < cnt; j++) {
                        int i = order[call][j];
                        k[j] = kinds[i], o[j] = outs[i], pp[j] = P[i], bb[j] = bias[i];
                        yy[j] = got[i];
                        memset(got[i], 0x7f, sizeof(float) * n * outs[i]);
                    }
                    if (call == 0) memset(scratch, 0x5a, sb);
                    if (call == 1) /* the next path this CPU runs (cyclic) */
                        for (int q = 1; q <= FS_ISA_AMX + 1; q++)
                            if (fs_linear_set_path((p + q) % (FS_ISA_AMX + 1)) == 0) break;
                    fs_linear_q_many(cnt, k, call ? NULL : x, pp, bb, yy, n, in, o, 0, scratch);
                    for (int j = 0; j < cnt; j++) {
                        int i = order[call][j];
                        (*checks)++;
                        if (memcmp(got[i], want[i], sizeof(float) * n * outs[i]) != 0) {
                            printf("fs_linear_q_many path %d threads %d n %d call %d: matrix "
                                   "%d (kind %d) != fs_linear_q\n", p, th, n, call, i,
                                   kinds[i]);
                            fails++;
                        }
                    }
                }
                fs_linear_set_path(p);
            }
        }
        fs_linear_set_path(-1);
        fs_linear_set_threads(1);
        for (int i = 0; i < 3; i++) free(want[i]), free(got[i]);
        free(x); free(scratch); free(scratch1);
    }
    for (int i = 0; i < 3; i++) free(P[i]), free(bias[i]);
    return fails;
}

int main(void)
{
    int fails = 0, checks = 0;
    fs_isa_features f;
    fs_isa_detect(&f);
    /* room for every variant one CPU can run: portable, avx2, avx_vnni, the two avx512_vnni,
     * amx_int8 (an Intel Xeon with AMX runs all six) */
    variant vs[6];
    int nv = 0;
    vs[nv++] = (variant){"portable", fs_qpart_def};
#if FS_Q_SIMD
    if (f.avx2 && f.fma && f.f16c) vs[nv++] = (variant){"avx2", fs_qpart_avx2};
    if (f.avx_vnni) vs[nv++] = (variant){"avx_vnni", fs_qpart_avxvnni};
    if (f.avx512vnni) vs[nv++] = (variant){"avx512_vnni", fs_qpart_avx512vnni};
    if (f.avx512vnni) vs[nv++] = (variant){"avx512_vnni_x16", fs_qpart_avx512vnni16};
#endif
#if FS_Q_AMX
    if (f.amx_int8) vs[nv++] = (variant){"amx_int8", fs_qpart_amx};
#endif
    for (int i = 0; i < nv; i++) printf("variant %s\n", vs[i].name);

    /* the activation rule: the AVX2 quantizer gives the C statement's bytes (random blocks,
     * exact ties, zeros, tiny, huge, NaN and infinite values; rows of 7 blocks, a tail alone, of
     * 8, taken eight at a time, and of 11, whose last three are a tail) */
#if FS_Q_SIMD
    if (f.avx2 && f.fma && f.f16c)
        for (int in = 224; in <= 352; in += in == 256 ? 96 : 32) {
            const int nr = 64, nb = in / 32;
            float *x = malloc(sizeof(float) * nr * in);
            int8_t *q1 = malloc(nr * in), *q2 = malloc(nr * in);
            float *d1 = malloc(sizeof(float) * nr * nb), *d2 = malloc(sizeof(float) * nr * nb);
            int32_t *s1 = malloc(sizeof(int32_t) * nr * nb);
            int32_t *s2 = malloc(sizeof(int32_t) * nr * nb);
            for (int i = 0; i < nr * in; i++) {
                int r = i / in;
                float v = rndf() * (r % 5 == 0 ? 1e-3f : r % 5 == 1 ? 3e4f : 1.0f);
                if (r % 7 == 2) v = (float)((int)(rndf() * 254.0f)) * 0.5f;  /* halves: ties */
                if (r % 7 == 3) v = i % 32 == 0 ? 127.0f : v;
                x[i] = v;
            }
            for (int t = 0; t < nb; t += 5) { /* the first, the last (and the sixth of 11) */
                int b = t + 5 < nb ? t : nb - 1;
                x[5 * in + b * 32 + 3] = NAN;
                x[6 * in + b * 32 + 8] = INFINITY;
                x[7 * in + b * 32 + 6] = -INFINITY;
                for (int i = 0; i < 32; i++)
                    x[8 * in + b * 32 + i] = 0.0f, x[9 * in + b * 32 + i] = 1e-30f;
                x[10 * in + b * 32] = 3e38f;
            }
            fs_quant_rows_ref(x, nr, in, q1, d1, s1);
            fs_quant_rows_avx2(x, nr, in, q2, d2, s2);
            checks++;
            if (memcmp(q1, q2, (size_t)nr * in) || memcmp(d1, d2, sizeof(float) * nr * nb)
                || memcmp(s1, s2, sizeof(int32_t) * nr * nb)) {
                printf("fs_quant_rows_avx2 != fs_quant_rows_ref (in %d)\n", in);
                fails++;
            }
            free(x); free(q1); free(q2); free(d1); free(d2); free(s1); free(s2);
        }
#endif

    /* 4096 and 4128: as many blocks as the AMX tiles widen once for several tiles of rows
     * (FS_QA_PRE_NB) and one more; 16416: more blocks than AMX takes */
    const int ins[] = {32, 64, 96, 576, 1536, 4096, 4128, 16416};
    const int outs[] = {1, 7, 9, 33, 576};
    /* 70 and 85: more than FS_QA_PRE_TILES tiles of 16 rows, and a partial tile */
    const int rows[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 33, 70, 85};
    for (int kind = 0; kind < 3; kind++)
        for (size_t ii = 0; ii < sizeof ins / sizeof ins[0]; ii++)
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                int in = ins[ii], out = outs[oi], nb = in / 32;
                if (in == 1536 && out == 576 && kind != FS_Q4_1) continue;  /* time */
                if (in >= 4096 && out > 9) continue;
                int bb = fs_quant_block_bytes(kind);
                uint8_t *B = malloc((size_t)out * nb * bb), *B2 = malloc((size_t)out * nb * bb);
                uint8_t *P = malloc(fs_quant_packed_bytes(kind, in, out));
                random_blocks(kind, in, out, B);
                if (fs_quant_pack(kind, B, in, out, P) != 0) {
                    printf("pack failed kind %d in %d out %d\n", kind, in, out);
                    fails++;
                }
                fs_quant_unpack(kind, P, in, out, B2);
                if (memcmp(B, B2, (size_t)out * nb * bb) != 0) {
                    printf("unpack != blocks kind %d in %d out %d\n", kind, in, out);
                    fails++;
                }
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                    int n = rows[ri];
                    if (in * out > 100000 && n > 9 && n != 16) continue;
                    float *x = malloc(sizeof(float) * n * in), *bias = malloc(sizeof(float) * out);
                    for (int i = 0; i < n * in; i++) x[i] = rndf() * (i % 7 == 0 ? 4.0f : 1.0f);
                    if (n > 2) x[in + 3] = NAN;  /* row 1: NaN outputs, the others unharmed */
                    for (int i = 0; i < out; i++) bias[i] = rndf();
                    int8_t *q = malloc((size_t)n * in);
                    uint8_t *qu = malloc((size_t)n * in);
                    float *d = malloc(sizeof(float) * n * nb), *ds = malloc(sizeof(float) * n * nb);
                    int32_t *s = malloc(sizeof(int32_t) * n * nb);
                    fs_quant_rows(x, n, in, q, d, s);
                    for (int i = 0; i < n * in; i++) qu[i] = (uint8_t)(q[i] ^ 0x80);
                    for (int i = 0; i < n * nb; i++) ds[i] = d[i] * (float)s[i];
                    int8_t *qi = malloc((size_t)n * in);
                    uint8_t *qui = malloc((size_t)n * in);
                    float *dt = malloc(sizeof(float) * n * nb), *dst = malloc(sizeof(float) * n * nb);
                    int32_t *st = malloc(sizeof(int32_t) * n * nb);
                    fs_qact a = {q, qu, d, ds, s, n, in, nb, qi, qui, dt, dst, st};
                    fs_quant_interleave(&a, 1);
                    size_t ylen = (size_t)n * out;
                    float *y0 = malloc(sizeof(float) * ylen), *yr = malloc(sizeof(float) * ylen);
                    float *y = malloc(sizeof(float) * ylen), *yinit = malloc(sizeof(float) * ylen);
                    for (size_t i = 0; i < ylen; i++) yinit[i] = rndf();
                    for (int acc = 0; acc < 2; acc++) {
                        memcpy(yr, yinit, sizeof(float) * ylen);
                        reference(kind, B, &a, out, yr, acc);
                        int ng = (out + 7) / 8;
                        for (int v = 0; v < nv; v++) {
                            memcpy(y, yinit, sizeof(float) * ylen);
                            vs[v].fn(kind, &a, P, y, out, 0, ng, acc);
                            checks++;
                            if (memcmp(y, yr, sizeof(float) * ylen) != 0) {
                                printf("%s != reference: kind %d in %d out %d n %d acc %d\n",
                                       vs[v].name, kind, in, out, n, acc);
                                fails++;
                            }
                            /* each row alone; and a split of the panels in two parts */
                            for (int r = 0; r < n && n <= 17; r++) {
                                /* one row: the interleaved layout is the row's own; odd
                                 * rows prefetch as on an Intel CPU (pf_one), rows 2, 6, ...
                                 * of q8_0 run the VNNI tiles' stream loop (fs_qact.stream,
                                 * FS_Q_STREAM_MIN_BYTES): the same bits */
                                fs_qact a1 = {q + (size_t)r * in, qu + (size_t)r * in,
                                              d + (size_t)r * nb, ds + (size_t)r * nb,
                                              s + (size_t)r * nb, 1, in, nb,
                                              q + (size_t)r * in, qu + (size_t)r * in,
                                              d + (size_t)r * nb, ds + (size_t)r * nb,
                                              s + (size_t)r * nb, r % 2 ? FS_Q_PF_ONE_INTEL : 0,
                                              kind == FS_Q8_0 && r % 4 == 2};
                                float *y1 = malloc(sizeof(float) * out);
                                memcpy(y1, yinit + (size_t)r * out, sizeof(float) * out);
                                vs[v].fn(kind, &a1, P, y1, out, 0, ng / 2, acc);
                                vs[v].fn(kind, &a1, P, y1, out, ng / 2, ng, acc);
                                checks++;
                                if (memcmp(y1, yr + (size_t)r * out, sizeof(float) * out) != 0) {
                                    printf("%s row %d alone != in block: kind %d in %d out %d "
                                           "n %d\n", vs[v].name, r, kind, in, out, n);
                                    fails++;
                                }
                                free(y1);
                            }
                        }
                        /* the entry point through every path, with bias, 1 and 2 threads */
                        size_t sbytes = fs_quant_scratch_bytes(kind, n, in);
                        void *scratch = malloc(sbytes);
                        for (int p = 0; p <= FS_ISA_AMX; p++) {
                            if (fs_linear_set_path(p) != 0) continue;
                            for (int th = 1; th <= 2; th++) {
                                fs_linear_set_threads(th);
                                memcpy(y, yinit, sizeof(float) * ylen);
                                /* poisoned: each call fills what its path reads (a previous
                                 * path's activation copies would hide one it left out) */
                                memset(scratch, 0x5a, sbytes);
                                fs_linear_q(kind, x, P, bias, y, n, in, out, acc, scratch);
                                checks++;
                                for (int r = 0; r < n; r++)
                                    for (int c = 0; c < out; c++) {
                                        float want = yr[(size_t)r * out + c] + bias[c];
                                        float got = y[(size_t)r * out + c];
                                        if (memcmp(&want, &got, 4) != 0) {
                                            printf("fs_linear_q path %d (%s) threads %d: kind %d "
                                                   "in %d out %d n %d (%d,%d)\n", p,
                                                   fs_quant_kernel_name(kind, n, in), th, kind,
                                                   in, out, n, r, c);
                                            fails++;
                                            r = n;
                                            break;
                                        }
                                    }
                            }
                        }
                        /* the name says what ran: rows longer than the AMX tiles take run the
                         * avx512 path's x16 tiles (16 rows) */
                        if (f.amx_int8 && fs_linear_set_path(FS_ISA_AMX) == 0 && n >= 16) {
                            const char *nm = fs_quant_kernel_name(kind, n, in);
                            const char *want = nb <= FS_Q_AMX_MAX_NB ? "amx_int8"
                                               : f.avx512vnni    ? "avx512_vnni_x16"
                                                                 : NULL;
                            checks++;
                            if (want && strcmp(nm, want) != 0) {
                                printf("kernel name %s for kind %d in %d n %d\n", nm, kind, in,
                                       n);
                                fails++;
                            }
                        }
                        fs_linear_set_path(-1);
                        fs_linear_set_threads(1);
                        free(scratch);
                    }
                    /* the NaN row's outputs are NaN, the others finite */
                    if (n > 2) {
                        int ok = 1;
                        for (int c = 0; c < out; c++)
                            ok &= isnan(yr[out + c]) && !isnan(yr[c]) && !isnan(yr[2 * out + c]);
                        if (!ok) {
                            printf("NaN input row not confined: kind %d in %d out %d\n", kind,
                                   in, out);
                            fails++;
                        }
                    }
                    free(x); free(bias); free(q); free(qu); free(d); free(ds); free(s);
                    free(qi); free(qui); free(dt); free(dst); free(st);
                    free(y0); free(yr); free(y); free(yinit);
                }
                /* dequantized rows */
                int32_t cols[3] = {0, out - 1, out / 2};
                float *dst = malloc(sizeof(float) * 3 * in);
                fs_quant_rows_f32(kind, P, in, out, cols, 3, dst);
                for (int k = 0; k < 3; k++)
                    for (int b = 0; b < nb; b++) {
                        const uint8_t *blk = B + ((size_t)cols[k] * nb + b) * bb;
                        uint16_t dh, mh = 0;
                        memcpy(&dh, blk, 2);
                        if (kind == FS_Q4_1) memcpy(&mh, blk + 2, 2);
                        for (int i = 0; i < 32; i++) {
                            float want;
                            if (kind == FS_Q8_0) {
                                want = fs_h2f(dh) * (float)(int8_t)blk[2 + i];
                            } else {
                                uint8_t byte = blk[(kind == FS_Q4_1 ? 4 : 2) + i % 16];
                                int nib = i < 16 ? byte & 15 : byte >> 4;
                                want = kind == FS_Q4_0 ? fs_h2f(dh) * (float)(nib - 8)
                                                       : fs_h2f(dh) * (float)nib + fs_h2f(mh);
                            }
                            float got = dst[(size_t)k * in + b * 32 + i];
                            if (memcmp(&want, &got, 4) != 0) {
                                printf("rows_f32 kind %d col %d elem %d: %g != %g\n", kind,
                                       cols[k], b * 32 + i, got, want);
                                fails++;
                                b = nb;
                                break;
                            }
                        }
                    }
                free(dst);
                /* a NaN or infinite scale is refused */
                uint16_t inf = 0x7c00, nan = 0x7e01;
                memcpy(B + (size_t)(out * nb - 1) * bb, &inf, 2);
                if (fs_quant_pack(kind, B, in, out, P) != FS_Q_EBADSCALE) {
                    printf("inf scale accepted kind %d\n", kind);
                    fails++;
                }
                memcpy(B + (size_t)(out * nb - 1) * bb, &nan, 2);
                if (fs_quant_pack(kind, B, in, out, P) != FS_Q_EBADSCALE) {
                    printf("NaN scale accepted kind %d\n", kind);
                    fails++;
                }
                free(B); free(B2); free(P);
            }
    fails += check_many(&checks);
    if (fs_quant_pack(FS_Q8_0, NULL, 33, 1, NULL) != FS_Q_EARG || fs_quant_pack(7, NULL, 32, 1, NULL)
        != FS_Q_EARG) {
        printf("bad shapes accepted\n");
        fails++;
    }
    printf("%d checks\n%d failures\n", checks, fails);
    return fails;
}
