/* fs_attention_def.c -- the tiled float attention block (fs_attention_f32.inc) for the
 * build's own target: 16-lane generic vectors, or 8 lanes when the build itself targets AVX2
 * without AVX-512 (no variants then). */
#include "fs_variants.h"

#if FS_HAVE_VEC
#define FS_SFX def
#define FS_ATTR
#if !FS_ATTN_VARIANTS && defined(__AVX2__) && !defined(__AVX512F__)
#define FS_W 8
#else
#define FS_W 16
#endif
/* float16 caches: the build's own conversions where it has them, else fs_h2f */
#if defined(__AVX512F__)
#define FS_F16C 16
#include <immintrin.h>
#elif defined(__F16C__) && defined(__AVX__)
#define FS_F16C 8
#include <immintrin.h>
#else
#define FS_F16C 0
#endif
#include "fs_attention_f32.inc"
#endif
