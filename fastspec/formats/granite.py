"""IBM Granite (``GraniteForCausalLM``, GGUF ``granite``): a Llama with four multipliers,
folded into a Llama-shaped model at load.

Granite multiplies the token embeddings by ``embedding_multiplier`` (``m_e``), each layer's
attention and MLP outputs by ``residual_multiplier`` (``m_r``) before they join the residual
stream, scales attention scores by ``attention_multiplier`` (``m_a``) instead of
``1 / sqrt(head_dim)``, and divides the logits by ``logits_scaling`` (``s``). fastspec runs the
same function with one forward change, :attr:`fastspec.ModelConfig.embedding_scale`:

- the residual stream is kept divided by ``m_r``: the layers add their outputs unscaled, the
  embedding rows are multiplied by ``m_e / m_r`` (``embedding_scale``), and every RMSNorm's
  epsilon becomes ``eps / m_r**2``, which makes each norm's output exactly what it is on the
  undivided stream (``rms(m_r h) = m_r rms(h)`` with ``eps`` scaled alike);
- the attention scale is ``rope_attention_factor**2 / sqrt(head_dim)``: the factor is
  ``sqrt(m_a sqrt(head_dim))`` (times any RoPE attention factor of the file);
- the final norm's weight is divided by ``s``.

The hidden states a step returns (``hidden_layers``, what a DFlash drafter reads) are the
divided stream's, and a normed last one is divided by ``s`` too: a drafter trained by
fastspec on such a target reads what it was trained on, one trained on transformers' hidden
states would not. GGUF's keys follow llama.cpp: ``granite.embedding_scale``,
``granite.residual_scale``, ``granite.attention.scale``, ``granite.logit_scale``, 0 or absent
for none (llama.cpp requires ``logit_scale``; fastspec reads it as the others), and
``granite.rope.scaling.finetuned`` false (llama.cpp's switch for a Granite without RoPE) is
refused. Written back (:func:`fastspec.formats.gguf_write.save_gguf`,
:func:`fastspec.formats.hf_folder.save_hf`), such a model is a Granite with residual and logit
multipliers of 1.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastspec.formats.folded_tensor import FoldedTensor
from fastspec.model.functional import positive_number

__all__ = ["GGUF_KEYS", "gguf_multipliers", "fold", "attention_fold", "with_attention",
           "logits_divisor", "final_norm", "export_multipliers", "gguf_keys"]

#: GGUF architecture keys (after ``"granite."``) -> the ``config.json`` multipliers.
GGUF_KEYS = {"embedding_scale": "embedding_multiplier", "residual_scale": "residual_multiplier",
             "attention.scale": "attention_multiplier", "logit_scale": "logits_scaling"}


def gguf_multipliers(metadata: dict[str, Any], arch: str, head_dim: int) -> dict[str, float]:
    """Return a ``granite`` file's multipliers under their ``config.json`` names.

    Parameters
    ----------
    metadata : dict
        The file's keys and values.
    arch : str
        ``general.architecture``; no key is read for another than ``"granite"``.
    head_dim : int

    Returns
    -------
    dict of str to float
        The four ``config.json`` multipliers (empty for another architecture); a key that is 0
        or absent means none, as in llama.cpp: a multiplier of 1, an attention scale of
        ``1 / sqrt(head_dim)`` (llama.cpp requires ``logit_scale``, read so all the same).

    Raises
    ------
    ValueError
        A value that is not a finite number of at least 0, or ``rope.scaling.finetuned``
        false: llama.cpp then runs the model without RoPE (named).
    """
    if arch != "granite":
        return {}
    if metadata.get("granite.rope.scaling.finetuned", True) is not True:
        raise ValueError("metadata key 'granite.rope.scaling.finetuned' = "
                         f"{metadata['granite.rope.scaling.finetuned']!r}: llama.cpp runs such "
                         "a granite file without RoPE, which fastspec does not")
    out = {"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "logits_scaling": 1.0,
           "attention_multiplier": 1 / math.sqrt(head_dim)}
    for key, hf in GGUF_KEYS.items():
        value = metadata.get(f"granite.{key}", 0)
        if value != 0 or isinstance(value, bool):
            out[hf] = positive_number(value, f"metadata key 'granite.{key}'")
    return out


def _is_granite(cfg: dict) -> bool:
    return "GraniteForCausalLM" in (cfg.get("architectures") or ())


def _granite_multiplier(cfg: dict, key: str) -> float | None:
    """Multiplier ``key`` of a Granite ``config.json`` (transformers' default 1), else None."""
    return _multiplier(cfg, key, 1.0) if _is_granite(cfg) else None


def _multiplier(cfg: dict, key: str, default: float) -> float:
    value = cfg.get(key)
    return default if value is None else positive_number(value, key)


def fold(cfg: dict, eps: float) -> tuple[float | None, float]:
    """Return the :class:`~fastspec.ModelConfig` values that run a Granite ``config.json``.

    Parameters
    ----------
    cfg : dict
        A ``GraniteForCausalLM`` ``config.json`` (another architecture's gives no change).
    eps : float
        The file's RMSNorm epsilon.

    Returns
    -------
    embedding_scale : float or None
        ``m_e / m_r`` (see the module).
    norm_eps : float
        ``eps / m_r**2``. (The attention multiplier: :func:`with_attention`.)

    Raises
    ------
    ValueError
        A multiplier that is not a positive finite number (named).
    """
    if not _is_granite(cfg):
        return None, eps
    logits_divisor(cfg)  # checked here; folded into the final norm as the tensors are read
    residual = _multiplier(cfg, "residual_multiplier", 1.0)
    scale = _multiplier(cfg, "embedding_multiplier", 1.0) / residual
    folded = eps / residual / residual
    for value, what in ((scale, "embedding_multiplier / residual_multiplier"),
                        (folded, "rms_norm_eps / residual_multiplier**2")):
        _in_float32(value, what)
    return scale, folded


def _in_float32(value: float, what: str) -> float:
    """``value``, checked to be a positive normal float32 (a float32 model computes with it)."""
    f32 = np.finfo(np.float32)
    if not f32.smallest_normal <= positive_number(value, what) <= f32.max:
        raise ValueError(f"{what} = {value!r} is beyond float32's range")
    return value


def attention_fold(cfg: dict, head_dim: int) -> float | None:
    """Return the factor RoPE's cos and sin are multiplied by to run a Granite
    ``config.json``'s ``attention_multiplier`` (``sqrt(m_a sqrt(head_dim))``; transformers'
    default multiplier is 1), None for another model.

    Raises
    ------
    ValueError
        A multiplier that is not a positive finite number.
    """
    attention = _granite_multiplier(cfg, "attention_multiplier")
    if attention is None:
        return None
    return _in_float32(math.sqrt(attention * math.sqrt(head_dim)),
                       "sqrt(attention_multiplier * sqrt(head_dim))")


def with_attention(factor: float | None, cfg: dict, head_dim: int) -> float | None:
    """Return RoPE attention factor ``factor`` (None for 1) times :func:`attention_fold`'s."""
    fold = attention_fold(cfg, head_dim)
    return factor if fold is None else fold if factor is None else factor * fold


def logits_divisor(cfg: dict) -> float | None:
    """Return a Granite ``config.json``'s ``logits_scaling`` (None for 1 or another model).

    Raises
    ------
    ValueError
        A value that is not a positive finite number.
    """
    divisor = _granite_multiplier(cfg, "logits_scaling")
    return None if divisor == 1 else divisor


def final_norm(tensor: Any, divisor: float) -> FoldedTensor:
    """A Granite's final norm weight ``tensor`` (a file tensor) read divided by its
    ``logits_scaling`` ``divisor``: float64, one rounding to the model's dtype; a quotient
    beyond float32's range is a ValueError."""
    return FoldedTensor(tensor, divisor=divisor,
                        what=f"the final norm weight divided by logits_scaling {divisor!r}")


def export_multipliers(embedding_scale: float | None, attention_factor: float | None,
                       head_dim: int) -> dict[str, float]:
    """Return the ``config.json`` multipliers that write a model as a Granite.

    Parameters
    ----------
    embedding_scale, attention_factor : float or None
        The model's :class:`~fastspec.ModelConfig` ``embedding_scale`` and
        ``rope_attention_factor`` (None for 1).
    head_dim : int

    Returns
    -------
    dict of str to float
        ``embedding_scale`` as the embedding multiplier, residual and logit multipliers of 1
        (folded at load), and the attention multiplier ``attention_factor**2 /
        sqrt(head_dim)``. The caller refuses what has no such form (QK-norm, biases, RoPE
        factors, partial rotary).
    """
    factor = attention_factor or 1.0
    return {"embedding_multiplier": embedding_scale or 1.0, "residual_multiplier": 1.0,
            "attention_multiplier": factor * factor / math.sqrt(head_dim),
            "logits_scaling": 1.0}


def gguf_keys(embedding_scale: float | None, attention_factor: float | None,
              head_dim: int) -> dict[str, float]:
    """Return :func:`export_multipliers` as ``granite.*`` keys (after the architecture)."""
    hf = export_multipliers(embedding_scale, attention_factor, head_dim)
    return {key: hf[name] for key, name in GGUF_KEYS.items()}
