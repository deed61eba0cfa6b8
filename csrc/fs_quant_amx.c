/* fs_quant_amx.c -- the AMX-INT8 variant of the quantized products (fs_quant_kern.h), for
 * blocks of rows (the amx path runs it from FS_Q_AMX_MIN_ROWS rows up).
 *
 * Tiles: A = up to 16 quantized rows x one block of 32 inputs (int8, 32 bytes a row, read in
 * place from the activations); B = one block of a panel: 8 rows of 32 bytes, input group k
 * (4 inputs) x 8 columns x 4 bytes, which is the q8_0 panel's own qs layout (q4_*: the
 * nibbles widened to bytes into a 256-byte buffer, low nibbles = inputs 0..15 first);
 * C = (rows x 8 columns) int32 = the blocks' exact integer sums (tdpbssd: signed x signed).
 * Two panels run side by side (tiles 1, 2 -> 4, 5), and each block's C tiles are stored and
 * scaled on 16-lane zmm vectors, one per row (acc = fma(d_w * d_a, (float)isum, acc), q4_1's
 * min fma after it): every lane runs the arithmetic of fs_quant.h in block order, so the
 * results equal the other paths' bits.
 */
#include "fs_quant.h"
#include "fs_quant_kern.h"

#if FS_Q_AMX
#include <immintrin.h>

#define FS_QA_ATTR \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512vl,avx512bw,avx2,fma,f16c")))
#define FS_QA_UNROLL _Pragma("GCC unroll 16")
/* Stack bytes for two q4 panels widened to bytes (in <= 4096; wider: block by block). */
#define FS_QA_UNPACKED 65536

FS_QA_ATTR static void fs_qa_config(int m)
{
    fs_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[0] = (uint8_t)m;  /* A */
    cfg.colsb[0] = 32;
    for (int t = 1; t <= 2; t++) {  /* B */
        cfg.rows[t] = 8;
        cfg.colsb[t] = 32;
    }
    for (int t = 4; t <= 5; t++) {  /* C */
        cfg.rows[t] = (uint8_t)m;
        cfg.colsb[t] = 32;
    }
    _tile_loadconfig(&cfg);
}

/* Block b of a q4 panel widened to the B layout: buf[0:128] low nibbles, buf[128:256] high. */
FS_QA_ATTR static inline __attribute__((always_inline)) void fs_qa_unpack4(const uint8_t *qs,
                                                                           uint8_t *buf)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    FS_QA_UNROLL for (int j = 0; j < 4; j++) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + j * 32));
        _mm256_store_si256((__m256i *)(buf + j * 32), _mm256_and_si256(bits, m4));
        _mm256_store_si256((__m256i *)(buf + 128 + j * 32),
                           _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4));
    }
}

/* 16 f16 scales: 8 of panel p0, 8 of panel p1 (NULL: zeros). */
FS_QA_ATTR static inline __attribute__((always_inline)) __m512 fs_qa_h16(const uint8_t *p0,
                                                                         const uint8_t *p1)
{
    __m128i lo = _mm_loadu_si128((const __m128i *)p0);
    __m128i hi = p1 ? _mm_loadu_si128((const __m128i *)p1) : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* Rows [r0, r0 + m) (m <= 16) x panels g, g + 1 (two: whether g + 1 exists). */
FS_QA_ATTR static inline __attribute__((always_inline)) void fs_qa_pair(
    const int KIND, const fs_qact *a, const uint8_t *P, size_t psz, float *y, int out, int g,
    int two, int r0, int m, int accumulate, int32_t *cbuf, uint8_t *ub, size_t ubsz)
{
    const int nb = a->nb, in = a->in;
    const size_t qoff = fs_quant_panel_qs(KIND, nb), moff = fs_quant_panel_m(nb);
    const size_t qb = KIND == FS_Q8_0 ? 256 : 128;
    const uint8_t *pan0 = P + (size_t)g * psz, *pan1 = two ? pan0 + psz : NULL;
    int col0 = g * FS_Q_COLS, nc = out - col0 < 2 * FS_Q_COLS ? out - col0 : 2 * FS_Q_COLS;
    __mmask16 mask = (__mmask16)((1u << nc) - 1u);
    __m512 acc[16];
    FS_QA_UNROLL for (int r = 0; r < 16; r++)
        acc[r] = r < m && accumulate
                 ? _mm512_maskz_loadu_ps(mask, y + (size_t)(r0 + r) * out + col0)
                 : _mm512_setzero_ps();
    const int8_t *qa = a->q + (size_t)r0 * in;
    const float *da = a->d + (size_t)r0 * nb, *ds = a->ds + (size_t)r0 * nb;
    const int32_t *sa = a->s + (size_t)r0 * nb;
    /* q4: the panels' nibbles widened to bytes before the block loop (a tile load right
     * after the vector stores that wrote its bytes stalls: measured 5x slower per block) */
    int pre = KIND != FS_Q8_0 && (size_t)nb * 512 <= ubsz;
    uint8_t *ub0 = ub, *ub1 = ub + (pre ? (size_t)nb * 256 : 256);
    if (pre)
        for (int b = 0; b < nb; b++) {
            fs_qa_unpack4(pan0 + qoff + (size_t)b * qb, ub0 + (size_t)b * 256);
            if (two) fs_qa_unpack4(pan1 + qoff + (size_t)b * qb, ub1 + (size_t)b * 256);
        }
    for (int b = 0; b < nb; b++) {
        const uint8_t *q0 = pan0 + qoff + (size_t)b * qb;
        /* ahead in this panel, or (q4 widened already) the next pair's same block */
        const uint8_t *pf0 = pre ? q0 + 2 * psz : q0 + FS_Q_PF_BLOCKS * qb;
        for (size_t l = 0; l < qb; l += 64) _mm_prefetch((const char *)(pf0 + l), _MM_HINT_T0);
        _tile_loadd(0, qa + (size_t)b * FS_Q_BLOCK, in);
        if (KIND == FS_Q8_0) {
            _tile_loadd(1, q0, 32);
        } else if (pre) {
            _tile_loadd(1, ub0 + (size_t)b * 256, 32);
        } else {
            fs_qa_unpack4(q0, ub0);
            _tile_loadd(1, ub0, 32);
        }
        _tile_zero(4);
        _tile_dpbssd(4, 0, 1);
        _tile_stored(4, cbuf, 64);
        if (two) {
            const uint8_t *q1 = pan1 + qoff + (size_t)b * qb;
            const uint8_t *pf1 = pre ? q1 + 2 * psz : q1 + FS_Q_PF_BLOCKS * qb;
            for (size_t l = 0; l < qb; l += 64)
                _mm_prefetch((const char *)(pf1 + l), _MM_HINT_T0);
            if (KIND == FS_Q8_0) {
                _tile_loadd(2, q1, 32);
            } else if (pre) {
                _tile_loadd(2, ub1 + (size_t)b * 256, 32);
            } else {
                fs_qa_unpack4(q1, ub1);
                _tile_loadd(2, ub1, 32);
            }
            _tile_zero(5);
            _tile_dpbssd(5, 0, 2);
            _tile_stored(5, cbuf + 8, 64);
        }
        __m512 dw = fs_qa_h16(pan0 + (size_t)b * 16, two ? pan1 + (size_t)b * 16 : NULL);
        __m512 mw = KIND == FS_Q4_1 ? fs_qa_h16(pan0 + moff + (size_t)b * 16,
                                                 two ? pan1 + moff + (size_t)b * 16 : NULL)
                                    : _mm512_setzero_ps();
        FS_QA_UNROLL for (int r = 0; r < 16; r++)
            if (r < m) {
                __m512i isum = _mm512_load_si512((const void *)(cbuf + r * 16));
                if (KIND == FS_Q4_0)
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(8 * sa[(size_t)r * nb + b]));
                __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(da[(size_t)r * nb + b]));
                acc[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(isum), acc[r]);
                if (KIND == FS_Q4_1)
                    acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ds[(size_t)r * nb + b]), acc[r]);
            }
    }
    FS_QA_UNROLL for (int r = 0; r < 16; r++)
        if (r < m) _mm512_mask_storeu_ps(y + (size_t)(r0 + r) * out + col0, mask, acc[r]);
}

FS_QA_ATTR static inline __attribute__((always_inline)) void fs_qa_run(
    const int KIND, const fs_qact *a, const uint8_t *P, float *y, int out, int g_lo, int g_hi,
    int accumulate)
{
    _Alignas(64) int32_t cbuf[16 * 16];
    _Alignas(64) uint8_t ub[FS_QA_UNPACKED];
    memset(cbuf, 0, sizeof cbuf);
    size_t psz = fs_quant_panel_bytes(KIND, a->in);
    int configured = 0;
    for (int r0 = 0; r0 < a->n; r0 += 16) {
        int m = a->n - r0 < 16 ? a->n - r0 : 16;
        if (m != configured) {
            fs_qa_config(m);
            configured = m;
        }
        for (int g = g_lo; g < g_hi; g += 2)
            fs_qa_pair(KIND, a, P, psz, y, out, g, g + 1 < g_hi, r0, m, accumulate, cbuf, ub,
                       sizeof ub);
    }
    _tile_release();
}

#define FS_QA_KIND(NAME, KIND)                                                                \
    FS_QA_ATTR __attribute__((noinline)) static void NAME(const fs_qact *a, const uint8_t *P,  \
                                                          float *y, int out, int g_lo,        \
                                                          int g_hi, int accumulate)           \
    {                                                                                          \
        fs_qa_run(KIND, a, P, y, out, g_lo, g_hi, accumulate);                                 \
    }
FS_QA_KIND(fs_qa_run8, FS_Q8_0)
FS_QA_KIND(fs_qa_run40, FS_Q4_0)
FS_QA_KIND(fs_qa_run41, FS_Q4_1)

void fs_qpart_amx(int kind, const fs_qact *a, const uint8_t *P, float *y, int out, int g_lo,
                  int g_hi, int accumulate)
{
    if (kind == FS_Q8_0)
        fs_qa_run8(a, P, y, out, g_lo, g_hi, accumulate);
    else if (kind == FS_Q4_0)
        fs_qa_run40(a, P, y, out, g_lo, g_hi, accumulate);
    else
        fs_qa_run41(a, P, y, out, g_lo, g_hi, accumulate);
}
#endif /* FS_Q_AMX */
