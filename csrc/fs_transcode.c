/* fs_transcode.c -- GGUF K-quant super-blocks and Q5_0 blocks into native Q4_1 / Q8_0 blocks
 * (fs_transcode.h), the work shared out by the core's pool. */
#include "fs_transcode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fs_common.h"
#include "fs_pool.h"
#include "fs_quant.h"

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
FS_CLONES static void fs_t_q4_k(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 144, *qs = b + 16;
        float d = fs_h2f(fs_rd16le(b)), dmin = fs_h2f(fs_rd16le(b + 2)), v[16];
        uint16_t h[16];
        for (int j = 0; j < 8; j++) {  /* the scales d * sc, then the mins -(dmin * m) */
            int sc, m;
            fs_t_scale_min(j, b + 4, &sc, &m);
            v[j] = d * (float)sc;
            v[8 + j] = -(dmin * (float)m);
        }
        fs_f2h16(v, h);
        for (int j = 0; j < 8; j++) {
            uint8_t *o = dst + (s * 8 + (size_t)j) * 20;
            fs_wr16le(o, h[j]);
            fs_wr16le(o + 2, h[8 + j]);
        }
        for (int i = 0; i < 4; i++) {  /* bytes 32i..: low nibbles block 2i, high 2i + 1 */
            const uint8_t *chunk = qs + 32 * i;
            uint8_t *lo = dst + (s * 8 + 2 * (size_t)i) * 20 + 4, *hi = lo + 20;
            for (int k = 0; k < 16; k++) {
                lo[k] = (uint8_t)((chunk[k] & 0x0f) | (chunk[k + 16] << 4));
                hi[k] = (uint8_t)((chunk[k] >> 4) | (chunk[k + 16] & 0xf0));
            }
        }
    }
}

/* GGUF's Q8_0 rule on one block of 32 float32 weights whose largest magnitude is amax:
 * d' = amax / 127, id = d' ? 1 / d' : 0, q = round-half-away(w * id), d' stored as f16. */
FS_ALWAYS_INLINE void fs_t_q8_0_block(const float *FS_RESTRICT w, float amax,
                                     uint8_t *FS_RESTRICT o)
{
    float dq = amax / 127.0f, id = dq != 0.0f ? 1.0f / dq : 0.0f;
    fs_wr16le(o, fs_f2h_fast(dq));
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
FS_CLONES static int fs_t_q4_k_q8(const uint8_t *src, size_t n, uint8_t *dst)
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
 * written so that the compiler vectorizes them (plain C, no intrinsics; unsigned bytes, whose
 * max and min x86-64's baseline SSE2 has). */
FS_CLONES static int fs_t_q6_k(const uint8_t *src, size_t n, uint8_t *dst)
{
    for (size_t s = 0; s < n; s++) {
        const uint8_t *b = src + s * 210, *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        uint16_t dh = fs_rd16le(b + 208);
        float d = fs_h2f(dh);
        uint8_t u[256];  /* the 6-bit values (q = u - 32), in element order */
        if (fs_h_nonfinite(dh))
            return -1;
        for (int h = 0; h < 2; h++) {  /* ggml's element order: 4 weights per l, 32 apart */
            const uint8_t *lo = ql + 64 * h, *hi = qh + 32 * h;
            uint8_t *y = u + 128 * h;
            for (int l = 0; l < 32; l++) {
                y[l] = (uint8_t)((lo[l] & 0x0f) | (hi[l] & 3) << 4);
                y[l + 32] = (uint8_t)((lo[l + 32] & 0x0f) | (hi[l] >> 2 & 3) << 4);
                y[l + 64] = (uint8_t)(lo[l] >> 4 | (hi[l] >> 4 & 3) << 4);
                y[l + 96] = (uint8_t)(lo[l + 32] >> 4 | (hi[l] >> 6 & 3) << 4);
            }
        }
        for (int k = 0; k < 8; k++) {  /* block k: elements 32k.., scales 2k and 2k + 1 */
            const uint8_t *x = u + 32 * k;
            uint8_t *o = dst + (s * 8 + (size_t)k) * 34;
            float w[32], amax = 0.0f;
            for (int half = 0; half < 2; half++) {
                /* max |ds * q| = |ds| * max |q|: a product's rounding is monotone and
                 * symmetric, so this is the largest of the 16 rounded products; max |q| is
                 * max(umax - 32, 32 - umin) */
                float ds = d * (float)scales[2 * k + half], m;
                uint8_t umax = 0, umin = 63;
                for (int i = 0; i < 16; i++) {
                    umax = x[16 * half + i] > umax ? x[16 * half + i] : umax;
                    umin = x[16 * half + i] < umin ? x[16 * half + i] : umin;
                }
                m = fabsf(ds) * (float)(umax - 32 > 32 - umin ? umax - 32 : 32 - umin);
                amax = m > amax ? m : amax;
                for (int i = 0; i < 16; i++)
                    w[16 * half + i] = ds * (float)((int)x[16 * half + i] - 32);
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

/* The conversions (fs_transcode.h's FS_T_*): source block bytes, weights a source block, the
 * native kind written. */
static const struct {
    int sb, weights, kind;
} fs_t_conv[FS_T_COUNT] = {
    [FS_T_Q4_K_Q4_1] = {144, 256, FS_Q4_1},
    [FS_T_Q4_K_Q8_0] = {144, 256, FS_Q8_0},
    [FS_T_Q6_K_Q8_0] = {210, 256, FS_Q8_0},
    [FS_T_Q5_0_Q8_0] = {22, 32, FS_Q8_0},
};

/* Conversion conv of the n source blocks at src into dst on the calling thread: 0, or -1 at
 * a NaN or infinite scale (Q4_K -> Q4_1 cannot fail here: fs_transcode.h). */
static int fs_t_convert(int conv, const uint8_t *src, size_t n, uint8_t *dst)
{
    switch (conv) {
    case FS_T_Q4_K_Q4_1: fs_t_q4_k(src, n, dst); return 0;
    case FS_T_Q4_K_Q8_0: return fs_t_q4_k_q8(src, n, dst);
    case FS_T_Q6_K_Q8_0: return fs_t_q6_k(src, n, dst);
    case FS_T_Q5_0_Q8_0: return fs_t_q5_0(src, n, dst);
    default: return -1;
    }
}

/* Bytes the conversion writes for one source block. */
static size_t fs_t_out_bytes(int conv)
{
    return (size_t)(fs_t_conv[conv].weights / FS_Q_BLOCK)
           * (size_t)fs_quant_block_bytes(fs_t_conv[conv].kind);
}

/* One conversion, its blocks shared out by the core's pool (fs_pool_run_ranges). */
typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    int conv, in, out;
} fs_t_job;

static int fs_t_range(void *ctx, size_t a, size_t e)
{
    const fs_t_job *j = (const fs_t_job *)ctx;
    return fs_t_convert(j->conv, j->src + a * (size_t)fs_t_conv[j->conv].sb, e - a,
                        j->dst + a * fs_t_out_bytes(j->conv));
}

/* cost in fs_pool_chunks' unit (a product's weight): a converted weight costs about 4 */
int fs_transcode(int conv, const uint8_t *src, size_t n, uint8_t *dst)
{
    fs_t_job j = {src, dst, conv, 0, 0};
    if (conv < 0 || conv >= FS_T_COUNT)
        return FS_T_EARG;
    return fs_pool_run_ranges(fs_t_range, &j, n, (size_t)fs_t_conv[conv].weights * 4)
               ? FS_T_EBADSCALE : 0;
}

/* Panels [g0, g1) of fs_transcode_pack: each panel's rows converted into a buffer of this
 * chunk (at most 8 rows of native blocks: L1/L2-sized), then packed from it. */
static int fs_tp_range(void *ctx, size_t g0, size_t g1)
{
    const fs_t_job *j = (const fs_t_job *)ctx;
    size_t nsrc = (size_t)(j->in / fs_t_conv[j->conv].weights);
    size_t srow = nsrc * (size_t)fs_t_conv[j->conv].sb, drow = nsrc * fs_t_out_bytes(j->conv);
    size_t psz = fs_quant_panel_bytes(fs_t_conv[j->conv].kind, j->in);
    uint8_t *buf = (uint8_t *)malloc(FS_Q_COLS * drow);
    int rc = 0;
    if (buf == NULL)
        return FS_T_ENOMEM;
    for (size_t g = g0; g < g1 && rc == 0; g++) {
        size_t c0 = g * FS_Q_COLS;
        int ncols = j->out - (int)c0 < FS_Q_COLS ? j->out - (int)c0 : FS_Q_COLS;
        if (fs_t_convert(j->conv, j->src + c0 * srow, (size_t)ncols * nsrc, buf) != 0
            || fs_quant_pack_panel(fs_t_conv[j->conv].kind, buf, j->in, ncols,
                                   j->dst + g * psz) != 0)
            rc = FS_T_EBADSCALE;
    }
    free(buf);
    return rc;
}

int fs_transcode_pack(int conv, const uint8_t *src, int in, int out, uint8_t *P)
{
    fs_t_job j = {src, P, conv, in, out};
    if (conv < 0 || conv >= FS_T_COUNT || in <= 0 || in % fs_t_conv[conv].weights != 0
        || out < 1)
        return FS_T_EARG;
    /* a panel: 8 rows of `in` weights, each converted (~4) and packed (~1) */
    return fs_pool_run_ranges(fs_tp_range, &j, ((size_t)out + FS_Q_COLS - 1) / FS_Q_COLS,
                              (size_t)in * FS_Q_COLS * 5);
}
