"""Goodness-of-fit statistics of the distribution audits (no SciPy)."""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

__all__ = ["chi_square_sf", "chi_square_test", "total_variation", "chi_square_expected"]


def chi_square_sf(statistic: float, df: int) -> float:
    """Upper tail P(X >= statistic) of a chi-square with ``df`` degrees of freedom.

    Wilson-Hilferty cube-root normal approximation (accurate to about 1e-3 absolute for
    df >= 10, which is what the audit uses; exact for df == 1, 2 via closed forms).
    """
    if df <= 0:
        return 1.0
    if statistic <= 0:
        return 1.0
    if df == 1:
        return math.erfc(math.sqrt(statistic / 2.0))
    if df == 2:
        return math.exp(-statistic / 2.0)
    k = float(df)
    z = ((statistic / k) ** (1.0 / 3.0) - (1.0 - 2.0 / (9.0 * k))) / math.sqrt(2.0 / (9.0 * k))
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def chi_square_test(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> dict:
    """Pearson chi-square goodness of fit of ``counts`` to ``probs``.

    Cells whose expected count is below ``min_expected`` are pooled into one cell (kept only
    if the pool itself reaches ``min_expected``; otherwise merged into the smallest kept
    cell). Zero-probability cells are excluded and reported separately: any count there is an
    impossible outcome.

    Returns
    -------
    dict
        ``statistic, df, p_value, cells, pooled_cells, impossible_count, tv``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    total = counts.sum()
    possible = probs > 0
    impossible = int(counts[~possible].sum())
    expected = probs * total
    big = possible & (expected >= min_expected)
    small = possible & ~big
    obs = list(counts[big])
    exp = list(expected[big])
    pooled = int(small.sum())
    if pooled:
        o, e = counts[small].sum(), expected[small].sum()
        if e >= min_expected or not exp:
            obs.append(o)
            exp.append(e)
        else:
            j = int(np.argmin(exp))
            obs[j] += o
            exp[j] += e
    obs_a, exp_a = np.array(obs), np.array(exp)
    statistic = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    df = len(obs) - 1
    tv = float(0.5 * np.abs(counts / total - probs).sum()) if total else 0.0
    return dict(statistic=statistic, df=df, p_value=chi_square_sf(statistic, df),
                cells=len(obs), pooled_cells=pooled, impossible_count=impossible, tv=tv)


def total_variation(a: Mapping, b: Mapping) -> float:
    """Return ``0.5 * sum |a - b|`` over the union of supports of two laws (dicts)."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def chi_square_expected(truth: Mapping, other: Mapping, n_samples: int) -> float:
    """Expected Pearson statistic ``n * sum (o - t)^2 / t`` of ``n`` samples from ``other``."""
    return n_samples * sum((other.get(k, 0.0) - t) ** 2 / t for k, t in truth.items() if t > 0) + \
        (np.inf if any(v > 0 and truth.get(k, 0.0) == 0 for k, v in other.items()) else 0.0)
