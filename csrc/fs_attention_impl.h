/* Template body of fs_attention.h's double-accumulating attention: included once per input
 * type with FS_T (float or double) and FS_SFX (f32 or f64) defined (see fs_common.h). No
 * include guard on purpose. */

/* sr[j] = scale * dot(qr, k[j]) for j in [j0, j1), in double (products of two floats are
 * exact in double). Four keys at a time keep independent accumulator chains in flight. */
FS_ALWAYS_INLINE void FS_FN(fs_attn_dots)(const FS_T *FS_RESTRICT qr, const FS_T *FS_RESTRICT k,
                                         int j0, int j1, int D, double scale,
                                         double *FS_RESTRICT sr)
{
    int j = j0;
    for (; j + 4 <= j1; j += 4) {
        const FS_T *k0 = k + (size_t)j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
#if FS_HAVE_VEC
        fs_v8d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int d = 0;
        for (; d + 8 <= D; d += 8) {
            fs_v8d x = FS_FN(fs_load8)(qr + d);
            a0 += x * FS_FN(fs_load8)(k0 + d);
            a1 += x * FS_FN(fs_load8)(k1 + d);
            a2 += x * FS_FN(fs_load8)(k2 + d);
            a3 += x * FS_FN(fs_load8)(k3 + d);
        }
        double t0 = FS_HSUM8(a0), t1 = FS_HSUM8(a1), t2 = FS_HSUM8(a2), t3 = FS_HSUM8(a3);
#else
        double t0 = 0.0, t1 = 0.0, t2 = 0.0, t3 = 0.0;
        int d = 0;
#endif
        for (; d < D; d++) {
            double x = (double)qr[d];
            t0 += x * (double)k0[d];
            t1 += x * (double)k1[d];
            t2 += x * (double)k2[d];
            t3 += x * (double)k3[d];
        }
        sr[j] = scale * t0;
        sr[j + 1] = scale * t1;
        sr[j + 2] = scale * t2;
        sr[j + 3] = scale * t3;
    }
    for (; j < j1; j++) {
        const FS_T *k0 = k + (size_t)j * D;
        double t0 = 0.0;
        for (int d = 0; d < D; d++)
            t0 += (double)qr[d] * (double)k0[d];
        sr[j] = scale * t0;
    }
}

FS_ALWAYS_INLINE void FS_FN(fs_attn_scores_body)(const FS_T *const *q, int rows,
                                                const FS_T *FS_RESTRICT k, int count, int D,
                                                double scale, double *s, int stride)
{
    for (int j0 = 0; j0 < count; j0 += FS_ATTN_TILE) {
        int j1 = count - j0 < FS_ATTN_TILE ? count : j0 + FS_ATTN_TILE;
        for (int r = 0; r < rows; r++)
            FS_FN(fs_attn_dots)(q[r], k, j0, j1, D, scale, s + (size_t)r * stride);
    }
}

/* Scores of `rows` queries against keys [0, count), into s + r * stride. Common head
 * sizes get their own compiled body (loops fully unrolled, accumulators in registers). */
FS_CLONES static void FS_FN(fs_attn_scores)(const FS_T *const *q, int rows,
                                            const FS_T *FS_RESTRICT k,
                                           int count, int D, double scale, double *s,
                                           int stride)
{
    if (D == 64)
        FS_FN(fs_attn_scores_body)(q, rows, k, count, 64, scale, s, stride);
    else if (D == 128)
        FS_FN(fs_attn_scores_body)(q, rows, k, count, 128, scale, s, stride);
    else if (D == 32)
        FS_FN(fs_attn_scores_body)(q, rows, k, count, 32, scale, s, stride);
    else
        FS_FN(fs_attn_scores_body)(q, rows, k, count, D, scale, s, stride);
}

/* ar[0:W) += sum_j wr[j] * v[j][d0:d0+W) for j in [j0, j1), four keys per pass over ar. */
FS_ALWAYS_INLINE void FS_FN(fs_attn_axpy)(const double *FS_RESTRICT wr, const FS_T *FS_RESTRICT v,
                                         int j0, int j1, int D, int d0, int W,
                                         double *FS_RESTRICT ar)
{
    int j = j0;
    for (; j + 4 <= j1; j += 4) {
        const FS_T *v0 = v + (size_t)j * D + d0, *v1 = v0 + D, *v2 = v1 + D, *v3 = v2 + D;
        double w0 = wr[j], w1 = wr[j + 1], w2 = wr[j + 2], w3 = wr[j + 3];
        for (int d = 0; d < W; d++)
            ar[d] += (w0 * (double)v0[d] + w1 * (double)v1[d])
                     + (w2 * (double)v2[d] + w3 * (double)v3[d]);
    }
    for (; j < j1; j++) {
        const FS_T *v0 = v + (size_t)j * D + d0;
        double w0 = wr[j];
        for (int d = 0; d < W; d++)
            ar[d] += w0 * (double)v0[d];
    }
}

FS_ALWAYS_INLINE void FS_FN(fs_attn_wsum_body)(const double *w, int stride, const int *count,
                                              int rows, const FS_T *FS_RESTRICT v, int D,
                                              int d0, int W, double *FS_RESTRICT acc)
{
    int most = 0;
    for (int r = 0; r < rows; r++)
        most = count[r] > most ? count[r] : most;
    for (int j0 = 0; j0 < most; j0 += FS_ATTN_TILE) {
        int j1 = most - j0 < FS_ATTN_TILE ? most : j0 + FS_ATTN_TILE;
        for (int r = 0; r < rows; r++) {
            int end = count[r] < j1 ? count[r] : j1;
            if (end > j0)
                FS_FN(fs_attn_axpy)(w + (size_t)r * stride, v, j0, end, D, d0, W,
                                   acc + (size_t)r * FS_ATTN_DCHUNK);
        }
    }
}

/* acc[r][0:W) += sum_j w[r][j] * v[j][d0:d0+W) for j < count[r]. */
FS_CLONES static void FS_FN(fs_attn_wsum)(const double *w, int stride, const int *count,
                                         int rows, const FS_T *FS_RESTRICT v, int D,
                                         int d0, int W, double *FS_RESTRICT acc)
{
    if (D == 64 && W == 64)
        FS_FN(fs_attn_wsum_body)(w, stride, count, rows, v, 64, 0, 64, acc);
    else if (D == 128 && W == 128)
        FS_FN(fs_attn_wsum_body)(w, stride, count, rows, v, 128, 0, 128, acc);
    else if (D == 32 && W == 32)
        FS_FN(fs_attn_wsum_body)(w, stride, count, rows, v, 32, 0, 32, acc);
    else
        FS_FN(fs_attn_wsum_body)(w, stride, count, rows, v, D, d0, W, acc);
}

/* One block of `rows` queries that read the same kv head; w holds rows * stride doubles.
 * mrows (NULL: no tree mask): row r sees key base + j only if mrows[r][j] (see fs_attn_hide). */
static void FS_FN(fs_attn_block)(const FS_T *const *qrows, FS_T *const *orows, const int *count,
                                int rows, const FS_T *kh, const FS_T *vh, int head_dim,
                                double scale, double *w, int stride,
                                const uint8_t *const *mrows, int base)
{
    double total[FS_ATTN_ROWS];
    double acc[FS_ATTN_ROWS * FS_ATTN_DCHUNK];
    int most = 0;
    for (int r = 0; r < rows; r++)
        if (count[r] > most)
            most = count[r];
    FS_FN(fs_attn_scores)(qrows, rows, kh, most, head_dim, scale, w, stride);
    for (int r = 0; r < rows; r++) {
        double *wr = w + (size_t)r * stride;
        if (mrows)
            fs_attn_hide(wr, 0, count[r], mrows[r], base);
        double m = wr[0];
        for (int j = 1; j < count[r]; j++)
            m = wr[j] > m ? wr[j] : m;
        total[r] = fs_exp_sum(wr, count[r], m);
    }
    for (int d0 = 0; d0 < head_dim; d0 += FS_ATTN_DCHUNK) {
        int width = head_dim - d0 < FS_ATTN_DCHUNK ? head_dim - d0 : FS_ATTN_DCHUNK;
        for (int i = 0; i < rows * FS_ATTN_DCHUNK; i++)
            acc[i] = 0.0;
        FS_FN(fs_attn_wsum)(w, stride, count, rows, vh, head_dim, d0, width, acc);
        for (int r = 0; r < rows; r++) {
            double inv = 1.0 / total[r];
            for (int d = 0; d < width; d++)
                orows[r][d0 + d] = (FS_T)(acc[(size_t)r * FS_ATTN_DCHUNK + d] * inv);
        }
    }
}

/* Several rows over a long key range with an online softmax (flash-attention style): keys
 * come in tiles of FS_ATTN_ONLINE_TILE, each row keeps its running maximum m, its sum of
 * weights l and its weighted sum of values, rescaled by exp(m_old - m_new) when the maximum
 * grows. The K/V tiles are read once for the whole block; head_dim <= FS_ATTN_DCHUNK. */
static void FS_FN(fs_attn_online)(const FS_T *const *qrows, FS_T *const *orows, const int *count,
                                 int rows, const FS_T *kh, const FS_T *vh, int head_dim,
                                 double scale, const uint8_t *const *mrows, int base)
{
    double s[FS_ATTN_ROWS * FS_ATTN_ONLINE_TILE];
    double acc[FS_ATTN_ROWS * FS_ATTN_DCHUNK];
    double m[FS_ATTN_ROWS], l[FS_ATTN_ROWS];
    int most = 0;
    for (int r = 0; r < rows; r++) {
        m[r] = -HUGE_VAL;
        l[r] = 0.0;
        most = count[r] > most ? count[r] : most;
    }
    for (int i = 0; i < rows * FS_ATTN_DCHUNK; i++)
        acc[i] = 0.0;
    for (int j0 = 0; j0 < most; j0 += FS_ATTN_ONLINE_TILE) {
        int width = most - j0 < FS_ATTN_ONLINE_TILE ? most - j0 : FS_ATTN_ONLINE_TILE;
        int visible[FS_ATTN_ROWS];
        FS_FN(fs_attn_scores)(qrows, rows, kh + (size_t)j0 * head_dim, width, head_dim, scale,
                             s, FS_ATTN_ONLINE_TILE);
        for (int r = 0; r < rows; r++) {
            int c = count[r] - j0;
            c = c < 0 ? 0 : (c > width ? width : c);
            visible[r] = c;
            if (c == 0)
                continue;
            double *sr = s + (size_t)r * FS_ATTN_ONLINE_TILE;
            if (mrows)
                fs_attn_hide(sr, j0, j0 + c, mrows[r], base);
            double top = sr[0];
            for (int j = 1; j < c; j++)
                top = sr[j] > top ? sr[j] : top;
            if (top == -HUGE_VAL) {  /* every key of the tile hidden by the tree mask */
                visible[r] = 0;
                continue;
            }
            if (top > m[r]) {
                double shrink = m[r] == -HUGE_VAL ? 0.0 : exp(m[r] - top);
                l[r] *= shrink;
                for (int d = 0; d < head_dim; d++)
                    acc[(size_t)r * FS_ATTN_DCHUNK + d] *= shrink;
                m[r] = top;
            }
            l[r] += fs_exp_sum(sr, c, m[r]);
        }
        FS_FN(fs_attn_wsum)(s, FS_ATTN_ONLINE_TILE, visible, rows,
                           vh + (size_t)j0 * head_dim, head_dim, 0, head_dim, acc);
    }
    for (int r = 0; r < rows; r++) {
        double inv = 1.0 / l[r];
        for (int d = 0; d < head_dim; d++)
            orows[r][d] = (FS_T)(acc[(size_t)r * FS_ATTN_DCHUNK + d] * inv);
    }
}

/* mask (NULL: none): the tree mask of fs_attention_masked_<sfx> (fs_attention.h), applied
 * to the keys each row sees by `causal`. */
static void FS_FN(fs_attention_dbl)(const FS_T *q, const FS_T *k, const FS_T *v, FS_T *out,
                                   int n, int n_heads, int n_kv_heads, int head_dim,
                                   int capacity, int length, int causal, const uint8_t *mask,
                                   double *scratch)
{
    int group = n_heads / n_kv_heads;
    int rows_per_kv = n * group; /* row index t = i * group + g, head h = kv * group + g */
    double scale = 1.0 / sqrt((double)head_dim);
    /* Short ranges: exact two-pass softmax, scores of a block of rows in a stack buffer.
     * Long ranges, one row per kv head (decode): two passes with the caller's scratch.
     * Long ranges, several rows: online softmax over key tiles, K/V read once per block. */
    double stack_w[FS_ATTN_ROWS * 1024];
    int online = length > 1024 && rows_per_kv > 1 && head_dim <= FS_ATTN_DCHUNK;
    int block = length <= 1024 || online ? FS_ATTN_ROWS : 1;
    double *w = length <= 1024 ? stack_w : scratch;
    int stride = length <= 1024 ? 1024 : length;
    for (int kv = 0; kv < n_kv_heads; kv++) {
        const FS_T *kh = k + (size_t)kv * capacity * head_dim;
        const FS_T *vh = v + (size_t)kv * capacity * head_dim;
        for (int t0 = 0; t0 < rows_per_kv; t0 += block) {
            const FS_T *qrows[FS_ATTN_ROWS];
            FS_T *orows[FS_ATTN_ROWS];
            const uint8_t *mrows[FS_ATTN_ROWS];
            int count[FS_ATTN_ROWS];
            int rows = rows_per_kv - t0 < block ? rows_per_kv - t0 : block;
            for (int r = 0; r < rows; r++) {
                size_t at;
                count[r] = fs_attn_row(kv, t0 + r, group, n, n_heads, head_dim, length, causal,
                                       &at);
                qrows[r] = q + at;
                orows[r] = out + at;
                mrows[r] = mask ? mask + (size_t)((t0 + r) / group) * n : NULL;
            }
            const uint8_t *const *mr = mask ? mrows : NULL;
            if (online)
                FS_FN(fs_attn_online)(qrows, orows, count, rows, kh, vh, head_dim, scale, mr,
                                     length - n);
            else
                FS_FN(fs_attn_block)(qrows, orows, count, rows, kh, vh, head_dim, scale, w,
                                    stride, mr, length - n);
        }
    }
}

#undef FS_T
#undef FS_SFX
