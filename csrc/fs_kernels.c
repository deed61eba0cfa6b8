/* fs_kernels.c -- C inner loops of the sampling and verification kernels (fs_kernels.h). */
#include <float.h>

#include "fs_common.h"
#include "fs_kernels.h"

FS_CLONES double fs_exp_sum(double *FS_RESTRICT s, int count, double m)
{
    double total = 0.0;
    for (int j = 0; j < count; j++) {
        double e = fs_exp_nonpos(s[j] - m);
        s[j] = e;
        total += e;
    }
    return total;
}


/* For loops over data already checked finite: lets GCC turn `a > b ? a : b` into SIMD max.
 * Never used where NaN or inf must be detected; it never reorders a sum. */
#if defined(__GNUC__) && !defined(__clang__)
#define FS_FINITE_MATH __attribute__((optimize("finite-math-only", "no-signed-zeros")))
#else
#define FS_FINITE_MATH
#endif

/* ---- data scans used by the argument checks ------------------------------------------ */
/* The checks read bit patterns. In the fused scan (one pass: sum and validity) a flag word
 * collects, with integer ops only (no compares, so it vectorises everywhere), the sign bit
 * and "exponent field all ones" (exponent + 1 carries into the next bit): a row with no flag
 * is finite and non-negative. A set sign bit may be -0.0, which is valid: such rows get an
 * exact scalar re-check. The finite-only scan compares the pattern without its sign bit to
 * the largest finite one (integer max). */

#define FS_F32_FINITE_MAX 0x7f7fffff
#define FS_F64_FINITE_MAX 0x7fefffffffffffffLL

FS_ALWAYS_INLINE uint32_t fs_flags_f32(uint32_t b)
{
    return (b & 0x80000000u) | ((((b >> 23) & 0xffu) + 1u) & 0x100u);
}

FS_ALWAYS_INLINE uint64_t fs_flags_f64(uint64_t b)
{
    return (b & 0x8000000000000000ull) | ((((b >> 52) & 0x7ffull) + 1ull) & 0x800ull);
}

/* Exact re-check of a flagged row: 1 when every element is finite and >= 0 (-0.0 too). */
#define FS_RECHECK(x, n)                                                                        \
    for (long j = 0; j < (n); j++)                                                              \
        if (!((x)[j] >= 0 && (x)[j] - (x)[j] == 0))                                             \
            return 0;                                                                           \
    return 1;

/* Returns 1 when every element of x[0:n) is finite and >= 0; *total = their sum in double
 * (float data is summed in float lanes per block of 1024 and the blocks in double: error
 * ~1e-7 relative, far below the 1e-3 row-sum tolerance of float32 rows). */
FS_CLONES int fs_scan_f32(const float *FS_RESTRICT x, long n, double *total)
{
    long j = 0;
    double sum = 0.0;
    uint32_t flags = 0;
#if FS_HAVE_VEC
    fs_v16u f = {0};
    while (j + 64 <= n) {
        fs_v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}; /* four chains hide the add latency */
        long stop = n - j < 1024 ? n : j + 1024;
        for (; j + 64 <= stop; j += 64) {
            fs_v16f v0, v1, v2, v3;
            memcpy(&v0, x + j, sizeof v0);
            memcpy(&v1, x + j + 16, sizeof v1);
            memcpy(&v2, x + j + 32, sizeof v2);
            memcpy(&v3, x + j + 48, sizeof v3);
            a0 += v0;
            a1 += v1;
            a2 += v2;
            a3 += v3;
            fs_v16u b0 = (fs_v16u)v0, b1 = (fs_v16u)v1, b2 = (fs_v16u)v2, b3 = (fs_v16u)v3;
            fs_v16u all = (b0 | b1) | (b2 | b3);
            f |= all & 0x80000000u;
            f |= ((((b0 >> 23) & 0xffu) + 1u) | (((b1 >> 23) & 0xffu) + 1u)
                  | (((b2 >> 23) & 0xffu) + 1u) | (((b3 >> 23) & 0xffu) + 1u)) & 0x100u;
        }
        a0 = (a0 + a1) + (a2 + a3);
        for (int l = 0; l < 16; l++)
            sum += (double)a0[l];
    }
    for (int l = 0; l < 16; l++)
        flags |= f[l];
#endif
    for (; j < n; j++) {
        uint32_t b;
        memcpy(&b, x + j, sizeof b);
        flags |= fs_flags_f32(b);
        sum += (double)x[j];
    }
    *total = sum;
    if (!flags)
        return 1;
    FS_RECHECK(x, n)
}

FS_CLONES int fs_scan_f64(const double *FS_RESTRICT x, long n, double *total)
{
    long j = 0;
    double sum = 0.0;
    uint64_t flags = 0;
#if FS_HAVE_VEC
    fs_v8u f = {0};
    fs_v8d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (; j + 32 <= n; j += 32) {
        fs_v8d v0 = fs_load8_f64(x + j), v1 = fs_load8_f64(x + j + 8),
               v2 = fs_load8_f64(x + j + 16), v3 = fs_load8_f64(x + j + 24);
        a0 += v0;
        a1 += v1;
        a2 += v2;
        a3 += v3;
        fs_v8u b0 = (fs_v8u)v0, b1 = (fs_v8u)v1, b2 = (fs_v8u)v2, b3 = (fs_v8u)v3;
        f |= ((b0 | b1) | (b2 | b3)) & 0x8000000000000000ull;
        f |= ((((b0 >> 52) & 0x7ffull) + 1ull) | (((b1 >> 52) & 0x7ffull) + 1ull)
              | (((b2 >> 52) & 0x7ffull) + 1ull) | (((b3 >> 52) & 0x7ffull) + 1ull)) & 0x800ull;
    }
    a0 = (a0 + a1) + (a2 + a3);
    for (int l = 0; l < 8; l++) {
        sum += a0[l];
        flags |= f[l];
    }
#endif
    for (; j < n; j++) {
        uint64_t b;
        memcpy(&b, x + j, sizeof b);
        flags |= fs_flags_f64(b);
        sum += x[j];
    }
    *total = sum;
    if (!flags)
        return 1;
    FS_RECHECK(x, n)
}


/* First j with cum[j] > target in the non-decreasing cum[0:n), or n. */
static long fs_first_above(const double *cum, long n, double target)
{
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (cum[mid] > target)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* ---- selection for top-k (the float / double variants use it) ------------------------ */

/* The k-th smallest (0-based) of a[0:n) (a is reordered): quickselect with a three-way
 * partition, so runs of equal values cost O(n). */
double fs_select_kth(double *a, long n, long k)
{
    long lo = 0, hi = n - 1;
    while (lo < hi) {
        double x = a[lo], y = a[lo + (hi - lo) / 2], w = a[hi];
        double pivot = x < y ? (y < w ? y : (x < w ? w : x)) : (x < w ? x : (y < w ? w : y));
        long lt = lo, i = lo, gt = hi; /* [lo,lt) < pivot, [lt,i) == pivot, (gt,hi] > pivot */
        while (i <= gt) {
            double v = a[i];
            if (v < pivot) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v > pivot) {
                a[i] = a[gt];
                a[gt--] = v;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt - 1;
        else if (k > gt)
            lo = gt + 1;
        else
            return pivot;
    }
    return a[k];
}

/* Restore the min-heap property of heap[0:k) below index i. */
static inline void fs_heap_sift_down(double *heap, long k, long i)
{
    double v = heap[i];
    for (;;) {
        long c = 2 * i + 1;
        if (c >= k)
            break;
        if (c + 1 < k && heap[c + 1] < heap[c])
            c++;
        if (!(heap[c] < v))
            break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = v;
}

/* ---- float / double variants (fs_kernels_impl.h) ------------------------------------- */

#define FS_T double /* first: the float instantiation uses fs_max_f64 */
#define FS_SFX f64
#define FS_BITS int64_t
#define FS_FINITE_MAX FS_F64_FINITE_MAX
#define FS_MAGNITUDE 0x7fffffffffffffffLL
#include "fs_kernels.inc"

#define FS_T float
#define FS_SFX f32
#define FS_BITS int32_t
#define FS_FINITE_MAX FS_F32_FINITE_MAX
#define FS_MAGNITUDE 0x7fffffff
#include "fs_kernels.inc"

/* ---- selection and sorting for top-k / top-p ----------------------------------------- */

/* Stable LSD radix sort of idx[0:n) by the 64-bit keys key[0:n), ascending, 8-bit digits;
 * digits on which every key agrees are skipped. tmp_key/tmp_idx: n elements each. */
static void fs_radix_sort(uint64_t *key, int32_t *idx, long n, uint64_t *tmp_key,
                          int32_t *tmp_idx)
{
    uint64_t and_all = ~(uint64_t)0, or_all = 0;
    for (long i = 0; i < n; i++) {
        and_all &= key[i];
        or_all |= key[i];
    }
    uint64_t varying = and_all ^ or_all;
    for (int shift = 0; shift < 64; shift += 8) {
        if (((varying >> shift) & 0xFF) == 0)
            continue;
        long count[257];
        memset(count, 0, sizeof count);
        for (long i = 0; i < n; i++)
            count[((key[i] >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (long i = 0; i < n; i++) {
            long dst = count[(key[i] >> shift) & 0xFF]++;
            tmp_key[dst] = key[i];
            tmp_idx[dst] = idx[i];
        }
        memcpy(key, tmp_key, (size_t)n * sizeof *key);
        memcpy(idx, tmp_idx, (size_t)n * sizeof *idx);
    }
}

static inline uint64_t fs_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

/* Nucleus (top-p) of the normalised, non-negative probabilities p[0:n), in place: keeps each
 * token whose preceding mass (descending p, ties by lower index, sequential float64 sum) is
 * below top_p, zeroes the rest, and renormalises. Only the tokens that can precede the cut
 * are sorted: the mass per binary exponent locates it, and the candidates (every token with
 * p >= 2^(e-1) for the exponent e of the cut) are a prefix of the full sorted order, so their
 * sequential prefix sums equal those of a full sort. key/idx/tmp_*: n elements each. */
void fs_top_p(double *p, long n, double top_p, uint64_t *key, int32_t *idx,
                     uint64_t *tmp_key, int32_t *tmp_idx)
{
    double mass[2048];
    memset(mass, 0, sizeof mass);
    for (long j = 0; j < n; j++)
        mass[fs_bits(p[j]) >> 52] += p[j]; /* p >= 0: the top bits are the exponent */
    int cut = 0;
    double run = 0.0;
    for (int e = 2047; e >= 0; e--) {
        run += mass[e];
        if (run >= top_p) {
            cut = e;
            break;
        }
    }
    uint64_t floor_bits = cut >= 2 ? (uint64_t)(cut - 1) << 52 : 1; /* also drops p == 0 */
    for (int attempt = 0; attempt < 2; attempt++) {
        long m = 0;
        for (long j = 0; j < n; j++) {
            uint64_t b = fs_bits(p[j]);
            if (b >= floor_bits) {
                key[m] = ~b; /* ascending ~bits == descending p; stable sort keeps index order */
                idx[m++] = (int32_t)j;
            }
        }
        fs_radix_sort(key, idx, m, tmp_key, tmp_idx);
        double before = 0.0;
        long keep = 0;
        while (keep < m && before < top_p) {
            before += p[idx[keep]];
            keep++;
        }
        if (keep < m || before >= top_p || floor_bits == 1) {
            /* idx[0:keep) is the nucleus */
            double total = 0.0;
            for (long t = 0; t < keep; t++) {
                total += p[idx[t]];
                key[t] = fs_bits(p[idx[t]]);
            }
            for (long j = 0; j < n; j++)
                p[j] = 0.0;
            for (long t = 0; t < keep; t++) {
                double v;
                memcpy(&v, &key[t], sizeof v);
                p[idx[t]] = v / total;
            }
            return;
        }
        floor_bits = 1; /* rounding put the cut below the candidates: take every p > 0 */
    }
}

