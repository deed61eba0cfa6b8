"""Llama 3.1+ RoPE scaling: per-frequency divisors (``ModelConfig.rope_freq_factors``) from a
``config.json``'s ``rope_type="llama3"`` and from a GGUF file's ``rope_freqs.weight``.

The oracles are transformers' own llama3 rule and model (a tiny random ``LlamaForCausalLM``);
the test configurations put frequencies in all three bands of the rule (kept, divided by
``factor``, interpolated) and check that plain RoPE is far from the reference, so the parity
checks can fail.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import fastspec as fs
from fastspec.model import ModelConfig, Transformer
from fastspec.model.functional import llama3_freq_factors

#: A llama3 scaling whose bands fall inside head_dim 16 at base 1e4: frequency 0 kept,
#: 1-2 interpolated, 3-7 divided by 4 (wavelengths 6.3, 20, 63, 199, ...).
SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
           "high_freq_factor": 8.0, "original_max_position_embeddings": 64}
PARAMS = {k: v for k, v in SCALING.items() if k != "rope_type"}
NO_LENGTH = {k: v for k, v in SCALING.items() if k != "original_max_position_embeddings"}
TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-6, rope_theta=10000.0)
IDS = np.random.default_rng(0).integers(0, TINY["vocab_size"], 100)  # beyond the original 64


def converter_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                      high_freq_factor: float, original_max_position_embeddings: int):
    """llama.cpp's ``convert_hf_to_gguf.py`` loop (LlamaModel), written out independently."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    low = original_max_position_embeddings / low_freq_factor
    high = original_max_position_embeddings / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            out.append(1)
        elif wavelen > low:
            out.append(factor)
        else:
            smooth = ((original_max_position_embeddings / wavelen - low_freq_factor)
                      / (high_freq_factor - low_freq_factor))
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_three_bands_and_the_converter():
    f = np.array(llama3_freq_factors(16, 1e4, **PARAMS))
    assert f[0] == 1 and (f[3:] == 4).all() and ((f[1:3] > 1) & (f[1:3] < 4)).all()
    np.testing.assert_allclose(f, converter_factors(16, 1e4, **PARAMS), rtol=1e-6)
    # Llama 3.1 8B / 3.2 1B parameters
    real = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192)
    for head_dim in (64, 128):
        np.testing.assert_allclose(llama3_freq_factors(head_dim, 5e5, **real),
                                   converter_factors(head_dim, 5e5, **real), rtol=1e-6)


@pytest.mark.parametrize("bad, match", [
    (dict(factor=0.0), "factor"), (dict(low_freq_factor=float("nan")), "low_freq_factor"),
    (dict(high_freq_factor=1.0), "must exceed"), (dict(original_max_position_embeddings="64"),
                                                  "original_max_position_embeddings")])
def test_bad_llama3_parameters(bad, match):
    with pytest.raises(ValueError, match=match):
        llama3_freq_factors(16, 1e4, **dict(PARAMS, **bad))


def test_config_field():
    base = dict(vocab_size=10, dim=32, n_layers=1, n_heads=2)
    c = ModelConfig(**base, rope_freq_factors=[1, 2.5] + [4] * 6)
    assert c.rope_freq_factors == (1.0, 2.5) + (4.0,) * 6 and hash(c)
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert "rope_freq_factors" not in ModelConfig(**base).to_dict()
    for bad, match in [([1.0] * 7, "has 7 values"), ([1.0] * 7 + [0.0], "positive"),
                       ([1.0] * 7 + [float("inf")], "positive"), ("abc", "positive|numbers"),
                       (3, "sequence")]:
        with pytest.raises(ValueError, match=match):
            ModelConfig(**base, rope_freq_factors=bad)
    with pytest.raises(ValueError, match="positional"):
        ModelConfig(**dict(base, positional="learned"), rope_freq_factors=[1.0] * 8)


def test_tables_divide_each_frequency():
    plain_cos, plain_sin = fs.model.functional.rope_tables(50, 16, 1e4, np.float64)
    f = np.array(llama3_freq_factors(16, 1e4, **PARAMS))
    cos, sin = fs.model.functional.rope_tables(50, 16, 1e4, np.float64, f)
    np.testing.assert_array_equal(cos[:, 0], plain_cos[:, 0])  # the kept frequency
    angles = np.arctan2(plain_sin[1], plain_cos[1]) / f  # position 1: the angle itself
    np.testing.assert_allclose(np.arctan2(sin[1], cos[1]), angles, rtol=1e-12)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tables_in_chunks_are_the_one_pass_values(monkeypatch, threads):
    """rope_tables fills its tables a chunk of positions at a time, the chunks shared by
    threads: the same values as the whole table in one pass, across chunk edges (the last
    chunk partial), for float32 and float64, with and without divisors."""
    from fastspec import kernels
    from fastspec.model import functional as F

    monkeypatch.setattr(F, "_ROPE_ROWS", 7)
    monkeypatch.setattr(F, "_ROPE_THREADED_MIN", 0 if threads > 1 else 1 << 62)
    monkeypatch.setattr(kernels, "get_threads", lambda: threads)
    for n, dim, f in ((7 * 9 + 3, 16, None), (40, 12, [1.0, 2.0, 0.5, 3.0, 7.0, 1.5]),
                      (1, 4, None), (0, 8, None)):
        inv = 1e4 ** (-np.arange(0, dim, 2, dtype=np.float64) / dim) / np.asarray(f or 1.0)
        angles = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        for dtype in (np.float32, np.float64):
            cos, sin = F.rope_tables(n, dim, 1e4, dtype, f)
            assert cos.dtype == sin.dtype == dtype and cos.shape == (n, dim // 2)
            np.testing.assert_array_equal(cos, np.cos(angles).astype(dtype))
            np.testing.assert_array_equal(sin, np.sin(angles).astype(dtype))


# --- against transformers ------------------------------------------------------------------

@pytest.fixture(scope="module", params=[1e4, 5e5], ids=["theta1e4", "theta5e5"])
def hf_scaled(request):
    """(transformers model, its logits over IDS, theta); at base 5e5 frequency 0 is kept, 1
    interpolated, 2-7 divided by 4."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **dict(TINY, rope_theta=request.param), rope_scaling=dict(SCALING))).eval()
    with torch.no_grad():  # the default init is tiny; make every weight matter
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        ref = model(torch.tensor(IDS[None])).logits[0].double().numpy()
    return model, ref, request.param


@pytest.fixture(params=["rope_parameters", "legacy"])
def scaled_folder(hf_scaled, tmp_path, request):
    """The model saved by transformers (``rope_parameters``, theta inside), or its config
    rewritten as Llama 3.1's own files have it (top-level ``rope_theta`` + ``rope_scaling``)."""
    folder = tmp_path / "hf"
    hf_scaled[0].save_pretrained(folder)
    if request.param == "legacy":
        cfg = json.loads((folder / "config.json").read_text())
        params = cfg.pop("rope_parameters")
        cfg["rope_theta"] = params.pop("rope_theta")
        cfg["rope_scaling"] = params
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.hf
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_llama3_folder_matches_transformers(hf_scaled, scaled_folder, backend, dtype):
    _, ref, theta = hf_scaled
    ours = Transformer.load(scaled_folder, dtype=dtype)
    assert ours.config.rope_theta == theta
    np.testing.assert_allclose(ours.config.rope_freq_factors,
                               llama3_freq_factors(16, theta, **PARAMS))
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4, rtol=0)
    cache = ours.new_cache()  # decoding token by token past the original 64 positions
    ours.forward(IDS[:60], cache)
    steps = np.concatenate([ours.forward(IDS[i:i + 1], cache).logits for i in range(60, 100)])
    np.testing.assert_allclose(steps, ref[60:], atol=1e-4, rtol=0)
    plain = Transformer(ours.config.replace(rope_freq_factors=None), **_weights(ours))
    assert np.abs(plain.forward(IDS).logits - ref).max() > 1e-2  # the scaling matters here


@pytest.mark.hf
@pytest.mark.parametrize("extra", [
    dict(rope_scaling=dict(SCALING)),
    dict(rope_scaling=dict(SCALING), original_max_position_embeddings=32),  # top level wins
    dict(rope_scaling=NO_LENGTH, original_max_position_embeddings=32),
    dict(rope_scaling=NO_LENGTH)],  # the context
    ids=["object", "top-level-wins", "top-level", "context"])
def test_original_length_is_found_as_transformers_finds_it(extra):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg = json.loads(json.dumps(dict(TINY, **extra)))  # LlamaConfig fills its argument in
    ours = 1e4 ** -(np.arange(0, 16, 2) / 16) / fs.formats.hf_rope.rope_freq_factors(cfg, 16)
    hf_config = transformers.LlamaConfig(**json.loads(json.dumps(cfg)))
    reference = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")[0]
    np.testing.assert_allclose(ours, reference.double().numpy(), rtol=1e-6)


def _weights(model: Transformer) -> dict:
    return dict(embed=model.embed, layers=model.layers, head=model.head,
                final_norm=model.final_norm)


@pytest.mark.hf
def test_rope_freqs_gguf_matches_transformers(hf_scaled, scaled_folder, tmp_path, backend):
    """A GGUF file carrying ``rope_freqs.weight`` as llama.cpp's converter computes it (an
    independent loop, not fastspec's rule) runs as transformers' llama3 model."""
    pytest.importorskip("gguf")
    folder = Transformer.load(scaled_folder)
    factors = converter_factors(16, hf_scaled[2], **PARAMS)
    path = tmp_path / "l3.gguf"
    _write_gguf(folder, path, factors)
    ours = Transformer.load(path)
    assert ours.config.rope_freq_factors == tuple(factors.tolist())
    np.testing.assert_allclose(ours.forward(IDS).logits, hf_scaled[1], atol=1e-4, rtol=0)


def _write_gguf(model: Transformer, path, factors) -> None:
    """Write ``model``'s weights with ``factors`` as its ``rope_freqs.weight`` (fastspec's
    writer: llama.cpp runs its files, docs/FORMATS.md)."""
    from fastspec.formats.gguf_write import save_gguf
    config = model.config.replace(rope_freq_factors=tuple(np.asarray(factors, float)))
    save_gguf(Transformer(config, **_weights(model)), path)


def test_saved_and_loaded(tmp_path):
    """npz and GGUF (fastspec's writer, and ``fastspec quantize``) keep the factors; a Hugging
    Face folder cannot say them and refuses, naming the formats that can."""
    from fastspec.cli import main
    c = ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                    max_seq_len=128, tie_embeddings=False,
                    rope_freq_factors=llama3_freq_factors(16, 1e4, **PARAMS))
    model = Transformer.random(c, seed=1)
    ids = IDS % 64
    ref = model.forward(ids).logits
    with pytest.raises(ValueError, match=r"\.npz or \.gguf"):
        model.save(tmp_path / "hf")
    for name in ("m.npz", "m.gguf"):
        if name.endswith(".gguf"):
            pytest.importorskip("gguf")
        model.save(tmp_path / name)
        back = Transformer.load(tmp_path / name)
        assert back.config.rope_freq_factors == c.rope_freq_factors
        np.testing.assert_array_equal(back.forward(ids).logits, ref)
    assert main(["quantize", str(tmp_path / "m.gguf"), str(tmp_path / "q.gguf"), "--type",
                 "q8_0", "--quiet"]) == 0
    assert Transformer.load(tmp_path / "q.gguf").config.rope_freq_factors == c.rope_freq_factors
    qwen3 = Transformer.random(c.replace(qk_norm=True), seed=1)  # llama.cpp: a llama tensor
    with pytest.raises(ValueError, match="qwen3"):
        qwen3.save(tmp_path / "q3.gguf")
    assert not (tmp_path / "q3.gguf").exists()


@pytest.mark.parametrize("change, match", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "yarn"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 4.0}), "low_freq_factor"),
    (dict(rope_scaling=dict(SCALING, factor=-1.0)), "factor"),
    (dict(rope_scaling=[1, 2]), "JSON object"),
    (dict(rope_scaling={"rope_type": {}}), "rope_type"),
    (dict(rope_scaling=dict(SCALING, factor="4")), "factor"),
    (dict(rope_scaling=dict(SCALING, factor=1e50)), "factor"),
    (dict(rope_scaling=dict(SCALING, factor=True)), "factor"),
    (dict(rope_scaling=dict(SCALING, original_max_position_embeddings=10**400)), "original"),
    (dict(rope_scaling=SCALING, rope_theta=-1.0), "rope_theta"),
    (dict(rope_scaling=SCALING, rope_theta=[1.0]), "rope_theta"),
    (dict(rope_theta=None, rope_parameters={"rope_theta": "x"}), "rope_theta")])
def test_bad_folder_scaling_is_named(tmp_path, change, match):
    model = Transformer.random(ModelConfig(vocab_size=64, dim=64, n_layers=1, n_heads=4))
    model.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, **change)))
    with pytest.raises(ValueError, match=match):
        Transformer.load(tmp_path)


@pytest.mark.parametrize("value, match", [
    (np.ones(16, np.float32), r"shape \(16,\)"), (np.ones(8, np.float16), "F16"),
    (np.array([1, 1, 1, 1, 1, 1, 1, np.nan], np.float32), "positive and finite"),
    (np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32), "positive and finite")])
def test_bad_rope_freqs_tensor_is_named(tmp_path, value, match):
    pytest.importorskip("gguf")
    from _gguf_writer import TYPES, write_model
    path = tmp_path / "bad.gguf"
    write_model(path, "llama", dim=64, ffn=128, types=TYPES[:5],
                extra={"rope_freqs.weight": value})  # head_dim 16: 8 factors
    with pytest.raises(ValueError, match="bad.gguf") as err:
        Transformer.load(path)
    assert "'rope_freqs.weight'" in str(err.value) and re.search(match, str(err.value))


def test_rope_freqs_only_in_a_llama_file(tmp_path):
    pytest.importorskip("gguf")
    from _gguf_writer import TYPES, write_model
    path = tmp_path / "q3.gguf"
    write_model(path, "qwen3", dim=64, ffn=128, types=TYPES[:5],
                extra={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(ValueError, match="unexpected tensor 'rope_freqs.weight'"):
        Transformer.load(path)


def test_drafters_on_a_scaled_target(backend):
    """The DFlash drafter keeps plain RoPE (its own tables) under a target with factors; greedy
    speculative output equals vanilla for the DFlash, n-gram and draft-model drafters."""
    c = ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                    max_seq_len=160, rope_freq_factors=llama3_freq_factors(16, 1e4, **PARAMS))
    target = Transformer.random(c, seed=2)
    dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, mask_token_id=0), target, seed=0)
    assert dflash._stack.config.rope_freq_factors is None
    prompt = list(IDS[:30] % 64) * 2
    vanilla = fs.generate(target, prompt, 40).tokens
    for drafter in (fs.DFlashDrafter(dflash), fs.NgramDrafter(max_ngram=3),
                    fs.DraftModelDrafter(Transformer.random(c.replace(n_layers=1), seed=3))):
        assert fs.speculative_generate(target, drafter, prompt, 40, gamma=3).tokens == vanilla


@pytest.mark.parametrize("attention, rope_dims, scale, family", [
    (None, None, None, {}), (1.3, None, None, {}), (1.3, 12, None, {}),
    (None, None, 3.5, {}), (None, None, None, dict(nope_layers=(1,))),
    (1.3, 12, None, dict(activation="geglu", post_norms=True, local_layers=(0,),
                         local_rope_theta=100.0))])
def test_trainer_target_runs_the_factors(tmp_path, attention, rope_dims, scale, family):
    """The trainer's torch target (distillation labels) computes the same logits (with a
    LongRoPE attention factor, partial rotary, Granite's embedding scale, SmolLM3's NoPE
    layers and Gemma 3's GeGLU, sandwich norms and local RoPE layers too)."""
    pytest.importorskip("torch")
    from fastspec.training.weights import load_transformer_npz
    c = ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                    max_seq_len=128, tie_embeddings=False,
                    rope_freq_factors=llama3_freq_factors(rope_dims or 16, 1e4, **PARAMS),
                    rope_attention_factor=attention, rope_dims=rope_dims,
                    embedding_scale=scale, **family)
    model = Transformer.random(c, seed=4)
    model.save(tmp_path / "t.npz")
    torch_model, _ = load_transformer_npz(tmp_path / "t.npz")
    import torch
    with torch.no_grad():
        logits, _ = torch_model.forward(torch.tensor((IDS % 64)[None]))
    np.testing.assert_allclose(logits[0].double().numpy(), model.forward(IDS % 64).logits,
                               atol=1e-4, rtol=0)
    # DFlash's distillation labels: the target's greedy continuation from each anchor
    from fastspec.training.objectives import branch_greedy_labels
    seqs = torch.tensor((IDS[:80] % 64)[None])
    anchors = torch.tensor([[10, 50, 70]])
    with torch.no_grad():
        cache: list = []
        logits, _ = torch_model(seqs, cache=cache)
        labels = branch_greedy_labels(torch_model, seqs, anchors, logits, cache, 6, False)
    for j, a in enumerate(anchors[0].tolist()):
        greedy = fs.generate(model, list(IDS[:a + 1] % 64), 5).tokens[-5:]
        assert labels[0, j, 1:].tolist() == greedy


def test_dflash_folder_reads_llama3_scaling(tmp_path):
    """A z-lab drafter folder with llama3 scaling gets its divisors (the reference parity is
    tests/test_dflash_official.py); another scaling type is refused, named."""
    target = Transformer.random(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4))
    cfg = fs.DFlashConfig(block_size=4, mask_token_id=0, qk_norm=True, last_tap_normed=True)
    fs.DFlashModel.random(cfg, target, seed=0).save(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(raw, rope_scaling=SCALING)))
    got = fs.DFlashModel.load(tmp_path, target).config.rope_freq_factors
    assert got == llama3_freq_factors(16, raw["rope_theta"], **PARAMS)
    for refused in ({"rope_type": "yarn", "factor": 4.0},  # LongRoPE too: no attention factor
                    {"rope_type": "longrope", "short_factor": [1.0] * 8,
                     "long_factor": [2.0] * 8, "original_max_position_embeddings": 64}):
        (tmp_path / "config.json").write_text(json.dumps(dict(raw, rope_scaling=refused)))
        with pytest.raises(ValueError, match=refused["rope_type"]):
            fs.DFlashModel.load(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps(dict(raw, partial_rotary_factor=0.5)))
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        fs.DFlashModel.load(tmp_path, target)
