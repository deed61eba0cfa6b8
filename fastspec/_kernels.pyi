"""Type stub of the compiled kernels (same signatures as fastspec._reference)."""
from typing import Optional, Union

import numpy as np
import numpy.typing as npt

_Float = Union[np.float32, np.float64]
_FloatArray = npt.NDArray[_Float]
_IntArray = npt.NDArray[np.integer]

__all__ = ["attention", "cache_write", "compact_kv", "probs", "sample", "tree_attention",
           "verify_greedy", "verify_rejection"]

def attention(
    q: _FloatArray,
    k_cache: _FloatArray,
    v_cache: _FloatArray,
    length: int,
    causal: bool = ...,
    out: Optional[_FloatArray] = ...,
) -> _FloatArray: ...
def cache_write(cache: _FloatArray, new: _FloatArray, start: int) -> None: ...
def probs(
    logits: _FloatArray, temperature: float = ..., top_k: int = ..., top_p: float = ...
) -> _FloatArray: ...
def sample(p: _FloatArray, u: float) -> int: ...
def verify_greedy(draft_tokens: _IntArray, target_logits: _FloatArray) -> tuple[int, int]: ...
def verify_rejection(
    draft_tokens: _IntArray,
    p: _FloatArray,
    q: Optional[_FloatArray],
    uniforms: npt.NDArray[np.float64],
) -> tuple[int, int]: ...
def tree_attention(
    q: _FloatArray,
    k_cache: _FloatArray,
    v_cache: _FloatArray,
    length: int,
    tree_mask: npt.NDArray[np.bool_],
    out: Optional[_FloatArray] = ...,
) -> _FloatArray: ...
def compact_kv(k: _FloatArray, v: _FloatArray, start: int, rows: npt.NDArray[np.int64]) -> None: ...
