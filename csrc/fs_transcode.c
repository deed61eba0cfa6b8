/* fs_transcode.c -- GGUF K-quant super-blocks and Q5_0 blocks into native Q4_1 / Q8_0 blocks
 * (fs_transcode.h), the work shared out by the core's pool. */
#include "fs_transcode.h"

#include <math.h>
#include <string.h>

#include "fs_common.h"
#include "fs_pool.h"

/* float -> binary16 bits, nearest (ties to even), as numpy's astype(float16): past the
 * largest f16 an infinity, below its subnormals a signed zero, a NaN keeps its sign and the
 * top of its payload (never becoming an infinity). */
static uint16_t fs_f2h(float f)
{
    uint32_t x, ax, sign, r, rem, half;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {  /* NaN */
        r = 0x7c00u | ((ax & 0x7fffffu) >> 13);
        return (uint16_t)(sign | (r == 0x7c00u ? 0x7c01u : r));
    }
    if (ax >= 0x477ff000u)  /* infinity, or at least halfway past 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {  /* normal: rebias the exponent, round the 13 dropped bits */
        r = (ax - 0x38000000u) >> 13;
        rem = ax & 0x1fffu;
        r += rem > 0x1000u || (rem == 0x1000u && (r & 1u));
        return (uint16_t)(sign | r);
    }
    if (ax <= 0x33000000u)  /* at most 2^-25, half the smallest subnormal: zero (ties even) */
        return (uint16_t)sign;
    {  /* subnormal: (ax's significand) * 2^(e - 150) in units of 2^-24 */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
        r = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        r += rem > half || (rem == half && (r & 1u));
        return (uint16_t)(sign | r);
    }
}

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K super-block. */
static void fs_t_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Super-blocks [0, n) of each kind; the public functions below cut them into chunks. */
static void fs_t_q4_k(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 144, *qs = b + 16;
        float d = fs_h2f(fs_rd16le(b)), dmin = fs_h2f(fs_rd16le(b + 2));
        for (int j = 0; j < 8; j++) {
            uint8_t *o = dst + (s * 8 + (size_t)j) * 20;
            const uint8_t *chunk = qs + 32 * (j / 2);
            int sc, m, shift = 4 * (j & 1);
            fs_t_scale_min(j, b + 4, &sc, &m);
            fs_wr16le(o, fs_f2h(d * (float)sc));
            fs_wr16le(o + 2, fs_f2h(-(dmin * (float)m)));
            for (int k = 0; k < 16; k++)
                o[4 + k] = (uint8_t)(((chunk[k] >> shift) & 0x0f)
                                     | (((chunk[k + 16] >> shift) & 0x0f) << 4));
        }
    }
}

/* GGUF's Q8_0 rule on one block of 32 float32 weights whose largest magnitude is amax:
 * d' = amax / 127, id = d' ? 1 / d' : 0, q = round-half-away(w * id), d' stored as f16. */
static void fs_t_q8_0_block(const float *w, float amax, uint8_t *o)
{
    float dq = amax / 127.0f, id = dq != 0.0f ? 1.0f / dq : 0.0f;
    fs_wr16le(o, fs_f2h(dq));
    for (int i = 0; i < 32; i++) {
        /* gguf's roundf, floor(a) + floor(2 (a - floor(a))), half away from zero: for
         * 0 <= a < 2^23 truncation is floor and both steps are exact */
        float v = w[i] * id, a = fabsf(v);
        int whole = (int)a, r = whole + (int)(2.0f * (a - (float)whole));
        o[2 + i] = (uint8_t)(int8_t)(v < 0.0f ? -r : r);
    }
}

/* Q4_K super-blocks [0, n) -> Q8_0: each weight (d * sc) * q - dmin * m in float32 as gguf
 * computes it (both products exact: at most 21 significant bits; one rounding, at the
 * subtraction, so a fused multiply-add gives the same), then the Q8_0 rule. Returns -1 at
 * the first super-block whose d or dmin is NaN or infinite, else 0. */
static int fs_t_q4_k_q8(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 144, *qs = b + 16;
        uint16_t dh = fs_rd16le(b), mh = fs_rd16le(b + 2);
        float d = fs_h2f(dh), dmin = fs_h2f(mh);
        if (fs_h_nonfinite(dh) || fs_h_nonfinite(mh))
            return -1;
        for (int j = 0; j < 8; j++) {
            const uint8_t *chunk = qs + 32 * (j / 2);
            int sc, m, shift = 4 * (j & 1);
            float w[32], ds, dm, lo, hi;
            int qlo = 15, qhi = 0;
            fs_t_scale_min(j, b + 4, &sc, &m);
            ds = d * (float)sc;
            dm = dmin * (float)m;
            for (int i = 0; i < 32; i++) {
                int q = (chunk[i] >> shift) & 0x0f;
                w[i] = ds * (float)q - dm;
                qlo = q < qlo ? q : qlo;
                qhi = q > qhi ? q : qhi;
            }
            /* w is monotone in q (an exact product, then one rounding), so the largest |w|
             * is that of the smallest or the largest q */
            lo = fabsf(ds * (float)qlo - dm);
            hi = fabsf(ds * (float)qhi - dm);
            fs_t_q8_0_block(w, lo > hi ? lo : hi, dst + (s * 8 + (size_t)j) * 34);
        }
    }
    return 0;
}

/* Returns -1 at the first super-block whose d is NaN or infinite, else 0. The loops are
 * written so that the compiler vectorizes them (plain C, no intrinsics). */
static int fs_t_q6_k(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 210, *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        uint16_t dh = fs_rd16le(b + 208);
        float d = fs_h2f(dh);
        int8_t q[256];  /* the 6-bit values minus 32, in element order */
        if (fs_h_nonfinite(dh))
            return -1;
        for (int h = 0; h < 2; h++) {  /* ggml's element order: 4 weights per l, 32 apart */
            const uint8_t *lo = ql + 64 * h, *hi = qh + 32 * h;
            int8_t *y = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                y[l] = (int8_t)(((lo[l] & 0x0f) | (hi[l] & 3) << 4) - 32);
                y[l + 32] = (int8_t)(((lo[l + 32] & 0x0f) | (hi[l] >> 2 & 3) << 4) - 32);
                y[l + 64] = (int8_t)((lo[l] >> 4 | (hi[l] >> 4 & 3) << 4) - 32);
                y[l + 96] = (int8_t)((lo[l + 32] >> 4 | (hi[l] >> 6 & 3) << 4) - 32);
            }
        }
        for (int k = 0; k < 8; k++) {  /* block k: elements 32k.., scales 2k and 2k + 1 */
            const int8_t *x = q + 32 * k;
            uint8_t *o = dst + (s * 8 + (size_t)k) * 34;
            float ds[2] = {d * (float)scales[2 * k], d * (float)scales[2 * k + 1]};
            float w[32], amax = 0.0f;
            for (int half = 0; half < 2; half++) {
                /* max |ds * q| = |ds| * max |q|: a product's rounding is monotone and
                 * symmetric, so this is the largest of the 16 rounded products */
                int top = 0;
                for (int i = 0; i < 16; i++) {
                    int a = x[16 * half + i] < 0 ? -x[16 * half + i] : x[16 * half + i];
                    top = a > top ? a : top;
                }
                float m = fabsf(ds[half]) * (float)top;
                amax = m > amax ? m : amax;
                for (int i = 0; i < 16; i++)
                    w[16 * half + i] = ds[half] * (float)x[16 * half + i];
            }
            fs_t_q8_0_block(w, amax, o);
        }
    }
    return 0;
}

/* Q5_0 blocks [0, n) -> Q8_0: the same d (its bytes), the integers q - 16 (exactly the same
 * weights); a block of d = +-0 holds only zero weights and gets zero integers. Returns -1 at
 * the first block whose d is NaN or infinite, else 0. */
static int fs_t_q5_0(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 22, *qs = b + 6;
        uint8_t *o = dst + s * 34;
        uint16_t dh = fs_rd16le(b);
        uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16
                      | (uint32_t)b[5] << 24;
        int keep = (dh & 0x7fffu) != 0;
        if (fs_h_nonfinite(dh))
            return -1;
        o[0] = b[0];
        o[1] = b[1];
        for (int j = 0; j < 16; j++) {  /* ggml: byte j holds elements j and j + 16 */
            int x0 = ((qs[j] & 0x0f) | ((qh >> j) << 4 & 0x10)) - 16;
            int x1 = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            o[2 + j] = (uint8_t)(int8_t)(keep ? x0 : 0);
            o[18 + j] = (uint8_t)(int8_t)(keep ? x1 : 0);
        }
    }
    return 0;
}

/* One conversion, its blocks shared out by the core's pool (fs_pool_run_ranges). */
typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    int type;
} fs_t_job;

enum { FS_T_Q4_K, FS_T_Q4_K_Q8, FS_T_Q6_K, FS_T_Q5_0 };

static int fs_t_range(void *ctx, size_t a, size_t e)
{
    const fs_t_job *j = (const fs_t_job *)ctx;
    switch (j->type) {
    case FS_T_Q4_K: fs_t_q4_k(j->src + a * 144, e - a, j->dst + a * 160); return 0;
    case FS_T_Q4_K_Q8: return fs_t_q4_k_q8(j->src + a * 144, e - a, j->dst + a * 272);
    case FS_T_Q6_K: return fs_t_q6_k(j->src + a * 210, e - a, j->dst + a * 272);
    case FS_T_Q5_0: return fs_t_q5_0(j->src + a * 22, e - a, j->dst + a * 34);
    default: return -1;
    }
}

/* cost in fs_pool_chunks' unit (a product's weight): a converted weight costs about 4 */
static int fs_t_run(int type, const uint8_t *src, size_t n, uint8_t *dst, size_t weights)
{
    fs_t_job j = {src, dst, type};
    return fs_pool_run_ranges(fs_t_range, &j, n, weights * 4);
}

void fs_q4_k_to_q4_1(const uint8_t *src, size_t n, uint8_t *dst)
{
    (void)fs_t_run(FS_T_Q4_K, src, n, dst, 256);
}

int fs_q4_k_to_q8_0(const uint8_t *src, size_t n, uint8_t *dst)
{
    return fs_t_run(FS_T_Q4_K_Q8, src, n, dst, 256);
}

int fs_q6_k_to_q8_0(const uint8_t *src, size_t n, uint8_t *dst)
{
    return fs_t_run(FS_T_Q6_K, src, n, dst, 256);
}

int fs_q5_0_to_q8_0(const uint8_t *src, size_t n, uint8_t *dst)
{
    return fs_t_run(FS_T_Q5_0, src, n, dst, 32);
}
