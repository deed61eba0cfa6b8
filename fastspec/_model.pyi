"""Type stub of the compiled fused forward :mod:`fastspec._model`."""
from typing import Iterable

import numpy as np

from fastspec.model import Transformer

def set_threads(n: int) -> None: ...
def get_threads() -> int: ...

class TransformerRunner:
    dtype: np.dtype
    def __init__(self, model: Transformer) -> None: ...
    def forward(self, ids, k_cache: np.ndarray, v_cache: np.ndarray, start: int,
                causal: bool = True, hidden_layers: Iterable[int] = (),
                out: np.ndarray | None = None,
                logits: bool = True) -> tuple[np.ndarray | None, dict[int, np.ndarray]]: ...
    def forward_embeddings(self, x: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                           start: int, causal: bool = True, hidden_layers: Iterable[int] = (),
                           out: np.ndarray | None = None,
                           logits: bool = True) -> tuple[np.ndarray | None, dict[int, np.ndarray]]: ...
    def context_kv(self, features: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                   start: int, layer_lo: int, layer_hi: int) -> None: ...
