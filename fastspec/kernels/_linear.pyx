"""The packed float products of ``csrc/fs_linear.h``, one call at a time, and the core's clock.

The fused model runners call these products from C; this module reaches them from Python for
the tests (NumPy twin, bit identity of a row alone vs in a block, paths against each other)
and the benchmarks (multiply-adds per cycle against the FMA peak of
:func:`fastspec.kernels.isa_info`). :func:`pack` copies a matrix into the kernels' packed
layout; :func:`product` runs ``y (n, out) [+]= x (n, in) @ W [+ bias]`` on the path of
:func:`fastspec.kernels.set_isa`, every check before the GIL is released.

The amx and avx512bf16 paths run bf16 weights from another layout, the tile layout
(:func:`tile_layout` says whether the selected path is one of them): ``pack(w, tiles=True)``
packs it and :func:`product_tiles` runs the models' bf16 rule on it.
"""
from libc.stdint cimport uint16_t

import numpy as np

from fastspec.kernels._csrc cimport (
    fs_amx_packed_len,
    fs_clock_hz,
    fs_linear_bf16_amx,
    fs_linear_f32,
    fs_linear_f32b,
    fs_linear_f32b_round,
    fs_linear_f32h,
    fs_pack_bf16_amx,
    fs_pack_strided,
    fs_packed_len,
)
from fastspec.kernels._isa cimport share_table

share_table()  # the product variants of the one dispatch table

__all__ = ["KINDS", "clock_hz", "pack", "packed_len", "product", "product_tiles",
           "tile_layout"]

#: Weight kinds: float32, IEEE binary16, bfloat16 (stored as uint16 bits).
KINDS = ("f32", "f16", "bf16")


def packed_len(int n_in, int n_out):
    """Return the element count of the packed copy of a (n_in, n_out) matrix."""
    if n_in < 1 or n_out < 1:
        raise ValueError(f"matrix shape must be positive, got ({n_in}, {n_out})")
    return fs_packed_len(n_in, n_out)


def tile_layout():
    """Whether bf16 products on the selected path read the tile layout (the amx and
    avx512bf16 paths): pack their weights with ``pack(w, tiles=True)`` and run them with
    :func:`product_tiles`."""
    return bool(fs_linear_bf16_amx())


def pack(w, bint tiles=False):
    """Return the packed copy of ``w``.

    Parameters
    ----------
    w : numpy.ndarray, shape (in, out)
        float32, float16, or uint16 (bfloat16 bits); any strides.
    tiles : bool
        Pack bfloat16 bits (uint16) in the tile layout of the amx and avx512bf16 paths
        (``csrc/fs_linear_amx.c``) instead of the panels.

    Returns
    -------
    numpy.ndarray
        Same dtype as ``w``. Panels: shape (packed_len(in, out),), panels of 48 columns, k
        after k, zero-padded. Tiles: shape (fs_amx_packed_len(in, out),), ``in`` padded to
        pairs of a tile's depth and ``out`` to 16 columns.
    """
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise ValueError("w must be a 2-D numpy array")
    if w.dtype not in (np.float32, np.float16, np.uint16):
        raise TypeError(f"w must be float32, float16 or uint16 (bfloat16 bits), got {w.dtype}")
    if tiles and w.dtype != np.uint16:
        raise TypeError(f"the tile layout holds bfloat16 bits: w must be uint16, got {w.dtype}")
    rows, cols = w.shape
    if rows < 1 or cols < 1:
        raise ValueError(f"w must be non-empty, got shape {w.shape}")
    src = np.ascontiguousarray(w)
    cdef const uint16_t[:, ::1] wt
    cdef uint16_t[::1] pt
    cdef int tr = rows, tc = cols
    if tiles:
        wt = src
        tiled = np.empty(fs_amx_packed_len(tr, tc), dtype=np.uint16)
        pt = tiled
        with nogil:
            fs_pack_bf16_amx(&wt[0, 0], tr, tc, &pt[0])
        return tiled
    out = np.empty(fs_packed_len(rows, cols), dtype=w.dtype)
    cdef size_t esz = src.itemsize
    cdef const unsigned char[:, ::1] sv = src.view(np.uint8)
    cdef unsigned char[::1] ov = out.view(np.uint8)
    cdef int r = rows, c = cols
    with nogil:
        fs_pack_strided(&sv[0, 0], esz, r, c, <size_t>c, 1, &ov[0])
    return out


cdef int _check_call(int n, int n_in, int n_out, float[:, ::1] y, const float[::1] bias,
                     p) except -1:
    """The checks :func:`product` and :func:`product_tiles` share: shapes, bias, p an array."""
    if n < 1 or n_in < 1 or n_out < 1:
        raise ValueError(f"x must be non-empty and n_out positive, got ({n}, {n_in}), {n_out}")
    if y.shape[0] != n or y.shape[1] != n_out:
        raise ValueError(f"y must have shape ({n}, {n_out}), got ({y.shape[0]}, {y.shape[1]})")
    if bias is not None and bias.shape[0] != n_out:
        raise ValueError(f"bias must have shape ({n_out},), got ({bias.shape[0]},)")
    if not isinstance(p, np.ndarray) or p.ndim != 1 or not p.flags.c_contiguous:
        raise ValueError("p must be a 1-D C-contiguous numpy array (pack's result)")
    return 0


def product(const float[:, ::1] x, p, str kind, int n_out, float[:, ::1] y, bint accumulate=False,
            const float[::1] bias=None):
    """``y (n, out) [+]= x (n, in) @ W [+ bias]`` with W packed by :func:`pack`.

    Parameters
    ----------
    x : float32 array, shape (n, in), C-contiguous
        For ``bf16`` the rows must hold bfloat16 values (the kernels' compute rule).
    p : numpy.ndarray, shape (packed_len(in, out),)
        :func:`pack` of W: float32 for ``f32``, float16 or uint16 for ``f16``, uint16 for
        ``bf16``.
    kind : {"f32", "f16", "bf16"}
    n_out : int
        Columns of W.
    y : float32 array, shape (n, out), C-contiguous
        Written in place (added to when ``accumulate``).
    accumulate : bool
    bias : float32 array, shape (out,), optional
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    cdef int n = x.shape[0], n_in = x.shape[1], acc = accumulate
    cdef bint half
    _check_call(n, n_in, n_out, y, bias, p)
    want = np.float32 if kind == "f32" else np.uint16
    if kind == "f16" and p.dtype == np.float16:
        p = p.view(np.uint16)
    if p.dtype != want:
        raise TypeError(f"p must be {np.dtype(want)} for kind {kind!r}, got {p.dtype}")
    if p.shape[0] != fs_packed_len(n_in, n_out):
        raise ValueError(f"p must hold packed_len({n_in}, {n_out}) = "
                         f"{fs_packed_len(n_in, n_out)} elements, got {p.shape[0]}")
    cdef const float *b = &bias[0] if bias is not None else NULL
    cdef const float[::1] pf
    cdef const uint16_t[::1] ph
    if kind == "f32":
        pf = p
        with nogil:
            fs_linear_f32(&x[0, 0], &pf[0], b, &y[0, 0], n, n_in, n_out, acc)
    else:
        ph = p
        half = kind == "f16"
        with nogil:
            if half:
                fs_linear_f32h(&x[0, 0], &ph[0], b, &y[0, 0], n, n_in, n_out, acc)
            else:
                fs_linear_f32b(&x[0, 0], &ph[0], b, &y[0, 0], n, n_in, n_out, acc)


def product_tiles(const float[:, ::1] x, p, int n_out, float[:, ::1] y, bint accumulate=False,
                  const float[::1] bias=None):
    """``y (n, out) [+]= round_bf16(x) @ W [+ bias]`` with bf16 W packed by
    ``pack(w, tiles=True)``, on the selected tile path (amx or avx512bf16): the models' bf16
    rule, every row rounded to bf16 (nearest even) first.

    Parameters
    ----------
    x : float32 array, shape (n, in), C-contiguous
        Any float32 values; they are rounded to bf16 into scratch, ``x`` is not written.
    p : numpy.ndarray of uint16, shape (fs_amx_packed_len(in, out),)
    n_out, y, accumulate, bias
        As in :func:`product`.

    Raises
    ------
    RuntimeError
        When the selected path does not read the tile layout (:func:`tile_layout` is False).
    """
    if not fs_linear_bf16_amx():
        raise RuntimeError("the selected path does not read the tile layout (tile_layout() is "
                           "False): select amx or avx512bf16 with set_isa")
    cdef int n = x.shape[0], n_in = x.shape[1], acc = accumulate
    _check_call(n, n_in, n_out, y, bias, p)
    if p.dtype != np.uint16:
        raise TypeError(f"p must be uint16 (bfloat16 bits in the tile layout), got {p.dtype}")
    if p.shape[0] != fs_amx_packed_len(n_in, n_out):
        raise ValueError(f"p must hold the tile layout of ({n_in}, {n_out}): "
                         f"{fs_amx_packed_len(n_in, n_out)} elements, got {p.shape[0]}")
    # the rounded rows: n * max(in, 16) floats hold n * fs_amx_kp(in) bf16 bits (fs_linear.h)
    cdef float[::1] xr = np.empty(n * max(n_in, 16), dtype=np.float32)
    cdef const float *b = &bias[0] if bias is not None else NULL
    cdef const uint16_t[::1] ph = p
    with nogil:
        fs_linear_f32b_round(&x[0, 0], &ph[0], b, &y[0, 0], n, n_in, n_out, acc, &xr[0])


def clock_hz(int bursts=8):
    """Return the core's clock in Hz measured by a loop of dependent integer adds (best of
    ``bursts`` bursts of about 0.3 ms each; 0.0 where the loop is not built)."""
    if bursts < 1:
        raise ValueError(f"bursts must be >= 1, got {bursts}")
    with nogil:
        hz = fs_clock_hz(bursts)
    return hz
