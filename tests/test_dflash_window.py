"""DFlashDrafter's sliding context window: exact against a fresh run over the window."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.model.functional import llama3_freq_factors


#: A drafter with Llama 3.1-style RoPE divisors (head_dim 16, base 1e4, original length 16:
#: frequency 0 interpolated, 1-7 divided by 4): the slide must rotate its keys by the divided
#: angles.
LLAMA3 = llama3_freq_factors(16, 1e4, factor=4.0, low_freq_factor=1.0, high_freq_factor=8.0,
                             original_max_position_embeddings=16)


@pytest.fixture(params=[None, LLAMA3], ids=["plain", "llama3"])
def models(request):
    cfg = fs.ModelConfig.tiny_llama(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                                    max_seq_len=256, dtype="float64")
    target = fs.Transformer.random(cfg, seed=0)
    dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=6, n_layers=2,
                                                   rope_freq_factors=request.param),
                                   target, seed=1)
    return target, dflash


def test_window_proposals_equal_a_fresh_run_over_the_window(models, backend):
    target, dflash = models
    W = 10
    drafter = fs.DFlashDrafter(dflash, context_window=W)
    seq = np.random.default_rng(0).integers(0, 256, 60)
    sampling = fs.SamplingParams()
    rng = np.random.default_rng(0)
    out = target.forward(seq, hidden_layers=dflash.config.tap_layers)
    drafter.reset(seq[:20], {l: h[:19] for l, h in out.hidden.items()})
    P = 19
    while P < 55:
        n_new = 3  # commit 3 positions per "round", like a verification with 2 accepted
        mine = drafter.propose(seq[:P + 1], 5, sampling, rng).tokens
        # Fresh: only the last len(context) positions, re-based to start at position 0.
        ctx = drafter.cache.length
        fresh = dflash.new_cache()
        dflash.append_context(fresh, dflash.context_features(
            {l: h[P - ctx:P] for l, h in out.hidden.items()}))
        logits = dflash.forward_block(fresh, dflash.mask_block(int(seq[P])))
        np.testing.assert_array_equal(mine, np.argmax(logits, axis=1)[:5])
        np.testing.assert_allclose(dflash.forward_block(drafter.cache, dflash.mask_block(int(seq[P]))),
                                   logits, rtol=0, atol=1e-9)
        assert W - min(32, W // 2) <= ctx <= W or drafter._offset == 0
        drafter.commit(seq[:P + n_new + 1], n_new - 1, {l: h[P:P + n_new] for l, h in out.hidden.items()})
        P += n_new
    assert drafter._offset > 0  # the window did slide


@pytest.mark.parametrize("window", [1, 7])
def test_windowed_drafter_is_lossless(models, backend, window):
    target, dflash = models
    prompt = np.random.default_rng(1).integers(0, 256, 12)
    ref = fs.generate(target, prompt, 48).tokens
    res = fs.speculative_generate(target, fs.DFlashDrafter(dflash, context_window=window),
                                  prompt, 48, gamma=5)
    assert res.tokens == ref


def test_npz_keeps_the_trained_window(models, tmp_path):
    target, dflash = models
    dflash.context_window = 40
    dflash.save(tmp_path / "d.npz")
    loaded = fs.DFlashModel.load(tmp_path / "d.npz", target)
    assert loaded.context_window == 40
    assert fs.DFlashDrafter(loaded).context_window == 40
    dflash.context_window = None  # unbounded: nothing stored, nothing read
    dflash.save(tmp_path / "u.npz")
    assert fs.DFlashModel.load(tmp_path / "u.npz", target).context_window is None


@pytest.mark.parametrize("bad", [0, -3, 2.5, "40", True])
def test_npz_rejects_a_bad_window(models, tmp_path, bad):
    import json
    target, dflash = models
    dflash.save(tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as z:
        arrays = {k: z[k] for k in z.files}
    cfg = json.loads(str(arrays["config"]))
    cfg["context_window"] = bad
    arrays["config"] = np.array(json.dumps(cfg))
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="bad.npz.*context_window"):
        fs.DFlashModel.load(tmp_path / "bad.npz", target)
