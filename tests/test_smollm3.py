"""SmolLM3: a Llama whose every fourth layer turns no RoPE (``ModelConfig.nope_layers``).
Checked against transformers' ``SmolLM3ForCausalLM`` and llama.cpp's ``smollm3``, with the
model that turns every layer as the negative control."""
import json

import numpy as np
import pytest

from fastspec import ModelConfig, Transformer
from fastspec.formats.gguf_write import save_gguf
from fastspec.formats.hf_folder import hf_config, save_hf

from _helpers import hf_reference, llama_cpp_logits, transformers_logits

IDS = np.random.default_rng(11).integers(0, 300, 90)
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_theta=10000.0, rms_norm_eps=1e-6, pad_token_id=None)


def _all_turned(model: Transformer) -> Transformer:
    """The same weights with RoPE in every layer (the negative control)."""
    return Transformer(model.config.replace(nope_layers=None), model.embed, model.layers,
                       model.head, model.final_norm)


def _far(model: Transformer, ref: np.ndarray) -> bool:
    return np.abs(model.forward(IDS).logits - ref).max() > 1e-2 * np.abs(ref).max()


@pytest.fixture(scope="module")
def hf_smollm3(tmp_path_factory):
    """(folder, transformers logits over IDS) of a random SmolLM3ForCausalLM."""
    folder = tmp_path_factory.mktemp("smollm3")
    return folder, hf_reference("SmolLM3ForCausalLM", TINY, IDS, folder)


@pytest.mark.hf
def test_folder_matches_transformers(hf_smollm3):
    folder, ref = hf_smollm3
    ours = Transformer.load(folder)
    assert ours.config.nope_layers == (3,)  # transformers' default: every fourth layer
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    assert _far(_all_turned(ours), ref)


@pytest.mark.hf
def test_save_hf_is_read_back_by_transformers(hf_smollm3, tmp_path):
    folder, ref = hf_smollm3
    ours = Transformer.load(folder)
    save_hf(ours, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["SmolLM3ForCausalLM"]
    assert written["no_rope_layers"] == [1, 1, 1, 0]
    got = transformers_logits(tmp_path / "out", IDS)
    np.testing.assert_allclose(got, ref, atol=1e-4 * np.abs(ref).max())


def _smollm3_file(path, **kw):
    pytest.importorskip("gguf")
    from _gguf_writer import write_model
    return write_model(path, arch="smollm3", dim=64, n_layers=8, n_heads=4, n_kv=2, ffn=96,
                       **kw)


def test_gguf_matches_llama_cpp(tmp_path):
    """llama.cpp turns no RoPE in layers 3 and 7 of an 8-layer smollm3 file (no key says so)."""
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q
    path = tmp_path / "s.gguf"
    _smollm3_file(path, types=(Q.F32,))
    ours = Transformer.load(path)
    assert ours.config.nope_layers == (3, 7)
    ref = llama_cpp_logits(path, IDS)
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    assert _far(_all_turned(ours), ref)


def test_quantized_gguf_matches_llama_cpp(tmp_path):
    """The quantized runner (q8_0 blocks kept) skips RoPE in the same layers: within llama.cpp's
    own Q8_0 distance (random weights over 8 layers: 3% of the largest logit, as the float
    model's), the all-RoPE model more than twice that off."""
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q
    path = tmp_path / "s.gguf"
    _smollm3_file(path, types=(Q.Q8_0,))
    ours = Transformer.load(path, weight_dtype="q8_0")
    ref = llama_cpp_logits(path, IDS)
    tol = 4e-2 * np.abs(ref).max()
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=tol)
    assert np.abs(_all_turned(ours).forward(IDS).logits - ref).max() > 2 * tol


@pytest.mark.parametrize("weight_dtype", [None, "q8_0"])
def test_save_gguf_round_trip(tmp_path, weight_dtype):
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q
    _smollm3_file(tmp_path / "s.gguf", types=(Q.F32,))
    ours = Transformer.load(tmp_path / "s.gguf", weight_dtype=weight_dtype)
    save_gguf(ours, tmp_path / "out.gguf", source=tmp_path / "s.gguf")
    back = Transformer.load(tmp_path / "out.gguf", weight_dtype=weight_dtype)
    assert back.config == ours.config
    np.testing.assert_array_equal(back.forward(IDS).logits, ours.forward(IDS).logits)


@pytest.mark.parametrize("weight_dtype", [None, "float64", "float16", "bfloat16", "q8_0"])
def test_every_runner_skips_the_layers(backend, weight_dtype):
    """Each storage's runner (and the NumPy twin) leaves the NoPE layers' q/k unturned: the
    model agrees with itself across backends (bf16 and q8_0 within their rounding, 2e-3 of
    the largest logit measured with and without NoPE layers) and differs from the all-RoPE
    one."""
    c = ModelConfig(vocab_size=300, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=96,
                    max_seq_len=128, nope_layers=(1, 3), weight_dtype=weight_dtype,
                    dtype="float64" if weight_dtype == "float64" else "float32")
    model = Transformer.random(c, seed=3)
    got = model.forward(IDS).logits
    assert np.abs(_all_turned(model).forward(IDS).logits - got).max() > 1e-2 * np.abs(got).max()
    import fastspec as fs
    with fs.using_backend("numpy"):
        model.invalidate()
        twin = model.forward(IDS).logits
    tol = 5e-3 if weight_dtype in ("bfloat16", "q8_0") else 1e-5
    np.testing.assert_allclose(got, twin, atol=tol * np.abs(twin).max())


@pytest.mark.parametrize("bad, match", [((4,), "nope_layers"), ((-1,), "nope_layers"),
                                        ((True,), "nope_layers"), ("3", "nope_layers"),
                                        (3, "nope_layers")])
def test_config_refuses_bad_layers(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ModelConfig(vocab_size=8, dim=16, n_layers=4, n_heads=2, nope_layers=bad)


def test_config_normalizes_and_round_trips(tmp_path):
    base = dict(vocab_size=8, dim=16, n_layers=4, n_heads=2)
    assert ModelConfig(**base, nope_layers=()).nope_layers is None
    c = ModelConfig(**base, nope_layers=[3, 1, 3])
    assert c.nope_layers == (1, 3) and hash(c)
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    Transformer.random(c).save(tmp_path / "m.npz")
    assert Transformer.load(tmp_path / "m.npz").config == c
    with pytest.raises(ValueError, match="positional='rope'"):
        ModelConfig(**dict(base, positional="learned", norm="layernorm", activation="tanh"),
                    nope_layers=(1,))
    with pytest.raises(ValueError, match="rope_attention_factor"):  # RoPE's tables carry it
        ModelConfig(**base, nope_layers=(1,), rope_attention_factor=1.5)


def test_hf_config_flags():
    cfg = dict(TINY, architectures=["SmolLM3ForCausalLM"])
    assert hf_config(cfg).nope_layers == (3,)
    assert hf_config(dict(cfg, no_rope_layers=[0, 1, 1, 1])).nope_layers == (0,)
    assert hf_config(dict(cfg, no_rope_layer_interval=2)).nope_layers == (1, 3)
    assert hf_config(dict(cfg, no_rope_layers=[1, 1, 1, 1])).nope_layers is None
    for bad in ([1, 1, 1], [1, 2, 1, 1], "1110", [True, 1, 1, 0]):
        with pytest.raises(ValueError, match="no_rope_layers"):
            hf_config(dict(cfg, no_rope_layers=bad))
    with pytest.raises(ValueError, match="no_rope_layer_interval"):
        hf_config(dict(cfg, no_rope_layer_interval=0))
    with pytest.raises(ValueError, match="sliding"):
        hf_config(dict(cfg, use_sliding_window=True))
    layer_types = ["full_attention"] * 3 + ["sliding_attention"]
    with pytest.raises(ValueError, match="sliding_attention"):  # transformers masks by these
        hf_config(dict(cfg, sliding_window=8, layer_types=layer_types))
    with pytest.raises(ValueError, match="sliding_attention"):
        hf_config(dict(cfg, architectures=["Qwen2ForCausalLM"], layer_types=layer_types))
    # transformers' SmolLM3Config ties when config.json says nothing (a Llama does not)
    assert hf_config(cfg).tie_embeddings is True
    assert hf_config(dict(cfg, architectures=["LlamaForCausalLM"])).tie_embeddings is False
    assert hf_config(dict(cfg, tie_word_embeddings=False)).tie_embeddings is False


def test_gguf_writer_refuses_other_layers(tmp_path):
    """llama.cpp's smollm3 turns no RoPE in every fourth layer, whatever the file says."""
    pytest.importorskip("gguf")
    c = ModelConfig(vocab_size=64, dim=64, n_layers=4, n_heads=4, nope_layers=(1,))
    with pytest.raises(ValueError, match="every fourth"):
        save_gguf(Transformer.random(c), tmp_path / "x.gguf")


def test_context_kv_skips_the_layers():
    """DFlash's K/V injection (``write_context_kv``) leaves a NoPE layer's keys unturned on both
    backends: the NoPE layer's keys are the plain projections."""
    import fastspec as fs
    c = ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                    max_seq_len=64, nope_layers=(1,))
    model = Transformer.random(c, seed=4)
    feats = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    caches = {}
    for name in fs.available_backends():
        with fs.using_backend(name):
            model.invalidate()
            cache = model.new_cache()
            cache.advance(3)  # positions 3.. : RoPE would turn them
            model.write_context_kv(feats, cache)
            caches[name] = cache.k.copy()
    plain = (feats @ model.layers[1].wk).reshape(5, 2, 16).transpose(1, 0, 2)
    for k in caches.values():
        np.testing.assert_allclose(k[1, :, 3:8], plain, rtol=1e-5, atol=1e-5)
        assert np.abs(k[0, :, 3:8] - (feats @ model.layers[0].wk).reshape(5, 2, 16)
                      .transpose(1, 0, 2)).max() > 1e-2
