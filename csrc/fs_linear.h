/* fs_linear.h -- dense row-major products for the fused transformer runner (fs_model.c).
 *
 * fs_linear_f64:   y (n, out) [+]= x (n, in) @ W (in, out) [+ bias (out,)], W C-contiguous
 * fs_linear_f32:   the same in float, with W packed by fs_pack_f32 (panels of 48 columns)
 * fs_linear_f32h:  the same as fs_linear_f32 with W stored as IEEE binary16 bits (uint16_t,
 *                  packed by fs_pack_f32h): weights are widened to float in registers (exact,
 *                  vcvtph2ps) and every product and sum is fs_linear_f32's, so the result is
 *                  bit-identical to fs_linear_f32 on the widened W while a decode step streams
 *                  half the bytes.
 * fs_linear_f32b:  the same with W stored as bfloat16 bits (uint16_t, packed by fs_pack_f32h,
 *                  which packs any 16-bit type), widened by a 16-bit shift in registers; x
 *                  must hold bf16 values (fs_linear_f32b_round rounds x into a scratch
 *                  buffer first: the bf16 compute rule). Each product of two bf16 values is
 *                  exact in float, so the result is bit-identical to fs_linear_f32 on the
 *                  widened W and the rounded x.
 *
 * Float kernels (the hot path): W is packed once, when a runner is built, into panels of
 * FS_LIN_PW = 48 columns stored k after k (6 ymm or 3 zmm per k step). One row (a decode
 * step) streams several panels at once and is bandwidth bound. A block of rows (verification)
 * runs register tiles sized to the register file (AVX2: 4 rows x 24 columns; AVX-512: 8 rows
 * x 48 columns), each weight loaded and widened once per k step for every row of the tile,
 * with the k axis cut into blocks that every row group sweeps while they are in L1, so W
 * streams from memory once per block of rows: bound by the multiply-adds (fs_linear_f32.inc).
 * Every output is ONE multiply-add chain in k order, from +0 (or y when accumulating), for any
 * row count, tile, k block or column range: decode and verification agree bit for bit, and
 * the AVX2 and AVX-512 variants (fused multiply-adds) agree with each other and with a scalar
 * fmaf chain.
 *
 * Double kernel: unpacked W; inner loops over `out` (contiguous in W and y) vectorise without
 * reassociating sums; one row streams W row after row, several rows use register tiles swept
 * over blocks of FS_LIN_KB rows of W.
 *
 * Threads: a product of at least FS_LIN_PARALLEL_MIN weights cuts its output columns into
 * chunks of whole FS_LIN_CHUNK_ALIGN-column groups (fs_variants.h), which the core's pool
 * (fs_pool.h) shares out; each column is summed as by one thread, so the results are the same
 * bits at any thread count (fs_pool_set_threads; 1 until the Python layer sets its default).
 *
 * With GCC on x86-64 Linux the double kernel is compiled three times (FS_CLONES, fs_common.h)
 * and the float kernels exist in AVX-512, AVX2 and baseline variants, each in its own file
 * (fs_variants.h) behind fs_isa.h's dispatch table: a portable wheel without -march=native
 * still gets wide vectors. Other compilers get the baseline build (and scalar loops without
 * GCC vectors, fs_linear.c). Define FS_NO_CLONES to turn multi-versioning off.
 * fs_linear_set_path (fs_isa.h's FS_ISA_* values) forces the packed float kernels onto one
 * variant (the FASTSPEC_ISA switch); the caller checks that the CPU runs it.
 *
 * Bit-identical 16-bit weights: the float kernels (f32, f32h, f32b) come from ONE template
 * body that differs only in how a vector of weights is loaded (widening is exact), so f32h and
 * f32b equal f32 on the widened weights in every variant (the AVX2 variant is
 * AVX2+FMA+F16C). The baseline variant (no FMA in its target) rounds each product then each
 * sum: bit-identical alone vs in a block, not to the SIMD variants.
 *
 * AMX (fs_linear_amx.c): on the FS_ISA_AMX path the bf16 products run on tiles, with the
 * weights in the tile layout of fs_pack_bf16_amx; see that file for the numerics.
 */
#ifndef FS_LINEAR_H
#define FS_LINEAR_H

#include <stddef.h>
#include <stdint.h>

/* y (n, out) [+]= x (n, in) @ W [+ bias (out,), NULL: none]; accumulate: add to y. W plain
 * (in, out) for f64, packed by fs_pack_f32 (f32) or fs_pack_f32h (f32h, f32b) otherwise;
 * f32b wants x already rounded to bf16 (fs_linear_f32b_round does it). */
void fs_linear_f64(const double *x, const double *W, const double *bias, double *y, int n,
                   int in, int out, int accumulate);
void fs_linear_f32(const float *x, const float *W, const float *bias, float *y, int n, int in,
                   int out, int accumulate);
void fs_linear_f32h(const float *x, const uint16_t *W, const float *bias, float *y, int n,
                    int in, int out, int accumulate);
void fs_linear_f32b(const float *x, const uint16_t *W, const float *bias, float *y, int n,
                    int in, int out, int accumulate);

/* The bf16 compute rule: y (n, out) [+]= round_bf16(x) @ W for bf16 W (packed), the rounded
 * rows written to xr (n * max(in, 16) floats; x itself when in >= 16) once, before any
 * thread starts. On the AMX path W is in the tile layout and xr receives the rows as bf16 bits
 * (n * fs_amx_kp(in) of them, which fit: fs_amx_kp(in) <= 2 * max(in, 16)). x NULL: xr
 * already holds the previous call's rounded rows, for the same n and in. */
void fs_linear_f32b_round(const float *x, const uint16_t *W, const float *bias, float *y,
                          int n, int in, int out, int accumulate, float *xr);

/* The products of one x (n, in) with `count` matrices (1 <= count <= FS_POOL_JOBS_MAX): y[i]
 * (n, out[i]) [+]= x @ W[i] [+ bias[i]] (bias NULL, or bias[i] NULL: none), the bits each
 * single call above gives, run as one pool job (fs_pool_run_jobs): one wait for the threads
 * instead of `count`, and products too small to split alone (a layer's k and v at one row)
 * run beside the others. The bf16 one rounds x once. */
void fs_linear_many_f64(int count, const double *x, const double *const *W,
                        const double *const *bias, double *const *y, int n, int in,
                        const int *out, int accumulate);
void fs_linear_many_f32(int count, const float *x, const float *const *W,
                        const float *const *bias, float *const *y, int n, int in,
                        const int *out, int accumulate);
void fs_linear_many_f32h(int count, const float *x, const uint16_t *const *W,
                         const float *const *bias, float *const *y, int n, int in,
                         const int *out, int accumulate);
void fs_linear_many_f32b(int count, const float *x, const uint16_t *const *W,
                         const float *const *bias, float *const *y, int n, int in,
                         const int *out, int accumulate);
void fs_linear_f32b_round_many(int count, const float *x, const uint16_t *const *W,
                               const float *const *bias, float *const *y, int n, int in,
                               const int *out, int accumulate, float *xr);

/* xr[i] = x[i] rounded to bf16 (fs_f2bf_bits), i < count (xr may be x). */
void fs_round_bf16(const float *x, float *xr, size_t count);

/* Packed layout of the float kernels' W (in, out), the same for 32- and 16-bit elements:
 * columns cut into panels of FS_LIN_PW = 48, the last one (out - c0 < 48 columns left)
 * zero-padded to 16 or 32 columns; panel c0 / 48 holds W[k, c0:c0 + width] for every k,
 * contiguously, from P + c0 * in. A tile of rows then reads its weights as one sequential
 * stream per panel. fs_packed_len: in x out rounded up to a multiple of 16. */
size_t fs_packed_len(int in, int out);
/* Pack W (in, out) of elements of esz bytes (2 or 4), element (k, col) at element offset
 * k * rs + col * cs, into P (fs_packed_len elements). cs == 1 (C-contiguous W) copies rows of
 * a panel; otherwise (the transpose of a C-contiguous matrix: a tied head read straight from
 * the embedding) elements one by one, a panel's 48 source rows staying in cache meanwhile. */
void fs_pack_strided(const void *W, size_t esz, int in, int out, size_t rs, size_t cs, void *P);
void fs_pack_f32(const float *W, int in, int out, float *P);
/* any 16-bit weights (float16 or bfloat16 bits) */
void fs_pack_f32h(const uint16_t *W, int in, int out, uint16_t *P);

/* The AMX tile layout (fs_linear_amx.c): `in` padded to fs_amx_kp(in), `out` to a multiple
 * of 16. */
int fs_amx_kp(int in);
size_t fs_amx_packed_len(int in, int out);
/* Pack W (in, out) of bf16 bits, element (k, col) at W[k * rs + col * cs], into P
 * (fs_amx_packed_len elements). */
void fs_pack_bf16_amx_strided(const uint16_t *W, int in, int out, size_t rs, size_t cs,
                              uint16_t *P);
/* W (in, out) C-contiguous */
void fs_pack_bf16_amx(const uint16_t *W, int in, int out, uint16_t *P);

/* The core's clock in Hz, measured: the best of `bursts` runs of 2^20 dependent integer adds
 * (one cycle each on every x86-64; register operands, which no core folds away), timed with
 * CLOCK_MONOTONIC. 0 where the loop is not built (not GCC on x86-64). About 0.3 ms a burst. */
double fs_clock_hz(int bursts);

#endif /* FS_LINEAR_H */
