"""A file tensor read with a constant folded into it: ``(x + shift) / divisor``.

Loaders fold a model's constants into its weights as they are read: a Granite's final norm
weight divided by its ``logits_scaling`` (:mod:`~fastspec.formats.granite`), a Gemma folder's
norm weights plus one (:mod:`~fastspec.formats.gemma3`: Gemma's RMSNorm multiplies by
``1 + w``). The sum and quotient are taken in float64 and rounded once to the model's dtype.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastspec.formats.safetensors_io import to_float

__all__ = ["FoldedTensor"]


class FoldedTensor:
    """A tensor in its file read as ``(x + shift) / divisor``:
    :class:`~fastspec.model.state.TensorFile`, float64.

    Parameters
    ----------
    tensor : TensorFile
        A float tensor (bf16 as uint16 bit patterns).
    shift, divisor : float
    what : str
        What the fold is, for the error message (``"the final norm weight divided by
        logits_scaling 8.0"``).
    """

    def __init__(self, tensor: Any, *, shift: float = 0.0, divisor: float = 1.0,
                 what: str = "") -> None:
        self.tensor, self.shift, self.divisor, self.what = tensor, shift, divisor, what
        self.shape: tuple[int, ...] = tuple(tensor.shape)
        self.ndim = len(self.shape)
        self.dtype = np.dtype(np.float64)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Return rows ``start:stop`` folded (float64, one rounding to the model's dtype).

        Raises
        ------
        ValueError
            A result beyond float32's range (a tiny divisor), named by ``what``.
        """
        raw = np.asarray(self.tensor.read(start, stop))
        out = (to_float(raw, "BF16" if raw.dtype == np.uint16 else "", self.dtype)
               + self.shift) / self.divisor
        if not (np.abs(out) <= np.finfo(np.float32).max).all():
            raise ValueError(f"{self.what or 'a folded tensor'} is not a finite float32")
        return out

    def mapped(self) -> np.ndarray:
        """Return :meth:`read` (a folded tensor is never a view of its file)."""
        return self.read()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)
