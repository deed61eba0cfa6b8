"""A GGUF file's header, read with every count checked: :func:`check_header`, :func:`read_header`.

A header cannot be trusted: ``gguf.GGUFReader`` loops ``kv_count`` times, builds an array of
as many elements as an array's length says and views tensors wherever their offsets point, so
a corrupt or hostile file could make it loop or allocate from a count of 2**60.
:func:`check_header` walks the GGUF v2/v3 layout itself -- magic ``GGUF``, version,
tensor and key/value counts, every key/value pair (key string, value type, value), every
tensor info (name, dimensions, type, offset), the data section's ``general.alignment`` --
and checks every count, length, offset and extent against the file's size *before* it is
used: nothing it allocates is sized from a count the file cannot hold, and it reads only
lengths (strings are skipped, not decoded, except keys and tensor names). Any inconsistency is
a ``ValueError`` that names the file, the field and the value.

The walk is a Python loop over the strings of the vocabulary arrays (about 100k on a 49k-token
file). :func:`read_header` is the same walk decoding every value as it goes, each only after
its length was checked (what :class:`fastspec.formats.gguf.GGUFFile` reads a file with, in
place of ``GGUFReader``'s far slower parse).
"""
from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NamedTuple

import numpy as np

__all__ = ["GGUFLayout", "GGUFHeader", "TensorInfo", "check_header", "read_header", "is_gguf",
           "MAX_DIMS", "VERSIONS"]

#: GGUF versions whose layout this walks (v1 had 32-bit counts; the gguf package reads 2-3).
VERSIONS = (2, 3)
#: ggml's GGML_MAX_DIMS: a tensor has at most four dimensions.
MAX_DIMS = 4
#: Nesting of arrays of arrays accepted (the gguf package recurses once per level).
_MAX_DEPTH = 4
_DEFAULT_ALIGNMENT = 32
#: GGUF value type -> its size in bytes (the scalar types); 8 is a string, 9 an array.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
#: GGUF value type -> its struct / NumPy format character (the same letters).
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                   11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
#: The fewest bytes a key/value pair (empty key, one-byte value) and a tensor info
#: (empty name, no dimension) can take: bounds on the counts before any loop.
_MIN_KV, _MIN_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8


@dataclass(frozen=True)
class GGUFLayout:
    """What :func:`check_header` found: the header's values, all checked against the file.

    Attributes
    ----------
    version, tensor_count, kv_count : int
    alignment : int
        ``general.alignment``, else 32.
    data_offset : int
        Where the tensor data section starts (aligned).
    byte_order : {"<", ">"}
    """

    version: int
    tensor_count: int
    kv_count: int
    alignment: int
    data_offset: int
    byte_order: str


class TensorInfo(NamedTuple):
    """One tensor's entry in the header: ``dims`` in ggml order (fastest first), ``type`` the
    ggml type number, ``offset`` from the start of the data section."""

    name: str
    dims: tuple[int, ...]
    type: int
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """What :func:`read_header` found: the checked layout, every key's value and every
    tensor's entry, in file order.

    Attributes
    ----------
    layout : GGUFLayout
    metadata : dict
        Key -> value as the ``gguf`` package's ``ReaderField.contents()`` gives it: ``int``,
        ``float``, ``bool`` or ``str``; arrays as lists; arrays of arrays as nested lists
        (``contents()`` flattens them; no key llama.cpp writes holds one).
    tensors : list of TensorInfo
    """

    layout: GGUFLayout
    metadata: dict
    tensors: list


class _Walker:
    """A cursor over the file's bytes whose every read is checked against the file's size."""

    def __init__(self, path: Path, buf, order: str, keep: bool = False) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, len(buf), 0
        self.order, self.keep = order, keep
        self.u32, self.u64 = struct.Struct(order + "I"), struct.Struct(order + "Q")

    def error(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> int:
        """Return the current offset and move past ``n`` bytes, checked to be in the file."""
        if n > self.size - self.pos:
            raise self.error(f"{what}: {n} bytes at offset {self.pos} run past the end of the "
                             f"file ({self.size} bytes; truncated or corrupt)")
        start, self.pos = self.pos, self.pos + n
        return start

    def uint(self, what: str, wide: bool = True) -> int:
        s = self.u64 if wide else self.u32
        return s.unpack_from(self.buf, self.need(s.size, what))[0]

    def name(self, what: str) -> str:
        """Return a key or tensor name: a length-prefixed UTF-8 string."""
        n = self.uint(f"{what} length")
        start = self.need(n, f"{what} of {n} bytes")
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} at offset {start} is not UTF-8") from None

    def new_name(self, what: str, seen: set[str], kind: str) -> str:
        """Return a :meth:`name` not in ``seen`` (then added to it): keys and tensors are
        unique."""
        name = self.name(what)
        if name in seen:
            raise self.error(f"{kind} {name!r} appears twice")
        seen.add(name)
        return name

    def strings(self, count: int, what: str) -> list[str] | None:
        """Skip ``count`` strings, reading only their lengths; with ``keep``, return them
        decoded (UTF-8)."""
        buf, size, pos, unpack = self.buf, self.size, self.pos, self.u64.unpack_from
        out: list[str] | None = [] if self.keep else None
        for i in range(count):
            if pos + 8 > size:
                break
            start = pos + 8
            pos = start + unpack(buf, pos)[0]
            if pos > size:
                break
            if out is not None:
                try:
                    out.append(str(buf[start:pos], "utf-8"))
                except UnicodeDecodeError:
                    where = f"element {i} at offset {start}" if count > 1 else f"offset {start}"
                    raise self.error(f"{what} holds a string that is not UTF-8 ({where})"
                                     ) from None
        else:
            self.pos = pos
            return out
        raise self.error(f"{what}: string {i} of {count} runs past the end of the file "
                         f"({size} bytes; truncated or corrupt)")

    def value(self, vtype: int, what: str, depth: int = 0):
        """Skip one value of GGUF type ``vtype``; with ``keep``, return it."""
        if vtype in _SCALAR_SIZES:
            start = self.need(_SCALAR_SIZES[vtype], what)
            if self.keep:
                return struct.unpack_from(self.order + _SCALAR_FORMATS[vtype], self.buf,
                                          start)[0]
        elif vtype == _STRING:
            strings = self.strings(1, what)
            return strings[0] if strings else None
        elif vtype == _ARRAY:
            if depth >= _MAX_DEPTH:
                raise self.error(f"{what}: arrays nested deeper than {_MAX_DEPTH}")
            itype = self.uint(f"{what} element type", wide=False)
            count = self.uint(f"{what} length")
            least = _SCALAR_SIZES.get(itype, 8 if itype == _STRING else 12)
            if itype not in _SCALAR_SIZES and itype not in (_STRING, _ARRAY):
                raise self.error(f"{what}: unknown array element type {itype}")
            if count > (self.size - self.pos) // least:
                raise self.error(f"{what}: an array of {count} elements of type {itype} "
                                 f"cannot fit in the {self.size - self.pos} bytes left of the "
                                 "file (corrupt)")
            if itype in _SCALAR_SIZES:
                start = self.need(count * least, what)
                if self.keep:
                    dtype = np.dtype(self.order + _SCALAR_FORMATS[itype])
                    return np.frombuffer(self.buf, dtype, count, start).tolist()
            elif itype == _STRING:
                return self.strings(count, what)
            else:
                items = [self.value(_ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
                return items if self.keep else None
        else:
            raise self.error(f"{what}: unknown value type {vtype}")
        return None


def is_gguf(path: str | os.PathLike) -> bool:
    """Return whether ``path`` is to be read as a GGUF file.

    Parameters
    ----------
    path : path-like

    Returns
    -------
    bool
        True for a ``.gguf`` name that is not a folder (whatever its bytes: the GGUF reader
        then names what is wrong), and for a regular file of any other name that starts with
        the magic ``GGUF`` (as Ollama's blobs, ``sha256-<hex>``); False otherwise, a path that
        cannot be read included. Only a regular file is opened, for its first four bytes (a
        FIFO or a terminal would block).
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return path.suffix.lower() == ".gguf"  # missing: the reader says so, naming it
    if stat.S_ISDIR(mode):
        return False
    if path.suffix.lower() == ".gguf":
        return True
    if not stat.S_ISREG(mode):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _open(path: Path) -> tuple[mmap.mmap | bytes, int]:
    if path.exists() and not path.is_file():  # opening a FIFO would block until a writer
        raise ValueError(f"{path}: not a regular file (a GGUF file is read from one)")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b"", 0
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size


def check_header(path: str | os.PathLike,
                 type_sizes: Mapping[int, tuple[int, int]],
                 type_names: Mapping[int, str] | None = None) -> GGUFLayout:
    """Check a GGUF file's header against its size; return its :class:`GGUFLayout`.

    Parameters
    ----------
    path : path-like
    type_sizes : mapping of int to (int, int)
        Tensor type -> ``(elements per block, bytes per block)``: the types accepted
        (``gguf.GGML_QUANT_SIZES``).
    type_names : mapping of int to str, optional
        Tensor type -> name, for the messages.

    Raises
    ------
    ValueError
        A truncated file, a wrong magic, a version other than 2 or 3, a count, length,
        dimension or offset the file cannot hold, an unknown value or tensor type, a tensor
        with more than four dimensions, rows not a multiple of its type's block or data past
        the end of the file, a duplicated key or tensor name, a ``general.alignment`` that is
        not a uint32 power of two, a key or tensor name that is not UTF-8 (all named).
    """
    return _read(path, type_sizes, type_names, keep=False).layout


def read_header(path: str | os.PathLike,
                type_sizes: Mapping[int, tuple[int, int]],
                type_names: Mapping[int, str] | None = None) -> GGUFHeader:
    """Check a GGUF file's header (:func:`check_header`) and return what it holds: every
    key's value and every tensor's entry (:class:`GGUFHeader`).

    The same one walk: each value is decoded where the check reads it (a vocabulary's strings
    in a Python loop, numeric arrays with one ``np.frombuffer``), about a hundred times
    faster than ``gguf.GGUFReader``'s parse, which builds NumPy views of every string.

    Raises
    ------
    ValueError
        What :func:`check_header` raises, or a string value that is not UTF-8 (named).
    """
    return _read(path, type_sizes, type_names, keep=True)


def _read(path: str | os.PathLike, type_sizes: Mapping[int, tuple[int, int]],
          type_names: Mapping[int, str] | None, keep: bool) -> GGUFHeader:
    path = Path(path)
    buf, size = _open(path)
    try:
        return _walk(path, buf, size, type_sizes, type_names or {}, keep)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def _walk(path: Path, buf, size: int, type_sizes: Mapping[int, tuple[int, int]],
          type_names: Mapping[int, str], keep: bool) -> GGUFHeader:
    if size < 24:
        raise ValueError(f"{path}: {size} bytes is too short for a GGUF header (24 bytes: "
                         "magic, version, counts): truncated?")
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: magic {bytes(buf[:4])!r} is not b'GGUF': not a GGUF file")
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"  # v < 65536
    w = _Walker(path, buf, order, keep)
    w.pos = 4
    version = w.uint("version", wide=False)
    if version not in VERSIONS:
        raise w.error(f"GGUF version {version} is not supported (versions {VERSIONS})")
    tensor_count, kv_count = w.uint("tensor_count"), w.uint("kv_count")
    if tensor_count * _MIN_TENSOR + kv_count * _MIN_KV > size - w.pos:
        raise w.error(f"tensor_count = {tensor_count} and kv_count = {kv_count} cannot fit in "
                      f"the file's {size} bytes (corrupt)")
    keys: set[str] = set()
    metadata: dict = {}
    alignment = _DEFAULT_ALIGNMENT
    for i in range(kv_count):
        key = w.new_name(f"key #{i}", keys, "metadata key")
        vtype = w.uint(f"metadata key {key!r} value type", wide=False)
        start = w.pos
        value = w.value(vtype, f"metadata key {key!r}")
        if keep:
            metadata[key] = value
        if key == "general.alignment":
            value = w.u32.unpack_from(buf, start)[0] if vtype == _UINT32 else None
            if not value or value & (value - 1):
                raise w.error(f"metadata key 'general.alignment' must be a uint32 power of "
                              f"two, got type {vtype} value {value}")
            alignment = value
    tensors = []
    infos: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(tensor_count):
        name = w.new_name(f"tensor #{i} name", names, "tensor")
        n_dims = w.uint(f"tensor {name!r} n_dims", wide=False)
        if n_dims > MAX_DIMS:
            raise w.error(f"tensor {name!r} has n_dims = {n_dims}, more than {MAX_DIMS}")
        dims = [w.uint(f"tensor {name!r} dimension {d}") for d in range(n_dims)]
        ttype = w.uint(f"tensor {name!r} type", wide=False)
        offset = w.uint(f"tensor {name!r} offset")
        what = f"tensor {name!r} of type {type_names.get(ttype, ttype)} and dims {dims}"
        if ttype not in type_sizes:
            raise w.error(f"tensor {name!r} has unknown type {ttype}")
        block, block_bytes = type_sizes[ttype]
        if any(d >= 2**63 for d in dims):
            raise w.error(f"{what}: a dimension past 2**63")
        row = dims[0] if dims else 1  # no dimension: one element
        if row % block:
            raise w.error(f"{what}: rows of {row} are not a multiple of its block of "
                          f"{block}")
        nbytes = math.prod(dims) // block * block_bytes
        if offset % alignment:
            raise w.error(f"{what}: offset {offset} is not a multiple of the alignment "
                          f"{alignment}")
        tensors.append((what, offset, nbytes))
        if keep:
            infos.append(TensorInfo(name, tuple(dims), ttype, offset))
    data_offset = -(-w.pos // alignment) * alignment
    for what, offset, nbytes in tensors:
        if data_offset + offset + nbytes > size:
            raise w.error(f"{what}: {nbytes} bytes at data offset {offset} (file offset "
                          f"{data_offset + offset}) run past the end of the file ({size} "
                          "bytes; truncated or corrupt)")
    layout = GGUFLayout(version, tensor_count, kv_count, alignment, data_offset, order)
    return GGUFHeader(layout, metadata, infos)
