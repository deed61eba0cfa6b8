"""GGUF blocks of 32 (Q8_0, Q4_0, Q4_1) as a file stores them: float weights quantized into
them (:func:`quantize_blocks`), and their scales checked (:func:`check_scales`).

:mod:`fastspec.kernels.quant` packs such blocks for its kernels (``QuantMatrix.from_blocks``)
and names a bad scale with :func:`check_scales`.
"""
from __future__ import annotations

import numpy as np

from fastspec.kernels._reference_quant import BLOCK, BLOCK_BYTES, q8_0_blocks

__all__ = ["quantize_blocks", "check_scales"]


def quantize_blocks(kind: str, W: np.ndarray) -> np.ndarray:
    """Return the GGUF blocks (out, in // 32 * block bytes) of a finite float W (out, in).

    ``gguf.quants.quantize`` when importable; else ggml's reference rules in float32: q8_0
    d = amax / 127, q = round-half-away(x / d); q4_0 d = (the signed value of largest
    magnitude) / -8, q = min(15, trunc(x / d + 8.5)); q4_1 d = (max - min) / 15, m = min,
    q = min(15, trunc((x - min) / d + 0.5)); d and m stored as float16.
    """
    W = np.asarray(W, np.float32)
    try:
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import quantize
    except ImportError:
        blocks = _quantize_ggml(kind, W)
    else:
        with np.errstate(over="ignore"):
            blocks = quantize(W, GGMLQuantizationType[kind.upper()])
    blocks = np.ascontiguousarray(blocks, np.uint8).reshape(W.shape[0], -1)
    try:
        check_scales(kind, blocks, W.shape[1])
    except ValueError:
        raise ValueError(f"W has values too large for {kind}'s float16 scales") from None
    return blocks


def check_scales(kind: str, blocks: np.ndarray, in_features: int) -> None:
    """Raise ValueError naming the first (row, block) of GGUF rows ``blocks`` (uint8 (out,
    in_features // 32 * block bytes) of ``kind``) whose f16 scale (or q4_1 min) is NaN or
    infinite; return None when there is none."""
    nb, bb = in_features // BLOCK, BLOCK_BYTES[kind]
    b3 = blocks.reshape(blocks.shape[0], nb, bb)
    for start, what in ((0, "scale"), (2, "min"))[:2 if kind == "q4_1" else 1]:
        h = b3[:, :, start:start + 2].copy().view(np.uint16)[..., 0]
        bad = (h & 0x7C00) == 0x7C00
        if bad.any():
            row, blk = (int(i[0]) for i in np.nonzero(bad))
            value = h[row, blk:blk + 1].view(np.float16)[0]
            raise ValueError(f"{kind} blocks: the {what} of row {row}, block {blk} is {value} "
                             "(NaN and infinite scales are refused)")


def _quantize_ggml(kind: str, W: np.ndarray) -> np.ndarray:
    """ggml's reference rules (:func:`quantize_blocks` without the ``gguf`` package)."""
    out_f, in_f = W.shape
    x = W.reshape(-1, BLOCK)
    one = np.float32(1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if kind == "q8_0":
            parts = [q8_0_blocks(x)]
        else:
            if kind == "q4_0":
                big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
                d, m, off = big / np.float32(-8), None, np.float32(8.5)
                base = x
            else:
                lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
                d, m, off = (hi - lo) / np.float32(15), lo, np.float32(0.5)
                base = x - lo
            inv = np.where(d == 0, np.float32(0), one / d)
            nib = np.clip(np.trunc(base * inv + off), 0, 15).astype(np.uint8)
            packed = nib[:, :16] | (nib[:, 16:] << np.uint8(4))
            parts = [d.astype(np.float16).view(np.uint8)]
            if m is not None:
                parts.append(m.astype(np.float16).view(np.uint8))
            parts.append(packed)
    return np.concatenate(parts, axis=1).reshape(out_f, -1)
