"""RoPE settings of a Hugging Face ``config.json``: the base, linear and llama3 scaling.

transformers 5 writes them under ``rope_parameters`` (``rope_theta`` included); earlier
versions wrote ``rope_theta`` and ``rope_scaling`` at the top level. Both are read as
transformers 5 reads them: a legacy ``rope_scaling`` object replaces ``rope_parameters``, and
the base is ``rope_theta`` inside the chosen object, else at the top level, else 10000.
Default RoPE, ``rope_type="linear"`` (positions divided by ``factor``: every frequency
divided by it, as transformers does) and ``"llama3"`` (per-frequency divisors,
:func:`~fastspec.model.functional.llama3_freq_factors`) run; any other type is a ValueError
naming it.
"""
from __future__ import annotations

from typing import Any

from fastspec.model.functional import llama3_freq_factors, positive_number

__all__ = ["rope_theta", "rope_freq_factors", "linear_factor", "SCALINGS"]

#: The RoPE types that run (:func:`rope_freq_factors` turns each into divisors or None).
SCALINGS = ("default", "linear", "llama3")

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
    return kind, params


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
        1); for ``"llama3"``: :func:`~fastspec.model.functional.llama3_freq_factors`.

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
