"""kernels.probs at a real vocabulary (Qwen's 151936): top-k by selection, not a full sort.

The Cython kernel keeps the k largest in a heap for k <= V/64 and uses a quickselect above;
the NumPy twin uses np.partition and orders only the kept tokens for top-p. Both must keep
exactly the tokens of the full-sort definition (ties at the k-th value kept).
"""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import _reference

from _helpers import RTOL

V = 151936


@pytest.fixture
def kern(backend):
    """The kernel module of the backend under test."""
    return fs.kernels.module(backend)


def _full_sort_support(row, temperature, top_k, top_p):
    """The definition, with full sorts: the kept set of probs(row, ...)."""
    z = row.astype(np.float64) / temperature
    keep = z >= np.sort(z)[len(z) - top_k] if top_k else np.ones(len(z), dtype=bool)
    e = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p = e / e.sum()
    if top_p < 1.0:
        order = np.lexsort((np.arange(len(z)), -p))
        before = np.concatenate(([0.0], np.cumsum(p[order])[:-1]))
        nucleus = np.zeros(len(z), dtype=bool)
        nucleus[order] = (before < top_p) & keep[order]
        keep = nucleus
    return keep


@pytest.mark.parametrize("top_k", [1, 2, 50, 2374, 2375, 40000, V - 1])  # heap: k * 64 <= V
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_top_k_at_151936_matches_the_full_sort(kern, dtype, top_k, top_p):
    rng = np.random.default_rng(top_k)
    # Quantised logits: many ties, also at the k-th value.
    logits = np.round(4 * rng.standard_normal((2, V))).astype(dtype)
    logits[1] = (3 * rng.standard_normal(V)).astype(dtype)
    logits[1, ::7] = np.sort(logits[1, ::7])  # long increasing runs: the heap's worst case
    got = kern.probs(logits, 0.8, top_k, top_p)
    twin = _reference.probs(logits, 0.8, top_k, top_p)
    for r in range(2):
        want = _full_sort_support(logits[r], 0.8, top_k, top_p)
        np.testing.assert_array_equal(got[r] > 0, want)
        np.testing.assert_array_equal(twin[r] > 0, want)
    np.testing.assert_allclose(got, twin, rtol=RTOL[dtype], atol=RTOL[dtype] * 1e-3)
    if top_p == 1.0:
        assert (got[0] > 0).sum() >= top_k
