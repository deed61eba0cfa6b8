"""One tensor of a GGUF file: its header entry over the file's bytes, read as NumPy rows.

:class:`GGUFTensor` is what :class:`~fastspec.formats.gguf.GGUFFile` hands
:meth:`fastspec.Transformer.from_tensors`: a tensor under its Hugging Face layout, read (and
dequantized by the ``gguf`` package) block of rows by block of rows, or lent as a view of the
file's map, or as its quantized blocks; :func:`gguf_package` imports the ``gguf`` package.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastspec.formats.gguf_header import TensorInfo
from fastspec.formats.gguf_names import unpermute
from fastspec.formats.gguf_quant import NEAREST_NATIVE, native_kind, quant_matrix

__all__ = ["GGUFTensor", "gguf_package", "file_tensor"]

#: Elements :meth:`GGUFTensor.read` converts at a time (1 MB of float32).
_CHUNK = 1 << 18
#: Tensor types read as views of the map, never released (:meth:`GGUFTensor.mapped` lends them).
_MAPPABLE = ("F32", "F16", "BF16")


def _gguf():
    """Return the ``gguf`` package, or raise an ImportError that says how to install it."""
    try:
        import gguf
    except ImportError as exc:
        raise ImportError('reading GGUF files needs the gguf package: pip install '
                          '"fastspec[gguf]"') from exc
    return gguf


def gguf_package():
    """Return the ``gguf`` package, or raise an ImportError that says how to install it."""
    return _gguf()


class _FileTensor(NamedTuple):
    """A tensor's header entry and its bytes: what :class:`GGUFTensor` reads (the fields of
    ``gguf.ReaderTensor`` it uses, with the same ``data`` shapes and dtypes)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray  # ggml order
    n_elements: int
    data: np.ndarray


#: ggml types read as NumPy values; every other type is bytes of blocks, (..., row bytes).
_VALUE_TYPES = {"F16": "f2", "F32": "f4", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4",
                "I64": "i8"}


def file_tensor(path: Path, info: TensorInfo, ttype: Any, data: np.ndarray, start: int,
                order: str) -> _FileTensor:
    """Return the file tensor of a header entry over the file's bytes.

    Parameters
    ----------
    path : Path
        The file (for the messages).
    info : TensorInfo
        The tensor's header entry.
    ttype : gguf.GGMLQuantizationType
        Its type.
    data : ndarray of uint8
        The file's bytes (whose extent :func:`~fastspec.formats.gguf_header.read_header`
        checked).
    start : int
        Offset of the tensor data.
    order : {"<", ">"}
        The file's byte order.

    Returns
    -------
    _FileTensor
        Values of a NumPy type as such, other types as bytes of blocks, ``(..., row bytes)``.
    """
    n = math.prod(info.dims)
    block, block_bytes = _gguf().GGML_QUANT_SIZES[ttype]
    shape = tuple(reversed(info.dims))
    at, nbytes = start + info.offset, n // block * block_bytes
    raw = data[at:at + nbytes]
    if raw.size != nbytes:  # the header's check saw a longer file: it changed since
        raise ValueError(f"{path}: tensor {info.name!r} needs {nbytes} bytes at offset {at}, "
                         f"the file now has {data.size} bytes (changed while being read?)")
    if ttype.name in _VALUE_TYPES:
        values = raw.view(np.dtype(order + _VALUE_TYPES[ttype.name])).reshape(shape)
    else:
        values = raw.reshape(*shape[:-1], shape[-1] // block * block_bytes if shape else 0)
    return _FileTensor(info.name, ttype, np.array(info.dims, dtype=np.uint64), n, values)


class GGUFTensor:
    """One tensor of a GGUF file under its Hugging Face layout: a :class:`TensorFile`.

    ``shape`` is NumPy's order (``(out, in)`` for a matrix). :meth:`read` returns rows
    ``[start, stop)`` as a new array: F16 as float16, BF16 as uint16 bit patterns, F32 and
    every quantized type dequantized to float32 (``gguf.quants.dequantize``; a quant block
    never crosses a row, so any row range dequantizes alone). For ``attn_q``/``attn_k`` of a
    ``llama`` file it undoes llama.cpp's row permutation, reading whole heads of
    ``head_rows`` rows (or puts each head's rows in ``order``: a partial rotary's,
    :func:`~fastspec.formats.gguf_names.rotary_order`). Dequantized
    values that are not finite (a NaN or infinite scale or min) are a ValueError naming the
    file and the tensor.

    The tensor reads through its file's memory map (the :class:`GGUFFile` stays open while
    a tensor references it), whose pages of a quantized type it hands back once converted.
    """

    def __init__(self, file: Any, tensor: Any, head_rows: int | None = None,
                 float_kind: str | None = None, order: np.ndarray | None = None) -> None:
        self.file, self.name = file, tensor.name
        self._t, self.head_rows, self.float_kind = tensor, head_rows, float_kind
        self.order = order
        self.type_name = tensor.tensor_type.name
        self.shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        self.ndim = len(self.shape)
        self.dtype = np.dtype({"F16": np.float16, "BF16": np.uint16}.get(self.type_name,
                                                                         np.float32))

    def _convert(self, raw: np.ndarray) -> np.ndarray:
        """Return file rows ``raw`` in :attr:`dtype`: a view of the map (:data:`_MAPPABLE`),
        else dequantized and raw's pages of the map released (:class:`FileMap`)."""
        if self.type_name in _MAPPABLE:
            return raw.view(np.uint16) if self.type_name == "BF16" else raw
        out = _gguf().quants.dequantize(raw, self._t.tensor_type)
        self.file.release(raw)
        if not np.isfinite(out).all():  # a NaN or infinite scale (or min) in the blocks
            raise ValueError(f"{self.file.path}: tensor {self.name!r} ({self.type_name}) "
                             "dequantizes to NaN or infinite values: its blocks hold a NaN "
                             "or infinite scale or min")
        return out

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Return rows ``[start, stop)`` (first axis) in :attr:`dtype`, a new array.

        Converted :data:`_CHUNK` elements at a time into the result, so that dequantizing
        even a whole tensor holds nothing beside the result but one chunk's temporaries.
        """
        rows = self.shape[0]
        stop = rows if stop is None else min(stop, rows)
        start = min(max(start, 0), stop)
        h = self.head_rows or 1  # the permutation acts inside a head: read whole heads
        a, b = start // h * h, -(-stop // h) * h
        if self.ndim == 1:  # quant blocks of a vector are not rows: convert it whole
            out = np.array(self._convert(self._t.data)[a:b])
        else:
            out = np.empty((b - a,) + self.shape[1:], self.dtype)
            step = max(1, _CHUNK // max(1, math.prod(self.shape[1:])))
            for r in range(a, b, step):
                out[r - a:r - a + step] = self._convert(self._t.data[r:min(r + step, b)])
        if self.head_rows:
            out = self._reorder(out)
        return out[start - a:stop - a]

    def native_kind(self, requested: str) -> str:
        """The quantized kind this tensor is stored in for a model of ``requested`` kind
        (:func:`fastspec.formats.gguf_quant.native_kind`; :attr:`float_kind` for a float one)."""
        return native_kind(self.type_name, requested, self.float_kind)

    def blocks(self, copy: bool = True) -> np.ndarray:
        """Return the raw quantized blocks as uint8 ``(out, bytes a row)`` (rows of a llama
        file's ``attn_q``/``attn_k`` unpermuted, of a partial rotary's in :attr:`order`), a new
        array; with ``copy=False`` a read-only view of the file's map where the rows are not
        reordered."""
        if self.type_name not in NEAREST_NATIVE or self.ndim != 2:
            raise ValueError(f"{self.file.path}: tensor {self.name!r} ({self.type_name}) "
                             "holds no quantized blocks")
        raw = np.array(self._t.data, dtype=np.uint8) if copy else self._t.data.view()
        raw.flags.writeable = bool(copy)
        if raw.ndim != 2 or raw.shape[0] != self.shape[0]:
            raise ValueError(f"{self.file.path}: tensor {self.name!r} has {raw.shape} bytes "
                             f"of blocks, not {self.shape[0]} rows")
        return self._reorder(raw) if self.head_rows else raw

    def _reorder(self, rows: np.ndarray) -> np.ndarray:
        """Whole heads of rows in the model's order (llama.cpp's permutation undone, or
        :attr:`order`): a new array."""
        h = int(self.head_rows or 1)
        if self.order is None:
            return unpermute(rows, h)
        return rows.reshape(-1, h, *rows.shape[1:])[:, self.order].reshape(rows.shape)

    def quant(self, requested: str, out: np.ndarray | None = None):
        """Return :func:`~fastspec.formats.gguf_quant.quant_matrix` for a model of kind
        ``requested`` (packed into ``out``); then release its pages unless :data:`_MAPPABLE`."""
        q = quant_matrix(self, requested, out)
        if self.type_name not in _MAPPABLE:
            self.file.release(self._t.data)
        return q

    def mapped(self) -> np.ndarray:
        """Return the tensor as a copy-on-write view of the file when it is :data:`_MAPPABLE`
        and not permuted (nothing read until touched; the file must not change while it lives),
        else read (:meth:`read`)."""
        if self.head_rows or self.type_name not in _MAPPABLE:
            return self.read()
        return self._convert(self._t.data).view(np.ndarray)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.read() if dtype is None else self.read().astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.type_name}, shape={self.shape})"
