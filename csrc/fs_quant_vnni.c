/* fs_quant_vnni.c -- the VNNI variants of the quantized products (fs_quant_x86.inc with
 * vpdpbusd): AVX-VNNI (VEX encoding, 16 registers: client cores without AVX-512) and
 * AVX512-VNNI (EVEX encoding with AVX512VL, 32 registers: larger row tiles) on 8-column ymm
 * vectors, and AVX512-VNNI on 16-column zmm vectors, a pair of panels at a time, for blocks of
 * rows (fs_isa.c picks it from FS_Q_X16_MIN_ROWS rows).
 *
 * Measured on an AMD EPYC (Zen 5, 1 thread): vpdpbusd retires 2 a cycle on ymm and on zmm
 * alike, and a block's float scaling (vcvtdq2ps, vmulps, vfmadd per row) competes with it for
 * the same two pipes, so the ymm tiles stop near 40 int8 multiply-adds a cycle and the zmm
 * tiles near 80 (weights hot in L2, 8-16 rows). */
#include "fs_quant.h"
#include "fs_quant_kern.h"

#if FS_Q_SIMD
#define FS_SFX avxvnni
#define FS_QATTR __attribute__((target("avx2,fma,f16c,avxvnni")))
#define FS_QRT 6
/* One int32 sum a row and block: with two, a 6-row tile keeps 22 vectors live in 16 registers
 * and GCC spilled 12-45 of them a block. Timed on the Zen 5 EPYC with a C loop over
 * fs_qpart_avxvnni (hot in L2, 1 thread, 576 x 1536 and 1536 x 576, int8 multiply-adds a cycle,
 * two sums -> one, four rounds): q8_0 6 rows 33.1-41.1 -> 42.7-46.3, 8 rows 29.2-40.7 ->
 * 39.7-43.5, 16 rows 37.1-42.7 -> 41.9-46.0; q4_1 6 rows 39.3-43.3 -> 43.5-47.9, 16 rows
 * 39.6-43.3 -> 42.6-46.5; 1-4 rows the same. Not measured on the Intel client cores that run
 * this variant (docs/PERFORMANCE.md). */
#define FS_QACC2 0
#define FS_QVNNI 1
#define FS_QZMM 0
#define FS_QDP(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#include "fs_quant_x86.inc"

#define FS_AVX512VNNI_ATTR \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define FS_SFX avx512vnni
#define FS_QATTR FS_AVX512VNNI_ATTR
#define FS_QRT 8
#define FS_QVNNI 1
#define FS_QZMM 0
#define FS_QDP(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#include "fs_quant_x86.inc"

#define FS_SFX avx512vnni16
#define FS_QATTR FS_AVX512VNNI_ATTR
#define FS_QRT 8
#define FS_QVNNI 1
#define FS_QZMM 1
#define FS_QRTZ 12
#define FS_QDP(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#include "fs_quant_x86.inc"
#endif
