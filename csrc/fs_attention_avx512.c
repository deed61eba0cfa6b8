/* fs_attention_avx512.c -- the tiled float attention block (fs_attention_f32.inc):
 * the AVX-512 variant (x86-64-v4), 16-lane vectors, one zmm each. */
#include "fs_variants.h"

#if FS_ATTN_VARIANTS
#define FS_SFX avx512
#define FS_ATTR __attribute__((target("arch=x86-64-v4")))
#define FS_W 16
#define FS_VREG "+v"
#define FS_F16C 16
#include <immintrin.h>
#include "fs_attention_f32.inc"
#endif
