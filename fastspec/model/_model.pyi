"""Type stub of the compiled fused forward :mod:`fastspec.model._model`."""
from typing import Iterable

import numpy as np
from typing_extensions import disjoint_base

from fastspec.model import Transformer

__all__ = ["TransformerRunner"]

def linear_weights(a: np.ndarray) -> np.ndarray: ...

@disjoint_base
class TransformerRunner:
    dtype: np.dtype
    @property
    def stale(self) -> bool: ...
    def __init__(self, model: Transformer) -> None: ...
    def forward(self, ids, k_cache: np.ndarray, v_cache: np.ndarray, start: int,
                causal: bool = True, hidden_layers: Iterable[int] = (),
                out: np.ndarray | None = None, logits: bool = True,
                positions: np.ndarray | None = None,
                tree_mask: np.ndarray | None = None,
                logit_rows: int | None = None
                ) -> tuple[np.ndarray | None, dict[int, np.ndarray]]: ...
    def forward_embeddings(self, x: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                           start: int, causal: bool = True, hidden_layers: Iterable[int] = (),
                           out: np.ndarray | None = None,
                           logits: bool = True) -> tuple[np.ndarray | None, dict[int, np.ndarray]]: ...
    def context_kv_taps(self, taps: np.ndarray, fc: np.ndarray, hidden_norm: np.ndarray,
                        k_cache: np.ndarray, v_cache: np.ndarray, start: int) -> None: ...
    def context_kv(self, features: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                   start: int, layer_lo: int, layer_hi: int) -> None: ...
