/* fs_attention_f32.h -- the float32 attention kernel: float arithmetic in registers inside
 * tiles of keys, double across tiles. Included by fs_attention.h (not on its own).
 *
 * Why a separate float32 kernel: the double-accumulating template spends most of its time
 * converting floats to doubles (one conversion per multiply), ~7 GMAC/s. Here the products
 * and their sums stay in float vectors of 16 lanes, so one fused multiply-add does 16 MACs:
 *
 *   scores:   s[r][j] = scale * dot(q[r], k[j]), four keys per pass, their four 16-lane
 *             partial sums reduced together by one shuffle tree (fs_f32_reduce4);
 *   softmax:  online over tiles of FS_F32_TILE keys (a running maximum m, and the sum of
 *             weights l in double, rescaled by exp(m_old - m_new) when m grows), exp in float;
 *   values:   per tile, acc[r][:] += w[r][j] * v[j][:] in float registers, then the tile's
 *             sum is added to a double accumulator.
 *
 * Error: float sums run over at most head_dim / 16 chunks (dot products, 16 lanes) or
 * FS_F32_TILE keys (weighted values); tiles are added in double, so the result is within
 * ~1e-6 relative of the float64 formula at any length (tests: 1e-5).
 *
 * Determinism across n: the arithmetic of one query row (the order of every sum, the tile
 * boundaries, the reduction tree) does not depend on which other rows share its block, so
 * a position's output is bit-identical whether it is computed alone (decode, n = 1) or inside
 * a block of queries (verification). Greedy speculative decoding relies on this.
 *
 * Handles head_dim a multiple of 16 up to 128 (fs_f32_supported); others use the double
 * template.
 */
#ifndef FS_ATTENTION_F32_H
#define FS_ATTENTION_F32_H

#include "fs_common.h"

#if FS_HAVE_VEC

#define FS_F32_TILE 128
#define FS_F32_ROWS 4
#define FS_F32_MAXD 128

static inline int fs_f32_supported(int head_dim)
{
    return head_dim % 16 == 0 && head_dim <= FS_F32_MAXD;
}

/* The four horizontal sums of a[0..3], as lanes 0, 4, 8, 12 of the result. Every input goes
 * through the same tree (halves, then quarters, then pairs), so a sum does not depend on its
 * neighbours. (Inputs by pointer: 64-byte vector arguments draw a GCC ABI note.) */
FS_ALWAYS_INLINE fs_v16f fs_f32_reduce4(const fs_v16f *a)
{
    fs_v16f a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    const fs_v16i lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const fs_v16i hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const fs_v16i lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const fs_v16i hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const fs_v16i swap2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
    const fs_v16i swap1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
    fs_v16f u = __builtin_shuffle(a0, a1, lo8) + __builtin_shuffle(a0, a1, hi8);
    fs_v16f w = __builtin_shuffle(a2, a3, lo8) + __builtin_shuffle(a2, a3, hi8);
    fs_v16f z = __builtin_shuffle(u, w, lo4) + __builtin_shuffle(u, w, hi4);
    z = z + __builtin_shuffle(z, swap2);
    return z + __builtin_shuffle(z, swap1);
}

/* Lane-wise select: mask lanes (all ones) take a, the others b. */
#define FS_SELECT16(mask, a, b) ((fs_v16f)(((mask) & (fs_v16i)(a)) | (~(mask) & (fs_v16i)(b))))

FS_ALWAYS_INLINE fs_v16f fs_splat16(float x) { return (fs_v16f){0} + x; }

/* exp(x) lane-wise for x = src[0:16) - shift <= 0, in float: 2^k * p(r) with |r| <= ln2/2 and a degree-7
 * polynomial (relative error ~2e-7); x < -87 (-inf included) gives 0. */
FS_ALWAYS_INLINE fs_v16f fs_expf16_nonpos(const float *src, float shift)
{
    fs_v16f x = fs_load16(src) - shift;
    const fs_v16f lowest = fs_splat16(-87.0f), shifter = fs_splat16(12582912.0f); /* 1.5*2^23 */
    const fs_v16f ln2_hi = fs_splat16(0.693145752f), ln2_lo = fs_splat16(1.42860677e-6f);
    fs_v16i dead = x < lowest;
    fs_v16f xc = FS_SELECT16(dead, lowest, x);
    fs_v16f kd = xc * 1.44269504f + shifter; /* round to nearest integer in the low bits */
    fs_v16i k = (fs_v16i)kd - 0x4B400000;     /* minus the bits of the shifter */
    kd -= shifter;
    fs_v16f r = (xc - kd * ln2_hi) - kd * ln2_lo;
    fs_v16f p = fs_splat16(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    fs_v16f two_k = (fs_v16f)((k + 127) << 23); /* k in [-126, 0] */
    return FS_SELECT16(dead, fs_splat16(0.0f), p * two_k);
}

/* s[r * FS_F32_TILE + j] = scale * dot(q[r], k[j]) for j < width; NC = head_dim / 16. */
FS_ALWAYS_INLINE void fs_f32_scores(const float *const *q, int rows, const float *FS_RESTRICT k,
                                    int width, int NC, float scale, float *FS_RESTRICT s)
{
    const fs_v16f zero = {0};
    const int D = NC * 16;
    for (int r = 0; r < rows; r++) {
        fs_v16f qv[FS_F32_MAXD / 16];
        for (int c = 0; c < NC; c++)
            qv[c] = fs_load16(q[r] + 16 * c);
        float *sr = s + (size_t)r * FS_F32_TILE;
        for (int j = 0; j < width; j += 4) {
            int left = width - j;
            const float *k0 = k + (size_t)j * D;
            fs_v16f a0 = qv[0] * fs_load16(k0), a1 = zero, a2 = zero, a3 = zero;
            for (int c = 1; c < NC; c++)
                a0 += qv[c] * fs_load16(k0 + 16 * c);
            if (left >= 4) {
                const float *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
                a1 = qv[0] * fs_load16(k1);
                a2 = qv[0] * fs_load16(k2);
                a3 = qv[0] * fs_load16(k3);
                for (int c = 1; c < NC; c++) {
                    a1 += qv[c] * fs_load16(k1 + 16 * c);
                    a2 += qv[c] * fs_load16(k2 + 16 * c);
                    a3 += qv[c] * fs_load16(k3 + 16 * c);
                }
            } else {
                /* the same chains, key by key, for the last 1-3 keys of the tile */
                if (left >= 2) {
                    const float *k1 = k0 + D;
                    a1 = qv[0] * fs_load16(k1);
                    for (int c = 1; c < NC; c++)
                        a1 += qv[c] * fs_load16(k1 + 16 * c);
                }
                if (left >= 3) {
                    const float *k2 = k0 + 2 * D;
                    a2 = qv[0] * fs_load16(k2);
                    for (int c = 1; c < NC; c++)
                        a2 += qv[c] * fs_load16(k2 + 16 * c);
                }
            }
            fs_v16f parts[4] = {a0, a1, a2, a3};
            fs_v16f t = fs_f32_reduce4(parts);
            float sums[4] = {t[0], t[4], t[8], t[12]};
            for (int i = 0; i < 4 && i < left; i++)
                sr[j + i] = sums[i] * scale;
        }
    }
}

/* tile[r][0:D) = sum_{j < width} w[r][j] * v[j][0:D) in float, D in chunks of 64. Rows whose
 * weights are zero beyond their visible keys add exact zeros. */
FS_ALWAYS_INLINE void fs_f32_values(const float *FS_RESTRICT w, int rows, const float *FS_RESTRICT v,
                                    int width, int NC, float *FS_RESTRICT tile)
{
    const int D = NC * 16;
    for (int c0 = 0; c0 < NC; c0 += 4) {
        int nc = NC - c0 < 4 ? NC - c0 : 4;
        fs_v16f acc[FS_F32_ROWS][4];
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < nc; c++)
                acc[r][c] = (fs_v16f){0};
        for (int j = 0; j < width; j++) {
            const float *vj = v + (size_t)j * D + 16 * c0;
            fs_v16f vv[4];
            for (int c = 0; c < nc; c++)
                vv[c] = fs_load16(vj + 16 * c);
            for (int r = 0; r < rows; r++) {
                float wr = w[(size_t)r * FS_F32_TILE + j];
                for (int c = 0; c < nc; c++)
                    acc[r][c] += wr * vv[c];
            }
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < nc; c++)
                FS_STORE16(tile + (size_t)r * FS_F32_MAXD + 16 * (c0 + c), acc[r][c]);
    }
}

/* Dispatch to bodies compiled for a constant row count and head size, so that the loops over
 * rows and 16-lane chunks unroll and their accumulators stay in registers. */
#define FS_F32_FOR_SHAPES(CALL, rows, NC)                                                      \
    do {                                                                                       \
        if (NC == 4) {                                                                         \
            if (rows == 4) CALL(4, 4); else if (rows == 3) CALL(3, 4);                         \
            else if (rows == 2) CALL(2, 4); else CALL(1, 4);                                   \
        } else if (NC == 8) {                                                                  \
            if (rows == 4) CALL(4, 8); else if (rows == 3) CALL(3, 8);                         \
            else if (rows == 2) CALL(2, 8); else CALL(1, 8);                                   \
        } else if (NC == 2) {                                                                  \
            if (rows == 4) CALL(4, 2); else if (rows == 3) CALL(3, 2);                         \
            else if (rows == 2) CALL(2, 2); else CALL(1, 2);                                   \
        } else {                                                                               \
            CALL(rows, NC);                                                                    \
        }                                                                                      \
    } while (0)

FS_CLONES static void fs_f32_tile_scores(const float *const *q, int rows, const float *k,
                                         int width, int NC, float scale, float *s)
{
#define FS_F32_SCORES(R, C) fs_f32_scores(q, R, k, width, C, scale, s)
    FS_F32_FOR_SHAPES(FS_F32_SCORES, rows, NC);
#undef FS_F32_SCORES
}

FS_CLONES static void fs_f32_tile_values(const float *w, int rows, const float *v, int width,
                                         int NC, float *tile)
{
#define FS_F32_VALUES(R, C) fs_f32_values(w, R, v, width, C, tile)
    FS_F32_FOR_SHAPES(FS_F32_VALUES, rows, NC);
#undef FS_F32_VALUES
}

/* Softmax numerators of one row of a tile, in place: w[j] <- exp(w[j] - m) for j < count and
 * 0 for count <= j < padded (a multiple of 16), where m is the larger of m_in and the row's
 * maximum, returned in *m_out. Returns the sum of the new weights (lanes, then a fixed tree). */
FS_CLONES static float fs_f32_softmax_row(float *FS_RESTRICT w, int count, int padded,
                                          float m_in, float *m_out)
{
    for (int j = count; j < padded; j++)
        w[j] = -HUGE_VALF;
    fs_v16f top = fs_splat16(m_in);
    for (int j = 0; j < padded; j += 16) {
        fs_v16f x = fs_load16(w + j);
        top = FS_SELECT16(x > top, x, top);
    }
    float m = top[0];
    for (int i = 1; i < 16; i++)
        m = top[i] > m ? top[i] : m;
    fs_v16f sum = {0};
    for (int j = 0; j < padded; j += 16) {
        fs_v16f e = fs_expf16_nonpos(w + j, m);
        FS_STORE16(w + j, e);
        sum += e;
    }
    *m_out = m;
    fs_v16f parts[4] = {sum, sum, sum, sum};
    fs_v16f t = fs_f32_reduce4(parts);
    return t[0];
}

/* One block of `rows` (<= FS_F32_ROWS) queries reading the same kv head. */
static void fs_f32_block(const float *const *qrows, float *const *orows, const int *count,
                         int rows, const float *kh, const float *vh, int head_dim, float scale)
{
    float s[FS_F32_ROWS * FS_F32_TILE];
    float tile[FS_F32_ROWS * FS_F32_MAXD];
    double acc[FS_F32_ROWS * FS_F32_MAXD];
    double l[FS_F32_ROWS];
    float m[FS_F32_ROWS];
    int NC = head_dim / 16, most = 0;
    for (int r = 0; r < rows; r++) {
        m[r] = -HUGE_VALF;
        l[r] = 0.0;
        most = count[r] > most ? count[r] : most;
    }
    for (int i = 0; i < rows * FS_F32_MAXD; i++)
        acc[i] = 0.0;
    for (int j0 = 0; j0 < most; j0 += FS_F32_TILE) {
        int width = most - j0 < FS_F32_TILE ? most - j0 : FS_F32_TILE;
        fs_f32_tile_scores(qrows, rows, kh + (size_t)j0 * head_dim, width, NC, scale, s);
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
            float tile_sum = fs_f32_softmax_row(sr, c, padded, m[r], &top);
            if (top > m[r]) { /* the running maximum grew: rescale what was summed so far */
                double shrink = m[r] == -HUGE_VALF ? 0.0 : exp((double)m[r] - (double)top);
                l[r] *= shrink;
                for (int d = 0; d < head_dim; d++)
                    acc[(size_t)r * FS_F32_MAXD + d] *= shrink;
                m[r] = top;
            }
            l[r] += (double)tile_sum;
        }
        fs_f32_tile_values(s, rows, vh + (size_t)j0 * head_dim, width, NC, tile);
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

/* Same contract as fs_attention_f64 (see fs_attention.h); head_dim must pass
 * fs_f32_supported. Query rows of a kv head are taken FS_F32_ROWS at a time. */
static void fs_attention_f32_tiled(const float *q, const float *k, const float *v, float *out,
                                   int n, int n_heads, int n_kv_heads, int head_dim,
                                   int capacity, int length, int causal)
{
    int group = n_heads / n_kv_heads;
    int rows_per_kv = n * group; /* row t = i * group + g reads query i, head kv * group + g */
    float scale = (float)(1.0 / sqrt((double)head_dim));
    for (int kv = 0; kv < n_kv_heads; kv++) {
        const float *kh = k + (size_t)kv * capacity * head_dim;
        const float *vh = v + (size_t)kv * capacity * head_dim;
        for (int t0 = 0; t0 < rows_per_kv; t0 += FS_F32_ROWS) {
            const float *qrows[FS_F32_ROWS];
            float *orows[FS_F32_ROWS];
            int count[FS_F32_ROWS];
            int rows = rows_per_kv - t0 < FS_F32_ROWS ? rows_per_kv - t0 : FS_F32_ROWS;
            for (int r = 0; r < rows; r++) {
                int i = (t0 + r) / group, h = kv * group + (t0 + r) % group;
                qrows[r] = q + ((size_t)i * n_heads + h) * head_dim;
                orows[r] = out + ((size_t)i * n_heads + h) * head_dim;
                count[r] = causal ? length - n + i + 1 : length;
            }
            fs_f32_block(qrows, orows, count, rows, kh, vh, head_dim, scale);
        }
    }
}

#endif /* FS_HAVE_VEC */
#endif /* FS_ATTENTION_F32_H */
