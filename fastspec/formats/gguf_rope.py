"""RoPE settings of a GGUF file: linear scaling from its keys, Llama 3.1+'s ``rope_freqs``,
Phi-3's LongRoPE factors and the attention factor.

llama.cpp reads ``{arch}.rope.scaling.type`` (absent: ``"linear"``) and the factor from
``{arch}.rope.scaling.factor``, else the older ``{arch}.rope.scale_linear`` (absent or 0: 1),
and turns every angle ``p * freq_scale * theta_i / rope_freqs[i]`` with ``freq_scale = 1 /
factor``. fastspec runs the same as per-frequency divisors (``ModelConfig.rope_freq_factors``):
``factor * rope_freqs[i]``. :func:`rope_scaling` gives the keys as a Hugging Face
``rope_scaling`` object (what :mod:`fastspec.formats.hf_rope` reads); :func:`freq_factors`
combines it with the ``rope_freqs.weight`` tensor.

LongRoPE (``phi3`` files of a long context: Phi-3-mini-128k, Phi-3.5-mini) stores two sets of
divisors, ``rope_factors_short.weight`` and ``rope_factors_long.weight``, and llama.cpp picks
the long ones for a context longer than ``{arch}.rope.scaling.original_context_length`` (else
the training context), the short ones otherwise. fastspec runs the short ones (what llama.cpp
and Ollama run at their default contexts, and transformers up to that length) and serves
that many positions (:func:`rope_context`). ``{arch}.rope.scaling.attn_factor`` multiplies
RoPE's cos and sin (llama.cpp applies it whatever the scaling; absent: 1):
``ModelConfig.rope_attention_factor``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastspec.model.functional import positive_number

__all__ = ["rope_scaling", "freq_factors", "attention_factor", "rope_context",
           "SCALING_KEYS", "LONGROPE"]

#: Keys of a linearly scaled file (after ``"{arch}."``): the type, the factor (both names),
#: two that change nothing llama.cpp computes for linear scaling (the training context
#: and whether the model was fine-tuned at the scaled length), and the attention factor.
SCALING_KEYS = frozenset({"rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
                          "rope.scaling.original_context_length", "rope.scaling.finetuned",
                          "rope.scaling.attn_factor"})
#: LongRoPE's divisors in a ``phi3`` file: the short ones (run), the long ones (not run).
LONGROPE = ("rope_factors_short.weight", "rope_factors_long.weight")


def rope_scaling(metadata: dict[str, Any], arch: str) -> dict[str, Any] | None:
    """Return the file's RoPE scaling as a ``config.json`` ``rope_scaling`` object.

    Parameters
    ----------
    metadata : dict
        The file's keys and values.
    arch : str
        ``general.architecture``.

    Returns
    -------
    dict or None
        ``{"rope_type": "linear", "factor": f}``, or None where nothing is scaled (no scaling
        key, type ``"none"``, or a linear factor of 0 or 1).

    Raises
    ------
    ValueError
        A type other than ``"none"`` and ``"linear"`` (yarn: not implemented), a key of another
        scaling (``yarn_*``), or a factor that is not a number (each named).
    """
    keys = {k.split(".", 1)[1] for k in metadata if k.startswith(f"{arch}.rope.scal")}
    if not keys:
        return None
    kind = metadata.get(f"{arch}.rope.scaling.type", "linear")
    if kind not in ("none", "linear"):
        raise ValueError(f"metadata key '{arch}.rope.scaling.type' = {kind!r} is not supported "
                         "(fastspec runs default RoPE, linear and Llama 3's rope_freqs)")
    other = sorted(keys - SCALING_KEYS)
    if other:
        raise ValueError(f"metadata key '{arch}.{other[0]}' = {metadata[f'{arch}.{other[0]}']!r}"
                         f" is not supported with {kind} RoPE scaling")
    key = f"{arch}.rope.scaling.factor"
    key = key if key in metadata else f"{arch}.rope.scale_linear"
    factor = metadata.get(key, 0.0)
    if kind == "none" or (type(factor) in (int, float) and factor in (0, 1)):
        return None  # llama.cpp: a factor of 0 is 1
    return {"rope_type": "linear", "factor": positive_number(factor, f"metadata key '{key}'")}


def freq_factors(tensor: Any, head_dim: int,
                 scaled: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """Return the file's per-frequency RoPE divisors: ``rope_freqs.weight`` times the linear
    scaling's ``scaled`` divisors (either alone, or None for neither).

    Parameters
    ----------
    tensor : file tensor or None
        The file's ``rope_freqs.weight`` (or a ``phi3`` file's ``rope_factors_short.weight``).
    head_dim : int
        The dims of a head RoPE turns: the head size, or a partial rotary's count (the tensor
        holds head_dim // 2 values).
    scaled : tuple of float of length head_dim // 2, or None
        The linear scaling's divisors (:func:`fastspec.formats.hf_rope.rope_freq_factors` of
        :func:`rope_scaling`).

    Returns
    -------
    tuple of float of length head_dim // 2, or None
        ``ModelConfig.rope_freq_factors``.

    Raises
    ------
    ValueError
        A tensor that is not F32 of shape (head_dim // 2,) with positive finite values.
    """
    if tensor is None:
        return scaled
    shape = tuple(int(n) for n in tensor.shape.tolist())
    if tensor.tensor_type.name != "F32" or shape != (head_dim // 2,):  # as llama.cpp asks
        raise ValueError(f"tensor {tensor.name!r} is {tensor.tensor_type.name} of shape "
                         f"{shape}; RoPE of {head_dim} dims a head needs F32 of shape "
                         f"({head_dim // 2},)")
    values = np.asarray(tensor.data, dtype=np.float64).ravel()
    if not (np.isfinite(values).all() and (values > 0).all()):
        raise ValueError(f"tensor {tensor.name!r} holds a value that is not positive and "
                         "finite")
    if scaled is not None:
        values = values * np.asarray(scaled)
    return tuple(values.tolist())


def attention_factor(metadata: dict[str, Any], arch: str) -> float | None:
    """Return the file's RoPE attention factor (parameters as :func:`rope_scaling`'s).

    Returns
    -------
    float or None
        ``{arch}.rope.scaling.attn_factor`` (``ModelConfig.rope_attention_factor``), or None
        where the file has none.

    Raises
    ------
    ValueError
        A value that is not a positive finite number (named).
    """
    key = f"{arch}.rope.scaling.attn_factor"
    if key not in metadata:
        return None
    return positive_number(metadata[key], f"metadata key {key!r}")


def rope_context(metadata: dict[str, Any], arch: str, names: Any, context: int) -> int:
    """Return the most positions the file's RoPE serves.

    Parameters
    ----------
    metadata : dict
        The file's keys and values.
    arch : str
        ``general.architecture``.
    names : container of str
        The file's tensor names.
    context : int
        The training context (``{arch}.context_length``).

    Returns
    -------
    int
        ``context``, or, for a file with :data:`LONGROPE` factors among ``names``, the context
        of the short ones (``{arch}.rope.scaling.original_context_length``, at most
        ``context``; without the key llama.cpp runs them for every context).

    Raises
    ------
    ValueError
        An original context that is not a positive int (named), factors or not.
    """
    key = f"{arch}.rope.scaling.original_context_length"
    if key not in metadata:
        return context
    original = metadata[key]
    if type(original) is not int or original <= 0:
        raise ValueError(f"metadata key {key!r} must be a positive int, got {original!r}")
    return min(original, context) if any(n in names for n in LONGROPE) else context
