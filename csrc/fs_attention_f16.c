/* fs_attention_f16.c -- attention over a float16 (IEEE binary16) K/V cache, float32 queries
 * (fs_attention.h: fs_attention_f32h, fs_attention_masked_f32h), and the float16 cache
 * writes' rounding (fs_f32_to_f16).
 *
 * Why a float16 cache: a decode step at long context reads the whole cache; binary16 halves
 * those bytes. Widening binary16 to float32 is exact, so every entry here gives the bits of
 * the float32 entry called on the widened cache:
 *
 *   head sizes of the tiled kernel (FS_F32_SUPPORTED): its drivers and blocks read the
 *     float16 rows themselves, each vector widened as it is loaded (fs_attention_f32.inc,
 *     fs_f32_loadh): no copy, no buffer, half the bytes;
 *   other head sizes (the double template): each kv head's valid rows are widened into a
 *     float32 buffer of the calling thread (capacity = length) and the float32 entry runs on
 *     it, one kv head at a time (the double template computes each kv head on its own, so
 *     the bits are the whole call's; the buffer is one head's, not the cache's).
 *
 * Memory (the second kind only): the buffer is the calling thread's, grown as needed and kept
 * for the thread's life, like fs_attention.c's transposed keys. The entries cannot fail: a
 * buffer the allocator refuses makes the call's outputs NaN, never a crash. */
#include "fs_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fs_common.h"
#include "fs_variants.h"

/* The calling thread's float buffer of at least `floats`, grown as needed; NULL when out of
 * memory (the old buffer is kept for the next call). Plain C11 (any compiler): this path
 * serves every build, the vector-less ones included. */
static float *fs_f16_buffer(size_t floats)
{
    static _Thread_local float *buf;
    static _Thread_local size_t cap;
    if (floats > cap) {
        float *p = malloc(floats * sizeof(float));
        if (!p)
            return NULL;
        free(buf);
        buf = p;
        cap = floats;
    }
    return buf;
}

/* 16 values at a time without branches (fs_f2h16, as the K-quant transcoder's scales), the
 * tail one by one: the bits of fs_f2h either way. */
void fs_f32_to_f16(const float *x, uint16_t *h, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16)
        fs_f2h16(x + i, h + i);
    for (; i < count; i++)
        h[i] = fs_f2h_fast(x[i]);
}

/* The double template's head sizes: per kv head, its rows [0, length) widened into kw, vw
 * and the float32 entry (mask NULL: fs_attention_f32, else the masked one) on its `group`
 * heads; the queries of n > 1 gathered into qg (their output into og) since a kv head's
 * heads are not contiguous across queries. */
static void fs_f16_widened(const float *q, const uint16_t *k, const uint16_t *v, float *out,
                           int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                           int length, int causal, const uint8_t *mask, int window,
                           double *scratch)
{
    int group = n_heads / n_kv_heads;
    size_t D = (size_t)head_dim, rows = (size_t)length * D;
    size_t per_q = (size_t)group * D, qsz = n > 1 ? (size_t)n * per_q : 0;
    float *kw = fs_f16_buffer(2 * rows + 2 * qsz);
    if (!kw) {
        for (size_t i = 0; i < (size_t)n * n_heads * D; i++)
            out[i] = NAN;
        return;
    }
    float *vw = kw + rows, *qg = vw + rows, *og = qg + qsz;
    for (int kv = 0; kv < n_kv_heads; kv++) {
        const uint16_t *kh = k + (size_t)kv * capacity * D, *vh = v + (size_t)kv * capacity * D;
        for (size_t i = 0; i < rows; i++) {
            kw[i] = fs_h2f(kh[i]);
            vw[i] = fs_h2f(vh[i]);
        }
        const float *qh = q + (size_t)kv * per_q;
        float *oh = out + (size_t)kv * per_q;
        if (n > 1) {
            for (int i = 0; i < n; i++)
                memcpy(qg + (size_t)i * per_q, qh + (size_t)i * n_heads * D,
                       per_q * sizeof(float));
            qh = qg;
            oh = og;
        }
        if (mask)
            fs_attention_masked_f32(qh, kw, vw, oh, n, group, 1, head_dim, length, length, mask,
                                    window, scratch);
        else
            fs_attention_f32(qh, kw, vw, oh, n, group, 1, head_dim, length, length, causal,
                             window, scratch);
        if (n > 1)
            for (int i = 0; i < n; i++)
                memcpy(out + ((size_t)i * n_heads + (size_t)kv * group) * D,
                       og + (size_t)i * per_q, per_q * sizeof(float));
    }
}

void fs_attention_f32h(const float *q, const uint16_t *k, const uint16_t *v, float *out, int n,
                       int n_heads, int n_kv_heads, int head_dim, int capacity, int length,
                       int causal, int window, double *scratch)
{
#if FS_HAVE_VEC
    if (FS_F32_SUPPORTED(head_dim)) {
        fs_attention_f32_tiled(q, NULL, NULL, k, v, out, n, n_heads, n_kv_heads, head_dim,
                               capacity, length, causal, window);
        return;
    }
#endif
    fs_f16_widened(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, causal,
                   NULL, window, scratch);
}

void fs_attention_masked_f32h(const float *q, const uint16_t *k, const uint16_t *v, float *out,
                              int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                              int length, const uint8_t *mask, int window, double *scratch)
{
#if FS_HAVE_VEC
    if (FS_F32_SUPPORTED(head_dim)) {  /* n ints of the caller's >= length doubles */
        fs_attention_f32_tree(q, NULL, NULL, k, v, out, n, n_heads, n_kv_heads, head_dim,
                              capacity, length, mask, window, (int32_t *)scratch);
        return;
    }
#endif
    fs_f16_widened(q, k, v, out, n, n_heads, n_kv_heads, head_dim, capacity, length, 0, mask,
                   window, scratch);
}
