"""Packed float products at the SmolLM2-135M shapes: multiply-adds per cycle vs the FMA peak.

Run:  taskset -c 1 pytest bench/test_bench_linear.py --benchmark-only --benchmark-json lin.json
Each case runs the seven products of a decoder layer (hidden 576, intermediate 1536, 9 heads /
3 kv heads of 64: q, k, v, o, gate, up, down) over LAYERS distinct copies of the weights, so
that W streams from memory as in a forward (or the 576 x 49152 head alone), for a weight kind,
a vector path (forced with set_isa) and a row count (1: a decode step; 2..16: a verification
block). ``extra_info`` records the multiply-adds per call, the clock and the peak of
``fs.kernels.isa_info()["peak"]``, and, after the run, ``macs_per_cycle`` (from the median) and
``of_peak`` (its fraction of lanes x FMA units: two, one 512-bit unit on Zen 4).
"""
import numpy as np
import pytest

import fastspec as fs

lin = pytest.importorskip("fastspec.kernels._linear")

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 9, 3, 64, 49152
LAYER = [(HIDDEN, HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM),
         (HEADS * HEAD_DIM, HIDDEN), (HIDDEN, INTER), (HIDDEN, INTER), (INTER, HIDDEN)]
LAYERS = 6
INFO = fs.kernels.isa_info()
PATHS = [p for p in ("avx2", "avx512") if p in INFO["available"] and p in INFO["kernels"]]
ROWS = [1, 2, 4, 8, 16]


def _packed(kind, shapes, copies, rng):
    out = []
    for _ in range(copies):
        for n_in, n_out in shapes:
            w = (rng.standard_normal((n_in, n_out)) * 0.05).astype(np.float32)
            if kind == "f16":
                w = w.astype(np.float16)
            elif kind == "bf16":
                w = (w.view(np.uint32) >> 16).astype(np.uint16)
            out.append((lin.pack(w), n_in, n_out))
    return out


@pytest.fixture(params=PATHS)
def path(request):
    prev = INFO["forced"]
    fs.kernels.set_isa(request.param)
    yield request.param
    fs.kernels.set_isa(prev)


def _run(benchmark, path, kind, rows, what, shapes, copies):
    rng = np.random.default_rng(0)
    mats = _packed(kind, shapes, copies, rng)
    width = max(max(n_in, n_out) for n_in, n_out in shapes)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    if kind == "bf16":
        x = ((x.view(np.uint32) >> 16) << 16).view(np.float32)
    xs = {n_in: np.ascontiguousarray(x[:, :n_in]) for n_in, _ in shapes}
    ys = {n_out: np.empty((rows, n_out), np.float32) for _, n_out in shapes}

    def forward():
        for p, n_in, n_out in mats:
            lin.product(xs[n_in], p, kind, n_out, ys[n_out])

    macs = rows * copies * sum(n_in * n_out for n_in, n_out in shapes)
    peak = INFO["peak"]
    benchmark.group = f"linear {what} {kind} {path}"
    benchmark.extra_info.update(path=path, kind=kind, rows=rows, macs=macs,
                                clock_ghz=peak["clock_ghz"], clock_source=peak["clock_source"],
                                peak_macs_per_cycle=peak["macs_per_cycle"][path])
    benchmark(forward)
    if benchmark.disabled:  # --benchmark-disable (CI): the case ran once, untimed
        return
    per_cycle = macs / benchmark.stats.stats.median / (peak["clock_ghz"] * 1e9)
    benchmark.extra_info.update(macs_per_cycle=per_cycle,
                                of_peak=per_cycle / peak["macs_per_cycle"][path])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_layer_products(benchmark, path, kind, rows):
    _run(benchmark, path, kind, rows, f"layer x{LAYERS}", LAYER, LAYERS)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_head_product(benchmark, path, kind, rows):
    _run(benchmark, path, kind, rows, "head", [(HIDDEN, VOCAB)], 1)
