"""What the compiled kernels share: per-thread scratch memory, the typed fast paths of the
argument checks, and the typed scans of O(V) data (finite, non-negative, rows summing to 1).

The kernel modules (:mod:`fastspec.kernels._kernels_attention`, :mod:`fastspec.kernels._kernels_sampling`,
:mod:`fastspec.kernels._kernels_verify`) cimport these through ``_kernels_base.pxd``.
"""
from cython cimport floating

import threading

import numpy as np

from fastspec.kernels.checks import NO_MASS, NOT_FINITE, NOT_PROBABILITIES, ROW_SUM, ROW_SUM_TOL

from fastspec.kernels._csrc cimport fs_all_finite_f32, fs_all_finite_f64, fs_scan_f32, fs_scan_f64

__all__ = []


cdef Py_ssize_t _INT_LIMIT = 2**31 - 1


_local = threading.local()
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


cdef bint is_float_c(a, int ndim, dtype=None):
    """True when check_float_array(a, name, ndim, dtype) would pass (typed fast path; on
    False the Python check runs and raises its message)."""
    if not isinstance(a, np.ndarray) or a.ndim != ndim or not a.flags.c_contiguous:
        return False
    dt = a.dtype
    if dtype is not None:
        return dt is dtype or dt == dtype
    return dt is _F32 or dt is _F64 or dt == _F32 or dt == _F64


cdef unsigned char *thread_scratch(Py_ssize_t nbytes) except NULL:
    """Per-thread scratch memory of at least nbytes, kept between calls (no allocation per
    token; each thread has its own, so kernels may run concurrently without the GIL)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape[0] < nbytes:
        buf = np.empty(max(nbytes, 1 << 16), dtype=np.uint8)
        _local.buf = buf
    cdef unsigned char[::1] view = buf
    return &view[0]


cdef int check_int_sized(tuple shape, str name) except -1:
    # The C loops index with int: refuse arrays whose dimensions do not fit.
    for extent in shape:
        if extent > _INT_LIMIT:
            raise ValueError(f"{name} is too large for the compiled kernels, shape {shape}")
    return 0


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


cdef check_rows_data(p, str name, bint normalised=True):
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
    raise_rows_status(p, name, status, normalised)


cdef raise_rows_status(p, str name, int status, bint normalised=True):
    """Raise the error of status ``status`` (_rows_status' code) of rows ``p``; 0: none."""
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


cdef check_finite(a, str name):
    flat = a.reshape(-1)
    cdef bint ok
    if a.dtype == np.float32:
        ok = _all_finite[float](flat)
    else:
        ok = _all_finite[double](flat)
    if not ok:
        raise ValueError(NOT_FINITE.format(name=name))
