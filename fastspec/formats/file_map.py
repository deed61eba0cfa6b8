"""A model file mapped copy-on-write as one uint8 array, whose pages a loader hands back once
it has converted them.

A load that packs or dequantizes a file's quantized blocks into its own arrays reads each
tensor once; the pages it touched would otherwise stay in the process's resident memory until
the map closes, so the load's peak would be the file plus the weights. :meth:`FileMap.release` drops
them (``madvise(MADV_DONTNEED)``, Linux): they stay in the operating system's page cache, and a
later read of the same bytes maps them again, unchanged. Only bytes nothing wrote to may be
released: the writes into a copy-on-write page would be dropped with it.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["FileMap"]


class FileMap:
    """The bytes of the file at ``path``, mapped copy-on-write (nothing is read until touched).

    Attributes
    ----------
    data : ndarray of uint8, shape (file size,)
        The file's bytes; slices of it are views of the map.

    Raises
    ------
    ValueError, OSError
        The file is empty, missing or cannot be mapped.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.data = np.frombuffer(self._map, dtype=np.uint8)
        self._base = self.data.ctypes.data

    def release(self, part: np.ndarray) -> bool:
        """Drop the whole pages of ``part`` (a view of :attr:`data`, nothing written to it)
        from this process's resident memory; return whether any page was dropped (False for
        an array that is not a view of the map, and where the OS has no ``madvise``)."""
        if not hasattr(self._map, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return False
        start = part.ctypes.data - self._base if part.size else -1
        if start < 0 or start + part.nbytes > self.data.size or not part.flags.c_contiguous:
            return False
        page = mmap.PAGESIZE
        first, stop = -(-start // page) * page, (start + part.nbytes) // page * page
        if stop <= first:
            return False
        self._map.madvise(mmap.MADV_DONTNEED, first, stop - first)
        return True
