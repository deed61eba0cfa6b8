"""Type stub of :mod:`fastspec.kernels._linear` (packed float products, the core's clock)."""
import numpy as np
import numpy.typing as npt

__all__ = ["KINDS", "clock_hz", "pack", "packed_len", "product"]

KINDS: tuple[str, ...]

def packed_len(n_in: int, n_out: int) -> int: ...
def pack(w: np.ndarray) -> np.ndarray: ...
def product(x: npt.NDArray[np.float32], p: np.ndarray, kind: str, n_out: int,
            y: npt.NDArray[np.float32], accumulate: bool = False,
            bias: npt.NDArray[np.float32] | None = None) -> None: ...
def clock_hz(bursts: int = 8) -> float: ...
