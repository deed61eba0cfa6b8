"""Type stub of :mod:`fastspec.model._model_weights` (a model's weights in the C layout)."""
from collections.abc import Iterable

import numpy as np
from typing_extensions import disjoint_base

from fastspec.model import Transformer

__all__ = ["ModelWeights", "linear_weights", "packed_of", "forget_packed", "bf16_tiles"]

def linear_weights(a: np.ndarray) -> np.ndarray: ...
def packed_of(a: np.ndarray, tiles: bool | None = None) -> np.ndarray | None: ...
def bf16_tiles() -> bool: ...
def forget_packed(arrays: Iterable[np.ndarray]) -> None: ...

@disjoint_base
class ModelWeights:
    dtype: np.dtype
    @property
    def tiles(self) -> bool: ...
    def __init__(self, model: Transformer) -> None: ...
