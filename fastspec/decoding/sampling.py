"""SamplingParams and the next-token pick: how the target's distribution is formed and drawn.

The distribution is always ``kernels.probs(logits, temperature, top_k, top_p)`` (temperature
-> top-k -> top-p); temperature 0 is argmax. Every loop and drafter that samples goes through
these two names, so the speculative and vanilla paths draw from the same law.
"""
from __future__ import annotations

import numpy as np

from fastspec import kernels
from fastspec.drafters.base import SamplingParams

__all__ = ["SamplingParams", "next_token"]


def next_token(logits_row: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the token after one position: argmax, or one inverse-CDF draw from p.

    Parameters
    ----------
    logits_row : ndarray of shape (1, V)
    sampling : SamplingParams
    rng : numpy.random.Generator
        Supplies one uniform when sampling (none at temperature 0).

    Returns
    -------
    int
    """
    if sampling.temperature == 0.0:
        return int(logits_row[0].argmax())
    p = kernels.probs(logits_row, sampling.temperature, sampling.top_k, sampling.top_p)
    return int(kernels.sample(p[0], rng.random()))
