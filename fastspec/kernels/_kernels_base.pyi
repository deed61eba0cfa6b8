"""Type stub of fastspec.kernels._kernels_base: cdef helpers only (cimported through its .pxd)."""
__all__: list[str]
