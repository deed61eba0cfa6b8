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
           "own_weight_dtype", "q4_k_as_q4_1", "quant_matrix"]

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
    kept, :func:`q4_k_as_q4_1`; the file's Q6_K matrices become q8_0); any other quantized
    type gives ``"q8_0"``, the conversion that adds at most ~0.6% relative RMS (the other 4-bit
    ones add up to 7%, docs/FORMATS.md); F16 gives ``"float16"``, BF16 ``"bfloat16"`` and F32
    None (float32). With ``dtype="float64"``: None (16-bit and quantized storage compute in
    float32).

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


def q4_k_as_q4_1(raw: np.ndarray) -> np.ndarray:
    """Return Q4_K super-blocks as Q4_1 blocks holding the same 4-bit values.

    A Q4_K super-block of 256 weights has eight sub-blocks of 32, each ``w = d * sc * q -
    dmin * m`` (``d``, ``dmin`` float16, ``sc``, ``m`` 6-bit, ``q`` 4-bit): a Q4_1 block
    ``w = d' * q + m'`` with ``d' = d * sc`` and ``m' = -dmin * m``, both exact in float32
    and rounded to float16 (nearest even) here: the only error of the conversion (about
    ``2**-11`` of each scale and min; 0.022% relative RMS on the synthetic blocks of
    docs/FORMATS.md, against 1.6% for dequantizing and quantizing again). Where both products
    are float16 values the result dequantizes to the same float32 values, bit for bit.

    Parameters
    ----------
    raw : ndarray of uint8, shape (rows, in / 256 * 144)
        Q4_K blocks, a row of the matrix a row (``GGUFTensor.blocks``).

    Returns
    -------
    ndarray of uint8, shape (rows, in / 32 * 20)
        Q4_1 blocks (``d'``, ``m'``, 16 bytes of values: element ``k`` of a block in the low
        nibble of byte ``k``, element ``k + 16`` in its high nibble).
    """
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    out = np.empty((rows, raw.shape[1] // 144 * 8 * 20), dtype=np.uint8)
    step = max(1, _CHUNK // max(1, raw.shape[1]))  # bounded temporaries
    for r in range(0, rows, step):
        b = np.ascontiguousarray(raw[r:r + step]).reshape(-1, 144)
        n = b.shape[0]
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, m = Q4_K.get_scale_min(b[:, 4:16])  # (n, 8) each
        o = out[r:r + step].reshape(n, 8, 20)
        with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN: refused by the q4_1 checks
            o[:, :, 0:2] = (d * sc).astype(np.float16).view(np.uint8).reshape(n, 8, 2)
            o[:, :, 2:4] = (-(dmin * m)).astype(np.float16).view(np.uint8).reshape(n, 8, 2)
        qs = b[:, 16:].reshape(n, 4, 32)  # bytes 32i..: sub-block 2i low, 2i + 1 high nibbles
        q = np.stack((qs & 0x0F, qs >> 4), axis=2).reshape(n, 8, 32)
        o[:, :, 4:] = q[:, :, :16] | (q[:, :, 16:] << 4)
    return out


#: GGUF types whose blocks of 32 are one f16 scale ``d`` (the block's first two bytes) times
#: integers of int8 range: Q4_0 ``q - 8``, Q5_0 ``q - 16``, IQ4_NL a table of int8 values.
#: Stored as q8_0 they keep ``d`` and those integers: the same weight values.
SCALED_INT8 = ("Q4_0", "Q5_0", "IQ4_NL")


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


def quant_matrix(tensor: Any, requested: str):
    """Return GGUF matrix ``tensor`` (a :class:`~fastspec.formats.gguf.GGUFTensor`) as a
    :class:`~fastspec.kernels.quant.QuantMatrix` of :func:`native_kind`.

    A tensor whose type is that kind keeps its blocks (``tensor.blocks()``), byte for byte:
    nothing is dequantized. A Q4_K tensor stored as q4_1 keeps its 4-bit values
    (:func:`q4_k_as_q4_1`), a :data:`SCALED_INT8` one stored as q8_0 its scales and integers
    (exactly the same weights). Any other is read (dequantized) :data:`_CHUNK` elements at a time,
    whole heads for a permuted llama ``attn_q``/``attn_k``, and each block of rows quantized
    into the result.

    Raises
    ------
    ValueError
        Blocks of a NaN or infinite scale, wrong block counts, or values that dequantize to
        NaN or infinity (named with the file and the tensor).
    """
    from fastspec.model.quantized import QuantMatrix, as_quant

    kind = native_kind(tensor.type_name, requested, getattr(tensor, "float_kind", None))
    rows, cols = tensor.shape
    try:
        if tensor.type_name.lower() == kind:
            return QuantMatrix.from_blocks(kind, tensor.blocks(), cols)
        if tensor.type_name == "Q4_K" and kind == "q4_1":
            return QuantMatrix.from_blocks(kind, q4_k_as_q4_1(tensor.blocks()), cols)
        h = tensor.head_rows or 1
        step = max(h, _CHUNK // max(1, cols) // h * h)
        if tensor.type_name in SCALED_INT8 and kind == "q8_0":
            blocks = _scaled_int8_as_q8_0(tensor, step)
            if blocks is not None:
                return QuantMatrix.from_blocks(kind, blocks, cols)
        parts = [as_quant(tensor.read(r, min(r + step, rows)), kind, rows_are_outputs=True)
                 .to_blocks() for r in range(0, rows, step)]
        return QuantMatrix.from_blocks(kind, np.concatenate(parts), cols)
    except ValueError as exc:
        where = f"{tensor.file.path}: tensor {tensor.name!r} ({tensor.type_name})"
        if str(exc).startswith(str(tensor.file.path)):
            raise
        raise ValueError(f"{where}: {exc}") from None
