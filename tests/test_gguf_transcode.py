"""GGUF Q4_K and Q6_K matrices converted at load in one pass over their bytes
(:func:`fastspec.kernels.quant.transcode`, csrc/fs_transcode.c), and quantized GGUF loads
packed straight into the weight arena.

Oracles: ``gguf.quants`` (Q6_K: its dequantize, then its Q8_0 quantize, llama.cpp's rules) and
an independent Q4_K rule written with gguf's own scale unpacking (Q4_K keeps its 4-bit values
as Q4_1, docs/FORMATS.md). Each backend's result must equal them byte for byte, on random
super-blocks with zero, subnormal, tiny and extreme scales, and for every float16 scale.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import quant
from fastspec.kernels.arena import WeightArena, in_arena
from fastspec.model.schema import FORWARD_MATRICES

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import Q4_K, dequantize, quantize  # noqa: E402

from _gguf_writer import write_model  # noqa: E402

SUPER = {"Q4_K": 144, "Q6_K": 210, "Q5_0": 22}  # bytes of a (super-)block
WEIGHTS = {"Q4_K": 256, "Q6_K": 256, "Q5_0": 32}  # its weights
SCALES = {"Q4_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,)}  # byte offsets of the f16 scales


def superblocks(type_name: str, rows: int, n: int, seed: int, special: bool) -> np.ndarray:
    """Random (super-)blocks (rows, n * bytes) with finite f16 scales over 14 decades; with
    ``special`` also zeros, the smallest subnormal, a tiny normal and -65504."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * n, SUPER[type_name]), dtype=np.uint8)
    for off in SCALES[type_name]:
        d = (rng.standard_normal(rows * n) * 10.0 ** rng.integers(-8, 4, rows * n))
        d = d.astype(np.float16)
        if special:
            d[::7], d[1::11], d[2::13], d[3::17] = 0, 6e-8, -65504, 1e-5
        raw[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def q4_k_rule(raw: np.ndarray) -> np.ndarray:
    """Q4_1 blocks of Q4_K super-blocks: d' = f16(d * sc), m' = f16(-(dmin * m)), the same
    nibbles (gguf's scale unpacking; numpy's float16 rounding)."""
    b = raw.reshape(-1, 144)
    n = b.shape[0]
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    out = np.empty((n, 8, 20), np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        out[:, :, 0:2] = (d * sc).astype(np.float16).view(np.uint8).reshape(n, 8, 2)
        out[:, :, 2:4] = (-(dmin * m)).astype(np.float16).view(np.uint8).reshape(n, 8, 2)
    for j in range(8):
        chunk = b[:, 16 + 32 * (j // 2):48 + 32 * (j // 2)]
        nib = chunk & 0x0F if j % 2 == 0 else chunk >> 4
        out[:, j, 4:] = nib[:, :16] | nib[:, 16:] << 4
    return out.reshape(raw.shape[0], -1)


def q8_0_rule(type_name: str):
    """gguf's dequantization of ``type_name``, then its Q8_0 quantization."""
    def rule(raw: np.ndarray) -> np.ndarray:
        w = dequantize(raw, Q[type_name])
        with np.errstate(over="ignore"):
            return quantize(w, Q.Q8_0).reshape(raw.shape[0], -1)
    return rule


q6_k_rule = q8_0_rule("Q6_K")


def q5_0_rule(raw: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of Q5_0 blocks: the same d bytes, gguf's dequantized values divided by d
    (exact), zeros where d is 0."""
    b = raw.reshape(-1, 22)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    w = dequantize(raw, Q.Q5_0).reshape(-1, 32)
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, 0:2] = b[:, 0:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[:, 2:] = np.where(d != 0, w / d, 0).astype(np.int8).view(np.uint8)
    return out.reshape(raw.shape[0], -1)


RULES = {("Q4_K", "q4_1"): q4_k_rule, ("Q4_K", "q8_0"): q8_0_rule("Q4_K"),
         ("Q6_K", "q8_0"): q6_k_rule, ("Q5_0", "q8_0"): q5_0_rule}


@pytest.mark.parametrize("special", [False, True], ids=["random", "special-scales"])
@pytest.mark.parametrize("type_name, kind", list(RULES))
def test_transcode_equals_the_oracle(backend, type_name, kind, special):
    n = 5000 * 8 if type_name == "Q5_0" else 5000  # the same weights: 1.28M
    raw = superblocks(type_name, 9, n // 9 + 1, seed=len(type_name) + special, special=special)
    want = RULES[type_name, kind](raw)
    got = quant.transcode(type_name, raw, kind)
    assert got.shape == want.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def test_q4_k_values_are_kept(backend):
    """Where d * sc and dmin * m are float16 values, the q4_1 weights are the Q4_K weights."""
    raw = superblocks("Q4_K", 4, 12, seed=5, special=False)
    b = raw.reshape(-1, 144)
    b[:, 0:4] = np.full(2, 2.0 ** -10, np.float16).view(np.uint8)  # d * sc exact in f16
    got = dequantize(quant.transcode("Q4_K", raw), Q.Q4_1)
    np.testing.assert_array_equal(got, dequantize(raw, Q.Q4_K))


@pytest.mark.skipif("cython" not in fs.available_backends(), reason="not built")
def test_every_float16_scale_rounds_as_numpy():
    """All 65,536 f16 values of d (and, shuffled, of dmin), NaNs and infinities included,
    times random 6-bit scales: the compiled float16 rounding equals numpy's, bit for bit."""
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (65536, 144), dtype=np.uint8)
    raw[:, 0:2] = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    raw[:, 2:4] = rng.permutation(65536).astype(np.uint16).view(np.uint8).reshape(-1, 2)
    raw = raw.reshape(256, -1)
    with fs.using_backend("cython"):
        got = quant.transcode("Q4_K", raw)
    np.testing.assert_array_equal(got, q4_k_rule(raw))
    six = superblocks("Q6_K", 1, 4096, seed=8, special=False)  # every finite d's exponent
    finite = np.arange(65536, dtype=np.uint16)
    finite = np.ascontiguousarray(finite[(finite & 0x7C00) != 0x7C00][::15][:4096])
    six.reshape(-1, 210)[:, 208:210] = finite.view(np.uint8).reshape(-1, 2)
    with fs.using_backend("cython"):
        np.testing.assert_array_equal(quant.transcode("Q6_K", six), q6_k_rule(six))


def test_bad_input(backend):
    raw = superblocks("Q6_K", 2, 3, seed=1, special=False)
    raw[1, 210 + 208:210 + 210] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="NaN or infinite"):
        quant.transcode("Q6_K", raw)
    with pytest.raises(ValueError, match="type_name"):
        quant.transcode("Q5_K", raw)
    with pytest.raises(ValueError, match="Q6_K converts to q8_0, not 'q4_1'"):
        quant.transcode("Q6_K", raw, "q4_1")
    four = superblocks("Q4_K", 2, 3, seed=4, special=False)
    for off in (0, 2):  # d, then dmin
        bad = four.copy()
        bad[1, 144 + off:144 + off + 2] = np.array([-np.inf], np.float16).view(np.uint8)
        with pytest.raises(ValueError, match="Q4_K blocks hold a NaN or infinite"):
            quant.transcode("Q4_K", bad, "q8_0")
    with pytest.raises(ValueError, match="whole blocks of 210 bytes"):
        quant.transcode("Q6_K", raw[:, :-1])
    with pytest.raises(ValueError, match="uint8"):
        quant.transcode("Q4_K", raw.astype(np.int16))
    five = superblocks("Q5_0", 3, 4, seed=3, special=False)
    five[2, 22 * 3:22 * 3 + 2] = np.array([np.nan], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="Q5_0 blocks hold a NaN or infinite"):
        quant.transcode("Q5_0", five)


def test_a_nan_q4_k_scale_is_refused_when_packed(backend):
    raw = superblocks("Q4_K", 8, 1, seed=2, special=False)
    raw[3, 0:2] = np.array([np.nan], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="row 3"):
        quant.QuantMatrix.from_blocks("q4_1", quant.transcode("Q4_K", raw), 256)



@pytest.mark.skipif("cython" not in fs.available_backends(), reason="not built")
@pytest.mark.parametrize("type_name, kind", list(RULES))
def test_conversion_and_pack_are_the_same_bits_at_every_thread_count(type_name, kind):
    """The compiled transcode and pack cut their work between the pool's threads (chunks of
    super-blocks, of 8-row panels): the bytes equal the one-thread result and the twin's at
    1, 2 and 3 threads, and a bad scale in the last chunk is still refused."""
    from fastspec.kernels import get_threads, set_threads

    raw = superblocks(type_name, 203, 16, seed=11, special=False)  # 3248 blocks
    small = (np.random.default_rng(12).standard_normal(203 * 16) * 1e-3).astype(np.float16)
    for off in SCALES[type_name]:  # scales whose q4_1 / q8_0 scales stay finite (packable)
        raw.reshape(-1, SUPER[type_name])[:, off:off + 2] = small.view(np.uint8).reshape(-1, 2)
    cols = 16 * WEIGHTS[type_name]
    with fs.using_backend("numpy"):
        want = quant.transcode(type_name, raw, kind)
        want_packed = quant.QuantMatrix.from_blocks(kind, want, cols).packed
    bad = raw.copy()
    off = SCALES[type_name][0]
    bad[-1, -SUPER[type_name] + off:][:2] = np.array([np.nan], np.float16).view(np.uint8)
    threads = get_threads()
    try:
        with fs.using_backend("cython"):
            for n in (1, 2, 3):
                set_threads(n)
                got = quant.transcode(type_name, raw, kind)
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(
                    quant.QuantMatrix.from_blocks(kind, got, cols).packed, want_packed)
                with pytest.raises(ValueError, match="NaN or infinite|row 202"):
                    quant.QuantMatrix.from_blocks(kind, quant.transcode(type_name, bad, kind),
                                                  cols)
                # converted and packed in one pass: the same bytes, into a slot of garbage
                slot = np.full(want_packed.size + 64, 0xA5, np.uint8)
                slot = slot[(-slot.ctypes.data) % 64:][:want_packed.size]
                m = quant.QuantMatrix.from_gguf(type_name, raw, cols, kind, slot)
                assert m.packed is slot and m.shape == (203, cols)
                np.testing.assert_array_equal(m.packed, want_packed)
                with pytest.raises(ValueError, match="NaN or infinite|row 202"):
                    quant.QuantMatrix.from_gguf(type_name, bad, cols, kind)
    finally:
        set_threads(threads)


@pytest.mark.parametrize("type_name, kind", list(RULES))
def test_from_gguf_is_transcode_then_pack(backend, type_name, kind):
    """QuantMatrix.from_gguf: the bytes of from_blocks(transcode(...)) for 1 to 17 rows (the
    last panel partial), a bad scale anywhere named as the two passes name it."""
    for rows in (1, 7, 8, 9, 17):
        raw = superblocks(type_name, rows, 3, seed=rows, special=True)
        small = (np.random.default_rng(rows).standard_normal(rows * 3) * 1e-3)
        for off in SCALES[type_name]:  # finite converted scales (packable), zeros kept
            v = raw.reshape(-1, SUPER[type_name])[:, off:off + 2].copy().view(np.float16)
            v[v != 0] = small.astype(np.float16)[v[:, 0] != 0]
            raw.reshape(-1, SUPER[type_name])[:, off:off + 2] = v.view(np.uint8)
        cols = 3 * WEIGHTS[type_name]
        want = quant.QuantMatrix.from_blocks(kind, quant.transcode(type_name, raw, kind), cols)
        got = quant.QuantMatrix.from_gguf(type_name, raw, cols, kind)
        assert got.kind == kind and got.shape == want.shape
        np.testing.assert_array_equal(got.packed, want.packed)
        assert not got.packed.flags.writeable
    bad = raw.copy()
    bad[rows - 1, SCALES[type_name][0]:][:2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match=f"NaN or infinite|row {rows - 1}"):
        quant.QuantMatrix.from_gguf(type_name, bad, cols, kind)


def test_from_gguf_never_hides_a_one_pass_error(monkeypatch):
    """Where the one pass refuses rows the two passes take, its error stands (no quiet
    fallback to the two passes, which hold the whole converted matrix)."""
    raw = superblocks("Q6_K", 2, 1, seed=1, special=False)

    class Refusing:
        @staticmethod
        def transcode_pack(*args):
            raise ValueError("the one pass refused")

        transcode = staticmethod(quant._impl().transcode)
        pack = staticmethod(quant._impl().pack)

    monkeypatch.setattr(quant, "_impl", lambda: Refusing)
    with pytest.raises(ValueError, match="the one pass refused"):
        quant.QuantMatrix.from_gguf("Q6_K", raw, 256)


def test_from_gguf_bad_input(backend):
    raw = superblocks("Q6_K", 2, 3, seed=1, special=False)
    with pytest.raises(ValueError, match="Q6_K rows cannot be packed as 'q4_1'"):
        quant.QuantMatrix.from_gguf("Q6_K", raw, 768, "q4_1")
    with pytest.raises(ValueError, match="Q5_K rows cannot be packed"):
        quant.QuantMatrix.from_gguf("Q5_K", raw, 768)
    with pytest.raises(ValueError, match="whole blocks of 210 bytes"):
        quant.QuantMatrix.from_gguf("Q6_K", raw[:, :-1], 768)
    with pytest.raises(ValueError, match="shape"):
        quant.QuantMatrix.from_gguf("Q6_K", raw, 512)  # 3 super-blocks a row, not 2
    with pytest.raises(TypeError, match="uint8"):  # as from_blocks says it
        quant.QuantMatrix.from_gguf("Q6_K", raw.astype(np.int16), 768)
    with pytest.raises(ValueError, match="shape"):
        quant.QuantMatrix.from_gguf("Q6_K", raw[:0], 768)
    with pytest.raises(ValueError, match="out must be"):
        quant.QuantMatrix.from_gguf("Q6_K", raw, 768, out=np.zeros(10, np.uint8))
    own = quant.QuantMatrix.from_float("q8_0", np.ones((3, 64), np.float32))
    blocks = own.to_blocks()
    same = quant.QuantMatrix.from_gguf("Q8_0", blocks, 64)  # a native type: its own blocks
    np.testing.assert_array_equal(same.packed, own.packed)
    with pytest.raises(ValueError, match="Q8_0 rows cannot be packed as 'q4_0'"):
        quant.QuantMatrix.from_gguf("Q8_0", blocks, 64, "q4_0")


# --- the loader: K-quant matrices, packed straight into the arena ---------------------------

@pytest.fixture(scope="module")
def k_quant_file(tmp_path_factory):
    """An untied llama file of Q4_K and Q6_K matrices (rows of 256 inputs and more)."""
    path = tmp_path_factory.mktemp("k") / "k.gguf"
    write_model(path, "llama", dim=256, ffn=768, n_layers=3, n_heads=4, n_kv=2, vocab=300,
                types=(Q.Q4_K, Q.Q6_K), tied=False)
    return path


def _matrices(model) -> list:
    return ([getattr(lw, n) for lw in model.layers for n in FORWARD_MATRICES]
            + [model.head, model.embed])


@pytest.mark.parametrize("weight_dtype", ["q4_1", "q8_0"])
def test_k_quant_file_loads_as_its_conversion(k_quant_file, backend, weight_dtype):
    """Each matrix holds the bytes of the oracle rules: loaded as q4_1, Q4_K kept as q4_1 and
    Q6_K requantized to q8_0 (its nearest native kind); loaded as q8_0, both requantized."""
    model = fs.Transformer.load(k_quant_file, weight_dtype=weight_dtype)
    file = fs.formats.gguf.GGUFFile(k_quant_file)
    tensors = dict(file.tensors(model.config))
    kinds = set()
    for name, t in tensors.items():
        if t.ndim == 2:
            four = (t.type_name, weight_dtype) == ("Q4_K", "q4_1")
            got = _by_name(model, name)
            kinds.add((t.type_name, got.kind))
            want = (q4_k_rule if four else q8_0_rule(t.type_name))(t.blocks())
            np.testing.assert_array_equal(got.to_blocks(), want, err_msg=name)
    assert kinds == {("Q4_K", weight_dtype), ("Q6_K", "q8_0")}


def test_blocks_without_a_copy_are_the_same_bytes(k_quant_file):
    """``blocks(copy=False)`` (what the loader packs from) is a read-only view of the file's
    map where the rows are not permuted, and always the same bytes as ``blocks()``, a new
    array."""
    file = fs.formats.gguf.GGUFFile(k_quant_file)
    views = 0
    for name, t in file.tensors(file.config()):
        if t.ndim == 2:
            copy, view = t.blocks(), t.blocks(copy=False)
            np.testing.assert_array_equal(view, copy, err_msg=name)
            assert not np.shares_memory(copy, t._t.data)
            assert np.shares_memory(view, t._t.data) == (not t.head_rows), name
            assert copy.flags.writeable and view.flags.writeable == bool(t.head_rows)
            views += not t.head_rows
    assert views >= 10


def _by_name(model, name: str):
    if name == "model.embed_tokens.weight":
        return model.embed
    if name == "lm_head.weight":
        return model.head
    layer, key = name.split(".")[2], name.split(".")[-2]
    attr = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo", "gate_proj": "w_gate",
            "up_proj": "w_up", "down_proj": "w_down"}[key]
    return getattr(model.layers[int(layer)], attr)


def test_matrices_are_packed_into_one_arena_in_forward_order(k_quant_file, monkeypatch):
    """No matrix is packed elsewhere and then copied (WeightArena.copy is never called); they
    share one arena, laid out in the order a step reads them."""
    copies = []
    real = WeightArena.copy
    monkeypatch.setattr(WeightArena, "copy",
                        lambda self, a: copies.append(a.nbytes) or real(self, a))
    model = fs.Transformer.load(k_quant_file, weight_dtype="q8_0")
    assert copies == []
    mats = _matrices(model)
    assert all(in_arena(m.packed) for m in mats)
    starts = [m.packed.ctypes.data for m in mats]
    assert starts == sorted(starts)
    assert starts[-1] + mats[-1].nbytes - starts[0] < sum(m.nbytes for m in mats) + 64 * len(mats)


def _peak_over_weights(path) -> float:
    """Peak traced bytes of loading ``path`` as q4_1 (the file opened before tracing) over
    the packed bytes of the model's matrices."""
    from fastspec.formats.gguf import GGUFFile, load_gguf

    file = GGUFFile(path)
    tracemalloc.start()
    try:
        model = load_gguf(fs.Transformer, file, weight_dtype="q4_1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / sum(m.nbytes for m in _matrices(model))


@pytest.mark.skipif("cython" not in fs.available_backends(), reason="not built")
def test_quantized_load_holds_no_second_copy(k_quant_file, monkeypatch):
    """The temporaries of a quantized GGUF load stay under half the packed weights (one
    matrix's blocks at a time; the arena is a mapping tracemalloc does not see); packing each
    matrix apart and gathering them afterwards (the control) holds them all. Compiled backend:
    the NumPy twin converts 1M weights at a time, more than this small model."""
    with fs.using_backend("cython"):
        ratio = _peak_over_weights(k_quant_file)
        assert ratio < 0.5, f"peak {ratio:.2f}x the packed weights"
        monkeypatch.setattr(fs.model.state, "_arena_slots", lambda c, tensors: {})
        control = _peak_over_weights(k_quant_file)
    print(f"peak {ratio:.2f}x, control {control:.2f}x the packed weights")
    assert control > 1.0, f"the control should hold every packed matrix, measured {control:.2f}x"


def test_an_iterator_of_arrays_still_streams(monkeypatch):
    """Only a sequence of file handles is listed for the arena: arrays fed one at a time (an
    iterator) are not all held at once; such a model is gathered afterwards, as before."""
    monkeypatch.setattr(fs.model.state, "_arena_slots",
                        lambda c, tensors: pytest.fail("an iterator was listed"))
    src = fs.Transformer.random(fs.ModelConfig.tiny_llama(dim=64, n_layers=1, ffn_dim=96))
    c = src.config.replace(weight_dtype="q8_0")
    model = fs.Transformer.from_tensors(c, iter(src.state_dict().items()))
    assert all(in_arena(m.packed) for m in _matrices(model))
