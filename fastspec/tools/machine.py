"""What this machine allows: stream rates, attention rates, Cython-vs-NumPy kernel ratios and
the decode step's stream bound (``fastspec bench``'s "machine" section)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fastspec import kernels
from fastspec.tools.timing import timeit

__all__ = ["machine_limits", "attention_rates", "kernel_ratios", "stream_rate", "decode_bound"]


def machine_limits(quick: bool = True) -> dict:
    """Measure streaming read bandwidth (cache-resident and DRAM-sized) and float32 GEMM.

    Streaming reads use BLAS ``sdot`` over two float32 arrays (it reads both once and does
    two flops per 8 bytes, so it is bandwidth-bound); the cache-resident case uses 2 x 512 KiB,
    the DRAM case 2 x 128 MiB (2 x 512 MiB with ``quick=False``).
    """
    out = {}
    small = np.ones(128 * 1024, np.float32)
    small_b = np.ones_like(small)
    t = timeit(lambda: small @ small_b, min_time=0.05)
    out["stream_cache_GBps"] = 2 * small.nbytes / t / 1e9
    n_big = (128 if quick else 512) * 1024 * 1024 // 4
    big, big_b = np.ones(n_big, np.float32), np.ones(n_big, np.float32)
    t = timeit(lambda: big @ big_b, min_time=0.2, repeats=3)
    out["stream_dram_GBps"] = 2 * big.nbytes / t / 1e9
    del big, big_b
    n = 512 if quick else 1024
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    t = timeit(lambda: a @ a, min_time=0.1, repeats=3)
    out["gemm_f32_GFLOPs"] = 2 * n ** 3 / t / 1e9
    out["gemm_size"] = n
    return out


def attention_rates(lengths: Sequence[int] = (1024, 4096), n_heads: int = 8, head_dim: int = 64) -> list[dict]:
    """Time single-query float32 attention per backend; report effective GB/s of K and V read.

    Each length also times a BLAS ``sdot`` of the same two K and V arrays (``stream_GBps``):
    the streaming rate at attention's own footprint (16.8 MB at L = 4096, beyond a 2 MB L2),
    which is the memory bound that applies to it.
    """
    rng = np.random.default_rng(0)
    rows = []
    for length in lengths:
        q = rng.standard_normal((1, n_heads, head_dim)).astype(np.float32)
        k = rng.standard_normal((n_heads, length, head_dim)).astype(np.float32)
        v = rng.standard_normal((n_heads, length, head_dim)).astype(np.float32)
        kf, vf = k.reshape(-1), v.reshape(-1)
        t_stream = timeit(lambda: kf @ vf)
        stream = (k.nbytes + v.nbytes) / t_stream / 1e9
        for name in kernels.available_backends():
            mod = kernels.module(name)
            t = timeit(lambda: mod.attention(q, k, v, length))
            gbps = (k.nbytes + v.nbytes) / t / 1e9
            rows.append({"backend": name, "length": length, "seconds": t, "GBps": gbps,
                         "bytes": k.nbytes + v.nbytes, "stream_GBps": stream,
                         "fraction_of_stream": gbps / stream})
    return rows


def kernel_ratios() -> list[dict]:
    """Cython vs NumPy time of each kernel on the issue's benchmark shapes (float32)."""
    rng = np.random.default_rng(0)
    V, g = 32000, 8
    logits = rng.standard_normal((1, V)).astype(np.float32)
    p = rng.random((g + 1, V)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    q = rng.random((g, V)).astype(np.float32)
    q /= q.sum(1, keepdims=True)
    draft = rng.integers(0, V, g)
    u = rng.random(g + 1)
    qa = rng.standard_normal((1, 8, 64)).astype(np.float32)
    q9 = rng.standard_normal((9, 8, 64)).astype(np.float32)
    kc = rng.standard_normal((8, 1024, 64)).astype(np.float32)
    cache = np.zeros((8, 4096, 64), np.float32)
    new = rng.standard_normal((1, 8, 64)).astype(np.float32)
    cases = {
        "attention n=1 L=1024": lambda m: m.attention(qa, kc, kc, 1024),
        "attention n=9 L=1024": lambda m: m.attention(q9, kc, kc, 1024),
        "cache_write 1 pos": lambda m: m.cache_write(cache, new, 4000),
        "probs V=32000 top_p=0.9": lambda m: m.probs(logits, 1.0, 0, 0.9),
        "verify_rejection g=8 V=32000": lambda m: m.verify_rejection(draft, p, q, u),
        "verify_greedy g=8 V=32000": lambda m: m.verify_greedy(draft, p),
    }
    rows = []
    for case, fn in cases.items():
        times = {name: timeit(lambda: fn(kernels.module(name)))
                 for name in kernels.available_backends()}
        row = {"case": case, **{f"{k}_s": v for k, v in times.items()}}
        if "cython" in times:
            row["speedup"] = times["numpy"] / times["cython"]
        rows.append(row)
    return rows



def stream_rate(n_bytes: int) -> float:
    """Streaming read rate (GB/s) over ``n_bytes`` in all: BLAS ``sdot`` of two float32 arrays."""
    n = max(n_bytes // 8, 1024)
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    return (a.nbytes + b.nbytes) / timeit(lambda: a @ b) / 1e9


def decode_bound(model, limits: dict, step_s: float) -> dict:
    """Compare a measured decode step with the memory and compute bounds of its weights.

    The memory bound that applies is the weight bytes over the streaming rate measured at the
    weights' own footprint (``stream_footprint_GBps``: a 6 MB model does not fit in a 2 MB
    L2); the cache-resident and DRAM rates are reported beside it.
    """
    n_params = model.n_params
    weight_bytes = n_params * model.config.matrix_itemsize  # norms: negligible
    flops = 2 * n_params
    footprint = stream_rate(weight_bytes)
    t_mem = weight_bytes / (footprint * 1e9)
    t_mem_cache = weight_bytes / (limits["stream_cache_GBps"] * 1e9)
    t_mem_dram = weight_bytes / (limits["stream_dram_GBps"] * 1e9)
    t_compute = flops / (limits["gemm_f32_GFLOPs"] * 1e9)
    bound = max(t_mem, t_compute)
    return {"params": n_params, "weight_bytes": weight_bytes, "step_s": step_s,
            "stream_footprint_GBps": footprint, "bound_memory_s": t_mem,
            "bound_memory_cache_s": t_mem_cache, "bound_memory_dram_s": t_mem_dram,
            "bound_compute_s": t_compute,
            "binding": "memory" if t_mem >= t_compute else "compute",
            "achieved_fraction": bound / step_s}
