/* Checks the tiled float attention block (fs_attention_f32.inc) in every variant this CPU
 * runs (baseline, AVX2, AVX-512):
 *   - a query row's output is the same bits alone as in any block of 1 .. FS_F32_ROWS rows,
 *     at any position of the block, for head sizes 16 .. 256, key counts across the tiles
 *     (1 .. 300, rows of one block seeing different counts as in a causal block) and for tree
 *     nodes (keys reached through an ancestor list);
 *   - the block gives the same bits again when its scores read the variant's transposed keys
 *     (fs_f32_keys: all keys of a causal block, the context below a tree's nodes), as the
 *     drivers do for calls of many rows (the AVX-512 variant's; the dispatch table, checked
 *     last, gives the others no transposed keys);
 *   - a float16 cache (kh16, vh16) gives the bits of the same block on the cache widened to
 *     float32, alone and in blocks, causal counts and tree nodes;
 *   - every output is within 2e-6 (relative to the largest value row) of softmax attention
 *     computed in double.
 * With an argument, it also prints one FNV-1a hash of every output of each variant (a
 * change of the kernel that must keep its bits can be compared before and after).
 * Built and run by tests/test_attention_c.py; exit status = failures. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fs_isa.h"
#include "fs_variants.h"

typedef void (*block_fn)(const float *const *, float *const *, const int *, int, const float *,
                         const float *, int, float, int, const int32_t *, const float *, int,
                         const uint16_t *, const uint16_t *);
typedef void (*keys_fn)(const float *, int, int, float *);

static uint64_t rng_state = 88172645463325252ull;
static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* softmax(scale q.k_j) . v_j over the count keys row_of(j) in double */
static void reference(const float *q, const float *k, const float *v, int count, int D,
                      float scale, int base, const int32_t *anc, double *out)
{
    double *s = malloc(sizeof(double) * (size_t)count), top = -HUGE_VAL, sum = 0.0;
    for (int j = 0; j < count; j++) {
        size_t row = anc && j >= base ? (size_t)base + (size_t)anc[j - base] : (size_t)j;
        double d = 0.0;
        for (int c = 0; c < D; c++) d += (double)q[c] * k[row * D + c];
        s[j] = d * scale;
        top = s[j] > top ? s[j] : top;
    }
    for (int c = 0; c < D; c++) out[c] = 0.0;
    for (int j = 0; j < count; j++) {
        size_t row = anc && j >= base ? (size_t)base + (size_t)anc[j - base] : (size_t)j;
        double w = exp(s[j] - top);
        sum += w;
        for (int c = 0; c < D; c++) out[c] += w * v[row * D + c];
    }
    for (int c = 0; c < D; c++) out[c] /= sum;
    free(s);
}

static int check(const char *name, block_fn block, keys_fn keys, int print_hash)
{
    enum { CAP = 320, ROWS = FS_F32_ROWS, MAXD = FS_F32_MAXD };
    const int dims[] = {16, 32, 64, 128, 256}, counts[] = {1, 3, 16, 17, 127, 128, 129, 300};
    int fails = 0;
    uint64_t hash = 1469598103934665603ull;
    float *k = malloc(sizeof(float) * CAP * MAXD), *v = malloc(sizeof(float) * CAP * MAXD);
    float *q = malloc(sizeof(float) * ROWS * MAXD);
    float *alone = malloc(sizeof(float) * ROWS * MAXD);
    float *inblk = malloc(sizeof(float) * ROWS * MAXD);
    double *want = malloc(sizeof(double) * MAXD);
    float *viakt = malloc(sizeof(float) * ROWS * MAXD);
    float *f16out = malloc(sizeof(float) * ROWS * MAXD);
    float *kt = malloc(sizeof(float) * (CAP + FS_F32_PANEL) * MAXD);
    int32_t anc[CAP];
    uint16_t *k16 = malloc(sizeof(uint16_t) * CAP * MAXD);
    uint16_t *v16 = malloc(sizeof(uint16_t) * CAP * MAXD);
    float *kw = malloc(sizeof(float) * CAP * MAXD), *vw = malloc(sizeof(float) * CAP * MAXD);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int D = dims[di];
        float scale = (float)(1.0 / sqrt((double)D));
        for (int i = 0; i < CAP * D; i++) {
            k[i] = 2.0f * frand();
            v[i] = frand();
        }
        for (int i = 0; i < ROWS * D; i++) q[i] = 2.0f * frand();
        for (int i = 0; i < CAP * D; i++) { /* the float16 cache and its widened values */
            k16[i] = fs_f2h(k[i]);
            v16[i] = fs_f2h(v[i]);
            kw[i] = fs_h2f(k16[i]);
            vw[i] = fs_h2f(v16[i]);
        }
        for (int ci = 0; ci < 8; ci++)
            for (int tree = 0; tree < 2; tree++) {
                int last = counts[ci], base = 0;
                const int32_t *a = NULL;
                if (tree) { /* the last 9 rows of the cache are tree nodes: a path of 5 */
                    if (last < 10) continue;
                    base = last - 9;
                    const int32_t path[] = {0, 2, 3, 6, 8};
                    memcpy(anc, path, sizeof path);
                    last = base + 5;
                    a = anc;
                }
                for (int rows = 1; rows <= ROWS; rows++) {
                    const float *qr[ROWS];
                    float *orow[ROWS];
                    int count[ROWS];
                    for (int r = 0; r < rows; r++) { /* causal: row r sees one key more */
                        count[r] = tree ? last : last - rows + 1 + r;
                        if (count[r] < 1) count[r] = 1;
                        qr[r] = q + (size_t)r * D;
                        orow[r] = inblk + (size_t)r * D;
                    }
                    block(qr, orow, count, rows, k, v, D, scale, base, a, NULL, 0, NULL, NULL);
                    /* the drivers' transposed keys: a causal call's every key, a tree's
                     * context (poisoned past it: a tree must not read those panels) */
                    int kt_keys = tree ? base : last;
                    for (size_t i = 0; i < (size_t)(CAP + FS_F32_PANEL) * D; i++)
                        kt[i] = NAN;
                    keys(k, kt_keys, D, kt);
                    float *vrow[ROWS], *orow16[ROWS];
                    for (int r = 0; r < rows; r++) {
                        vrow[r] = viakt + (size_t)r * D;
                        orow16[r] = f16out + (size_t)r * D;
                    }
                    block(qr, vrow, count, rows, k, v, D, scale, base, a, kt, kt_keys, NULL, NULL);
                    if (memcmp(viakt, inblk, sizeof(float) * (size_t)rows * D) != 0) {
                        printf("%s: D %d count %d rows %d tree %d: transposed keys differ\n",
                               name, D, last, rows, tree);
                        fails++;
                    }
                    /* float16: the widened cache's bits, in the block and alone */
                    block(qr, vrow, count, rows, kw, vw, D, scale, base, a, NULL, 0, NULL,
                          NULL);
                    block(qr, orow16, count, rows, NULL, NULL, D, scale, base, a, NULL, 0, k16,
                          v16);
                    for (int r = 0; r < rows; r++) {
                        float *o1 = alone + (size_t)r * D;
                        block(&qr[r], &o1, &count[r], 1, NULL, NULL, D, scale, base, a, NULL, 0,
                              k16, v16);
                        if (memcmp(o1, vrow[r], sizeof(float) * D) != 0
                            || memcmp(orow16[r], vrow[r], sizeof(float) * D) != 0) {
                            printf("%s: D %d count %d rows %d tree %d: row %d float16 differs\n",
                                   name, D, count[r], rows, tree, r);
                            fails++;
                        }
                    }
                    for (int r = 0; r < rows; r++) {
                        float *o1 = alone + (size_t)r * D;
                        block(&qr[r], &o1, &count[r], 1, k, v, D, scale, base, a, NULL, 0, NULL,
                              NULL);
                        if (memcmp(o1, orow[r], sizeof(float) * D) != 0) {
                            printf("%s: D %d count %d rows %d tree %d: row %d differs alone\n",
                                   name, D, count[r], rows, tree, r);
                            fails++;
                        }
                        reference(qr[r], k, v, count[r], D, scale, base, a, want);
                        double most = 0.0, err = 0.0;
                        for (int c = 0; c < D; c++) {
                            double e = fabs((double)orow[r][c] - want[c]);
                            err = e > err ? e : err;
                        }
                        for (int j = 0; j < CAP * D; j++)
                            most = fabs((double)v[j]) > most ? fabs((double)v[j]) : most;
                        if (!(err <= 2e-6 * most)) {
                            printf("%s: D %d count %d rows %d tree %d: row %d off by %g\n", name,
                                   D, count[r], rows, tree, r, err);
                            fails++;
                        }
                    }
                    hash = fnv(hash, inblk, sizeof(float) * (size_t)rows * D);
                }
            }
    }
    if (print_hash) printf("%s hash %016llx\n", name, (unsigned long long)hash);
    free(k);
    free(v);
    free(q);
    free(alone);
    free(inblk);
    free(want);
    free(viakt);
    free(kt);
    free(k16);
    free(v16);
    free(kw);
    free(vw);
    free(f16out);
    return fails;
}

int main(int argc, char **argv)
{
    int fails = check("def", fs_f32_block_def, fs_f32_keys_def, argc > 1);
#if FS_ATTN_VARIANTS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v3")) {
        rng_state = 88172645463325252ull;
        fails += check("avx2", fs_f32_block_avx2, fs_f32_keys_avx2, argc > 1);
    } else {
        printf("avx2: not run (this CPU lacks x86-64-v3)\n");
    }
    if (__builtin_cpu_supports("x86-64-v4")) {
        rng_state = 88172645463325252ull;
        fails += check("avx512", fs_f32_block_avx512, fs_f32_keys_avx512, argc > 1);
    } else {
        printf("avx512: not run (this CPU lacks x86-64-v4)\n");
    }
    /* each path runs its own variant (fs_isa_select_attn): the AVX2 one on the avx2 path of
     * an AVX-512 CPU, the baseline on the portable path; only the AVX-512 one transposes keys */
    for (int p = FS_ISA_PORTABLE; p <= FS_ISA_AMX; p++) {
        if (fs_linear_set_path(p) != 0) continue;
        const fs_dispatch *t = fs_isa_table();
        int w = p >= FS_ISA_AVX512 && __builtin_cpu_supports("x86-64-v4") ? 16
                : p >= FS_ISA_AVX2 && __builtin_cpu_supports("x86-64-v3") ? 8 : 0;
        int got = t->attn_f32 == fs_f32_block_avx512 && t->attn_f32_keys == fs_f32_keys_avx512
                  ? 16 : t->attn_f32 == fs_f32_block_avx2 && !t->attn_f32_keys
                  ? 8 : t->attn_f32 == fs_f32_block_def && !t->attn_f32_keys
                  ? 0 : -1;
        printf("path %d: attention of %d lanes (0: baseline)\n", p, got);
        if (got != w) {
            printf("path %d runs the attention of %d lanes, not %d\n", p, got, w);
            fails++;
        }
    }
    fs_linear_set_path(-1);
#endif
    printf("%d failures\n", fails);
    return fails;
}
