"""GGUF matrices as quantized weights: which native kind each GGUF type is stored in, and the
conversion of the others (docs/FORMATS.md, "Quantized storage").

A model loaded with ``weight_dtype="q8_0" | "q4_0" | "q4_1"`` keeps a file's Q8_0, Q4_0 and
Q4_1 blocks byte for byte when the tensor's kind (:func:`native_kind`) is its own type, and
converts every other tensor: dequantized by ``gguf.quants.dequantize`` (through
:meth:`GGUFTensor.read <fastspec.formats.gguf.GGUFTensor.read>`) and quantized again, a block
of rows at a time (:func:`quant_matrix`).
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

__all__ = ["AUTO_FLOAT_KIND", "NEAREST_NATIVE", "SCALED_INT8", "native_kind",
           "own_weight_dtype", "quant_matrix"]

#: Precision order of the native kinds (the two 4-bit grids are not nested: one is never
#: converted into the other, which costs ~6% relative RMS).
_PRECISION = {"q4_0": 0, "q4_1": 0, "q8_0": 1}
#: The nearest native kind of each quantized GGUF type: itself for Q8_0/Q4_0/Q4_1; otherwise
#: the native kind with at least its precision (4-bit-or-less types -> q4_1; 5- to 8-bit
#: types, the non-uniform 4-bit types and the ternary ones -> q8_0). Float types (absent
#: here) take the requested kind.
NEAREST_NATIVE = {
    "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1",
    "Q5_0": "q8_0", "Q5_1": "q8_0", "Q5_K": "q8_0", "Q6_K": "q8_0", "Q8_1": "q8_0",
    "Q8_K": "q8_0", "MXFP4": "q8_0", "NVFP4": "q8_0", "IQ4_NL": "q8_0", "IQ4_XS": "q8_0",
    "TQ1_0": "q8_0", "TQ2_0": "q8_0",  # ternary: no 4-bit grid of 32 holds -d, 0, d exactly
    "Q2_K": "q4_1", "Q3_K": "q4_1", "Q4_K": "q4_1", "IQ1_S": "q4_1", "IQ1_M": "q4_1",
    "IQ2_XXS": "q4_1", "IQ2_XS": "q4_1", "IQ2_S": "q4_1", "IQ3_XXS": "q4_1", "IQ3_S": "q4_1",
}
#: Elements converted at a time by :func:`quant_matrix` (1 MB of float32).
_CHUNK = 1 << 18


def native_kind(type_name: str, requested: str, float_kind: str | None = None) -> str:
    """The quantized kind a tensor of GGUF type ``type_name`` is stored in, in a model of
    ``requested`` kind: its :data:`NEAREST_NATIVE` kind unless ``requested`` is more precise
    (q8_0 over the 4-bit kinds, which rank equal); a float type: ``float_kind`` when given
    (``weight_dtype="auto"``: :data:`AUTO_FLOAT_KIND`), else ``requested``.

    So a Q4_1 file loaded as q4_1 (or q4_0) keeps its blocks and its Q8_0 embedding, and
    loaded as q8_0 has every matrix in q8_0.
    """
    own = NEAREST_NATIVE.get(type_name)
    if own is None:
        return float_kind or requested
    return requested if _PRECISION[own] < _PRECISION[requested] else own


#: The kind ``weight_dtype="auto"`` stores a file's F32/F16/BF16 matrices in, by the kind it
#: chose (an output or embedding kept in float in a 4-bit file: q8_0, 0.54% relative RMS,
#: rather than the 4-bit kind's 7.8%).
AUTO_FLOAT_KIND = {"q4_0": "q8_0", "q4_1": "q8_0"}


def own_weight_dtype(tensors: Iterable[Any], dtype: str | None = None) -> str | None:
    """Return the ``weight_dtype`` that keeps a GGUF file's own storage (``"auto"``).

    The type holding most of the elements of the file's matrices decides: Q8_0, Q4_0 and Q4_1
    give their own kind (the blocks are kept, and the other matrices take their
    :func:`native_kind`: a Q4_1 file's Q8_0 embedding stays q8_0, a float one becomes q8_0,
    :data:`AUTO_FLOAT_KIND`), Q4_K (most of a Q4_K_M file) gives ``"q4_1"`` (its 4-bit values
    kept, :func:`fastspec.kernels.quant.transcode`; the file's Q6_K matrices become q8_0);
    any other quantized type gives ``"q8_0"``, the conversion that adds at most ~0.6%
    relative RMS (the other 4-bit ones add up to 7%, docs/FORMATS.md); F16 gives
    ``"float16"``, BF16 ``"bfloat16"`` and F32 None (float32). With ``dtype="float64"``: None
    (16-bit and quantized storage compute in float32).

    Parameters
    ----------
    tensors : iterable of gguf ReaderTensor
        The file's tensors (``shape``, ``tensor_type``, ``n_elements``); those of two or more
        axes are its matrices. A tie goes to the type met first.
    dtype : {"float32", "float64"}, optional
        The compute dtype the model will have (default float32).

    Returns
    -------
    str or None
        A ``weight_dtype`` (None: the compute dtype).
    """
    elements: dict[str, int] = {}
    for t in tensors:
        if len(t.shape) >= 2:
            name = t.tensor_type.name
            elements[name] = elements.get(name, 0) + int(t.n_elements)
    if dtype not in (None, "float32") or not elements:
        return None
    top = max(elements, key=lambda name: elements[name])
    if top in NEAREST_NATIVE:  # its own native kind, Q4_K's transcoded q4_1, else q8_0
        own = NEAREST_NATIVE[top]
        return own if own == top.lower() or top == "Q4_K" else "q8_0"
    return {"F16": "float16", "BF16": "bfloat16"}.get(top)  # F32 (others fail the checks)


#: GGUF types whose blocks of 32 are one f16 scale ``d`` (the block's first two bytes) times
#: integers of int8 range: Q4_0 ``q - 8``, IQ4_NL a table of int8 values. Stored as q8_0
#: they keep ``d`` and those integers: the same weight values. (Q5_0, ``q - 16``, is one too;
#: its blocks are converted by the compiled :func:`fastspec.kernels.quant.transcode`.)
SCALED_INT8 = ("Q4_0", "IQ4_NL")


def _scaled_int8_as_q8_0(tensor: Any, step: int) -> np.ndarray | None:
    """The q8_0 blocks of a :data:`SCALED_INT8` tensor: each block's ``d`` and its values
    divided by ``d`` (``gguf``'s dequantized float32 values, exact products of ``d`` and the
    integers, so the division is exact); None if a block does not hold that form."""
    raw = tensor.blocks()
    rows, cols = tensor.shape
    nb = cols // 32
    raw = raw.reshape(rows, nb, -1)
    out = np.empty((rows, nb, 34), dtype=np.uint8)
    out[:, :, :2] = raw[:, :, :2]
    d = raw[:, :, :2].copy().view(np.float16).astype(np.float32)  # (rows, nb, 1)
    for r in range(0, rows, step):
        w = tensor.read(r, min(r + step, rows)).reshape(-1, nb, 32)
        dr = d[r:r + step]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(dr != 0, np.rint(w / dr), 0).astype(np.float32)
        if np.abs(q).max(initial=0) > 127 or not np.array_equal(q * dr, w):
            return None
        out[r:r + step, :, 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(rows, nb * 34)


def quant_matrix(tensor: Any, requested: str, out: np.ndarray | None = None):
    """Return GGUF matrix ``tensor`` (a :class:`~fastspec.formats.gguf.GGUFTensor`) as a
    :class:`~fastspec.kernels.quant.QuantMatrix` of :func:`native_kind`.

    A tensor whose type is that kind keeps its blocks (``tensor.blocks``), byte for byte:
    nothing is dequantized. A Q4_K tensor stored as q4_1 (its 4-bit values kept, not
    requantized), a Q6_K or Q4_K one stored as q8_0 (the bytes of the dequantize-and-quantize
    below) and a Q5_0 one stored as q8_0 (its scales and integers kept) are converted by
    :func:`fastspec.kernels.quant.transcode`'s rules as they are packed
    (:meth:`~fastspec.kernels.quant.QuantMatrix.from_gguf`, one compiled pass); a
    :data:`SCALED_INT8` one stored as q8_0 keeps its scales and integers (exactly the same
    weights). Any other is read (dequantized) :data:`_CHUNK` elements at a time, whole heads
    for a permuted llama ``attn_q``/``attn_k``, and each block of rows quantized into the
    result.

    Parameters
    ----------
    tensor : GGUFTensor
        A matrix of the file.
    requested : {"q8_0", "q4_0", "q4_1"}
        The model's kind.
    out : ndarray of uint8, optional
        The byte slot to pack into (:meth:`~fastspec.kernels.quant.QuantMatrix.from_blocks`).

    Raises
    ------
    ValueError
        Blocks of a NaN or infinite scale, wrong block counts, or values that dequantize to
        NaN or infinity (named with the file and the tensor).
    """
    from fastspec.kernels.quant import TRANSCODED, QuantMatrix
    from fastspec.model.quantized import quant_blocks

    kind = native_kind(tensor.type_name, requested, getattr(tensor, "float_kind", None))
    rows, cols = tensor.shape
    try:
        if tensor.type_name.lower() == kind or kind in TRANSCODED.get(tensor.type_name, ()):
            # packed (converted on the way) from the file's map: no copy of its bytes
            return QuantMatrix.from_gguf(tensor.type_name, tensor.blocks(copy=False), cols,
                                         kind, out)
        h = tensor.head_rows or 1
        step = max(h, _CHUNK // max(1, cols) // h * h)
        blocks = (_scaled_int8_as_q8_0(tensor, step)
                  if tensor.type_name in SCALED_INT8 and kind == "q8_0" else None)
        if blocks is None:
            blocks = np.concatenate([quant_blocks(tensor.read(r, min(r + step, rows)), kind)
                                     for r in range(0, rows, step)])
        return QuantMatrix.from_blocks(kind, blocks, cols, out)
    except ValueError as exc:
        where = f"{tensor.file.path}: tensor {tensor.name!r} ({tensor.type_name})"
        if str(exc).startswith(str(tensor.file.path)):
            raise
        raise ValueError(f"{where}: {exc}") from None
