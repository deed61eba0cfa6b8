"""Type stub of the compiled verification kernels (same signatures as fastspec.kernels._reference)."""
from typing import Optional, Union

import numpy as np
import numpy.typing as npt

_Float = Union[np.float32, np.float64]
_FloatArray = npt.NDArray[_Float]
_IntArray = npt.NDArray[np.integer]

__all__ = ["verify_greedy", "verify_rejection"]

def verify_greedy(draft_tokens: _IntArray, target_logits: _FloatArray) -> tuple[int, int]: ...
def verify_rejection(
    draft_tokens: _IntArray,
    p: _FloatArray,
    q: Optional[_FloatArray],
    uniforms: npt.NDArray[np.float64],
) -> tuple[int, int]: ...
