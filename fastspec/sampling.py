"""SamplingParams and the next-token pick: how the target's distribution is formed and drawn.

The distribution is always ``kernels.probs(logits, temperature, top_k, top_p)`` (temperature
-> top-k -> top-p); temperature 0 is argmax. Every loop and drafter that samples goes through
these two names, so the speculative and vanilla paths draw from the same law.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastspec import kernels

__all__ = ["SamplingParams", "next_token"]


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution is formed: temperature -> top-k -> top-p.

    ``temperature == 0`` is greedy decoding. Drafters that sample use the same settings.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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
