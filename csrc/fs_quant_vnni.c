/* fs_quant_vnni.c -- the VNNI variants of the quantized products (fs_quant_x86.inc with
 * vpdpbusd on 8-column ymm vectors): AVX-VNNI (VEX encoding, 16 registers: client cores
 * without AVX-512) and AVX512-VNNI (EVEX encoding with AVX512VL, 32 registers: larger row
 * tiles). */
#include "fs_quant.h"
#include "fs_quant_kern.h"

#if FS_Q_SIMD
#define FS_SFX avxvnni
#define FS_QATTR __attribute__((target("avx2,fma,f16c,avxvnni")))
#define FS_QRT 6
#define FS_QVNNI 1
#define FS_QDP(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#include "fs_quant_x86.inc"

#define FS_SFX avx512vnni
#define FS_QATTR \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define FS_QRT 8
#define FS_QVNNI 1
#define FS_QDP(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#include "fs_quant_x86.inc"
#endif
