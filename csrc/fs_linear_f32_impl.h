/* Template body of fs_linear.h's packed float kernels: included once per weight type and
 * variant with these defined (see fs_common.h; no include guard on purpose):
 *
 *   FS_SFX    name suffix (weight type and variant: f32_avx2, f32h_def, ...)
 *   FS_WT     weight element type (float, or uint16_t for binary16 / bfloat16 bits)
 *   FS_ATTR   target attribute of the variant (empty for the baseline build)
 *   FS_LOADW  FS_LOADW(dst, p) loads 16 weights at p into dst[0 .. FS_NL - 1] as floats
 *   FS_YMM    1: arithmetic on native 8-lane vectors (AVX2: every accumulator a ymm
 *             register), 0: on 64-byte vectors (one zmm on AVX-512)
 *
 * Shape of the tiles: FS_VT is the vector type, FS_NL the vectors per 16 columns; rows pass
 * through in tiles of at most FS_MAXR; a tile of 1 row reads FS_NP1 panels at once, of 2 rows
 * FS_NP2, of more rows 1; tiles of more than FS_HALFR rows take each panel as two halves of
 * 16 columns (the second half re-reads the panel from L2: the weights still stream from
 * memory once per tile). With 64-byte vectors a tile holds up to 10 rows x 2 vectors (20 of
 * AVX-512's 32 registers); AVX2's 16 ymm registers hold at most 12 accumulators beside the
 * broadcast input (2 x 8-lane vectors per 16 columns): one row reads two panels, 2-3 rows one
 * panel, 4-6 rows half a panel.
 * W is packed by fs_pack_f32 / fs_pack_f32h. */

/* Prefetch distance in k steps of a tile of R rows: FS_LIN_PF_K for float weights, the same
 * bytes for 16-bit; on AVX2 a one-row tile of float weights looks FS_LIN_PF_K_F32_AVX2 steps
 * ahead instead. */
#if FS_YMM
#define FS_LINF_PF(R) \
    ((int)sizeof(FS_WT) == 4 && (R) == 1 ? FS_LIN_PF_K_F32_AVX2 : FS_LIN_PF_K * 4 / (int)sizeof(FS_WT))
#else
#define FS_LINF_PF(R) (FS_LIN_PF_K * 4 / (int)sizeof(FS_WT))
#endif

#if FS_YMM
#define FS_VT fs_v8f_u
#define FS_NL 2
#define FS_MAXR FS_LIN_MAXR_AVX2
#define FS_NP1 2
#define FS_NP2 1
#define FS_HALFR 3
#else
#define FS_VT fs_v16f_u
#define FS_NL 1
#define FS_MAXR FS_LIN_MAXR
#define FS_NP1 4
#define FS_NP2 2
#define FS_HALFR FS_LIN_MAXR
#endif

/* y[c0 + i] for i < min(m, lanes), zero past m (m may be <= 0), and its inverse. */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_linf_ld)(FS_VT *dst, const float *p, int m)
{
    union { FS_VT v; float f[sizeof(FS_VT) / sizeof(float)]; } u;
    const int lanes = (int)(sizeof(FS_VT) / sizeof(float));
    memset(&u, 0, sizeof u);
    if (m > 0) memcpy(u.f, p, (size_t)(m < lanes ? m : lanes) * sizeof(float));
    *dst = u.v;
}
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_linf_st)(float *p, FS_VT v, int m)
{
    union { FS_VT v; float f[sizeof(FS_VT) / sizeof(float)]; } u = {v};
    const int lanes = (int)(sizeof(FS_VT) / sizeof(float));
    if (m > 0) memcpy(p, u.f, (size_t)(m < lanes ? m : lanes) * sizeof(float));
}

/* A tile of R rows x NP panels x NV vectors of 16 columns at column c0 + 16 V0 (NP consecutive
 * panels of PW = 32 columns, or one of 16; NP = 1 when NV * 16 < PW), accumulated in
 * registers over the whole `in` axis while the panels stream in sequentially. Each y[c]
 * takes its products in k order, one multiply-add at a time, whatever R and NP are: a row
 * gives the same bits alone (decode) as inside a block (verification). */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_linf_tile)(const float *FS_RESTRICT x,
                                         const FS_WT *FS_RESTRICT P,
                                         float *FS_RESTRICT y, const int R, const int NP,
                                         const int NV, const int PW, const int V0, int in,
                                         int out, int c0, int accumulate)
{
    FS_VT acc[FS_LIN_MAXR * 2 * (FS_NL)];
    const int VL = (int)(sizeof(FS_VT) / sizeof(float)), NJ = NP * NV * (FS_NL);
    const size_t ps = (size_t)in * 32;
    FS_LIN_UNROLL for (int r = 0; r < R; r++)
        FS_LIN_UNROLL for (int j = 0; j < NJ; j++) {
            int c = c0 + V0 * 16 + j * VL;
            if (accumulate) FS_FN(fs_linf_ld)(&acc[r * NJ + j], y + (size_t)r * out + c, out - c);
            else acc[r * NJ + j] = (FS_VT){0};
        }
    for (int k = 0; k < in; k++) {
        FS_VT wv[8 * (FS_NL)];
        FS_LIN_UNROLL for (int p = 0; p < NP; p++) {
            const FS_WT *w = P + p * ps + (size_t)k * PW + V0 * 16;
            FS_LIN_UNROLL for (int v = 0; v < NV; v++) {
                if (FS_LIN_PF_K && (v * 16 * sizeof(FS_WT)) % 64 == 0) {  /* once a line */
                    /* Past the panel's end, fetch the same offset of the next tile's panel:
                     * each tile's streams then start warm (measured on a SmolLM-shape bf16
                     * decode: ~85% -> ~92% of a two-stream dot's rate). */
                    const FS_WT *pf = w + FS_LINF_PF(R) * PW + v * 16;
                    if (k + FS_LINF_PF(R) >= in) pf += (size_t)(NP - 1) * ps;
                    __builtin_prefetch(pf, 0, 3);
                }
                FS_LOADW(&wv[(p * NV + v) * (FS_NL)], w + v * 16);
            }
        }
        FS_LIN_UNROLL for (int r = 0; r < R; r++) {
            const float a = x[(size_t)r * in + k];
            FS_LIN_UNROLL for (int j = 0; j < NJ; j++) acc[r * NJ + j] += a * wv[j];
        }
    }
    FS_LIN_UNROLL for (int r = 0; r < R; r++)
        FS_LIN_UNROLL for (int j = 0; j < NJ; j++) {
            int c = c0 + V0 * 16 + j * VL;
            FS_FN(fs_linf_st)(y + (size_t)r * out + c, acc[r * NJ + j], out - c);
        }
}

/* R rows, columns [lo, hi) (lo a multiple of 32; hi == out or a multiple of 32): NP panels
 * at a time, then single panels, then the last half panel. */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_linf_rows)(const float *x, const FS_WT *P, float *y,
                                                  const int R,
                                         const int NP, int in, int out, int lo, int hi,
                                         int accumulate)
{
    int end = hi == out ? (out + 15) / 16 * 16 : hi, c0 = lo;
    if (R > (FS_HALFR)) {
        for (; c0 + 32 <= end; c0 += 32) {
            FS_FN(fs_linf_tile)(x, P + (size_t)c0 * in, y, R, 1, 1, 32, 0, in, out, c0, accumulate);
            FS_FN(fs_linf_tile)(x, P + (size_t)c0 * in, y, R, 1, 1, 32, 1, in, out, c0, accumulate);
        }
    }
    for (; c0 + 32 * NP <= end; c0 += 32 * NP)
        FS_FN(fs_linf_tile)(x, P + (size_t)c0 * in, y, R, NP, 2, 32, 0, in, out, c0, accumulate);
    for (; c0 + 32 <= end; c0 += 32)
        FS_FN(fs_linf_tile)(x, P + (size_t)c0 * in, y, R, 1, 2, 32, 0, in, out, c0, accumulate);
    if (c0 < end)
        FS_FN(fs_linf_tile)(x, P + (size_t)c0 * in, y, R, 1, 1, 16, 0, in, out, c0, accumulate);
}

/* All n rows, columns [lo, hi), in passes of at most FS_MAXR rows (as even as possible). With
 * 64-byte vectors one row reads four panels at once (eight independent sums hide the
 * multiply-add latency), two rows two panels, more rows one panel. */
static FS_ATTR void FS_FN(fs_linf_part)(const float *x, const FS_WT *P, float *y, int n, int in,
                                  int out, int lo, int hi, int accumulate)
{
    int passes = (n + (FS_MAXR) - 1) / (FS_MAXR);
    int r0 = 0;
    for (int p = 0; p < passes; p++) {
        int R = (n - r0 + (passes - p) - 1) / (passes - p);
        const float *xp = x + (size_t)r0 * in;
        float *yp = y + (size_t)r0 * out;
        switch (R) {
        case 1: FS_FN(fs_linf_rows)(xp, P, yp, 1, FS_NP1, in, out, lo, hi, accumulate); break;
        case 2: FS_FN(fs_linf_rows)(xp, P, yp, 2, FS_NP2, in, out, lo, hi, accumulate); break;
        FS_LINF_CASE(3) FS_LINF_CASE(4) FS_LINF_CASE(5)
        FS_LINF_CASE(6) FS_LINF_CASE(7) FS_LINF_CASE(8)
        FS_LINF_CASE(9)
        default: FS_FN(fs_linf_rows)(xp, P, yp, (FS_MAXR) < 10 ? (FS_MAXR) : 10, 1, in, out, lo, hi,
                                  accumulate); break;
        }
        r0 += R;
    }
}

#undef FS_SFX
#undef FS_WT
#undef FS_ATTR
#undef FS_LOADW
#undef FS_YMM
#undef FS_VT
#undef FS_NL
#undef FS_MAXR
#undef FS_NP1
#undef FS_NP2
#undef FS_HALFR
#undef FS_LINF_PF
