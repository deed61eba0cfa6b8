/* fs_quant.h -- products with GGUF's quantized weights (Q8_0, Q4_0, Q4_1) and int8 activations.
 *
 * The numerics are stated once, in docs/FORMATS.md ("Quantized products"); every path (the
 * portable C kernel, AVX2, AVX-VNNI, AVX512-VNNI, AMX-INT8) gives the same bits, and a row
 * gives the same bits alone or inside a block of rows:
 *
 *   weights     blocks of 32 along the input axis (GGUF's own blocks, one f16 scale d, and an
 *               f16 min m for q4_1);
 *   activations each row of x quantized per block of 32 once per call (fs_quant_rows):
 *               amax = max|x|, da = amax / 127, q = nearest-even(x * (127 / amax)) in
 *               [-127, 127], sa = the exact integer sum of q;
 *   per output  acc = 0 (or y when accumulating), then for b = 0 .. nb-1 in order:
 *               isum = exact integer sum of w * q (q4_0: the nibbles' sum minus 8 * sa);
 *               acc = fmaf(d_w * da, (float)isum, acc);
 *               q4_1: acc = fmaf(m_w, da * (float)sa, acc);
 *               y = acc (+ bias afterwards).
 *
 * Packed layout (fs_quant_pack; one per kind, read by every path, so forcing a path never
 * repacks): the output columns in panels of 8 (FS_Q_COLS; the last panel padded with zero
 * columns), a panel being
 *
 *   d    nb x 8 f16   d[b * 8 + c]: scale of column c, block b        (padded to 64 bytes)
 *   m    nb x 8 f16   q4_1 only: the mins, same order                  (padded to 64 bytes)
 *   qs   q8_0: nb x 256 bytes, qs[b * 256 + (j * 8 + c) * 4 + t] = w[b * 32 + 4 * j + t]
 *        of column c (j = 0..7): one 32-byte vector holds 4 inputs of the 8 columns;
 *        q4_*: nb x 128 bytes, byte b * 128 + (j * 8 + c) * 4 + t (j = 0..3) =
 *        nib[4 * j + t] | nib[16 + 4 * j + t] << 4 of column c (low nibbles: inputs 0..15).
 *
 * so that a vector of 8 int32 sums is 8 output columns (no horizontal sums) and a register
 * tile of rows applies one unpacked weight vector to every row. The q8_0 qs vector is also the
 * AMX-INT8 "B" tile layout (K groups of 4 bytes per column).
 *
 * Threads: fs_linear_q splits the panels between fs_pool_run's chunks after quantizing the
 * activations once; every column's result is independent of the split.
 */
#ifndef FS_QUANT_H
#define FS_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "fs_pool.h"

enum { FS_Q8_0 = 0, FS_Q4_0 = 1, FS_Q4_1 = 2 };

/* Inputs per block, output columns per packed panel. */
#define FS_Q_BLOCK 32
#define FS_Q_COLS 8

/* Error codes of fs_quant_pack (negative). */
#define FS_Q_EBADSCALE (-1)  /* a scale (or a q4_1 min) is NaN or infinite */
#define FS_Q_EARG (-2)       /* kind unknown, in not a positive multiple of 32, out < 1 */

/* Bytes of one GGUF block (34, 18, 20), or 0 for an unknown kind. */
int fs_quant_block_bytes(int kind);
/* Bytes of one packed panel of 8 columns, and of the whole packed W (out, in). */
size_t fs_quant_panel_bytes(int kind, int in);
size_t fs_quant_packed_bytes(int kind, int in, int out);
/* GGUF rows (out rows of in/32 blocks each, row-major) -> the packed layout P
 * (fs_quant_packed_bytes); returns 0, or FS_Q_EBADSCALE / FS_Q_EARG (P is then unspecified). */
int fs_quant_pack(int kind, const uint8_t *blocks, int in, int out, uint8_t *P);
/* One panel of fs_quant_pack, on the calling thread: the ncols (1 <= ncols <= FS_Q_COLS)
 * GGUF rows at `rows` (each in/32 blocks) into pan (fs_quant_panel_bytes; the missing
 * columns zero). Returns 1 if a scale (or a q4_1 min) is NaN or infinite, else 0. Nothing
 * else is checked (fs_transcode_pack packs each panel as it converts it). */
int fs_quant_pack_panel(int kind, const uint8_t *rows, int in, int ncols, uint8_t *pan);
/* The inverse of fs_quant_pack: P -> GGUF rows (out * in / 32 * block bytes). */
void fs_quant_unpack(int kind, const uint8_t *P, int in, int out, uint8_t *blocks);
/* Dequantize the rows `cols` of W (GGUF rows = output columns; 0 <= cols[i] < out) into dst
 * (count, in): w = d * q (q8_0), d * (nib - 8) (q4_0), d * nib + m (q4_1), each one float
 * operation on the widened f16 values (the embedding lookup of a tied head). */
void fs_quant_rows_f32(int kind, const uint8_t *P, int in, int out, const int32_t *cols,
                       int count, float *dst);

/* Scratch of fs_linear_q for n rows (the quantized activations), 64-byte aligned inside. */
size_t fs_quant_scratch_bytes(int kind, int n, int in);
/* y (n, out) [+]= x (n, in) @ W^T [+ bias (out,), NULL: none]; W packed by fs_quant_pack;
 * scratch of fs_quant_scratch_bytes(kind, n, in) bytes. Nothing is checked here. x NULL: the
 * activations the previous call left in scratch, for the same n and in (the layout does not
 * depend on the kind), so products of one input quantize it once. */
void fs_linear_q(int kind, const float *x, const uint8_t *P, const float *bias, float *y, int n,
                 int in, int out, int accumulate, void *scratch);

/* The products of one x (n, in) with `count` matrices (1 <= count <= FS_Q_MANY_MAX; matrix i
 * of kind kind[i], packed P[i], out[i] columns, bias NULL or bias[i] NULL for none, output
 * y[i] (n, out[i])) in one pool job: each y[i] gets the bits fs_linear_q gives it, with one
 * quantization of x (x NULL: the previous call's, as above) and one wait for the threads
 * instead of `count` (q, k and v of a layer; its gate and up). */
#define FS_Q_MANY_MAX FS_POOL_JOBS_MAX
void fs_linear_q_many(int count, const int *kind, const float *x, const uint8_t *const *P,
                      const float *const *bias, float *const *y, int n, int in, const int *out,
                      int accumulate, void *scratch);

/* The activation rule alone: q (n, in) int8, d (n, in/32) float, s (n, in/32) int32. A block
 * holding NaN or an infinity gets d = NaN and q = s = 0 (its row's outputs are NaN); a block
 * with amax < 2^-96 (zero included) gets d = 0 and q = s = 0. */
void fs_quant_rows(const float *x, int n, int in, int8_t *q, float *d, int32_t *s);

/* Name of the quantized kernel the current path runs for a block of n rows of kind `kind` and
 * in inputs ("portable", "avx2", "avx_vnni", "avx512_vnni", "avx512_vnni_x16", "amx_int8"; in
 * <= 0: a width every kernel takes, so rows longer than the AMX tiles' limit are not asked). */
const char *fs_quant_kernel_name(int kind, int n, int in);

#endif /* FS_QUANT_H */
