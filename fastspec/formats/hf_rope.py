"""RoPE settings of a Hugging Face ``config.json``: the base, linear, llama3 and LongRoPE
scaling.

transformers 5 writes them under ``rope_parameters`` (``rope_theta`` included); earlier
versions wrote ``rope_theta`` and ``rope_scaling`` at the top level. Both are read as
transformers 5 reads them: a legacy ``rope_scaling`` object replaces ``rope_parameters``, and
the base is ``rope_theta`` inside the chosen object, else at the top level, else 10000.
Default RoPE, ``rope_type="linear"`` (positions divided by ``factor``: every frequency
divided by it, as transformers does) and ``"llama3"`` (per-frequency divisors,
:func:`~fastspec.model.functional.llama3_freq_factors`) and ``"longrope"`` (Phi-3's; ``"su"``,
its older name) run; any other type is a ValueError naming it. LongRoPE divides by its
``short_factor`` up to ``original_max_position_embeddings`` positions and by its
``long_factor`` beyond (transformers switches by the sequence's length): fastspec runs the
short factors and serves that many positions (:func:`rope_context`), with transformers'
``attention_factor`` (:func:`rope_attention_factor`).
"""
from __future__ import annotations

import math
from typing import Any

from fastspec.model.functional import llama3_freq_factors, positive_number

__all__ = ["rope_theta", "rope_freq_factors", "rope_attention_factor", "rope_context",
           "partial_rotary_factor", "linear_factor", "nope_layers", "SCALINGS",
           "DRAFTER_SCALINGS"]

#: The RoPE types that run (:func:`rope_freq_factors` turns each into divisors or None).
SCALINGS = ("default", "linear", "llama3", "longrope", "su")
#: Those a DFlash drafter folder may have (its config has no attention factor nor a context).
DRAFTER_SCALINGS = ("default", "linear", "llama3")

#: The llama3 parameters (``original_max_position_embeddings`` defaults as in transformers).
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")


def _rope_parameters(cfg: dict) -> tuple[str, dict]:
    """Return the RoPE type of ``cfg`` and the object holding its parameters."""
    for name in ("rope_scaling", "rope_parameters"):
        if cfg.get(name) is not None and not isinstance(cfg[name], dict):
            raise ValueError(f"{name} must be a JSON object or null, got {cfg[name]!r}")
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"rope_type must be a non-empty string, got {kind!r}")
    return ("longrope" if kind == "su" else kind), params


def rope_theta(cfg: dict, scalings: tuple[str, ...] = ("default",)) -> float:
    """Return the RoPE base of a Hugging Face ``config.json``.

    Parameters
    ----------
    cfg : dict
        The parsed ``config.json``.
    scalings : tuple of str, default ("default",)
        The RoPE types the caller runs.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        A RoPE type not in ``scalings``, or a base that is not a positive finite number.
    """
    kind, params = _rope_parameters(cfg)
    if kind not in scalings:
        raise ValueError(f"unsupported rope scaling {kind!r} (implemented: "
                         f"{', '.join(scalings)})")
    theta = params.get("rope_theta")
    if theta is None:
        theta = cfg.get("rope_theta")
    return positive_number(10000.0 if theta is None else theta, "rope_theta")


def rope_freq_factors(cfg: dict, head_dim: int) -> tuple[float, ...] | None:
    """Return the per-frequency RoPE divisors of a ``config.json``, or None for default RoPE.

    Parameters
    ----------
    cfg : dict
        The parsed ``config.json``.
    head_dim : int
        The model's head size.

    Returns
    -------
    tuple of float of length head_dim // 2, or None
        For ``rope_type`` ``"linear"``: ``factor`` for every frequency (None for a factor of
        1); for ``"llama3"``: :func:`~fastspec.model.functional.llama3_freq_factors`; for
        ``"longrope"``: its ``short_factor``.

    Raises
    ------
    ValueError
        Another RoPE type, or a missing or invalid linear or llama3 parameter (named).
    """
    theta = rope_theta(cfg, SCALINGS)
    kind, params = _rope_parameters(cfg)
    if kind == "default":
        return None
    if kind == "linear":
        factor = positive_number(params.get("factor"), "linear RoPE scaling's factor")
        return None if factor == 1 else (factor,) * (head_dim // 2)
    if kind == "longrope":
        _longrope_original(cfg, params)  # checked here: the factors serve that many positions
        short = params.get("short_factor")
        if not isinstance(short, list) or len(short) != head_dim // 2:
            raise ValueError(f"LongRoPE's short_factor must be a list of head_dim / 2 = "
                             f"{head_dim // 2} numbers, got {short!r}")
        return tuple(positive_number(f, f"LongRoPE's short_factor[{i}]")
                     for i, f in enumerate(short))
    values: dict[str, Any] = {k: params.get(k) for k in _LLAMA3_KEYS}
    # transformers: a top-level original length wins, else the object's, else the context
    original = (cfg.get("original_max_position_embeddings"),
                values["original_max_position_embeddings"], cfg.get("max_position_embeddings"))
    values["original_max_position_embeddings"] = next((v for v in original if v is not None),
                                                      None)
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise ValueError(f"llama3 RoPE scaling needs {missing}")
    return llama3_freq_factors(head_dim, theta, **values)


def linear_factor(factors: tuple[float, ...] | None) -> float | None:
    """Return the linear scaling factor that RoPE divisors amount to.

    Parameters
    ----------
    factors : tuple of float, or None
        ``ModelConfig.rope_freq_factors``.

    Returns
    -------
    float or None
        The divisor when every frequency has the same one (written as ``{"rope_type":
        "linear", "factor": f}``, or GGUF's linear keys); None for per-frequency divisors
        (llama3: GGUF's ``rope_freqs.weight``) or none.
    """
    if not factors or any(f != factors[0] for f in factors):
        return None
    return float(factors[0])


def _longrope_original(cfg: dict, params: dict) -> int:
    """LongRoPE's ``original_max_position_embeddings``: the top level's, else the object's (the
    order of transformers' ``standardize_rope_params``)."""
    original = cfg.get("original_max_position_embeddings")
    if original is None:
        original = params.get("original_max_position_embeddings")
    if type(original) is not int or original <= 0:
        raise ValueError("LongRoPE scaling needs original_max_position_embeddings, a positive "
                         f"int, got {original!r}")
    return original


def rope_attention_factor(cfg: dict) -> float | None:
    """Return the factor RoPE's cos and sin are multiplied by, or None for none.

    Parameters
    ----------
    cfg : dict
        The parsed ``config.json``.

    Returns
    -------
    float or None
        For ``"longrope"``: its ``attention_factor``, else transformers' default from
        ``factor`` (else ``max_position_embeddings / original_max_position_embeddings``): 1 up
        to 1, else ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))``. Other
        types: None.

    Raises
    ------
    ValueError
        A factor or length that is not a positive number (named).
    """
    kind, params = _rope_parameters(cfg)
    if kind != "longrope":
        return None
    if params.get("attention_factor") is not None:
        return positive_number(params["attention_factor"], "LongRoPE's attention_factor")
    original = _longrope_original(cfg, params)
    factor = params.get("factor")
    if factor is None:
        factor = positive_number(cfg.get("max_position_embeddings"),
                                 "max_position_embeddings") / original
    factor = positive_number(factor, "LongRoPE's factor")
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_context(cfg: dict, context: int) -> int:
    """Return the most positions the RoPE settings serve.

    Parameters
    ----------
    cfg : dict
        The parsed ``config.json``.
    context : int
        The model's own (``max_position_embeddings``).

    Returns
    -------
    int
        LongRoPE's ``original_max_position_embeddings`` (its short factors'; at most
        ``context``), else ``context``.

    Raises
    ------
    ValueError
        A LongRoPE scaling without a positive int original length.
    """
    kind, params = _rope_parameters(cfg)
    return min(_longrope_original(cfg, params), context) if kind == "longrope" else context


def partial_rotary_factor(cfg: dict) -> float:
    """Return the share of each head RoPE turns: ``partial_rotary_factor`` of the RoPE object
    in use, else of the top level; absent or null: 1 (as transformers).

    Raises
    ------
    ValueError
        A value that is not a positive finite number.
    """
    _, params = _rope_parameters(cfg)
    value = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    return 1.0 if value is None else positive_number(value, "partial_rotary_factor")


def nope_layers(cfg: dict, n_layers: int) -> tuple[int, ...] | None:
    """Return the layers of a ``SmolLM3ForCausalLM`` ``config.json`` that RoPE does not turn.

    Parameters
    ----------
    cfg : dict
        The parsed ``config.json`` (another architecture's has none: None).
    n_layers : int
        ``num_hidden_layers``: ``no_rope_layers`` must have one entry a layer.

    Returns
    -------
    tuple of int or None
        The indices whose ``no_rope_layers`` entry is 0 (1: RoPE turns the layer), else, as
        transformers' default, every ``no_rope_layer_interval``-th (default 4) counted from 1;
        None when there are none.

    Raises
    ------
    ValueError
        A ``no_rope_layers`` that is not one 0 or 1 a layer, or an interval that is not a
        positive int (named).
    """
    if "SmolLM3ForCausalLM" not in (cfg.get("architectures") or ()):
        return None
    flags = cfg.get("no_rope_layers")
    if flags is None:
        step = cfg.get("no_rope_layer_interval", 4)
        if type(step) is not int or step <= 0:
            raise ValueError(f"no_rope_layer_interval must be a positive int, got {step!r}")
        flags = [int((i + 1) % step != 0) for i in range(n_layers)]
    if (not isinstance(flags, list) or len(flags) != n_layers
            or any(type(f) is not int or f not in (0, 1) for f in flags)):
        raise ValueError(f"no_rope_layers must be a list of {n_layers} zeros and ones (1: RoPE "
                         f"turns the layer), got {flags!r}")
    return tuple(i for i, f in enumerate(flags) if f == 0) or None
