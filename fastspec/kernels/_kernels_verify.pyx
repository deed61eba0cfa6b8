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

from fastspec.kernels.checks import (
    Q_ZERO,
    ROW_SUM_TOL,
    check_draft_rows,
    check_logits,
    check_probability_rows,
    check_tokens,
    check_uniforms,
)

from fastspec.kernels._csrc cimport (
    FS_CDF_CHECKPOINTS,
    fs_argmax_f32,
    fs_argmax_f64,
    fs_inverse_cdf_f32,
    fs_inverse_cdf_f64,
    fs_residual_draw_f32,
    fs_residual_draw_f64,
    fs_scan_f32,
    fs_scan_f64,
)
from fastspec.kernels._kernels_base cimport (
    check_finite,
    check_rows_data,
    is_float_c,
    raise_rows_status,
    thread_scratch,
)

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


cdef struct _Checked:
    # What the fused pass of verify_rejection found: _rows_status codes (_kernels_base) of p
    # and q, the first i with q[i, draft_tokens[i]] <= 0 (-1: none), and the step's result.
    int p_status
    int q_status
    Py_ssize_t q_zero
    Py_ssize_t accepted
    long next_token


cdef inline int _scan(const floating *row, Py_ssize_t vocab, double tol,
                      Py_ssize_t r) noexcept nogil:
    """_rows_status' code for row r alone: 0 valid, 1 not finite or negative, bad sum."""
    cdef double total
    cdef int valid
    if floating is float:
        valid = fs_scan_f32(row, vocab, &total)
    else:
        valid = fs_scan_f64(row, vocab, &total)
    if not valid:
        return 1
    return 2 + (<int>r << 2) if abs(total - 1.0) > tol else 0


cdef void _rejection_checked(const int64_t[::1] tokens,       # IN  (g,)
                             const floating[:, ::1] p,        # IN  (g + 1, V)
                             const floating[:, ::1] q,        # IN  (g, V), unused if none
                             bint has_q,
                             const double[::1] uniforms,      # IN  (g + 1,)
                             double tol,
                             double *cum,                     # TMP (FS_CDF_CHECKPOINTS(V),)
                             _Checked *out) noexcept nogil:   # OUT
    """Validate p and q row by row and run the step in the same pass: the rows a rejection
    draws from are drawn while the scan has them in cache. Statuses keep the first error of
    each array (a non-finite or negative entry anywhere before any row sum, as
    check_rows_data); the result means something only when no status is set."""
    cdef Py_ssize_t g = tokens.shape[0], vocab = p.shape[1], i, x
    cdef int st
    cdef bint decided = False
    out.p_status = out.q_status = 0
    out.q_zero = -1
    out.accepted = g
    out.next_token = 0
    for i in range(g + 1):
        st = _scan(&p[i, 0], vocab, tol, i)
        if st == 1:
            out.p_status = 1  # reported before anything else: stop here
            return
        if st and not out.p_status:
            out.p_status = st
        if i == g:
            break
        x = tokens[i]
        if has_q and out.q_status != 1:
            st = _scan(&q[i, 0], vocab, tol, i)
            if st and (st == 1 or not out.q_status):
                out.q_status = st
            if out.q_zero < 0 and not q[i, x] > 0:
                out.q_zero = i
        if not decided and not out.p_status and not out.q_status and out.q_zero < 0:
            if not uniforms[i] * (q[i, x] if has_q else 1.0) < <double>p[i, x]:
                out.accepted = i
                out.next_token = _correction(tokens, p, q, has_q, uniforms, i, cum)
                decided = True
    if not decided:
        if floating is float:
            out.next_token = fs_inverse_cdf_f32(&p[g, 0], vocab, -1, uniforms[g], cum)
        else:
            out.next_token = fs_inverse_cdf_f64(&p[g, 0], vocab, -1, uniforms[g], cum)


cdef long _correction(const int64_t[::1] tokens, const floating[:, ::1] p,
                      const floating[:, ::1] q, bint has_q, const double[::1] uniforms,
                      Py_ssize_t i, double *cum) noexcept nogil:
    """The token drawn after rejecting draft token i: from normalise(max(p - q, 0)), or from
    p without the token for one-hot proposals; from p when that residual is all zero."""
    cdef Py_ssize_t g = tokens.shape[0], vocab = p.shape[1]
    cdef long x = tokens[i], drawn = -1
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
    return drawn


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
    has_q = q is not None and g > 0
    if (q is not None and not _q_structure_ok(q, p, g)) or not _fast_uniforms(uniforms, g + 1):
        # an argument the fused pass cannot take: the checks one by one, in their order
        check_rows_data(p, "p")
        if q is not None:
            check_draft_rows(q, p, g, data=False)
        if has_q:
            check_rows_data(q, "q")
            zero = np.flatnonzero(~(q[np.arange(g), tokens] > 0))
            if zero.size:
                raise ValueError(Q_ZERO.format(i=zero[0]))
        check_uniforms(uniforms, g + 1)
    cdef _Checked c
    cdef double tol = ROW_SUM_TOL[p.dtype]
    q_rows = q if has_q else p  # a placeholder view when there is no q
    cdef double *ends = <double *>thread_scratch(FS_CDF_CHECKPOINTS(p.shape[1]) * sizeof(double))
    if p.dtype == np.float32:
        _rejection_run[float](tokens, p, q_rows, has_q, uniforms, tol, ends, &c)
    else:
        _rejection_run[double](tokens, p, q_rows, has_q, uniforms, tol, ends, &c)
    raise_rows_status(p, "p", c.p_status)
    raise_rows_status(q_rows, "q", c.q_status)
    if c.q_zero >= 0:
        raise ValueError(Q_ZERO.format(i=c.q_zero))
    return c.accepted, c.next_token


cdef void _rejection_run(const int64_t[::1] tokens, const floating[:, ::1] p,
                         const floating[:, ::1] q, bint has_q, const double[::1] uniforms,
                         double tol, double *ends, _Checked *c) noexcept:
    with nogil:
        _rejection_checked(tokens, p, q, has_q, uniforms, tol, ends, c)


cdef bint _q_structure_ok(q, p, Py_ssize_t g):
    """Whether q passes check_draft_rows(q, p, g, data=False) (without raising)."""
    return (isinstance(q, np.ndarray) and q.dtype == p.dtype and q.ndim == 2
            and q.shape == (g, p.shape[1]) and _fast_rows(q))
