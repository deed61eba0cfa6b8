"""Quantized matrices in a Transformer: conversion, shapes, and the NumPy path's products.

A model whose ``config.weight_dtype`` is ``"q8_0"``, ``"q4_0"`` or ``"q4_1"`` holds its
embedding, head and layer projections as :class:`fastspec.kernels.quant.QuantMatrix` (GGUF's
blocks of 32 along the input axis, rows = outputs: ``nn.Linear``'s ``(out, in)`` layout, which
is also the file layout). The embedding is a ``(vocab, dim)`` QuantMatrix (``out_features`` =
vocab) whose rows the lookup dequantizes; a tied head is that very object (``x @ embed.T`` is
a product over its rows). Norms, biases and positions stay float32.

:func:`as_quant` converts what a constructor is handed, :func:`quantize_model` builds the
quantized copy of any model (:meth:`fastspec.Transformer.quantize`), and :class:`QLinear` /
:class:`QRows` let the NumPy forward multiply and look up without a special case.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fastspec.kernels.bf16 import RoundingMatrix, from_bits
from fastspec.model.config import QUANT_WEIGHT_DTYPES
from fastspec.model.schema import MATRICES, LayerWeights

from fastspec.kernels.quant import QuantMatrix, linear_q
from fastspec.kernels.quant_blocks import quantize_blocks

__all__ = ["QuantMatrix", "QLinear", "QRows", "is_quant", "as_quant", "quant_blocks",
           "layout_shape", "quantize_model", "float_matrix", "QUANT_WEIGHT_DTYPES"]


def is_quant(a: Any) -> bool:
    """Whether ``a`` is a :class:`QuantMatrix`."""
    return isinstance(a, QuantMatrix)


def layout_shape(a: Any) -> tuple[int, ...]:
    """``a``'s shape in fastspec's ``(in, out)`` layout: ``(in_features, out_features)`` for a
    QuantMatrix, ``a.shape`` otherwise."""
    if is_quant(a):
        return (a.in_features, a.out_features)
    return tuple(a.shape)


def float_matrix(a: Any) -> np.ndarray:
    """Return matrix ``a`` (array of any storage dtype, RoundingMatrix or QuantMatrix) as
    float32 values in its own layout (a QuantMatrix dequantized: ``(out, in)``)."""
    if is_quant(a):
        return a.dequantize()
    if isinstance(a, RoundingMatrix):
        a = a.w
    a = np.asarray(a)
    if a.dtype == np.uint16:  # bf16 bit patterns
        return from_bits(a)
    return np.asarray(a, dtype=np.float32)


def as_quant(a: Any, kind: str, rows_are_outputs: bool = False) -> "QuantMatrix":
    """Return ``a`` as a QuantMatrix.

    Parameters
    ----------
    a : QuantMatrix or array_like
        A QuantMatrix is returned as it is, whatever its kind (a file's blocks stay as they
        are). An array is quantized to ``kind``: a matrix in ``(in, out)`` layout, or, with
        ``rows_are_outputs``, in ``(out, in)`` (the embedding ``(vocab, dim)``).
    kind : {"q8_0", "q4_0", "q4_1"}
    """
    if is_quant(a):
        return a
    if kind not in QUANT_WEIGHT_DTYPES:
        raise ValueError(f"kind must be one of {QUANT_WEIGHT_DTYPES}, got {kind!r}")
    w = float_matrix(a)
    if w.ndim != 2:
        raise ValueError(f"a quantized matrix must be 2-D, got shape {w.shape}")
    w = w if rows_are_outputs else w.T
    if w.shape[1] % 32:
        raise ValueError(f"{kind} quantizes blocks of 32 inputs: a matrix with {w.shape[1]} "
                         "inputs cannot be stored")
    return QuantMatrix.from_blocks(kind, quant_blocks(w, kind), w.shape[1])


def quant_blocks(a: Any, kind: str) -> np.ndarray:
    """Return matrix ``a`` (``(out, in)``, any storage dtype, :func:`float_matrix`) as GGUF
    blocks of ``kind``, uint8 ``(out, in // 32 * block bytes)``
    (:func:`fastspec.kernels.quant_blocks.quantize_blocks`).

    Raises
    ------
    ValueError
        ``a`` holds NaN or infinite values, or values too large for float16 scales.
    """
    w = float_matrix(a)
    if not np.isfinite(w).all():
        raise ValueError("cannot quantize a matrix holding NaN or infinite values")
    return quantize_blocks(kind, np.ascontiguousarray(w, dtype=np.float32))


class QLinear:
    """The NumPy path's view of a QuantMatrix as an ``(in, out)`` matrix: ``x @ m`` is
    :func:`fastspec.kernels.quant.linear_q` (activations quantized per block, the kernels'
    numerics; its NumPy twin on the NumPy backend)."""

    __array_ufunc__ = None  # ndarray @ QLinear defers to __rmatmul__

    def __init__(self, w: "QuantMatrix") -> None:
        self.w = w
        self.shape = layout_shape(w)

    def __rmatmul__(self, x):
        x = np.asarray(x, dtype=np.float32)
        lead = x.shape[:-1]
        y = linear_q(np.ascontiguousarray(x.reshape(-1, x.shape[-1])), self.w)
        return y.reshape(*lead, self.shape[1])

    def __repr__(self) -> str:
        return f"QLinear({self.w.kind}, shape={self.shape})"


class QRows:
    """The NumPy path's view of a quantized embedding: ``e[ids]`` dequantizes those rows."""

    def __init__(self, w: "QuantMatrix") -> None:
        self.w = w
        self.shape = (w.out_features, w.in_features)

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        return np.asarray(self.w.rows(ids.reshape(-1)), dtype=np.float32).reshape(
            *ids.shape, self.shape[1])


def quantize_model(model: Any, kind: str, *, keep_native: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> Any:
    """Return a copy of ``model`` (a :class:`~fastspec.Transformer`) whose matrices are
    quantized to ``kind``.

    Float matrices (float32/float64, float16, bfloat16) are quantized from their float32
    values; matrices of a quantized model are dequantized first unless already of ``kind``
    (then kept, blocks shared), or of any quantized kind with ``keep_native``. Norms,
    biases and positions are shared, as float32. ``progress(done, total)`` is called after
    the embedding, each layer and the head.
    """
    if kind not in QUANT_WEIGHT_DTYPES:
        raise ValueError(f"kind must be one of {QUANT_WEIGHT_DTYPES}, got {kind!r}")
    c = model.config
    if c.dtype != "float32":
        c = c.replace(dtype="float32", weight_dtype=None)
    config = c.replace(weight_dtype=kind)

    def conv(a, rows_are_outputs=False):
        if is_quant(a):
            if a.kind == kind or keep_native:
                return a
            w = a.dequantize()
            return as_quant(w, kind, rows_are_outputs=True)
        return as_quant(a, kind, rows_are_outputs)

    total = len(model.layers) + 2
    tick = progress or (lambda done, total: None)
    embed = conv(model.embed, rows_are_outputs=True)
    tick(1, total)
    layers = []
    for lw in model.layers:
        layers.append(LayerWeights(**{k: conv(v) if k in MATRICES else np.asarray(v, np.float32)
                                      for k, v in lw.arrays().items()}))
        tick(len(layers) + 1, total)
    tied = model.head is model.embed or _is_view_t(model.head, model.embed)
    head = embed if tied else conv(model.head)
    tick(total, total)
    f32 = lambda a: None if a is None else np.asarray(a, np.float32)  # noqa: E731
    return type(model)(config, embed, layers, head, f32(model.final_norm), f32(model.pos_embed))


def _is_view_t(a, b) -> bool:
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == b.ndim == 2
            and a.shape == b.shape[::-1] and np.shares_memory(a, b))
