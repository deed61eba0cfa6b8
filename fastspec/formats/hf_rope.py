"""RoPE settings of a Hugging Face ``config.json``: the base and Llama 3.1+'s llama3 scaling.

transformers 5 writes them under ``rope_parameters`` (``rope_theta`` included), earlier versions
as ``rope_theta`` and ``rope_scaling``; both are read. Default RoPE and ``rope_type="llama3"``
(as per-frequency divisors, :func:`~fastspec.model.functional.llama3_freq_factors`) run; any
other type is a ValueError naming it.
"""
from __future__ import annotations

from fastspec.model.functional import llama3_freq_factors

__all__ = ["rope_theta", "rope_freq_factors"]


def _rope_scaling(cfg: dict) -> tuple[str, dict]:
    """Return the RoPE type of a ``config.json`` and the dict holding its parameters
    (``rope_parameters`` in transformers 5, ``rope_scaling`` before)."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ValueError("rope_parameters and rope_scaling must be JSON objects")
    kind = (params.get("rope_type") or params.get("type") or scaling.get("rope_type")
            or scaling.get("type") or "default")
    return kind, (params if params.get("rope_type") or params.get("type") else scaling)


def rope_theta(cfg: dict, scalings: tuple[str, ...] = ("default",)) -> float:
    """Return the RoPE base of a Hugging Face ``config.json``.

    Raises
    ------
    ValueError
        A RoPE type not in ``scalings`` (default RoPE only unless told).
    """
    kind, _ = _rope_scaling(cfg)
    if kind not in scalings:
        raise ValueError(f"unsupported rope scaling {kind!r} (implemented: "
                         f"{', '.join(scalings)})")
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


def rope_freq_factors(cfg: dict, head_dim: int) -> tuple[float, ...] | None:
    """Return the per-frequency RoPE divisors of a ``config.json`` (``rope_type`` ``"llama3"``:
    :func:`~fastspec.model.functional.llama3_freq_factors`), or None for default RoPE.

    Raises
    ------
    ValueError
        Another RoPE type, or a missing or invalid llama3 parameter (named).
    """
    theta = rope_theta(cfg, ("default", "llama3"))
    kind, params = _rope_scaling(cfg)
    if kind == "default":
        return None
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in params]
    if missing:  # transformers requires all four too
        raise ValueError(f"llama3 RoPE scaling needs {missing}")
    return llama3_freq_factors(head_dim, theta, **{k: params[k] for k in keys})
