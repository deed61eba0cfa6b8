/* fs_isa.c -- CPU feature detection, the one dispatch table and the path state (fs_isa.h). */
#include "fs_isa.h"
#include "fs_variants.h"
#include "fs_quant.h"
#include "fs_quant_kern.h"

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

#if FS_ISA_X86
static unsigned long long fs_isa_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Ask Linux for the AMX tile-data state (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA =
 * 18); returns 1 when granted. Idempotent: a second request for a granted feature succeeds. */
static int fs_isa_request_amx(void)
{
#if FS_ISA_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

void fs_isa_detect(fs_isa_features *f)
{
    f->avx2 = f->fma = f->f16c = f->avx512f = f->avx512bf16 = 0;
    f->amx_cpu = f->amx_tile = f->amx_bf16 = 0;
    f->avx512vnni = f->avx_vnni = f->amx_int8 = 0;
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
    int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
    /* VNNI: ECX bit 11; VL: EBX bit 31; BW: EBX bit 30 */
    f->avx512vnni = f->avx512f && ((c >> 11) & 1) && ((b >> 31) & 1) && ((b >> 30) & 1);
    if (sub_max >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512bf16 = f->avx512f && ((a >> 5) & 1);
        f->avx_vnni = f->avx2 && ((a >> 4) & 1);
    }
    f->amx_cpu = os_tiles && amx_tile && amx_bf16;
    if (f->amx_cpu && fs_isa_request_amx()) {
        f->amx_tile = 1;
        f->amx_bf16 = 1;
        f->amx_int8 = amx_int8;
    }
#endif
}

/* Whether path p can run on a CPU with features f (its instructions exist and are enabled). */
int fs_isa_supported(const fs_isa_features *f, int p)
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


/* Transposed keys for an AVX-512 attention variant only (fs_isa_select_attn): the baseline
 * one is AVX-512 where the build targets it (FS_ATTN_VARIANTS 0, e.g. FASTSPEC_NATIVE=1 on an
 * AVX-512 CPU), and then keeps them. */
#if FS_HAVE_VEC && defined(__AVX512F__)
#define FS_F32_KEYS_OWN fs_f32_keys_def
#else
#define FS_F32_KEYS_OWN 0
#endif

/* Until fs_isa_init: the baseline variants and this copy's pool, valid on any CPU. */
static fs_dispatch fs_own = {
    0, FS_ISA_PORTABLE, &fs_pool_local, 0, 0, fs_linf_part_f32_def, fs_linf_part_f32h_def,
    fs_linf_part_f32b_def,
#if FS_HAVE_VEC
    fs_f32_block_def, FS_F32_KEYS_OWN,
#else
    0, 0,
#endif
    fs_qpart_def, fs_qpart_def, {1 << 30, 1 << 30, 1 << 30}, 1 << 30,
    fs_qpart_def, {1 << 30, 1 << 30, 1 << 30}, 0, 0, 0, 0,
};
fs_dispatch *fs_disp = &fs_own;

/* Whether the CPU is an Intel one (its CPUID vendor string). */
static int fs_isa_intel(void)
{
#if FS_ISA_X86
    unsigned int a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return !memcmp(&b, "Genu", 4) && !memcmp(&d, "ineI", 4) && !memcmp(&c, "ntel", 4);
#else
    return 0;
#endif
}

/* The widest product path the CPU runs (AMX only with the tile-data grant). The avx512bf16
 * path only on a CPU that is not an Intel one: there VDPBF16PS runs at half the rate of the
 * float32 FMA, so the AVX-512 panels' bf16 products (weights widened by a shift) are faster.
 * Measured on an Intel Xeon guest without AMX (family 6 model 207, 2026-12-07): 12 or 24
 * independent chains of zmm VDPBF16PS, 0.46 a cycle (14.7 multiply-adds) against 1.8
 * VFMADD231PS (29); bench/test_bench_linear.py, 1 thread, a layer's seven products (W from
 * memory), tiles -> panels: 8 rows 4.30 -> 2.74 ms, 16 rows 8.55 -> 5.65, 1-4 rows within 9%;
 * the 576 x 49152 head 5.36 -> 3.51 and 11.07 -> 7.53 ms; the SmolLM-135M shape's step (bf16,
 * context 64, paths interleaved in one process, medians of 6 and of 9 rounds) 1 thread: 8 rows
 * 29.7 -> 25.7 and 31.3 -> 30.9 ms, 16 rows 55.8 -> 44.6 and 61.1 -> 51.2; 2 threads: 19.9
 * -> 18.2 and 20.5 -> 18.2, 36.5 -> 31.5 and 36.6 -> 32.6; decode within the noise (minima
 * 18.0-19.9 -> 18.5-20.7 at 1 thread, 11.3-12.8 -> 12.1-12.9 at 2). On a Zen 4 VDPBF16PS
 * runs one a cycle, twice its zmm FMA (docs/PERFORMANCE.md). FASTSPEC_ISA=avx512bf16 still
 * selects it on any CPU that has it. */
static int fs_isa_auto(const fs_dispatch *t)
{
#if FS_LINF_SIMD
    if (t->amx) return FS_ISA_AMX;
    if (t->bf16dp && !fs_isa_intel()) return FS_ISA_AVX512BF16;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c")) return FS_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && __builtin_cpu_supports("f16c"))
        return FS_ISA_AVX2;
#else
    (void)t;
#endif
    return FS_ISA_PORTABLE;
}

/* The quantized products of path p (fs_quant_kern.h): the avx2 path runs vpmaddubsw (what
 * an AVX2-only CPU runs), or AVX-VNNI on a CPU that has it but no AVX-512 (where avx2 is the
 * widest path); the avx512 paths run AVX512-VNNI when the CPU has it (ymm tiles, zmm tiles
 * of panel pairs from FS_Q_X16_MIN_ROWS rows); the amx path runs
 * AMX-INT8 tiles for blocks of FS_Q_AMX_MIN_ROWS rows or more, and the avx512 path's kernels
 * for rows longer than FS_Q_AMX_MAX_NB blocks (its `mid`). Every choice gives the same bits. */
static fs_isa_features fs_q_feat;
static int fs_q_feat_ready;
typedef struct {
    fs_qpart_fn fn, big, mid;
    const char *name, *name_big, *name_mid;
    int rows, rows4;  /* q8_0's and q4's fewest rows for big */
    int max_nb;       /* big's most blocks a row */
    int mid_rows, mid_rows4;  /* without big, mid (fn's reads) from this many rows */
    int reads, reads_big;  /* FS_QREAD_* */
    fs_qpart_fn one_wide;  /* fs_dispatch.qpart_one_wide (NULL: none) */
    const char *name_one_wide;
} fs_q_choice;
static fs_q_choice fs_q_choose(int p)
{
    fs_q_choice c = {fs_qpart_def, fs_qpart_def, fs_qpart_def, "portable", "portable", "portable",
                     1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 0, 0};
#if FS_Q_SIMD
    if (!fs_q_feat_ready) {
        fs_isa_detect(&fs_q_feat);
        fs_q_feat_ready = 1;
    }
    const fs_isa_features *f = &fs_q_feat;
    if (p == FS_ISA_AVX2 || (p >= FS_ISA_AVX512 && !f->avx512vnni)) {
        int vnni = f->avx_vnni && (p >= FS_ISA_AVX512 || !f->avx512f);
        c.fn = c.big = vnni ? fs_qpart_avxvnni : fs_qpart_avx2;
        c.name = c.name_big = vnni ? "avx_vnni" : "avx2";
        c.reads = c.reads_big = FS_QREAD_INTERLEAVED | (vnni ? FS_QREAD_UNSIGNED : 0);
    } else if (p >= FS_ISA_AVX512) {
        c.fn = fs_qpart_avx512vnni;
        c.big = fs_qpart_avx512vnni16;
        c.name = "avx512_vnni";
        c.name_big = "avx512_vnni_x16";
        c.one_wide = fs_qpart_avx512vnni16;
        c.name_one_wide = "avx512_vnni_x16";
        c.rows = FS_Q_X16_MIN_ROWS;
        c.rows4 = FS_Q_X16_MIN_ROWS_Q4;
        c.reads = c.reads_big = FS_QREAD_INTERLEAVED | FS_QREAD_UNSIGNED;
    }
#if FS_Q_AMX
    if (p == FS_ISA_AMX && f->amx_int8) {
        c.big = fs_qpart_amx;
        c.name_big = "amx_int8";
        c.rows = FS_Q_AMX_MIN_ROWS;
        c.rows4 = FS_Q_AMX_MIN_ROWS_Q4;
        c.max_nb = FS_Q_AMX_MAX_NB;
        c.reads_big = 0;  /* row-major q, d, ds, s */
        /* rows too long for the tiles run the avx512 path's kernels, x16 for blocks (where
         * the CPU has AVX512-VNNI: a guest may grant AMX-INT8 without it) */
        if (f->avx512vnni) {
            c.mid = fs_qpart_avx512vnni16;
            c.name_mid = "avx512_vnni_x16";
            c.mid_rows = FS_Q_X16_MIN_ROWS;
            c.mid_rows4 = FS_Q_X16_MIN_ROWS_Q4;
        }
    }
#endif
#else
    (void)p;
#endif
    return c;
}

static void fs_isa_select_q(fs_dispatch *t, int p)
{
    fs_q_choice c = fs_q_choose(p);
    t->qpart = c.fn;
    t->qpart_big = c.big;
    t->qbig_rows[0] = c.rows;
    t->qbig_rows[1] = t->qbig_rows[2] = c.rows4;
    t->qbig_max_nb = c.max_nb;
    t->qpart_mid = c.mid;
    t->qmid_rows[0] = c.mid_rows;
    t->qmid_rows[1] = t->qmid_rows[2] = c.mid_rows4;
    t->qreads = c.reads;
    t->qreads_big = c.reads_big;
    t->qpart_one_wide = c.one_wide;
}

const char *fs_isa_quant_kernel(int p, int kind, int n, int in)
{
    fs_q_choice c = fs_q_choose(p);
    int nb = in > 0 ? in / FS_Q_BLOCK : 0;
    if (FS_Q_USE_ONE_WIDE(n, in, fs_disp->qpf_one) && c.one_wide) return c.name_one_wide;
    if (FS_Q_USE_BIG(n, nb, kind == 0 ? c.rows : c.rows4, c.max_nb)) return c.name_big;
    return FS_Q_USE_MID(n, kind == 0 ? c.mid_rows : c.mid_rows4) ? c.name_mid : c.name;
}

int fs_isa_quant_max_in(int p)
{
    fs_q_choice c = fs_q_choose(p);
    return c.max_nb < (1 << 30) / FS_Q_BLOCK ? c.max_nb * FS_Q_BLOCK : 0;
}

/* The float attention variant of path p: its vector width, so a forced path (FASTSPEC_ISA=avx2
 * on an AVX-512 CPU) runs what a CPU of that path runs, attention included (8- and 16-lane
 * sums round differently: each path its own bits, as its products).
 * Transposed keys (fs_attention.c) for the AVX-512 variant only. The AVX2 one scores from a
 * transposed panel with two broadcasts of query values and one key load per two multiply-adds
 * (AVX-512 folds the broadcasts into its multiply-adds), against three loads per four
 * multiply-adds from the keys as they are. Measured on the Zen 4 EPYC, forced AVX2, 1 thread,
 * blocks that transposed (24-64 query rows a kv head; us a call, min of 3 processes,
 * transposed -> as they are): head_dim 64, 9 heads on 3, 300 keys, 8 rows 98 -> 92, 4096 keys
 * 16 rows 2747 -> 2524; head_dim 128, 8 on 2, 300 keys 8 rows 171 -> 139, 4096 keys 3341 ->
 * 2511; head_dim 256, 4 on 1, 1024 keys 8 rows 659 -> 460. The baseline variant lost ~10% as
 * well (head_dim 64, 300 keys, 16 rows 1766 -> 1635). Their fs_f32_keys stay built (the C
 * harness checks every variant's transposed scores). */
static void fs_isa_select_attn(fs_dispatch *t, int p)
{
#if FS_ATTN_VARIANTS
    if (p >= FS_ISA_AVX512 && __builtin_cpu_supports("x86-64-v4")) {
        t->attn_f32 = fs_f32_block_avx512;
        t->attn_f32_keys = fs_f32_keys_avx512;
    } else if (p >= FS_ISA_AVX2 && __builtin_cpu_supports("x86-64-v3")) {
        t->attn_f32 = fs_f32_block_avx2;
        t->attn_f32_keys = NULL;
    } else {
        t->attn_f32 = fs_f32_block_def;
        t->attn_f32_keys = NULL;
    }
#else
    (void)t;
    (void)p;
#endif
}

/* The product variants of path p (AVX-512 CPUs all have F16C, so the three weight types always
 * run the same arithmetic; the AMX path runs the non-bf16-tile products as AVX-512). */
static void fs_isa_select(fs_dispatch *t, int p)
{
    t->path = p;
    fs_isa_select_q(t, p);
    fs_isa_select_attn(t, p);
#if FS_LINF_SIMD
    if (p >= FS_ISA_AVX512) {
        t->linf_f32 = fs_linf_part_f32_avx512;
        t->linf_f32h = fs_linf_part_f32h_avx512;
        t->linf_f32b = fs_linf_part_f32b_avx512;
        return;
    }
    if (p == FS_ISA_AVX2) {
        t->linf_f32 = fs_linf_part_f32_avx2;
        t->linf_f32h = fs_linf_part_f32h_avx2;
        t->linf_f32b = fs_linf_part_f32b_avx2;
        return;
    }
#endif
    t->linf_f32 = fs_linf_part_f32_def;
    t->linf_f32h = fs_linf_part_f32h_def;
    t->linf_f32b = fs_linf_part_f32b_def;
}

/* fs_dispatch.qpf_one for this CPU (FS_Q_PF_ONE_INTEL, fs_quant_kern.h). */
static int fs_isa_qpf_one(void)
{
#if defined(FS_Q_PF_ONE)
    return FS_Q_PF_ONE;
#else
    return fs_isa_intel() ? FS_Q_PF_ONE_INTEL : 0;
#endif
}

void fs_isa_init(void)
{
    fs_dispatch *t = &fs_own;
    if (t->ready) return;
#if FS_LINF_SIMD || FS_ATTN_VARIANTS
    __builtin_cpu_init(); /* before fs_isa_auto's and fs_isa_select_attn's feature checks */
#endif
#if FS_AMX_BUILD
    fs_isa_features f;
    fs_isa_detect(&f);  /* asks Linux for the tile data once */
    t->amx = f.amx_bf16;
    t->bf16dp = FS_BF16DP_BUILD && f.avx512bf16;  /* (fs_isa_detect: implies avx512f) */
#endif
    fs_isa_select(t, fs_isa_auto(t));
    t->qpf_one = fs_isa_qpf_one();
    t->ready = 1;
}

fs_dispatch *fs_isa_table(void)
{
    if (fs_disp == &fs_own) fs_isa_init();
    return fs_disp;
}

void fs_isa_share(fs_dispatch *owner) { fs_disp = owner; }

int fs_linear_set_path(int p)
{
    fs_dispatch *t = fs_isa_table();
    int best = fs_isa_auto(t);
    int ok = p == FS_ISA_AMX ? t->amx
             : p == FS_ISA_AVX512BF16 ? t->bf16dp
             : p >= -1 && p <= FS_ISA_AVX512 && p <= best;
    if (!ok)
        return -1;
    fs_isa_select(t, p < 0 ? best : p);
    return 0;
}

int fs_linear_get_path(void) { return fs_isa_table()->path; }

int fs_linear_bf16_amx(void)
{
    return fs_disp->path == FS_ISA_AMX || fs_disp->path == FS_ISA_AVX512BF16;
}

int fs_linear_amx_built(void) { return FS_AMX_BUILD; }

int fs_linear_bf16dp_built(void) { return FS_BF16DP_BUILD; }

void fs_linear_set_threads(int n) { fs_pool_set_threads(n); }

int fs_linear_get_threads(void) { return fs_pool_threads(); }
int fs_linf_amx(void) { return fs_isa_table()->amx; }
