"""Compiled sampling kernels of :mod:`fastspec.kernels`: ``probs`` (temperature, top-k,
top-p) and ``sample`` (inverse CDF with a given uniform).

Same names, signatures, results and messages as :mod:`fastspec.kernels._reference`. ``probs`` agrees
with the twin to rounding; ``sample`` returns the same index bit for bit (its inverse-CDF sum
is sequential in float64, exactly like numpy.cumsum).
"""
from cython cimport floating
from libc.stdint cimport int32_t, uint64_t
from libc.string cimport memset

import numpy as np

from fastspec.kernels.checks import (
    check_float_array,
    check_logits,
    check_probs_out,
    check_probability_rows,
    check_sampling_params,
    check_uniforms,
)

from fastspec.kernels._csrc cimport (
    FS_CDF_CHECKPOINTS,
    fs_argmax_f32,
    fs_argmax_f64,
    fs_exp_sum,
    fs_inverse_cdf_f32,
    fs_inverse_cdf_f64,
    fs_scale_row_f32,
    fs_scale_row_f64,
    fs_store_scaled_f32,
    fs_store_scaled_f64,
    fs_top_k_scaled_f32,
    fs_top_k_scaled_f64,
    fs_top_p,
)
from fastspec.kernels._kernels_base cimport check_finite, check_int_sized, check_rows_data, thread_scratch

__all__ = ["probs", "sample"]


# ---- probs -------------------------------------------------------------------------------

cdef struct _Scratch:
    double *z
    double *spare
    uint64_t *key
    uint64_t *tmp_key
    int32_t *idx
    int32_t *tmp_idx
    int32_t *kept


cdef void _probs_rows(const floating[:, ::1] logits,      # IN  (rows, V)
                      floating[:, ::1] out,                # OUT (rows, V), overwritten
                      double temperature, Py_ssize_t top_k, double top_p,
                      _Scratch *s) noexcept:
    with nogil:
        _probs_rows_nogil(logits, out, temperature, top_k, top_p, s)


cdef void _probs_rows_nogil(const floating[:, ::1] logits, floating[:, ::1] out,
                            double temperature, Py_ssize_t top_k, double top_p,
                            _Scratch *s) noexcept nogil:
    cdef Py_ssize_t rows = logits.shape[0], vocab = logits.shape[1], r, j, m
    cdef double zmax, total
    cdef long best
    for r in range(rows):
        if temperature == 0.0 or 0 < top_k < vocab:  # sparse rows: zeros, then the kept
            memset(&out[r, 0], 0, vocab * sizeof(floating))
        if temperature == 0.0:
            if floating is float:
                best = fs_argmax_f32(&logits[r, 0], vocab)
            else:
                best = fs_argmax_f64(&logits[r, 0], vocab)
            out[r, best] = 1
            continue
        if 0 < top_k < vocab:
            # Only the kept tokens go on, in index order: every sum below is the full row's
            # minus exact zeros (bit-identical results), for k instead of V tokens.
            if floating is float:
                m = fs_top_k_scaled_f32(&logits[r, 0], vocab, top_k, temperature, s.kept,
                                        s.spare, s.z, &zmax)
            else:
                m = fs_top_k_scaled_f64(&logits[r, 0], vocab, top_k, temperature, s.kept,
                                        s.spare, s.z, &zmax)
            total = fs_exp_sum(s.spare, <int>m, zmax)
            if top_p < 1.0:
                for j in range(m):
                    s.spare[j] = s.spare[j] / total
                fs_top_p(s.spare, m, top_p, s.key, s.idx, s.tmp_key, s.tmp_idx)
                total = 1.0
            for j in range(m):  # the row is zero-filled; fs_store_scaled's rounding
                out[r, s.kept[j]] = <floating>(s.spare[j] / total)
            continue
        if floating is float:
            zmax = fs_scale_row_f32(&logits[r, 0], vocab, temperature, s.z)
        else:
            zmax = fs_scale_row_f64(&logits[r, 0], vocab, temperature, s.z)
        total = fs_exp_sum(s.z, <int>vocab, zmax)
        if top_p < 1.0:
            for j in range(vocab):
                s.z[j] = s.z[j] / total
            fs_top_p(s.z, vocab, top_p, s.key, s.idx, s.tmp_key, s.tmp_idx)
            total = 1.0
        if floating is float:
            fs_store_scaled_f32(s.z, vocab, total, &out[r, 0])
        else:
            fs_store_scaled_f64(s.z, vocab, total, &out[r, 0])


def probs(logits, temperature=1.0, top_k=0, top_p=1.0, out=None):
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
    out : ndarray, optional
        Caller-owned result buffer (shape and dtype of ``logits``, C-contiguous, not
        overlapping it), overwritten; a decoding loop reuses one instead of a fresh
        ``(n, V)`` array per round.

    Returns
    -------
    p : ndarray, same shape and dtype as ``logits``
        Each row sums to 1 (``out`` when given).
    """
    check_logits(logits, data=False)
    check_finite(logits, "logits")
    temperature, top_k, top_p = check_sampling_params(temperature, top_k, top_p)
    check_int_sized(logits.shape, "logits")
    if out is None:
        out = np.empty(logits.shape, dtype=logits.dtype)
    else:
        check_probs_out(out, logits)
    result = out
    rows = logits if logits.ndim == 2 else logits.reshape(1, logits.shape[0])
    out = out if out.ndim == 2 else out.reshape(1, out.shape[0])
    cdef Py_ssize_t vocab = rows.shape[1]
    cdef double t = temperature, tp = top_p
    cdef Py_ssize_t k = min(top_k, vocab)
    cdef _Scratch s = _Scratch(NULL, NULL, NULL, NULL, NULL, NULL, NULL)
    # one per-thread block for every scratch array, obtained with the GIL
    cdef unsigned char *block = NULL
    if t != 0.0:
        block = thread_scratch(vocab * (2 * sizeof(double) + 2 * sizeof(uint64_t)
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
    return result


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
    check_rows_data(rows, "p", normalised=False)
    check_uniforms(np.asarray([u], dtype=np.float64), 1, "u")
    cdef double draw = u
    cdef long index
    cdef double *ends = <double *>thread_scratch(FS_CDF_CHECKPOINTS(p.shape[0]) * sizeof(double))
    if p.dtype == np.float32:
        index = _sample_run[float](p, draw, ends)
    else:
        index = _sample_run[double](p, draw, ends)
    return index
