"""bfloat16 storage without a bfloat16 dtype: raw bit patterns in uint16 arrays.

NumPy has no bf16, so a bf16 matrix is a ``uint16`` array of bit patterns (the upper half of
the float32 bits), and everywhere in fastspec a ``uint16`` weight array means exactly that.
float32 -> bf16 rounds to nearest, ties to even (NaN stays NaN, quieted; values past the
largest bf16 become infinite), with the same integer arithmetic as ``fs_f2bf_bits`` in
``csrc/fs_common.h``; bf16 -> float32 is exact.

The compute rule of bf16 weights (docs/FORMATS.md): every matrix product rounds its input rows
to bf16 and accumulates in float32. :class:`RoundingMatrix` is the NumPy twin of that rule.
"""
from __future__ import annotations

import numpy as np

__all__ = ["BF16", "to_bits", "from_bits", "round_values", "storage_dtype", "as_storage",
           "RoundingMatrix"]

#: The ``weight_dtype`` name.
BF16 = "bfloat16"


def _rounded_u32(x) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    with np.errstate(over="ignore"):  # uint32 wrap-around of negative NaNs: masked by nan
        up = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return np.where(nan, u | np.uint32(0x00400000), up) & np.uint32(0xFFFF0000)


def to_bits(x) -> np.ndarray:
    """Return ``x`` (any real array, taken as float32) rounded to bf16, as uint16 bit patterns."""
    return (_rounded_u32(x) >> np.uint32(16)).astype(np.uint16)


def from_bits(bits: np.ndarray) -> np.ndarray:
    """Return bf16 bit patterns (uint16) as float32 values (exact)."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bf16 bit patterns must be uint16, got dtype {bits.dtype}")
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_values(x) -> np.ndarray:
    """Return float32 ``x`` rounded to the nearest bf16 values, still float32 (same shape)."""
    return _rounded_u32(x).view(np.float32)


def storage_dtype(name: str) -> np.dtype:
    """Return the NumPy dtype that stores matrices of ``weight_dtype`` name (bf16: uint16)."""
    return np.dtype(np.uint16) if name == BF16 else np.dtype(name)


def as_storage(a, name: str) -> np.ndarray:
    """Return ``a`` as a C-contiguous array of storage dtype ``name``.

    A uint16 ``a`` is read as bf16 bit patterns: kept as they are for ``"bfloat16"``, widened
    (exactly) before any other conversion. Other arrays convert to bf16 through float32.
    """
    a = np.asarray(a)
    if a.dtype == np.uint16:
        if name == BF16:
            return np.ascontiguousarray(a)
        a = from_bits(a)
    elif name == BF16:
        return np.ascontiguousarray(to_bits(a))
    elif a.dtype.kind not in "fiub":
        raise TypeError(f"weights must be real numbers, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=name)


class RoundingMatrix:
    """A float32 matrix ``w`` whose products ``x @ w`` round ``x`` to bf16 first.

    The NumPy twin of the bf16 compute rule, handed out by
    :meth:`fastspec.Transformer._numpy_weights` for bf16 models so that the NumPy forward
    (and every other reference that multiplies by those weights) applies it without a
    special case: ``x @ m`` is ``round_values(x) @ m.w`` in float32. Only ``x @ m`` is
    defined; ``m.w`` is the plain widened matrix.
    """

    __array_ufunc__ = None  # ndarray @ RoundingMatrix defers to __rmatmul__

    def __init__(self, w: np.ndarray) -> None:
        self.w = w
        self.shape = w.shape
        self.dtype = w.dtype

    def __rmatmul__(self, x):
        return round_values(x) @ self.w

    def __repr__(self) -> str:
        return f"RoundingMatrix(shape={self.shape})"
