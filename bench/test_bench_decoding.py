"""End-to-end decoding benchmarks.

Run: ``pytest bench/test_bench_decoding.py --benchmark-only [--benchmark-json out.json]``.

- ``toy-48``: the seed experiment — toy target (2 layers) and draft (1 layer), float64,
  48 new tokens after the 8-token prefix: full-prefix recompute vs KV-cached vanilla vs
  speculative (gamma 4, draft model; and the n-gram drafter), on each backend. With seed 69
  the random 1-layer draft almost never agrees with the target (tau ~1.02), so this case
  measures the cost of wasted drafting; ``extra_info`` shows it.
- ``tiny-llama-256``: ``ModelConfig.tiny_llama()`` target with a 1-layer draft of the same
  width, 256 new tokens, vanilla vs each drafter, on each backend.

Every case stores its workload counters (target calls and positions, tau) in ``extra_info``
so that a speedup can be explained; ``test_toy_cached_backend_ratio`` records the
Cython/NumPy ratio of cached vanilla decoding measured in one run (target: >= 20x).
"""
import time

import numpy as np
import pytest

import fastspec as fs

PREFIX = [0, 1, 3, 2, 4, 1, 5, 6]
BACKENDS = fs.available_backends()
LLAMA_PROMPT = list(b"the cat sat on the mat. the cat sat on the hat. the cat ")


@pytest.fixture
def use_backend(request):
    with fs.using_backend(request.param):
        yield request.param


def toy_models():
    target = fs.Transformer.random(fs.ModelConfig.toy(n_layers=2, dtype="float64"), 69)
    draft = fs.Transformer.random(fs.ModelConfig.toy(n_layers=1, dtype="float64"), 69)
    return target, draft


def record(benchmark, result):
    s = result.stats
    benchmark.extra_info.update(
        backend=fs.backend(), new_tokens=s.new_tokens, rounds=s.rounds,
        target_calls=s.target_calls, target_positions=s.target_positions,
        target_score_cells=s.target_score_cells, draft_calls=s.draft_calls,
        draft_positions=s.draft_positions, tau=s.mean_accepted_length,
        acceptance_rate=s.acceptance_rate)


@pytest.mark.benchmark(group="toy-48")
@pytest.mark.parametrize("use_backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("mode", ["full_prefix", "cached", "speculative_g4",
                                  "speculative_ngram_g4"])
def test_toy_48(benchmark, use_backend, mode):
    target, draft = toy_models()
    cache = target.new_cache()
    if mode == "full_prefix":
        run = lambda: fs.generate(target, PREFIX, 48, use_cache=False)  # noqa: E731
    elif mode == "cached":
        run = lambda: fs.generate(target, PREFIX, 48, cache=cache)  # noqa: E731
    else:
        drafter = fs.NgramDrafter() if "ngram" in mode else fs.DraftModelDrafter(draft)
        run = lambda: fs.speculative_generate(target, drafter, PREFIX, 48,  # noqa: E731
                                              gamma=4, cache=cache)
    expected = fs.generate(target, PREFIX, 48, use_cache=False).tokens
    result = benchmark(run)
    assert result.tokens == expected
    record(benchmark, result)


@pytest.mark.benchmark(group="tiny-llama-256")
@pytest.mark.parametrize("use_backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("mode", ["vanilla", "draft_model_g4", "ngram_g4"])
def test_tiny_llama_256(benchmark, use_backend, mode):
    cfg = fs.ModelConfig.tiny_llama()
    target = fs.Transformer.random(cfg, 0)
    cache = target.new_cache()
    if mode == "vanilla":
        run = lambda: fs.generate(target, LLAMA_PROMPT, 256, cache=cache)  # noqa: E731
    else:
        if mode.startswith("draft_model"):
            drafter = fs.DraftModelDrafter(fs.Transformer.random(cfg.replace(n_layers=1), 0))
        else:
            drafter = fs.NgramDrafter(max_ngram=3)
        run = lambda: fs.speculative_generate(target, drafter, LLAMA_PROMPT, 256,  # noqa: E731
                                              gamma=4, cache=cache)
    result = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert len(result.tokens) == 256
    record(benchmark, result)


def _median_seconds(fn, repeats):
    fn()  # warm-up, excluded
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@pytest.mark.benchmark(group="toy-48-ratio")
def test_toy_cached_backend_ratio(benchmark):
    """Cython / NumPy speed ratio of cached vanilla toy decoding, measured in one run."""
    if "cython" not in BACKENDS:
        pytest.skip("the Cython backend is not built")
    target, _ = toy_models()
    cache = target.new_cache()
    per_token = {}
    for name in ("numpy", "cython"):
        with fs.using_backend(name):
            per_token[name] = _median_seconds(
                lambda: fs.generate(target, PREFIX, 48, cache=cache), 7) / 48
    with fs.using_backend("cython"):
        benchmark(lambda: fs.generate(target, PREFIX, 48, cache=cache))
    ratio = per_token["numpy"] / per_token["cython"]
    benchmark.extra_info.update(numpy_us_per_token=per_token["numpy"] * 1e6,
                                cython_us_per_token=per_token["cython"] * 1e6,
                                cython_speedup=ratio, target_speedup=20.0)
    print(f"\ntoy cached decoding: numpy {per_token['numpy'] * 1e6:.1f} us/token, "
          f"cython {per_token['cython'] * 1e6:.1f} us/token, ratio {ratio:.1f}x (target 20x)")
