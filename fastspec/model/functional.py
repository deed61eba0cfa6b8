"""The reference math of a decoder layer in NumPy: norms, rotary positions, activations.

Shared by the NumPy path of :class:`~fastspec.Transformer`, the DFlash drafter's reference
block and the audits; the compiled runner implements the same formulas.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["rms_norm", "layer_norm", "rope_tables", "llama3_freq_factors", "apply_rope",
           "rotate_half_into", "gelu_tanh", "silu", "linear", "layer_rope", "layer_window"]


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


#: Positions of :func:`rope_tables` computed at a time (float64 temporaries of this many rows
#: stay in the cache), and the fewest table entries for which the chunks share the threads.
_ROPE_ROWS = 1024
_ROPE_THREADED_MIN = 1 << 18


def rope_tables(max_positions: int, head_dim: int, theta: float, dtype,
                freq_factors=None, attention_factor: float | None = None,
                rope_dims: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``cos, sin`` of shape (max_positions, head_dim // 2) for rotate-half RoPE.

    Frequency ``i`` turns ``theta ** (-2 i / head_dim) / freq_factors[i]`` radians a position
    (``freq_factors`` of shape (head_dim // 2,); None: all ones), as llama.cpp's RoPE reads
    ``rope_freqs.weight``. Angles are computed in float64, then rounded to ``dtype``; with an
    ``attention_factor`` (LongRoPE's, GGUF's ``rope.scaling.attn_factor``) the float64 cos
    and sin are multiplied by it before the rounding. With ``rope_dims`` (partial rotary:
    ``ModelConfig.rope_dims``) the first ``rope_dims // 2`` columns are those of RoPE over
    ``rope_dims`` dims (``freq_factors`` of that length) and the others cos 1, sin 0 exactly.

    The tables are filled :data:`_ROPE_ROWS` positions at a time (element by element the same
    operations, so the same values), the chunks of a large table (a GGUF file's context of
    131072 positions) shared by :func:`fastspec.kernels.get_threads` Python threads: NumPy's
    ``cos`` and ``sin`` release the GIL.
    """
    inv_freq = rope_inv_freq(rope_dims or head_dim, theta, freq_factors)
    r = inv_freq.size  # the rotated columns; the others keep cos 1, sin 0
    m = 1.0 if attention_factor is None else float(attention_factor)
    full = r == head_dim // 2
    cos = (np.empty if full else np.ones)((max_positions, head_dim // 2), dtype)
    sin = np.empty_like(cos) if full else np.zeros_like(cos)

    def fill(p0: int) -> None:
        p1 = min(p0 + _ROPE_ROWS, max_positions)
        angles = np.arange(p0, p1, dtype=np.float64)[:, None] * inv_freq[None, :]
        cos[p0:p1, :r] = np.cos(angles) * m  # times 1.0: the same bits
        sin[p0:p1, :r] = np.sin(angles) * m

    starts = range(0, max_positions, _ROPE_ROWS)
    threads = 1
    if cos.size >= _ROPE_THREADED_MIN:
        from fastspec.kernels import get_threads  # here: keeps the import chains short
        threads = min(get_threads(), len(starts))
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(fill, starts):
                pass
    else:
        for p0 in starts:
            fill(p0)
    return cos, sin


def rope_inv_freq(head_dim: int, theta: float, freq_factors=None) -> np.ndarray:
    """Return the radians a position turns each RoPE frequency, float64 (head_dim // 2,):
    ``theta ** (-2 i / head_dim) / freq_factors[i]`` (:func:`rope_tables`' angles)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    return inv_freq


def llama3_freq_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: float
                        ) -> tuple[float, ...]:
    """Return the per-frequency divisors of Llama 3.1's ``"llama3"`` RoPE scaling.

    The rule of transformers' ``rope_type="llama3"`` and of llama.cpp's converter (which
    writes these values as ``rope_freqs.weight``): a frequency whose wavelength
    ``2 pi / inv_freq`` is shorter than ``original_max_position_embeddings /
    high_freq_factor`` is kept (divisor 1), one longer than ``original_max_position_embeddings
    / low_freq_factor`` is divided by ``factor``, and the ones between are interpolated:
    divisor ``1 / ((1 - s) / factor + s)`` with ``s = (original / wavelength -
    low_freq_factor) / (high_freq_factor - low_freq_factor)``.

    Parameters
    ----------
    head_dim : int
        Rotated size of a head (even).
    theta : float
        RoPE base (``rope_theta``).
    factor, low_freq_factor, high_freq_factor, original_max_position_embeddings : float
        The ``rope_scaling`` / ``rope_parameters`` entries of the same names.

    Returns
    -------
    tuple of float, length head_dim // 2
        Each rounded to float32, as the converter writes them: a model and its GGUF file
        hold the same values.

    Raises
    ------
    ValueError
        A parameter that is not a positive finite number (named), ``high_freq_factor <=
        low_freq_factor``, or divisors that are not positive finite float32 values.
    """
    values = dict(theta=theta, factor=factor, low_freq_factor=low_freq_factor,
                  high_freq_factor=high_freq_factor,
                  original_max_position_embeddings=original_max_position_embeddings)
    p = {name: positive_number(value, f"llama3 RoPE scaling: {name}")
         for name, value in values.items()}
    if p["high_freq_factor"] <= p["low_freq_factor"]:
        raise ValueError(f"llama3 RoPE scaling: high_freq_factor {high_freq_factor!r} must "
                         f"exceed low_freq_factor {low_freq_factor!r}")
    original, low, high = (p["original_max_position_embeddings"], p["low_freq_factor"],
                           p["high_freq_factor"])
    out = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * p["theta"] ** (i / head_dim)
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(p["factor"])
        else:
            s = (original / wavelength - low) / (high - low)
            out.append(1.0 / ((1.0 - s) / p["factor"] + s))
    with np.errstate(over="ignore", under="ignore"):
        rounded = np.asarray(out, dtype=np.float64).astype(np.float32)
    if not (np.isfinite(rounded).all() and (rounded > 0).all()):
        raise ValueError(f"llama3 RoPE scaling: factor {factor!r} gives divisors outside "
                         "float32's positive finite range")
    return tuple(float(f) for f in rounded)


def positive_number(value, name: str) -> float:
    """``value`` as a positive finite float (a RoPE base, scaling parameter or divisor).

    Raises
    ------
    ValueError
        ``value`` is not a number (bools and strings included), or not positive and finite;
        the message names ``name``.
    """
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        out = math.nan
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return out


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
    """GELU's tanh form: ``x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2``."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Return ``x @ w`` (+ ``bias``)."""
    y = x @ w
    return y if bias is None else y + bias


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def layer_rope(config, i: int, cos, sin, local_cos, local_sin):
    """``(cos, sin)`` for layer ``i`` of a model of ``config`` (a ``ModelConfig``):
    ``(None, None)`` (no RoPE) for a NoPE layer (one of ``config.nope_layers``), the local
    tables ``(local_cos, local_sin)`` for one of ``config.local_layers``, else ``(cos, sin)``."""
    if config.nope_layers and i in config.nope_layers:
        return None, None
    if config.local_layers and i in config.local_layers:
        return local_cos, local_sin
    return cos, sin


def layer_window(config, i: int) -> int | None:
    """The sliding window of layer ``i``'s attention for a model of ``config`` (a
    ``ModelConfig``): ``config.sliding_window`` for one of ``config.local_layers``, else None
    (every earlier position)."""
    if config.sliding_window and i in (config.local_layers or ()):
        return int(config.sliding_window)
    return None
