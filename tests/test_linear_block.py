"""The packed float products (csrc/fs_linear_f32.inc) through fastspec.kernels._linear.

NumPy twin over awkward shapes (in/out not multiples of the 48-column panel or of 16, rows 1..17,
accumulate, bias); a row alone gives the same bits as inside any block, on every path and
weight kind; f16 == f32 on the widened weights and bf16 == f32 on the widened weights and
bf16-rounded rows; the AVX2 and AVX-512 paths agree bit for bit; the packed layout; the FMA
peak of isa_info. tests/c/linear_block.c checks every variant against a scalar fmaf chain.
The tile layout of the amx and avx512bf16 paths (product_tiles): the bf16 rule's twin within
float32 rounding, and a row alone == the same row in a block, where the CPU has such a path
(tests/c/linear_amx.c checks them in C).
"""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import bf16

from _helpers import isa_params, needs_c_harness, run_c_harness

lin = pytest.importorskip("fastspec.kernels._linear")

PW = 48
SIMD = [p for p in ("avx2", "avx512") if p in fs.kernels.isa_info()["available"]
        and p in fs.kernels.isa_info()["kernels"]]
PATHS = ["portable", *SIMD]
#: the tile paths (amx, avx512bf16): params skipped with a reason where absent, and the names
#: this CPU and build run
TILE_PARAMS = isa_params(skipped=("avx512bf16", "amx"), names=("avx512bf16", "amx"))
TILE_PATHS = [p for p in TILE_PARAMS if isinstance(p, str)]


@pytest.fixture
def on_path(request):
    """Run the test with every product forced onto ``request.param``; restore afterwards."""
    prev = fs.kernels.isa_info()["forced"]
    fs.kernels.set_isa(request.param)
    yield request.param
    fs.kernels.set_isa(prev)


def _weights(kind, n_in, n_out, rng):
    """(stored W for pack, its float32 value)"""
    w = (rng.standard_normal((n_in, n_out)) * 0.5).astype(np.float32)
    w[rng.random(w.shape) < 0.05] = 0.0
    if kind == "f16":
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    if kind == "bf16":
        b = bf16.to_bits(w)
        return b, bf16.from_bits(b)
    return w, w


def _rows(kind, n, n_in, rng):
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = -0.0
    return bf16.round_values(x).reshape(n, n_in) if kind == "bf16" else x


def _run(kind, p, x, n_out, y0=None, bias=None):
    """lin.product, or lin.product_tiles for kind "tiles" (bf16 weights in the tile layout)."""
    y = np.zeros((x.shape[0], n_out), np.float32) if y0 is None else y0.copy()
    if kind == "tiles":
        lin.product_tiles(x, p, n_out, y, accumulate=y0 is not None, bias=bias)
    else:
        lin.product(x, p, kind, n_out, y, accumulate=y0 is not None, bias=bias)
    return y


def _pack_twin(w):
    """NumPy twin of the packed layout: panels of PW columns k after k, the last one (fewer
    than PW columns left) zero-padded to a multiple of 16."""
    n_in, n_out = w.shape
    parts = []
    for c0 in range(0, n_out, PW):
        width = PW if n_out - c0 >= PW else -(-(n_out - c0) // 16) * 16
        panel = np.zeros((n_in, width), w.dtype)
        panel[:, :min(width, n_out - c0)] = w[:, c0:c0 + width]
        parts.append(panel.ravel())
    return np.concatenate(parts)


def test_pack_layout():
    rng = np.random.default_rng(0)
    for n_in, n_out in [(1, 1), (3, 47), (5, 48), (7, 49), (2, 100), (4, 80), (3, 256)]:
        w = rng.standard_normal((n_in, n_out)).astype(np.float32)
        p = lin.pack(w)
        assert p.shape == (n_in * -(-n_out // 16) * 16,) == (lin.packed_len(n_in, n_out),)
        np.testing.assert_array_equal(p, _pack_twin(w))
        # strided (a transposed view) packs the same as its contiguous copy
        np.testing.assert_array_equal(lin.pack(np.ascontiguousarray(w.T).T), p)
        assert lin.pack(w.astype(np.float16)).dtype == np.float16


@pytest.mark.parametrize("on_path", PATHS, indirect=True)
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_numpy_twin(on_path, kind):
    rng = np.random.default_rng(1)
    for n_in, n_out in [(1, 5), (5, 47), (70, 48), (129, 49), (300, 100), (577, 97), (64, 80)]:
        stored, wf = _weights(kind, n_in, n_out, rng)
        p = lin.pack(stored)
        bias = rng.standard_normal(n_out).astype(np.float32)
        for n in (1, 2, 3, 4, 5, 8, 9, 13, 16, 17):
            x = _rows(kind, n, n_in, rng)
            y0 = rng.standard_normal((n, n_out)).astype(np.float32)
            ref = x.astype(np.float64) @ wf.astype(np.float64)
            scale = np.abs(x).astype(np.float64) @ np.abs(wf).astype(np.float64) + 1.0
            got = _run(kind, p, x, n_out)
            assert np.all(np.abs(got - ref) <= 1e-5 * scale), (n_in, n_out, n)
            got = _run(kind, p, x, n_out, y0=y0, bias=bias)
            want = ref + y0 + bias
            assert np.all(np.abs(got - want) <= 1e-5 * (scale + np.abs(y0) + np.abs(bias))), \
                (n_in, n_out, n)


@pytest.mark.parametrize("on_path", PATHS, indirect=True)
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_row_alone_equals_row_in_block(on_path, kind):
    rng = np.random.default_rng(2)
    for n_in, n_out in [(70, 49), (300, 97), (576, 192)]:
        stored, _ = _weights(kind, n_in, n_out, rng)
        p = lin.pack(stored)
        x = _rows(kind, 17, n_in, rng)
        y0 = rng.standard_normal((17, n_out)).astype(np.float32)
        alone = np.concatenate([_run(kind, p, x[i:i + 1], n_out) for i in range(17)])
        alone_acc = np.concatenate([_run(kind, p, x[i:i + 1], n_out, y0=y0[i:i + 1])
                                    for i in range(17)])
        for n in range(1, 18):
            np.testing.assert_array_equal(_run(kind, p, x[:n], n_out), alone[:n])
            np.testing.assert_array_equal(_run(kind, p, x[17 - n:], n_out), alone[17 - n:])
            np.testing.assert_array_equal(_run(kind, p, x[:n], n_out, y0=y0[:n]),
                                          alone_acc[:n])


@pytest.mark.parametrize("on_path", PATHS, indirect=True)
def test_16bit_weights_equal_float32_on_widened(on_path):
    rng = np.random.default_rng(3)
    for n_in, n_out in [(129, 49), (576, 96)]:
        for kind in ("f16", "bf16"):
            stored, wf = _weights(kind, n_in, n_out, rng)
            p16, p32 = lin.pack(stored), lin.pack(wf)
            for n in (1, 2, 4, 7, 16):
                x = _rows(kind, n, n_in, rng)
                np.testing.assert_array_equal(_run(kind, p16, x, n_out),
                                              _run("f32", p32, x, n_out))


@pytest.mark.skipif(len(SIMD) < 2, reason="needs both the AVX2 and the AVX-512 path")
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_simd_paths_agree(kind):
    rng = np.random.default_rng(4)
    prev = fs.kernels.isa_info()["forced"]
    try:
        for n_in, n_out in [(5, 47), (300, 100), (577, 192)]:
            stored, _ = _weights(kind, n_in, n_out, rng)
            p = lin.pack(stored)
            for n in (1, 2, 3, 4, 6, 8, 9, 16, 17):
                x = _rows(kind, n, n_in, rng)
                y0 = rng.standard_normal((n, n_out)).astype(np.float32)
                got = []
                for path in SIMD:
                    fs.kernels.set_isa(path)
                    got.append((_run(kind, p, x, n_out), _run(kind, p, x, n_out, y0=y0)))
                np.testing.assert_array_equal(got[0][0], got[1][0])
                np.testing.assert_array_equal(got[0][1], got[1][1])
    finally:
        fs.kernels.set_isa(prev)


@pytest.mark.parametrize("on_path", TILE_PARAMS, indirect=True)
def test_tiles_numpy_twin(on_path):
    # the bf16 rule: round_bf16(x) @ W in float32; the tile paths sum pairs in the hardware's
    # order, so within float32 rounding of the float64 product, not bit for bit
    assert lin.tile_layout()
    rng = np.random.default_rng(5)
    for n_in, n_out in [(1, 5), (5, 47), (31, 16), (70, 48), (129, 49), (300, 100), (577, 97)]:
        stored, wf = _weights("bf16", n_in, n_out, rng)
        p = lin.pack(stored, tiles=True)
        bias = rng.standard_normal(n_out).astype(np.float32)
        for n in (1, 2, 3, 5, 6, 7, 8, 12, 13, 16, 17, 25):
            x = rng.standard_normal((n, n_in)).astype(np.float32)
            ref = x @ bf16.RoundingMatrix(wf.astype(np.float64))  # the rule's NumPy twin
            xb = bf16.round_values(x).astype(np.float64)
            scale = np.abs(xb) @ np.abs(wf).astype(np.float64) + 1.0
            got = _run("tiles", p, x, n_out)
            assert np.all(np.abs(got - ref) <= 1e-5 * scale), (n_in, n_out, n)
            y0 = rng.standard_normal((n, n_out)).astype(np.float32)
            got = _run("tiles", p, x, n_out, y0=y0, bias=bias)
            want = ref + y0 + bias
            assert np.all(np.abs(got - want) <= 1e-5 * (scale + np.abs(y0) + np.abs(bias))), \
                (n_in, n_out, n)
            # a wrong product (the last input dropped) is caught at this tolerance
            if n_in > 1 and n == 1:
                assert not np.all(np.abs(_run("tiles", lin.pack(stored[:-1], tiles=True),
                                                    x[:, :-1], n_out) - ref) <= 1e-5 * scale)


@pytest.mark.parametrize("on_path", TILE_PARAMS, indirect=True)
def test_tiles_row_alone_equals_row_in_block(on_path):
    rng = np.random.default_rng(6)
    for n_in, n_out in [(70, 49), (576, 192)]:
        stored, _ = _weights("bf16", n_in, n_out, rng)
        p = lin.pack(stored, tiles=True)
        x = rng.standard_normal((17, n_in)).astype(np.float32)
        alone = np.concatenate([_run("tiles", p, x[i:i + 1], n_out) for i in range(17)])
        for n in range(1, 18):
            np.testing.assert_array_equal(_run("tiles", p, x[:n], n_out), alone[:n])
            np.testing.assert_array_equal(_run("tiles", p, x[17 - n:], n_out), alone[17 - n:])


def test_product_tiles_rejects_bad_input():
    w = np.ones((4, 5), np.uint16)
    p = lin.pack(w, tiles=True)
    assert p.dtype == np.uint16 and p.shape[0] >= 4 * 16
    with pytest.raises(TypeError, match="uint16"):
        lin.pack(np.ones((4, 5), np.float32), tiles=True)
    x, y = np.ones((2, 4), np.float32), np.zeros((2, 5), np.float32)
    prev = fs.kernels.isa_info()["forced"]
    try:
        fs.kernels.set_isa("portable")
        assert not lin.tile_layout()
        with pytest.raises(RuntimeError, match="tile layout"):
            lin.product_tiles(x, p, 5, y)
        if TILE_PATHS:
            fs.kernels.set_isa(TILE_PATHS[0])
            with pytest.raises(ValueError, match="tile layout of"):
                lin.product_tiles(x, p[:-1].copy(), 5, y)
            with pytest.raises(TypeError, match="uint16"):
                lin.product_tiles(x, p.astype(np.float32), 5, y)
            with pytest.raises(ValueError, match="y must have shape"):
                lin.product_tiles(x, p, 5, np.zeros((3, 5), np.float32))
            with pytest.raises(ValueError, match="bias"):
                lin.product_tiles(x, p, 5, y, bias=np.ones(4, np.float32))
    finally:
        fs.kernels.set_isa(prev)


def test_product_rejects_bad_input():
    p = lin.pack(np.ones((4, 5), np.float32))
    x, y = np.ones((2, 4), np.float32), np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError, match="kind"):
        lin.product(x, p, "f64", 5, y)
    with pytest.raises(ValueError, match="y must have shape"):
        lin.product(x, p, "f32", 5, np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="packed_len"):
        lin.product(x, p[:-1].copy(), "f32", 5, y)
    with pytest.raises(TypeError, match="uint16"):
        lin.product(x, p, "bf16", 5, y)
    with pytest.raises(ValueError, match="bias"):
        lin.product(x, p, "f32", 5, y, bias=np.ones(4, np.float32))
    with pytest.raises(TypeError, match="float32, float16 or uint16"):
        lin.pack(np.ones((2, 2)))
    with pytest.raises(ValueError, match="bursts"):
        lin.clock_hz(0)


def test_isa_info_reports_the_fma_peak():
    peak = fs.kernels.isa_info()["peak"]
    assert peak["clock_source"] in ("calibration", "cpuinfo")
    cpu = peak["cpu"]
    assert peak["fma_units"] == fs.kernels._isa.fma_units(cpu["vendor"], cpu["family"], SIMD)
    for path in SIMD:
        lanes = {"avx2": 8, "avx512": 16}[path]
        units = peak["fma_units"][path]
        assert peak["macs_per_cycle"][path] == units * lanes
        assert peak["gmacs"][path] == pytest.approx(units * lanes * peak["clock_ghz"])
    assert peak["clock_ghz"] > 0.1 or peak["clock_source"] == "cpuinfo"
    # the bf16 dot-product peak: exactly where the CPU runs avx512bf16
    have = "avx512bf16" in fs.kernels.isa_info()["available"]
    assert set(peak["dot_bf16"]) == ({"avx512bf16"} if have else set())
    dot = 16 if cpu["vendor"] == "GenuineIntel" else 32  # VDPBF16PS: 2 cycles each on Intel
    for d in peak["dot_bf16"].values():
        assert d["macs_per_cycle"] == dot
        assert d["gmacs"] == pytest.approx(dot * peak["clock_ghz"])


def test_fma_units_count_zen4_avx512_as_one_unit():
    units = fs.kernels._isa.fma_units
    # Zen 4 (family 25) runs a 512-bit FMA as two 256-bit halves: 16 lanes a cycle either way
    assert units("AuthenticAMD", 25, ["avx2", "avx512"]) == {"avx2": 2, "avx512": 1}
    # Zen 5, Intel and an unknown CPU keep two units of each width
    assert units("AuthenticAMD", 26, ["avx2", "avx512"]) == {"avx2": 2, "avx512": 2}
    assert units("GenuineIntel", 6, ["avx2", "avx512"]) == {"avx2": 2, "avx512": 2}
    assert units("", 0, ["avx2"]) == {"avx2": 2}
    vendor, family, model = fs.kernels._isa.cpu_model()
    assert isinstance(vendor, str) and family >= 0 and model >= 0


@needs_c_harness
def test_c_every_variant_is_one_fma_chain(tmp_path):
    # tests/c/linear_block.c: every variant == a scalar chain in k order, bit for bit
    run_c_harness("linear_block", [], tmp_path)
