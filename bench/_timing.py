"""Timing helper shared by the benchmark modules (interleaved medians within one run)."""
import time

import numpy as np


def median_time(fn, number: int = 1, repeat: int = 7) -> float:
    """Median over ``repeat`` samples of the mean time of ``number`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return float(np.median(times))
