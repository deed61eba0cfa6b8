"""Phi-3 GGUF files (llama.cpp's ``phi3``: Phi-3-mini, Phi-3.5-mini, as Ollama pulls them):
fused ``attn_qkv`` and ``ffn_up`` tensors split as views, LongRoPE's short factors with its
attention factor (``ModelConfig.rope_attention_factor``), the context they serve.

Oracles: transformers' ``Phi3ForCausalLM`` (``rope_type="longrope"``) holding the weights the
file holds, and llama.cpp itself where llama-cpp-python is installed; each parity check is
paired with the model without the factors, and without the attention factor, failing it.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastspec.formats.hf_rope import rope_attention_factor, rope_context, rope_freq_factors
from fastspec.model import ModelConfig, Transformer
from fastspec.model.functional import rope_tables

gguf = pytest.importorskip("gguf")
from _helpers import llama_cpp_logits  # noqa: E402
from _gguf_writer import write_model  # noqa: E402  (needs gguf)
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

HD = 16
SHORT = np.linspace(1.0, 3.0, HD // 2).astype(np.float32)
LONG = np.linspace(1.0, 20.0, HD // 2).astype(np.float32)
#: Mixed types: every fused tensor is cut through the blocks of one of them.
TYPES = (Q.Q8_0, Q.Q4_K, Q.F16, Q.Q6_K, Q.Q4_0, Q.Q4_1, Q.F32)


def _attention(context: int, original: int) -> float:
    """transformers' default LongRoPE attention factor."""
    return math.sqrt(1 + math.log(context / original) / math.log(original))


def phi3_file(path, original=64, context=256, types=(Q.F32,), dim=64, factors=True,
              attn=True, rotary=HD, **kw):
    """A random ``phi3`` GGUF file with LongRoPE (over ``rotary`` dims of each head); its
    weights under HF's separate names."""
    meta = {"phi3.context_length": (context, V.UINT32),
            "phi3.attention.sliding_window": (47, V.UINT32),
            "phi3.rope.dimension_count": (rotary, V.UINT32)}
    if original is not None:
        meta["phi3.rope.scaling.original_context_length"] = (original, V.UINT32)
    if attn:
        meta["phi3.rope.scaling.attn_factor"] = (_attention(context, original or 256),
                                                 V.FLOAT32)
    extra = {"rope_factors_short.weight": SHORT[:rotary // 2],
             "rope_factors_long.weight": LONG[:rotary // 2]}
    extra = {k: v for k, v in ((extra if factors else {}) | kw.pop("extra", {})).items()
             if k not in kw.get("skip", ())}
    return write_model(path, arch="phi3", dim=dim, n_layers=2, n_heads=dim // HD, n_kv=2,
                       ffn=256, vocab=300, types=types, metadata=dict(meta, **kw.pop("meta", {})),
                       extra=extra, **kw)


def _without(model: Transformer, **changes) -> Transformer:
    return Transformer(model.config.replace(**changes), embed=model.embed, layers=model.layers,
                       head=model.head, final_norm=model.final_norm)


def _transformers_logits(state: dict, c: ModelConfig, ids, context: int, original: int,
                         rotary: int = HD):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Phi3Config(
        vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, max_position_embeddings=context,
        original_max_position_embeddings=original, rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=False, sliding_window=None,
        rope_scaling={"rope_type": "longrope", "short_factor": SHORT[:rotary // 2].tolist(),
                      "long_factor": LONG[:rotary // 2].tolist()},
        partial_rotary_factor=rotary / HD, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.Phi3ForCausalLM(cfg).eval()
    sd = {k: torch.tensor(v) for k, v in state.items()}
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.qkv_proj.weight"] = torch.cat(
            [sd.pop(f"{p}self_attn.{x}_proj.weight") for x in "qkv"])
        sd[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [sd.pop(p + "mlp.gate_proj.weight"), sd.pop(p + "mlp.up_proj.weight")])
    model.load_state_dict(sd, strict=True)
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids)[None])).logits[0].double().numpy()


@pytest.mark.hf
@pytest.mark.parametrize("rotary", [HD, 12])
def test_gguf_matches_transformers(tmp_path, backend, rotary):
    """Mixed quant types (the fused tensors cut through their blocks), LongRoPE's short
    factors and attention factor, partial rotary (12 of 16, as Phi-4-mini's 96 of 128):
    transformers' Phi-3 with the file's weights."""
    path = tmp_path / "phi3.gguf"
    state = phi3_file(path, types=TYPES, dim=256, rotary=rotary)
    ours = Transformer.load(path)
    c = ours.config
    assert c.rope_freq_factors == tuple(SHORT[:rotary // 2].tolist()) and c.max_seq_len == 64
    assert c.rope_attention_factor == pytest.approx(_attention(256, 64), rel=1e-7)
    assert c.rope_dims == (None if rotary == HD else rotary)
    ids = np.random.default_rng(1).integers(0, c.vocab_size, 60)
    ref = _transformers_logits(state, c, ids, 256, 64, rotary)
    np.testing.assert_allclose(ours.forward(ids).logits, ref, atol=1e-4, rtol=0)
    for changes in ({"rope_freq_factors": None}, {"rope_attention_factor": None}):
        assert np.abs(_without(ours, **changes).forward(ids).logits - ref).max() > 1e-2


#: phi3 files as llama.cpp runs them at a context of 256: (file, max_seq_len, the settings
#: that must matter). Only long factors: llama.cpp has no short ones to run (plain RoPE);
#: no original length: the short ones at every context.
LLAMA_CPP_CASES = {
    "both factors": (dict(original=256, context=1024), 256,
                     ("rope_freq_factors", "rope_attention_factor")),
    "partial rotary": (dict(original=256, context=1024, rotary=12), 256,
                       ("rope_freq_factors", "rope_attention_factor")),
    "long factors only": (dict(original=256, context=1024,
                               skip=("rope_factors_short.weight",)), 256,
                          ("rope_attention_factor",)),
    "no original length": (dict(original=None, context=1024), 1024,
                           ("rope_freq_factors", "rope_attention_factor")),
}


@pytest.mark.parametrize("case", list(LLAMA_CPP_CASES))
def test_gguf_matches_llama_cpp(tmp_path, case):
    """llama.cpp runs the short factors at a context of at most the original one (its context
    is rounded up to 256) and multiplies cos and sin by the attention factor."""
    pytest.importorskip("llama_cpp")
    kw, context, matter = LLAMA_CPP_CASES[case]
    path = tmp_path / "phi3.gguf"
    phi3_file(path, **kw)
    ours = Transformer.load(path)
    assert ours.config.max_seq_len == context
    assert (ours.config.rope_freq_factors is None) == ("rope_freq_factors" not in matter)
    ids = np.random.default_rng(2).integers(0, ours.config.vocab_size, 200)
    ref = llama_cpp_logits(path, ids)
    np.testing.assert_allclose(ours.forward(ids).logits, ref, atol=2e-4, rtol=0)
    for name in matter:
        assert np.abs(_without(ours, **{name: None}).forward(ids).logits - ref).max() > 1e-2


def test_attn_factor_in_any_file(tmp_path):
    """llama.cpp multiplies cos and sin by ``rope.scaling.attn_factor`` whatever the
    architecture (a qwen2 file here)."""
    pytest.importorskip("llama_cpp")
    path = tmp_path / "qwen2.gguf"
    write_model(path, arch="qwen2", dim=64, n_layers=2, n_heads=4, n_kv=2, ffn=96,
                types=(Q.F32,), metadata={"qwen2.rope.scaling.attn_factor": (1.4, V.FLOAT32)})
    ours = Transformer.load(path)
    assert ours.config.rope_attention_factor == pytest.approx(1.4)
    ids = np.random.default_rng(5).integers(0, ours.config.vocab_size, 100)
    ref = llama_cpp_logits(path, ids)
    np.testing.assert_allclose(ours.forward(ids).logits, ref, atol=2e-4, rtol=0)
    plain = _without(ours, rope_attention_factor=None).forward(ids).logits
    assert np.abs(plain - ref).max() > 1e-2


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_fused_blocks_are_kept(tmp_path, kind):
    """A quantized file's fused tensors load natively: each part holds its rows' blocks."""
    path = tmp_path / "phi3.gguf"
    phi3_file(path, types=(getattr(Q, kind.upper()),), dim=256)
    model = Transformer.load(path, weight_dtype="auto")
    assert model.config.weight_dtype == kind
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}
    lw = model.layers[1]
    q, kv = 256, 2 * HD
    qkv, up = raw["blk.1.attn_qkv.weight"], raw["blk.1.ffn_up.weight"]
    for got, want in ((lw.wq, qkv[:q]), (lw.wk, qkv[q:q + kv]), (lw.wv, qkv[q + kv:]),
                      (lw.w_gate, up[:256]), (lw.w_up, up[256:])):
        np.testing.assert_array_equal(got.to_blocks(), want)


def test_saved_as_llama(tmp_path):
    """``fastspec quantize``/``save``: a Phi-3 model is written as the llama it computes
    (q/k permuted, the short factors as rope_freqs, the attention factor as a key), and reads
    back to the same logits, in fastspec and in llama.cpp."""
    from fastspec.formats.gguf import GGUFFile
    from fastspec.formats.gguf_write import save_gguf

    src, out = tmp_path / "phi3.gguf", tmp_path / "llama.gguf"
    phi3_file(src, original=256, context=1024)
    model = Transformer.load(src)
    save_gguf(model, out, source=src)
    f = GGUFFile(out)
    assert f.architecture == "llama" and "rope_freqs.weight" in f._tensors
    assert not [k for k in f.metadata if k.startswith("phi3.")]
    assert f.metadata["llama.rope.scaling.attn_factor"] == pytest.approx(_attention(1024, 256))
    back = Transformer.load(out)
    assert back.config == model.config
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, 100)
    np.testing.assert_array_equal(back.forward(ids).logits, model.forward(ids).logits)
    np.testing.assert_allclose(model.forward(ids).logits, llama_cpp_logits(out, ids),
                               atol=2e-4, rtol=0)


def test_without_longrope(tmp_path):
    """Phi-3-mini-4k: no factors, no attention factor, a sliding window that llama.cpp does
    not run (nor fastspec): the file's context."""
    path = tmp_path / "phi3.gguf"
    phi3_file(path, factors=False, attn=False, original=64, context=256)
    c = Transformer.load(path).config
    assert (c.rope_freq_factors, c.rope_attention_factor, c.max_seq_len) == (None, None, 256)


@pytest.mark.parametrize("change, match", [
    (dict(reshape={"blk.0.attn_qkv.weight": (64, 128)}), r"'blk\.0\.attn_qkv\.weight'.*rows"),
    (dict(reshape={"blk.1.ffn_up.weight": (128, 256)}), r"'blk\.1\.ffn_up\.weight'.*rows"),
    (dict(meta={"phi3.rope.scaling.attn_factor": (0.0, V.FLOAT32)}), "attn_factor"),
    (dict(meta={"phi3.rope.scaling.attn_factor": ("x", V.STRING)}), "attn_factor"),
    (dict(meta={"phi3.rope.scaling.original_context_length": (0, V.INT32)}),
     "original_context_length"),
    (dict(meta={"phi3.rope.scaling.original_context_length": ("64", V.STRING)}, factors=False),
     "original_context_length"),
    (dict(extra={"rope_factors_long.weight": np.ones(3, np.float32)}, factors=False),
     r"'rope_factors_long\.weight'.*shape"),
])
def test_bad_files_are_named(tmp_path, change, match):
    path = tmp_path / "phi3.gguf"
    phi3_file(path, **change)
    with pytest.raises(ValueError, match=match):
        Transformer.load(path)


def test_tensors_without_config(tmp_path):
    """``GGUFFile.tensors`` splits the fused tensors itself (``config`` not asked first)."""
    from fastspec.formats.gguf import GGUFFile

    path = tmp_path / "phi3.gguf"
    phi3_file(path)
    config = GGUFFile(path).config()
    names = {hf for hf, _ in GGUFFile(path).tensors(config)}
    assert "model.layers.1.self_attn.v_proj.weight" in names
    assert "model.layers.1.mlp.gate_proj.weight" in names


def test_fused_beside_its_part_is_refused(tmp_path):
    path = tmp_path / "phi3.gguf"
    rng = np.random.default_rng(0)
    write_model(path, arch="phi3", dim=64, n_layers=1, n_heads=4, n_kv=2, ffn=256, vocab=300,
                types=(Q.F32,), extra={"blk.0.attn_q.weight":
                                       rng.normal(size=(64, 64)).astype(np.float32)})
    with pytest.raises(ValueError, match=r"fused.*'blk\.0\.attn_q\.weight'"):
        Transformer.load(path)


def test_sliding_window_still_refused_elsewhere(tmp_path):
    path = tmp_path / "llama.gguf"
    write_model(path, arch="llama", dim=64, n_layers=1, n_heads=4, n_kv=2, ffn=96, vocab=300,
                types=(Q.F32,), metadata={"llama.attention.sliding_window": (100, V.UINT32)})
    with pytest.raises(ValueError, match="sliding_window"):
        Transformer.load(path)


# --- the config field and the config.json rule ------------------------------------------

def test_config_field(tmp_path):
    base = dict(vocab_size=64, dim=64, n_layers=1, n_heads=4)
    c = ModelConfig(**base, rope_attention_factor=1.25)
    assert c.rope_attention_factor == 1.25 and hash(c)
    assert ModelConfig.from_dict(c.to_dict()) == c
    assert ModelConfig(**base, rope_attention_factor=1).rope_attention_factor is None
    assert "rope_attention_factor" not in ModelConfig(**base).to_dict()
    for bad in (0, -1.0, float("nan"), float("inf"), "2", True):
        with pytest.raises(ValueError, match="rope_attention_factor"):
            ModelConfig(**base, rope_attention_factor=bad)
    with pytest.raises(ValueError, match="positional='rope'"):
        ModelConfig(**dict(base, positional="learned"), rope_attention_factor=2.0)
    model = Transformer.random(c, seed=0)
    model.save(tmp_path / "m.npz")
    assert Transformer.load(tmp_path / "m.npz").config == c
    model.save(tmp_path / "folder")  # a Granite's attention multiplier (tests/test_granite.py)
    cfg = json.loads((tmp_path / "folder" / "config.json").read_text())
    assert cfg["architectures"] == ["GraniteForCausalLM"]
    back = Transformer.load(tmp_path / "folder")
    assert back.config.rope_attention_factor == pytest.approx(1.25, rel=1e-12)
    with pytest.raises(ValueError, match="rope_attention_factor"):  # no config.json form
        Transformer.random(c.replace(qk_norm=True)).save(tmp_path / "qk")


def test_tables_scaled():
    cos, sin = rope_tables(50, 16, 1e4, np.float64)
    c2, s2 = rope_tables(50, 16, 1e4, np.float64, attention_factor=1.5)
    np.testing.assert_allclose(c2, 1.5 * cos, rtol=1e-15)
    np.testing.assert_allclose(s2, 1.5 * sin, rtol=1e-15)


def test_longrope_config_json():
    """As transformers reads it (its ``_compute_longrope_parameters``), ``"su"`` included."""
    cfg = {"max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
           "hidden_size": 64, "num_attention_heads": 4,
           "rope_scaling": {"type": "su", "short_factor": SHORT.tolist(),
                            "long_factor": LONG.tolist()}}
    assert rope_freq_factors(cfg, HD) == tuple(SHORT.tolist())
    assert rope_attention_factor(cfg) == pytest.approx(_attention(131072, 4096))
    assert rope_context(cfg, 131072) == 4096
    cfg["rope_scaling"]["attention_factor"] = 1.5
    assert rope_attention_factor(cfg) == 1.5
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    del cfg["rope_scaling"]["attention_factor"]
    ref = transformers.Phi3Config(**{k: v for k, v in cfg.items() if k != "rope_scaling"},
                                  rope_scaling=dict(cfg["rope_scaling"], type="longrope"))
    _, attention = ROPE_INIT_FUNCTIONS["longrope"](ref, None)
    assert rope_attention_factor(cfg) == pytest.approx(attention, rel=1e-12)
    for bad, match in ((dict(short_factor=[1.0] * 3), "short_factor"),
                       (dict(short_factor=[1.0] * 7 + [0.0]), r"short_factor\[7\]")):
        with pytest.raises(ValueError, match=match):
            rope_freq_factors(dict(cfg, rope_scaling=dict(cfg["rope_scaling"], **bad)), HD)
    del cfg["original_max_position_embeddings"]
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rope_freq_factors(cfg, HD)


# --- Hugging Face folders -----------------------------------------------------------------

@pytest.mark.hf
@pytest.mark.parametrize("longrope", [True, False])
def test_folder_matches_transformers(tmp_path, backend, longrope):
    """A ``Phi3ForCausalLM`` folder (fused ``qkv_proj``/``gate_up_proj``): with LongRoPE it
    serves the original context; without it (Phi-3-mini-4k) its sliding window's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    scaling = {"rope_type": "longrope", "short_factor": SHORT.tolist(),
               "long_factor": LONG.tolist()} if longrope else None
    cfg = transformers.Phi3Config(
        vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        original_max_position_embeddings=64, rope_scaling=scaling, tie_word_embeddings=False,
        sliding_window=None if longrope else 100, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    model = transformers.Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # the default init is tiny; make every weight matter
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    ours = Transformer.load(tmp_path)
    assert ours.config.max_seq_len == (64 if longrope else 100)
    ids = np.random.default_rng(4).integers(0, 96, ours.config.max_seq_len - 4)
    with torch.no_grad():
        ref = model(torch.tensor(ids[None])).logits[0].double().numpy()
    np.testing.assert_allclose(ours.forward(ids).logits, ref, atol=1e-4, rtol=0)
    if longrope:
        for changes in ({"rope_freq_factors": None}, {"rope_attention_factor": None}):
            assert np.abs(_without(ours, **changes).forward(ids).logits - ref).max() > 1e-2


def test_folder_fused_rows_are_checked(tmp_path):
    import json

    from fastspec.formats.hf_folder import write_safetensors
    c = ModelConfig(vocab_size=32, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=80,
                    tie_embeddings=False)
    sd = {k: np.asarray(v, np.float32) for k, v in Transformer.random(c, 0).state_dict().items()}
    p = "model.layers.0."
    sd[p + "self_attn.qkv_proj.weight"] = np.concatenate(
        [sd.pop(f"{p}self_attn.{x}_proj.weight") for x in "qkv"])[:-16]  # one head short
    sd[p + "mlp.gate_up_proj.weight"] = np.concatenate(
        [sd.pop(p + "mlp.gate_proj.weight"), sd.pop(p + "mlp.up_proj.weight")])
    write_safetensors(tmp_path / "model.safetensors", sd)
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Phi3ForCausalLM"], "vocab_size": 32, "hidden_size": 64,
        "intermediate_size": 80, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "tie_word_embeddings": False}))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.qkv_proj\.weight'.*112"):
        Transformer.load(tmp_path)
    sd[p + "self_attn.qkv_proj.weight"] = np.zeros((128, 64), np.float32)
    sd[p + "self_attn.q_proj.weight"] = np.zeros((64, 64), np.float32)  # and a part beside it
    write_safetensors(tmp_path / "model.safetensors", sd)
    with pytest.raises(ValueError, match=r"fused.*'model\.layers\.0\.self_attn\.q_proj"):
        Transformer.load(tmp_path)


@pytest.mark.parametrize("change, match", [
    ({"partial_rotary_factor": 0.7}, "partial_rotary_factor"),  # 11.2 of 16: not even
    ({"partial_rotary_factor": "x"}, "partial_rotary_factor must be a positive finite"),
    ({"rope_parameters": [1]}, "rope_parameters"),
    ({"sliding_window": "abc"}, "sliding_window"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"sliding_window": 100.5}, "sliding_window"),
])
def test_bad_phi3_config_json(change, match):
    from fastspec.formats.hf_folder import hf_config
    cfg = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 32, "hidden_size": 64,
           "intermediate_size": 80, "num_hidden_layers": 1, "num_attention_heads": 4}
    assert hf_config(dict(cfg, partial_rotary_factor=None)).max_seq_len == 2048  # null: 1
    with pytest.raises(ValueError, match=match):
        hf_config(dict(cfg, **change))


def test_longrope_original_length_order():
    """The top level's original length wins over the RoPE object's, as in transformers."""
    cfg = {"max_position_embeddings": 1024, "original_max_position_embeddings": 64,
           "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT.tolist(),
                            "long_factor": LONG.tolist(),
                            "original_max_position_embeddings": 128}}
    assert rope_context(cfg, 1024) == 64
    assert rope_attention_factor(cfg) == pytest.approx(_attention(1024, 64))


# --- partial rotary (Phi-4-mini) ---------------------------------------------------------

def test_rotary_order_pairs():
    """After the reordering, the whole head's rotate-half pairs are partial rotary's pairs
    and pairs of pass-through rows."""
    from fastspec.formats.gguf_names import rotary_order
    order = rotary_order(96, 128)
    assert sorted(order) == list(range(128))
    for j in range(64):
        a, b = order[j], order[j + 64]
        assert (b == a + 48 and a < 48) if j < 48 else (a >= 96 and b >= 96)


def test_rope_dims_config_and_tables(tmp_path):
    base = dict(vocab_size=64, dim=64, n_layers=1, n_heads=4)  # head_dim 16
    c = ModelConfig(**base, rope_dims=12, rope_freq_factors=[2.0] * 6, rope_attention_factor=2)
    assert ModelConfig.from_dict(c.to_dict()) == c
    assert ModelConfig(**base, rope_dims=16).rope_dims is None
    assert "rope_dims" not in ModelConfig(**base).to_dict()
    for bad in (0, 7, 18, 2.5, "12"):
        with pytest.raises((ValueError, TypeError), match="rope_dims"):
            ModelConfig(**base, rope_dims=bad)
    with pytest.raises(ValueError, match="6"):
        ModelConfig(**base, rope_dims=12, rope_freq_factors=[2.0] * 8)
    cos, sin = rope_tables(40, 16, 1e4, np.float32, [2.0] * 6, 2.0, rope_dims=12)
    assert (cos[:, 6:] == 1).all() and (sin[:, 6:] == 0).all()  # exactly, not scaled
    full_cos, full_sin = rope_tables(40, 12, 1e4, np.float32, [2.0] * 6, 2.0)
    np.testing.assert_array_equal(cos[:, :6], full_cos)
    np.testing.assert_array_equal(sin[:, :6], full_sin)
    model = Transformer.random(c, seed=0)
    with pytest.raises(ValueError, match="rope_dims"):
        model.save(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="rope_dims"):
        model.save(tmp_path / "folder")
    model.save(tmp_path / "m.npz")
    assert Transformer.load(tmp_path / "m.npz").config == c


def test_partial_rotary_blocks_and_folders(tmp_path):
    """Native blocks are reordered by whole rows; a folder with partial rotary is refused."""
    from fastspec.formats.gguf_names import rotary_order
    path = tmp_path / "phi3.gguf"
    phi3_file(path, types=(Q.Q8_0,), dim=256, rotary=12)
    model = Transformer.load(path, weight_dtype="auto")
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}
    qkv, order = raw["blk.0.attn_qkv.weight"], rotary_order(12, HD)
    want_q = qkv[:256].reshape(16, HD, -1)[:, order].reshape(256, -1)
    np.testing.assert_array_equal(model.layers[0].wq.to_blocks(), want_q)
    want_v = qkv[256 + 2 * HD:]  # v is not reordered
    np.testing.assert_array_equal(model.layers[0].wv.to_blocks(), want_v)
    import json
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Phi3ForCausalLM"], "vocab_size": 32, "hidden_size": 64,
        "intermediate_size": 80, "num_hidden_layers": 1, "num_attention_heads": 4,
        "partial_rotary_factor": 0.75}))
    with pytest.raises(ValueError, match="partial rotary"):
        Transformer.load(folder)


@pytest.mark.parametrize("arch, rotary, match", [
    ("phi3", 30, None),  # 30 of 44: the count itself, not a factor rounded back
    ("phi3", 11, r"'phi3\.rope\.dimension_count' = 11"),
    ("phi3", 46, r"'phi3\.rope\.dimension_count' = 46"),
    ("qwen2", 30, r"'qwen2\.rope\.dimension_count' = 30"),
    ("qwen3", 30, r"'qwen3\.rope\.dimension_count' = 30"),
])
def test_rotary_counts(tmp_path, arch, rotary, match):
    """Partial rotary is a phi3 file's (NeoX, as llama.cpp), of an even count."""
    path = tmp_path / "m.gguf"
    write_model(path, arch=arch, dim=64, n_layers=1, n_heads=4, n_kv=2, head_dim=44, ffn=96,
                vocab=300, types=(Q.F32,), tied=True,
                metadata={f"{arch}.rope.dimension_count": (rotary, V.UINT32),
                          f"{arch}.attention.key_length": (44, V.UINT32),
                          f"{arch}.attention.value_length": (44, V.UINT32)})
    if match is None:
        assert Transformer.load(path).config.rope_dims == rotary
    else:
        with pytest.raises(ValueError, match=match):
            Transformer.load(path)


def test_factors_of_the_rotated_dims(tmp_path):
    """LongRoPE factors of a partial rotary file hold rope_dims / 2 values."""
    path = tmp_path / "phi3.gguf"
    phi3_file(path, rotary=12, extra={"rope_factors_short.weight": SHORT})  # 8, not 6
    with pytest.raises(ValueError, match=r"'rope_factors_short\.weight'.*\(6,\)"):
        Transformer.load(path)
