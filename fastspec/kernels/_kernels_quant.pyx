"""Compiled quantized products of :mod:`fastspec.kernels.quant` (csrc/fs_quant.h).

Same names, signatures and results as :mod:`fastspec.kernels._reference_quant` (the packed
bytes and the products' bits). :mod:`fastspec.kernels.quant` checks every argument before it
calls here; these functions only check what the C loops rely on (dtypes, contiguity, sizes),
then run without the GIL. Other extensions call the C entry points directly (``fs_linear_q``
and friends, declared in ``_csrc.pxd``) on :attr:`QuantMatrix.packed`.
"""
from libc.stdint cimport int8_t, int32_t, uint8_t

import numpy as np

from fastspec.kernels._csrc cimport (
    fs_linear_q,
    fs_quant_pack,
    fs_quant_packed_bytes,
    fs_quant_rows,
    fs_quant_rows_f32,
    fs_quant_scratch_bytes,
    fs_quant_kernel_name,
    fs_quant_unpack,
    fs_transcode,
    fs_transcode_pack,
    FS_T_EBADSCALE,
    FS_T_ENOMEM,
    FS_T_Q4_K_Q4_1,
    FS_T_Q4_K_Q8_0,
    FS_T_Q5_0_Q8_0,
    FS_T_Q6_K_Q8_0,
)
from fastspec.kernels._isa cimport share_table
from fastspec.kernels._kernels_base cimport thread_scratch

share_table()  # the quantized kernel of the path lives in the one dispatch table

__all__ = ["KINDS", "BLOCK", "BLOCK_BYTES", "TRANSCODED", "packed_bytes", "pack", "unpack",
           "rows", "transcode", "transcode_pack", "quantize_activations", "linear",
           "kernel_name"]

KINDS = ("q8_0", "q4_0", "q4_1")
BLOCK = 32
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
#: (GGUF type, the native kind it is transcoded into) -> (its block bytes, weights a block).
TRANSCODED = {("Q4_K", "q4_1"): (144, 256), ("Q4_K", "q8_0"): (144, 256),
              ("Q6_K", "q8_0"): (210, 256), ("Q5_0", "q8_0"): (22, 32)}
#: fs_transcode.h's number of each conversion.
_CONV = {("Q4_K", "q4_1"): FS_T_Q4_K_Q4_1, ("Q4_K", "q8_0"): FS_T_Q4_K_Q8_0,
         ("Q6_K", "q8_0"): FS_T_Q6_K_Q8_0, ("Q5_0", "q8_0"): FS_T_Q5_0_Q8_0}


cdef int _kind(str kind) except -1:
    try:
        return KINDS.index(kind)
    except ValueError:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}") from None


cdef object _aligned_empty(Py_ssize_t nbytes):
    """Return an uninitialised uint8 array of nbytes whose data is 64-byte aligned."""
    buf = np.empty(nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    return buf[off:off + nbytes]


cdef object _packed_out(int k, int in_features, int out_f, out):
    """Return ``out`` (checked to hold the packed bytes of kind k) or a new aligned array."""
    cdef Py_ssize_t need = fs_quant_packed_bytes(k, in_features, out_f)
    if out is None:
        return _aligned_empty(need)
    if out.shape[0] != need:
        raise ValueError(f"out must have {need} bytes, got {out.shape[0]}")
    return out


def packed_bytes(str kind, int in_features, int out_features):
    """Return the bytes of W (out_features, in_features) in the packed layout."""
    return fs_quant_packed_bytes(_kind(kind), in_features, out_features)


def pack(str kind, blocks, int in_features, out=None):
    """Return the packed layout (uint8, 64-byte aligned) of GGUF rows ``blocks``
    (out, nb * bytes), written into ``out`` when given (uint8, packed_bytes, writable);
    ValueError when a scale (or a q4_1 min) is NaN or infinite."""
    cdef int k = _kind(kind), rc
    cdef const uint8_t[:, ::1] b = np.ascontiguousarray(blocks, np.uint8)
    cdef int out_f = b.shape[0]
    P = _packed_out(k, in_features, out_f, out)
    cdef uint8_t[::1] p = P
    with nogil:
        rc = fs_quant_pack(k, &b[0, 0], in_features, out_f, &p[0])
    if rc != 0:
        raise ValueError(f"{kind} blocks hold a NaN or infinite scale or min" if rc == -1 else
                         f"{kind} blocks do not fit in_features={in_features}")
    return P


def unpack(str kind, packed, int in_features, int out_features):
    """Return the GGUF rows (out_features, nb * bytes) of a packed W."""
    cdef int k = _kind(kind)
    cdef const uint8_t[::1] p = packed
    blocks = np.empty((out_features, in_features // BLOCK * BLOCK_BYTES[kind]), np.uint8)
    cdef uint8_t[:, ::1] b = blocks
    with nogil:
        fs_quant_unpack(k, &p[0], in_features, out_features, &b[0, 0])
    return blocks


def rows(str kind, packed, int in_features, int out_features, ids):
    """Return the dequantized rows ``ids`` of W: float32 (len(ids), in_features)."""
    cdef int k = _kind(kind)
    cdef const uint8_t[::1] p = packed
    cdef const int32_t[::1] cols = np.ascontiguousarray(ids, np.int32)
    cdef int count = cols.shape[0]
    dst = np.empty((count, in_features), np.float32)
    if count == 0:
        return dst
    cdef float[:, ::1] d = dst
    with nogil:
        fs_quant_rows_f32(k, &p[0], in_features, out_features, &cols[0], count, &d[0, 0])
    return dst


def transcode(str type_name, raw, str kind):
    """Return Q4_K / Q6_K super-blocks or Q5_0 blocks ``raw`` (uint8 (rows, n * 144 | 210 |
    22)) as GGUF blocks of ``kind`` (uint8 (rows, n * (8 | 1) * (20 | 34));
    csrc/fs_transcode.h); ValueError when a scale is NaN or infinite (not Q4_K -> q4_1)."""
    sb, weights = TRANSCODED[type_name, kind]
    cdef int conv = _CONV[type_name, kind]
    cdef const uint8_t[:, ::1] src = np.ascontiguousarray(raw, np.uint8)
    cdef Py_ssize_t rows = src.shape[0], n = src.shape[1] // sb, rc = 0
    if src.shape[1] != n * sb:
        raise ValueError(f"{type_name} rows must be whole blocks of {sb} bytes")
    out = np.empty((rows, n * weights // BLOCK * BLOCK_BYTES[kind]), np.uint8)
    cdef uint8_t[:, ::1] dst = out
    if rows * n == 0:
        return out
    with nogil:
        rc = fs_transcode(conv, &src[0, 0], rows * n, &dst[0, 0])
    if rc != 0:
        raise ValueError(f"{type_name} blocks hold a NaN or infinite scale"
                         + (" or min" if type_name == "Q4_K" else ""))
    return out


def transcode_pack(str type_name, raw, str kind, int in_features, out=None):
    """Return the packed layout of ``kind`` (uint8, packed_bytes, 64-byte aligned; written into
    ``out`` when given) of Q4_K / Q6_K / Q5_0 rows ``raw`` (uint8 (out_features, in_features /
    weights a block * its bytes)) as :func:`transcode` converts them: pack(transcode(...)) in
    one pass (fs_transcode_pack); ValueError when a scale or min is NaN or infinite."""
    sb, weights = TRANSCODED[type_name, kind]
    cdef int conv = _CONV[type_name, kind], rc
    cdef const uint8_t[:, ::1] src = np.ascontiguousarray(raw, np.uint8)
    cdef int out_f = src.shape[0]
    if (out_f < 1 or in_features <= 0 or in_features % weights
            or src.shape[1] != in_features // weights * sb):
        raise ValueError(f"{type_name} rows of {in_features} inputs must be whole blocks of "
                         f"{weights} weights ({sb} bytes), got shape {tuple(raw.shape)}")
    P = _packed_out(_kind(kind), in_features, out_f, out)
    cdef uint8_t[::1] p = P
    with nogil:
        rc = fs_transcode_pack(conv, &src[0, 0], in_features, out_f, &p[0])
    if rc == FS_T_ENOMEM:
        raise MemoryError("no memory for a panel's converted rows")
    if rc == FS_T_EBADSCALE:
        raise ValueError(f"{type_name} blocks hold a NaN or infinite scale or min")
    if rc != 0:
        raise ValueError(f"{type_name} rows do not fit in_features={in_features}")
    return P


def quantize_activations(x, str kind="q8_0"):
    """Return (q int8 (n, in), d float32 (n, nb), s int32 (n, nb)): each row of x quantized per
    block of 32 (docs/FORMATS.md); ``kind`` does not change the rule."""
    _kind(kind)
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, np.float32)
    cdef int n = xv.shape[0], in_f = xv.shape[1]
    q = np.empty((n, in_f), np.int8)
    d = np.empty((n, in_f // BLOCK), np.float32)
    s = np.empty((n, in_f // BLOCK), np.int32)
    if n == 0:
        return q, d, s
    cdef int8_t[:, ::1] qv = q
    cdef float[:, ::1] dv = d
    cdef int32_t[:, ::1] sv = s
    with nogil:
        fs_quant_rows(&xv[0, 0], n, in_f, &qv[0, 0], &dv[0, 0], &sv[0, 0])
    return q, d, s


def linear(str kind, x, packed, int in_features, int out_features, bias, out,
           bint accumulate):
    """y = out (n, out_features) [+]= x (n, in) @ W^T [+ bias]; returns ``out``.

    x float32 C-contiguous (n, in_features), out float32 C-contiguous (n, out_features), bias
    None or float32 (out_features,): checked by the caller."""
    cdef int k = _kind(kind)
    cdef const float[:, ::1] xv = x
    cdef const uint8_t[::1] p = packed
    cdef float[:, ::1] yv = out
    cdef const float[::1] bv
    cdef const float *bp = NULL
    cdef int n = xv.shape[0]
    if n == 0 or out_features == 0:
        return out
    if bias is not None:
        bv = bias
        bp = &bv[0]
    cdef unsigned char *scratch = thread_scratch(fs_quant_scratch_bytes(k, n, in_features))
    with nogil:
        fs_linear_q(k, &xv[0, 0], &p[0], bp, &yv[0, 0], n, in_features, out_features,
                    accumulate, scratch)
    return out


def kernel_name(str kind, int n, int in_features=0):
    """Return the name of the kernel a product of n rows of ``kind`` and ``in_features``
    inputs (0: a width every kernel takes) runs on the current path ("portable", "avx2",
    "avx_vnni", "avx512_vnni", "avx512_vnni_x16", "amx_int8")."""
    return fs_quant_kernel_name(_kind(kind), n, in_features).decode()
