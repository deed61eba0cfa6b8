/* Template body of fs_attention_f32.h: the tiled float32 attention kernel for one vector
 * width. Included once per variant with these defined (see fs_common.h; no include guard on
 * purpose):
 *
 *   FS_SFX   name suffix of the variant (avx2, avx512, def)
 *   FS_ATTR  its target attribute (empty: the build's own target)
 *   FS_W     lanes of its float vectors: 8 (one ymm register each, AVX2) or 16 (one zmm on
 *            AVX-512; two ymm or four xmm elsewhere)
 *
 * Register budget (the reason for FS_W): the score and value tiles below keep at most 14
 * vectors live (8 sums, 2 query or weight broadcasts, 4 key or value rows), which fits
 * AVX2's 16 ymm registers with 8-lane vectors; 64-byte vectors there would be two registers
 * each and spill to the stack.
 */

#if FS_W == 8
#define FS_VF fs_v8f
#define FS_VI fs_v8i
#else
#define FS_VF fs_v16f
#define FS_VI fs_v16i
#endif

FS_ALWAYS_INLINE FS_ATTR FS_VF FS_FN(fs_f32_load)(const float *p)
{
    FS_VF x;
    memcpy(&x, p, sizeof x);
    return x;
}

FS_ALWAYS_INLINE FS_ATTR FS_VF FS_FN(fs_f32_splat)(float x) { return (FS_VF){0} + x; }

/* Lane-wise select: mask lanes (all ones) take a, the others b. */
FS_ALWAYS_INLINE FS_ATTR FS_VF FS_FN(fs_f32_select)(FS_VI mask, FS_VF a, FS_VF b)
{
    return (FS_VF)((mask & (FS_VI)a) | (~mask & (FS_VI)b));
}

/* The four horizontal sums of a[0..3], as lanes 0, W/4, W/2 and 3W/4 of the result. Every
 * input goes through the same tree (halves, then quarters, then pairs), so a sum does not
 * depend on its neighbours. (Inputs by pointer: vector arguments draw a GCC ABI note.) */
FS_ALWAYS_INLINE FS_ATTR FS_VF FS_FN(fs_f32_reduce4)(const FS_VF *a)
{
#if FS_W == 8
    const FS_VI lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    const FS_VI lo2 = {0, 1, 4, 5, 8, 9, 12, 13}, hi2 = {2, 3, 6, 7, 10, 11, 14, 15};
    const FS_VI swap1 = {1, 0, 3, 2, 5, 4, 7, 6};
    FS_VF u = __builtin_shuffle(a[0], a[1], lo4) + __builtin_shuffle(a[0], a[1], hi4);
    FS_VF w = __builtin_shuffle(a[2], a[3], lo4) + __builtin_shuffle(a[2], a[3], hi4);
    FS_VF z = __builtin_shuffle(u, w, lo2) + __builtin_shuffle(u, w, hi2);
#else
    const FS_VI lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const FS_VI hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const FS_VI lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const FS_VI hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const FS_VI swap2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
    const FS_VI swap1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
    FS_VF u = __builtin_shuffle(a[0], a[1], lo8) + __builtin_shuffle(a[0], a[1], hi8);
    FS_VF w = __builtin_shuffle(a[2], a[3], lo8) + __builtin_shuffle(a[2], a[3], hi8);
    FS_VF z = __builtin_shuffle(u, w, lo4) + __builtin_shuffle(u, w, hi4);
    z = z + __builtin_shuffle(z, swap2);
#endif
    return z + __builtin_shuffle(z, swap1);
}

/* exp(x) lane-wise for x = src[0:W) - shift <= 0, in float: 2^k * p(r) with |r| <= ln2/2 and a
 * degree-7 polynomial (relative error ~2e-7); x < -87 (-inf included) gives 0. */
FS_ALWAYS_INLINE FS_ATTR FS_VF FS_FN(fs_f32_exp_nonpos)(const float *src, float shift)
{
    FS_VF x = FS_FN(fs_f32_load)(src) - shift;
    const FS_VF lowest = FS_FN(fs_f32_splat)(-87.0f);
    const FS_VF shifter = FS_FN(fs_f32_splat)(12582912.0f); /* 1.5 * 2^23 */
    const FS_VF ln2_hi = FS_FN(fs_f32_splat)(0.693145752f);
    const FS_VF ln2_lo = FS_FN(fs_f32_splat)(1.42860677e-6f);
    FS_VI dead = x < lowest;
    FS_VF xc = FS_FN(fs_f32_select)(dead, lowest, x);
    FS_VF kd = xc * 1.44269504f + shifter; /* round to nearest integer in the low bits */
    FS_VI k = (FS_VI)kd - 0x4B400000;      /* minus the bits of the shifter */
    kd -= shifter;
    FS_VF r = (xc - kd * ln2_hi) - kd * ln2_lo;
    FS_VF p = FS_FN(fs_f32_splat)(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    FS_VF two_k = (FS_VF)((k + 127) << 23); /* k in [-126, 0] */
    return FS_FN(fs_f32_select)(dead, FS_FN(fs_f32_splat)(0.0f), p * two_k);
}

/* sr[r][i] = scale * dot(q[r], kp[i]) for i < nk, nk <= 4 key rows, and the R (1 or 2) query
 * rows of one pass. A row's sums run over NC = head_dim / W chunks, one multiply-add at a
 * time: the same chain whether the row passes alone or beside another, and whether the key
 * is one of four or the last of a tile (missing keys repeat the last one; their sums are
 * dropped), so every call runs the same code. */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_f32_dots)(const float *const *q, const int R,
                                                 const float *const *kp, int nk, const int NC,
                                                 float scale, float *const *sr)
{
    FS_VF a[2][4];
    for (int r = 0; r < R; r++) {
        FS_VF qc = FS_FN(fs_f32_load)(q[r]);
        for (int i = 0; i < 4; i++)
            a[r][i] = qc * FS_FN(fs_f32_load)(kp[i]);
    }
    for (int c = 1; c < NC; c++)
        for (int r = 0; r < R; r++) {
            FS_VF qc = FS_FN(fs_f32_load)(q[r] + FS_W * c);
            for (int i = 0; i < 4; i++)
                a[r][i] += qc * FS_FN(fs_f32_load)(kp[i] + FS_W * c);
        }
    for (int r = 0; r < R; r++) {
        FS_VF t = FS_FN(fs_f32_reduce4)(a[r]);
        for (int i = 0; i < nk; i++)
            sr[r][i] = t[i * (FS_W / 4)] * scale;
    }
}

/* Keys j0 + [0, width) (rows by fs_f32_key) for R query rows, four at a time. */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_f32_dots_rows)(const float *const *q, const int R,
                                                      const float *FS_RESTRICT k, int j0,
                                                      int width, const int NC, float scale,
                                                      float *FS_RESTRICT s, int base,
                                                      const int32_t *anc)
{
    const int D = NC * FS_W;
    for (int j = 0; j < width; j += 4) {
        const float *kp[4];
        for (int i = 0; i < 4; i++)
            kp[i] = fs_f32_key(k, j0 + (j + i < width ? j + i : width - 1), D, base, anc);
        float *sr[2] = {s + j, s + FS_F32_TILE + j};
        FS_FN(fs_f32_dots)(q, R, kp, width - j < 4 ? width - j : 4, NC, scale, sr);
    }
}

/* s[r * FS_F32_TILE + j] = scale * dot(q[r], key j0 + j) for j < width: rows in pairs (each
 * key row loaded once for both). */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_f32_scores)(const float *const *q, int rows,
                                                   const float *FS_RESTRICT k, int j0,
                                                   int width, const int NC, float scale,
                                                   float *FS_RESTRICT s, int base,
                                                   const int32_t *anc)
{
    int r = 0;
    for (; r + 2 <= rows; r += 2)
        FS_FN(fs_f32_dots_rows)(q + r, 2, k, j0, width, NC, scale, s + (size_t)r * FS_F32_TILE,
                                base, anc);
    if (r < rows)
        FS_FN(fs_f32_dots_rows)(q + r, 1, k, j0, width, NC, scale, s + (size_t)r * FS_F32_TILE,
                                base, anc);
}

/* tile[r][W c0 + W c] for R (1 or 2) rows and nc <= 4 vectors of columns from W c0: the sum
 * over keys j < width of w[r][j] * v[j0 + j][...], one multiply-add at a time in key order. */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_f32_values_pass)(const float *FS_RESTRICT w, const int R,
                                                        const float *FS_RESTRICT v, int j0,
                                                        int width, const int D, int c0, int nc,
                                                        float *FS_RESTRICT tile, int base,
                                                        const int32_t *anc)
{
    FS_VF acc[2][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = (FS_VF){0};
    for (int j = 0; j < width; j++) {
        const float *vj = fs_f32_key(v, j0 + j, D, base, anc) + FS_W * c0;
        FS_VF vv[4];
        for (int c = 0; c < nc; c++)
            vv[c] = FS_FN(fs_f32_load)(vj + FS_W * c);
        for (int r = 0; r < R; r++) {
            float x = w[(size_t)r * FS_F32_TILE + j];
            for (int c = 0; c < nc; c++)
                acc[r][c] += x * vv[c];
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < nc; c++)
            memcpy(tile + (size_t)r * FS_F32_MAXD + FS_W * (c0 + c), &acc[r][c], sizeof(FS_VF));
}

/* tile[r][0:D) = sum_{j < width} w[r][j] * v[j][0:D) in float: passes of two rows by four
 * vectors of columns. Rows whose weights are zero beyond their visible keys add exact zeros. */
FS_ALWAYS_INLINE FS_ATTR void FS_FN(fs_f32_values)(const float *FS_RESTRICT w, int rows,
                                                   const float *FS_RESTRICT v, int j0,
                                                   int width, const int NC,
                                                   float *FS_RESTRICT tile, int base,
                                                   const int32_t *anc)
{
    const int D = NC * FS_W;
    for (int c0 = 0; c0 < NC; c0 += 4) {
        const int nc = NC - c0 < 4 ? NC - c0 : 4;
        int r = 0;
        for (; r + 2 <= rows; r += 2)
            FS_FN(fs_f32_values_pass)(w + (size_t)r * FS_F32_TILE, 2, v, j0, width, D, c0, nc,
                                      tile + (size_t)r * FS_F32_MAXD, base, anc);
        if (r < rows)
            FS_FN(fs_f32_values_pass)(w + (size_t)r * FS_F32_TILE, 1, v, j0, width, D, c0, nc,
                                      tile + (size_t)r * FS_F32_MAXD, base, anc);
    }
}

/* Bodies compiled for the common head sizes (NC a constant: the loops over chunks unroll and
 * every sum stays in a register), and one for any other size. Not for 128 / W: GCC compiled
 * that fully unrolled body so that a row's bits depended on its neighbours (tests:
 * test_attention_row_is_bit_identical_alone_and_in_a_block, odd groups). */
#define FS_F32_BY_NC(CALL, NC, ...)                                                            \
    do {                                                                                       \
        if (NC == 64 / FS_W) CALL(64 / FS_W, __VA_ARGS__);                                     \
        else if (NC == 32 / FS_W) CALL(32 / FS_W, __VA_ARGS__);                                \
        else CALL(NC, __VA_ARGS__);                                                            \
    } while (0)

/* anc NULL (every call but a tree node's) gets its own bodies: the key rows are plain
 * offsets there, as before trees existed. */
static FS_ATTR void FS_FN(fs_f32_tile_scores)(const float *const *q, int rows, const float *k,
                                              int j0, int width, int NC, float scale, float *s,
                                              int base, const int32_t *anc)
{
#define FS_F32_SCORES(C, B, A) FS_FN(fs_f32_scores)(q, rows, k, j0, width, C, scale, s, B, A)
    if (anc)
        FS_F32_BY_NC(FS_F32_SCORES, NC, base, anc);
    else
        FS_F32_BY_NC(FS_F32_SCORES, NC, 0, NULL);
#undef FS_F32_SCORES
}

static FS_ATTR void FS_FN(fs_f32_tile_values)(const float *w, int rows, const float *v, int j0,
                                              int width, int NC, float *tile, int base,
                                              const int32_t *anc)
{
#define FS_F32_VALUES(C, B, A) FS_FN(fs_f32_values)(w, rows, v, j0, width, C, tile, B, A)
    if (anc)
        FS_F32_BY_NC(FS_F32_VALUES, NC, base, anc);
    else
        FS_F32_BY_NC(FS_F32_VALUES, NC, 0, NULL);
#undef FS_F32_VALUES
}

#undef FS_F32_BY_NC

/* Softmax numerators of one row of a tile, in place: w[j] <- exp(w[j] - m) for j < count and
 * 0 for count <= j < padded (a multiple of 16), where m is the larger of m_in and the row's
 * maximum, returned in *m_out. Returns the sum of the new weights (lanes, then a fixed tree). */
static FS_ATTR float FS_FN(fs_f32_softmax_row)(float *FS_RESTRICT w, int count, int padded,
                                               float m_in, float *m_out)
{
    for (int j = count; j < padded; j++)
        w[j] = -HUGE_VALF;
    FS_VF top = FS_FN(fs_f32_splat)(m_in);
    for (int j = 0; j < padded; j += FS_W) {
        FS_VF x = FS_FN(fs_f32_load)(w + j);
        top = FS_FN(fs_f32_select)(x > top, x, top);
    }
    float m = top[0];
    for (int i = 1; i < FS_W; i++)
        m = top[i] > m ? top[i] : m;
    FS_VF sum = {0};
    for (int j = 0; j < padded; j += FS_W) {
        FS_VF e = FS_FN(fs_f32_exp_nonpos)(w + j, m);
        memcpy(w + j, &e, sizeof e);
        sum += e;
    }
    *m_out = m;
    FS_VF parts[4] = {sum, sum, sum, sum};
    return FS_FN(fs_f32_reduce4)(parts)[0];
}

/* One block of `rows` (<= FS_F32_ROWS) queries reading the same kv head; key j is row
 * fs_f32_key(j, base, anc) (anc NULL: row j). */
static FS_ATTR void FS_FN(fs_f32_block)(const float *const *qrows, float *const *orows,
                                        const int *count, int rows, const float *kh,
                                        const float *vh, int head_dim, float scale, int base,
                                        const int32_t *anc)
{
    float s[FS_F32_ROWS * FS_F32_TILE];
    float tile[FS_F32_ROWS * FS_F32_MAXD];
    double acc[FS_F32_ROWS * FS_F32_MAXD];
    double l[FS_F32_ROWS];
    float m[FS_F32_ROWS];
    int NC = head_dim / FS_W, most = 0;
    for (int r = 0; r < rows; r++) {
        m[r] = -HUGE_VALF;
        l[r] = 0.0;
        most = count[r] > most ? count[r] : most;
    }
    for (int i = 0; i < rows * FS_F32_MAXD; i++)
        acc[i] = 0.0;
    for (int j0 = 0; j0 < most; j0 += FS_F32_TILE) {
        int width = most - j0 < FS_F32_TILE ? most - j0 : FS_F32_TILE;
        FS_FN(fs_f32_tile_scores)(qrows, rows, kh, j0, width, NC, scale, s, base, anc);
        int padded = (width + 15) & ~15;
        for (int r = 0; r < rows; r++) {
            float *sr = s + (size_t)r * FS_F32_TILE;
            int c = count[r] - j0;
            c = c < 0 ? 0 : (c > width ? width : c);
            if (c == 0) { /* the row sees none of these keys */
                for (int j = 0; j < padded; j++)
                    sr[j] = 0.0f;
                continue;
            }
            float top;
            float tile_sum = FS_FN(fs_f32_softmax_row)(sr, c, padded, m[r], &top);
            if (top > m[r]) { /* the running maximum grew: rescale what was summed so far */
                double shrink = m[r] == -HUGE_VALF ? 0.0 : exp((double)m[r] - (double)top);
                l[r] *= shrink;
                for (int d = 0; d < head_dim; d++)
                    acc[(size_t)r * FS_F32_MAXD + d] *= shrink;
                m[r] = top;
            }
            l[r] += (double)tile_sum;
        }
        FS_FN(fs_f32_tile_values)(s, rows, vh, j0, width, NC, tile, base, anc);
        for (int r = 0; r < rows; r++)
            for (int d = 0; d < head_dim; d++)
                acc[(size_t)r * FS_F32_MAXD + d] += (double)tile[(size_t)r * FS_F32_MAXD + d];
    }
    for (int r = 0; r < rows; r++) {
        double inv = 1.0 / l[r];
        for (int d = 0; d < head_dim; d++)
            orows[r][d] = (float)(acc[(size_t)r * FS_F32_MAXD + d] * inv);
    }
}

#undef FS_VF
#undef FS_VI
#undef FS_SFX
#undef FS_ATTR
#undef FS_W
