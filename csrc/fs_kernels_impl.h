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
