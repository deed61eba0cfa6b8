"""Model forward steps, Cython (fused runner) beside the NumPy backend.

Cases: one decode step (1 new token) at cache length 64 and 1024, and one 9-token verification
step at cache length 64, for the toy config and the tiny Llama (vocab 260, dim 256, 4 layers,
8 heads, ffn 704). Each group pairs the two backends. ``test_model_ratios`` measures the
targets' ratios in one run, interleaved, and records them in ``extra_info``:

- toy decode step: Cython >= 10x NumPy;
- tiny Llama decode step at cache length 64: Cython >= 3x NumPy;
- tiny Llama 9-token verification step <= 2x a 1-token decode step (Cython).

Run: ``pytest bench/test_bench_model.py --benchmark-only -s``.
"""
import time

import numpy as np
import pytest

import fastspec as fs
from fastspec.model import ModelConfig, Transformer

MODELS = {
    "toy": lambda: Transformer.random(ModelConfig.toy(max_seq_len=1024 + 16), seed=0),
    "tiny_llama": lambda: Transformer.random(ModelConfig.tiny_llama(), seed=0),
}
CASES = {"decode64": (64, 1), "decode1024": (1024, 1), "verify9": (64, 9)}
_cache = {}


def model(name):
    if name not in _cache:
        _cache[name] = MODELS[name]()
    return _cache[name]


def make_step(name, backend, case):
    """Return a callable running one step on ``backend`` (cache refilled, then cropped back)."""
    m = model(name)
    length, n = CASES[case]
    previous = fs.backend()
    fs.set_backend(backend)
    cache = m.new_cache(length + 16)
    m.forward(np.arange(length) % m.config.vocab_size, cache)
    fs.set_backend(previous)
    ids = (np.arange(n) * 7 + 3) % m.config.vocab_size

    def step():
        fs.set_backend(backend)
        m.forward(ids, cache)
        cache.crop(length)

    return step


@pytest.fixture
def restore_backend():
    previous = fs.backend()
    yield
    fs.set_backend(previous)


@pytest.mark.parametrize("backend", fs.available_backends())
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_step(benchmark, restore_backend, name, case, backend):
    benchmark.group = f"model-{name}-{case}"
    step = make_step(name, backend, case)
    step()  # builds the fused runner outside the timing
    benchmark(step)


def _median_time(fn, number=20, repeat=7):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return float(np.median(times))


@pytest.mark.skipif("cython" not in fs.available_backends(), reason="Cython extension not built")
def test_model_ratios(benchmark, restore_backend):
    """The three targets, measured interleaved in one run (medians of 3 rounds)."""
    benchmark.group = "model-ratios"
    steps = {(name, case, b): make_step(name, b, case)
             for name in MODELS for case in ("decode64", "verify9") for b in ("cython", "numpy")}
    for s in steps.values():
        s()
    rounds = {k: [] for k in steps}
    for _ in range(3):
        for k, s in steps.items():
            rounds[k].append(_median_time(s, number=5 if k[2] == "numpy" else 20))
    t = {k: float(np.median(v)) for k, v in rounds.items()}
    info = {f"{n}_{c}_{b}_us": v * 1e6 for (n, c, b), v in t.items()}
    info.update(
        toy_decode_speedup=t["toy", "decode64", "numpy"] / t["toy", "decode64", "cython"],
        llama_decode64_speedup=(t["tiny_llama", "decode64", "numpy"]
                                / t["tiny_llama", "decode64", "cython"]),
        llama_verify9_over_decode=(t["tiny_llama", "verify9", "cython"]
                                   / t["tiny_llama", "decode64", "cython"]),
        goals="toy_decode_speedup >= 10, llama_decode64_speedup >= 3, "
              "llama_verify9_over_decode <= 2",
    )
    benchmark.extra_info.update(info)
    print("\n" + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in info.items()))
    benchmark.pedantic(steps["tiny_llama", "decode64", "cython"], rounds=5, iterations=10)
