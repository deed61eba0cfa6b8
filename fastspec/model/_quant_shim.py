"""TEMPORARY stand-in for fastspec.kernels.quant (branch qkern) until it is merged: the
contract's names in plain NumPy (weights dequantized, no activation quantization)."""
from __future__ import annotations

import numpy as np

QUANT_KINDS = ("q8_0", "q4_0", "q4_1")
BLOCK = 32
_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}


def block_bytes(kind: str) -> int:
    return _BYTES[kind]


def _dequant(kind, blocks):
    b = blocks.reshape(-1, _BYTES[kind])
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    if kind == "q8_0":
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return d * q
    m = b[:, 2:4].copy().view(np.float16).astype(np.float32) if kind == "q4_1" else None
    qs = b[:, 4:] if kind == "q4_1" else b[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    if kind == "q4_0":
        return d * (q - 8)
    return d * q + m


class QuantMatrix:
    def __init__(self, kind, blocks, in_features):
        self.kind, self._b, self.in_features = kind, blocks, in_features
        self.out_features = blocks.shape[0]
        self.nbytes = blocks.nbytes

    @classmethod
    def from_blocks(cls, kind, blocks, in_features):
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        if in_features % 32 or blocks.ndim != 2 or blocks.shape[1] != in_features // 32 * _BYTES[kind]:
            raise ValueError(f"blocks of shape {blocks.shape} do not hold {kind} rows of {in_features}")
        sc = blocks.reshape(-1, _BYTES[kind])[:, :2].copy().view(np.float16)
        if not np.isfinite(sc).all():
            raise ValueError("non-finite scale")
        return cls(kind, blocks, in_features)

    @classmethod
    def from_float(cls, kind, w):
        import gguf
        qt = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
              "q4_1": gguf.GGMLQuantizationType.Q4_1}[kind]
        w = np.ascontiguousarray(w, dtype=np.float32)
        return cls(kind, gguf.quants.quantize(w, qt), w.shape[1])

    def to_blocks(self):
        return self._b

    def dequantize(self):
        return _dequant(self.kind, self._b).reshape(self.out_features, self.in_features)

    def rows(self, ids):
        return _dequant(self.kind, self._b[np.asarray(ids)]).reshape(-1, self.in_features)


def linear_q(x, W, bias=None, out=None, *, accumulate=False):
    y = np.asarray(x, np.float32) @ W.dequantize().T
    if bias is not None:
        y = y + bias
    if out is None:
        return y
    if accumulate:
        out += y
    else:
        out[...] = y
    return out
