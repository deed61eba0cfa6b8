"""Memory: resident set size stays flat over many decoding calls and failing kernel calls, and a
run to max_seq_len needs memory bounded by the cache capacity.

RSS is read from /proc/self/statm (Linux only). Figures are printed (``pytest -s``) for
docs/RELIABILITY.md.
"""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import fastspec as fs

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                                reason="RSS is read from /proc/self/statm (Linux)")

MB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Calls per backend in the default run (the NumPy twin is ~10x slower); the slow variant
#: does 10,000 on every backend.
CALLS = {"cython": 10_000, "numpy": 500}


def rss() -> int:
    """Resident set size of this process in bytes."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _toy_pair():
    target = fs.Transformer.random(fs.ModelConfig.toy(vocab_size=8, max_seq_len=64), seed=0)
    draft = fs.Transformer.random(fs.ModelConfig.toy(vocab_size=8, n_layers=1, max_seq_len=64),
                                  seed=1)
    return target, draft


def _decode_calls(n: int, target, draft) -> None:
    """``n`` speculative_generate calls of 8 new tokens, cycling drafters, settings and caches."""
    cache = target.new_cache()
    drafters = [fs.DraftModelDrafter(draft), fs.NgramDrafter()]
    for i in range(n):
        fs.speculative_generate(target, drafters[i % 2], [1 + i % 5, 2, 3], 8,
                                gamma=3 if i % 3 else "adaptive",
                                temperature=0.0 if i % 4 == 0 else 0.8, top_k=i % 3,
                                top_p=0.9 if i % 5 == 0 else 1.0, seed=i,
                                cache=cache if i % 2 else None)


def _flat_over_calls(backend, calls):
    target, draft = _toy_pair()
    _decode_calls(300, target, draft)  # warm-up: runners, scratch, allocator pools
    before = rss()
    _decode_calls(calls, target, draft)
    growth = rss() - before
    print(f"\n[memory] {backend}: {calls} speculative_generate calls, RSS {before / MB:.1f} MB, "
          f"growth {growth / MB:+.3f} MB")
    assert growth < 5 * MB


def test_rss_flat_over_many_speculative_calls(backend):
    _flat_over_calls(backend, CALLS[backend])


@pytest.mark.slow
def test_rss_flat_over_10k_speculative_calls_slow(backend):
    _flat_over_calls(backend, 10_000)


def test_long_run_memory_is_bounded_by_the_cache(backend):
    """Decode to max_seq_len: RSS grows by at most the caches' bytes (+ slack), and a second
    run over the same caches does not grow at all."""
    max_seq_len = 2048 if backend == "cython" else 768
    cfg = fs.ModelConfig(vocab_size=64, dim=64, n_layers=4, n_heads=4, ffn_dim=128,
                         max_seq_len=max_seq_len)
    target = fs.Transformer.random(cfg, seed=0)
    cache = target.new_cache()
    drafter = fs.NgramDrafter()
    fs.speculative_generate(target, drafter, [1, 2, 3], 8, cache=cache)  # warm-up
    before = rss()
    out = fs.speculative_generate(target, drafter, [1, 2, 3, 4], max_seq_len - 4, gamma=4,
                                  cache=cache)
    first = rss() - before
    assert len(out.tokens) == max_seq_len - 4
    fs.speculative_generate(target, drafter, [1, 2, 3, 4], max_seq_len - 4, gamma=4,
                            cache=cache)
    second = rss() - before - first
    print(f"\n[memory] {backend}: run to max_seq_len {max_seq_len}: cache {cache.nbytes / MB:.2f}"
          f" MB, RSS growth {first / MB:+.3f} MB, second run {second / MB:+.3f} MB")
    assert first < cache.nbytes + 4 * MB
    assert second < 1 * MB


def _failing_calls(backend):
    """Calls that each fail a different check (kernels, model, decoding)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 64, 8)).astype(np.float32)
    logits = np.zeros((4, 5000), np.float32)
    logits[2, 7] = np.nan
    p = np.full((3, 1000), 1e-3, np.float32)
    p[2, 0] = -1.0
    big = np.ones((8, 2, 8), np.float32)
    target, draft = _toy_pair()
    cache = target.new_cache()
    drafter = fs.DraftModelDrafter(draft)
    km = fs.kernels.module(backend)
    return [
        lambda: km.attention(q, k, k, 65, True),
        lambda: km.attention(q.astype(np.float64), k, k, 10, True),
        lambda: km.attention(q, k, k[:, :32], 10, True),
        lambda: km.cache_write(k, big, 60),
        lambda: km.probs(logits, 1.0, 0, 1.0),
        lambda: km.probs(logits[:2], 1.0, 0, 1.5),
        lambda: km.sample(np.array([0.5, -0.6]), 0.3),
        lambda: km.verify_rejection(np.array([0, 1]), p, p[:2], np.array([0.1, 0.2, 0.3])),
        lambda: km.verify_greedy(np.array([0, 9999]), logits[:3]),
        lambda: target.forward([1, 99], cache),
        lambda: target.forward([1] * 65, cache),
        lambda: fs.speculative_generate(target, drafter, [1, 2], 8, gamma=0, cache=cache),
        lambda: fs.generate(target, [1, 2], 8, top_p=2.0),
    ]


def test_failing_calls_do_not_leak(backend):
    calls = _failing_calls(backend)
    rounds = 2000 if backend == "cython" else 400

    def hammer(n):
        for _ in range(n):
            for call in calls:
                try:
                    call()
                except (TypeError, ValueError):
                    pass
                else:  # pragma: no cover
                    raise AssertionError("a bad call was accepted")

    hammer(100)
    before = rss()
    hammer(rounds)
    growth = rss() - before
    print(f"\n[memory] {backend}: {rounds * len(calls)} failing calls, RSS growth "
          f"{growth / MB:+.3f} MB")
    assert growth < 2 * MB
