"""The reference math of a decoder layer in NumPy: norms, rotary positions, activations.

Shared by the NumPy path of :class:`~fastspec.Transformer`, the DFlash drafter's reference
block and the audits; the compiled runner implements the same formulas.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["rms_norm", "layer_norm", "rope_tables", "apply_rope", "rotate_half_into", "gelu_tanh",
           "silu", "linear"]


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """Return ``x / sqrt(mean(x**2, -1) + eps) * weight`` (float64 statistics)."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    y = (x / np.sqrt(ms + eps)).astype(x.dtype, copy=False)
    return y if weight is None else y * weight


def layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """Return ``(x - mean) / sqrt(var + eps)`` over the last axis, no affine parameters."""
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(x64 - mu), axis=-1, keepdims=True)
    return ((x64 - mu) / np.sqrt(var + eps)).astype(x.dtype, copy=False)


def rope_tables(max_positions: int, head_dim: int, theta: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Return ``cos, sin`` of shape (max_positions, head_dim // 2) for rotate-half RoPE."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x`` of shape (n, heads, D) by per-position ``cos, sin`` of shape (n, D/2)."""
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty(x.shape, dtype=np.result_type(x, c, s))
    rotate_half_into(out, x, c, s)
    return out


def rotate_half_into(out: np.ndarray, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """Write the rotate-half RoPE rotation of ``x`` (..., D) to ``out`` (same shape).

    ``[x1 cos - x2 sin, x2 cos + x1 sin]`` with ``x1, x2`` the halves of the last axis and
    ``cos, sin`` broadcasting against a half (..., D/2). ``out`` may overlap ``x``: both halves
    are computed in full before it is written.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    first = x1 * cos
    first -= x2 * sin
    second = x2 * cos
    second += x1 * sin
    out[..., :half] = first
    out[..., half:] = second


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Return ``x @ w`` (+ ``bias``)."""
    y = x @ w
    return y if bias is None else y + bias


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))
