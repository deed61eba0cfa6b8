"""Gemma 3: GeGLU, sandwich norms, sqrt(dim) embedding scale and sliding-window layers with a
RoPE base of their own (:mod:`fastspec.formats.gemma3`). Checked against transformers'
``Gemma3ForCausalLM`` and llama.cpp's ``gemma3``, each feature undone as a negative control."""
import dataclasses
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec import ModelConfig, Transformer
from fastspec.formats import gemma3
from fastspec.formats.gguf_write import save_gguf
from fastspec.formats.hf_folder import hf_config, save_hf

from _helpers import (GEMMA, GEMMA3_HF, hf_reference, llama_cpp_logits, transformers_logits,
                      undone as _undone)

IDS = np.random.default_rng(11).integers(0, 300, 90)
#: The window (128) beyond the 90 ids.
TINY = GEMMA3_HF


CONTROLS = {"local RoPE": dict(local_layers=None, local_rope_theta=None, sliding_window=None),
            "SwiGLU": dict(activation="swiglu"), "sandwich norms": dict(post_norms=False),
            "embedding scale": dict(embedding_scale=None)}


def _far(model: Transformer, ref: np.ndarray, tol: float = 1e-2) -> list[str]:
    """The controls that are NOT farther than ``tol`` of the largest logit from ``ref``."""
    near = []
    for name, changes in CONTROLS.items():
        got = _undone(model, **changes).forward(IDS).logits
        if np.abs(got - ref).max() <= tol * np.abs(ref).max():
            near.append(name)
    return near


@pytest.fixture(scope="module")
def hf_gemma3(tmp_path_factory):
    """(folder, transformers logits over IDS) of a random Gemma3ForCausalLM."""
    folder = tmp_path_factory.mktemp("gemma3")
    return folder, hf_reference("Gemma3ForCausalLM", TINY, IDS, folder)


@pytest.mark.hf
def test_folder_matches_transformers(hf_gemma3):
    folder, ref = hf_gemma3
    ours = Transformer.load(folder)
    c = ours.config
    assert (c.local_layers, c.local_rope_theta, c.max_seq_len, c.sliding_window) == (
        (0, 1, 2, 3, 4), 100.0, 256, 128)  # the context is the model's, not the window
    assert c.rope_freq_factors == (2.0,) * 8 and c.embedding_scale == 8.0
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    assert _far(ours, ref) == []
    plain = _undone(ours, rope_attention_factor=None)  # query_pre_attn_scalar's scale
    assert np.abs(plain.forward(IDS).logits - ref).max() > 1e-2 * np.abs(ref).max()
    minus = lambda a: None if a is None else a - 1  # noqa: E731
    norms = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "attn_post_norm", "mlp_post_norm")
    ones = Transformer(c, ours.embed, [dataclasses.replace(lw, **{n: minus(getattr(lw, n))
                                                                  for n in norms})
                                       for lw in ours.layers], ours.head, ours.final_norm - 1)
    # the norms read without Gemma's plus one
    assert np.abs(ones.forward(IDS).logits - ref).max() > 1e-2 * np.abs(ref).max()


@pytest.mark.hf
def test_save_hf_is_read_back_by_transformers(hf_gemma3, tmp_path):
    folder, ref = hf_gemma3
    ours = Transformer.load(folder)
    save_hf(ours, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["Gemma3ForCausalLM"]
    got = transformers_logits(tmp_path / "out", IDS)
    np.testing.assert_allclose(got, ref, atol=1e-4 * np.abs(ref).max())
    again = Transformer.load(tmp_path / "out")
    assert again.config == ours.config
    np.testing.assert_array_equal(again.forward(IDS).logits, ours.forward(IDS).logits)


def test_transformers_4_config_reads_as_5():
    """A config.json of transformers 4 (rope_theta, rope_local_base_freq, rope_scaling,
    sliding_window_pattern) maps as transformers 5's rope_parameters and layer_types do."""
    legacy = dict(TINY, architectures=["Gemma3ForCausalLM"], sliding_window_pattern=3)
    new = dict(legacy, layer_types=["sliding_attention", "sliding_attention", "full_attention"]
               * 2, rope_parameters={
                   "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern"):
        del new[key]
    assert hf_config(legacy) == hf_config(new)
    assert hf_config(legacy).local_layers == (0, 1, 3, 4)
    # every layer global: no local tables, the context not capped
    full = hf_config(dict(new, layer_types=["full_attention"] * 6))
    assert (full.local_layers, full.local_rope_theta, full.max_seq_len) == (None, None, 256)
    assert hf_config(dict(new, query_pre_attn_scalar=16)).rope_attention_factor is None
    # Gemma3TextConfig's defaults where config.json says nothing: scalar 256, global base 1e6
    bare = {k: v for k, v in new.items() if k not in ("query_pre_attn_scalar",
                                                        "rope_parameters")}
    c = hf_config(bare)
    assert c.rope_attention_factor == pytest.approx((16 / 256) ** 0.25)
    assert (c.rope_theta, c.local_rope_theta) == (1e6, 1e4)
    assert c.replace(max_seq_len=4096).max_seq_len == 4096  # the window slides past 512


@pytest.mark.parametrize("change, match", [
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    (dict(hidden_activation="gelu"), "hidden_activation"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(layer_types=["sliding_attention"] * 5), "layer_types"),
    (dict(layer_types=["chunked_attention"] * 6), "layer_types"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "yarn", "factor": 2.0}},
          rope_scaling=None), "sliding-window"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0] * 8,
                        "long_factor": [1.0] * 8}), "longrope"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "yarn"),
    ({"hidden_size": None}, "hidden_size"),
])
def test_config_refuses_what_does_not_run(change, match):
    cfg = dict(TINY, architectures=["Gemma3ForCausalLM"], **change)
    with pytest.raises(ValueError, match=match):
        hf_config({k: v for k, v in cfg.items() if v is not None or k != "hidden_size"})


def _gemma3_file(path, **kw):
    pytest.importorskip("gguf")
    from _gguf_writer import write_model
    return write_model(path, arch="gemma3", dim=64, n_layers=7, n_heads=4, n_kv=2, head_dim=32,
                       ffn=96, **kw)


def test_gguf_matches_llama_cpp(tmp_path):
    """llama.cpp's gemma3: layers 0-4 and 6 local (base 100 from rope.freq_base_swa), 5
    global. llama.cpp's CPU GELU reads an fp16 table (its input rounded to fp16): 4.6e-4 of
    the largest logit measured; each feature undone is more than 1e-2 off."""
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q
    path = tmp_path / "g.gguf"
    _gemma3_file(path, types=(Q.F32,))
    ours = Transformer.load(path)
    c = ours.config
    assert (c.local_layers, c.local_rope_theta, c.max_seq_len) == ((0, 1, 2, 3, 4, 6), 100.0,
                                                                    512)
    ref = llama_cpp_logits(path, IDS)
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=2e-3 * np.abs(ref).max())
    assert _far(ours, ref) == []


def test_27b_attention_rule_matches_llama_cpp(tmp_path):
    """llama.cpp scales a 62-layer gemma3 file's scores by sqrt(heads / dim) (the 27B's
    query_pre_attn_scalar), not 1 / sqrt(head_dim); saved back, the file says the same."""
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q
    path = tmp_path / "g.gguf"
    from _gguf_writer import write_model
    write_model(path, arch="gemma3", dim=64, n_layers=62, n_heads=4, n_kv=2, head_dim=32,
                ffn=64, types=(Q.F32,))
    ours = Transformer.load(path)
    assert ours.config.rope_attention_factor == pytest.approx((32 / 16) ** 0.25)
    ref = llama_cpp_logits(path, IDS[:40])
    np.testing.assert_allclose(ours.forward(IDS[:40]).logits, ref,
                               atol=2e-3 * np.abs(ref).max())
    plain = _undone(ours, rope_attention_factor=None).forward(IDS[:40]).logits
    assert np.abs(plain - ref).max() > 1e-1 * np.abs(ref).max()
    save_gguf(ours, tmp_path / "out.gguf")
    assert Transformer.load(tmp_path / "out.gguf").config == ours.config


def test_quantized_gguf_matches_llama_cpp(tmp_path):
    """Q8_0 blocks run natively against llama.cpp's Q8_0 run: both quantize the activations, so
    each is ~4% of the largest logit from its float run over 7 random layers, 2.9% from the
    other measured; SwiGLU instead of GeGLU is 25%."""
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q
    path = tmp_path / "g.gguf"
    _gemma3_file(path, types=(Q.Q8_0,))
    ours = Transformer.load(path, weight_dtype="q8_0")
    ref = llama_cpp_logits(path, IDS)
    got = ours.forward(IDS).logits
    np.testing.assert_allclose(got, ref, atol=5e-2 * np.abs(ref).max())
    swiglu = _undone(ours, activation="swiglu").forward(IDS).logits
    assert np.abs(swiglu - ref).max() > 1.5e-1 * np.abs(ref).max()


@pytest.mark.parametrize("weight_dtype", [None, "q8_0"])
def test_save_gguf_round_trip(tmp_path, weight_dtype):
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q
    _gemma3_file(tmp_path / "g.gguf", types=(Q.F32, Q.Q8_0))
    ours = Transformer.load(tmp_path / "g.gguf", weight_dtype=weight_dtype)
    for source in (tmp_path / "g.gguf", None):  # without one, the writer's own keys alone
        save_gguf(ours, tmp_path / "out.gguf", source=source)
        back = Transformer.load(tmp_path / "out.gguf", weight_dtype=weight_dtype)
        assert back.config == ours.config
        np.testing.assert_array_equal(back.forward(IDS).logits, ours.forward(IDS).logits)


def test_gguf_written_from_a_folder_runs_in_llama_cpp(hf_gemma3, tmp_path):
    """transformers' model, read from its folder and written as GGUF (the tokenizer keys of a
    test file), is llama.cpp's too: the two reference implementations agree through
    fastspec's reader and writer (GELU's fp16 table apart)."""
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q
    folder, ref = hf_gemma3
    model = Transformer.load(folder)
    # llama.cpp's own pattern (every sixth layer global) and attention scale: TINY's layers
    # are; its query_pre_attn_scalar is not, so that factor is dropped on both sides
    plain = _undone(model, rope_attention_factor=None)
    _gemma3_file(tmp_path / "tok.gguf", types=(Q.F32,))
    save_gguf(plain, tmp_path / "out.gguf", source=tmp_path / "tok.gguf")
    got = llama_cpp_logits(tmp_path / "out.gguf", IDS)
    want = plain.forward(IDS).logits
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
    eps = float(np.float32(plain.config.norm_eps))  # a GGUF key holds a float32
    assert Transformer.load(tmp_path / "out.gguf").config == plain.config.replace(norm_eps=eps)


def test_ollama_file_reads_as_llama_cpp_s(tmp_path):
    """Ollama's converter names the local base ``rope.local.freq_base`` and its files of the
    larger models hold a vision tower (``v.*``, ``mm.*`` tensors, ``vision.*`` keys): the
    text model is the one a llama.cpp file of the same weights holds. Its ``v.*`` tensor is a
    vision one only in a gemma3 file."""
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V
    _gemma3_file(tmp_path / "llama.gguf", types=(Q.F32,))
    vision = {"v.blk.0.attn_q.weight": np.ones((8, 8), np.float32),
              "mm.input_projection.weight": np.ones((8, 8), np.float32)}
    keys = {"gemma3.rope.local.freq_base": (100.0, V.FLOAT32),
            "gemma3.vision.block_count": (1, V.UINT32), "gemma3.mm.tokens_per_image": (256,
                                                                                     V.UINT32)}
    _gemma3_file(tmp_path / "ollama.gguf", types=(Q.F32,), metadata=keys, extra=vision,
                 drop=("gemma3.rope.freq_base_swa",))
    ours, want = Transformer.load(tmp_path / "ollama.gguf"), Transformer.load(
        tmp_path / "llama.gguf")
    assert ours.config == want.config and ours.config.local_rope_theta == 100.0
    np.testing.assert_array_equal(ours.forward(IDS).logits, want.forward(IDS).logits)
    save_gguf(ours, tmp_path / "out.gguf", source=tmp_path / "ollama.gguf")  # no tower: no keys
    from fastspec.formats.gguf import read_metadata
    assert not [k for k in read_metadata(tmp_path / "out.gguf")
                if k.startswith(("gemma3.vision.", "gemma3.mm."))]
    from _gguf_writer import write_model
    write_model(tmp_path / "q.gguf", arch="qwen3", dim=64, ffn=96, types=(Q.F32,), extra=vision)
    with pytest.raises(ValueError, match="unexpected tensor 'v.blk.0.attn_q.weight'"):
        Transformer.load(tmp_path / "q.gguf")
    meta = {"gemma3.attention.sliding_window": 512, "gemma3.rope.global.freq_base": 5e5}
    assert gemma3.gguf_entries(meta, 7, 64, 4, 16)["rope_theta"] == 5e5
    assert gemma3.gguf_entries({}, 7, 64, 4, 16)["rope_theta"] == 1e6  # Gemma's, Ollama's


def test_ollama_corrections(tmp_path):
    """Ollama's files as Ollama loads them (a window shorter than the context): its 1B's
    soft-cap of 30 is none, and the 4B/12B/27B (34/48/62 layers) without RoPE scaling keys nor
    an epsilon get the linear scaling 8 of their global layers and eps 1e-6."""
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V
    from _gguf_writer import write_model
    ollama = {"gemma3.final_logit_softcapping": (30.0, V.FLOAT32),
              "gemma3.attention.sliding_window": (256, V.UINT32),
              "gemma3.rope.global.freq_base": (1e4, V.FLOAT32),
              "gemma3.rope.local.freq_base": (100.0, V.FLOAT32)}
    ollama_keys = ("gemma3.attention.sliding_window", "gemma3.rope.freq_base",
                   "gemma3.rope.freq_base_swa")
    small = dict(dim=32, n_heads=2, n_kv=1, head_dim=32, ffn=32, types=(Q.F32,))
    write_model(tmp_path / "o1b.gguf", "gemma3", n_layers=26, metadata=ollama,
                drop=ollama_keys, **small)
    write_model(tmp_path / "l1b.gguf", "gemma3", n_layers=26, **small)  # llama.cpp's keys
    ours, want = (Transformer.load(tmp_path / f) for f in ("o1b.gguf", "l1b.gguf"))
    assert (ours.config.sliding_window, want.config.sliding_window) == (256, 512)
    np.testing.assert_array_equal(ours.forward(IDS).logits, want.forward(IDS).logits)
    write_model(tmp_path / "o7.gguf", "gemma3", n_layers=7, metadata=ollama, drop=ollama_keys,
                **small)
    with pytest.raises(ValueError, match="final_logit_softcapping"):  # not the 1B's
        Transformer.load(tmp_path / "o7.gguf")
    eps = ("gemma3.attention.layer_norm_rms_epsilon",)
    del ollama["gemma3.final_logit_softcapping"]
    write_model(tmp_path / "o4b.gguf", "gemma3", n_layers=34, metadata=ollama,
                drop=ollama_keys + eps, **small)
    c = Transformer.load(tmp_path / "o4b.gguf").config
    assert c.rope_freq_factors == (8.0,) * 16 and c.norm_eps == 1e-6
    write_model(tmp_path / "w4b.gguf", "gemma3", n_layers=34, drop=eps, **small)  # no window
    assert Transformer.load(tmp_path / "w4b.gguf").config.rope_freq_factors is None  # < ctx


def test_gguf_entries_follow_llama_cpp():
    """The layer pattern (a bool per layer, a period, 0 = all local, none without a window),
    the local base and the 27B attention rule, as llama.cpp reads a gemma3 file."""
    meta = {"gemma3.attention.sliding_window": 512}
    types = gemma3.gguf_entries(meta, 7, 64, 4, 16)["layer_types"]
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [5]
    flags = [True, False, True]
    e = gemma3.gguf_entries(dict(meta, **{"gemma3.attention.sliding_window_pattern": flags,
                                          "gemma3.rope.freq_base_swa": 50.0}), 3, 64, 4, 16)
    assert e["layer_types"][1] == "full_attention" and e["rope_local_base_freq"] == 50.0
    e = gemma3.gguf_entries(dict(meta, **{"gemma3.attention.sliding_window_pattern": 0}),
                            3, 64, 4, 16)
    assert set(e["layer_types"]) == {"sliding_attention"}
    assert set(gemma3.gguf_entries({}, 7, 64, 4, 16)["layer_types"]) == {"full_attention"}
    assert gemma3.gguf_entries(meta, 62, 5376, 32, 128)["query_pre_attn_scalar"] == 168
    assert gemma3.gguf_entries(meta, 61, 5376, 32, 128)["query_pre_attn_scalar"] == 128
    for bad in ({"gemma3.final_logit_softcapping": 30.0},
                {"gemma3.attention.sliding_window_pattern": [True]},
                {"gemma3.attention.sliding_window_pattern": "6"},
                {"gemma3.attention.sliding_window": -1}):
        with pytest.raises(ValueError, match="gemma3"):
            gemma3.gguf_entries(dict(meta, **bad), 3, 64, 4, 16)


def _model(**changes) -> Transformer:
    c = ModelConfig(vocab_size=64, dim=64, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=16,
                    ffn_dim=96, qk_norm=True, **{**GEMMA, "max_seq_len": 128, **changes})
    return Transformer.random(c, seed=3)


def test_writers_refuse_what_they_cannot_say(tmp_path):
    pytest.importorskip("gguf")
    with pytest.raises(ValueError, match="every sixth"):  # local layer 0 only
        save_gguf(_model(embedding_scale=8.0), tmp_path / "x.gguf")
    sixth = dict(local_layers=(0, 1, 2, 3, 4), embedding_scale=8.0)
    with pytest.raises(ValueError, match="attention scale"):
        save_gguf(_model(**sixth, rope_attention_factor=1.2), tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="per-frequency"):
        save_gguf(_model(**sixth, rope_freq_factors=(1.0, 2.0) * 4), tmp_path / "x.gguf")
    save_gguf(_model(**sixth), tmp_path / "ok.gguf")  # the shape llama.cpp runs
    for bad in (dict(embedding_scale=2.5), dict(activation="swiglu", embedding_scale=8.0)):
        with pytest.raises(ValueError, match="Gemma 3's shape"):
            save_hf(_model(**bad), tmp_path / "x")
    with pytest.raises(ValueError, match="per-frequency"):
        save_hf(_model(**sixth, rope_freq_factors=(1.0, 2.0) * 4), tmp_path / "x")
    # local RoPE layers without Gemma's sandwich norms: no architecture says them
    plain = Transformer.random(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4,
                                           local_layers=(0,), local_rope_theta=100.0))
    for save in (save_gguf, save_hf):
        with pytest.raises(ValueError, match="local_layers"):
            save(plain, tmp_path / "y.gguf")


def test_source_window_keys_are_not_copied(tmp_path):
    """A model saved with a gemma3 source file states its own window, pattern and bases: the
    source's are not copied (an all-global model stays all global)."""
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q
    _gemma3_file(tmp_path / "g.gguf", types=(Q.F32,))
    ours = Transformer.load(tmp_path / "g.gguf")
    flat = _undone(ours, local_layers=None, local_rope_theta=None, sliding_window=None)
    save_gguf(flat, tmp_path / "out.gguf", source=tmp_path / "g.gguf")
    assert Transformer.load(tmp_path / "out.gguf").config == flat.config


@pytest.mark.parametrize("weight_dtype", [None, "float64", "float16", "bfloat16", "q8_0"])
def test_every_runner_runs_the_features(backend, weight_dtype):
    """Each storage's runner and the NumPy twin compute the same model (bf16 and q8_0 within
    their rounding), and each feature undone changes it."""
    model = _model(weight_dtype=weight_dtype, dtype="float64" if weight_dtype == "float64"
                   else "float32")
    got = model.forward(IDS % 64).logits
    near = []
    for name, changes in CONTROLS.items():
        other = _undone(model, **changes).forward(IDS % 64).logits
        if np.abs(other - got).max() <= 1e-2 * np.abs(got).max():
            near.append(name)
    assert near == []
    with fs.using_backend("numpy"):
        model.invalidate()
        twin = model.forward(IDS % 64).logits
    tol = 5e-3 if weight_dtype in ("bfloat16", "q8_0") else 1e-5
    np.testing.assert_allclose(got, twin, atol=tol * np.abs(twin).max())


def test_context_kv_turns_local_layers_with_their_tables():
    """DFlash's K/V injection path (``write_context_kv``) turns a local layer's keys with the
    local tables on both backends."""
    model = _model()
    feats = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    caches = {}
    for name in fs.available_backends():
        with fs.using_backend(name):
            for m in (model, _undone(model, local_layers=None, local_rope_theta=None,
                                     sliding_window=None)):
                m.invalidate()
                cache = m.new_cache()
                cache.advance(3)  # positions 3.. : RoPE turns them
                m.write_context_kv(feats, cache)
                caches[name, m is model] = cache.k[0].copy()
    for name in fs.available_backends():
        np.testing.assert_allclose(caches[name, True], caches["numpy", True], rtol=1e-5,
                                   atol=1e-5)
        assert np.abs(caches[name, True] - caches[name, False]).max() > 1e-2


def test_trainer_refuses_a_sequence_past_the_window(tmp_path):
    """The torch target attends over every position: training past a Gemma target's window
    would distil from another model than fastspec runs."""
    pytest.importorskip("torch")
    from fastspec.training.loops import _frozen_target
    _model(max_seq_len=64, sliding_window=64).save(tmp_path / "t.npz")
    _frozen_target(tmp_path / "t.npz", 64)
    with pytest.raises(ValueError, match="sliding_window 64"):
        _frozen_target(tmp_path / "t.npz", 65)


def test_speculative_decoding_equals_vanilla():
    """Greedy speculative decoding of a Gemma-shaped target equals vanilla decoding, for the
    draft-model, n-gram and DFlash drafters."""
    target = _model(max_seq_len=160)
    dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, mask_token_id=0), target,
                                   seed=0)
    prompt = list(IDS[:30] % 64) * 2
    vanilla = fs.generate(target, prompt, 40).tokens
    draft = Transformer.random(target.config.replace(n_layers=1), seed=3)
    for drafter in (fs.DFlashDrafter(dflash), fs.NgramDrafter(max_ngram=3),
                    fs.DraftModelDrafter(draft)):
        assert fs.speculative_generate(target, drafter, prompt, 40, gamma=3).tokens == vanilla
