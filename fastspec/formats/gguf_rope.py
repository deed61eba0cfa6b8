"""RoPE settings of a GGUF file: linear scaling from its keys, Llama 3.1+'s ``rope_freqs``.

llama.cpp reads ``{arch}.rope.scaling.type`` (absent: ``"linear"``) and the factor from
``{arch}.rope.scaling.factor``, else the older ``{arch}.rope.scale_linear`` (absent or 0: 1),
and turns every angle ``p * freq_scale * theta_i / rope_freqs[i]`` with ``freq_scale = 1 /
factor``. fastspec runs the same as per-frequency divisors (``ModelConfig.rope_freq_factors``):
``factor * rope_freqs[i]``. :func:`rope_scaling` gives the keys as a Hugging Face
``rope_scaling`` object (what :mod:`fastspec.formats.hf_rope` reads); :func:`freq_factors`
combines it with the ``rope_freqs.weight`` tensor.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastspec.formats.gguf_names import ROPE_FREQS
from fastspec.model.functional import positive_number

__all__ = ["rope_scaling", "freq_factors", "SCALING_KEYS"]

#: Keys of a linearly scaled file (after ``"{arch}."``): the type, the factor (both names),
#: and two that change nothing llama.cpp computes for linear scaling (the training context
#: and whether the model was fine-tuned at the scaled length).
SCALING_KEYS = frozenset({"rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
                          "rope.scaling.original_context_length", "rope.scaling.finetuned"})


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
        A type other than ``"none"`` and ``"linear"`` (yarn, longrope: not implemented), a key
        of another scaling (``attn_factor``, ``yarn_*``), or a factor that is not a number
        (each named).
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
    tensor : GGUFTensor or None
        The file's ``rope_freqs.weight``.
    head_dim : int
        The model's head size (the tensor holds head_dim // 2 values).
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
        raise ValueError(f"tensor {ROPE_FREQS!r} is {tensor.tensor_type.name} of shape "
                         f"{shape}; RoPE of head size {head_dim} needs F32 of shape "
                         f"({head_dim // 2},)")
    values = np.asarray(tensor.data, dtype=np.float64).ravel()
    if not (np.isfinite(values).all() and (values > 0).all()):
        raise ValueError(f"tensor {ROPE_FREQS!r} holds a value that is not positive and "
                         "finite")
    if scaled is not None:
        values = values * np.asarray(scaled)
    return tuple(values.tolist())

