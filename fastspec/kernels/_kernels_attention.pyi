"""Type stub of the compiled attention kernels (same signatures as fastspec.kernels._reference)."""
from typing import Optional, Union

import numpy as np
import numpy.typing as npt

_Float = Union[np.float32, np.float64]
_FloatArray = npt.NDArray[_Float]
# A KV cache: q's dtype, or float16 with float32 queries.
_CacheArray = npt.NDArray[Union[np.float16, np.float32, np.float64]]
_IntArray = npt.NDArray[np.integer]

__all__ = ["attention", "cache_write", "compact_kv", "tree_attention"]

def attention(
    q: _FloatArray,
    k_cache: _CacheArray,
    v_cache: _CacheArray,
    length: int,
    causal: bool = ...,
    out: Optional[_FloatArray] = ...,
    window: Optional[int] = ...,
) -> _FloatArray: ...
def cache_write(cache: _CacheArray, new: _CacheArray, start: int) -> None: ...
def tree_attention(
    q: _FloatArray,
    k_cache: _CacheArray,
    v_cache: _CacheArray,
    length: int,
    tree_mask: npt.NDArray[np.bool_],
    out: Optional[_FloatArray] = ...,
    window: Optional[int] = ...,
) -> _FloatArray: ...
def compact_kv(
    k: _CacheArray, v: _CacheArray, start: int, rows: npt.NDArray[np.int64]
) -> None: ...
