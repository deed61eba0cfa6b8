"""safetensors files, parsed and written with NumPy only (fastspec's one runtime dependency).

The header is length-checked against the file size before it is read, every tensor's dtype,
shape and byte range are validated before any data is read, only the tensors asked for are
read, and nothing is unpickled. (The ``safetensors`` package's NumPy API cannot return bf16,
the usual dtype of real checkpoints, so it would only ever be a second code path.)
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from fastspec.formats import json_io

__all__ = ["read_safetensors", "write_safetensors", "FileTensor", "read_header", "to_float",
           "DTYPES", "FLOAT_CODES", "MAX_HEADER_BYTES"]

#: Largest safetensors header accepted (the JSON table of contents), in bytes.
MAX_HEADER_BYTES = 100 * 2**20

#: safetensors dtype codes -> the NumPy dtype their bytes are read as.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; converted to float32 by a 16-bit shift
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
#: The codes of float tensors (the only ones a model's weights may have).
FLOAT_CODES = {"F64", "F32", "F16", "BF16"}


def read_header(path: Path) -> tuple[dict, int, int]:
    """Return ``(entries, data_start, data_size)`` of a safetensors file, all validated.

    ``entries`` maps each tensor name to ``(dtype code, shape, offset in the data)``;
    ``data_start`` is the data's offset in the file and ``data_size`` its length in bytes.

    Raises
    ------
    ValueError
        A header the file cannot hold, or an entry whose dtype, shape or byte range is wrong
        (named with the file).
    """
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: not a safetensors file ({size} bytes, no header length)")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8 or n > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: header length {n} exceeds the file size {size} or the "
                             f"limit {MAX_HEADER_BYTES} (truncated or not a safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header must be a JSON object")
    data_start, data_size = 8 + n, size - 8 - n
    entries = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(e, dict) or set(e) - {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{path}: tensor {name!r} has a malformed header entry")
        code, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if code not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {code!r}")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(type(s) is int and 0 <= s < 2**40 for s in shape)):
            raise ValueError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            raise ValueError(f"{path}: tensor {name!r} has data_offsets {offsets!r} outside the "
                             f"{data_size} data bytes (truncated file?)")
        nbytes = math.prod(shape) * DTYPES[code].itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise ValueError(f"{path}: tensor {name!r} of dtype {code} and shape {shape} needs "
                             f"{nbytes} bytes, its data_offsets span {offsets[1] - offsets[0]}")
        entries[name] = (code, tuple(shape), offsets[0])
    return entries, data_start, data_size


def to_float(raw: np.ndarray, code: str, dtype: np.dtype) -> np.ndarray:
    """Return ``raw`` as ``dtype``: bf16 bit patterns (uint16, ``code`` ``"BF16"``) widened
    by a 16-bit shift, other floats converted (a view when already ``dtype``)."""
    if code == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(dtype, copy=False)


def read_safetensors(path: str | os.PathLike, names: Iterable[str] | None = None,
                     dtype: str | np.dtype | None = None,
                     bf16_bits: bool = False) -> dict[str, np.ndarray]:
    """Read tensors from a ``.safetensors`` file.

    Parameters
    ----------
    path : path-like
    names : iterable of str, optional
        Read only these tensors (missing ones raise ValueError); default all.
    dtype : dtype, optional
        Convert floating tensors (F64/F32/F16/BF16) to this dtype. Without it BF16 becomes
        float32 and other dtypes are kept.
    bf16_bits : bool, default False
        Return BF16 tensors as their raw uint16 bit patterns instead (``dtype`` then applies
        to the other floating tensors only).

    Returns
    -------
    dict of str to ndarray

    Raises
    ------
    ValueError
        For a truncated or malformed file (checked before any tensor data is read) or a
        missing tensor.
    """
    path = Path(path)
    entries, data_start, _ = read_header(path)
    wanted = list(entries) if names is None else list(names)
    missing = [n for n in wanted if n not in entries]
    if missing:
        raise ValueError(f"{path}: missing tensors {missing}")
    with open(path, "rb") as f:
        return {name: _read_entry(f, path, name, entries[name], data_start, dtype, bf16_bits)
                for name in wanted}


def _read_entry(f, path: Path, name: str, entry: tuple, data_start: int,
                dtype: str | np.dtype | None, bf16_bits: bool) -> np.ndarray:
    """Read one validated header entry from the open file ``f`` (see :func:`read_safetensors`)."""
    code, shape, offset = entry
    count = math.prod(shape)
    f.seek(data_start + offset)
    raw = np.fromfile(f, dtype=DTYPES[code], count=count)
    if raw.size != count:
        raise ValueError(f"{path}: tensor {name!r} is truncated")
    raw = raw.reshape(shape)
    if code in FLOAT_CODES and not (bf16_bits and code == "BF16"):
        raw = to_float(raw, code, np.dtype(dtype) if dtype is not None
                        else np.dtype(np.float32) if code == "BF16" else raw.dtype)
    return raw


class FileTensor:
    """One tensor of a safetensors file, read when asked: whole (``numpy.asarray``) or by rows.

    Its header entry is validated (:func:`read_header`) before it is made; reads return the
    file's dtype, BF16 as uint16 bit patterns. A reader that converts blocks of rows into
    their final array never holds the whole raw tensor (:meth:`Transformer.from_tensors`).
    """

    def __init__(self, path: Path, name: str, entry: tuple, data_start: int) -> None:
        self.path, self.name = path, name
        self._code, self.shape, self._offset = entry
        self._start = data_start
        self.dtype = DTYPES[self._code]
        self.ndim = len(self.shape)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Return rows ``[start, stop)`` (first axis) of the tensor."""
        rows = self.shape[0] if self.shape else 1
        stop = rows if stop is None else min(stop, rows)
        start = min(max(start, 0), stop)
        row = math.prod(self.shape[1:])
        count = (stop - start) * row
        with open(self.path, "rb") as f:
            f.seek(self._start + self._offset + start * row * self.dtype.itemsize)
            raw = np.fromfile(f, dtype=self.dtype, count=count)
        if raw.size != count:
            raise ValueError(f"{self.path}: tensor {self.name!r} is truncated")
        return raw.reshape(((stop - start),) + tuple(self.shape[1:]) if self.shape else ())

    def mapped(self) -> np.ndarray:
        """Return the tensor as a copy-on-write map of the file: nothing is read until a page
        is touched, the pages read are the kernel's page cache (shared, reclaimable), and
        writes stay private to this process. The file must not be truncated or rewritten
        while the array lives."""
        if math.prod(self.shape) == 0:
            return self.read()
        mm = np.memmap(self.path, dtype=self.dtype, mode="c", offset=self._start + self._offset,
                       shape=tuple(self.shape))
        return mm.view(np.ndarray)  # a plain array (its base keeps the map alive)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"FileTensor({self.name!r}, {self._code}, shape={self.shape})"


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write float32/float64/float16 (and integer) arrays to a ``.safetensors`` file.

    uint16 arrays are bfloat16 bit patterns (fastspec's bf16 storage) and are written as BF16.
    """
    codes = {(v.kind, v.itemsize): k for k, v in DTYPES.items()}
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        code = codes.get((a.dtype.kind, a.dtype.itemsize))
        if code is None:
            raise TypeError(f"tensor {name!r}: dtype {a.dtype} cannot be written to safetensors")
        a = a.astype(DTYPES[code], copy=False)
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    raw = json_io.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in arrays:
            f.write(a.tobytes())
