/* Runtime detection of the x86-64 features the matrix-product paths need.
 *
 * fs_isa_detect fills an fs_isa_features from CPUID (leaf 1: FMA, F16C, OSXSAVE; leaf 7
 * subleaf 0: AVX2, AVX512F, AMX_BF16, AMX_TILE; leaf 7 subleaf 1: AVX512_BF16) and XGETBV: a
 * feature counts only when the OS saves its registers (XCR0: ymm for AVX2, opmask/zmm for
 * AVX-512, XTILECFG/XTILEDATA for AMX). On Linux, when the CPU has AMX, it also asks the kernel
 * for permission to use tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)):
 * without that grant the first tile instruction faults, so amx_tile is reported only when
 * the grant succeeds (amx_cpu says what the CPU itself has).
 *
 * Other compilers or architectures report no features (the portable path only).
 */
#ifndef FS_ISA_H
#define FS_ISA_H

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FS_ISA_X86 1
#include <cpuid.h>
#else
#define FS_ISA_X86 0
#endif
#if FS_ISA_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef struct {
    int avx2, fma, f16c, avx512f, avx512bf16;
    int amx_cpu;      /* AMX_TILE and AMX_BF16 in CPUID (and XCR0 tile state) */
    int amx_tile;     /* amx_cpu and the OS granted tile data to this process */
    int amx_bf16;     /* amx_tile and AMX_BF16 */
} fs_isa_features;

/* Matrix-product paths, in order of preference. */
enum { FS_ISA_PORTABLE = 0, FS_ISA_AVX2 = 1, FS_ISA_AVX512 = 2, FS_ISA_AVX512BF16 = 3,
       FS_ISA_AMX = 4 };

#if FS_ISA_X86
static inline unsigned long long fs_isa_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Ask Linux for the AMX tile-data state (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA =
 * 18); returns 1 when granted. Idempotent: a second request for a granted feature succeeds. */
static inline int fs_isa_request_amx(void)
{
#if FS_ISA_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

static inline void fs_isa_detect(fs_isa_features *f)
{
    f->avx2 = f->fma = f->f16c = f->avx512f = f->avx512bf16 = 0;
    f->amx_cpu = f->amx_tile = f->amx_bf16 = 0;
#if FS_ISA_X86
    unsigned int a, b, c, d, max_leaf = __get_cpuid_max(0, 0);
    if (max_leaf < 1 || !__get_cpuid(1, &a, &b, &c, &d)) return;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx) return;
    unsigned long long xcr0 = fs_isa_xgetbv0();
    int os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
    int os_tiles = (xcr0 & 0x60000ULL) == 0x60000ULL;
    if (!os_ymm) return;
    f->fma = fma;
    f->f16c = f16c;
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned int sub_max = a;
    f->avx2 = (b >> 5) & 1;
    f->avx512f = os_zmm && ((b >> 16) & 1);
    int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    if (sub_max >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512bf16 = f->avx512f && ((a >> 5) & 1);
    }
    f->amx_cpu = os_tiles && amx_tile && amx_bf16;
    if (f->amx_cpu && fs_isa_request_amx()) {
        f->amx_tile = 1;
        f->amx_bf16 = 1;
    }
#endif
}

/* Whether path p can run on a CPU with features f (its instructions exist and are enabled). */
static inline int fs_isa_supported(const fs_isa_features *f, int p)
{
    switch (p) {
    case FS_ISA_PORTABLE: return 1;
    case FS_ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case FS_ISA_AVX512: return f->avx512f && f->f16c;
    case FS_ISA_AVX512BF16: return f->avx512bf16;
    case FS_ISA_AMX: return f->amx_tile && f->amx_bf16;
    default: return 0;
    }
}

#endif /* FS_ISA_H */
