/* fs_kernels.h -- C inner loops of fastspec's sampling and verification kernels.
 *
 * Used by the sampling and verification kernels (fastspec/kernels/_kernels_*.pyx), and
 * fs_exp_sum by attention too (fs_attention.c). Every function here runs without the GIL and cannot fail:
 * the caller has validated shapes and (with the fs_scan_* helpers below) the data, and owns
 * every buffer. Reductions that decide a sampled token (the inverse-CDF sums) are sequential
 * in double, exactly like numpy.cumsum, so the compiled and NumPy backends pick the same
 * token bit for bit. Reductions that only feed checks or normalisations use several
 * accumulators so that they vectorise.
 */
#ifndef FS_KERNELS_H
#define FS_KERNELS_H

#include <stdint.h>

/* s[j] <- exp(s[j] - m) for j < count; return the sum (double, sequential). The softmax
 * numerators of the double attention template and of probs. */
double fs_exp_sum(double *s, int count, double m);

/* Returns 1 when every element of x[0:n) is finite and >= 0; *total = their sum in double
 * (float data is summed in float lanes per block of 1024 and the blocks in double: error
 * ~1e-7 relative, far below the 1e-3 row-sum tolerance of float32 rows). */
int fs_scan_f32(const float *x, long n, double *total);
int fs_scan_f64(const double *x, long n, double *total);
/* 1 when every element of x[0:n) is finite. */
int fs_all_finite_f32(const float *x, long n);
int fs_all_finite_f64(const double *x, long n);
/* Index of the first maximum of x[0:n), n >= 1, finite. */
long fs_argmax_f32(const float *x, long n);
long fs_argmax_f64(const double *x, long n);

/* Doubles of checkpoint scratch the inverse-CDF draws need for n weights. */
#define FS_CDF_BLOCK 64
#define FS_CDF_CHECKPOINTS(n) (((n) + FS_CDF_BLOCK - 1) / FS_CDF_BLOCK)

/* The inverse-CDF draw of _reference._inverse_cdf over w = x (as double), except position
 * `skip` (-1: none) which counts as 0: the first j with cumsum(w)[j] > u * sum(w), else the
 * last j with w[j] > 0; sums sequential, exactly as numpy.cumsum computes them. ends:
 * FS_CDF_CHECKPOINTS(n) doubles of scratch. */
long fs_inverse_cdf_f32(const float *x, long n, long skip, double u, double *ends);
long fs_inverse_cdf_f64(const double *x, long n, long skip, double u, double *ends);
/* The same draw over max(p - q, 0) (double); returns -1 when that residual is all zero. */
long fs_residual_draw_f32(const float *p, const float *q, long n, double u, double *ends);
long fs_residual_draw_f64(const double *p, const double *q, long n, double u, double *ends);
/* Top-k of the row x[0:n) at temperature t > 0, 0 < k < n: the kept indices, ascending, in
 * kept and their scaled logits in z; returns their count; *zmax = the largest scaled logit.
 * scratch: n doubles. */
long fs_top_k_scaled_f32(const float *x, long n, long k, double t, int32_t *kept, double *z,
                         double *scratch, double *zmax);
long fs_top_k_scaled_f64(const double *x, long n, long k, double t, int32_t *kept, double *z,
                         double *scratch, double *zmax);
/* z[j] = x[j] / temperature (double); returns max z. */
double fs_scale_row_f32(const float *x, long n, double temperature, double *z);
double fs_scale_row_f64(const double *x, long n, double temperature, double *z);
/* out[j] = (FS_T)(z[j] / total) */
void fs_store_scaled_f32(const double *z, long n, double total, float *out);
void fs_store_scaled_f64(const double *z, long n, double total, double *out);
/* The k-th smallest (0-based) of a[0:n) (a is reordered). */
double fs_select_kth(double *a, long n, long k);
/* Nucleus (top-p) of the normalised, non-negative probabilities p[0:n), in place (fs_kernels.c
 * has the rule). key/idx/tmp_*: n elements each. */
void fs_top_p(double *p, long n, double top_p, uint64_t *key, int32_t *idx, uint64_t *tmp_key,
              int32_t *tmp_idx);

#endif /* FS_KERNELS_H */
