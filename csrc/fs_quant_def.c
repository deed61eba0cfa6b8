/* fs_quant_def.c -- the portable variant of the quantized products (fs_quant_kern.h): plain C,
 * one output at a time, the statement of fs_quant.h's arithmetic that the other variants
 * reproduce bit for bit (fmaf is the C library's fused multiply-add). */
#include "fs_quant.h"
#include "fs_quant_kern.h"

/* Exact integer sum of block b of panel column c with row r's quantized block. */
static int32_t fs_q_isum_def(int kind, const uint8_t *qs, int c, const int8_t *q, int32_t s)
{
    int32_t isum = 0;
    if (kind == FS_Q8_0) {
        for (int i = 0; i < FS_Q_BLOCK; i++)
            isum += (int32_t)(int8_t)qs[((i / 4) * FS_Q_COLS + c) * 4 + i % 4] * q[i];
        return isum;
    }
    for (int i = 0; i < 16; i++) {
        uint8_t byte = qs[((i / 4) * FS_Q_COLS + c) * 4 + i % 4];
        isum += (int32_t)(byte & 15) * q[i] + (int32_t)(byte >> 4) * q[16 + i];
    }
    return kind == FS_Q4_0 ? isum - 8 * s : isum;
}

void fs_qpart_def(int kind, const fs_qact *a, const uint8_t *P, float *y, int out, int g_lo,
                  int g_hi, int accumulate)
{
    int nb = a->nb;
    size_t psz = fs_quant_panel_bytes(kind, a->in), qoff = FS_Q_PANEL_QS(kind, nb);
    size_t moff = FS_Q_PANEL_M(nb), qb = kind == FS_Q8_0 ? 256 : 128;
    for (int g = g_lo; g < g_hi; g++) {
        const uint8_t *pan = P + (size_t)g * psz;
        for (int c = 0; c < FS_Q_COLS && g * FS_Q_COLS + c < out; c++)
            for (int r = 0; r < a->n; r++) {
                float *yo = y + (size_t)r * out + g * FS_Q_COLS + c;
                float acc = accumulate ? *yo : 0.0f;
                for (int b = 0; b < nb; b++) {
                    size_t rb = (size_t)r * nb + b;
                    const uint8_t *dp = pan + (size_t)(b * FS_Q_COLS + c) * 2;
                    float dw = fs_h2f((uint16_t)(dp[0] | dp[1] << 8));
                    int32_t isum = fs_q_isum_def(kind, pan + qoff + (size_t)b * qb, c,
                                                 a->q + (size_t)r * a->in + b * FS_Q_BLOCK,
                                                 a->s[rb]);
                    float sc = dw * a->d[rb];
                    acc = fmaf(sc, (float)isum, acc);
                    if (kind == FS_Q4_1) {
                        const uint8_t *mp = pan + moff + (size_t)(b * FS_Q_COLS + c) * 2;
                        acc = fmaf(fs_h2f((uint16_t)(mp[0] | mp[1] << 8)), a->ds[rb], acc);
                    }
                }
                *yo = acc;
            }
    }
}
