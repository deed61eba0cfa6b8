"""timeit: the one timer of the benchmarks (best of repeats of calls long enough to measure)."""
from __future__ import annotations

import time
from typing import Callable

__all__ = ["timeit"]


def timeit(fn: Callable[[], object], min_time: float = 0.05, repeats: int = 5) -> float:
    """Return the best, over ``repeats``, of the mean seconds per call of ``fn``.

    Each repeat calls ``fn`` as many times as fit in ``min_time`` (at least once) after one
    warm-up call. The minimum is the figure least disturbed by other processes.
    """
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    loops = max(1, int(min_time / once))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best
