/* fs_attention_avx2.c -- the tiled float attention block (fs_attention_f32.inc):
 * the AVX2 + FMA variant (x86-64-v3), 8-lane vectors: every sum a ymm register. */
#include "fs_variants.h"

#if FS_ATTN_VARIANTS
#define FS_SFX avx2
#define FS_ATTR __attribute__((target("arch=x86-64-v3")))
#define FS_W 8
#define FS_VREG "+x"
#define FS_F16C 8
#include <immintrin.h>
#include "fs_attention_f32.inc"
#endif
