"""The one dispatch table of the C core (fs_isa.h), owned by :mod:`fastspec.kernels._isa`."""
from fastspec.kernels._csrc cimport fs_dispatch, fs_isa_share


cdef fs_dispatch *table() noexcept nogil


cdef inline void share_table() noexcept nogil:
    """Point this extension's copy of the core at the owner's table (call at import of every
    extension that links the core: each links its own copy, and the path, the threads and the
    variants must be one process-wide state)."""
    fs_isa_share(table())
