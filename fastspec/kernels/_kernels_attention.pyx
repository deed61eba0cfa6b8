"""Compiled attention kernels and KV-cache moves of :mod:`fastspec.kernels`.

``attention``, ``tree_attention`` and ``cache_write`` run the C loops of
``csrc/fs_attention.h`` (the same attention code as the fused model forward, whose tree steps
use the masked entry of ``tree_attention``); ``tree_attention`` and ``compact_kv`` serve tree
verification. Same names, signatures, results and messages as :mod:`fastspec.kernels._reference`;
every check happens before the GIL is released. Agreement with the twin: to rounding (float64
accumulation in both). float16 caches (float32 queries): the C entries read the binary16 bits
(``fs_attention_f32h``), with the bits of the float32 call on the widened cache.
"""
from cython cimport floating
from libc.stdint cimport int64_t, uint8_t, uint16_t
from libc.string cimport memcpy

import numpy as np

from fastspec.kernels.checks import (
    check_attention_args,
    check_cache_write_args,
    check_compact_kv_args,
    check_tree_mask,
    check_window,
)

from fastspec.kernels._csrc cimport (
    fs_attention_f32,
    fs_attention_f32h,
    fs_attention_f64,
    fs_attention_masked_f32,
    fs_attention_masked_f32h,
    fs_attention_masked_f64,
    fs_f32_to_f16,
)
from fastspec.kernels._isa cimport share_table
from fastspec.kernels._kernels_base cimport check_int_sized, is_float_c, thread_scratch

share_table()  # the float attention variant of the one dispatch table

__all__ = ["attention", "cache_write", "compact_kv", "tree_attention"]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)

# A cache cell: float32, float64, or float16 moved as its bits.
ctypedef fused cell_t:
    float
    double
    uint16_t


cdef bint _is_half_c(a, int ndim):
    """True for a C-contiguous float16 ndarray of rank ndim."""
    return (isinstance(a, np.ndarray) and a.ndim == ndim and a.flags.c_contiguous
            and (a.dtype is _F16 or a.dtype == _F16))


# ---- attention ---------------------------------------------------------------------------

cdef void _attention_run(const floating[:, :, ::1] q,      # IN  (n, H, D)
                         const floating[:, :, ::1] k,      # IN  (H_kv, C, D)
                         const floating[:, :, ::1] v,      # IN  (H_kv, C, D)
                         floating[:, :, ::1] out,          # OUT (n, H, D)
                         int length, bint causal, int window,
                         double *scratch) noexcept:        # TMP (length,)
    with nogil:
        if floating is float:
            fs_attention_f32(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                             <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                             <int>q.shape[2], <int>k.shape[1], length, causal, window,
                             scratch)
        else:
            fs_attention_f64(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                             <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                             <int>q.shape[2], <int>k.shape[1], length, causal, window,
                             scratch)


cdef void _attention_run_f16(const float[:, :, ::1] q,      # IN  (n, H, D)
                             const uint16_t[:, :, ::1] k,   # IN  (H_kv, C, D) binary16 bits
                             const uint16_t[:, :, ::1] v,   # IN  (H_kv, C, D) binary16 bits
                             float[:, :, ::1] out,          # OUT (n, H, D)
                             int length, bint causal, int window,
                             double *scratch) noexcept:     # TMP (length,)
    with nogil:
        fs_attention_f32h(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                          <int>q.shape[0], <int>q.shape[1], <int>k.shape[0], <int>q.shape[2],
                          <int>k.shape[1], length, causal, window, scratch)


cdef bint _fast_attention_args(q, k, v, length, out):
    """True when check_attention_args would pass."""
    if not is_float_c(q, 3):
        return False
    if is_float_c(k, 3, q.dtype):
        if not is_float_c(v, 3, q.dtype):
            return False
    elif not (_is_half_c(k, 3) and _is_half_c(v, 3) and q.dtype == _F32):
        return False
    if type(length) is not int or v.shape != k.shape:
        return False
    n, n_heads, head_dim = q.shape
    n_kv_heads, capacity, kdim = k.shape
    if kdim != head_dim or n < 1 or head_dim < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        return False
    if not n <= length <= capacity:
        return False
    if out is not None:
        if not is_float_c(out, 3, q.dtype) or not out.flags.writeable or out.shape != q.shape:
            return False
    return True


cdef object _int_sized_out(q, k_cache, out):
    """Check that the C kernels' int sizes hold q and the cache; return ``out`` or a new one."""
    check_int_sized(q.shape, "q")
    check_int_sized(k_cache.shape, "k_cache")
    return np.empty(q.shape, dtype=q.dtype) if out is None else out


def attention(q, k_cache, v_cache, length, causal=True, out=None, window=None):
    """Scaled dot-product attention of ``n`` queries over the first ``length`` cached keys.

    Parameters
    ----------
    q : ndarray of shape (n, n_heads, head_dim)
        Queries of the ``n`` newest positions ``length - n .. length - 1``.
    k_cache, v_cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        Cached keys and values; positions ``[0, length)`` are valid. ``n_heads`` must be a
        multiple of ``n_kv_heads`` (head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``).
        q's dtype, or both float16 with float32 ``q``: the result is then that of the float32
        call on the cache widened to float32 (exact), bit for bit, with half the bytes read.
    length : int
        Number of valid keys, ``n <= length <= capacity``.
    causal : bool, default True
        If True, query ``i`` sees keys ``< length - n + i + 1``; otherwise every key.
    out : ndarray of shape (n, n_heads, head_dim), optional
        Caller-owned, writable, C-contiguous output of the same dtype.
    window : int, optional
        A sliding window (causal only): query ``i``, at position ``p = length - n + i``, sees
        the keys ``(p - window, p]``. None: every earlier key.

    Returns
    -------
    out : ndarray of shape (n, n_heads, head_dim)
    """
    if not _fast_attention_args(q, k_cache, v_cache, length, out):
        check_attention_args(q, k_cache, v_cache, length, out)
    cdef int win = check_window(window, causal)
    out = _int_sized_out(q, k_cache, out)
    cdef int n_valid = length
    cdef bint is_causal = bool(causal)
    if q.shape[1] == 0:  # no heads: nothing to compute (and no element to point at)
        return out
    cdef double *scratch = <double *>thread_scratch(n_valid * sizeof(double))
    if k_cache.dtype == _F16:
        _attention_run_f16(q, k_cache.view(np.uint16), v_cache.view(np.uint16), out, n_valid,
                           is_causal, win, scratch)
    elif q.dtype == np.float32:
        _attention_run[float](q, k_cache, v_cache, out, n_valid, is_causal, win, scratch)
    else:
        _attention_run[double](q, k_cache, v_cache, out, n_valid, is_causal, win, scratch)
    return out


# ---- KV cache write ----------------------------------------------------------------------

cdef void _cache_write_run(cell_t[:, :, ::1] cache,             # OUT (H_kv, C, D)
                           const cell_t[:, :, ::1] new,          # IN  (n, H_kv, D)
                           Py_ssize_t start) noexcept:
    cdef Py_ssize_t n = new.shape[0], heads = new.shape[1], dim = new.shape[2]
    cdef Py_ssize_t i, h
    with nogil:
        for h in range(heads):
            for i in range(n):
                memcpy(&cache[h, start + i, 0], &new[i, h, 0], dim * sizeof(cell_t))


cdef void _cache_write_f16(uint16_t[:, :, ::1] cache,           # OUT (H_kv, C, D) binary16
                           const float[:, :, ::1] new,          # IN  (n, H_kv, D)
                           Py_ssize_t start) noexcept:
    cdef Py_ssize_t n = new.shape[0], heads = new.shape[1], dim = new.shape[2]
    cdef Py_ssize_t i, h
    with nogil:
        for h in range(heads):
            for i in range(n):
                fs_f32_to_f16(&new[i, h, 0], &cache[h, start + i, 0], dim)


def cache_write(cache, new, start):
    """Write ``n`` new positions into one layer's cache buffer, in place.

    Parameters
    ----------
    cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        Writable, C-contiguous buffer (float32, float64 or float16); positions
        ``start .. start + n - 1`` are overwritten.
    new : ndarray of shape (n, n_kv_heads, head_dim)
        The keys (or values) of the new positions, same dtype as ``cache``; or float32 for a
        float16 cache, rounded to nearest (ties to even) as ``new.astype(np.float16)``.
    start : int
        First position to write, ``0 <= start`` and ``start + n <= capacity``.
    """
    cdef Py_ssize_t n
    if (is_float_c(cache, 3) and is_float_c(new, 3, cache.dtype) and cache.flags.writeable
            and type(start) is int and new.shape[1] == cache.shape[0]
            and new.shape[2] == cache.shape[2] and 0 <= start
            and start + new.shape[0] <= cache.shape[1]):
        n = new.shape[0]
    else:
        n = check_cache_write_args(cache, new, start)
    cdef Py_ssize_t first = start
    if n == 0 or cache.shape[2] == 0 or cache.shape[0] == 0:
        return
    if cache.dtype == _F16:
        if new.dtype == _F16:
            _cache_write_run[uint16_t](cache.view(np.uint16), new.view(np.uint16), first)
        else:
            _cache_write_f16(cache.view(np.uint16), new, first)
    elif cache.dtype == np.float32:
        _cache_write_run[float](cache, new, first)
    else:
        _cache_write_run[double](cache, new, first)


# ---- tree verification: tree attention, KV compaction ---------------------------------------

cdef void _tree_attention_run(const floating[:, :, ::1] q,        # IN  (n, H, D)
                              const floating[:, :, ::1] k,        # IN  (H_kv, C, D)
                              const floating[:, :, ::1] v,        # IN  (H_kv, C, D)
                              const uint8_t[:, ::1] mask,         # IN  (n, n) ancestors
                              floating[:, :, ::1] out,            # OUT (n, H, D)
                              int length, int window,
                              double *scratch) noexcept:  # TMP (length,)
    with nogil:
        if floating is float:
            fs_attention_masked_f32(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                                    <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                                    <int>q.shape[2], <int>k.shape[1], length, &mask[0, 0],
                                    window, scratch)
        else:
            fs_attention_masked_f64(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                                    <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                                    <int>q.shape[2], <int>k.shape[1], length, &mask[0, 0],
                                    window, scratch)


cdef void _tree_attention_run_f16(const float[:, :, ::1] q,      # IN  (n, H, D)
                                  const uint16_t[:, :, ::1] k,   # IN  (H_kv, C, D) binary16
                                  const uint16_t[:, :, ::1] v,   # IN  (H_kv, C, D) binary16
                                  const uint8_t[:, ::1] mask,    # IN  (n, n) ancestors
                                  float[:, :, ::1] out,          # OUT (n, H, D)
                                  int length, int window,
                                  double *scratch) noexcept:     # TMP (length,)
    with nogil:
        fs_attention_masked_f32h(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                                 <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                                 <int>q.shape[2], <int>k.shape[1], length, &mask[0, 0], window,
                                 scratch)


def tree_attention(q, k_cache, v_cache, length, tree_mask, out=None, window=None):
    """Attention of ``n`` tree nodes: each sees the cached context and its own ancestors.

    Parameters
    ----------
    q : ndarray of shape (n, n_heads, head_dim)
        Queries of the nodes stored at cache positions ``length - n .. length - 1``.
    k_cache, v_cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        As for :func:`attention` (float16 with float32 ``q`` too: the bits of the float32
        call on the widened cache); keys ``[0, length - n)`` are the committed context.
    length : int
        Number of valid keys, ``n <= length <= capacity``.
    tree_mask : ndarray of shape (n, n), bool
        ``tree_mask[i, j]``: node ``i`` sees node ``j`` (its ancestors and itself). The
        diagonal must be True.
    out : ndarray of shape (n, n_heads, head_dim), optional
    window : int, optional
        A sliding window: node ``i``, at position ``length - n + d`` (``d``, its depth: the
        nodes it sees but itself), sees the context keys from ``length - n + d + 1 - window``
        on and its ancestors, every one of which must lie inside it (``d < window``).

    Returns
    -------
    out : ndarray of shape (n, n_heads, head_dim)
    """
    check_attention_args(q, k_cache, v_cache, length, out)
    n = q.shape[0]
    check_tree_mask(tree_mask, n)
    cdef int win = check_window(window, True, tree_mask)
    out = _int_sized_out(q, k_cache, out)
    cdef int n_valid = length
    if q.shape[1] == 0 or q.shape[2] == 0:
        out[...] = 0
        return out
    mask = np.ascontiguousarray(tree_mask).view(np.uint8)
    cdef double *s = <double *>thread_scratch(n_valid * sizeof(double))
    if k_cache.dtype == _F16:
        _tree_attention_run_f16(q, k_cache.view(np.uint16), v_cache.view(np.uint16), mask, out,
                                n_valid, win, s)
    elif q.dtype == np.float32:
        _tree_attention_run[float](q, k_cache, v_cache, mask, out, n_valid, win, s)
    else:
        _tree_attention_run[double](q, k_cache, v_cache, mask, out, n_valid, win, s)
    return out


cdef void _compact_kv_run(cell_t[:, :, :, ::1] k,       # OUT (L, H_kv, C, D)
                          cell_t[:, :, :, ::1] v,       # OUT (L, H_kv, C, D)
                          Py_ssize_t start,
                          const int64_t[::1] rows) noexcept:  # IN (m,) increasing sources
    cdef Py_ssize_t L = k.shape[0], H = k.shape[1], D = k.shape[3], m = rows.shape[0]
    cdef Py_ssize_t l, h, j, src
    with nogil:
        # Ascending j: the destination start + j is below every source still to read.
        for l in range(L):
            for h in range(H):
                for j in range(m):
                    src = rows[j]
                    if src != start + j:
                        memcpy(&k[l, h, start + j, 0], &k[l, h, src, 0], D * sizeof(cell_t))
                        memcpy(&v[l, h, start + j, 0], &v[l, h, src, 0], D * sizeof(cell_t))


def compact_kv(k, v, start, rows):
    """Move the cache rows ``rows`` to positions ``start ..`` (the accepted tree path), in place.

    Parameters
    ----------
    k, v : ndarray of shape (n_layers, n_kv_heads, capacity, head_dim)
        Writable, C-contiguous key and value buffers of one dtype: float32, float64 or float16
        (moved as its bits).
    start : int
        First destination position.
    rows : ndarray of shape (m,), int64
        Strictly increasing source positions with ``rows[j] >= start + j`` and
        ``rows[-1] < capacity``; position ``start + j`` receives row ``rows[j]``.
    """
    m = check_compact_kv_args(k, v, start, rows)
    if m == 0 or k.size == 0:
        return
    src = np.ascontiguousarray(rows)
    cdef Py_ssize_t first = start
    if k.dtype == _F16:
        _compact_kv_run[uint16_t](k.view(np.uint16), v.view(np.uint16), first, src)
    elif k.dtype == np.float32:
        _compact_kv_run[float](k, v, first, src)
    else:
        _compact_kv_run[double](k, v, first, src)
