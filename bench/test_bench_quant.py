"""Quantized products (fastspec.kernels.quant): multiply-adds per cycle per kind, rows and ISA
path, on SmolLM2-135M's shapes, and the decode row's GB/s against a stream of the same bytes.

Run:  taskset -c 1 pytest bench/test_bench_quant.py --benchmark-only --benchmark-json q.json

Each ``test_linear_q`` case records ``extra_info``: ``path`` (the forced ISA path),
``kernel`` (the quantized kernel it runs), ``macs`` (multiply-adds per call),
``mac_per_ns`` and ``mac_per_cycle`` (at ``ghz``, the CPU's highest reported clock, or
FASTSPEC_BENCH_GHZ), from the median time. Shapes: the hidden-to-intermediate (576x1536),
intermediate-to-hidden (1536x576) and vocabulary head (576x49152) products.
``test_decode_vs_stream`` times one row through a ring of copies of the head (>= 256 MiB, so
that the weights come from DRAM) interleaved with a read-only stream (BLAS sdot) of the same
bytes, and records both GB/s and ``fraction_of_stream`` (issue 29's goal: >= 0.9).
"""
import os
import pickle

import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import quant as Q

from _timing import median_time

SHAPES = {"576x1536": (576, 1536), "1536x576": (1536, 576), "576x49152": (576, 49152)}
ROWS = (1, 2, 4, 8, 16)
PATHS = ("portable", "avx2", "avx512", "amx")
_CACHE: dict = {}


def _ghz() -> float:
    env = os.environ.get("FASTSPEC_BENCH_GHZ")
    if env:
        return float(env)
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        return max(mhz) / 1000.0
    except (OSError, ValueError):
        return 2.45


def _matrix(kind, shape):
    key = (kind, shape)
    if key not in _CACHE:
        inp, out = SHAPES[shape]
        rng = np.random.default_rng(0)
        W = (rng.standard_normal((out, inp)) * 0.05).astype(np.float32)
        _CACHE[key] = Q.QuantMatrix.from_float(kind, W)
    return _CACHE[key]


def _use_path(path):
    info = fs.kernels.isa_info()
    if info["selected"] is None:
        pytest.skip("no compiled extension")
    if path not in info["available"] or path not in info["kernels"]:
        pytest.skip(f"no {path} path here")
    fs.kernels.set_isa(path)
    return info["quant_kernels"][path]


@pytest.mark.parametrize("rows", ROWS, ids=[f"r{r}" for r in ROWS])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_linear_q(benchmark, path, kind, shape, rows):
    if path == "portable" and (shape == "576x49152" or rows > 4):
        pytest.skip("the portable kernel is the reference, timed on small cases only")
    _use_path(path)
    try:
        W = _matrix(kind, shape)
        with fs.using_backend("cython"):
            kernel = Q.kernel_name(kind, rows, W.in_features)
        x = np.random.default_rng(1).standard_normal((rows, W.in_features)).astype(np.float32)
        out = np.empty((rows, W.out_features), np.float32)
        macs = rows * W.in_features * W.out_features
        with fs.using_backend("cython"):
            benchmark.group = f"quant {kind} {shape} rows={rows}"
            benchmark(Q.linear_q, x, W, None, out)
    finally:
        fs.kernels.set_isa(None)
    if benchmark.disabled:  # --benchmark-disable (CI): the case ran once, untimed
        return
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(
        path=path, kernel=kernel, kind=kind, shape=shape, rows=rows, macs=macs,
        weight_bytes=W.nbytes, ghz=_ghz(), mac_per_ns=macs / median / 1e9,
        mac_per_cycle=macs / median / 1e9 / _ghz(), weight_GBps=W.nbytes / median / 1e9)


@pytest.mark.parametrize("rows", (1, 8))
@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
def test_linear_q_twin(benchmark, kind, rows):
    """The NumPy twin beside the compiled cases of the same group (576x1536)."""
    W = _matrix(kind, "576x1536")
    x = np.random.default_rng(1).standard_normal((rows, W.in_features)).astype(np.float32)
    out = np.empty((rows, W.out_features), np.float32)
    with fs.using_backend("numpy"):
        benchmark.group = f"quant {kind} 576x1536 rows={rows}"
        benchmark.extra_info.update(path="numpy", kind=kind, rows=rows)
        benchmark.pedantic(Q.linear_q, args=(x, W, None, out), rounds=3, iterations=1)


@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
@pytest.mark.parametrize("path", ("avx2", "avx512"))
def test_decode_vs_stream(benchmark, path, kind):
    _use_path(path)
    try:
        W = _matrix(kind, "576x49152")
        with fs.using_backend("cython"):
            kernel = Q.kernel_name(kind, 1, W.in_features)
        copies = max(2, (256 << 20) // W.nbytes + 1)
        ring = [pickle.loads(pickle.dumps(W)) for _ in range(copies)]
        floats = [m.packed[:m.nbytes // 4 * 4].view(np.float32) for m in ring]
        x = np.random.default_rng(1).standard_normal((1, W.in_features)).astype(np.float32)
        out = np.empty((1, W.out_features), np.float32)

        def decode():
            for m in ring:
                Q.linear_q(x, m, None, out)

        def stream():
            for f in floats:
                np.dot(f, f)

        with fs.using_backend("cython"):
            t_q, t_s = [], []
            for _ in range(5):  # interleaved: the machine's load shifts between samples
                t_q.append(median_time(decode, repeat=1))
                t_s.append(median_time(stream, repeat=1))
            benchmark.group = f"quant decode vs stream {kind}"
            benchmark.pedantic(decode, rounds=3, iterations=1)
    finally:
        fs.kernels.set_isa(None)
    total = copies * W.nbytes
    gbps, stream_gbps = total / np.median(t_q) / 1e9, total / np.median(t_s) / 1e9
    benchmark.extra_info.update(path=path, kernel=kernel, kind=kind, bytes=total,
                                GBps=gbps, stream_GBps=stream_gbps,
                                fraction_of_stream=gbps / stream_gbps)
