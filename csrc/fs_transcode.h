/* fs_transcode.h -- GGUF K-quant super-blocks and Q5_0 blocks into the native kinds of
 * fs_quant.h, at load.
 *
 * Plain C (a load-time pass over the file's bytes, cut into chunks of whole source blocks
 * that the core's pool (fs_pool.h) shares out: the same bytes at any thread count; the K-quant
 * loops compiled as FS_CLONES variants, fs_common.h, the same bytes on each); the NumPy
 * twin is fastspec/kernels/_reference_quant.py (transcode), the oracle gguf.quants. The K-quant
 * functions take n super-blocks of 256 weights, row-major as the file stores them, and write
 * GGUF blocks of 32 (8 per super-block):
 *
 *   Q4_K (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles)
 *     -> Q4_1 (20 bytes): d' = f16(d * sc), m' = f16(-(dmin * m)) (both products exact in
 *        float32), the same 4-bit values; sub-block 2i holds the low nibbles of bytes
 *        32i..32i+31, sub-block 2i+1 their high nibbles.
 *   Q6_K (210 bytes: 128 of low nibbles, 64 of 2-bit highs, 16 int8 scales, f16 d)
 *     -> Q8_0 (34 bytes): each weight w = (d * sc) * (q - 32) in float32, then GGUF's Q8_0
 *        rule on each block of 32: amax = max|w|, d' = amax / 127, id = d' ? 1 / d' : 0,
 *        q' = round-half-away(w * id), stored d' = f16(d').
 *   Q4_K -> Q8_0 (for a model stored as q8_0): w = (d * sc) * q - dmin * m in float32 (the
 *        products exact, one rounding at the subtraction), then the same Q8_0 rule.
 *
 * and Q5_0 takes n blocks of 32:
 *   Q5_0 (22 bytes: f16 d, 32 fifth bits, 16 bytes of nibbles), one block of 32 each
 *     -> Q8_0 (34 bytes): the same d bytes and the integers q - 16: exactly the same weights
 *        (a block of d = +-0, whose weights are all zero, gets zero integers).
 *
 * The Q6_K and Q4_K -> Q8_0 bytes are those of gguf.quants' dequantize-and-quantize; the
 * Q4_1 bytes keep the Q4_K values (no requantization), only the two f16 roundings above
 * (tests/test_gguf_transcode.py).
 */
#ifndef FS_TRANSCODE_H
#define FS_TRANSCODE_H

#include <stddef.h>
#include <stdint.h>

/* The conversions, by number. */
enum { FS_T_Q4_K_Q4_1, FS_T_Q4_K_Q8_0, FS_T_Q6_K_Q8_0, FS_T_Q5_0_Q8_0, FS_T_COUNT };
/* fs_transcode's and fs_transcode_pack's errors (negative). */
#define FS_T_EBADSCALE (-1)  /* a NaN or infinite scale or min, in the source or converted */
#define FS_T_ENOMEM (-2)     /* a chunk's buffer could not be allocated */
#define FS_T_EARG (-3)       /* conv unknown, in not a positive multiple of its source block's
                              * weights, out < 1 */

/* The conversion conv of n source blocks (super-blocks of 256 weights, or Q5_0 blocks of 32)
 * at src into dst (8 native blocks a super-block, one a Q5_0 block), the blocks shared out by
 * the core's pool. Returns 0, FS_T_EBADSCALE (dst unspecified) when a source block's d (or
 * Q4_K's dmin) is NaN or infinite, FS_T_EARG for an unknown conv. Q4_K -> Q4_1 never fails
 * here: a non-finite d or dmin gives a non-finite q4_1 scale or min, which the pack refuses. */
int fs_transcode(int conv, const uint8_t *src, size_t n, uint8_t *dst);

/* The conversion conv of GGUF rows src (out rows of in weights, whole source blocks, as the
 * file stores them) packed straight into P (fs_quant_pack's layout of its native kind,
 * fs_quant_packed_bytes): the bytes fs_quant_pack gives the converted rows, without them
 * ever being whole in memory (each panel's 8 rows are converted into a small buffer, then
 * packed; the panels shared out by the core's pool). Returns 0 or an FS_T_E* code (P is then
 * unspecified). */
int fs_transcode_pack(int conv, const uint8_t *src, int in, int out, uint8_t *P);

#endif
