"""Model forward steps, Cython (fused runner) beside the NumPy backend.

Cases: one decode step (1 new token) at cache length 64 and 1024, and one 9-token verification
step at cache length 64, for the toy config and the tiny Llama (vocab 260, dim 256, 4 layers,
8 heads, ffn 704). Each group pairs the two backends. ``test_model_ratios`` measures the
targets' ratios in one run, interleaved, and records them in ``extra_info``:

- toy decode step: Cython >= 10x NumPy;
- tiny Llama decode step at cache length 64: Cython >= 3x NumPy;
- tiny Llama 9-token verification step <= 2x a 1-token decode step (Cython).

Weight storage (``ModelConfig.weight_dtype``): the embedded target (when installed) and the
tiny Llama with float16 (and bfloat16) matrices beside the same model in float32, Cython backend, one decode
step at cache length 300 and a 9-token verification step (groups ``weights-<model>-<case>``);
``test_weight_dtype_ratio`` records the interleaved f32/f16 time ratios (goal: float16 decode
step >= 1.3x faster for the embedded target; bandwidth bound, so it depends on the machine).

Run: ``pytest bench/test_bench_model.py --benchmark-only -s``.
"""

import numpy as np
import pytest

import fastspec as fs
from _timing import median_time
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
    with fs.using_backend(backend):
        cache = m.new_cache(length + 16)
        m.forward(np.arange(length) % m.config.vocab_size, cache)
    ids = (np.arange(n) * 7 + 3) % m.config.vocab_size

    def step():
        fs.set_backend(backend)
        m.forward(ids, cache)
        cache.crop(length)

    return step


@pytest.fixture
def restore_backend():
    with fs.using_backend(fs.backend()):  # the steps switch backends; restore the caller's
        yield


@pytest.mark.parametrize("backend", fs.available_backends())
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_step(benchmark, restore_backend, name, case, backend):
    benchmark.group = f"model-{name}-{case}"
    step = make_step(name, backend, case)
    step()  # builds the fused runner outside the timing
    benchmark(step)


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
            rounds[k].append(median_time(s, number=5 if k[2] == "numpy" else 20))
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


# --- float16 weight storage -----------------------------------------------------------------

def _weight_models():
    out = {"tiny_llama": lambda: Transformer.random(ModelConfig.tiny_llama(), seed=0)}
    if fs.pretrained.available():
        out["embedded"] = lambda: fs.pretrained.load(weight_dtype="float32").target
    return out


WEIGHT_MODELS = _weight_models()
WEIGHT_CASES = {"decode300": (300, 1), "verify9": (300, 9)}
_wcache = {}


def make_weight_step(name, weight_dtype, case):
    """Return a callable running one Cython step of ``name`` stored in ``weight_dtype``."""
    key = (name, weight_dtype)
    if key not in _wcache:
        _wcache[key] = WEIGHT_MODELS[name]().with_weight_dtype(weight_dtype)
    m = _wcache[key]
    length, n = WEIGHT_CASES[case]
    fs.set_backend("cython")
    cache = m.new_cache(length + 16)
    m.forward(np.arange(length) % m.config.vocab_size, cache)
    ids = (np.arange(n) * 7 + 3) % m.config.vocab_size
    out = np.empty((n, m.config.vocab_size), dtype=np.float32)

    def step():
        m.forward(ids, cache, out=out)
        cache.crop(length)

    step()  # builds the fused runner outside the timing
    return step


needs_cython = pytest.mark.skipif("cython" not in fs.available_backends(),
                                  reason="Cython extension not built")


@needs_cython
@pytest.mark.parametrize("weight_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(WEIGHT_CASES))
@pytest.mark.parametrize("name", sorted(WEIGHT_MODELS))
def test_weight_dtype_step(benchmark, restore_backend, name, case, weight_dtype):
    benchmark.group = f"weights-{name}-{case}"
    benchmark(make_weight_step(name, weight_dtype, case))


@needs_cython
def test_weight_dtype_ratio(benchmark, restore_backend):
    """float32 / float16 step time per model and case, interleaved (medians of 5 rounds)."""
    benchmark.group = "weights-ratio"
    steps = {(n, c, w): make_weight_step(n, w, c)
             for n in WEIGHT_MODELS for c in WEIGHT_CASES for w in ("float32", "float16")}
    rounds = {k: [] for k in steps}
    for _ in range(5):
        for k, s in steps.items():
            rounds[k].append(median_time(s, number=50))
    t = {k: float(np.median(v)) for k, v in rounds.items()}
    info = {f"{n}_{c}_{w}_us": v * 1e6 for (n, c, w), v in t.items()}
    for n in WEIGHT_MODELS:
        for c in WEIGHT_CASES:
            info[f"{n}_{c}_f32_over_f16"] = t[n, c, "float32"] / t[n, c, "float16"]
    benchmark.extra_info.update(info)
    print("\n" + ", ".join(f"{k}={v:.3g}" for k, v in info.items()))
    name = "embedded" if "embedded" in WEIGHT_MODELS else "tiny_llama"
    benchmark.pedantic(steps[name, "decode300", "float16"], rounds=5, iterations=10)
