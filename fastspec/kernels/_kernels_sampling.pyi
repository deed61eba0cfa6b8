"""Type stub of the compiled sampling kernels (same signatures as fastspec.kernels._reference)."""
from typing import Union

import numpy as np
import numpy.typing as npt

_Float = Union[np.float32, np.float64]
_FloatArray = npt.NDArray[_Float]

__all__ = ["probs", "sample"]

def probs(
    logits: _FloatArray,
    temperature: float = ...,
    top_k: int = ...,
    top_p: float = ...,
    out: _FloatArray | None = ...,
) -> _FloatArray: ...
def sample(p: _FloatArray, u: float) -> int: ...
