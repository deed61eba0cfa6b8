"""Kernel benchmarks: each compiled kernel beside its NumPy twin (same pytest-benchmark group).

Run:  pytest bench/test_bench_kernels.py --benchmark-only --benchmark-json bench.json
      python scripts/kernel_ratios.py bench.json
Every case records ``extra_info["backend"]`` ("cython", "numpy" or "concat") and, for
attention, ``extra_info["kv_bytes"]`` (bytes of K and V read per call) for the GB/s column.
"""
import numpy as np
import pytest

import fastspec as fs

BACKENDS = fs.available_backends()
V = 32000


def kernel(backend, name):
    return getattr(fs.kernels.module(backend), name)


# ---- attention ---------------------------------------------------------------------------

ATTENTION_CASES = [(1, 128), (1, 1024), (1, 4096), (9, 1024), (17, 4096)]
H, H_KV, D = 8, 8, 64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, length", ATTENTION_CASES, ids=[f"n{n}-L{L}" for n, L in ATTENTION_CASES])
def test_attention(benchmark, backend, n, length):
    benchmark.group = f"attention n={n} L={length}"
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    k = rng.standard_normal((H_KV, length, D)).astype(np.float32)
    v = rng.standard_normal((H_KV, length, D)).astype(np.float32)
    out = np.empty_like(q)
    benchmark.extra_info.update(backend=backend, kv_bytes=k.nbytes + v.nbytes)
    benchmark(kernel(backend, "attention"), q, k, v, length, True, out)


# Head sizes at the same work a call (heads x head size 1024, 4096 keys): 64 (16 heads on 4),
# 128 (8 on 2) and Gemma's 256 (4 on 1), float32 and float16 caches. The compiled rows should
# cost about the same at every size (the tiled kernel takes multiples of 16 up to 256); a size
# that fell back to the double-accumulating template would take ~4x as long.
HEAD_CASES = [(d, n, kv) for d in (64, 128, 256) for n in (1, 8)
              for kv in ("float32", "float16")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim, n, kv_dtype", HEAD_CASES,
                         ids=[f"D{d}-n{n}-{kv}" for d, n, kv in HEAD_CASES])
def test_attention_head_size(benchmark, backend, head_dim, n, kv_dtype):
    benchmark.group = f"attention head sizes n={n} L=4096 {kv_dtype}"
    heads, length = 1024 // head_dim, 4096
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((heads // 4, length, head_dim)).astype(kv_dtype)
    v = rng.standard_normal((heads // 4, length, head_dim)).astype(kv_dtype)
    out = np.empty_like(q)
    benchmark.extra_info.update(backend=backend, kv_bytes=k.nbytes + v.nbytes,
                                macs=2 * n * heads * length * head_dim)
    benchmark(kernel(backend, "attention"), q, k, v, length, True, out)


# ---- KV append + crop --------------------------------------------------------------------

def concat_append_crop(keys, values, new_k, new_v):
    """The approach the preallocated cache replaces: grow with np.concatenate, then roll
    back (crop) to the old length with a copy. keys, values: (H_kv, L, D); new: (H_kv, n, D)."""
    length = keys.shape[1]
    grown_k = np.concatenate([keys, new_k], axis=1)
    grown_v = np.concatenate([values, new_v], axis=1)
    return grown_k[:, :length].copy(), grown_v[:, :length].copy()


KV_CASES = [(1, 4096), (9, 4096), (1, 256), (9, 256)]


@pytest.mark.parametrize("backend", BACKENDS + ("concat",))
@pytest.mark.parametrize("n, length", KV_CASES, ids=[f"n{n}-L{L}" for n, L in KV_CASES])
def test_kv_append_crop(benchmark, backend, n, length):
    benchmark.group = f"kv append {n} + crop L={length}"
    benchmark.extra_info.update(backend=backend)
    rng = np.random.default_rng(0)
    new = rng.standard_normal((n, H_KV, D)).astype(np.float32)
    if backend == "concat":
        keys = rng.standard_normal((H_KV, length, D)).astype(np.float32)
        values = keys.copy()
        new_t = np.ascontiguousarray(new.transpose(1, 0, 2))
        benchmark(concat_append_crop, keys, values, new_t, new_t)
        return
    cache = fs.KVCache(n_layers=1, n_kv_heads=H_KV, capacity=length + 64, head_dim=D)
    cache.advance(length)
    write = kernel(backend, "cache_write")
    k_layer, v_layer = cache.k[0], cache.v[0]

    def append_crop():
        start = cache.length
        write(k_layer, new, start)
        write(v_layer, new, start)
        cache.advance(n)
        cache.crop(start)

    benchmark(append_crop)
    assert cache.length == length


# ---- probs, verification -----------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_probs_top_p(benchmark, backend):
    benchmark.group = f"probs V={V} top_p=0.9"
    benchmark.extra_info.update(backend=backend)
    logits = (2 * np.random.default_rng(0).standard_normal(V)).astype(np.float32)
    benchmark(kernel(backend, "probs"), logits, 1.0, 0, 0.9)


def _verify_inputs(g=8):
    rng = np.random.default_rng(0)
    p = fs.kernels.module("numpy").probs((2 * rng.standard_normal((g + 1, V))).astype(np.float32))
    q = fs.kernels.module("numpy").probs((2 * rng.standard_normal((g, V))).astype(np.float32))
    draft = np.array([rng.choice(V, p=row.astype(np.float64) / row.sum(dtype=np.float64))
                      for row in q])
    uniforms = rng.random(g + 1)
    return draft, p, q, uniforms


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "onehot"])
def test_verify_rejection(benchmark, backend, with_q):
    benchmark.group = f"verify_rejection g=8 V={V} {'q' if with_q else 'onehot'}"
    benchmark.extra_info.update(backend=backend)
    draft, p, q, uniforms = _verify_inputs()
    benchmark(kernel(backend, "verify_rejection"), draft, p, q if with_q else None, uniforms)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_greedy(benchmark, backend):
    benchmark.group = f"verify_greedy g=8 V={V}"
    benchmark.extra_info.update(backend=backend)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((9, V)).astype(np.float32)
    draft = np.argmax(logits[:8], axis=1)
    draft[6] = (draft[6] + 1) % V  # six accepted, a mismatch at 6
    benchmark(kernel(backend, "verify_greedy"), draft, logits)


# ---- probs and the sampled round at a real vocabulary (Qwen2/Qwen3: 151936) -----------------

V_QWEN = 151936
PROBS_QWEN_CASES = [(0, 1.0), (50, 1.0), (50, 0.9), (0, 0.9)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("top_k, top_p", PROBS_QWEN_CASES,
                         ids=[f"k{k}-p{p}" for k, p in PROBS_QWEN_CASES])
def test_probs_qwen_vocab(benchmark, backend, top_k, top_p):
    """Top-k selects (heap / partition), it does not sort the vocabulary."""
    benchmark.group = f"probs V={V_QWEN} top_k={top_k} top_p={top_p}"
    benchmark.extra_info.update(backend=backend)
    logits = (3 * np.random.default_rng(0).standard_normal((1, V_QWEN))).astype(np.float32)
    benchmark(kernel(backend, "probs"), logits, 0.8, top_k, top_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_round_qwen_vocab(benchmark, backend):
    """The sampled path of one round at gamma 7: the target's 8 rows of p (top-k 50, top-p
    0.9) and verify_rejection against the drafter's q; compare with a decode step of the
    model (a Qwen3-0.6B step streams ~1.2 GB of 16-bit weights: ~60 ms at 20 GB/s)."""
    benchmark.group = f"sampled round g=7 V={V_QWEN} top_k=50 top_p=0.9"
    benchmark.extra_info.update(backend=backend)
    rng = np.random.default_rng(0)
    probs, verify = kernel(backend, "probs"), kernel(backend, "verify_rejection")
    logits = (3 * rng.standard_normal((8, V_QWEN))).astype(np.float32)
    q = fs.kernels.module("numpy").probs((3 * rng.standard_normal((7, V_QWEN))).astype(np.float32),
                                         0.8, 50, 0.9)
    draft = q.argmax(axis=1)
    uniforms = rng.random(8)
    p = np.empty_like(logits)  # reused, as the decoding loop reuses its buffer

    def round_():
        return verify(draft, probs(logits, 0.8, 50, 0.9, out=p), q, uniforms)

    benchmark(round_)
