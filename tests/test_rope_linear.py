"""Linear RoPE scaling (positions divided by ``factor``, as DeepSeek-Coder's files have it): from
a ``config.json``'s ``rope_type="linear"`` and from a GGUF file's ``rope.scaling.*`` keys, run as
per-frequency divisors (``ModelConfig.rope_freq_factors``).

Oracles: transformers' ``LlamaForCausalLM`` with the same scaling (folders and GGUF files, the
latter through the weights the file holds) and llama.cpp itself where llama-cpp-python is
installed; each parity check is paired with plain RoPE failing it.
"""
from __future__ import annotations

import numpy as np
import pytest

from fastspec.formats.gguf_rope import rope_scaling
from fastspec.formats.hf_rope import rope_freq_factors
from fastspec.model import Transformer

from _helpers import llama_cpp_logits

FACTOR = 4.0
TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-6, rope_theta=10000.0)
IDS = np.random.default_rng(1).integers(0, TINY["vocab_size"], 96)


def _reference(state: dict | None = None, **config):
    """(transformers LlamaForCausalLM with linear scaling, its logits over ``ids``)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**dict(TINY, **config),
                                   rope_scaling={"rope_type": "linear", "factor": FACTOR})
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        if state is None:
            for p in model.parameters():  # the default init is tiny; make every weight matter
                p.add_(0.05 * torch.randn_like(p))
        else:
            model.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)
        ids = IDS if state is None else IDS % config["vocab_size"]
        return model, model(torch.tensor(ids[None])).logits[0].double().numpy()


def _plain(model: Transformer) -> Transformer:
    return Transformer(model.config.replace(rope_freq_factors=None), embed=model.embed,
                       layers=model.layers, head=model.head, final_norm=model.final_norm)


@pytest.mark.hf
def test_linear_folder_matches_transformers(tmp_path, backend):
    model, ref = _reference()
    model.save_pretrained(tmp_path)
    ours = Transformer.load(tmp_path)
    assert ours.config.rope_freq_factors == (FACTOR,) * 8
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4, rtol=0)
    cache = ours.new_cache()  # token by token past position 64
    ours.forward(IDS[:64], cache)
    steps = np.concatenate([ours.forward(IDS[i:i + 1], cache).logits for i in range(64, 96)])
    np.testing.assert_allclose(steps, ref[64:], atol=1e-4, rtol=0)
    assert np.abs(_plain(ours).forward(IDS).logits - ref).max() > 1e-2  # the scaling matters


def _linear_gguf(path, key="rope.scaling.factor", **extra):
    """A random llama GGUF file (float32 matrices) with linear scaling; its HF weights."""
    gguf = pytest.importorskip("gguf")
    from _gguf_writer import write_model
    from gguf import GGUFValueType as V

    meta = {"llama.rope.scaling.type": ("linear", V.STRING), f"llama.{key}": (FACTOR, V.FLOAT32)}
    meta.update(extra)
    return write_model(path, arch="llama", dim=64, n_layers=2, n_heads=4, n_kv=2, ffn=112,
                       vocab=101, types=(gguf.GGMLQuantizationType.F32,), metadata=meta)


@pytest.mark.hf
@pytest.mark.parametrize("key", ["rope.scaling.factor", "rope.scale_linear"])
def test_linear_gguf_matches_transformers(tmp_path, backend, key):
    """Both of llama.cpp's keys for the factor; the weights the file holds, in transformers."""
    path = tmp_path / "lin.gguf"
    state = _linear_gguf(path, key)
    ours = Transformer.load(path)
    assert ours.config.rope_freq_factors == (FACTOR,) * 8
    vocab = ours.config.vocab_size
    _, ref = _reference(state, vocab_size=vocab, max_position_embeddings=ours.config.max_seq_len,
                        rms_norm_eps=ours.config.norm_eps, tie_word_embeddings=False)
    ids = IDS % vocab
    np.testing.assert_allclose(ours.forward(ids).logits, ref, atol=1e-4, rtol=0)
    assert np.abs(_plain(ours).forward(ids).logits - ref).max() > 1e-2


def test_linear_gguf_matches_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp")
    path = tmp_path / "lin.gguf"
    _linear_gguf(path)
    ours = Transformer.load(path)
    ids = (IDS % ours.config.vocab_size).tolist()
    ref = llama_cpp_logits(path, ids, n_ctx=128)
    np.testing.assert_allclose(ours.forward(np.array(ids)).logits, ref, atol=2e-4, rtol=0)
    assert np.abs(_plain(ours).forward(np.array(ids)).logits - ref).max() > 1e-2


def test_linear_times_rope_freqs(tmp_path):
    """llama.cpp divides each frequency by rope_freqs[i] and scales every position: both."""
    pytest.importorskip("gguf")
    from fastspec.formats.gguf import GGUFFile
    from fastspec.formats.gguf_write import save_gguf

    path = tmp_path / "lin.gguf"
    _linear_gguf(path)
    model = Transformer.load(path)
    factors = tuple(float(1 + i) for i in range(8))
    both = tmp_path / "both.gguf"
    save_gguf(Transformer(model.config.replace(rope_freq_factors=factors), embed=model.embed,
                          layers=model.layers, head=model.head, final_norm=model.final_norm),
              both)
    file = GGUFFile(both)  # rope_freqs.weight, no scaling key; then a factor of 2 beside it
    assert file.config().rope_freq_factors == factors
    file.metadata.update({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    assert file.config().rope_freq_factors == tuple(2.0 * f for f in factors)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_saved_as_linear_keys(tmp_path, arch):
    """Equal divisors are written as llama.cpp's linear keys (any architecture), not as
    rope_freqs; a source file's scaling keys are not copied over them (no double scaling)."""
    pytest.importorskip("gguf")
    from _gguf_writer import write_model
    from gguf import GGUFValueType as V
    from fastspec.formats.gguf import GGUFFile, read_metadata
    from fastspec.formats.gguf_write import save_gguf

    src = tmp_path / "src.gguf"
    Q = __import__("gguf").GGMLQuantizationType
    write_model(src, arch=arch, dim=64, n_layers=1, n_heads=4, n_kv=2, ffn=128, vocab=101,
                types=(Q.Q8_0, Q.F32), metadata={f"{arch}.rope.scaling.type": ("linear", V.STRING),
                          f"{arch}.rope.scale_linear": (FACTOR, V.FLOAT32)})
    model = Transformer.load(src, weight_dtype="q8_0")
    assert model.config.rope_freq_factors == (FACTOR,) * 8
    out = tmp_path / "out.gguf"
    save_gguf(model, out, source=src)
    meta = read_metadata(out)
    assert meta[f"{arch}.rope.scaling.factor"] == FACTOR
    assert f"{arch}.rope.scale_linear" not in meta
    assert "rope_freqs.weight" not in GGUFFile(out)._tensors
    again = Transformer.load(out, weight_dtype="auto")
    assert again.config.rope_freq_factors == (FACTOR,) * 8
    ids = IDS % 101
    np.testing.assert_array_equal(again.forward(ids).logits, model.forward(ids).logits)


@pytest.mark.parametrize("meta, expected", [
    ({}, None),
    ({"rope.scaling.type": "none", "rope.scaling.factor": 8.0}, None),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 1.0}, None),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 0.0}, None),  # llama.cpp: 0 is 1
    ({"rope.scaling.factor": 2.5}, {"rope_type": "linear", "factor": 2.5}),  # type: linear
    ({"rope.scale_linear": 4.0}, {"rope_type": "linear", "factor": 4.0}),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 4.0, "rope.scale_linear": 2.0,
      "rope.scaling.original_context_length": 4096, "rope.scaling.finetuned": True},
     {"rope_type": "linear", "factor": 4.0}),  # the newer key wins
])
def test_gguf_keys(meta, expected):
    assert rope_scaling({f"llama.{k}": v for k, v in meta.items()}, "llama") == expected
    assert rope_scaling({f"qwen2.{k}": v for k, v in meta.items()}, "llama") is None


@pytest.mark.parametrize("meta, match", [
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, r"'yarn' is not supported"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 4.0,
      "rope.scaling.yarn_log_multiplier": 0.1},
     r"'llama\.rope\.scaling\.yarn_log_multiplier'"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": "4"}, "positive finite number"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": -2.0}, "positive finite number"),
    ({"rope.scaling.factor": float("nan")}, "positive finite number"),
    ({"rope.scaling.factor": True}, r"'llama\.rope\.scaling\.factor'.*positive finite"),
    ({"rope.scale_linear": "x"}, r"'llama\.rope\.scale_linear'.*positive finite"),
])
def test_bad_gguf_keys_are_named(meta, match):
    with pytest.raises(ValueError, match=match):
        rope_scaling({f"llama.{k}": v for k, v in meta.items()}, "llama")


def test_bad_gguf_scaling_names_the_file(tmp_path):
    pytest.importorskip("gguf")
    from gguf import GGUFValueType as V

    path = tmp_path / "yarn.gguf"
    _linear_gguf(path, **{"llama.rope.scaling.type": ("yarn", V.STRING)})
    with pytest.raises(ValueError, match=rf"{path}.*'yarn' is not supported"):
        Transformer.load(path)


@pytest.mark.hf
def test_linear_folder_saved_and_loaded(tmp_path):
    """Equal divisors are written back as config.json's linear scaling (a folder and a z-lab
    drafter folder's config), which transformers and fastspec read as the same model."""
    model, ref = _reference()
    model.save_pretrained(tmp_path / "a")
    ours = Transformer.load(tmp_path / "a")
    ours.save(tmp_path / "b")
    again = Transformer.load(tmp_path / "b")
    assert again.config.rope_freq_factors == (FACTOR,) * 8
    np.testing.assert_array_equal(again.forward(IDS).logits, ours.forward(IDS).logits)
    import json
    assert json.loads((tmp_path / "b" / "config.json").read_text())["rope_scaling"] == {
        "rope_type": "linear", "factor": FACTOR}
    per_frequency = ours.config.replace(rope_freq_factors=(1.0,) * 7 + (2.0,))
    with pytest.raises(ValueError, match="no config.json form"):
        Transformer(per_frequency, embed=ours.embed, layers=ours.layers, head=ours.head,
                    final_norm=ours.final_norm).save(tmp_path / "c")


@pytest.mark.parametrize("scaling, expected", [
    ({"rope_type": "linear", "factor": 2.0}, (2.0,) * 8),
    ({"type": "linear", "factor": 1.0}, None),
])
def test_config_json(scaling, expected):
    assert rope_freq_factors(dict(TINY, rope_scaling=scaling), 16) == expected


@pytest.mark.parametrize("scaling", [{"rope_type": "linear"},
                                     {"rope_type": "linear", "factor": 0},
                                     {"rope_type": "linear", "factor": True}])
def test_bad_config_json(scaling):
    with pytest.raises(ValueError, match="linear RoPE scaling's factor"):
        rope_freq_factors(dict(TINY, rope_scaling=scaling), 16)
