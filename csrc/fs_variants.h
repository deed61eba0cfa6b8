/* fs_variants.h -- the ISA variants behind fs_isa.h's dispatch table: which ones this build
 * has, their declarations and the tunables the variant files share. Internal to the core (and
 * tests/c, which runs the variants side by side); the extensions call the entry points of
 * fs_linear.h and fs_attention.h, which go through fs_disp.
 *
 * Each variant lives in its own file, compiled once with its target attribute on every
 * function (never -march: the wheel runs on any x86-64):
 *
 *   fs_linear_def.c, fs_linear_avx2.c, fs_linear_avx512.c   packed float products
 *                                                             (fs_linear_f32.inc, 3 weight types)
 *   fs_linear_amx.c                                          bf16 products on AMX tiles
 *   fs_attention_def.c, fs_attention_avx2.c,                 tiled float attention blocks
 *   fs_attention_avx512.c                                    (fs_attention_f32.inc)
 */
#ifndef FS_VARIANTS_H
#define FS_VARIANTS_H

#include "fs_common.h"

/* ---- which variants exist ---------------------------------------------------------------- */

/* AVX2 and AVX-512 products (explicit targets; the float16 ones need F16C, which
 * target_clones cannot add to its "avx2" clone). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__linux__) \
    && !defined(FS_NO_CLONES)
#define FS_LINF_SIMD 1
#else
#define FS_LINF_SIMD 0
#endif

/* The AMX kernel (GCC >= 11 on x86-64 Linux); it runs only when fs_isa.h reports AMX with the
 * tile-data grant. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) \
    && defined(__linux__) && !defined(FS_NO_CLONES)
#define FS_AMX_BUILD 1
#else
#define FS_AMX_BUILD 0
#endif

/* AVX2 and AVX-512 float attention blocks (else the build's own target only: 8 lanes when it
 * is AVX2 without AVX-512, 16 otherwise). */
#if FS_HAVE_VEC && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) \
    && defined(__linux__) && defined(__GLIBC__) && !defined(FS_NO_CLONES) && !defined(__AVX512F__)
#define FS_ATTN_VARIANTS 1
#else
#define FS_ATTN_VARIANTS 0
#endif

/* ---- packed float products (fs_linear_f32.inc) ------------------------------------------- */

/* Most rows of x handled in one pass over W (accumulators: rows x 2 vectors <= 20 zmm). */
#define FS_LIN_MAXR 10
/* ... in the AVX2 variants (16 registers; see fs_linear_f32.inc). */
#ifndef FS_LIN_MAXR_AVX2
#define FS_LIN_MAXR_AVX2 6
#endif
/* Threads split a product's columns into chunks whose bounds are multiples of this (a whole
 * number of the packed float kernels' panels, so every chunk runs whole tiles). */
#ifndef FS_LIN_CHUNK_ALIGN
#define FS_LIN_CHUNK_ALIGN 32
#endif
/* Products with at least this many weights are split between the pool's threads (fs_pool.h;
 * fs_linear.c sizes the chunks); smaller ones run on the caller. */
#ifndef FS_LIN_PARALLEL_MIN
#define FS_LIN_PARALLEL_MIN 65536
#endif
/* Software prefetch this many tiles ahead along the rows of W being swept (measured: ~15%
 * off a 9-row product whose weights come from L3/DRAM). */
#ifndef FS_LIN_PF_TILES
#define FS_LIN_PF_TILES 2
#endif
#ifndef FS_LIN_KB
#define FS_LIN_KB 32
#endif
/* Packed float kernels: software prefetch this many k steps ahead in each panel stream
 * (measured on a 9-row product from L3: ~20% off without it). */
#ifndef FS_LIN_PF_K
#define FS_LIN_PF_K 8
#endif
/* The AVX2 float-weight kernel's distance for one row (decode): 3 k steps, 384 bytes per
 * panel stream (measured on Zen 3, the SmolLM-shape float32 decode products: 0.71-0.78 of a
 * two-stream dot's rate at 8 steps, 0.90-0.96 at 3; blocks of 4-16 rows lost ~10% at 3, and
 * 16-bit weights were best at 16 steps, 1 KiB, among 2-32). */
#ifndef FS_LIN_PF_K_F32_AVX2
#define FS_LIN_PF_K_F32_AVX2 3
#endif
/* Full unrolling keeps every accumulator in a register. */
#define FS_LIN_UNROLL _Pragma("GCC unroll 16")

#define FS_LINF_DECLARE(SFX)                                                                   \
    void fs_linf_part_f32_##SFX(const float *x, const float *P, float *y, int n, int in,      \
                                int out, int lo, int hi, int accumulate);                      \
    void fs_linf_part_f32h_##SFX(const float *x, const uint16_t *P, float *y, int n, int in,  \
                                 int out, int lo, int hi, int accumulate);                     \
    void fs_linf_part_f32b_##SFX(const float *x, const uint16_t *P, float *y, int n, int in,  \
                                 int out, int lo, int hi, int accumulate);
FS_LINF_DECLARE(def)
#if FS_LINF_SIMD
FS_LINF_DECLARE(avx2)
FS_LINF_DECLARE(avx512)
#endif

/* The entry points' column parts, through fs_disp (the variant of the path). */
void fs_linear_part_f32(const float *x, const float *P, float *y, int n, int in, int out,
                        int lo, int hi, int accumulate);
void fs_linear_part_f32h(const float *x, const uint16_t *P, float *y, int n, int in, int out,
                         int lo, int hi, int accumulate);
void fs_linear_part_f32b(const float *x, const uint16_t *P, float *y, int n, int in, int out,
                         int lo, int hi, int accumulate);

/* ---- AMX tiles (fs_linear_amx.c) --------------------------------------------------------- */

/* Column tiles that share one input tile per k step (4 sums + 1 input + 3 weight tiles of the
 * 8 tile registers). */
#define FS_AMX_G 4
#if FS_AMX_BUILD
/* xa (m, kp) = x (m, in) rounded to bf16 bits (fs_f2bf_bits' rule), zero past in. */
void fs_amx_round_rows(const float *x, int m, int in, int kp, uint16_t *xa);
/* Column tiles [t_lo, t_hi) (t_lo a multiple of FS_AMX_G) of all n rows of xa (n, kp), in
 * passes of up to 16 rows; configures this thread's tiles and releases them. */
void fs_amx_part(const uint16_t *xa, int kp, const uint16_t *P, float *y, int n, int out,
                 int t_lo, int t_hi, int accumulate);
#endif
/* 1 when the bf16 products run on AMX tiles in this process (built, detected, granted). */
int fs_linf_amx(void);

/* ---- tiled float attention (fs_attention_f32.inc) ---------------------------------------- */

#if FS_HAVE_VEC
#define FS_F32_TILE 128
#define FS_F32_ROWS 4
#define FS_F32_MAXD 128

void fs_f32_block_def(const float *const *qrows, float *const *orows, const int *count,
                      int rows, const float *kh, const float *vh, int head_dim, float scale,
                      int base, const int32_t *anc);
#if FS_ATTN_VARIANTS
void fs_f32_block_avx2(const float *const *qrows, float *const *orows, const int *count,
                       int rows, const float *kh, const float *vh, int head_dim, float scale,
                       int base, const int32_t *anc);
void fs_f32_block_avx512(const float *const *qrows, float *const *orows, const int *count,
                         int rows, const float *kh, const float *vh, int head_dim, float scale,
                         int base, const int32_t *anc);
#endif
#endif

#endif /* FS_VARIANTS_H */
