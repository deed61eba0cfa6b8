/* fs_transcode.c -- GGUF K-quant super-blocks into native Q4_1 / Q8_0 blocks (fs_transcode.h). */
#include "fs_transcode.h"

#include <math.h>
#include <string.h>

#include "fs_common.h"

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

static uint16_t fs_t_rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void fs_t_wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xffu);
    p[1] = (uint8_t)(v >> 8);
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

void fs_q4_k_to_q4_1(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 144, *qs = b + 16;
        float d = fs_h2f(fs_t_rd16(b)), dmin = fs_h2f(fs_t_rd16(b + 2));
        for (int j = 0; j < 8; j++) {
            uint8_t *o = dst + (s * 8 + (size_t)j) * 20;
            const uint8_t *chunk = qs + 32 * (j / 2);
            int sc, m, shift = 4 * (j & 1);
            fs_t_scale_min(j, b + 4, &sc, &m);
            fs_t_wr16(o, fs_f2h(d * (float)sc));
            fs_t_wr16(o + 2, fs_f2h(-(dmin * (float)m)));
            for (int k = 0; k < 16; k++)
                o[4 + k] = (uint8_t)(((chunk[k] >> shift) & 0x0f)
                                     | (((chunk[k + 16] >> shift) & 0x0f) << 4));
        }
    }
}

int fs_q6_k_to_q8_0(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 210, *ql = b, *qh = b + 128;  /* d * sc exact below */
        const int8_t *scales = (const int8_t *)(b + 192);
        uint16_t dh = fs_t_rd16(b + 208);
        float d = fs_h2f(dh), w[256];
        if ((dh & 0x7c00u) == 0x7c00u)
            return -1;
        for (int h = 0; h < 2; h++) {  /* ggml's element order: 4 weights per l, 32 apart */
            const uint8_t *lo = ql + 64 * h, *hi = qh + 32 * h;
            const int8_t *sc = scales + 8 * h;
            float *y = w + 128 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                y[l] = (d * (float)sc[is]) * (float)(((lo[l] & 0x0f) | (hi[l] & 3) << 4) - 32);
                y[l + 32] = (d * (float)sc[is + 2])
                            * (float)(((lo[l + 32] & 0x0f) | (hi[l] >> 2 & 3) << 4) - 32);
                y[l + 64] = (d * (float)sc[is + 4])
                            * (float)((lo[l] >> 4 | (hi[l] >> 4 & 3) << 4) - 32);
                y[l + 96] = (d * (float)sc[is + 6])
                            * (float)((lo[l + 32] >> 4 | (hi[l] >> 6 & 3) << 4) - 32);
            }
        }
        for (int k = 0; k < 8; k++) {
            const float *x = w + 32 * k;
            uint8_t *o = dst + (s * 8 + (size_t)k) * 34;
            float amax = 0.0f, dq, id;
            for (int i = 0; i < 32; i++)
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            dq = amax / 127.0f;
            id = dq != 0.0f ? 1.0f / dq : 0.0f;
            fs_t_wr16(o, fs_f2h(dq));
            for (int i = 0; i < 32; i++) {
                /* gguf's roundf, floor(a) + floor(2 (a - floor(a))), half away from zero: for
                 * 0 <= a < 2^23 truncation is floor and both steps are exact */
                float v = x[i] * id, a = fabsf(v);
                int whole = (int)a, r = whole + (int)(2.0f * (a - (float)whole));
                o[2 + i] = (uint8_t)(int8_t)(v < 0.0f ? -r : r);
            }
        }
    }
    return 0;
}
