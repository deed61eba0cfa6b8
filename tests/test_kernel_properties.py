"""Hypothesis property tests: random shapes and data, compiled kernels against the twin and the
twin against independent formulas. A few examples by default; the `slow` copies run 500."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import strategies as st

import fastspec as fs
from fastspec.kernels import _reference

from _helpers import (BACKENDS, DTYPES, RTOL, assert_close_rel, fast_and_slow, naive_attention,
                      naive_probs_row, random_rows)

FAST_EXAMPLES = 15


def kernel_property(**strategies):
    """A quick per-backend property test and a `slow` copy (see _helpers.fast_and_slow)."""
    return fast_and_slow(FAST_EXAMPLES, backends=BACKENDS, suppress=(HealthCheck.too_slow,),
                         **strategies)


@pytest.fixture(autouse=True)
def _slow_only_on_request(request):
    """The 500-example copies run only when asked for (-m slow, or FASTSPEC_SLOW=1)."""
    if (request.node.get_closest_marker("slow")
            and "slow" not in (request.config.getoption("markexpr") or "")
            and not os.environ.get("FASTSPEC_SLOW")):
        pytest.skip("slow property test: select with -m slow or FASTSPEC_SLOW=1")


seeds = st.integers(0, 2**32 - 1)
dtypes = st.sampled_from(DTYPES)


def _attention_property(backend, seed, dtype, n, length_extra, capacity_extra, n_kv, group,
                        head_dim, causal):
    rng = np.random.default_rng(seed)
    length = n + length_extra
    capacity = length + capacity_extra
    n_heads = n_kv * group
    q = rng.standard_normal((n, n_heads, head_dim)).astype(dtype)
    k = (2 * rng.standard_normal((n_kv, capacity, head_dim))).astype(dtype)
    v = rng.standard_normal((n_kv, capacity, head_dim)).astype(dtype)
    got = fs.kernels.module(backend).attention(q, k, v, length, causal)
    assert_close_rel(got, naive_attention(q, k, v, length, causal), RTOL[dtype])


test_attention_property, test_attention_property_slow = kernel_property(
    seed=seeds, dtype=dtypes, n=st.integers(1, 9), length_extra=st.integers(0, 40),
    capacity_extra=st.integers(0, 5), n_kv=st.integers(1, 3), group=st.integers(1, 3),
    head_dim=st.sampled_from([1, 3, 7, 8, 16, 32, 33, 64]), causal=st.booleans(),
)(_attention_property)


def _probs_property(backend, seed, dtype, rows, vocab, scale, temperature, top_k, top_p, ties):
    rng = np.random.default_rng(seed)
    logits = scale * rng.standard_normal((rows, vocab))
    if ties:  # coarse logits: many exact ties at the top-k and top-p boundaries
        logits = np.round(logits)
    logits = logits.astype(dtype)
    got = fs.kernels.module(backend).probs(logits, temperature, top_k, top_p)
    twin = _reference.probs(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(got > 0, twin > 0)
    np.testing.assert_allclose(got, twin, rtol=RTOL[dtype], atol=1e-12)
    np.testing.assert_allclose(got.sum(axis=1, dtype=np.float64), 1, rtol=1e-5)
    for r in range(rows):
        expected = naive_probs_row(logits[r], temperature, top_k, top_p)
        np.testing.assert_array_equal(twin[r] > 0, expected > 0)
        np.testing.assert_allclose(twin[r], expected, rtol=RTOL[dtype], atol=1e-12)


test_probs_property, test_probs_property_slow = kernel_property(
    seed=seeds, dtype=dtypes, rows=st.integers(1, 3), vocab=st.integers(1, 300),
    scale=st.sampled_from([0.1, 1.0, 5.0]),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]), top_k=st.integers(0, 20),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1, 1e-3]), ties=st.booleans(),
)(_probs_property)


def _verify_property(backend, seed, dtype, g, vocab, with_q, accept_scale):
    rng = np.random.default_rng(seed)
    kern = fs.kernels.module(backend)
    p = random_rows(rng, g + 1, vocab, dtype)
    q = random_rows(rng, g, vocab, dtype) if with_q else None
    if with_q:
        draft = np.array([rng.choice(vocab, p=q[i].astype(np.float64) / q[i].sum(dtype=np.float64))
                          for i in range(g)], dtype=np.int64)
    else:
        draft = rng.integers(0, vocab, g)
    uniforms = np.minimum(rng.random(g + 1) * np.r_[np.full(g, accept_scale), 1.0], 1 - 2**-53)
    got = kern.verify_rejection(draft, p, q, uniforms)
    assert got == _reference.verify_rejection(draft, p, q, uniforms)
    logits = np.log(p + 1e-30).astype(dtype)
    assert kern.verify_greedy(draft, logits) == _reference.verify_greedy(draft, logits)
    w = p[g]
    assert kern.sample(w, float(uniforms[g])) == _reference.sample(w, float(uniforms[g]))


test_verify_property, test_verify_property_slow = kernel_property(
    seed=seeds, dtype=dtypes, g=st.integers(0, 8), vocab=st.integers(1, 200),
    with_q=st.booleans(), accept_scale=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
)(_verify_property)


def _cache_write_property(backend, seed, dtype, n_kv, capacity, head_dim, n, start):
    rng = np.random.default_rng(seed)
    n = min(n, capacity)
    start = min(start, capacity - n)
    cache = rng.standard_normal((n_kv, capacity, head_dim)).astype(dtype)
    expected = cache.copy()
    new = rng.standard_normal((n, n_kv, head_dim)).astype(dtype)
    fs.kernels.module(backend).cache_write(cache, new, start)
    _reference.cache_write(expected, new, start)
    np.testing.assert_array_equal(cache, expected)


test_cache_write_property, test_cache_write_property_slow = kernel_property(
    seed=seeds, dtype=dtypes, n_kv=st.integers(1, 4), capacity=st.integers(1, 30),
    head_dim=st.integers(1, 20), n=st.integers(0, 30), start=st.integers(0, 30),
)(_cache_write_property)
