"""Compiled verification kernels of :mod:`fastspec.kernels`: ``verify_greedy`` and
``verify_rejection`` (the speculative accept/reject step).

Same names, signatures, results and messages as :mod:`fastspec.kernels._reference`, and the same
tokens bit for bit (the inverse-CDF sums of the correction and bonus draws are sequential in
float64, exactly like numpy.cumsum). Well-formed arguments are accepted by typed fast paths;
anything else goes through :mod:`fastspec.kernels.checks`, which raises the documented message.
"""
from cython cimport floating
from libc.stdint cimport int64_t

import numpy as np

from fastspec.kernels.checks import check_logits, check_probability_rows, check_tokens, check_uniforms

from fastspec.kernels._csrc cimport (
    FS_CDF_CHECKPOINTS,
    fs_argmax_f32,
    fs_argmax_f64,
    fs_inverse_cdf_f32,
    fs_inverse_cdf_f64,
    fs_residual_draw_f32,
    fs_residual_draw_f64,
)
from fastspec.kernels._kernels_base cimport check_finite, check_rows_data, is_float_c, thread_scratch

__all__ = ["verify_greedy", "verify_rejection"]

_F64 = np.dtype(np.float64)


# ---- verification ------------------------------------------------------------------------

# Fast acceptance of well-formed arguments in typed code; anything unusual falls back to the
# Python checks of fastspec.kernels.checks, which raise the documented message (or accept it).

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
    return is_float_c(a, 2) and a.shape[1] >= 1


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
    check_finite(target_logits, "target_logits")
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
    check_rows_data(p, "p")
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
            check_rows_data(q, "q")
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
    cdef double *ends = <double *>thread_scratch(FS_CDF_CHECKPOINTS(p.shape[1]) * sizeof(double))
    if p.dtype == np.float32:
        accepted = _rejection_run[float](tokens, p, q_rows, has_q, uniforms, ends, &next_token)
    else:
        accepted = _rejection_run[double](tokens, p, q_rows, has_q, uniforms, ends,
                                          &next_token)
    return accepted, next_token
