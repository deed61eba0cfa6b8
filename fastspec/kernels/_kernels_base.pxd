"""Shared helpers of the compiled kernels (see _kernels_base.pyx)."""

cdef bint is_float_c(a, int ndim, dtype=*)
cdef unsigned char *thread_scratch(Py_ssize_t nbytes) except NULL
cdef int check_int_sized(tuple shape, str name) except -1
cdef check_rows_data(p, str name, bint normalised=*)
cdef raise_rows_status(p, str name, int status, bint normalised=*)
cdef check_finite(a, str name)
