"""Parity with z-lab's reference DFlash implementation (``dflash`` 0.1.0, installed --no-deps).

A random Qwen3 target built with transformers and a random ``dflash.model.DFlashDraftModel``,
both saved with ``save_pretrained``, load in fastspec: block logits match the reference within
1e-4 (float32), on both backends, through the explicit ``block_logits`` and the cached fast
path; greedy ``speculative_generate`` equals ``dflash_generate`` token for token; a folder
written by ``DFlashModel.save`` loads in the reference.
"""
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
dflash_model = pytest.importorskip("dflash.model")

import fastspec as fs  # noqa: E402

pytestmark = pytest.mark.hf

BLOCK, MASK, V = 5, 127, 128
SHAPE = dict(vocab_size=V, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6)
#: Llama 3.1's RoPE scaling on the drafter (Qwen3Config's base 1e4, head_dim 16: frequency 0
#: kept, 1-2 interpolated, 3-7 divided by 4), as a drafter for a Llama 3.1 target carries it.
SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
           "high_freq_factor": 8.0, "original_max_position_embeddings": 64}


def _randomize(module, seed):
    """O(1) weights (transformers' 0.02 init makes logits nearly flat: argmax ties)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if p.dim() == 1
                    else torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(torch target, reference drafter, fastspec target, fastspec drafter, folder)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("zlab")
    shape = SHAPE
    target = Qwen3ForCausalLM(Qwen3Config(**shape, intermediate_size=128, num_hidden_layers=4,
                                          tie_word_embeddings=False)).eval()
    # Taps 1 and 3: layer 3 is the last, read by the reference after the target's final norm.
    drafter = dflash_model.DFlashDraftModel(Qwen3Config(
        **shape, intermediate_size=96, num_hidden_layers=2, block_size=BLOCK,
        num_target_layers=4, dflash_config={"target_layer_ids": [1, 3], "mask_token_id": MASK},
    )).eval()
    _randomize(target, 0)
    _randomize(drafter, 1)
    target.save_pretrained(folder / "target")
    drafter.save_pretrained(folder / "drafter")
    fs_target = fs.Transformer.load(folder / "target")
    fs_drafter = fs.DFlashModel.load(folder / "drafter", fs_target)
    return target, drafter, fs_target, fs_drafter, folder


def _reference_block_logits(target, drafter, ids, block):
    """The reference's block forward from scratch: context = all of ``ids``."""
    with torch.no_grad():
        out = target(torch.tensor([ids]), output_hidden_states=True)
        feat = dflash_model.extract_context_feature(out.hidden_states, drafter.target_layer_ids)
        noise = torch.nn.functional.embedding(torch.tensor([block]),
                                              target.get_input_embeddings().weight)
        h = drafter(target_hidden=feat, noise_embedding=noise,
                    position_ids=torch.arange(len(ids) + len(block))[None])
        return drafter.compute_logits(h[:, 1:], target.lm_head)[0].numpy()


def test_config_maps_the_reference_conventions(models):
    _, drafter, fs_target, fs_drafter, _ = models
    c = fs_drafter.config
    assert c.tap_layers == (1, 3) and c.mask_token_id == MASK and c.block_size == BLOCK
    assert c.last_tap_normed and c.qk_norm and c.n_layers == 2 and c.ffn_dim == 96
    np.testing.assert_array_equal(fs_drafter.fc, drafter.fc.weight.detach().numpy().T)


@pytest.mark.parametrize("block", [[5, MASK, MASK, MASK, MASK], [9, 3, MASK, 40, MASK], [7, MASK]])
def test_block_logits_match_the_reference(models, backend, block):
    target, drafter, fs_target, fs_drafter, _ = models
    ids = np.random.default_rng(2).integers(0, V - 1, size=11).tolist()
    ref = _reference_block_logits(target, drafter, ids, block)
    out = fs_target.forward(np.array(ids), hidden_layers=fs_drafter.config.tap_layers)
    explicit = fs_drafter.block_logits(out.hidden, block)
    assert explicit.shape == (len(block) - 1, V)
    assert np.abs(explicit - ref).max() < 1e-4
    # The cached fast path, the context appended in two chunks (positions carried over).
    cache = fs_drafter.new_cache()
    fs_drafter.append_hidden(cache, {t: h[:6] for t, h in out.hidden.items()})
    fs_drafter.append_hidden(cache, {t: h[6:] for t, h in out.hidden.items()})
    fast = fs_drafter.forward_block(cache, np.array(block))
    assert np.abs(fast - ref).max() < 1e-4


def test_wrong_tap_convention_would_be_caught(models):
    """Negative control: without the final norm on the last tap the logits differ."""
    target, drafter, fs_target, fs_drafter, _ = models
    ids = np.random.default_rng(3).integers(0, V - 1, size=8).tolist()
    block = [5, MASK, MASK, MASK, MASK]
    ref = _reference_block_logits(target, drafter, ids, block)
    wrong = fs.DFlashModel(fs_drafter.config.replace(last_tap_normed=False), fs_target,
                           fs_drafter.fc, fs_drafter.hidden_norm, fs_drafter.layers,
                           fs_drafter.norm)
    out = fs_target.forward(np.array(ids), hidden_layers=(1, 3))
    assert np.abs(wrong.block_logits(out.hidden, block) - ref).max() > 1e-2


@pytest.mark.parametrize("max_new", [1, 7, 40])
def test_greedy_equals_dflash_generate(models, backend, max_new, monkeypatch):
    target, drafter, fs_target, fs_drafter, _ = models
    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)  # CPU: no cuda sync
    ids = np.random.default_rng(4).integers(0, V - 1, size=10).tolist()
    with torch.no_grad():
        ref = dflash_model.dflash_generate(drafter, target, torch.tensor([ids]), max_new, None,
                                           return_stats=True)
    want = ref.output_ids[0, len(ids):].tolist()
    got = fs.speculative_generate(fs_target, fs.DFlashDrafter(fs_drafter), ids, max_new,
                                  gamma=BLOCK - 1)
    assert got.tokens == want and len(want) == max_new
    assert got.tokens == fs.generate(fs_target, ids, max_new).tokens


def test_saved_folder_loads_in_the_reference(models, tmp_path):
    target, drafter, fs_target, fs_drafter, _ = models
    fs_drafter.save(tmp_path / "again")
    back = dflash_model.DFlashDraftModel.from_pretrained(tmp_path / "again").eval()
    assert back.target_layer_ids == [1, 3] and back.mask_token_id == MASK
    assert back.block_size == BLOCK
    ids = np.random.default_rng(5).integers(0, V - 1, size=9).tolist()
    block = [5, MASK, MASK, MASK, MASK]
    np.testing.assert_allclose(_reference_block_logits(target, back, ids, block),
                               _reference_block_logits(target, drafter, ids, block), atol=1e-5)
    again = fs.DFlashModel.load(tmp_path / "again", fs_target)
    assert again.config == fs_drafter.config


@pytest.fixture(scope="module")
def scaled(models, tmp_path_factory):
    """(reference drafter with llama3 RoPE scaling, fastspec's load of its folder), over the
    same target."""
    from transformers import Qwen3Config

    drafter = dflash_model.DFlashDraftModel(Qwen3Config(
        **SHAPE, intermediate_size=96, num_hidden_layers=2, block_size=BLOCK,
        num_target_layers=4, rope_scaling=dict(SCALING),
        dflash_config={"target_layer_ids": [1, 3], "mask_token_id": MASK})).eval()
    _randomize(drafter, 2)
    folder = tmp_path_factory.mktemp("zlab3") / "drafter"
    drafter.save_pretrained(folder)
    return drafter, fs.DFlashModel.load(folder, models[2])


def test_llama3_drafter_matches_the_reference(models, scaled, backend):
    """A z-lab drafter with llama3 RoPE scaling (a Llama 3.1 target's drafter) runs as the
    reference: explicit and cached block forwards; without its divisors it would not."""
    target, _, fs_target, _, _ = models
    drafter, fs_drafter = scaled
    assert fs_drafter.config.rope_freq_factors is not None
    ids = np.random.default_rng(6).integers(0, V - 1, size=19).tolist()
    block = [9, 3, MASK, 40, MASK]
    ref = _reference_block_logits(target, drafter, ids, block)
    out = fs_target.forward(np.array(ids), hidden_layers=(1, 3))
    assert np.abs(fs_drafter.block_logits(out.hidden, block) - ref).max() < 1e-4
    cache = fs_drafter.new_cache()
    fs_drafter.append_hidden(cache, out.hidden)
    assert np.abs(fs_drafter.forward_block(cache, np.array(block)) - ref).max() < 1e-4
    plain = fs.DFlashModel(fs_drafter.config.replace(rope_freq_factors=None), fs_target,
                           fs_drafter.fc, fs_drafter.hidden_norm, fs_drafter.layers,
                           fs_drafter.norm)
    assert np.abs(plain.block_logits(out.hidden, block) - ref).max() > 1e-3


def test_llama3_drafter_greedy_equals_dflash_generate(models, scaled, backend, monkeypatch):
    """Lossless against the reference's output (the random drafter's acceptance is low: the
    block logits test above is the drafter's parity check)."""
    target, _, fs_target, _, _ = models
    drafter, fs_drafter = scaled
    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)
    ids = np.random.default_rng(7).integers(0, V - 1, size=10).tolist()
    with torch.no_grad():
        ref = dflash_model.dflash_generate(drafter, target, torch.tensor([ids]), 40, None,
                                           return_stats=True)
    got = fs.speculative_generate(fs_target, fs.DFlashDrafter(fs_drafter), ids, 40,
                                  gamma=BLOCK - 1)
    assert got.tokens == ref.output_ids[0, len(ids):].tolist()


def test_llama3_drafter_saves_to_npz_not_to_a_folder(models, scaled, tmp_path):
    fs_drafter = scaled[1]
    with pytest.raises(ValueError, match="RoPE scaling"):
        fs_drafter.save(tmp_path / "folder")
    fs_drafter.save(tmp_path / "d.npz")
    back = fs.DFlashModel.load(tmp_path / "d.npz", models[2])
    assert back.config == fs_drafter.config
