"""Threads: the compiled kernels release the GIL, separate models/caches decode in parallel
exactly as in series, and one cache shared by two threads at once is refused."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import fastspec as fs


def _progress_during(work) -> int:
    """Run ``work()`` in a thread; return how often this thread advanced while ``work`` ran.

    The switch interval is raised to 100 s so that the interpreter never hands the GIL over on
    its own: the worker can only let this thread run by releasing the GIL (a ``nogil`` block) or
    by blocking. The worker reads the progress counter right before and right after ``work``
    (no blocking call in between), so a non-zero difference means this thread ran while
    ``work`` executed, i.e. ``work`` released the GIL.
    """
    progress = [0]
    result = {}

    def worker():
        before = progress[0]
        work()
        result["delta"] = progress[0] - before

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        t = threading.Thread(target=worker)
        t.start()
        while t.is_alive():
            progress[0] += 1
            time.sleep(0)  # lets the worker (re)take the GIL when it wants it
        t.join()
    finally:
        sys.setswitchinterval(old)
    return result["delta"]


def _long_attention():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((64, 8, 64)).astype(np.float32)
    k = rng.standard_normal((2, 4096, 64)).astype(np.float32)
    v = rng.standard_normal((2, 4096, 64)).astype(np.float32)
    out = np.empty_like(q)
    kernels = fs.kernels.module("cython")
    return lambda: [kernels.attention(q, k, v, 4096, False, out) for _ in range(3)]


@pytest.mark.skipif("cython" not in fs.available_backends(), reason="no compiled backend")
def test_attention_kernel_releases_the_gil():
    assert _progress_during(_long_attention()) > 0


@pytest.mark.skipif("cython" not in fs.available_backends(), reason="no compiled backend")
def test_probs_kernel_releases_the_gil():
    logits = np.random.default_rng(1).standard_normal((16, 200_000)).astype(np.float32)
    kernels = fs.kernels.module("cython")
    assert _progress_during(lambda: kernels.probs(logits, 0.8, 0, 0.9)) > 0


@pytest.mark.skipif("cython" not in fs.available_backends(), reason="no compiled backend")
def test_fused_model_forward_releases_the_gil():
    model = fs.Transformer.random(fs.ModelConfig.tiny_llama(max_seq_len=512), seed=0)
    ids = np.arange(512) % 260
    with fs.using_backend("cython"):
        model.forward(ids[:4])  # build the fused runner outside the measured call
        assert _progress_during(lambda: model.forward(ids)) > 0


def test_the_guard_detects_a_kernel_that_holds_the_gil():
    """Negative control of the measurement: pure Python work never lets the other thread run."""
    def busy():
        total = 0
        for i in range(300_000):
            total += i
        return total
    assert _progress_during(busy) == 0


# --- parallel decoding on separate models and caches ---------------------------------------

def _config():
    return fs.ModelConfig(vocab_size=60, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                          ffn_dim=64, max_seq_len=128)


def _jobs(seed):
    """Independent (model, drafter) pairs and the calls each thread makes on its own pair."""
    target = fs.Transformer.random(_config(), seed=seed)
    draft = fs.Transformer.random(_config().replace(n_layers=1), seed=seed + 100)
    dflash = fs.DFlashDrafter(fs.DFlashModel.random(fs.DFlashConfig(block_size=4), target,
                                                    seed=seed + 200))
    calls = []
    for i in range(4):
        prompt = [(seed * 7 + i * 3 + j) % 60 for j in range(5)]
        calls.append(lambda p=prompt, i=i: fs.speculative_generate(
            target, fs.DraftModelDrafter(draft) if i % 2 else dflash, p, 24, gamma=3,
            temperature=0.0 if i < 2 else 0.9, top_p=0.95, seed=i).tokens)
        calls.append(lambda p=prompt, i=i: fs.generate(target, p, 12, temperature=0.7,
                                                       seed=i).tokens)
    return calls


def test_two_threads_on_separate_models_match_serial(backend):
    serial = [[call() for call in _jobs(seed)] for seed in (1, 2)]
    jobs = [_jobs(seed) for seed in (1, 2)]
    results = [None, None]
    errors = []

    def run(slot):
        try:
            results[slot] = [call() for _ in range(3) for call in jobs[slot]][-len(jobs[slot]):]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == serial


# --- one cache, two threads ----------------------------------------------------------------

def test_a_cache_in_use_by_another_thread_is_refused(backend):
    cfg = _config()
    target = fs.Transformer.random(cfg, seed=3)
    other = fs.Transformer.random(cfg, seed=3)  # same weights, its own fused runner
    drafter = fs.DraftModelDrafter(fs.Transformer.random(cfg.replace(n_layers=1), seed=4))
    want = fs.speculative_generate(target, drafter, [1, 2, 3], 16, gamma=3).tokens
    cache = target.new_cache()
    inside, go = threading.Event(), threading.Event()
    got = {}

    def hold(seq, n):  # called by the decoding loop after each round, with the cache held
        inside.set()
        go.wait(30)

    def run():
        got["tokens"] = fs.speculative_generate(target, drafter, [1, 2, 3], 16, gamma=3,
                                                cache=cache, callback=hold).tokens

    t = threading.Thread(target=run)
    t.start()
    try:
        assert inside.wait(30)
        length = cache.length
        with pytest.raises(RuntimeError, match="KVCache is in use by another thread"):
            other.forward([1, 2], cache)
        with pytest.raises(RuntimeError, match="KVCache is in use by another thread"):
            fs.speculative_generate(other, drafter, [4, 5], 4, cache=cache)
        with pytest.raises(RuntimeError, match="KVCache is in use by another thread"):
            fs.generate(other, [4, 5], 4, cache=cache)
        with pytest.raises(RuntimeError, match="KVCache is in use by another thread"):
            other.forward_embeddings(np.zeros((1, cfg.dim), np.float32), cache)
        assert cache.length == length
    finally:
        go.set()
        t.join()
    assert got["tokens"] == want
    # Released afterwards: this thread may use it now.
    assert fs.speculative_generate(other, drafter, [1, 2, 3], 16, gamma=3, cache=cache).tokens == want


def test_hammering_one_cache_from_two_threads_loses_nothing(backend):
    """Two threads forwarding into one cache: each call either runs whole or is refused, so
    the cache ends with exactly 2 positions per successful call."""
    cfg = _config()
    models = [fs.Transformer.random(cfg, seed=5) for _ in range(2)]
    cache = models[0].new_cache()
    outcomes = {"ok": 0, "refused": 0, "full": 0}
    errors = []
    lock = threading.Lock()

    def run(model):
        for _ in range(150):
            try:
                model.forward([1, 2], cache)
                key = "ok"
            except RuntimeError as exc:
                key = "refused" if "in use by another thread" in str(exc) else "error"
            except ValueError as exc:
                key = "full" if "capacity" in str(exc) else "error"
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)
                return
            with lock:
                outcomes[key] = outcomes.get(key, 0) + 1

    threads = [threading.Thread(target=run, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert "error" not in outcomes, outcomes
    assert sum(outcomes.values()) == 300
    assert cache.length == 2 * outcomes["ok"] == cache.capacity
