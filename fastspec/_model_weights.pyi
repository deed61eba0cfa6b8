"""Type stub of :mod:`fastspec._model_weights` (a model's weights in the C layout)."""
import numpy as np
from typing_extensions import disjoint_base

from fastspec.model import Transformer

__all__ = ["ModelWeights", "linear_weights"]

def linear_weights(a: np.ndarray) -> np.ndarray: ...

@disjoint_base
class ModelWeights:
    dtype: np.dtype
    def __init__(self, model: Transformer) -> None: ...
