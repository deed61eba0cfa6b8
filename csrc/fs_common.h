/* fs_common.h -- what every file of csrc/ shares: portability macros, the function
 * multi-versioning switch, the GCC vector types, the template-instantiation helpers and the
 * tiny static inline helpers used by more than one translation unit (the only function
 * bodies a header of csrc/ holds; csrc/README.md has the layout and its rules).
 *
 * Templates: a body that exists for several element types or ISA variants is written once in
 * a file named fs_*.inc and #included by ONE .c file per instantiation, with FS_T (element
 * type) and FS_SFX (name suffix) -- plus whatever else that body documents -- defined before
 * the include; the body names its functions FS_FN(name) (name_SFX) and #undefs its
 * parameters at its end.
 */
#ifndef FS_COMMON_H
#define FS_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* tests/c builds the core as a compiler without GNU C extensions would (the scalar paths);
 * after the system headers, which need __GNUC__. */
#if defined(FS_TEST_PORTABLE)
#undef __GNUC__
#endif

/* ---- portability ----------------------------------------------------------------------- */

#if defined(__GNUC__)
/* A template body (fs_*.inc) may define a helper that one of its instantiations never
 * calls. */
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

#if defined(__GNUC__)
#define FS_ALWAYS_INLINE static inline __attribute__((always_inline))
#define FS_RESTRICT __restrict__
#else
#define FS_ALWAYS_INLINE static inline
#define FS_RESTRICT
#endif

/* Function multi-versioning: with GCC on x86-64 glibc Linux, FS_CLONES functions are compiled
 * for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA + F16C) and the baseline, and the loader
 * picks one from the CPU flags (ifunc): wide SIMD in a portable wheel without -march=native.
 * Building for AVX-512 already (FASTSPEC_NATIVE=1) makes it pointless; FS_NO_CLONES turns it
 * off. Only loops whose variant nobody needs to choose use it (the double products, the sampling
 * scans, the activations); the packed float products and the float attention tiles are
 * explicit variants in their own files behind the one dispatch table of fs_isa.h, because
 * FASTSPEC_ISA must be able to force one. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && defined(__GLIBC__) && !defined(FS_NO_CLONES) && !defined(__AVX512F__)
#define FS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FS_CLONES
#endif

/* Template instantiation: FS_FN(name) is name_FS_SFX. */
#define FS_CAT_(a, b) a##_##b
#define FS_CAT(a, b) FS_CAT_(a, b)
#define FS_FN(name) FS_CAT(name, FS_SFX)

/* ---- vector types ------------------------------------------------------------------------ */

#if defined(__GNUC__)
#if !defined(__clang__)
/* The vector helpers are always inlined, so the ABI note about passing 64-byte vectors by
 * value does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
/* Generic vectors: GCC/clang map a 64-byte one to one zmm, two ymm or four xmm registers
 * depending on the target (on AVX2, two ymm per vector: see fs_linear.h for why the hot
 * tiles use the native 8-lane fs_v8f there). */
typedef float fs_v16f __attribute__((vector_size(64)));
typedef int fs_v16i __attribute__((vector_size(64)));
typedef uint32_t fs_v16u __attribute__((vector_size(64)));
typedef double fs_v8d __attribute__((vector_size(64)));
typedef uint64_t fs_v8u __attribute__((vector_size(64)));
typedef float fs_v8f __attribute__((vector_size(32)));
typedef int fs_v8i __attribute__((vector_size(32)));
/* The same with element alignment, for loads and stores through a pointer anywhere in an
 * array (the types above assume their own, vector-size alignment). */
typedef float fs_v16f_u __attribute__((vector_size(64), aligned(4)));
typedef double fs_v8d_u __attribute__((vector_size(64), aligned(8)));
typedef float fs_v8f_u __attribute__((vector_size(32), aligned(4)));
#endif

/* Explicit vector loops in the attention and sampling kernels (GCC >= 9 or clang). */
#if defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 9) && !defined(FS_DISABLE_VEC)
#define FS_HAVE_VEC 1
#else
#define FS_HAVE_VEC 0
#endif

#if FS_HAVE_VEC
/* Unaligned, alias-safe loads (memcpy compiles to one vector load). */
FS_ALWAYS_INLINE fs_v8d fs_load8_f64(const double *p)
{
    fs_v8d x;
    memcpy(&x, p, sizeof x);
    return x;
}
FS_ALWAYS_INLINE fs_v8d fs_load8_f32(const float *p)
{
    fs_v8f x;
    memcpy(&x, p, sizeof x);
    return __builtin_convertvector(x, fs_v8d);
}
FS_ALWAYS_INLINE fs_v16f fs_load16(const float *p)
{
    fs_v16f x;
    memcpy(&x, p, sizeof x);
    return x;
}
#define FS_STORE16(p, x) memcpy((p), &(x), sizeof(fs_v16f))
/* Horizontal sum of 8 lanes, always by the same tree. */
#define FS_HSUM8(a) \
    ((((a)[0] + (a)[4]) + ((a)[1] + (a)[5])) + (((a)[2] + (a)[6]) + ((a)[3] + (a)[7])))
#endif

/* ---- scalar math ------------------------------------------------------------------------- */

/* exp(x) for x <= 0 in double, branch-free so loops over it vectorise (glibc's exp does not).
 * Relative error ~1e-15; x < -708 gives 0 (below 1e-307 of a softmax row's maximum, 1). Used
 * by the softmax of attention and probs and by the model's activations. */
static inline double fs_exp_nonpos(double x)
{
    const double log2e = 1.4426950408889634074;
    const double ln2_hi = 6.93147180369123816490e-01;
    const double ln2_lo = 1.90821492927058770002e-10;
    const double shifter = 6755399441055744.0; /* 1.5 * 2^52: rounds to integer in the low bits */
    double xc = x < -708.0 ? -708.0 : x;
    double kd = xc * log2e + shifter;
    uint64_t kbits;
    memcpy(&kbits, &kd, sizeof kbits);
    kd -= shifter;
    double r = (xc - kd * ln2_hi) - kd * ln2_lo; /* |r| <= ln2 / 2 */
    /* Taylor polynomial of degree 12 in Horner form: error < 2e-16 on |r| <= 0.347 */
    double p = 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t sbits = (kbits + 1023u) << 52; /* 2^k, k in [-1022, 0] */
    double scale;
    memcpy(&scale, &sbits, sizeof scale);
    return x < -708.0 ? 0.0 : p * scale;
}

/* exp(x) for x <= 0 in float, branch-free (vectorises): 2^k p(r), |r| <= ln2 / 2, with a
 * degree-7 polynomial; relative error ~2e-7. x < -87 gives 0. For float activations. */
static inline float fs_expf_nonpos(float x)
{
    const float shifter = 12582912.0f; /* 1.5 * 2^23: rounds to integer in the low bits */
    float xc = x < -87.0f ? -87.0f : x;
    float kd = xc * 1.44269504f + shifter;
    uint32_t kbits;
    memcpy(&kbits, &kd, sizeof kbits);
    kd -= shifter;
    float r = (xc - kd * 0.693145752f) - kd * 1.42860677e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t sbits = (kbits - 0x4B400000u + 127u) << 23; /* 2^k, k in [-126, 0] */
    float scale;
    memcpy(&scale, &sbits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

/* silu(g) = g / (1 + exp(-g)) in float, through exp(-|g|) only, for float activations (the
 * model's double formula costs twice per lane, and its division dominates): within 3.3 ulp of
 * it on [-87, 100]; -0 below -87, like the NumPy twin's float32 overflow (tests/c/activ.c). */
static inline float fs_silu_f(float g)
{
    float e = fs_expf_nonpos(g < 0 ? g : -g);
    return (g >= 0 ? g : g * e) / (1.0f + e);
}

/* binary16 bits -> float, exactly (normals, subnormals, zeros, infinities, NaNs). */
static inline float fs_h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    float f;
    if (e == 0) {  /* zero or subnormal: m * 2^-24, exact in float */
        f = (float)m * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    bits = sign | (e == 0x1f ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The binary16 bits (no sign) of a float's magnitude ax that rounds to a normal binary16
 * value (2^-14 <= value < 65520): the exponent rebiased, the 13 dropped bits rounded to
 * nearest, ties to even. No branch: fs_transcode.c's loops vectorize with it. */
static inline uint32_t fs_f2h_normal(uint32_t ax)
{
    uint32_t r = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
    return r + ((uint32_t)(rem > 0x1000u) | ((uint32_t)(rem == 0x1000u) & r));
}

/* float -> binary16 bits, nearest (ties to even), as numpy's astype(float16): past the
 * largest f16 an infinity, below its subnormals a signed zero, a NaN keeps its sign and the
 * top of its payload (never becoming an infinity). */
static inline uint16_t fs_f2h(float f)
{
    uint32_t x, ax, sign, r, rem, half;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {  /* NaN */
        r = 0x7c00u | ((ax & 0x7fffffu) >> 13);
        return (uint16_t)(sign | (r == 0x7c00u ? 0x7c01u : r));
    }
    if (ax >= 0x477ff000u)  /* infinity, or at least halfway past 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u)  /* normal */
        return (uint16_t)(sign | fs_f2h_normal(ax));
    if (ax <= 0x33000000u)  /* at most 2^-25, half the smallest subnormal: zero (ties even) */
        return (uint16_t)sign;
    {  /* subnormal: (ax's significand) * 2^(e - 150) in units of 2^-24 */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
        r = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        r += rem > half || (rem == half && (r & 1u));
        return (uint16_t)(sign | r);
    }
}

/* fs_f2h, inline for the values a scale almost always has (normal binary16 results and
 * zeros), the rest through fs_f2h: the same bits. */
static inline uint16_t fs_f2h_fast(float f)
{
    uint32_t x, ax;
    memcpy(&x, &f, sizeof x);
    ax = x & 0x7fffffffu;
    if (ax - 0x38800000u < 0x477ff000u - 0x38800000u)  /* as fs_f2h's normal branch */
        return (uint16_t)((x >> 16 & 0x8000u) | fs_f2h_normal(ax));
    return ax == 0 ? (uint16_t)(x >> 16 & 0x8000u) : fs_f2h(f);
}

/* fs_f2h of 16 values: one loop without branches (the compiler vectorizes it) for results
 * that are normal binary16 values or zeros, as fs_f2h rounds them; all 16 again through
 * fs_f2h when one is not (the same bits either way). */
FS_ALWAYS_INLINE void fs_f2h16(const float *v, uint16_t *h)
{
    uint32_t x[16], other = 0;
    memcpy(x, v, sizeof x);
    for (int i = 0; i < 16; i++) {
        uint32_t ax = x[i] & 0x7fffffffu;
        other |= (uint32_t)(ax - 0x38800000u >= 0x477ff000u - 0x38800000u) & (uint32_t)(ax != 0);
        h[i] = (uint16_t)((x[i] >> 16 & 0x8000u) | (ax == 0 ? 0u : fs_f2h_normal(ax)));
    }
    if (other)
        for (int i = 0; i < 16; i++) h[i] = fs_f2h(v[i]);
}

/* A little-endian 16-bit value (a GGUF block's f16 scale) read from / written to bytes. */
static inline uint16_t fs_rd16le(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline void fs_wr16le(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xffu);
    p[1] = (uint8_t)(v >> 8);
}

/* Whether binary16 bits are an infinity or a NaN (the largest exponent). */
static inline int fs_h_nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }

/* bfloat16 bits -> float: the upper half of the float's bits (exact). */
static inline float fs_bf2f(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

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

/* The 64-byte AMX tile configuration that ldtilecfg reads (palette 1): tile t has rows[t]
 * rows of colsb[t] bytes. The AMX variants (fs_linear_amx.c, fs_quant_amx.c) fill one each. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fs_amx_tilecfg;

#endif /* FS_COMMON_H */
