"""Typed Cython kernels: the compiled backend of :mod:`fastspec.kernels`.

Same names, signatures, results and error messages as the NumPy twin
:mod:`fastspec._reference` (read its docstrings for the exact semantics). Each kernel
validates everything while holding the GIL -- well-formed arguments are accepted by typed
fast paths, anything else goes through :mod:`fastspec._checks`, which raises the documented
message; O(V) data (finite, non-negative, rows summing to 1, uniforms in [0, 1)) is scanned in
typed code -- and then runs C inner loops from ``csrc/`` with the GIL released; those loops
cannot fail. Scratch memory is per thread and reused between calls.

Agreement with the twin: attention, probs and cache_write agree to rounding (float64
accumulation in both); sample, verify_greedy and verify_rejection return the same tokens bit
for bit (their inverse-CDF sums are sequential in float64, exactly like numpy.cumsum).
"""
from cython cimport floating
from libc.math cimport INFINITY, exp, sqrt
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy

import threading

import numpy as np

from fastspec._checks import (
    NO_MASS,
    NOT_FINITE,
    NOT_PROBABILITIES,
    ROW_SUM,
    ROW_SUM_TOL,
    check_attention_args,
    check_cache_write_args,
    check_compact_kv_args,
    check_float_array,
    check_logits,
    check_probability_rows,
    check_sampling_params,
    check_tokens,
    check_tree_mask,
    check_uniforms,
)

__all__ = [
    "attention",
    "cache_write",
    "compact_kv",
    "probs",
    "sample",
    "tree_attention",
    "verify_greedy",
    "verify_rejection",
]


cdef extern from "fs_attention.h" nogil:
    void fs_attention_f32(const float *q, const float *k, const float *v, float *out,
                          int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                          int length, int causal, double *scratch)
    void fs_attention_f64(const double *q, const double *k, const double *v, double *out,
                          int n, int n_heads, int n_kv_heads, int head_dim, int capacity,
                          int length, int causal, double *scratch)
    double fs_attn_exp_sum(double *s, int count, double m)


cdef extern from "fs_kernels.h" nogil:
    int fs_scan_f32(const float *x, long n, double *total)
    int fs_scan_f64(const double *x, long n, double *total)
    int fs_all_finite_f32(const float *x, long n)
    int fs_all_finite_f64(const double *x, long n)
    long fs_argmax_f32(const float *x, long n)
    long fs_argmax_f64(const double *x, long n)
    long fs_inverse_cdf_f32(const float *x, long n, long skip, double u, double *cum)
    long fs_inverse_cdf_f64(const double *x, long n, long skip, double u, double *cum)
    long fs_residual_draw_f32(const float *p, const float *q, long n, double u, double *cum)
    long fs_residual_draw_f64(const double *p, const double *q, long n, double u,
                              double *cum)
    double fs_scale_row_f32(const float *x, long n, double temperature, double *z)
    double fs_scale_row_f64(const double *x, long n, double temperature, double *z)
    void fs_store_scaled_f32(const double *z, long n, double total, float *out)
    void fs_store_scaled_f64(const double *z, long n, double total, double *out)
    double fs_select_kth(double *a, long n, long k)
    void fs_top_p(double *p, long n, double top_p, uint64_t *key, int32_t *idx,
                  uint64_t *tmp_key, int32_t *tmp_idx)
    long FS_CDF_CHECKPOINTS(long n)


cdef Py_ssize_t _INT_LIMIT = 2**31 - 1


_local = threading.local()
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


cdef inline bint _is_float_c(a, int ndim, dtype=None):
    """True when check_float_array(a, name, ndim, dtype) would pass (typed fast path; on
    False the Python check runs and raises its message)."""
    if not isinstance(a, np.ndarray) or a.ndim != ndim or not a.flags.c_contiguous:
        return False
    dt = a.dtype
    if dtype is not None:
        return dt is dtype or dt == dtype
    return dt is _F32 or dt is _F64 or dt == _F32 or dt == _F64


cdef unsigned char *_scratch(Py_ssize_t nbytes) except NULL:
    """Per-thread scratch memory of at least nbytes, kept between calls (no allocation per
    token; each thread has its own, so kernels may run concurrently without the GIL)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape[0] < nbytes:
        buf = np.empty(max(nbytes, 1 << 16), dtype=np.uint8)
        _local.buf = buf
    cdef unsigned char[::1] view = buf
    return &view[0]


cdef inline void _check_int_sized(tuple shape, str name) except *:
    # The C loops index with int: refuse arrays whose dimensions do not fit.
    for extent in shape:
        if extent > _INT_LIMIT:
            raise ValueError(f"{name} is too large for the compiled kernels, shape {shape}")


# ---- attention ---------------------------------------------------------------------------

cdef void _attention_run(const floating[:, :, ::1] q,      # IN  (n, H, D)
                         const floating[:, :, ::1] k,      # IN  (H_kv, C, D)
                         const floating[:, :, ::1] v,      # IN  (H_kv, C, D)
                         floating[:, :, ::1] out,          # OUT (n, H, D)
                         int length, bint causal,
                         double *scratch) noexcept:        # TMP (length,)
    with nogil:
        if floating is float:
            fs_attention_f32(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                             <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                             <int>q.shape[2], <int>k.shape[1], length, causal, scratch)
        else:
            fs_attention_f64(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &out[0, 0, 0],
                             <int>q.shape[0], <int>q.shape[1], <int>k.shape[0],
                             <int>q.shape[2], <int>k.shape[1], length, causal, scratch)


cdef bint _fast_attention_args(q, k, v, length, out):
    """True when check_attention_args would pass."""
    if not _is_float_c(q, 3) or not _is_float_c(k, 3, q.dtype) or not _is_float_c(v, 3, q.dtype):
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
        if not _is_float_c(out, 3, q.dtype) or not out.flags.writeable or out.shape != q.shape:
            return False
    return True


def attention(q, k_cache, v_cache, length, causal=True, out=None):
    """Scaled dot-product attention of ``n`` queries over the first ``length`` cached keys.

    Parameters
    ----------
    q : ndarray of shape (n, n_heads, head_dim)
        Queries of the ``n`` newest positions ``length - n .. length - 1``.
    k_cache, v_cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        Cached keys and values; positions ``[0, length)`` are valid. ``n_heads`` must be a
        multiple of ``n_kv_heads`` (head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``).
    length : int
        Number of valid keys, ``n <= length <= capacity``.
    causal : bool, default True
        If True, query ``i`` sees keys ``< length - n + i + 1``; otherwise every key.
    out : ndarray of shape (n, n_heads, head_dim), optional
        Caller-owned, writable, C-contiguous output of the same dtype.

    Returns
    -------
    out : ndarray of shape (n, n_heads, head_dim)
    """
    if not _fast_attention_args(q, k_cache, v_cache, length, out):
        check_attention_args(q, k_cache, v_cache, length, out)
    _check_int_sized(q.shape, "q")
    _check_int_sized(k_cache.shape, "k_cache")
    cdef int n_valid = length
    cdef bint is_causal = bool(causal)
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    if q.shape[1] == 0:  # no heads: nothing to compute (and no element to point at)
        return out
    cdef double *scratch = <double *>_scratch(n_valid * sizeof(double))
    if q.dtype == np.float32:
        _attention_run[float](q, k_cache, v_cache, out, n_valid, is_causal, scratch)
    else:
        _attention_run[double](q, k_cache, v_cache, out, n_valid, is_causal, scratch)
    return out


# ---- KV cache write ----------------------------------------------------------------------

cdef void _cache_write_run(floating[:, :, ::1] cache,           # OUT (H_kv, C, D)
                           const floating[:, :, ::1] new,        # IN  (n, H_kv, D)
                           Py_ssize_t start) noexcept:
    cdef Py_ssize_t n = new.shape[0], heads = new.shape[1], dim = new.shape[2]
    cdef Py_ssize_t i, h
    with nogil:
        for h in range(heads):
            for i in range(n):
                memcpy(&cache[h, start + i, 0], &new[i, h, 0], dim * sizeof(floating))


def cache_write(cache, new, start):
    """Write ``n`` new positions into one layer's cache buffer, in place.

    Parameters
    ----------
    cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        Writable, C-contiguous buffer; positions ``start .. start + n - 1`` are overwritten.
    new : ndarray of shape (n, n_kv_heads, head_dim)
        The keys (or values) of the new positions, same dtype as ``cache``.
    start : int
        First position to write, ``0 <= start`` and ``start + n <= capacity``.
    """
    cdef Py_ssize_t n
    if (_is_float_c(cache, 3) and _is_float_c(new, 3, cache.dtype) and cache.flags.writeable
            and type(start) is int and new.shape[1] == cache.shape[0]
            and new.shape[2] == cache.shape[2] and 0 <= start
            and start + new.shape[0] <= cache.shape[1]):
        n = new.shape[0]
    else:
        n = check_cache_write_args(cache, new, start)
    cdef Py_ssize_t first = start
    if n == 0 or cache.shape[2] == 0 or cache.shape[0] == 0:
        return
    if cache.dtype == np.float32:
        _cache_write_run[float](cache, new, first)
    else:
        _cache_write_run[double](cache, new, first)


# ---- data scans for the checks -----------------------------------------------------------

cdef int _rows_status(const floating[:, ::1] p, double tol, bint normalised,
                      double *bad_sum) noexcept nogil:  # called inside `with nogil`
    """0 when every row is finite, non-negative and (normalised) sums to 1 within tol or
    (not normalised) has a positive sum; else 1 + (row << 2) + reason, reason 1: not finite
    or negative, 2: bad sum. Reason 1 is reported for the whole array before any sum."""
    cdef Py_ssize_t rows = p.shape[0], cols = p.shape[1], r
    cdef double total
    cdef int valid
    cdef Py_ssize_t first_bad_sum = -1
    for r in range(rows):
        if floating is float:
            valid = fs_scan_f32(&p[r, 0], cols, &total)
        else:
            valid = fs_scan_f64(&p[r, 0], cols, &total)
        if not valid:
            return 1
        if first_bad_sum < 0:
            if (normalised and abs(total - 1.0) > tol) or (not normalised and not total > 0.0):
                first_bad_sum = r
                bad_sum[0] = total
    if first_bad_sum >= 0:
        return 2 + (<int>first_bad_sum << 2)
    return 0


cdef _check_rows_data(p, str name, bint normalised=True):
    """The data part of _checks.check_probability_rows, in typed code, same messages."""
    cdef double bad_sum = 0.0, tol = ROW_SUM_TOL[p.dtype]
    cdef int status
    cdef const float[:, ::1] p32
    cdef const double[:, ::1] p64
    if p.dtype == np.float32:
        p32 = p
        with nogil:
            status = _rows_status(p32, tol, normalised, &bad_sum)
    else:
        p64 = p
        with nogil:
            status = _rows_status(p64, tol, normalised, &bad_sum)
    if status == 1:
        raise ValueError(NOT_PROBABILITIES.format(name=name))
    if status:
        if normalised:
            # report the row sum as numpy's float64 sum gives it
            row = status >> 2
            raise ValueError(ROW_SUM.format(name=name, row=row,
                                            total=p[row].sum(dtype=np.float64)))
        raise ValueError(NO_MASS.format(name=name))


cdef bint _all_finite(const floating[::1] x) noexcept:
    cdef bint ok
    with nogil:
        if floating is float:
            ok = fs_all_finite_f32(&x[0], x.shape[0])
        else:
            ok = fs_all_finite_f64(&x[0], x.shape[0])
    return ok


cdef _check_finite(a, str name):
    flat = a.reshape(-1)
    cdef bint ok
    if a.dtype == np.float32:
        ok = _all_finite[float](flat)
    else:
        ok = _all_finite[double](flat)
    if not ok:
        raise ValueError(NOT_FINITE.format(name=name))


# ---- probs -------------------------------------------------------------------------------

cdef struct _Scratch:
    double *z
    double *spare
    uint64_t *key
    uint64_t *tmp_key
    int32_t *idx
    int32_t *tmp_idx
    int32_t *kept


cdef inline void _sift_down(double *heap, Py_ssize_t k, Py_ssize_t i) noexcept nogil:
    """Restore the min-heap property of heap[0:k) below index i."""
    cdef double v = heap[i]
    cdef Py_ssize_t c
    while True:
        c = 2 * i + 1
        if c >= k:
            break
        if c + 1 < k and heap[c + 1] < heap[c]:
            c += 1
        if not heap[c] < v:
            break
        heap[i] = heap[c]
        i = c
    heap[i] = v


cdef double _kth_largest(const double *z,   # IN  (n,)
                         Py_ssize_t n, Py_ssize_t k,
                         double *spare      # scratch (n,)
                         ) noexcept nogil:
    """The k-th largest of z[0:n) (duplicates counted), 0 < k < n: the same value as
    fs_select_kth(copy of z, n, n - k). A small k keeps the k largest in a min-heap, one
    compare per token for most of a large vocabulary (quickselect's data-dependent branches
    cost ~8x more at V = 151936, k = 50); a large k uses the quickselect."""
    cdef Py_ssize_t j
    if k * 64 > n:
        memcpy(spare, z, n * sizeof(double))
        return fs_select_kth(spare, n, n - k)
    memcpy(spare, z, k * sizeof(double))
    j = k // 2
    while j > 0:
        j -= 1
        _sift_down(spare, k, j)
    for j in range(k, n):
        if z[j] > spare[0]:
            spare[0] = z[j]
            _sift_down(spare, k, 0)
    return spare[0]


cdef void _probs_rows(const floating[:, ::1] logits,      # IN  (rows, V)
                      floating[:, ::1] out,                # OUT (rows, V), zero-filled
                      double temperature, Py_ssize_t top_k, double top_p,
                      _Scratch *s) noexcept:
    with nogil:
        _probs_rows_nogil(logits, out, temperature, top_k, top_p, s)


cdef void _probs_rows_nogil(const floating[:, ::1] logits, floating[:, ::1] out,
                            double temperature, Py_ssize_t top_k, double top_p,
                            _Scratch *s) noexcept nogil:
    cdef Py_ssize_t rows = logits.shape[0], vocab = logits.shape[1], r, j, m
    cdef double zmax, kth, total
    cdef long best
    for r in range(rows):
        if temperature == 0.0:
            if floating is float:
                best = fs_argmax_f32(&logits[r, 0], vocab)
            else:
                best = fs_argmax_f64(&logits[r, 0], vocab)
            out[r, best] = 1
            continue
        if floating is float:
            zmax = fs_scale_row_f32(&logits[r, 0], vocab, temperature, s.z)
        else:
            zmax = fs_scale_row_f64(&logits[r, 0], vocab, temperature, s.z)
        if 0 < top_k < vocab:
            kth = _kth_largest(s.z, vocab, top_k, s.spare)
            # Only the kept tokens go on, in index order: every sum below is the full row's
            # minus exact zeros (bit-identical results), for k instead of V tokens.
            m = 0
            for j in range(vocab):
                if s.z[j] >= kth:
                    s.kept[m] = <int32_t>j
                    s.spare[m] = s.z[j]
                    m += 1
            total = fs_attn_exp_sum(s.spare, <int>m, zmax)
            if top_p < 1.0:
                for j in range(m):
                    s.spare[j] = s.spare[j] / total
                fs_top_p(s.spare, m, top_p, s.key, s.idx, s.tmp_key, s.tmp_idx)
                total = 1.0
            for j in range(m):  # out is zero-filled; fs_store_scaled's rounding
                out[r, s.kept[j]] = <floating>(s.spare[j] / total)
            continue
        total = fs_attn_exp_sum(s.z, <int>vocab, zmax)
        if top_p < 1.0:
            for j in range(vocab):
                s.z[j] = s.z[j] / total
            fs_top_p(s.z, vocab, top_p, s.key, s.idx, s.tmp_key, s.tmp_idx)
            total = 1.0
        if floating is float:
            fs_store_scaled_f32(s.z, vocab, total, &out[r, 0])
        else:
            fs_store_scaled_f64(s.z, vocab, total, &out[r, 0])


def probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Turn rows of logits into the sampling distribution fastspec verifies against.

    The pipeline is temperature, then top-k, then top-p (nucleus). ``temperature == 0``
    gives the one-hot of the argmax (the first index among ties). Top-k keeps every token
    whose logit is at least the k-th largest (ties at the boundary are kept). Top-p sorts the
    remaining tokens by probability, descending, ties by lower index first, and keeps each
    token whose preceding mass (float64) is below ``top_p``.

    Parameters
    ----------
    logits : ndarray of shape (n, V) or (V,)
        Finite float32 or float64 logits.
    temperature : float, default 1.0
        ``>= 0``; 0 means greedy.
    top_k : int, default 0
        ``>= 0``; 0 disables it.
    top_p : float, default 1.0
        In ``(0, 1]``; 1 disables it.

    Returns
    -------
    p : ndarray, same shape and dtype as ``logits``
        Each row sums to 1.
    """
    check_logits(logits, data=False)
    _check_finite(logits, "logits")
    temperature, top_k, top_p = check_sampling_params(temperature, top_k, top_p)
    _check_int_sized(logits.shape, "logits")
    rows = logits if logits.ndim == 2 else logits.reshape(1, logits.shape[0])
    out = np.zeros(rows.shape, dtype=logits.dtype)
    cdef Py_ssize_t vocab = rows.shape[1]
    cdef double t = temperature, tp = top_p
    cdef Py_ssize_t k = min(top_k, vocab)
    cdef _Scratch s = _Scratch(NULL, NULL, NULL, NULL, NULL, NULL, NULL)
    # one per-thread block for every scratch array, obtained with the GIL
    cdef unsigned char *block = NULL
    if t != 0.0:
        block = _scratch(vocab * (2 * sizeof(double) + 2 * sizeof(uint64_t)
                                  + 3 * sizeof(int32_t)))
        s.z = <double *>block
        s.spare = s.z + vocab
        s.key = <uint64_t *>(s.spare + vocab)
        s.tmp_key = s.key + vocab
        s.idx = <int32_t *>(s.tmp_key + vocab)
        s.tmp_idx = s.idx + vocab
        s.kept = s.tmp_idx + vocab
    if logits.dtype == np.float32:
        _probs_rows[float](rows, out, t, k, tp, &s)
    else:
        _probs_rows[double](rows, out, t, k, tp, &s)
    return out if logits.ndim == 2 else out[0]


# ---- sample ------------------------------------------------------------------------------

cdef long _sample_run(const floating[::1] p, double u,
                      double *ends) noexcept:  # TMP (FS_CDF_CHECKPOINTS(V),)
    cdef long index
    with nogil:
        if floating is float:
            index = fs_inverse_cdf_f32(&p[0], p.shape[0], -1, u, ends)
        else:
            index = fs_inverse_cdf_f64(&p[0], p.shape[0], -1, u, ends)
    return index


def sample(p, u):
    """Draw one index from weights ``p`` by inverse CDF with the uniform ``u``.

    Parameters
    ----------
    p : ndarray of shape (V,)
        Non-negative weights (need not be normalised) with a positive sum.
    u : float
        Uniform draw in ``[0, 1)``.

    Returns
    -------
    index : int
        The first ``j`` whose cumulative weight exceeds ``u * sum(p)`` (float64).
    """
    check_float_array(p, "p", 1)
    rows = p.reshape(1, -1)
    check_probability_rows(rows, "p", normalised=False, data=False)
    _check_rows_data(rows, "p", normalised=False)
    check_uniforms(np.asarray([u], dtype=np.float64), 1, "u")
    cdef double draw = u
    cdef long index
    cdef double *ends = <double *>_scratch(FS_CDF_CHECKPOINTS(p.shape[0]) * sizeof(double))
    if p.dtype == np.float32:
        index = _sample_run[float](p, draw, ends)
    else:
        index = _sample_run[double](p, draw, ends)
    return index


# ---- verification ------------------------------------------------------------------------

# Fast acceptance of well-formed arguments in typed code; anything unusual falls back to the
# Python checks of fastspec._checks, which raise the documented message (or accept it).

cdef bint _tokens_in_range(const int64_t[::1] tokens, int64_t vocab) noexcept:
    cdef Py_ssize_t i
    for i in range(tokens.shape[0]):
        if tokens[i] < 0 or tokens[i] >= vocab:
            return False
    return True


cdef object _fast_tokens(draft_tokens, rows):
    """draft_tokens as a C-contiguous int64 array when check_tokens would pass, else None."""
    if not isinstance(draft_tokens, np.ndarray) or not isinstance(rows, np.ndarray):
        return None
    if draft_tokens.ndim != 1 or rows.ndim != 2 or draft_tokens.dtype.kind not in "iu":
        return None
    if rows.shape[0] != draft_tokens.shape[0] + 1:
        return None
    tokens = np.ascontiguousarray(draft_tokens, dtype=np.int64)
    if draft_tokens.dtype.kind == "u" and draft_tokens.dtype.itemsize == 8:
        return None  # values above 2**63 would wrap; leave them to check_tokens
    if not _tokens_in_range(tokens, rows.shape[1]):
        return None
    return tokens


cdef bint _fast_rows(a) noexcept:
    """True when check_probability_rows(a, ..., data=False) would pass."""
    return _is_float_c(a, 2) and a.shape[1] >= 1


cdef bint _uniforms_ok(const double[::1] u) noexcept:
    cdef Py_ssize_t i
    for i in range(u.shape[0]):
        if not (u[i] >= 0.0 and u[i] < 1.0):
            return False
    return True


cdef bint _fast_uniforms(uniforms, Py_ssize_t count):
    """True when check_uniforms(uniforms, count) would pass."""
    if not isinstance(uniforms, np.ndarray) or uniforms.dtype != _F64:
        return False
    if uniforms.ndim != 1 or uniforms.shape[0] != count or not uniforms.flags.c_contiguous:
        return False
    return _uniforms_ok(uniforms)


cdef Py_ssize_t _greedy_run(const int64_t[::1] tokens,         # IN  (g,)
                            const floating[:, ::1] logits,     # IN  (g + 1, V)
                            long *next_token) noexcept:
    cdef Py_ssize_t g = tokens.shape[0], vocab = logits.shape[1], i = 0
    cdef long best = 0
    with nogil:
        for i in range(g + 1):
            if floating is float:
                best = fs_argmax_f32(&logits[i, 0], vocab)
            else:
                best = fs_argmax_f64(&logits[i, 0], vocab)
            if i == g or best != tokens[i]:
                break
    next_token[0] = best
    return i


def verify_greedy(draft_tokens, target_logits):
    """Accept the longest prefix of the draft that matches the target's argmax.

    Parameters
    ----------
    draft_tokens : ndarray of shape (g,), integer
        Proposed tokens, ``0 <= token < V``.
    target_logits : ndarray of shape (g + 1, V)
        Row ``i`` scores the position of ``draft_tokens[i]``; row ``g`` scores the bonus.

    Returns
    -------
    n_accepted : int
        Number of accepted draft tokens, ``0 <= n_accepted <= g``.
    next_token : int
        The target's argmax at the first mismatch, or the bonus token after a full accept.
    """
    tokens = _fast_tokens(draft_tokens, target_logits)
    if tokens is None or not _fast_rows(target_logits):
        check_tokens(draft_tokens, target_logits, "target_logits")
        check_logits(target_logits, "target_logits", ndim=2, data=False)
        tokens = np.ascontiguousarray(draft_tokens, dtype=np.int64)
    _check_finite(target_logits, "target_logits")
    cdef long next_token = 0
    cdef Py_ssize_t accepted
    if target_logits.dtype == np.float32:
        accepted = _greedy_run[float](tokens, target_logits, &next_token)
    else:
        accepted = _greedy_run[double](tokens, target_logits, &next_token)
    return accepted, next_token


cdef int _q_status(const int64_t[::1] tokens, const floating[:, ::1] q) noexcept nogil:
    """-1 when q[i, draft_tokens[i]] > 0 for every i, else the first bad i."""
    cdef Py_ssize_t i
    for i in range(tokens.shape[0]):
        if not q[i, tokens[i]] > 0:
            return <int>i
    return -1


cdef Py_ssize_t _rejection_run(const int64_t[::1] tokens,       # IN  (g,)
                               const floating[:, ::1] p,        # IN  (g + 1, V)
                               const floating[:, ::1] q,        # IN  (g, V), unused if none
                               bint has_q,
                               const double[::1] uniforms,      # IN  (g + 1,)
                               double *ends,            # TMP (FS_CDF_CHECKPOINTS(V),)
                               long *next_token) noexcept:
    cdef Py_ssize_t accepted
    with nogil:
        accepted = _rejection_nogil(tokens, p, q, has_q, uniforms, ends, next_token)
    return accepted


cdef Py_ssize_t _rejection_nogil(const int64_t[::1] tokens, const floating[:, ::1] p,
                                 const floating[:, ::1] q, bint has_q,
                                 const double[::1] uniforms, double *cum,
                                 long *next_token) noexcept nogil:
    cdef Py_ssize_t g = tokens.shape[0], vocab = p.shape[1], i
    cdef long x, drawn
    cdef double qx
    for i in range(g):
        x = tokens[i]
        qx = q[i, x] if has_q else 1.0
        if uniforms[i] * qx < <double>p[i, x]:
            continue
        drawn = -1
        if has_q:
            if floating is float:
                drawn = fs_residual_draw_f32(&p[i, 0], &q[i, 0], vocab, uniforms[g], cum)
            else:
                drawn = fs_residual_draw_f64(&p[i, 0], &q[i, 0], vocab, uniforms[g], cum)
        elif _residual_without(&p[i, 0], vocab, x):
            if floating is float:
                drawn = fs_inverse_cdf_f32(&p[i, 0], vocab, x, uniforms[g], cum)
            else:
                drawn = fs_inverse_cdf_f64(&p[i, 0], vocab, x, uniforms[g], cum)
        if drawn < 0:  # the residual is all zero (only through rounding): draw from p itself
            if floating is float:
                drawn = fs_inverse_cdf_f32(&p[i, 0], vocab, -1, uniforms[g], cum)
            else:
                drawn = fs_inverse_cdf_f64(&p[i, 0], vocab, -1, uniforms[g], cum)
        next_token[0] = drawn
        return i
    if floating is float:
        next_token[0] = fs_inverse_cdf_f32(&p[g, 0], vocab, -1, uniforms[g], cum)
    else:
        next_token[0] = fs_inverse_cdf_f64(&p[g, 0], vocab, -1, uniforms[g], cum)
    return g


cdef inline bint _residual_without(const floating *row, Py_ssize_t vocab,
                                   Py_ssize_t x) noexcept nogil:
    """True when the row without token x has positive mass."""
    cdef Py_ssize_t j
    for j in range(vocab):
        if j != x and row[j] > 0:
            return True
    return False


def verify_rejection(draft_tokens, p, q, uniforms):
    """Speculative-sampling accept/reject step; exactly preserves the target distribution.

    Token ``i`` is accepted when ``uniforms[i] * q[i, x] < p[i, x]`` (probability
    ``min(1, p/q)``). On the first rejection the correction is drawn from
    ``normalise(max(p[i] - q[i], 0))``; after a full accept the bonus is drawn from ``p[g]``.
    Both draws use ``uniforms[g]`` by inverse CDF.

    Parameters
    ----------
    draft_tokens : ndarray of shape (g,), integer
    p : ndarray of shape (g + 1, V)
        Target probabilities (rows sum to 1).
    q : ndarray of shape (g, V) or None
        Draft probabilities the tokens were sampled from; None means deterministic (one-hot)
        proposals, for which the correction is drawn from ``p`` with the proposal removed.
    uniforms : ndarray of shape (g + 1,), float64
        Draws in ``[0, 1)``.

    Returns
    -------
    n_accepted : int
    next_token : int
        The correction after a rejection, else the bonus token.
    """
    tokens = _fast_tokens(draft_tokens, p)
    if tokens is None or not _fast_rows(p):
        check_tokens(draft_tokens, p, "p")
        check_probability_rows(p, "p", data=False)
        tokens = np.ascontiguousarray(draft_tokens, dtype=np.int64)
    cdef Py_ssize_t g = tokens.shape[0]
    _check_rows_data(p, "p")
    cdef int bad
    if q is not None:
        if not isinstance(q, np.ndarray):
            raise TypeError(f"q must be a numpy.ndarray or None, got {type(q).__name__}")
        if q.dtype != p.dtype:
            raise TypeError(f"q must have the dtype of p ({p.dtype}), got {q.dtype}")
        if q.ndim != 2 or q.shape != (g, p.shape[1]):
            raise ValueError(f"q must have shape {(g, p.shape[1])}, got {q.shape}")
        if not _fast_rows(q):
            check_probability_rows(q, "q", data=False)
        if g:
            _check_rows_data(q, "q")
            if q.dtype == np.float32:
                bad = _q_status[float](tokens, q)
            else:
                bad = _q_status[double](tokens, q)
            if bad >= 0:
                raise ValueError(f"q[{bad}, draft_tokens[{bad}]] must be > 0: the draft token "
                                 "cannot have been sampled from q")
    if not _fast_uniforms(uniforms, g + 1):
        check_uniforms(uniforms, g + 1)
    cdef long next_token = 0
    cdef Py_ssize_t accepted
    has_q = q is not None and g > 0
    q_rows = q if has_q else p  # a placeholder view when there is no q
    cdef double *ends = <double *>_scratch(FS_CDF_CHECKPOINTS(p.shape[1]) * sizeof(double))
    if p.dtype == np.float32:
        accepted = _rejection_run[float](tokens, p, q_rows, has_q, uniforms, ends, &next_token)
    else:
        accepted = _rejection_run[double](tokens, p, q_rows, has_q, uniforms, ends,
                                          &next_token)
    return accepted, next_token



# ---- tree verification: tree attention, KV compaction ---------------------------------------

cdef void _tree_attention_run(const floating[:, :, ::1] q,        # IN  (n, H, D)
                              const floating[:, :, ::1] k,        # IN  (H_kv, C, D)
                              const floating[:, :, ::1] v,        # IN  (H_kv, C, D)
                              const unsigned char[:, ::1] mask,   # IN  (n, n) ancestors
                              floating[:, :, ::1] out,            # OUT (n, H, D)
                              Py_ssize_t length, double *s, double *acc) noexcept:
    cdef Py_ssize_t n = q.shape[0], H = q.shape[1], D = q.shape[2]
    cdef Py_ssize_t group = H // k.shape[0], ctx = length - n
    cdef Py_ssize_t i, h, kh, j, d
    cdef double scale = 1.0 / sqrt(<double>D), m, total, dot, w
    with nogil:
        for i in range(n):
            for h in range(H):
                kh = h // group
                m = -INFINITY
                for j in range(length):
                    if j >= ctx and not mask[i, j - ctx]:
                        s[j] = -INFINITY  # not an ancestor: invisible
                        continue
                    dot = 0.0
                    for d in range(D):
                        dot = dot + <double>q[i, h, d] * <double>k[kh, j, d]
                    s[j] = dot * scale
                    if s[j] > m:
                        m = s[j]
                total = 0.0
                for d in range(D):
                    acc[d] = 0.0
                for j in range(length):
                    if s[j] == -INFINITY:
                        continue
                    w = exp(s[j] - m)
                    total = total + w
                    for d in range(D):
                        acc[d] = acc[d] + w * <double>v[kh, j, d]
                for d in range(D):
                    out[i, h, d] = <floating>(acc[d] / total)


def tree_attention(q, k_cache, v_cache, length, tree_mask, out=None):
    """Attention of ``n`` tree nodes: each sees the cached context and its own ancestors.

    Parameters
    ----------
    q : ndarray of shape (n, n_heads, head_dim)
        Queries of the nodes stored at cache positions ``length - n .. length - 1``.
    k_cache, v_cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        As for :func:`attention`; keys ``[0, length - n)`` are the committed context.
    length : int
        Number of valid keys, ``n <= length <= capacity``.
    tree_mask : ndarray of shape (n, n), bool
        ``tree_mask[i, j]``: node ``i`` sees node ``j`` (its ancestors and itself). The
        diagonal must be True.
    out : ndarray of shape (n, n_heads, head_dim), optional

    Returns
    -------
    out : ndarray of shape (n, n_heads, head_dim)
    """
    check_attention_args(q, k_cache, v_cache, length, out)
    n = q.shape[0]
    check_tree_mask(tree_mask, n)
    _check_int_sized(q.shape, "q")
    _check_int_sized(k_cache.shape, "k_cache")
    cdef Py_ssize_t n_valid = length
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    if q.shape[1] == 0 or q.shape[2] == 0:
        out[...] = 0
        return out
    mask = np.ascontiguousarray(tree_mask).view(np.uint8)
    cdef double *s = <double *>_scratch((n_valid + q.shape[2]) * sizeof(double))
    if q.dtype == np.float32:
        _tree_attention_run[float](q, k_cache, v_cache, mask, out, n_valid, s, s + n_valid)
    else:
        _tree_attention_run[double](q, k_cache, v_cache, mask, out, n_valid, s, s + n_valid)
    return out


cdef void _compact_kv_run(floating[:, :, :, ::1] k,     # OUT (L, H_kv, C, D)
                          floating[:, :, :, ::1] v,     # OUT (L, H_kv, C, D)
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
                        memcpy(&k[l, h, start + j, 0], &k[l, h, src, 0], D * sizeof(floating))
                        memcpy(&v[l, h, start + j, 0], &v[l, h, src, 0], D * sizeof(floating))


def compact_kv(k, v, start, rows):
    """Move the cache rows ``rows`` to positions ``start ..`` (the accepted tree path), in place.

    Parameters
    ----------
    k, v : ndarray of shape (n_layers, n_kv_heads, capacity, head_dim)
        Writable, C-contiguous key and value buffers.
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
    if k.dtype == np.float32:
        _compact_kv_run[float](k, v, first, src)
    else:
        _compact_kv_run[double](k, v, first, src)
