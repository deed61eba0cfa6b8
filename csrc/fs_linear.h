/* fs_linear.h -- dense row-major products for the fused transformer runner (fs_model.c).
 *
 * fs_linear_f64:   y (n, out) [+]= x (n, in) @ W (in, out) [+ bias (out,)], W C-contiguous
 * fs_linear_f32:   the same in float, with W packed by fs_pack_f32 (panels of 32 columns)
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
 * Float kernels (the hot path): W is packed once, when a runner is built, into panels of 32
 * columns stored k after k, so that a register tile of up to FS_LIN_MAXR rows x 32 columns
 * (AVX-512; AVX2: up to 6 rows x 16 columns, FS_LIN_MAXR_AVX2, to fit its 16 registers)
 * reads its weights as one sequential stream and keeps its sums in registers over the whole
 * `in` axis. One row (a decode step) streams several panels at once and is bandwidth bound; a
 * verification block of up to one tile of rows reads W once and is bound by the multiply-adds,
 * which overlap the stream instead of following it. Every output takes its products in
 * k order, one multiply-add at a time, for any row count: decode and verification agree bit
 * for bit.
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
 * Bit-identical float16 weights: the float kernels (f32, f32h, f32b) come from ONE macro body
 * that differs only in how 16 weights are loaded, and all their arithmetic is on the variant's
 * float vectors (16 lanes; two 8-lane ymm vectors in the AVX2 variant, whose 64-byte generic
 * vectors spilled every accumulator; the last, partial vector of a row too: packing pads it
 * with zero weights). GCC
 * contracts a*b+c into FMA where the target has it; with identical statements on identical
 * vector types the two instantiations are contracted identically, so f32h == f32 on widened
 * weights in every variant (the AVX2 variant is AVX2+FMA+F16C).
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
 * (n * fs_amx_kp(in) of them, which fit: fs_amx_kp(in) <= 2 * max(in, 16)). */
void fs_linear_f32b_round(const float *x, const uint16_t *W, const float *bias, float *y,
                          int n, int in, int out, int accumulate, float *xr);

/* xr[i] = x[i] rounded to bf16 (fs_f2bf_bits), i < count (xr may be x). */
void fs_round_bf16(const float *x, float *xr, size_t count);

/* Packed layout of the float kernels' W (in, out): columns zero-padded to a multiple of 16
 * and cut into panels of 32 (the last one 16 wide when the padded width is an odd multiple of
 * 16); panel c0 / 32 holds W[k, c0:c0 + width] for every k, contiguously, from P + c0 * in.
 * A tile of rows then reads its weights as one sequential stream per panel. */
size_t fs_packed_len(int in, int out);
/* Pack W (in, out) of elements of esz bytes (2 or 4), element (k, col) at element offset
 * k * rs + col * cs, into P (fs_packed_len elements). cs == 1 (C-contiguous W) copies rows of
 * a panel; otherwise (the transpose of a C-contiguous matrix: a tied head read straight from
 * the embedding) elements one by one, a panel's 32 source rows staying in cache meanwhile. */
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

#endif /* FS_LINEAR_H */
