/* fs_linear_amx.c -- bf16 products on AMX tiles (TDPBF16PS), for fs_linear.h's FS_ISA_AMX path,
 * and the tile layout's packing.
 *
 * fs_amx_part: y (n, out) [+]= xa (n, kp) @ W (in, out) on column tiles [t_lo, t_hi), W bf16
 * bits packed by fs_pack_bf16_amx and xa the input rows rounded to bf16 bits (nearest even,
 * the integer rule of fs_f2bf_bits) by fs_amx_round_rows; the tiles accumulate in float32.
 * fs_linear.c's fs_linear_f32b_tiles is the entry point (threads, bias).
 *
 * Why tiles: one TDPBF16PS multiplies up to 16 rows of 32 inputs by a 32 x 16 weight tile, so
 * a block of up to 16 rows (a verification or a DFlash block) streams the weights once for
 * about the price of one row (a decode step): the products of a block cost what the weights
 * cost to read.
 *
 * Numerics: each output is row m of the tile sum over k steps of 32, and row m of a tile
 * product depends on row m of the input tile alone, so a row gives the same bits alone
 * (decode) as inside a block of any size. The order of the 32 products inside one TDPBF16PS
 * and the instruction's denormal handling (bf16 denormal inputs read as zero, float32
 * denormal results flushed) are the hardware's: the results are not bit-identical to the
 * FMA paths', only equal within the float32 rounding of the sums (tests/test_model_bf16.py
 * compares them with the NumPy twin at BF16_TOL; tests/c/linear_amx.c with a double product).
 *
 * Packed layout (fs_pack_bf16_amx): `in` zero-padded to a multiple of 32 (kp), `out` to a
 * multiple of 16; column tile t (16 columns) at P + 16 * t * kp holds, k step after k step,
 * 16 rows of pairs (k, k + 1) x 16 columns (the "VNNI" order TDPBF16PS reads: element
 * [p][c][e] of step k0 is W[k0 + 2p + e][16 t + c]). FS_AMX_G = 4 tiles share each input
 * tile, so a pass reads four sequential streams at once (measured on the SmolLM-shape decode
 * products, 212 MB: 16.4-16.8 GB/s against 15.8-16.1 for the same tiles as one stream).
 *
 * Only GCC on x86-64 Linux builds the kernel (FS_AMX_BUILD, fs_variants.h); the caller runs it
 * only when fs_isa.h reports AMX with the tile-data grant (the path of fs_isa.c's table).
 */
#include "fs_linear.h"
#include "fs_variants.h"

int fs_amx_kp(int in) { return (in + 31) / 32 * 32; }
size_t fs_amx_packed_len(int in, int out)
{
    return (size_t)fs_amx_kp(in) * ((out + 15) / 16 * 16);
}

void fs_pack_bf16_amx_strided(const uint16_t *W, int in, int out, size_t rs, size_t cs,
                                     uint16_t *P)
{
    int kp = fs_amx_kp(in), nt = (out + 15) / 16;
    for (int t = 0; t < nt; t++)
        for (int k0 = 0; k0 < kp; k0 += 32)
            for (int p = 0; p < 16; p++)
                for (int c = 0; c < 16; c++)
                    for (int e = 0; e < 2; e++) {
                        int k = k0 + 2 * p + e, col = t * 16 + c;
                        *P++ = (k < in && col < out) ? W[(size_t)k * rs + (size_t)col * cs] : 0;
                    }
}
void fs_pack_bf16_amx(const uint16_t *W, int in, int out, uint16_t *P)
{
    fs_pack_bf16_amx_strided(W, in, out, (size_t)out, 1, P);
}

#if FS_AMX_BUILD
/* Software prefetch this many bytes ahead in each of the four weight streams, every line; past
 * a stream's end, the same offset of the next group's stream (so its streams start warm).
 * Measured on the SmolLM-shape decode products with the head, 269 MB on 2 MiB pages: 16.9 ms
 * without, 15.0 with 1 KiB (the AVX-512 FMA kernel: 15.0); 512 B: 16.0, 2-3 KiB: 15.2-15.4. */
#ifndef FS_AMX_PF
#define FS_AMX_PF 1024
#endif

#include <immintrin.h>

#define FS_AMX_ATTR __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

/* Tiles 0..3: sums (m x 16 floats); 4: input (m x 32 bf16); 5..7: weights (16 x 32 bf16). */
static FS_AMX_ATTR void fs_amx_configure(int m)
{
    fs_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = (uint8_t)(t < 5 ? m : 16);
    }
    _tile_loadconfig(&c);
}

/* (AVX-512 only: the AVX512-BF16 path, on CPUs without AMX, rounds its rows here too.) */
__attribute__((target("avx512f,avx512bw"))) void fs_amx_round_rows(const float *x, int m, int in,
                                                                    int kp, uint16_t *xa)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x00400000), half = _mm512_set1_epi32(0x7fff);
    const __m512i one = _mm512_set1_epi32(1);
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * in;
        uint16_t *o = xa + (size_t)r * kp;
        for (int k = 0; k < kp; k += 16) {
            __mmask16 live = k + 16 <= in ? (__mmask16)0xffff
                             : k < in ? (__mmask16)((1u << (in - k)) - 1) : (__mmask16)0;
            __m512i u = _mm512_maskz_loadu_epi32(live, xr + k);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
            __m512i up = _mm512_add_epi32(
                u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
            __m512i r32 = _mm512_mask_or_epi32(up, nan, u, quiet);
            _mm256_storeu_si256((__m256i *)(void *)(o + k),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(r32, 16)));
        }
    }
}

/* Rows m <= 16 of xa (kp bf16 each) times column tiles [t_lo, t_hi) of P (t_lo a multiple of
 * FS_AMX_G), into y (out columns); stage: 16 x 64 floats. Tiles configured for m rows. */
static FS_AMX_ATTR void fs_amx_tiles(const uint16_t *xa, int kp, const uint16_t *P, float *y,
                                     int m, int out, int t_lo, int t_hi, int accumulate,
                                     float *stage)
{
    const int nt = (out + 15) / 16, nk = kp / 32, xs = kp * 2, ss = 64 * (int)sizeof(float);
    for (int t0 = t_lo; t0 < t_hi; t0 += FS_AMX_G) {
        const int g = nt - t0 < FS_AMX_G ? nt - t0 : FS_AMX_G;
        const int c0 = t0 * 16, cols = out - c0 < 16 * g ? out - c0 : 16 * g;
        const uint16_t *b = P + (size_t)16 * t0 * kp;
        /* a full group of 64 columns loads and stores its sums in y itself (rows out floats
         * apart); a narrower one goes through the stage, whose unused columns are zero */
        float *sums = cols == 64 ? y + c0 : stage;
        const int sstride = cols == 64 ? out * (int)sizeof(float) : ss;
        if (accumulate) {
            if (cols < 64)
                for (int r = 0; r < m; r++) {
                    memcpy(stage + r * 64, y + (size_t)r * out + c0,
                           (size_t)cols * sizeof(float));
                    memset(stage + r * 64 + cols, 0, (size_t)(64 - cols) * sizeof(float));
                }
            _tile_loadd(0, sums, sstride);
            _tile_loadd(1, sums + 16, sstride);
            _tile_loadd(2, sums + 32, sstride);
            _tile_loadd(3, sums + 48, sstride);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        }
        const size_t len = (size_t)16 * kp;  /* one tile column: one stream */
        if (g == FS_AMX_G) {
            const uint16_t *b1 = b + len, *b2 = b1 + len, *b3 = b2 + len;
            for (int kc = 0; kc < nk; kc++) {
                const size_t o = (size_t)kc * 512;
                if (FS_AMX_PF) {
                    size_t a = o + FS_AMX_PF / 2;
                    if (a >= len) a += 3 * len;  /* past the stream's end: the next group's */
                    for (int i = 0; i < 512; i += 32) {
                        __builtin_prefetch(b + a + i, 0, 3);
                        __builtin_prefetch(b1 + a + i, 0, 3);
                        __builtin_prefetch(b2 + a + i, 0, 3);
                        __builtin_prefetch(b3 + a + i, 0, 3);
                    }
                }
                _tile_loadd(4, xa + kc * 32, xs);
                _tile_loadd(5, b + o, 64);
                _tile_loadd(6, b1 + o, 64);
                _tile_loadd(7, b2 + o, 64);
                _tile_dpbf16ps(0, 4, 5);
                _tile_dpbf16ps(1, 4, 6);
                _tile_loadd(5, b3 + o, 64);
                _tile_dpbf16ps(2, 4, 7);
                _tile_dpbf16ps(3, 4, 5);
            }
        } else {
            for (int kc = 0; kc < nk; kc++) {
                const size_t o = (size_t)kc * 512;
                _tile_loadd(4, xa + kc * 32, xs);
                _tile_loadd(5, b + o, 64);
                _tile_dpbf16ps(0, 4, 5);
                if (g > 1) {
                    _tile_loadd(6, b + len + o, 64);
                    _tile_dpbf16ps(1, 4, 6);
                }
                if (g > 2) {
                    _tile_loadd(7, b + 2 * len + o, 64);
                    _tile_dpbf16ps(2, 4, 7);
                }
            }
        }
        _tile_stored(0, sums, sstride);
        _tile_stored(1, sums + 16, sstride);
        _tile_stored(2, sums + 32, sstride);
        _tile_stored(3, sums + 48, sstride);
        if (cols < 64)
            for (int r = 0; r < m; r++)
                memcpy(y + (size_t)r * out + c0, stage + r * 64, (size_t)cols * sizeof(float));
    }
}

/* Column tiles [t_lo, t_hi) (t_lo a multiple of FS_AMX_G) of all n rows of xa (n, kp: the
 * input rows as bf16 bits, fs_amx_round_rows), in passes of up to 16 rows. Configures this
 * thread's tiles and releases them. */
FS_AMX_ATTR void fs_amx_part(const uint16_t *xa, int kp, const uint16_t *P, float *y,
                                    int n, int out, int t_lo, int t_hi, int accumulate)
{
    float stage[16 * 64] __attribute__((aligned(64)));
    int configured = 0;
    for (int r0 = 0; r0 < n; r0 += 16) {
        int m = n - r0 < 16 ? n - r0 : 16;
        if (m != configured) {
            fs_amx_configure(m);
            configured = m;
        }
        fs_amx_tiles(xa + (size_t)r0 * kp, kp, P, y + (size_t)r0 * out, m, out, t_lo, t_hi,
                     accumulate, stage);
    }
    _tile_release();
}
#endif /* FS_AMX_BUILD */
