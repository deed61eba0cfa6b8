"""Packed float products at the SmolLM2-135M shapes: multiply-adds per cycle vs the FMA peak.

Run:  taskset -c 1 pytest bench/test_bench_linear.py --benchmark-only --benchmark-json lin.json
Each case runs the seven products of a decoder layer (hidden 576, intermediate 1536, 9 heads /
3 kv heads of 64: q, k, v, o, gate, up, down) over LAYERS distinct copies of the weights, so
that W streams from memory as in a forward (or the 576 x 49152 head alone), for a weight kind,
a vector path (forced with set_isa) and a row count (1: a decode step; 2..16: a verification
block). ``extra_info`` records the multiply-adds per call, the clock and the peak of
``fs.kernels.isa_info()["peak"]``, and, after the run, ``macs_per_cycle`` (from the median) and
``of_peak`` (its fraction of lanes x FMA units: two, one 512-bit unit on Zen 4).

The tile paths (avx512bf16, amx) run bf16 weights from the tile layout (``pack(w,
tiles=True)``, ``product_tiles``, which rounds the rows to bf16 itself); ``test_*_tiles`` runs
them where the CPU has them. Their peak: avx512bf16's, ``isa_info()["peak"]["dot_bf16"]`` (one
``VDPBF16PS`` a cycle, 32 multiply-adds: measured on a Zen 4, 31.6 against 15.9 a cycle for
the float32 FMA; 16 on an Intel CPU, one every two cycles); amx records no peak.
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
TILE_PATHS = [p for p in ("avx512bf16", "amx") if p in INFO["available"] and p in INFO["kernels"]]
ROWS = [1, 2, 4, 8, 16]


def tile_peak(path):
    """Multiply-adds a cycle of a tile path's bf16 products (``isa_info()["peak"]["dot_bf16"]``),
    or None where not known (amx)."""
    return INFO["peak"]["dot_bf16"].get(path, {}).get("macs_per_cycle")


def _packed(kind, shapes, copies, rng, tiles=False):
    out = []
    for _ in range(copies):
        for n_in, n_out in shapes:
            w = (rng.standard_normal((n_in, n_out)) * 0.05).astype(np.float32)
            if kind == "f16":
                w = w.astype(np.float16)
            elif kind == "bf16":
                w = (w.view(np.uint32) >> 16).astype(np.uint16)
            out.append((lin.pack(w, tiles=tiles), n_in, n_out))
    return out


def _on_path(name):
    prev = INFO["forced"]
    fs.kernels.set_isa(name)
    yield name
    fs.kernels.set_isa(prev)


@pytest.fixture(params=PATHS)
def path(request):
    yield from _on_path(request.param)


@pytest.fixture(params=TILE_PATHS)
def tile_path(request):
    yield from _on_path(request.param)


def _run(benchmark, path, kind, rows, what, shapes, copies):
    rng = np.random.default_rng(0)
    tiles = path in TILE_PATHS
    mats = _packed(kind, shapes, copies, rng, tiles=tiles)
    width = max(max(n_in, n_out) for n_in, n_out in shapes)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    if kind == "bf16":
        x = ((x.view(np.uint32) >> 16) << 16).view(np.float32)
    xs = {n_in: np.ascontiguousarray(x[:, :n_in]) for n_in, _ in shapes}
    ys = {n_out: np.empty((rows, n_out), np.float32) for _, n_out in shapes}

    def forward():
        for p, n_in, n_out in mats:
            lin.product(xs[n_in], p, kind, n_out, ys[n_out])

    def forward_tiles():
        for p, n_in, n_out in mats:
            lin.product_tiles(xs[n_in], p, n_out, ys[n_out])

    macs = rows * copies * sum(n_in * n_out for n_in, n_out in shapes)
    peak = INFO["peak"]
    top = tile_peak(path) if tiles else peak["macs_per_cycle"][path]
    benchmark.group = f"linear {what} {kind} {path}"
    benchmark.extra_info.update(path=path, kind=kind, rows=rows, macs=macs,
                                clock_ghz=peak["clock_ghz"], clock_source=peak["clock_source"],
                                peak_macs_per_cycle=top)
    benchmark(forward_tiles if tiles else forward)
    if benchmark.disabled:  # --benchmark-disable (CI): the case ran once, untimed
        return
    per_cycle = macs / benchmark.stats.stats.median / (peak["clock_ghz"] * 1e9)
    benchmark.extra_info.update(macs_per_cycle=per_cycle)
    if top:
        benchmark.extra_info.update(of_peak=per_cycle / top)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_layer_products(benchmark, path, kind, rows):
    _run(benchmark, path, kind, rows, f"layer x{LAYERS}", LAYER, LAYERS)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_head_product(benchmark, path, kind, rows):
    _run(benchmark, path, kind, rows, "head", [(HIDDEN, VOCAB)], 1)


@pytest.mark.parametrize("rows", ROWS)
def test_layer_products_tiles(benchmark, tile_path, rows):
    _run(benchmark, tile_path, "bf16", rows, f"layer x{LAYERS}", LAYER, LAYERS)


@pytest.mark.parametrize("rows", ROWS)
def test_head_product_tiles(benchmark, tile_path, rows):
    _run(benchmark, tile_path, "bf16", rows, "head", [(HIDDEN, VOCAB)], 1)
