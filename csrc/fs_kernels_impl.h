/* Template body of fs_kernels.h: included once per element type with FS_T (float or
 * double), FS_SFX (f32 or f64), FS_BITS (the signed integer of FS_T's size), FS_FINITE_MAX
 * (the bit pattern of the largest finite FS_T) and FS_MAGNITUDE (every bit but the sign)
 * defined (see fs_common.h). No include guard on purpose. */

/* 1 when every element of x[0:n) is finite. */
FS_CLONES static int FS_FN(fs_all_finite)(const FS_T *FS_RESTRICT x, long n)
{
    FS_BITS hi = 0;
    for (long j = 0; j < n; j++) {
        FS_BITS b;
        memcpy(&b, x + j, sizeof b);
        b &= (FS_BITS)(FS_MAGNITUDE); /* drop the sign bit */
        hi = b > hi ? b : hi;
    }
    return hi <= (FS_BITS)(FS_FINITE_MAX);
}

/* max of x[0:n) in double, n >= 1, every element finite. */
FS_FINITE_MATH FS_CLONES static double FS_FN(fs_max)(const FS_T *FS_RESTRICT x, long n)
{
    double m = (double)x[0];
    for (long i = 1; i < n; i++) {
        double v = (double)x[i];
        m = v > m ? v : m;
    }
    return m;
}

/* Index of the first maximum of x[0:n), n >= 1, finite: SIMD maxima of blocks of 256, then
 * a scalar search inside the first block that holds the overall maximum. */
static long FS_FN(fs_argmax)(const FS_T *FS_RESTRICT x, long n)
{
    double best = FS_FN(fs_max)(x, n < 256 ? n : 256);
    long best_block = 0;
    for (long j0 = 256; j0 < n; j0 += 256) {
        double m = FS_FN(fs_max)(x + j0, n - j0 < 256 ? n - j0 : 256);
        if (m > best) {
            best = m;
            best_block = j0;
        }
    }
    long i = best_block;
    while ((double)x[i] != best)
        i++;
    return i;
}

/* The inverse-CDF draw of _reference._inverse_cdf over w = x (as double), except position
 * `skip` (-1: none) which counts as 0: the first j with cumsum(w)[j] > u * sum(w), else the
 * last j with w[j] > 0. The prefix sums are sequential, exactly as numpy.cumsum computes
 * them; the sum at the end of every block of FS_CDF_BLOCK is kept in ends[] (the caller
 * provides FS_CDF_CHECKPOINTS(n) doubles), so the crossing block is a binary search (sums of
 * non-negative weights never decrease) and only that block is summed again, from the same
 * starting value, which repeats the same additions bit for bit. */
static long FS_FN(fs_inverse_cdf)(const FS_T *FS_RESTRICT x, long n, long skip, double u,
                                 double *FS_RESTRICT ends)
{
    double run = 0.0;
    long blocks = 0;
    for (long j0 = 0; j0 < n; j0 += FS_CDF_BLOCK) {
        long j1 = n - j0 < FS_CDF_BLOCK ? n : j0 + FS_CDF_BLOCK;
        for (long j = j0; j < j1; j++)
            run += j == skip ? 0.0 : (double)x[j];
        ends[blocks++] = run;
    }
    double target = u * run;
    long b = fs_first_above(ends, blocks, target);
    if (b < blocks) {
        double again = b > 0 ? ends[b - 1] : 0.0;
        for (long j = b * FS_CDF_BLOCK; j < n; j++) {
            again += j == skip ? 0.0 : (double)x[j];
            if (again > target)
                return j;
        }
    }
    for (long j = n - 1; j > 0; j--)
        if (j != skip && (double)x[j] > 0.0)
            return j;
    return 0;
}

/* The same draw over max(p - q, 0) (double); returns -1 when that residual is all zero.
 * finite-math lets max(r, 0) be a branch-free maxsd (it never reorders a sum). */
FS_FINITE_MATH static long FS_FN(fs_residual_draw)(const FS_T *FS_RESTRICT p,
                                                  const FS_T *FS_RESTRICT q,
                                                  long n, double u, double *FS_RESTRICT ends)
{
    double run = 0.0;
    long blocks = 0;
    for (long j0 = 0; j0 < n; j0 += FS_CDF_BLOCK) {
        long j1 = n - j0 < FS_CDF_BLOCK ? n : j0 + FS_CDF_BLOCK;
        for (long j = j0; j < j1; j++) {
            double r = (double)p[j] - (double)q[j];
            run += r > 0.0 ? r : 0.0;
        }
        ends[blocks++] = run;
    }
    if (!(run > 0.0))
        return -1;
    double target = u * run;
    long b = fs_first_above(ends, blocks, target);
    if (b < blocks) {
        double again = b > 0 ? ends[b - 1] : 0.0;
        for (long j = b * FS_CDF_BLOCK; j < n; j++) {
            double r = (double)p[j] - (double)q[j];
            again += r > 0.0 ? r : 0.0;
            if (again > target)
                return j;
        }
    }
    for (long j = n - 1; j > 0; j--)
        if ((double)p[j] - (double)q[j] > 0.0)
            return j;
    return 0;
}

/* 1 when one of x[0:16) is above t: compares on 32-byte vectors (GCC leaves the scalar loop
 * of this test scalar, and lowers 64-byte vector compares to scalars on AVX2). */
FS_ALWAYS_INLINE int FS_FN(fs_any_above)(const FS_T *x, FS_T t)
{
    typedef FS_T vec __attribute__((vector_size(32)));
    typedef FS_BITS mask __attribute__((vector_size(32)));
    const vec tv = (vec){0} + t;
    mask any = {0};
    for (int i = 0; i < 16; i += (int)(32 / sizeof(FS_T))) {
        vec v;
        memcpy(&v, x + i, sizeof v);
        any |= v > tv;
    }
    uint64_t w[4];
    memcpy(w, &any, sizeof w);
    return (w[0] | w[1] | w[2] | w[3]) != 0;
}

/* The k-th largest of x[0:n) (duplicates counted), 0 < k < n, in double. A small k keeps the
 * k largest in a min-heap (heap: k doubles) behind a branch-free test of 16 elements at a time
 * against its minimum, so most of a large vocabulary costs one vector compare (quickselect's
 * data-dependent branches cost ~8x more at V = 151936, k = 50); a large k runs fs_select_kth
 * on a copy (heap: n doubles). */
FS_CLONES static double FS_FN(fs_kth_largest)(const FS_T *FS_RESTRICT x, long n, long k,
                                            double *FS_RESTRICT heap)
{
    if (k * 64 > n) {
        for (long j = 0; j < n; j++) heap[j] = (double)x[j];
        return fs_select_kth(heap, n, n - k);
    }
    for (long j = 0; j < k; j++) heap[j] = (double)x[j];
    for (long j = k / 2; j-- > 0;) fs_heap_sift_down(heap, k, j);
    long j = k;
    for (; j + 16 <= n; j += 16) {
        if (FS_FN(fs_any_above)(x + j, (FS_T)heap[0])) /* exact: the heap holds elements of x */
            for (int i = 0; i < 16; i++)
                if ((double)x[j + i] > heap[0]) {
                    heap[0] = (double)x[j + i];
                    fs_heap_sift_down(heap, k, 0);
                }
    }
    for (; j < n; j++)
        if ((double)x[j] > heap[0]) {
            heap[0] = (double)x[j];
            fs_heap_sift_down(heap, k, 0);
        }
    return heap[0];
}

/* Top-k of the row x[0:n) at temperature t > 0, 0 < k < n. Keeps every token whose scaled
 * logit (double)x[j] / t is at least the k-th largest scaled logit (ties kept): the set a
 * selection over the scaled row keeps, found without scaling the row. Scaling is monotone, so
 * the k-th largest scaled logit is zk = the k-th largest x, scaled; when the next FS_T below
 * that x scales to less than zk, "scaled >= zk" is exactly "x >= that x" (a vector compare);
 * otherwise (scaling merged neighbours) every token is scaled and compared. Writes the kept
 * indices, ascending, to kept and their scaled logits to z; returns their count. *zmax = the
 * largest scaled logit. scratch: n doubles. */
FS_CLONES static long FS_FN(fs_top_k_scaled)(const FS_T *FS_RESTRICT x, long n, long k, double t,
                                           int32_t *FS_RESTRICT kept, double *FS_RESTRICT z,
                                           double *FS_RESTRICT scratch, double *zmax)
{
    const FS_T kth = (FS_T)FS_FN(fs_kth_largest)(x, n, k, scratch);
    const double zk = (double)kth / t;
    const FS_T below = sizeof(FS_T) == sizeof(float) ? (FS_T)nextafterf((float)kth, -INFINITY)
                                                     : (FS_T)nextafter((double)kth, -INFINITY);
    const int exact = (double)below / t < zk;
    double top = zk;
    long m = 0;
    long j = 0;
    /* x >= kth is x > the next FS_T below it */
    for (; j < n; j += 16) {
        const int len = n - j < 16 ? (int)(n - j) : 16;
        if (exact && len == 16 && !FS_FN(fs_any_above)(x + j, below))
            continue;
        for (int i = 0; i < len; i++) {
            const double v = (double)x[j + i] / t;
            if (exact ? x[j + i] >= kth : v >= zk) {
                kept[m] = (int32_t)(j + i);
                z[m++] = v;
                top = v > top ? v : top;
            }
        }
    }
    *zmax = top;
    return m;
}

/* z[j] = x[j] / temperature (double); returns max z. */
FS_CLONES static double FS_FN(fs_scale_row)(const FS_T *FS_RESTRICT x, long n, double temperature,
                                          double *FS_RESTRICT z)
{
    for (long i = 0; i < n; i++)
        z[i] = (double)x[i] / temperature;
    return fs_max_f64(z, n);
}

/* out[j] = (FS_T)(z[j] / total) */
FS_CLONES static void FS_FN(fs_store_scaled)(const double *FS_RESTRICT z, long n, double total,
                                           FS_T *FS_RESTRICT out)
{
    for (long j = 0; j < n; j++)
        out[j] = (FS_T)(z[j] / total);
}

#undef FS_T
#undef FS_SFX
#undef FS_BITS
#undef FS_FINITE_MAX
#undef FS_MAGNITUDE
