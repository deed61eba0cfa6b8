"""Quantized products (fastspec.kernels.quant): the compiled kernels on every ISA path against
the NumPy twin, bit for bit (the twin emulates each fused multiply-add exactly, so the
tolerance is zero); a row alone equals the same row inside any block; GGUF's own quantizer and
dequantizer agree with ours; bad input gives clear errors; the C harness tests/c/quant.c runs
every variant against a scalar reference computed from the GGUF blocks."""
import copy
import pickle
import sys
import time

import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import quant as Q

from _helpers import BACKENDS, needs_c_harness, run_c_harness

INS = (32, 64, 96, 576, 1536, 16416)  # 16416: longer rows than the AMX tiles take
OUTS = (1, 7, 8, 9, 33, 576)


def _paths():
    if "cython" not in BACKENDS:
        return [pytest.param(None, marks=pytest.mark.skip(reason="Cython extension not built"))]
    info = fs.kernels.isa_info()
    return [n for n in ("portable", "avx2", "avx512", "avx512bf16", "amx")
            if n in info["available"] and n in info["kernels"]]


@pytest.fixture
def all_paths():
    """Run a body on every compiled path (yields the names), restoring the path after."""
    from fastspec.kernels import _isa
    prev = fs.kernels.isa_info()["forced"]

    def run(fn):
        out = {}
        with fs.using_backend("cython"):
            for name in _paths():
                _isa.set_isa(name)
                out[name] = fn()
        return out

    yield run
    _isa.set_isa(prev)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _weights(kind, out, inp, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((out, inp)).astype(np.float32) * 0.05
    return Q.QuantMatrix.from_float(kind, W)


def _rows(n, inp, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, inp)).astype(np.float32)
    x[:, ::7] *= 4.0
    return x


@pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
@pytest.mark.parametrize("inp", INS)
def test_every_path_equals_the_twin_and_rows_alone(kind, inp, all_paths):
    outs = OUTS if inp < 1536 else (1, 9, 576) if inp == 1536 else (9, 33)
    for out in outs:
        W = _weights(kind, out, inp, seed=out)
        x = _rows(17, inp, seed=inp + out)
        with fs.using_backend("numpy"):
            want = Q.linear_q(x, W)

        def body():
            alone = np.concatenate([Q.linear_q(x[r:r + 1], W) for r in range(17)])
            assert np.array_equal(_bits(alone), _bits(want)), (kind, inp, out, "alone")
            for n in range(2, 18):
                got = Q.linear_q(x[:n], W)
                assert np.array_equal(_bits(got), _bits(want[:n])), (kind, inp, out, n)
            # a block that starts elsewhere: rows 3..15 inside it equal their alone bits
            got = Q.linear_q(x[3:16], W)
            assert np.array_equal(_bits(got), _bits(want[3:16]))
            return True

        assert all(all_paths(body).values())


@pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
@pytest.mark.parametrize("inp", (96, 4096))
def test_prompt_blocks_equal_the_twin(kind, inp, all_paths):
    """70 rows (a prompt's products: on amx, four tiles of 16 rows share each pair's widened
    weights, then a tile of 6) and rows of 128 blocks, the most that sharing takes."""
    W = _weights(kind, 9, inp, seed=inp)
    x = _rows(70, inp, seed=7)
    with fs.using_backend("numpy"):
        want = Q.linear_q(x, W)

    def body():
        got = Q.linear_q(x, W)
        assert np.array_equal(_bits(got), _bits(want)), (kind, inp)
        return True

    assert all(all_paths(body).values())


@pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
@pytest.mark.parametrize("out", (2047, 2048))
def test_one_row_of_a_large_q8_0_matrix_equals_the_twin(out, all_paths):
    """One row of q8_0 matrices of 2.1 MiB, above FS_Q_STREAM_MIN_BYTES (fs_quant_kern.h): on
    a CPU that is not Intel the VNNI tiles run their k steps two at a time in a loop there,
    the same bits; beside a row of a small matrix (the fully unrolled tile) and a block of 3."""
    W = _weights("q8_0", out, 1024, seed=out)
    small = _weights("q8_0", 40, 1024, seed=3)
    x = _rows(3, 1024, seed=5)
    with fs.using_backend("numpy"):
        want, want_small = Q.linear_q(x, W), Q.linear_q(x[:1], small)

    def body():
        for r in range(3):
            got = Q.linear_q(x[r:r + 1], W)
            assert np.array_equal(_bits(got), _bits(want[r:r + 1])), (out, r)
        assert np.array_equal(_bits(Q.linear_q(x[:1], small)), _bits(want_small))
        assert np.array_equal(_bits(Q.linear_q(x, W)), _bits(want)), (out, "block")
        return True

    assert all(all_paths(body).values())


@pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
def test_accumulate_bias_and_threads(kind, all_paths):
    inp, out = 96, 33
    W = _weights(kind, out, inp)
    x = _rows(9, inp)
    rng = np.random.default_rng(5)
    bias = rng.standard_normal(out).astype(np.float32)
    y0 = rng.standard_normal((9, out)).astype(np.float32)
    with fs.using_backend("numpy"):
        want_b = Q.linear_q(x, W, bias)
        want_acc = Q.linear_q(x, W, bias, y0.copy(), accumulate=True)
    assert not np.array_equal(want_b, want_acc)

    def body():
        got_b = Q.linear_q(x, W, bias)
        got_acc = Q.linear_q(x, W, bias, y0.copy(), accumulate=True)
        assert np.array_equal(_bits(got_b), _bits(want_b))
        assert np.array_equal(_bits(got_acc), _bits(want_acc))
        return True

    assert all(all_paths(body).values())
    # threads split the columns: the same bits (a product large enough to be split)
    big = _weights(kind, 576, 576)
    xb = _rows(5, 576)
    with fs.using_backend("cython"):
        one = Q.linear_q(xb, big)
        prev = fs.kernels.get_threads()
        fs.kernels.set_threads(2)
        try:
            two = Q.linear_q(xb, big)
        finally:
            fs.kernels.set_threads(prev)
    assert np.array_equal(_bits(one), _bits(two))


@pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
def test_rows_quantized_on_the_threads_equal_the_twin(kind, all_paths):
    """From 16 rows, with the workers awake, the activations (and the block-interleaved copies
    the avx2/avx512 kernels read) are made by row chunks on the threads (fs_linear_q_many):
    every call of a loop, on every path, equals the twin. The product is large enough to be
    split, so its job wakes the workers for the next calls; the loop runs until three calls
    started with the workers awake (the pool reports them asleep for 20 ms after a late
    worker), and skips after the comparisons when no path saw them awake; the calls alternate
    two inputs, so a row a chunk left out keeps the other input's bytes."""
    from fastspec.kernels import _isa

    W = _weights(kind, 1536, 576, seed=3)
    xs = [_rows(37, 576, seed=11), _rows(37, 576, seed=12)]
    xs[0][5] *= 1e-30  # rows of very different scales, in different chunks
    xs[0][30] *= 1e6
    with fs.using_backend("numpy"):
        want = [_bits(Q.linear_q(x, W)) for x in xs]
    prev = fs.kernels.get_threads()

    def body():
        fs.kernels.set_threads(2)
        same, awake = [], 0
        with fs.kernels.keep_threads_awake():
            end = time.perf_counter() + 2.0
            while len(same) < 6 or (awake < 3 and time.perf_counter() < end):
                i = len(same) % 2
                awake += _isa._pool_awake()
                same.append(np.array_equal(_bits(Q.linear_q(xs[i], W)), want[i]))
        return all(same), awake

    try:
        runs = all_paths(body)
    finally:
        fs.kernels.set_threads(prev)
    assert all(ok for ok, _ in runs.values()), runs
    if not any(awake for _, awake in runs.values()):
        pytest.skip(f"the pool's workers were not awake at any call: {runs}")


_SMALL_STACK = """
import sys, threading, numpy as np, fastspec as fs
from fastspec.kernels import quant as Q, _isa
products = sys.argv[1] == "products"
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 16384)).astype(np.float32)
cases = []
for kind in Q.QUANT_KINDS:
    W = Q.QuantMatrix.from_float(kind, rng.standard_normal((40, 16384)).astype(np.float32))
    with fs.using_backend("numpy"):
        cases.append((W, Q.linear_q(x, W)))
fs.set_backend("cython")
fs.kernels.set_threads(1)  # the products run on the small thread itself
paths = sys.argv[2].split(",")  # the test module's _paths()
ok = []
def body():
    for name in paths:
        _isa.set_isa(name)
        for W, want in cases:  # the control compares the twin's result with itself
            got = Q.linear_q(x, W) if products else want.copy()
            ok.append(np.array_equal(got, want))
try:
    threading.stack_size(64 * 1024)
except ValueError:  # below the platform's minimum thread stack
    print("0 small-stacks-refused")
    sys.exit(0)
t = threading.Thread(target=body)
t.start()
t.join()
print(len(ok), all(ok))
"""


@pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
def test_products_run_on_a_small_thread_stack():
    """A 16-row product of rows of 16384 inputs (the longest the AMX tiles take) on a thread
    of 64 KiB stack, every kind on every path: the kernels keep their large buffers off the
    stack (the AMX kernel's scales took its frame to 79 KB and crashed such a thread). A
    control run without the products first: where Python itself needs more, the test skips."""
    import subprocess

    def run(what):
        return subprocess.run([sys.executable, "-c", _SMALL_STACK, what, ",".join(_paths())],
                              capture_output=True, text=True, timeout=600)

    control = run("control")
    if control.returncode != 0 or "refused" in control.stdout:
        pytest.skip(f"no 64 KiB thread for Python here: {control.returncode} "
                    f"{control.stdout.strip()} {control.stderr[-300:]}")
    got = run("products")
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    count, same = got.stdout.split()
    assert int(count) >= 3 and same == "True", got.stdout


def test_backends_pack_and_quantize_the_same(backend):
    for kind in Q.QUANT_KINDS:
        W = _weights(kind, 9, 64)
        blocks = W.to_blocks()
        again = Q.QuantMatrix.from_blocks(kind, blocks, 64)
        assert np.array_equal(again.packed, W.packed)
        assert np.array_equal(again.to_blocks(), blocks)
    x = _rows(3, 64)
    x[1, :32] = 0.0
    x[2, 40] = np.nan
    q, d, s = Q.quantize_activations(x)
    with fs.using_backend("numpy"):
        q2, d2, s2 = Q.quantize_activations(x)
    assert np.array_equal(q, q2) and np.array_equal(s, s2)
    assert np.array_equal(_bits(d), _bits(d2))
    assert d[1, 0] == 0 and not q[1, :32].any() and np.isnan(d[2, 1]) and not q[2, 32:].any()


def test_activation_rule_known_answers(backend):
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = 127.0           # amax: the scale is exactly 1
    x[0, 1:6] = [2.5, 3.5, -2.5, -0.5, 126.5]  # ties go to the even neighbour
    x[0, 32:64] = 1e-30       # below 2^-96: a zero block
    q, d, s = Q.quantize_activations(x)
    assert q[0, :6].tolist() == [127, 2, 4, -2, 0, 126]
    assert d[0].tolist() == [1.0, 0.0] and s[0, 0] == 127 + 2 + 4 - 2 + 126 and s[0, 1] == 0


def test_nan_row_stays_in_its_row(backend):
    W = _weights("q4_1", 9, 64)
    x = _rows(3, 64)
    x[1, 5] = np.inf
    y = Q.linear_q(x, W)
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()


@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
def test_dequantize_equals_gguf(backend, kind):
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf.constants import GGMLQuantizationType

    W = _weights(kind, 33, 96)
    deq = gguf_quants.dequantize(W.to_blocks(), GGMLQuantizationType[kind.upper()])
    assert np.array_equal(_bits(W.dequantize()), _bits(deq.reshape(33, 96)))
    assert np.array_equal(_bits(W.rows([5, 0, 32])), _bits(deq.reshape(33, 96)[[5, 0, 32]]))
    assert W.rows(np.zeros(0, np.int64)).shape == (0, 96)


@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
def test_own_quantizer_equals_gguf(kind, monkeypatch):
    pytest.importorskip("gguf.quants")
    rng = np.random.default_rng(3)
    W = rng.standard_normal((17, 96)).astype(np.float32)
    W[0, :32] = 0.0
    W[1, :32] = np.arange(32) - 15.5
    W[2, :32] = np.r_[127.0, np.arange(31) - 14.5]  # d = 1: exact halves for q8_0's rounding
    with_gguf = Q.quantize_blocks(kind, W)
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setitem(sys.modules, "gguf.quants", None)
    monkeypatch.setitem(sys.modules, "gguf.constants", None)
    assert np.array_equal(Q.quantize_blocks(kind, W), with_gguf)


def test_quant_matrix_attributes_pickle_copy():
    W = _weights("q8_0", 9, 64)
    assert (W.kind, W.in_features, W.out_features, W.shape) == ("q8_0", 64, 9, (9, 64))
    assert W.nbytes == W.packed.nbytes == 2 * (64 + 2 * 256)
    assert Q.block_bytes("q8_0") == 34 and Q.block_bytes("q4_0") == 18
    assert Q.block_bytes("q4_1") == 20 and Q.BLOCK == 32
    for other in (pickle.loads(pickle.dumps(W)), copy.deepcopy(W), copy.copy(W)):
        assert np.array_equal(other.packed, W.packed) and other.packed.ctypes.data % 64 == 0
    assert not W.packed.flags.writeable
    assert "q8_0" in repr(W)


def test_isa_info_names_the_quantized_kernels():
    info = fs.kernels.isa_info()
    if info["selected"] is None:
        pytest.skip("no compiled extension")
    kernels = info["quant_kernels"]
    assert kernels["portable"] == "portable"
    if "avx2" in kernels:
        assert kernels["avx2"] in ("avx2", "avx_vnni")
    with fs.using_backend("numpy"):
        assert Q.kernel_name("q8_0", 1) == "numpy"
    with fs.using_backend("cython"):
        for name in _paths():
            fs.kernels.set_isa(name)
            try:
                names = {Q.kernel_name(k, n) for k in Q.QUANT_KINDS for n in (1, 16)}
            finally:
                fs.kernels.set_isa(None)
            assert names <= {"portable", "avx2", "avx_vnni", "avx512_vnni", "avx512_vnni_x16",
                             "amx_int8"}
            assert name != "portable" or names == {"portable"}
            assert "amx_int8" not in names or name == "amx"
    if "amx" in _paths() and "amx_int8" in kernels["amx"]:
        # rows longer than the AMX tiles take (512 blocks) run the avx512 path's kernels
        with fs.using_backend("cython"):
            fs.kernels.set_isa("amx")
            try:
                assert Q.kernel_name("q8_0", 16, 576) == "amx_int8"
                assert Q.kernel_name("q8_0", 16, 16384) == "amx_int8"
                # ... the avx512 path's: zmm tiles for blocks, as there
                one = kernels["amx"].split(";")[0]
                assert Q.kernel_name("q8_0", 1, 576) == one
                # one row of wide rows: the zmm pairs on an Intel CPU (FS_Q_USE_ONE_WIDE; a
                # build with -DFS_Q_PF_ONE=N decides for every CPU, and this line with it)
                wide = Q.kernel_name("q8_0", 1, 16416)
                intel = fs.kernels.cpuinfo.cpuinfo()["vendor"] == "GenuineIntel"
                assert wide == ("avx512_vnni_x16" if intel else one)
                assert Q.kernel_name("q4_1", 1, 1024) == wide
                assert Q.kernel_name("q4_1", 1, 992) == one
                assert (("; one row of 1024 inputs or more: avx512_vnni_x16" in kernels["amx"])
                        == (wide != one))
                assert Q.kernel_name("q8_0", 5, 16416) == "avx512_vnni"
                assert Q.kernel_name("q8_0", 6, 16416) == "avx512_vnni_x16"
                assert Q.kernel_name("q4_1", 5, 16416) == "avx512_vnni_x16"
                assert Q.kernel_name("q8_0", 16, 16416) == "avx512_vnni_x16"
                assert Q.kernel_name("q4_1", 16) == "amx_int8"
            finally:
                fs.kernels.set_isa(None)
        assert "rows of at most 16384 inputs" in kernels["amx"]
        assert "(longer rows: avx512_vnni_x16 from 6 rows of q8_0)" in kernels["amx"]
    for bad in (0, 33, -32, 1.0, True):
        with pytest.raises(ValueError, match="in_features"):
            Q.kernel_name("q8_0", 2, bad)


def test_bad_input_errors(backend):
    W = _weights("q4_0", 9, 64)
    blocks = W.to_blocks()
    with pytest.raises(ValueError, match="kind must be one of"):
        Q.QuantMatrix.from_blocks("q5_0", blocks, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.QuantMatrix.from_blocks("q4_0", blocks, 48)
    with pytest.raises(ValueError, match=r"must have shape \(out_features >= 1, 36\)"):
        Q.QuantMatrix.from_blocks("q4_0", blocks[:, :-1], 64)
    with pytest.raises(ValueError, match="shape"):
        Q.QuantMatrix.from_blocks("q4_0", blocks, 96)
    with pytest.raises(TypeError, match="uint8"):
        Q.QuantMatrix.from_blocks("q4_0", blocks.astype(np.int16), 64)
    for kind, off, what in (("q4_0", 18, "scale"), ("q4_1", 22, "min")):
        bad = _weights(kind, 9, 64).to_blocks().copy()
        for value in (0x7C00, 0x7E00, 0xFC00):  # inf, NaN, -inf
            bad[4, off:off + 2] = np.array([value], np.uint16).view(np.uint8)
            with pytest.raises(ValueError, match=f"the {what} of row 4, block 1"):
                Q.QuantMatrix.from_blocks(kind, bad, 64)
    with pytest.raises(TypeError, match="float ndarray"):
        Q.QuantMatrix.from_float("q8_0", np.zeros((2, 32), np.int32))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.QuantMatrix.from_float("q8_0", np.zeros((2, 40), np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        Q.QuantMatrix.from_float("q8_0", np.full((2, 32), np.inf, np.float32))
    with pytest.raises(ValueError, match="too large"):
        Q.QuantMatrix.from_float("q8_0", np.full((2, 32), 3e38, np.float32))
    x = _rows(2, 64)
    with pytest.raises(TypeError, match="float32"):
        Q.linear_q(x.astype(np.float64), W)
    with pytest.raises(ValueError, match="in_features=64"):
        Q.linear_q(_rows(2, 96), W)
    with pytest.raises(TypeError, match="QuantMatrix"):
        Q.linear_q(x, np.zeros((9, 64), np.float32))
    with pytest.raises(TypeError, match="bias"):
        Q.linear_q(x, W, np.zeros(9))
    with pytest.raises(ValueError, match="bias"):
        Q.linear_q(x, W, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="accumulate"):
        Q.linear_q(x, W, accumulate=True)
    with pytest.raises(ValueError, match="out must be"):
        Q.linear_q(x, W, out=np.zeros((2, 8), np.float32))
    with pytest.raises(TypeError, match="out must be"):
        Q.linear_q(x, W, out=np.zeros((2, 9)))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.quantize_activations(np.zeros((1, 33), np.float32))
    with pytest.raises(IndexError, match=r"\[0, 9\)"):
        W.rows([0, 9])
    with pytest.raises(ValueError, match="1-D integer"):
        W.rows([[1]])


@pytest.mark.parametrize("flags", [[], ["-DFS_TEST_PORTABLE"]], ids=["gnu-variants", "portable"])
@needs_c_harness
def test_c_harness_every_variant_bit_identical(tmp_path, flags):
    run_c_harness("quant", flags, tmp_path)
