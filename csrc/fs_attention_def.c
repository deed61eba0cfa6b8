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
#include "fs_attention_f32.inc"
#endif
