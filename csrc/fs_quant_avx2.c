/* fs_quant_avx2.c -- the AVX2 variant of the quantized products (fs_quant_x86.inc with
 * vpmaddubsw): what an AVX2-only CPU (Zen 3) runs. */
#include "fs_quant.h"
#include "fs_quant_kern.h"

#if FS_Q_SIMD
#define FS_SFX avx2
#define FS_QATTR __attribute__((target("avx2,fma,f16c")))
#define FS_QRT 4
#define FS_QVNNI 0
#include "fs_quant_x86.inc"
#endif
