"""KVCache: one preallocated key/value buffer per model, appended in place, cropped by length."""
from __future__ import annotations

import threading

import numpy as np

from fastspec.kernels.checks import check_index

__all__ = ["KVCache", "cache_dtype"]

_IN_USE = ("KVCache is in use by another thread: a cache serves one call at a time; give each "
           "thread its own cache (and its own model: the fused runner keeps scratch buffers)")


def cache_dtype(dtype, compute_dtype) -> np.dtype:
    """Return ``dtype`` as the dtype of a cache for a model computing in ``compute_dtype``.

    A cache holds the model's own dtype, or float16 for a float32 model: its keys and values
    are rounded to binary16 (nearest, ties to even) as they are written, and attention widens
    them exactly, so a position's logits are the same bits alone or inside a block on each
    path, within float16 rounding of the float32 cache's. A value past 65504 becomes an
    infinity (and the attention rows that see it NaN): a model whose keys or values reach that
    range needs its float32 cache.

    Parameters
    ----------
    dtype : str or numpy.dtype
        The cache dtype asked for.
    compute_dtype : str or numpy.dtype
        The model's ``config.dtype``.

    Returns
    -------
    numpy.dtype

    Raises
    ------
    ValueError
        If ``dtype`` is not one of those.
    """
    want = np.dtype(compute_dtype)
    try:
        got = np.dtype(dtype)
    except TypeError:
        got = None
    allowed = (want,) + ((np.dtype(np.float16),) if want == np.float32 else ())
    if got not in allowed:
        raise ValueError(f"a {want} model's cache dtype must be one of "
                         f"{[str(a) for a in allowed]}, got {dtype!r}")
    return got


class KVCache:
    """Preallocated key/value cache of a stack of attention layers.

    Parameters
    ----------
    n_layers, n_kv_heads, capacity, head_dim : int
        Buffer geometry; ``capacity`` is the maximum number of positions.
    dtype : {"float32", "float64", "float16"}
        float16 serves a float32 model (:func:`cache_dtype`): half the bytes a step reads.

    Attributes
    ----------
    k, v : ndarray of shape (n_layers, n_kv_heads, capacity, head_dim)
        The buffers. Positions ``[0, length)`` are valid. Each layer's slice ``k[l]`` is a
        C-contiguous ``(n_kv_heads, capacity, head_dim)`` block, the layout the attention
        kernel reads.
    length : int
        Number of valid positions. Appending writes at ``length``; :meth:`crop` only moves it.
    """

    __slots__ = ("k", "v", "_length", "_lock_owner", "_guard")

    def __init__(self, n_layers: int, n_kv_heads: int, capacity: int, head_dim: int,
                 dtype: str | np.dtype = "float32") -> None:
        for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                            ("capacity", capacity), ("head_dim", head_dim)):
            check_index(value, name, 1, 2**31 - 1)
        shape = (n_layers, n_kv_heads, capacity, head_dim)
        self.k = np.zeros(shape, dtype=np.dtype(dtype))
        self.v = np.zeros(shape, dtype=np.dtype(dtype))
        self._length = 0
        self._lock_owner = None
        self._guard = threading.Lock()

    @property
    def length(self) -> int:
        """Number of valid (committed) positions."""
        return self._length

    @property
    def capacity(self) -> int:
        """Maximum number of positions the buffers hold."""
        return self.k.shape[2]

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def dtype(self) -> np.dtype:
        return self.k.dtype

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` positions (no copy, no allocation).

        Raises
        ------
        ValueError
            If ``length`` is negative or larger than the current length.
        """
        self._length = check_index(length, "length", 0, self._length)

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions (already written) as valid."""
        n = check_index(n, "n", 0, self.capacity - self._length)
        self._length += n

    def reset(self) -> None:
        """Forget every position (same as ``crop(0)``)."""
        self._length = 0

    def keys(self, layer: int) -> np.ndarray:
        """Return the valid keys of ``layer``, shape (n_kv_heads, length, head_dim) (a view)."""
        return self.k[layer, :, :self._length]

    def values(self, layer: int) -> np.ndarray:
        """Return the valid values of ``layer``, shape (n_kv_heads, length, head_dim) (a view)."""
        return self.v[layer, :, :self._length]

    def acquire(self) -> bool:
        """Take the cache for the calling thread without blocking.

        Returns False when this thread already holds it (nested calls), True when taken here
        (pass the result to :meth:`release`). Raises RuntimeError if another thread holds it:
        concurrent writers would interleave positions silently.
        """
        if self._guard.acquire(False):
            self._lock_owner = threading.get_ident()
            return True
        if self._lock_owner == threading.get_ident():
            return False
        raise RuntimeError(_IN_USE)

    def release(self, claimed: bool) -> None:
        """Give the cache back after :meth:`acquire` (``claimed`` is what it returned)."""
        if claimed:
            self._lock_owner = None
            self._guard.release()

    def claim(self) -> "_Claim":
        """Context manager holding the cache for this thread (RuntimeError if another holds it).

        The model's forward methods and :func:`fastspec.speculative_generate` claim their cache;
        :meth:`crop`, :meth:`advance` and :meth:`reset` do not (they are the owner's moves).
        """
        return _Claim(self)

    @property
    def nbytes(self) -> int:
        """Bytes held by the two buffers."""
        return self.k.nbytes + self.v.nbytes

    def __repr__(self) -> str:
        L, H, C, D = self.k.shape
        return (f"KVCache(n_layers={L}, n_kv_heads={H}, capacity={C}, head_dim={D}, "
                f"dtype={self.k.dtype}, length={self._length})")


class _Claim:
    __slots__ = ("cache", "claimed")

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.claimed = False

    def __enter__(self) -> KVCache:
        self.claimed = self.cache.acquire()
        return self.cache

    def __exit__(self, *exc) -> None:
        self.cache.release(self.claimed)
