"""IBM Granite: a Llama with embedding, residual, attention and logit multipliers, folded into
``ModelConfig.embedding_scale``, the RMSNorm epsilon, the RoPE attention factor and the final
norm (fastspec.formats.granite). Checked against transformers' ``GraniteForCausalLM`` and
llama.cpp's ``granite``, each fold with a negative control."""
import json

import numpy as np
import pytest

from fastspec import ModelConfig, Transformer
from fastspec.formats.gguf_write import save_gguf
from fastspec.formats.hf_folder import hf_config, save_hf

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q, GGUFValueType as V  # noqa: E402

from _helpers import hf_reference, llama_cpp_logits, transformers_logits  # noqa: E402
from _gguf_writer import write_model  # noqa: E402

#: Granite 3's multipliers (2B: embedding 12, residual 0.22, logits 8), an attention scale
#: that is not 1/sqrt(head_dim), and an epsilon large enough that its fold matters.
MULTIPLIERS = dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                   attention_multiplier=0.03, logits_scaling=8.0)
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_theta=10000.0)
IDS = np.random.default_rng(7).integers(0, 300, 90)
EPS = 0.1


def _far(model: Transformer, ref: np.ndarray) -> bool:
    """Whether ``model``'s logits are off ``ref`` by 20 times the tolerance of the parity."""
    return np.abs(model.forward(IDS).logits - ref).max() > 20 * 1e-4 * np.abs(ref).max()


def _without(model: Transformer, final_norm=None, **changes) -> Transformer:
    """The same weights with config fields changed (a fold undone: a negative control)."""
    norm = model.final_norm if final_norm is None else final_norm
    return Transformer(model.config.replace(**changes), model.embed, model.layers, model.head,
                       norm)


@pytest.fixture(scope="module")
def hf_granite(tmp_path_factory):
    """(folder, transformers logits over IDS): a random GraniteForCausalLM saved by
    transformers, its weights widened so that every one matters."""
    cfg = dict(**TINY, **MULTIPLIERS, rms_norm_eps=EPS, tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("granite")
    return folder, hf_reference("GraniteForCausalLM", cfg, IDS, folder)


@pytest.mark.hf
def test_folder_matches_transformers(hf_granite):
    folder, ref = hf_granite
    ours = Transformer.load(folder)
    c = ours.config
    r = MULTIPLIERS["residual_multiplier"]
    assert c.embedding_scale == pytest.approx(12.0 / r)
    assert c.norm_eps == pytest.approx(EPS / r**2)
    assert c.rope_attention_factor == pytest.approx(np.sqrt(0.03 * 4.0))  # head_dim 16
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    # each fold undone alone moves the logits
    undone = [_without(ours, embedding_scale=None), _without(ours, norm_eps=EPS),
              _without(ours, rope_attention_factor=None),
              _without(ours, final_norm=ours.final_norm * 8.0)]
    assert [_far(model, ref) for model in undone] == [True] * 4


@pytest.mark.hf
def test_save_hf_is_read_back_by_transformers(hf_granite, tmp_path):
    """Written back, a Granite has residual and logit multipliers of 1 and computes the same."""
    folder, ref = hf_granite
    ours = Transformer.load(folder)
    save_hf(ours, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["GraniteForCausalLM"]
    assert (written["residual_multiplier"], written["logits_scaling"]) == (1.0, 1.0)
    got = transformers_logits(tmp_path / "out", IDS)
    np.testing.assert_allclose(got, ref, atol=1e-4 * np.abs(ref).max())
    again = Transformer.load(tmp_path / "out")
    np.testing.assert_allclose(again.forward(IDS).logits, ours.forward(IDS).logits, atol=1e-5)


def _granite_file(path, types=(Q.F32,), tied=True, extra=None, **keys):
    """A random ``granite`` GGUF file (llama.cpp's converter's layout: q/k rows permuted)
    with ``granite.<key>`` keys (``__`` for ``.``; floats as FLOAT32, bools as BOOL); returns
    its weights under Hugging Face names."""
    meta = {f"granite.{k.replace('__', '.')}": (v, V.BOOL if isinstance(v, bool) else V.FLOAT32)
            for k, v in keys.items()}
    return write_model(path, arch="granite", dim=64, n_layers=2, n_heads=4, n_kv=2, ffn=96,
                       types=types, metadata=meta, tied=tied, extra=extra)


FILE_KEYS = dict(embedding_scale=12.0, residual_scale=0.22, attention__scale=0.03,
                 logit_scale=8.0)


@pytest.mark.hf
@pytest.mark.parametrize("types", [(Q.F32,), (Q.Q8_0, Q.F16, Q.Q4_0, Q.BF16, Q.Q4_1)])
def test_gguf_matches_transformers(tmp_path, types):
    """The file's keys are transformers' multipliers; its q/k rows are permuted as llama's."""
    weights = _granite_file(tmp_path / "g.gguf", types, **FILE_KEYS)
    ours = Transformer.load(tmp_path / "g.gguf")
    cfg = dict(**TINY, **MULTIPLIERS, rms_norm_eps=1e-6, tie_word_embeddings=True)
    ref = hf_reference("GraniteForCausalLM", cfg, IDS, weights=weights)  # lm_head: tied
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    assert _far(_without(ours, embedding_scale=None, rope_attention_factor=None), ref)


GGUF_CASES = {
    "tied": ({}, ("embedding_scale", "rope_attention_factor", "norm_eps")),
    "untied": ({"tied": False}, ("embedding_scale", "rope_attention_factor", "norm_eps")),
    "with attn_factor": ({"rope__scaling__attn_factor": 1.3}, ("rope_attention_factor",)),
    "with rope_freqs": ({"extra": {"rope_freqs.weight": np.linspace(5, 2, 8, dtype=np.float32)}},
                        ("rope_freq_factors",)),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_matches_llama_cpp(tmp_path, case):
    """llama.cpp's granite (an epsilon of 0.1: its fold matters too); each fold undone is far."""
    pytest.importorskip("llama_cpp")
    kw, matter = GGUF_CASES[case]
    path = tmp_path / "g.gguf"
    keys = dict(FILE_KEYS, attention__layer_norm_rms_epsilon=EPS)
    keys.update({k: v for k, v in kw.items() if k not in ("tied", "extra")})
    _granite_file(path, tied=kw.get("tied", True), extra=kw.get("extra"), **keys)
    ours = Transformer.load(path)
    ref = llama_cpp_logits(path, IDS)
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    undo = {"embedding_scale": None, "rope_attention_factor": None, "norm_eps": EPS,
            "rope_freq_factors": None}
    for name in matter:
        assert _far(_without(ours, **{name: undo[name]}), ref), name


def test_quantized_gguf_matches_llama_cpp(tmp_path):
    """A Q8_0 file run natively (q8_0 blocks, int8 activations): llama.cpp's Q8_0 products
    quantize the activations alike, so the two agree near the quantization's error, and the
    embedding scale undone is far beyond it."""
    pytest.importorskip("llama_cpp")
    path = tmp_path / "g.gguf"
    _granite_file(path, types=(Q.Q8_0,), **FILE_KEYS)
    ours = Transformer.load(path, weight_dtype="q8_0")
    assert ours.config.weight_dtype == "q8_0"
    ref = llama_cpp_logits(path, IDS)
    tol = 2e-2 * np.abs(ref).max()
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=tol)
    plain = _without(ours, embedding_scale=None).forward(IDS).logits
    assert np.abs(plain - ref).max() > 10 * tol


@pytest.mark.parametrize("weight_dtype", [None, "q8_0"])
def test_save_gguf_round_trip(tmp_path, weight_dtype):
    """Written back (granite, residual and logit scales 1, the attention factor as its
    attention scale), the file computes the same logits in fastspec and llama.cpp."""
    _granite_file(tmp_path / "g.gguf", **FILE_KEYS)
    ours = Transformer.load(tmp_path / "g.gguf", weight_dtype=weight_dtype)
    save_gguf(ours, tmp_path / "out.gguf", source=tmp_path / "g.gguf")
    meta = {f.name: f.contents() for f in gguf.GGUFReader(tmp_path / "out.gguf").fields.values()}
    assert meta["general.architecture"] == "granite"
    assert (meta["granite.residual_scale"], meta["granite.logit_scale"]) == (1.0, 1.0)
    assert not any(k.startswith("granite.rope.scaling") for k in meta)
    again = Transformer.load(tmp_path / "out.gguf", weight_dtype=weight_dtype)
    want = ours.forward(IDS).logits
    np.testing.assert_allclose(again.forward(IDS).logits, want, atol=1e-5 * np.abs(want).max())
    if weight_dtype is None:
        pytest.importorskip("llama_cpp")
        np.testing.assert_allclose(llama_cpp_logits(tmp_path / "out.gguf", IDS), want,
                                   atol=1e-4 * np.abs(want).max())


def test_rope_off_is_refused(tmp_path):
    """llama.cpp runs a granite file whose ``rope.scaling.finetuned`` is false without RoPE."""
    _granite_file(tmp_path / "g.gguf", rope__scaling__finetuned=False)
    with pytest.raises(ValueError, match="granite.rope.scaling.finetuned"):
        Transformer.load(tmp_path / "g.gguf")
    _granite_file(tmp_path / "t.gguf", rope__scaling__finetuned=True)
    assert Transformer.load(tmp_path / "t.gguf").config.embedding_scale is None


def test_absent_or_zero_keys_are_none(tmp_path):
    """As llama.cpp: 0 or no key is no multiplier (attention: 1/sqrt(head_dim))."""
    _granite_file(tmp_path / "a.gguf")
    _granite_file(tmp_path / "z.gguf", embedding_scale=0.0, residual_scale=0.0,
                  attention__scale=0.0, logit_scale=0.0)
    _granite_file(tmp_path / "one.gguf", embedding_scale=1.0, residual_scale=1.0,
                  attention__scale=0.25, logit_scale=1.0)
    configs = [Transformer.load(tmp_path / n).config for n in ("a.gguf", "z.gguf", "one.gguf")]
    assert configs[0] == configs[1]
    assert configs[0].embedding_scale is None and configs[0].rope_attention_factor is None
    assert configs[2].rope_attention_factor is None  # 0.25 = 1/sqrt(16): no factor
    assert configs[0].norm_eps == pytest.approx(1e-6)


@pytest.mark.parametrize("key, value", [("residual_scale", -0.5), ("logit_scale", float("nan")),
                                        ("attention__scale", float("inf"))])
def test_bad_gguf_keys_are_named(tmp_path, key, value):
    _granite_file(tmp_path / "g.gguf", **{key: value})
    with pytest.raises(ValueError, match=key.replace("__", ".")):
        Transformer.load(tmp_path / "g.gguf")


def test_granite_keys_in_a_llama_file_are_refused(tmp_path):
    write_model(tmp_path / "l.gguf", arch="llama", dim=64, n_layers=1, n_heads=4, n_kv=2,
                ffn=96, types=(Q.F32,), metadata={"llama.residual_scale": (0.5, V.FLOAT32)})
    with pytest.raises(ValueError, match="llama.residual_scale"):
        Transformer.load(tmp_path / "l.gguf")


def _hf(**changes) -> dict:
    return dict(TINY, architectures=["GraniteForCausalLM"], rms_norm_eps=1e-5, **changes)


@pytest.mark.parametrize("key", list(MULTIPLIERS))
@pytest.mark.parametrize("bad", [0, -1.0, "2", float("nan"), True])
def test_bad_multipliers_are_named(key, bad):
    with pytest.raises(ValueError, match=key):
        hf_config(_hf(**{key: bad}))


@pytest.mark.parametrize("key, value", [("residual_multiplier", 1e-200),
                                        ("residual_multiplier", 1e200),
                                        ("residual_multiplier", 1e-40),
                                        ("embedding_multiplier", 1e-320),
                                        ("attention_multiplier", 1e-90)])
def test_folds_beyond_float_range_are_named(key, value):
    with pytest.raises(ValueError, match=key):
        hf_config(_hf(**{key: value}))


@pytest.mark.hf
def test_tiny_logits_scaling_is_refused(hf_granite, tmp_path):
    folder, _ = hf_granite
    out = tmp_path / "g"
    out.mkdir()
    for f in folder.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(cfg, logits_scaling=1e-200)))
    with pytest.raises(ValueError, match="logits_scaling"):
        Transformer.load(out)


def test_multipliers_default_to_transformers():
    """transformers' GraniteConfig defaults every multiplier to 1 (the attention one too)."""
    c = hf_config(_hf())
    assert c.embedding_scale is None and c.norm_eps == 1e-5
    assert c.rope_attention_factor == pytest.approx(np.sqrt(4.0))  # sqrt(1 * sqrt(16))
    assert hf_config(dict(_hf(), architectures=["LlamaForCausalLM"])).rope_attention_factor is None


@pytest.mark.parametrize("kw, match", [({"embedding_scale": 0.0}, "embedding_scale"),
                                       ({"embedding_scale": float("nan")}, "embedding_scale"),
                                       ({"embedding_scale": 2.0, "positional": "learned",
                                         "norm": "layernorm", "activation": "tanh"},
                                        "positional='rope'")])
def test_config_refuses_bad_embedding_scales(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=8, dim=16, n_layers=1, n_heads=2, **kw)


def test_embedding_scale_of_one_is_none_and_round_trips(tmp_path):
    base = dict(vocab_size=8, dim=16, n_layers=1, n_heads=2)
    assert ModelConfig(**base, embedding_scale=1).embedding_scale is None
    assert "embedding_scale" not in ModelConfig(**base).to_dict()
    c = ModelConfig(**base, embedding_scale=2.5)
    assert ModelConfig.from_dict(c.to_dict()) == c
    model = Transformer.random(c, seed=1)
    model.save(tmp_path / "m.npz")
    assert Transformer.load(tmp_path / "m.npz").config.embedding_scale == 2.5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_embedding_scale_multiplies_the_rows(backend, dtype):
    """The scale is one multiply of each gathered row: the same bits as a model whose
    embedding rows were multiplied (untied head), on chains and trees alike."""
    c = ModelConfig.tiny_llama(dtype=dtype, n_layers=2, tie_embeddings=False,
                               embedding_scale=3.7)
    model = Transformer.random(c, seed=2)
    scaled = Transformer(c.replace(embedding_scale=None),
                         model.embed * np.asarray(3.7, model.embed.dtype), model.layers,
                         model.head, model.final_norm)
    ids = [5, 7, 9, 100, 3]
    np.testing.assert_array_equal(model.forward(ids).logits, scaled.forward(ids).logits)
    parents = np.array([-1, 0, 0, 1, 2])
    for m in (model, scaled):
        m.tree = m.step(ids, m.new_cache(), tree_parents=parents).logits
    np.testing.assert_array_equal(model.tree, scaled.tree)
    plain = _without(model, embedding_scale=None).forward(ids).logits
    assert np.abs(plain - scaled.forward(ids).logits).max() > 1e-2


@pytest.mark.parametrize("kw", [{"qk_norm": True}, {"qkv_bias": True}])
def test_writers_refuse_what_granite_cannot_hold(tmp_path, kw):
    c = ModelConfig(vocab_size=64, dim=64, n_layers=1, n_heads=4, embedding_scale=2.0, **kw)
    model = Transformer.random(c)
    with pytest.raises(ValueError, match="embedding_scale"):
        save_gguf(model, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="embedding_scale"):
        save_hf(model, tmp_path / "x")


@pytest.mark.hf
def test_equal_embedding_and_residual_multipliers_are_written_back(tmp_path):
    """With m_e == m_r there is no embedding scale, but the attention factor and the folded
    epsilon make it a Granite still: written as one, transformers computes the same."""
    cfg = dict(**TINY, embedding_multiplier=0.5, residual_multiplier=0.5,
               attention_multiplier=0.03, rms_norm_eps=EPS)
    ref = hf_reference("GraniteForCausalLM", cfg, IDS, tmp_path / "in", seed=1)
    ours = Transformer.load(tmp_path / "in")
    assert ours.config.embedding_scale is None and ours.config.norm_eps == pytest.approx(EPS / .25)
    save_hf(ours, tmp_path / "out")
    got = transformers_logits(tmp_path / "out", IDS)
    np.testing.assert_allclose(got, ref, atol=1e-4 * np.abs(ref).max())
