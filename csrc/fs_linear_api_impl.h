/* Template body of fs_linear.h's entry points: y (n, out) [+]= x (n, in) @ W [+ bias], the
 * columns split between OpenMP threads for large products. Included once per kernel with FS_T
 * (compute type), FS_WT (weight element type) and FS_SFX (suffix of the fs_linear_part_<SFX>
 * it calls) defined (see fs_common.h). No include guard on purpose. In a build without GCC
 * vectors, the float kernels also define FS_WIDEN(w) (16 bits -> float) and get their scalar
 * fs_linear_part here. */

#if defined(FS_WIDEN)
/* The float kernels of the scalar build: the packed layout, products in k order. */
static void FS_FN(fs_linear_part)(const float *x, const FS_WT *P, float *y, int n, int in,
                                  int out, int lo, int hi, int accumulate)
{
    int outp = (out + 15) / 16 * 16;
    for (int c = lo; c < hi; c++) {
        int c0 = c / 32 * 32, width = outp - c0 >= 32 ? 32 : 16;
        const FS_WT *w = P + (size_t)c0 * in + (c - c0);
        for (int r = 0; r < n; r++) {
            float s = accumulate ? y[(size_t)r * out + c] : 0.0f;
            for (int k = 0; k < in; k++)
                s += x[(size_t)r * in + k] * FS_WIDEN(w[(size_t)k * width]);
            y[(size_t)r * out + c] = s;
        }
    }
}
#endif

static void FS_FN(fs_linear)(const FS_T *x, const FS_WT *W, const FS_T *bias, FS_T *y, int n,
                             int in, int out, int accumulate)
{
    int parts = 1;
    if (FS_LIN_OMP && (size_t)in * out >= FS_LIN_PARALLEL_MIN && out >= 128)
        parts = fs_lin_threads();
    if (parts <= 1) {
        FS_FN(fs_linear_part)(x, W, y, n, in, out, 0, out, accumulate);
    } else {
        /* Column blocks on 32-element boundaries, so every thread runs whole tiles. */
        int chunk = ((out + parts - 1) / parts + 31) / 32 * 32;
        FS_LIN_PRAGMA_PARALLEL
        for (int p = 0; p < parts; p++) {
            int lo = p * chunk, hi = lo + chunk < out ? lo + chunk : out;
            if (lo < hi) FS_FN(fs_linear_part)(x, W, y, n, in, out, lo, hi, accumulate);
        }
    }
    if (bias != NULL)
        for (int r = 0; r < n; r++)
            for (int c = 0; c < out; c++) y[(size_t)r * out + c] += bias[c];
}

#undef FS_T
#undef FS_WT
#undef FS_SFX
#undef FS_WIDEN
