"""Quantized weights in GGUF's Q8_0, Q4_0 and Q4_1 blocks, and their products with float rows.

A :class:`QuantMatrix` holds W (out_features, in_features) repacked once into the kernels'
layout (csrc/fs_quant.h: panels of 8 output columns); :func:`linear_q` computes
``y = x @ W.T (+ bias)`` with the numerics of docs/FORMATS.md ("Quantized products"): each row
of x quantized per block of 32 to int8 (:func:`quantize_activations`), exact integer block
sums, a float sum over blocks in a fixed order. Every ISA path of the compiled backend and the
NumPy twin give the same bits, and a row gives the same bits alone or inside a block of rows.

The backend follows :func:`fastspec.kernels.set_backend` (``FASTSPEC_BACKEND``): the compiled
:mod:`fastspec.kernels._kernels_quant` or the twin :mod:`fastspec.kernels._reference_quant`.
Compiled callers (the model runner) call ``fs_linear_q`` of ``_csrc.pxd`` on
:attr:`QuantMatrix.packed` directly.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from fastspec.kernels import _reference_quant, backend
from fastspec.kernels.arena import WeightArena, in_arena
from fastspec.kernels.quant_blocks import check_scales, quantize_blocks

__all__ = ["QUANT_KINDS", "BLOCK", "TRANSCODED", "block_bytes", "packed_bytes", "QuantMatrix",
           "gather", "reserve", "transcode", "linear_q",
           "quantize_activations", "kernel_name"]

#: The quantized weight kinds, in csrc/fs_quant.h's order.
QUANT_KINDS = ("q8_0", "q4_0", "q4_1")
#: Inputs per block (GGUF's QK8_0 / QK4_0 / QK4_1).
BLOCK = 32
_INT_LIMIT = 2**31 - 1
#: GGUF types with a direct conversion (:func:`transcode`) -> the native kinds it makes
#: (the first: the kind a load keeps them in unless asked for another).
TRANSCODED = {name: tuple(k for t, k in _reference_quant.TRANSCODED if t == name)
              for name, _ in _reference_quant.TRANSCODED}
_compiled: list[ModuleType] = []


def _impl() -> ModuleType:
    """The active backend's module (the compiled one imported on first use)."""
    if backend() != "cython":
        return _reference_quant
    if not _compiled:
        try:
            _compiled.append(importlib.import_module("fastspec.kernels._kernels_quant"))
        except ImportError as exc:
            raise RuntimeError("the compiled quantized kernels (fastspec.kernels._kernels_quant) "
                               f"are not built ({exc}); rebuild fastspec or use the numpy "
                               "backend") from None
    return _compiled[0]


def _check_kind(kind: Any) -> str:
    if kind not in QUANT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(QUANT_KINDS)}, got {kind!r}")
    return kind


def block_bytes(kind: str) -> int:
    """Return the bytes of one GGUF block of ``kind``: 34 (q8_0), 18 (q4_0), 20 (q4_1)."""
    return _reference_quant.BLOCK_BYTES[_check_kind(kind)]


def packed_bytes(kind: str, in_features: int, out_features: int) -> int:
    """Return the bytes of a packed W (out_features, in_features) of ``kind``
    (:attr:`QuantMatrix.packed`, csrc/fs_quant.h's layout)."""
    return _reference_quant.packed_bytes(_check_kind(kind), _check_in_features(in_features),
                                         int(out_features))


def _check_in_features(in_features: Any) -> int:
    if isinstance(in_features, bool) or not isinstance(in_features, (int, np.integer)):
        raise TypeError(f"in_features must be an int, got {type(in_features).__name__}")
    if not 0 < in_features <= _INT_LIMIT or in_features % BLOCK:
        raise ValueError(f"in_features must be a positive multiple of {BLOCK}, "
                         f"got {in_features}")
    return int(in_features)


def _check_out(out: np.ndarray | None, need: int) -> None:
    """ValueError unless ``out`` is None or a slot to pack ``need`` bytes into."""
    if out is not None and not (isinstance(out, np.ndarray) and out.dtype == np.uint8
                                and out.ndim == 1 and out.flags.c_contiguous
                                and out.flags.writeable and out.shape[0] == need
                                and out.ctypes.data % 64 == 0):
        raise ValueError(f"out must be a writable, 64-byte aligned, contiguous uint8 array of "
                         f"{need} bytes")


class QuantMatrix:
    """A quantized weight W (out_features, in_features), packed for the kernels.

    Attributes
    ----------
    kind : {"q8_0", "q4_0", "q4_1"}
    in_features, out_features : int
    packed : ndarray of uint8, shape (nbytes,)
        The kernels' layout (csrc/fs_quant.h), read-only, 64-byte aligned when packed here.

    Build one with :meth:`from_blocks` (GGUF bytes) or :meth:`from_float`. Pickles and copies
    (the packed bytes are re-aligned on unpickling).
    """

    __slots__ = ("kind", "in_features", "out_features", "packed")

    def __init__(self, kind: str, in_features: int, out_features: int, packed: np.ndarray):
        self.kind = _check_kind(kind)
        self.in_features = _check_in_features(in_features)
        self.out_features = int(out_features)
        need = packed_bytes(kind, self.in_features, self.out_features)
        if not (isinstance(packed, np.ndarray) and packed.dtype == np.uint8 and packed.ndim == 1
                and packed.flags.c_contiguous and packed.shape[0] == need):
            raise ValueError(f"packed must be a contiguous uint8 array of {need} bytes")
        packed.flags.writeable = False
        self.packed = packed

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weights."""
        return int(self.packed.nbytes)

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        return (self.out_features, self.in_features)

    def __repr__(self) -> str:
        return (f"QuantMatrix({self.kind!r}, out_features={self.out_features}, "
                f"in_features={self.in_features}, nbytes={self.nbytes})")

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self.kind, "in_features": self.in_features,
                "out_features": self.out_features, "packed": np.array(self.packed)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        packed = _aligned_copy(np.asarray(state["packed"], np.uint8))
        QuantMatrix.__init__(self, state["kind"], state["in_features"], state["out_features"],
                             packed)

    @classmethod
    def from_blocks(cls, kind: str, blocks: np.ndarray, in_features: int,
                    out: np.ndarray | None = None) -> QuantMatrix:
        """Pack GGUF rows: ``blocks`` uint8 (out, in_features / 32 * block_bytes(kind)).

        Parameters
        ----------
        kind : {"q8_0", "q4_0", "q4_1"}
        blocks : ndarray of uint8, shape (out_features, in_features // 32 * block_bytes(kind))
            The tensor's bytes as a GGUF file stores them (row r = output column r).
        in_features : int
            A positive multiple of 32.
        out : ndarray of uint8, shape (packed_bytes(kind, in_features, out_features),), optional
            Where to pack (a slot of :func:`reserve`: C-contiguous, writable, 64-byte
            aligned); it becomes :attr:`packed` (read-only). Default: a new array.

        Raises
        ------
        TypeError
            ``blocks`` is not a uint8 ndarray.
        ValueError
            Wrong shape or byte count, or a NaN / infinite scale (the message names its row
            and block).
        """
        kind = _check_kind(kind)
        in_features = _check_in_features(in_features)
        if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8:
            raise TypeError("blocks must be a uint8 ndarray, got "
                            + (f"dtype {blocks.dtype}" if isinstance(blocks, np.ndarray)
                               else type(blocks).__name__))
        row = in_features // BLOCK * block_bytes(kind)
        if blocks.ndim != 2 or blocks.shape[0] < 1 or blocks.shape[1] != row:
            raise ValueError(f"blocks of a {kind} W with in_features={in_features} must have "
                             f"shape (out_features >= 1, {row}) ({in_features // BLOCK} blocks "
                             f"of {block_bytes(kind)} bytes a row), got {blocks.shape}")
        if blocks.shape[0] > _INT_LIMIT:
            raise ValueError(f"out_features is too large, got {blocks.shape[0]}")
        blocks = np.ascontiguousarray(blocks)
        _check_out(out, packed_bytes(kind, in_features, blocks.shape[0]))
        try:  # the pack refuses a NaN or infinite scale; the message then names its place
            packed = _impl().pack(kind, blocks, in_features, out)
        except ValueError:
            check_scales(kind, blocks, in_features)
            raise
        return cls(kind, in_features, blocks.shape[0], packed)

    @classmethod
    def from_gguf(cls, type_name: str, raw: np.ndarray, in_features: int,
                  kind: str | None = None, out: np.ndarray | None = None) -> QuantMatrix:
        """Pack GGUF rows of type ``type_name`` as ``kind``.

        A native kind's own blocks go to :meth:`from_blocks`; the rows of a
        :data:`TRANSCODED` type are converted as they are packed, a panel of 8 rows at a time
        (csrc/fs_transcode.h's ``fs_transcode_pack``): the bytes of ``from_blocks(kind,
        transcode(type_name, raw, kind), in_features, out)`` without the converted matrix.

        Parameters
        ----------
        type_name : str
            The GGUF type of ``raw``: "Q8_0", "Q4_0", "Q4_1" or a key of :data:`TRANSCODED`.
        raw : ndarray of uint8, shape (out_features, a row's bytes in that type)
        in_features : int
        kind : {"q8_0", "q4_0", "q4_1"}, optional
            Default: the type's own kind, or the first of its :data:`TRANSCODED` kinds.
        out : ndarray of uint8, optional
            Where to pack, as in :meth:`from_blocks`.

        Raises
        ------
        TypeError
            ``raw`` is not a uint8 ndarray.
        ValueError
            Another type or kind, a wrong shape, or a NaN or infinite scale (named as
            :func:`transcode` and :meth:`from_blocks` name it).
        """
        if type_name.lower() in QUANT_KINDS and kind in (None, type_name.lower()):
            return cls.from_blocks(type_name.lower(), raw, in_features, out)
        kinds = TRANSCODED.get(type_name, ())
        if (kind := kinds[0] if kind is None and kinds else kind) not in kinds:
            done = ", ".join(f"{t} as {' or '.join(k)}" for t, k in TRANSCODED.items())
            raise ValueError(f"{type_name} rows cannot be packed as {kind!r} (native kinds as "
                             f"they are; converted: {done})")
        in_features = _check_in_features(in_features)
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
            raise TypeError("raw must be a uint8 ndarray")
        if raw.ndim != 2 or not 0 < raw.shape[0] <= _INT_LIMIT:
            raise ValueError(f"raw must have shape (out_features >= 1, bytes), got {raw.shape}")
        _check_out(out, packed_bytes(kind, in_features, raw.shape[0]))
        try:
            packed = _impl().transcode_pack(type_name, raw, kind, in_features, out)
        except ValueError:  # the two passes say where (a q4_1 scale's row and block)
            cls.from_blocks(kind, transcode(type_name, raw, kind), in_features)
            raise  # they found nothing: the one-pass error stands
        return cls(kind, in_features, raw.shape[0], packed)

    @classmethod
    def from_float(cls, kind: str, W: np.ndarray) -> QuantMatrix:
        """Quantize a float W (out_features, in_features) into GGUF blocks, then pack them.

        Uses ``gguf.quants.quantize`` when the ``gguf`` package is importable, else
        :func:`quantize_blocks` (ggml's reference rules, the same bytes); no dependency is
        needed.

        Raises
        ------
        TypeError
            W is not a float ndarray.
        ValueError
            W is not 2-D, in_features is not a positive multiple of 32, W holds NaN or
            infinite values, or a block's scale does not fit a float16.
        """
        kind = _check_kind(kind)
        if not isinstance(W, np.ndarray) or W.dtype.kind != "f":
            raise TypeError("W must be a float ndarray, got "
                            + (f"dtype {W.dtype}" if isinstance(W, np.ndarray)
                               else type(W).__name__))
        if W.ndim != 2 or W.shape[0] < 1:
            raise ValueError(f"W must have shape (out_features >= 1, in_features), got {W.shape}")
        _check_in_features(W.shape[1])
        if not np.isfinite(W).all():
            raise ValueError("W holds NaN or infinite values")
        return cls.from_blocks(kind, quantize_blocks(kind, W), W.shape[1])

    def to_blocks(self) -> np.ndarray:
        """Return the GGUF rows: uint8 (out_features, in_features // 32 * block_bytes)."""
        return _impl().unpack(self.kind, self.packed, self.in_features, self.out_features)

    def rows(self, ids: Any) -> np.ndarray:
        """Return rows ``ids`` of W dequantized: float32 (len(ids), in_features) (an
        embedding lookup; w = d * q, d * (q - 8), d * q + m as GGUF's dequantize)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"ids must be a 1-D integer array, got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.out_features):
            raise IndexError(f"ids must lie in [0, {self.out_features}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        return _impl().rows(self.kind, self.packed, self.in_features, self.out_features,
                            ids.astype(np.int32))

    def dequantize(self) -> np.ndarray:
        """Return W as float32 (out_features, in_features)."""
        return self.rows(np.arange(self.out_features))


def gather(mats: Sequence[QuantMatrix]) -> list[QuantMatrix]:
    """Return ``mats`` with their packed bytes moved into one huge-page arena, in this order.

    A model's forward reads its matrices in one order every step; with their bytes laid out
    in that order in one :class:`~fastspec.kernels.arena.WeightArena` the step is one stream
    on huge pages (docs/PERFORMANCE.md). The bytes, and so every result, are the same.

    Parameters
    ----------
    mats : sequence of QuantMatrix
        In the order the forward reads them. The same object twice (a tied head) is copied
        once; a matrix already in an arena (another model's, shared) is kept as it is.

    Returns
    -------
    list of QuantMatrix
        New matrices, one per entry of ``mats`` (the same object for repeats and for matrices
        already in an arena). ``mats`` are left unchanged.
    """
    todo = {id(m): m for m in mats if not in_arena(m.packed)}
    if not todo:
        return list(mats)
    arena = WeightArena(sum(WeightArena.padded(m.nbytes) for m in todo.values()))
    moved = {i: QuantMatrix(m.kind, m.in_features, m.out_features, arena.copy(m.packed))
             for i, m in todo.items()}
    return [moved.get(id(m), m) for m in mats]


def transcode(type_name: str, raw: np.ndarray, kind: str | None = None) -> np.ndarray:
    """Return GGUF Q4_K, Q6_K or Q5_0 rows ``raw`` (uint8 (rows, n * 144 | 210 | 22), whole
    blocks) as blocks of ``kind`` (default ``TRANSCODED[type_name][0]``), uint8 (rows, n * 8 *
    20 | n * 8 * 34 | n * 34): Q4_K as q4_1 keeps its 4-bit values (scale ``d * sc``, min
    ``-dmin * m``, exact in float32, rounded to float16); Q6_K and Q4_K as q8_0 are the bytes
    of ``gguf.quants``' dequantize-and-quantize; Q5_0 keeps ``d`` and the integers ``q - 16``.
    One compiled pass (csrc/fs_transcode.h; the twin on the numpy backend) that the threads
    share: the same bytes at any :func:`fastspec.set_threads` count. ValueError: another type
    or kind, partial blocks, a NaN or infinite scale (for Q4_K as q4_1: at the pack).
    """
    if (kinds := TRANSCODED.get(type_name)) is None:
        raise ValueError(f"type_name must be one of {', '.join(TRANSCODED)}, got {type_name!r}")
    kind = kinds[0] if kind is None else kind
    if kind not in kinds:
        raise ValueError(f"{type_name} converts to {' or '.join(kinds)}, not {kind!r}")
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError("raw must be a 2-D uint8 ndarray")
    return _impl().transcode(type_name, raw, kind)


def reserve(shapes: Sequence[tuple[str, int, int]]) -> list[np.ndarray]:
    """Return byte slots for packed matrices, in this order, in one new huge-page arena.

    What :func:`gather` would build, without the matrices first packed elsewhere: a loader
    that knows every matrix's size before it reads any packs each straight into its slot
    (:meth:`QuantMatrix.from_blocks` ``out=``), so its peak holds no second copy.

    Parameters
    ----------
    shapes : sequence of (kind, in_features, out_features)
        In the order the forward reads the matrices.

    Returns
    -------
    list of ndarray of uint8
        Writable, uninitialised, 64-byte aligned; one per entry, ``packed_bytes`` each.
    """
    sizes = [packed_bytes(*shape) for shape in shapes]
    arena = WeightArena(sum(WeightArena.padded(n) for n in sizes))
    return [arena.take(n, np.uint8) for n in sizes]


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    buf = np.empty(a.nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    out = buf[off:off + a.nbytes]
    out[:] = a.reshape(-1)
    return out


def _check_rows(x: Any, name: str, in_features: int | None = None) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray, got "
                        + (f"dtype {x.dtype}" if isinstance(x, np.ndarray) else type(x).__name__))
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, in_features), got shape {x.shape}")
    if in_features is not None and x.shape[1] != in_features:
        raise ValueError(f"{name} has {x.shape[1]} features, W has in_features={in_features}")
    if in_features is None and (x.shape[1] == 0 or x.shape[1] % BLOCK):
        raise ValueError(f"{name} must have a positive multiple of {BLOCK} features, "
                         f"got {x.shape[1]}")
    if x.shape[0] > _INT_LIMIT:
        raise ValueError(f"{name} has too many rows, got {x.shape[0]}")
    return np.ascontiguousarray(x)


def quantize_activations(x: np.ndarray, kind: str = "q8_0"):
    """Quantize each row of x per block of 32 as the products do (docs/FORMATS.md).

    Parameters
    ----------
    x : ndarray of float32, shape (n, in)
        in a positive multiple of 32.
    kind : {"q8_0", "q4_0", "q4_1"}
        Checked only: every kind uses the same rule.

    Returns
    -------
    q : ndarray of int8, shape (n, in)
    d : ndarray of float32, shape (n, in // 32)
        amax / 127 per block (0 for a block below 2^-96, NaN for one holding NaN or inf).
    s : ndarray of int32, shape (n, in // 32)
        The exact sum of each block's q.
    """
    _check_kind(kind)
    return _impl().quantize_activations(_check_rows(x, "x"), kind)


def linear_q(x: np.ndarray, W: QuantMatrix, bias: np.ndarray | None = None,
             out: np.ndarray | None = None, *, accumulate: bool = False) -> np.ndarray:
    """Return y (n, out_features) = x @ W.T (+ bias), or add it to ``out`` (accumulate).

    Parameters
    ----------
    x : ndarray of float32, shape (n, in_features)
    W : QuantMatrix
    bias : ndarray of float32, shape (out_features,), optional
        Added after the product (y = acc + bias).
    out : ndarray of float32, shape (n, out_features), optional
        C-contiguous and writable; receives the result (and is returned).
    accumulate : bool
        Start each output's sum from ``out`` (which is then required).

    Raises
    ------
    TypeError
        W is not a QuantMatrix, or an array has the wrong dtype.
    ValueError
        Mismatched shapes, or ``accumulate`` without ``out``.
    """
    if not isinstance(W, QuantMatrix):
        raise TypeError(f"W must be a QuantMatrix, got {type(W).__name__}")
    x = _check_rows(x, "x", W.in_features)
    n = x.shape[0]
    if bias is not None:
        if not isinstance(bias, np.ndarray) or bias.dtype != np.float32:
            raise TypeError("bias must be a float32 ndarray or None")
        if bias.shape != (W.out_features,):
            raise ValueError(f"bias must have shape ({W.out_features},), got {bias.shape}")
        bias = np.ascontiguousarray(bias)
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out (the values to add to)")
        out = np.empty((n, W.out_features), np.float32)
    elif not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise TypeError("out must be a float32 ndarray or None")
    elif out.shape != (n, W.out_features) or not out.flags.c_contiguous \
            or not out.flags.writeable:
        raise ValueError(f"out must be a writable C-contiguous array of shape "
                         f"({n}, {W.out_features}), got {out.shape}")
    return _impl().linear(W.kind, x, W.packed, W.in_features, W.out_features, bias, out,
                          bool(accumulate))


def kernel_name(kind: str, n: int, in_features: int | None = None) -> str:
    """Return the kernel :func:`linear_q` runs for n rows of ``kind`` now.

    Parameters
    ----------
    kind : str
        One of :data:`QUANT_KINDS`.
    n : int
        Rows of the product (>= 1).
    in_features : int or None
        Inputs of the matrix (a multiple of 32), or None for a width every kernel takes: the
        AMX tiles take rows of at most 16384 inputs, and longer rows run the avx512 path's
        kernels ("avx512_vnni_x16" for blocks of rows). None does not name the one-row rule
        for wide rows below.

    Returns
    -------
    str
        "numpy" (the twin), or the compiled path's "portable", "avx2", "avx_vnni",
        "avx512_vnni", "avx512_vnni_x16" (its zmm tiles of 16 columns, for blocks of rows, and
        on an Intel CPU for one row of at least 1024 inputs) or "amx_int8".
    """
    _check_kind(kind)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    width = 0
    if in_features is not None:
        if (isinstance(in_features, bool) or not isinstance(in_features, (int, np.integer))
                or in_features < 32 or in_features % 32):
            raise ValueError(f"in_features must be a positive multiple of 32, got "
                             f"{in_features!r}")
        width = min(int(in_features), _INT_LIMIT)
    return _impl().kernel_name(kind, min(int(n), _INT_LIMIT), width)
