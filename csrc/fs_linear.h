/* Dense row-major products for the fused transformer runner (fastspec._model).
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
 * With OpenMP (FASTSPEC_HAVE_OPENMP, probed by setup.py) large products can split their
 * columns between threads: opt in with fs_linear_set_threads (default 1 thread).
 *
 * With GCC on x86-64 Linux the double kernel is compiled three times (FS_CLONES, fs_common.h)
 * and the float kernels exist in AVX-512, AVX2 and baseline variants (explicit targets, below):
 * a portable wheel without -march=native still gets wide vectors. Other compilers get the
 * baseline build (and scalar loops without GCC vectors). Define FS_NO_CLONES to turn
 * multi-versioning off. fs_linear_set_path (fs_isa.h's FS_ISA_*
 * values) forces the packed float kernels onto one variant (the FASTSPEC_ISA switch); the
 * caller checks that the CPU runs it.
 *
 * Bit-identical float16 weights: the float kernels (f32, f32h, f32b) come from ONE macro body
 * that differs only in how 16 weights are loaded, and all their arithmetic is on the variant's
 * float vectors (16 lanes; two 8-lane ymm vectors in the AVX2 variant, whose 64-byte generic
 * vectors spilled every accumulator; the last, partial vector of a row too: packing pads it
 * with zero weights). GCC
 * contracts a*b+c into FMA where the target has it; with identical statements on identical
 * vector types the two instantiations are contracted identically, so f32h == f32 on widened
 * weights in every variant (the AVX2 variant is AVX2+FMA+F16C). The float16 variants need F16C,
 * which target_clones cannot add to its "avx2" clone, so the float kernels use explicit target
 * attributes and a dispatch on __builtin_cpu_supports.
 */
#ifndef FS_LINEAR_H
#define FS_LINEAR_H

#include "fs_common.h"
#include "fs_isa.h"
#include "fs_linear_amx.h"

#if defined(FASTSPEC_HAVE_OPENMP) && defined(_OPENMP)
#include <omp.h>
#define FS_LIN_OMP 1
#else
#define FS_LIN_OMP 0
#endif

/* The packed float kernels' variant: -1 (default) the widest the CPU runs, else FS_ISA_PORTABLE,
 * FS_ISA_AVX2, FS_ISA_AVX512 or FS_ISA_AMX (fs_linear_set_path; AMX runs the bf16 products on
 * tiles, fs_linear_amx.h, and the others as AVX-512). Process-wide; set it while no product
 * runs, and repack bf16 weights after a change (fs_linear_bf16_amx says which layout). */
static int fs_lin_path = -1;

/* Most rows of x handled in one pass over W (accumulators: rows x 2 vectors <= 20 zmm). */
#define FS_LIN_MAXR 10
/* ... in the AVX2 variants (16 registers; see the variants below). */
#ifndef FS_LIN_MAXR_AVX2
#define FS_LIN_MAXR_AVX2 6
#endif
/* Products with at least this many weights are split between OpenMP threads. */
#ifndef FS_LIN_PARALLEL_MIN
#define FS_LIN_PARALLEL_MIN 65536
#endif

/* float -> the nearest bfloat16 value (ties to even), as a float; NaN stays NaN (quieted),
 * values past the largest bf16 become infinite. The NumPy twin (fastspec._bf16) is the same
 * integer arithmetic. */
static inline uint32_t fs_f2bf_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    return u & 0xffff0000u;
}

/* xr[i] = x[i] rounded to bf16, i < count (xr may be x). */
static void fs_round_bf16(const float *x, float *xr, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t u = fs_f2bf_bits(x[i]);
        memcpy(xr + i, &u, sizeof u);
    }
}

/* Packed layout of the float kernels' W (in, out): columns zero-padded to a multiple of 16
 * and cut into panels of 32 (the last one 16 wide when the padded width is an odd multiple of
 * 16); panel c0 / 32 holds W[k, c0:c0 + width] for every k, contiguously, from P + c0 * in.
 * A tile of rows then reads its weights as one sequential stream per panel. */
static inline size_t fs_packed_len(int in, int out) { return (size_t)in * ((out + 15) / 16 * 16); }

/* Pack W (in, out) of elements of esz bytes (2 or 4), element (k, col) at element offset
 * k * rs + col * cs, into P (fs_packed_len elements). cs == 1 (C-contiguous W) copies rows of
 * a panel; otherwise (the transpose of a C-contiguous matrix: a tied head read straight from
 * the embedding) elements one by one, a panel's 32 source rows staying in cache meanwhile. */
static void fs_pack_strided(const void *W, size_t esz, int in, int out, size_t rs, size_t cs,
                            void *P)
{
    const char *w = (const char *)W;
    char *p = (char *)P;
    int outp = (out + 15) / 16 * 16;
    for (int c0 = 0; c0 < outp; c0 += 32) {
        int width = outp - c0 >= 32 ? 32 : 16, real = out - c0 < width ? out - c0 : width;
        for (int k = 0; k < in; k++) {
            const char *row = w + ((size_t)k * rs + (size_t)c0 * cs) * esz;
            if (cs == 1)
                memcpy(p, row, (size_t)real * esz);
            else if (esz == 2)
                for (int c = 0; c < real; c++)
                    ((uint16_t *)p)[c] = ((const uint16_t *)row)[(size_t)c * cs];
            else
                for (int c = 0; c < real; c++)
                    ((float *)p)[c] = ((const float *)row)[(size_t)c * cs];
            memset(p + (size_t)real * esz, 0, (size_t)(width - real) * esz);
            p += (size_t)width * esz;
        }
    }
}
static void fs_pack_f32(const float *W, int in, int out, float *P)
{
    fs_pack_strided(W, sizeof *W, in, out, (size_t)out, 1, P);
}
/* any 16-bit weights (float16 or bfloat16 bits) */
static void fs_pack_f32h(const uint16_t *W, int in, int out, uint16_t *P)
{
    fs_pack_strided(W, sizeof *W, in, out, (size_t)out, 1, P);
}

#if defined(__GNUC__)
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

/* --- the double kernel (unpacked W) --------------------------------------------------------- */

/* A tile of R rows x NV vectors of y at column c0, accumulated in registers over the whole
 * `in` axis. R and NV are compile-time constants after inlining. */
FS_ALWAYS_INLINE void fs_lin_tile_f64(const double *FS_RESTRICT x, const double *FS_RESTRICT W,
                                     double *FS_RESTRICT y, const int R, const int NV, int in,
                                     int out, int c0, int k0, int k1, int accumulate)
{
    fs_v8d_u acc[FS_LIN_MAXR * 8];
    FS_LIN_UNROLL for (int r = 0; r < R; r++)
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)
            acc[r * NV + v] = (accumulate || k0 > 0)
                              ? *(const fs_v8d_u *)(y + (size_t)r * out + c0 + v * 8)
                              : (fs_v8d_u){0};
    for (int k = k0; k < k1; k++) {
        const double *w = W + (size_t)k * out + c0;
        if (FS_LIN_PF_TILES)
            FS_LIN_UNROLL for (int v = 0; v < NV; v++)
                __builtin_prefetch(w + (FS_LIN_PF_TILES * NV + v) * 8, 0, 3);
        fs_v8d_u wv[8];
        FS_LIN_UNROLL for (int v = 0; v < NV; v++) wv[v] = *(const fs_v8d_u *)(w + v * 8);
        FS_LIN_UNROLL for (int r = 0; r < R; r++) {
            const double a = x[(size_t)r * in + k];
            FS_LIN_UNROLL for (int v = 0; v < NV; v++) acc[r * NV + v] += a * wv[v];
        }
    }
    FS_LIN_UNROLL for (int r = 0; r < R; r++)
        FS_LIN_UNROLL for (int v = 0; v < NV; v++)
            *(fs_v8d_u *)(y + (size_t)r * out + c0 + v * 8) = acc[r * NV + v];
}

/* Columns [lo, hi): full tiles of NV vectors, then single vectors; returns the first column
 * not covered. */
FS_ALWAYS_INLINE int fs_lin_cols_f64(const double *x, const double *W, double *y, const int R,
                                     const int NV,
                                    int in, int out, int lo, int hi, int accumulate)
{
    /* Blocks of FS_LIN_KB rows of W, each swept across all columns: W is read as a few
     * sequential streams (prefetcher-friendly) and y is reloaded once per block (from L1). */
    int c0 = lo;
    for (int k0 = 0; k0 < in; k0 += FS_LIN_KB) {
        int k1 = k0 + FS_LIN_KB < in ? k0 + FS_LIN_KB : in;
        for (c0 = lo; c0 + NV * 8 <= hi; c0 += NV * 8)
            fs_lin_tile_f64(x, W, y, R, NV, in, out, c0, k0, k1, accumulate);
        for (; c0 + 8 <= hi; c0 += 8)
            fs_lin_tile_f64(x, W, y, R, 1, in, out, c0, k0, k1, accumulate);
    }
    return c0;
}

FS_ALWAYS_INLINE int fs_lin_vec_f64(const double *x, const double *W, double *y, int R, int in,
                                    int out,
                                   int lo, int hi, int accumulate)
{
    switch (R) {
    case 2: return fs_lin_cols_f64(x, W, y, 2, 4, in, out, lo, hi, accumulate);
    case 3: return fs_lin_cols_f64(x, W, y, 3, 2, in, out, lo, hi, accumulate);
    case 4: return fs_lin_cols_f64(x, W, y, 4, 2, in, out, lo, hi, accumulate);
    case 5: return fs_lin_cols_f64(x, W, y, 5, 2, in, out, lo, hi, accumulate);
    case 6: return fs_lin_cols_f64(x, W, y, 6, 2, in, out, lo, hi, accumulate);
    case 7: return fs_lin_cols_f64(x, W, y, 7, 2, in, out, lo, hi, accumulate);
    case 8: return fs_lin_cols_f64(x, W, y, 8, 2, in, out, lo, hi, accumulate);
    case 9: return fs_lin_cols_f64(x, W, y, 9, 2, in, out, lo, hi, accumulate);
    default: return fs_lin_cols_f64(x, W, y, 10, 2, in, out, lo, hi, accumulate);
    }
}
#define FS_LIN_VEC_F64(x, W, y, R, in, out, lo, hi, acc) \
    fs_lin_vec_f64(x, W, y, R, in, out, lo, hi, acc)

/* --- float kernels: f32 (float weights) and f32h (binary16 weights) ------------------------- */

#if defined(__GNUC__)
#if defined(__x86_64__) && !defined(__clang__) && defined(__linux__) && !defined(FS_NO_CLONES)
#define FS_LINF_SIMD 1
#include <immintrin.h>
#define FS_LINF_AVX512_F32 __attribute__((target("avx512f")))
#define FS_LINF_AVX2_F32 __attribute__((target("avx2,fma")))
#define FS_LINF_AVX512_F32H __attribute__((target("avx512f,f16c")))
#define FS_LINF_AVX2_F32H __attribute__((target("avx2,fma,f16c")))
#else
#define FS_LINF_SIMD 0
#endif

typedef union { fs_v16f_u v; float f[16]; } fs_linf_u;

/* Loads of 16 weights into *dst (LOADW). */
#define FS_LINF_LOAD_F32(dst, p) (*(dst) = *(const fs_v16f_u *)(const void *)(p))
/* The first min(m, 16) floats at p, zero-padded. */
FS_ALWAYS_INLINE void fs_linf_part_f32(fs_v16f_u *dst, const float *p, int m)
{
    fs_linf_u u = {{0}};
    memcpy(u.f, p, (size_t)(m < 16 ? m : 16) * sizeof(float));
    *dst = u.v;
}
/* 16 weights of 16 bits, widened one by one (the baseline build; widen is inlined). */
FS_ALWAYS_INLINE void fs_linf_load16_def(fs_v16f_u *dst, const uint16_t *p,
                                         float (*widen)(uint16_t))
{
    fs_linf_u u;
    for (int i = 0; i < 16; i++) u.f[i] = widen(p[i]);
    *dst = u.v;
}
#define FS_LINF_LOAD_F32H_DEF(dst, p) fs_linf_load16_def(dst, p, fs_h2f)
#if FS_LINF_SIMD
#define FS_LINF_LOAD_F32H_AVX512(dst, p) \
    (*(dst) = (fs_v16f_u)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p))))
/* AVX2 variants work on native 8-lane vectors (fs_v8f_u): 16 weights are two of them. */
#define FS_LINF_LOAD_F32_AVX2(dst, p)                                                          \
    ((dst)[0] = *(const fs_v8f_u *)(const void *)(p),                                        \
     (dst)[1] = *(const fs_v8f_u *)(const void *)((p) + 8))
#define FS_LINF_LOAD_F32H_AVX2(dst, p)                                                         \
    ((dst)[0] = (fs_v8f_u)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p))), \
     (dst)[1] = (fs_v8f_u)_mm256_cvtph_ps(                                                   \
         _mm_loadu_si128((const __m128i *)(const void *)((p) + 8))))
#endif
/* bfloat16: 16 bits up into the float's upper half. */
#define FS_LINF_LOAD_BF16_DEF(dst, p) fs_linf_load16_def(dst, p, fs_bf2f)
#if FS_LINF_SIMD
#define FS_LINF_LOAD_BF16_AVX512(dst, p)                                                      \
    (*(dst) = (fs_v16f_u)_mm512_castsi512_ps(_mm512_slli_epi32(                             \
         _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)))
#define FS_LINF_WIDEN_B8(q)                                                                    \
    ((fs_v8f_u)_mm256_castsi256_ps(_mm256_slli_epi32(                                        \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(q))), 16)))
#define FS_LINF_LOAD_BF16_AVX2(dst, p)                                                         \
    ((dst)[0] = FS_LINF_WIDEN_B8(p), (dst)[1] = FS_LINF_WIDEN_B8((p) + 8))
#endif
/* A tile of R rows (R <= FS_MAXR), for the switch of fs_linear_f32_impl.h's fs_linf_part. */
#define FS_LINF_CASE(R)                                                                        \
    case R: if ((R) <= (FS_MAXR)) { FS_FN(fs_linf_rows)(xp, P, yp, (R) <= (FS_MAXR) ? (R) : 1, 1,\
                                                        in, out, lo, hi, accumulate); break; }

/* The variants, from fs_linear_f32_impl.h: baseline and AVX-512 on 64-byte vectors, AVX2 on
 * native 8-lane ones (FS_YMM). */
#define FS_SFX f32_def
#define FS_WT float
#define FS_ATTR
#define FS_LOADW FS_LINF_LOAD_F32
#define FS_YMM 0
#include "fs_linear_f32_impl.h"
#define FS_SFX f32h_def
#define FS_WT uint16_t
#define FS_ATTR
#define FS_LOADW FS_LINF_LOAD_F32H_DEF
#define FS_YMM 0
#include "fs_linear_f32_impl.h"
#define FS_SFX f32b_def
#define FS_WT uint16_t
#define FS_ATTR
#define FS_LOADW FS_LINF_LOAD_BF16_DEF
#define FS_YMM 0
#include "fs_linear_f32_impl.h"
#if FS_LINF_SIMD
#define FS_SFX f32_avx2
#define FS_WT float
#define FS_ATTR FS_LINF_AVX2_F32
#define FS_LOADW FS_LINF_LOAD_F32_AVX2
#define FS_YMM 1
#include "fs_linear_f32_impl.h"
#define FS_SFX f32_avx512
#define FS_WT float
#define FS_ATTR FS_LINF_AVX512_F32
#define FS_LOADW FS_LINF_LOAD_F32
#define FS_YMM 0
#include "fs_linear_f32_impl.h"
#define FS_SFX f32h_avx2
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX2_F32H
#define FS_LOADW FS_LINF_LOAD_F32H_AVX2
#define FS_YMM 1
#include "fs_linear_f32_impl.h"
#define FS_SFX f32h_avx512
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX512_F32H
#define FS_LOADW FS_LINF_LOAD_F32H_AVX512
#define FS_YMM 0
#include "fs_linear_f32_impl.h"
#define FS_SFX f32b_avx2
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX2_F32
#define FS_LOADW FS_LINF_LOAD_BF16_AVX2
#define FS_YMM 1
#include "fs_linear_f32_impl.h"
#define FS_SFX f32b_avx512
#define FS_WT uint16_t
#define FS_ATTR FS_LINF_AVX512_F32
#define FS_LOADW FS_LINF_LOAD_BF16_AVX512
#define FS_YMM 0
#include "fs_linear_f32_impl.h"
#endif

/* The widest variant the CPU runs (same choice for every weight type: AVX-512F CPUs all have
 * F16C, so f32, f32h and f32b always run the same arithmetic), unless fs_linear_set_path
 * forced one. */
#if FS_LINF_SIMD
/* AMX tiles with the Linux tile-data grant (asked for once, by fs_isa_detect). */
static inline int fs_linf_amx(void)
{
#if FS_AMX_BUILD
    static int granted = -1;
    if (granted < 0) {
        fs_isa_features f;
        fs_isa_detect(&f);
        granted = f.amx_bf16;
    }
    return granted;
#else
    return 0;
#endif
}
static inline int fs_linf_auto(void)
{
    if (fs_linf_amx()) return FS_ISA_AMX;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c")) return FS_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && __builtin_cpu_supports("f16c"))
        return FS_ISA_AVX2;
    return FS_ISA_PORTABLE;
}
#define FS_LINF_DISPATCH(SFX, args)                                                            \
    do {                                                                                       \
        int path_ = fs_lin_path < 0 ? fs_linf_auto() : fs_lin_path;                            \
        if (path_ >= FS_ISA_AVX512)                                                            \
            fs_linf_part_##SFX##_avx512 args;                                                  \
        else if (path_ == FS_ISA_AVX2)                                                         \
            fs_linf_part_##SFX##_avx2 args;                                                    \
        else                                                                                   \
            fs_linf_part_##SFX##_def args;                                                     \
    } while (0)
#else
static inline int fs_linf_amx(void) { return 0; }
static inline int fs_linf_auto(void) { return FS_ISA_PORTABLE; }
#define FS_LINF_DISPATCH(SFX, args) fs_linf_part_##SFX##_def args
#endif
static void fs_linear_part_f32(const float *x, const float *W, float *y, int n, int in, int out,
                               int lo, int hi, int accumulate)
{
    FS_LINF_DISPATCH(f32, (x, W, y, n, in, out, lo, hi, accumulate));
}
static void fs_linear_part_f32h(const float *x, const uint16_t *W, float *y, int n, int in,
                                int out, int lo, int hi, int accumulate)
{
    FS_LINF_DISPATCH(f32h, (x, W, y, n, in, out, lo, hi, accumulate));
}
static void fs_linear_part_f32b(const float *x, const uint16_t *W, float *y, int n, int in,
                                int out, int lo, int hi, int accumulate)
{
    FS_LINF_DISPATCH(f32b, (x, W, y, n, in, out, lo, hi, accumulate));
}
#endif /* __GNUC__ */
#else
#define FS_LIN_VEC_F64(x, W, y, R, in, out, lo, hi, acc) (lo)
static inline int fs_linf_amx(void) { return 0; }
static inline int fs_linf_auto(void) { return FS_ISA_PORTABLE; }
#endif

/* Force path p (-1: automatic); returns 0, or -1 when this build or CPU cannot run it. */
static inline int fs_linear_set_path(int p)
{
    if (p == FS_ISA_AMX ? !fs_linf_amx()
                        : (p < -1 || p > FS_ISA_AVX512 || p > fs_linf_auto()))
        return -1;
    fs_lin_path = p;
    return 0;
}
/* The variant the next product runs. */
static inline int fs_linear_get_path(void)
{
    return fs_lin_path < 0 ? fs_linf_auto() : fs_lin_path;
}
/* 1 when the bf16 products run on AMX tiles now: their weights must then be packed by
 * fs_pack_bf16_amx (fs_amx_packed_len), else by fs_pack_f32h (fs_packed_len). */
static inline int fs_linear_bf16_amx(void) { return fs_linear_get_path() == FS_ISA_AMX; }
/* 1 when this build has the AMX kernel (GCC >= 11 on x86-64 Linux). */
static inline int fs_linear_amx_built(void) { return FS_AMX_BUILD; }

/* Threads for large products: 1 by default. On a loaded machine (or one shared with other
 * BLAS/OpenMP users) a descheduled worker stalls every barrier, which costs far more than
 * the bandwidth a second core adds to a decode step; callers opt in. */
static int fs_lin_nthreads = 1;
static inline void fs_linear_set_threads(int n) { fs_lin_nthreads = n < 1 ? 1 : n; }
static inline int fs_linear_get_threads(void) { return fs_lin_nthreads; }
#if FS_LIN_OMP
#define FS_LIN_PRAGMA_PARALLEL _Pragma("omp parallel for num_threads(parts) schedule(static, 1)")
static inline int fs_lin_threads(void) { return fs_lin_nthreads; }
#else
#define FS_LIN_PRAGMA_PARALLEL
static inline int fs_lin_threads(void) { return 1; }
#endif

/* One row, columns [lo, hi): four rows of W per pass over y (which stays in L1). */
FS_ALWAYS_INLINE void fs_lin_row_f64(const double *FS_RESTRICT x, const double *FS_RESTRICT W,
                                    double *FS_RESTRICT y, int in, int out, int lo, int hi,
                                    int accumulate)
{
    if (!accumulate)
        for (int c = lo; c < hi; c++) y[c] = (double)0;
    int k = 0;
    for (; k + 4 <= in; k += 4) {
        const double a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
        const double *w0 = W + (size_t)k * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;
        for (int c = lo; c < hi; c++)
            y[c] += (a0 * w0[c] + a1 * w1[c]) + (a2 * w2[c] + a3 * w3[c]);
    }
    for (; k < in; k++) {
        const double a = x[k];
        const double *w = W + (size_t)k * out;
        for (int c = lo; c < hi; c++) y[c] += a * w[c];
    }
}

/* Columns [c0, hi) not covered by vector tiles: plain axpy rows. */
FS_ALWAYS_INLINE void fs_lin_tail_f64(const double *FS_RESTRICT x, const double *FS_RESTRICT W,
                                     double *FS_RESTRICT y, int R, int in, int out, int c0,
                                     int hi, int accumulate)
{
    for (int r = 0; r < R; r++) {
        double *yr = y + (size_t)r * out;
        if (!accumulate)
            for (int c = c0; c < hi; c++) yr[c] = (double)0;
        for (int k = 0; k < in; k++) {
            const double a = x[(size_t)r * in + k];
            const double *w = W + (size_t)k * out;
            for (int c = c0; c < hi; c++) yr[c] += a * w[c];
        }
    }
}

/* All n rows, columns [lo, hi). */
FS_CLONES static void fs_linear_part_f64(const double *x, const double *W, double *y, int n,
                                          int in, int out, int lo, int hi, int accumulate)
{
    /* Split n rows into passes of at most FS_LIN_MAXR, as even as possible. */
    int passes = (n + FS_LIN_MAXR - 1) / FS_LIN_MAXR;
    int r0 = 0;
    for (int p = 0; p < passes; p++) {
        int R = (n - r0 + (passes - p) - 1) / (passes - p);
        const double *xp = x + (size_t)r0 * in;
        double *yp = y + (size_t)r0 * out;
        if (R == 1) {
            fs_lin_row_f64(xp, W, yp, in, out, lo, hi, accumulate);
        } else {
            int c0 = FS_LIN_VEC_F64(xp, W, yp, R, in, out, lo, hi, accumulate);
            if (c0 < hi) fs_lin_tail_f64(xp, W, yp, R, in, out, c0, hi, accumulate);
        }
        r0 += R;
    }
}

#define FS_T double
#define FS_WT double
#define FS_SFX f64
#include "fs_linear_api_impl.h"

#define FS_T float
#define FS_WT float
#define FS_SFX f32
#if !defined(__GNUC__)
#define FS_WIDEN(w) (w)
#endif
#include "fs_linear_api_impl.h"

#define FS_T float
#define FS_WT uint16_t
#define FS_SFX f32h
#if !defined(__GNUC__)
#define FS_WIDEN(w) fs_h2f(w)
#endif
#include "fs_linear_api_impl.h"

#define FS_T float
#define FS_WT uint16_t
#define FS_SFX f32b
#if !defined(__GNUC__)
#define FS_WIDEN(w) fs_bf2f(w)
#endif
#include "fs_linear_api_impl.h"

#if FS_AMX_BUILD
/* y (n, out) [+]= round_bf16(x) @ W [+ bias] on AMX tiles, W packed by fs_pack_bf16_amx; the
 * rows are rounded once into xa (n * fs_amx_kp(in) bf16 bits), then the column tiles are
 * split between threads in groups of FS_AMX_G (each thread configures its own tiles). */
static void fs_linear_f32b_amx(const float *x, const uint16_t *P, const float *bias, float *y,
                               int n, int in, int out, int accumulate, uint16_t *xa)
{
    int kp = fs_amx_kp(in), nt = (out + 15) / 16, parts = 1;
    fs_amx_round_rows(x, n, in, kp, xa);
    if (FS_LIN_OMP && (size_t)in * out >= FS_LIN_PARALLEL_MIN && out >= 128)
        parts = fs_lin_threads();
    if (parts <= 1) {
        fs_amx_part(xa, kp, P, y, n, out, 0, nt, accumulate);
    } else {
        int groups = (nt + FS_AMX_G - 1) / FS_AMX_G, chunk = (groups + parts - 1) / parts;
        FS_LIN_PRAGMA_PARALLEL
        for (int p = 0; p < parts; p++) {
            int lo = p * chunk * FS_AMX_G, hi = lo + chunk * FS_AMX_G < nt ? lo + chunk * FS_AMX_G
                                                                         : nt;
            if (lo < hi) fs_amx_part(xa, kp, P, y, n, out, lo, hi, accumulate);
        }
    }
    if (bias != NULL)
        for (int r = 0; r < n; r++)
            for (int c = 0; c < out; c++) y[(size_t)r * out + c] += bias[c];
}
#endif

/* The bf16 compute rule: y (n, out) [+]= round_bf16(x) @ W for bf16 W (packed), the rounded
 * rows written to xr (n * max(in, 16) floats; x itself when in >= 16) once, before any
 * thread starts. On the AMX path W is in the tile layout and xr receives the rows as bf16 bits
 * (n * fs_amx_kp(in) of them, which fit: fs_amx_kp(in) <= 2 * max(in, 16)). */
static void fs_linear_f32b_round(const float *x, const uint16_t *W, const float *bias, float *y,
                                 int n, int in, int out, int accumulate, float *xr)
{
#if FS_AMX_BUILD
    if (fs_linear_bf16_amx()) {  /* W in the tile layout; xr holds the rows as bf16 bits */
        fs_linear_f32b_amx(x, W, bias, y, n, in, out, accumulate, (uint16_t *)(void *)xr);
        return;
    }
#endif
    fs_round_bf16(x, xr, (size_t)n * in);
    fs_linear_f32b(xr, W, bias, y, n, in, out, accumulate);
}

#endif /* FS_LINEAR_H */
