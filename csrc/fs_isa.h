/* fs_isa.h -- the CPU features, the ISA paths and the ONE dispatch table of the core.
 *
 * Detection (fs_isa.c): the x86-64 features the matrix-product paths need.
 *
 * fs_isa_detect fills an fs_isa_features from CPUID (leaf 1: FMA, F16C, OSXSAVE; leaf 7
 * subleaf 0: AVX2, AVX512F, AVX512_VNNI, AMX_BF16, AMX_TILE, AMX_INT8; leaf 7 subleaf 1:
 * AVX512_BF16, AVX_VNNI) and XGETBV: a
 * feature counts only when the OS saves its registers (XCR0: ymm for AVX2, opmask/zmm for
 * AVX-512, XTILECFG/XTILEDATA for AMX). On Linux, when the CPU has AMX, it also asks the kernel
 * for permission to use tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)):
 * without that grant the first tile instruction faults, so amx_tile is reported only when
 * the grant succeeds (amx_cpu says what the CPU itself has).
 *
 * Other compilers or architectures report no features (the portable path only).
 *
 * The dispatch table (fs_dispatch) holds the path every packed float product runs, the
 * thread pool (fs_pool.h) and a function pointer per ISA-variant kernel (fs_variants.h
 * declares the variants, each in its own file). Every core function that has variants calls
 * through fs_disp. A process holds one table: each extension module links its own copy of the
 * core (a static library), so the owner, fastspec.kernels._isa, fills its copy at import
 * (fs_isa_init, then FASTSPEC_ISA) and every other extension points its copy's fs_disp at
 * the owner's table (fs_isa_share) when it is imported; set_isa and set_threads then change
 * what every extension runs, and every fs_pool_run of the process reaches the owner's pool
 * (one set of workers). Before fs_isa_init a copy's table is valid but portable (the baseline
 * variants, its own pool at one thread): the C harnesses of tests/c use it without Python.
 */
#ifndef FS_ISA_H
#define FS_ISA_H

#include <stdint.h>

#include "fs_pool.h"

typedef struct {
    int avx2, fma, f16c, avx512f, avx512bf16;
    int amx_cpu;      /* AMX_TILE and AMX_BF16 in CPUID (and XCR0 tile state) */
    int amx_tile;     /* amx_cpu and the OS granted tile data to this process */
    int amx_bf16;     /* amx_tile and AMX_BF16 */
    int avx512vnni;   /* avx512f, AVX512_VNNI, AVX512VL and AVX512BW (the quantized products) */
    int avx_vnni;     /* AVX-VNNI (VEX-encoded vpdpbusd on ymm) and avx2 */
    int amx_int8;     /* amx_tile and AMX_INT8 */
} fs_isa_features;

/* Matrix-product paths, in order of preference (fs_isa_auto: not avx512bf16 on Intel). */
enum { FS_ISA_PORTABLE = 0, FS_ISA_AVX2 = 1, FS_ISA_AVX512 = 2, FS_ISA_AVX512BF16 = 3,
       FS_ISA_AMX = 4 };

void fs_isa_detect(fs_isa_features *f);
/* Whether path p can run on a CPU with features f (its instructions exist and are enabled). */
int fs_isa_supported(const fs_isa_features *f, int p);

/* The packed float products' columns [lo, hi) of y (n, out) [+]= x (n, in) @ P (fs_linear.h):
 * float weights, and 16-bit ones (binary16 or bfloat16 bits). */
typedef void (*fs_linf_f32_fn)(const float *x, const float *P, float *y, int n, int in,
                               int out, int lo, int hi, int accumulate);
typedef void (*fs_linf_u16_fn)(const float *x, const uint16_t *P, float *y, int n, int in,
                               int out, int lo, int hi, int accumulate);
/* One block of query rows of the tiled float attention (fs_attention.c), and the
 * transposition of a kv head's keys its scores may read instead of the keys. kh16, vh16:
 * a float16 cache's head (kh, vh unused), else NULL. */
typedef void (*fs_attn_block_fn)(const float *const *qrows, float *const *orows,
                                 const int *count, int rows, const float *kh, const float *vh,
                                 int head_dim, float scale, int base, const int32_t *anc,
                                 const float *kt, int kt_keys, const uint16_t *kh16,
                                 const uint16_t *vh16);
typedef void (*fs_attn_keys_fn)(const float *k, int keys, int head_dim, float *kt);

/* The quantized products' columns (fs_quant_kern.h: panels [g_lo, g_hi) of all rows). */
struct fs_qact;
typedef void (*fs_qpart_fn)(int kind, const struct fs_qact *a, const uint8_t *P, float *y,
                            int out, int g_lo, int g_hi, int accumulate);

typedef struct {
    int ready;       /* fs_isa_init ran on this table */
    int path;        /* FS_ISA_* of the packed float products (AMX: bf16 on tiles) */
    const fs_pool_ops *pool;  /* the process's thread pool (the owner copy's fs_pool_local) */
    int amx;         /* the CPU runs AMX tiles and Linux granted them (built in too) */
    int bf16dp;      /* the CPU runs AVX512-BF16 (and the kernel is built in) */
    fs_linf_f32_fn linf_f32;
    fs_linf_u16_fn linf_f32h, linf_f32b;
    /* The variant of the path (fs_isa_select_attn: its vector width; never depends on n), so a
     * forced path runs the attention a CPU of that path runs, with that variant's bits. */
    fs_attn_block_fn attn_f32;
    fs_attn_keys_fn attn_f32_keys;  /* its transposed keys (the same variant), or NULL */
    /* The quantized products of the path (fs_quant.h): qpart_big for blocks of at least
     * qbig_rows rows (AMX tiles), else qpart_mid from qmid_rows rows, else qpart
     * (FS_Q_USE_BIG, FS_Q_USE_MID), qpart_one_wide before them (FS_Q_USE_ONE_WIDE); their
     * names: fs_isa_quant_kernel. */
    fs_qpart_fn qpart, qpart_big;
    int qbig_rows[3];  /* per kind (FS_Q8_0, FS_Q4_0, FS_Q4_1) */
    int qbig_max_nb;  /* qpart_big for rows of at most this many blocks */
    /* where qpart_big does not run: qpart_mid (qpart's reads) from qmid_rows rows (the amx
     * path's rows longer than its tiles take: avx512_vnni_x16) */
    fs_qpart_fn qpart_mid;
    int qmid_rows[3];
    int qreads, qreads_big;  /* FS_QREAD_* of qpart (and qpart_mid), qpart_big */
    /* a one-row product's prefetch distance into L1, without L2 (fs_qact.pf_one; 0: as blocks):
     * FS_Q_PF_ONE_INTEL on an Intel CPU (or FS_Q_PF_ONE where defined), from fs_isa_init,
     * whatever the path */
    int qpf_one;
    /* a one-row product of rows of at least FS_Q_ONE_STREAM_MIN_IN inputs where qpf_one is set:
     * the path's zmm tiles of panel pairs (avx512_vnni_x16, qpart's reads) where it has them,
     * else NULL (qpart) */
    fs_qpart_fn qpart_one_wide;
} fs_dispatch;

/* What a quantized product reads of its activations (fs_qact) besides the row-major q, d, ds
 * and s, which every call fills: FS_QREAD_UNSIGNED, q + 128 (q8_0 on the VNNI variants), and
 * FS_QREAD_INTERLEAVED, the block-interleaved copies of a block of rows (the x86 tiles; the
 * AMX tiles and the portable C read the row-major arrays). fs_linear_q_many fills only what
 * its products read. */
#define FS_QREAD_UNSIGNED 1
#define FS_QREAD_INTERLEAVED 2

/* The table this copy of the core reads. */
extern fs_dispatch *fs_disp;

/* Fill this copy's own table from the CPU (automatic path); idempotent. */
void fs_isa_init(void);
/* The table this copy reads (initialised), for fs_isa_share in the other extensions. */
fs_dispatch *fs_isa_table(void);
/* Read `owner` (another copy's fs_isa_table()) from now on. */
void fs_isa_share(fs_dispatch *owner);

/* Force path p (-1: automatic); returns 0, or -1 when this build or CPU cannot run it. Set it
 * while no product or attention runs, and repack bf16 weights after a change
 * (fs_linear_bf16_amx says which layout). */
int fs_linear_set_path(int p);
/* The path the next product runs. */
int fs_linear_get_path(void);
/* 1 when the bf16 products run in the tile layout now (the AMX or the AVX512-BF16 path): their
 * weights must then be packed by fs_pack_bf16_amx (fs_amx_packed_len), else by fs_pack_f32h
 * (fs_packed_len). */
int fs_linear_bf16_amx(void);
/* 1 when this build has the AMX kernel (GCC >= 11 on x86-64 Linux). */
int fs_linear_amx_built(void);
/* 1 when this build has the AVX512-BF16 kernel (the same compilers). */
int fs_linear_bf16dp_built(void);
/* The pool's thread count (aliases of fs_pool_set_threads and fs_pool_threads): 1 until set
 * (the Python layer sets the CPUs the process may run on at import). */
void fs_linear_set_threads(int n);
int fs_linear_get_threads(void);
/* The quantized products' kernel path p runs for blocks of n rows of in inputs of weights of
 * kind `kind` (fs_quant.h), whether or not p is the current path: "portable", "avx2",
 * "avx_vnni", "avx512_vnni", "avx512_vnni_x16" or "amx_int8" (in <= 0: a width every kernel
 * takes). */
const char *fs_isa_quant_kernel(int p, int kind, int n, int in);
/* The widest rows (inputs) path p's block kernel takes, or 0 for no limit (the AMX tiles:
 * FS_Q_AMX_MAX_NB blocks; longer rows run the path's qpart_mid / qpart). */
int fs_isa_quant_max_in(int p);

#endif /* FS_ISA_H */
