"""One buffer for a model's weight matrices, advised onto transparent huge pages.

A decode step streams every weight matrix once. Matrices smaller than a huge page (2 MiB),
each in its own allocation, sit on 4 KiB pages, and the TLB misses of that stream cost a
measurable share of the step (SmolLM2-135M q8_0 on an Intel Xeon: 10.9 -> 9.7 ms a step, see
docs/PERFORMANCE.md). One anonymous mapping of them all, in the order the forward reads them,
is one long stream on huge pages, where the kernel grants them: ``madvise`` is advice, and a
system with transparent huge pages off gets ordinary pages and the same results.

:class:`WeightArena` hands out aligned arrays from such a mapping; :func:`in_arena` says whether
an array lies in one. The compiled runner's packed float matrices and a quantized model's
:class:`fastspec.kernels.quant.QuantMatrix` bytes (:func:`fastspec.kernels.quant.gather`) use
it.
"""
from __future__ import annotations

import mmap
import weakref

import numpy as np

__all__ = ["HUGE_PAGE", "ALIGN", "WeightArena", "in_arena"]

#: Bytes of a transparent huge page on x86-64 Linux; the arena starts on such a boundary.
HUGE_PAGE = 2 << 20
#: Alignment of every array taken from an arena (a cache line; the kernels' loads want 64).
ALIGN = 64

# every live arena's byte array, by id (ndarrays are not hashable: no WeakSet)
_ARENAS: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


class WeightArena:
    """An anonymous private mapping of ``nbytes`` (plus a huge page of slack), advised with
    ``MADV_HUGEPAGE``, from which :meth:`take` hands out arrays in order.

    Parameters
    ----------
    nbytes : int
        The sum of :meth:`padded` of every array that will be taken.

    The mapping lives as long as any array taken from it (each is a view of it).
    """

    def __init__(self, nbytes: int) -> None:
        nbytes = max(int(nbytes), 1)
        # private: a shared anonymous map is shmem, which THP leaves alone by default
        self._map = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # not Linux, or THP disabled: ordinary pages
            pass
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._next = (-self._bytes.ctypes.data) % HUGE_PAGE  # start on a huge-page boundary
        self._end = self._next + nbytes
        _ARENAS[id(self._bytes)] = self._bytes

    @staticmethod
    def padded(nbytes: int) -> int:
        """``nbytes`` rounded up to :data:`ALIGN`, the room one array takes in an arena."""
        return (int(nbytes) + ALIGN - 1) // ALIGN * ALIGN

    def take(self, n: int, dtype) -> np.ndarray:
        """Return a fresh (uninitialised) 1-D array of ``n`` elements of ``dtype``.

        Raises
        ------
        MemoryError
            The arena was sized too small for what is taken from it.
        """
        nbytes = int(n) * np.dtype(dtype).itemsize
        start, self._next = self._next, self._next + self.padded(nbytes)
        if self._next > self._end:
            raise MemoryError("weight arena overrun")  # sizes are computed before packing
        return self._bytes[start:start + nbytes].view(dtype)

    def copy(self, a: np.ndarray) -> np.ndarray:
        """Return a read-only 1-D copy of the C-contiguous array ``a`` taken from the arena."""
        out = self.take(a.size, a.dtype)
        out[:] = a.reshape(-1)
        out.flags.writeable = False
        return out


def in_arena(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a :class:`WeightArena`'s mapping."""
    base = a
    while isinstance(base, np.ndarray):
        if _ARENAS.get(id(base)) is base:
            return True
        base = base.base
    return False
