"""DFlash drafter: block forward vs reference, context cache, losslessness, persistence, errors."""
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec.drafters.dflash_model import DFlashConfig, DFlashModel, default_tap_layers
from fastspec.audit import ExactOracle, exact_speculative_law, exact_target_law, total_variation
from fastspec.audit.dflash import (AUDIT_PROMPT, WrongQDenoiseDrafter, run_distribution_audit,
                                   toy_setup)
from fastspec.decoding.sampling import SamplingParams
from fastspec.drafters.dflash import DFlashDrafter, denoise_schedule

PROMPT = [0, 1, 3, 2, 4, 1, 5, 6]


def small_llama(dtype="float64", **kw):
    cfg = dict(vocab_size=40, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=48,
               max_seq_len=96, dtype=dtype)
    cfg.update(kw)
    return fs.Transformer.random(fs.ModelConfig(**cfg), seed=3)


def context_cache_from_scratch(model, target, committed):
    """Context cache rebuilt from a full target recompute of ``committed`` (positions 0..n-1)."""
    cache = model.new_cache()
    if len(committed):
        out = target.forward(np.array(committed), hidden_layers=model.config.tap_layers)
        model.append_context(cache, model.context_features(out.hidden))
    return cache


# --- config ---------------------------------------------------------------------------------

def test_config_defaults_resolve_from_target():
    cfg = fs.DFlashConfig(block_size=8)
    assert cfg.n_layers == 1 and cfg.tap_layers is None and not cfg.resolved
    tiny = fs.ModelConfig.tiny_llama()
    r = cfg.resolve(tiny)
    assert r.resolved
    assert r.tap_layers == (1, 3) and r.tap_layers[-1] == tiny.n_layers - 1
    assert (r.n_heads, r.n_kv_heads, r.head_dim, r.ffn_dim) == (8, 8, 32, 704)
    assert r.mask_token_id == 258  # the byte tokenizer's MASK
    assert r.qk_norm is False and r.rope_theta == tiny.rope_theta and r.norm_eps == tiny.norm_eps
    toy = fs.ModelConfig.toy(vocab_size=8)
    assert cfg.resolve(toy).mask_token_id == 7  # vocab_size - 1 without a byte tokenizer
    assert default_tap_layers(1) == (0,)
    assert default_tap_layers(12, 4) == (2, 5, 8, 11)
    assert DFlashConfig(tap_layers=(-1, 0)).resolve(tiny).tap_layers == (3, 0)


def test_config_dict_round_trip():
    cfg = DFlashConfig(block_size=16, n_layers=2, tap_layers=(0, 2), mask_token_id=5)
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert DFlashConfig.from_dict(d) == cfg
    with pytest.raises(ValueError, match="unknown DFlashConfig keys"):
        DFlashConfig.from_dict({**d, "bogus": 1})
    assert "rope_freq_factors" not in d  # left out at its default (older readers)
    scaled = cfg.replace(rope_freq_factors=[1, 2.5, 4, 4])
    assert scaled.rope_freq_factors == (1.0, 2.5, 4.0, 4.0)
    assert DFlashConfig.from_dict(json.loads(json.dumps(scaled.to_dict()))) == scaled


@pytest.mark.parametrize("bad, match", [
    ("abc", "sequence"), (3, "sequence"), ([1, 0, 1, 1], r"rope_freq_factors\[1\]"),
    ([1, float("nan")], "positive finite"), ([1, True], "positive finite")])
def test_config_rejects_bad_rope_freq_factors(bad, match):
    with pytest.raises(ValueError, match=match):
        DFlashConfig(rope_freq_factors=bad)


def test_config_rope_freq_factors_fit_the_head():
    tiny = fs.ModelConfig.tiny_llama()  # head_dim 32: 16 divisors
    assert DFlashConfig(rope_freq_factors=[2.0] * 16).resolve(tiny).resolved
    with pytest.raises(ValueError, match="needs 16"):
        DFlashConfig(rope_freq_factors=[2.0] * 8).resolve(tiny)


@pytest.mark.parametrize("kw, match", [
    (dict(block_size=1), "block_size"), (dict(block_size=17), "block_size"),
    (dict(n_layers=0), "n_layers"), (dict(tap_layers=()), "tap_layers"),
    (dict(rope_theta=-1.0), "rope_theta"), (dict(mask_token_id=-1), "mask_token_id"),
])
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        DFlashConfig(**kw)


def test_config_rejects_what_does_not_fit_the_target():
    target = small_llama()
    with pytest.raises(ValueError, match="tap_layers"):
        DFlashModel.random(DFlashConfig(tap_layers=(3,)), target)
    with pytest.raises(ValueError, match="mask_token_id 40"):
        DFlashModel.random(DFlashConfig(mask_token_id=40), target)
    with pytest.raises(ValueError, match="repeat"):
        DFlashModel.random(DFlashConfig(tap_layers=(2, -1)), target)


# --- block forward vs the explicit reference --------------------------------------------------

@pytest.mark.parametrize("variant", ["gqa", "qk_norm", "toy_target", "two_layers"])
def test_block_forward_matches_reference(backend, variant):
    if variant == "toy_target":
        target = fs.Transformer.random(fs.ModelConfig.toy(vocab_size=8, dtype="float64"), seed=1)
        cfg = DFlashConfig(block_size=5)
    else:
        target = small_llama()
        cfg = DFlashConfig(block_size=8, qk_norm=variant == "qk_norm",
                           n_layers=2 if variant == "two_layers" else 1)
    model = DFlashModel.random(cfg, target, seed=7)
    rng = np.random.default_rng(0)
    V = target.config.vocab_size
    seq = rng.integers(0, V, size=13)
    out = target.forward(seq, hidden_layers=model.config.tap_layers)
    for P in (0, 1, 6, 12):
        cache = model.new_cache()
        hidden = {t: h[:P] for t, h in out.hidden.items()}
        model.append_context(cache, model.context_features(hidden))
        block = model.mask_block(int(seq[P]))
        got = model.draft_block(cache, int(seq[P]))
        want = model.draft_block_reference(hidden, block)
        assert got.shape == (cfg.block_size - 1, V)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        assert cache.length == P  # the block never advances the context
        # partially filled and shorter blocks
        block[2] = rng.integers(0, V)
        np.testing.assert_allclose(model.forward_block(cache, block),
                                   model.draft_block_reference(hidden, block), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(model.forward_block(cache, block[:3]),
                                   model.draft_block_reference(hidden, block[:3]),
                                   rtol=1e-10, atol=1e-10)


def test_block_forward_float32_close_to_float64(backend):
    t64 = small_llama("float64")
    t32 = fs.Transformer(t64.config.replace(dtype="float32"), t64.embed, t64.layers, t64.head,
                         t64.final_norm)
    m64 = DFlashModel.random(DFlashConfig(block_size=8), t64, seed=2)
    m32 = DFlashModel(m64.config, t32, m64.fc, m64.hidden_norm, m64.layers, m64.norm)
    seq = np.arange(10) % 40
    for m, t in ((m64, t64), (m32, t32)):
        cache = m.new_cache()
        out = t.forward(seq, hidden_layers=m.config.tap_layers)
        m.append_context(cache, m.context_features(out.hidden))
        m.logits = m.draft_block(cache, 3).copy()
    assert m32.logits.dtype == np.float32
    np.testing.assert_allclose(m32.logits, m64.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_embedding_and_head_are_shared_not_copied(backend, dtype):
    target = small_llama(dtype, tie_embeddings=False)  # scaling the head alone, below
    model = DFlashModel.random(DFlashConfig(), target)
    assert model.target is target
    assert model._stack.embed is target.embed and model._stack.head is target.head
    assert not any(k.startswith(("embed", "model.embed", "lm_head")) for k in model.state_dict())
    cache = model.new_cache()
    before = model.draft_block(cache, 1).copy()
    target.head[:] *= 2.0  # the drafter uses the target's head array ...
    model.invalidate()  # ... which float32 runners pack once: refresh them
    np.testing.assert_allclose(model.draft_block(cache, 1), 2.0 * before,
                               rtol=1e-12 if dtype == "float64" else 1e-6)


@pytest.mark.parametrize("weight_dtype", [None, "bfloat16"])
def test_runners_share_packed_matrices_until_invalidated(weight_dtype):
    """Runners over the same arrays (a DFlash drafter's stack reads its target's head, each
    thread builds its own runner) share one packed copy; invalidate() makes the next runner
    pack afresh, so in-place updates are seen."""
    if "cython" not in fs.available_backends():
        pytest.skip("needs the compiled runner")
    from fastspec.model import _model_weights

    # untied: the head is reordered in place below, the embedding must stay as it is
    target = small_llama("float32", weight_dtype=weight_dtype, tie_embeddings=False)
    model = DFlashModel.random(DFlashConfig(), target)
    with fs.using_backend("cython"):
        target.forward([1, 2, 3])
        packed_head = _model_weights.packed_of(target.head)
        assert packed_head is not None
        cache = model.new_cache()
        before = model.draft_block(cache, 1).copy()
        assert _model_weights.packed_of(target.head) is packed_head  # not packed again
        twin = fs.Transformer(target.config, target.embed, target.layers, target.head,
                              target.final_norm)
        np.testing.assert_array_equal(twin.forward([1, 2, 3]).logits,
                                      target.forward([1, 2, 3]).logits)
        assert _model_weights.packed_of(target.layers[0].wq) is not None
        target.head[:] = target.head[:, ::-1]  # in place, then refreshed
        model.invalidate()
        assert _model_weights.packed_of(target.head) is None
        after = model.draft_block(cache, 1)
        assert _model_weights.packed_of(target.head) is not packed_head
    np.testing.assert_array_equal(after, before[:, ::-1])


# --- context cache ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,weights", [("float64", None), ("float32", None),
                                           ("float32", "float16")])
def test_append_hidden_equals_features_then_append_context(backend, dtype, weights):
    # The fused call (Cython) against its NumPy twin, the composition of the two methods.
    target = small_llama(dtype).with_weight_dtype(weights)
    model = DFlashModel.random(DFlashConfig(block_size=4), target, seed=2)
    out = target.forward(np.array(PROMPT), hidden_layers=model.config.tap_layers)
    fused, twin = model.new_cache(), model.new_cache()
    L = len(PROMPT)
    for lo, hi in ((0, 5), (5, 6), (3, L)):  # appends, then a rollback to position 3
        rows = {t: h[lo:hi] for t, h in out.hidden.items()}
        model.append_hidden(fused, rows, lo)
        model.append_context(twin, model.context_features(rows), lo)
    assert fused.length == twin.length == L
    tol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(fused.k[:, :, :L], twin.k[:, :, :L], rtol=tol, atol=tol)
    np.testing.assert_allclose(fused.v[:, :, :L], twin.v[:, :, :L], rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="capacity"):
        model.append_hidden(fused, {t: np.zeros((fused.capacity, 32), dtype) for t in rows})


def test_context_kv_taps_rejects_bad_arguments():
    _model = pytest.importorskip("fastspec.model._model")
    target = small_llama("float32")
    model = DFlashModel.random(DFlashConfig(block_size=4), target, seed=2)
    runner = _model.TransformerRunner(model._stack)
    cache = model.new_cache()
    taps = np.zeros((2, 64), np.float32)
    fc = _model.linear_weights(model.fc)
    with pytest.raises(ValueError, match="fc"):
        runner.context_kv_taps(taps, model.fc, model.hidden_norm, cache.k, cache.v, 0)
    with pytest.raises(ValueError, match="taps"):
        runner.context_kv_taps(taps.astype(np.float64), fc, model.hidden_norm, cache.k, cache.v, 0)
    with pytest.raises(ValueError, match="hidden_norm"):
        runner.context_kv_taps(taps, fc, model.hidden_norm[:3], cache.k, cache.v, 0)
    with pytest.raises(ValueError, match="capacity"):
        runner.context_kv_taps(taps, fc, model.hidden_norm, cache.k, cache.v, cache.capacity - 1)
    with pytest.raises(TypeError):
        _model.linear_weights(np.zeros((2, 2), np.int32))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_incremental_context_cache_equals_recompute(backend, temperature):
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=4), target, seed=1)
    drafter = DFlashDrafter(model)
    rounds = []

    def after_round(seq, n):
        fresh = context_cache_from_scratch(model, target, seq[:n - 1])
        L = n - 1
        assert drafter.cache.length == L
        err = max(np.abs(fresh.k[:, :, :L] - drafter.cache.k[:, :, :L]).max(),
                  np.abs(fresh.v[:, :, :L] - drafter.cache.v[:, :, :L]).max())
        rounds.append(err)

    fs.speculative_generate(target, drafter, PROMPT, 30, gamma=3, temperature=temperature,
                            seed=4, callback=after_round)
    assert len(rounds) >= 8
    assert max(rounds) <= 1e-10


def test_append_context_rolls_back_with_start():
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(), target)
    out = target.forward(np.arange(12), hidden_layers=model.config.tap_layers)
    feats = model.context_features(out.hidden)
    cache = model.new_cache()
    model.append_context(cache, feats[:10])
    model.draft_block(cache, 5)  # scratch writes past the length
    model.append_context(cache, feats[7:12], start=7)  # crop to 7, then append 5
    fresh = context_cache_from_scratch(model, target, np.arange(12))
    assert cache.length == 12
    np.testing.assert_allclose(cache.k[:, :, :12], fresh.k[:, :, :12], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="start"):
        model.append_context(cache, feats[:1], start=13)


# --- losslessness ----------------------------------------------------------------------------

@pytest.mark.parametrize("block_size, steps", [(2, 1), (8, 1), (8, 3), (16, 1), (16, 3)])
def test_greedy_equals_vanilla(backend, block_size, steps):
    target = small_llama()
    expected = fs.generate(target, PROMPT, 40).tokens
    model = DFlashModel.random(DFlashConfig(block_size=block_size), target, seed=block_size)
    for gamma in (1, 4, block_size - 1, 32):
        drafter = DFlashDrafter(model, denoise_steps=steps)
        res = fs.speculative_generate(target, drafter, PROMPT, 40, gamma=gamma)
        assert res.tokens == expected, (gamma, res.tokens, expected)
        assert res.stats.drafted <= res.stats.rounds * min(gamma, block_size - 1)
        # fed from the verification pass: one target call per round, plus the prefill
        assert res.stats.target_calls == res.stats.rounds + 1
        assert drafter.forward_calls <= res.stats.rounds * steps


def test_greedy_equals_vanilla_with_an_oracle_drafter():
    """A drafter that knows the target's greedy tokens: every round fully accepted."""
    target = small_llama()
    expected = fs.generate(target, PROMPT, 30).tokens
    model = DFlashModel.random(DFlashConfig(block_size=6), target)
    drafter = DFlashDrafter(model)
    full = np.array(PROMPT + expected)

    def oracle_block(cache, block):
        P = cache.length
        logits = np.full((block.shape[0] - 1, 40), -10.0)
        for j in range(block.shape[0] - 1):
            if P + 1 + j < len(full):
                logits[j, full[P + 1 + j]] = 10.0
        return logits

    model.forward_block = oracle_block
    res = fs.speculative_generate(target, drafter, PROMPT, 30, gamma=5, trace=True)
    assert res.tokens == expected
    assert all(r["accepted"] == r["proposed"] for r in res.stats.trace)
    assert res.stats.mean_accepted_length > 4


def test_denoise_schedule():
    assert denoise_schedule(7, 3) == [3, 2, 2]
    assert denoise_schedule(7, 1) == [7]
    assert denoise_schedule(2, 5) == [1, 1]
    assert sum(denoise_schedule(15, 4)) == 15


def test_multi_step_denoising_runs_steps_forwards():
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target)
    drafter = DFlashDrafter(model, denoise_steps=3)
    out = target.forward(np.array(PROMPT[:-1]), hidden_layers=drafter.hidden_layers)
    drafter.reset(np.array(PROMPT), out.hidden)
    prop = drafter.propose(np.array(PROMPT), 7, SamplingParams(1.0), np.random.default_rng(0))
    assert prop.q is None and len(prop) == 7 and drafter.forward_calls == 3
    # deterministic: the rng is not used
    again = drafter.propose(np.array(PROMPT), 7, SamplingParams(1.0), np.random.default_rng(9))
    assert again.tokens.tolist() == prop.tokens.tolist()
    # the first of the 3 forwards sees the all-MASK block, like the single-step drafter: the 3
    # positions it fills (denoise_schedule(7, 3)[0], the most confident) carry that argmax
    single = DFlashDrafter(model)
    single.reset(np.array(PROMPT), out.hidden)
    first = single.propose(np.array(PROMPT), 7, SamplingParams(1.0), np.random.default_rng(0))
    assert first.q is None and len(first) == 7
    logits = model.draft_block(single.cache, PROMPT[-1])[:7].astype(np.float64)
    top = np.argsort(-_confidence(logits), kind="stable")[:denoise_schedule(7, 3)[0]]
    assert prop.tokens[top].tolist() == first.tokens[top].tolist()


def _confidence(logits):
    """Top softmax probability of each row of ``logits`` (n, vocab)."""
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z.max(axis=1) / z.sum(axis=1)


def _unmask(model, hidden, bonus, g, steps, order):
    """Replay argmax unmasking with the explicit reference forward; ``order(conf, masked, count)``
    picks the positions each step fills."""
    block = model.mask_block(bonus)[:g + 1]
    masked = np.ones(g, dtype=bool)
    for count in denoise_schedule(g, steps):
        logits = model.draft_block_reference(hidden, block)[:g]
        picks = order(_confidence(logits), masked, count)
        assert masked[picks].all()
        block[1 + picks] = np.argmax(logits[picks], axis=1)
        masked[picks] = False
    return block[1:].tolist()


def _most_confident(conf, masked, count):
    return np.argsort(-np.where(masked, conf, -1.0), kind="stable")[:count]


def _left_to_right(conf, masked, count):
    return np.flatnonzero(masked)[:count]


def test_unmasking_goes_in_confidence_order():
    """Each denoising step fills the most confident still-masked positions with their argmax."""
    target, model = toy_setup(block_size=8)
    rng = np.random.default_rng(1)
    other_order_differs = 0
    for _ in range(12):
        seq = rng.integers(0, 8, size=12)
        out = target.forward(seq[:-1], hidden_layers=model.config.tap_layers)
        for steps in (2, 3, 7):
            drafter = DFlashDrafter(model, denoise_steps=steps)
            drafter.reset(seq, out.hidden)
            got = drafter.propose(seq, 7, SamplingParams(), rng).tokens.tolist()
            assert got == _unmask(model, out.hidden, int(seq[-1]), 7, steps, _most_confident)
            other_order_differs += got != _unmask(model, out.hidden, int(seq[-1]), 7, steps,
                                                  _left_to_right)
    assert other_order_differs > 0  # the order matters on these blocks: the check has power


def test_multi_step_changes_proposals():
    """Re-running the block with filled positions changes later argmaxes (not a no-op)."""
    target, model = toy_setup(block_size=8)
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(20):
        seq = rng.integers(0, 8, size=12)
        out = target.forward(seq[:-1], hidden_layers=model.config.tap_layers)
        props = []
        for steps in (1, 7):
            d = DFlashDrafter(model, denoise_steps=steps)
            d.reset(seq, out.hidden)
            props.append(d.propose(seq, 7, SamplingParams(), rng).tokens.tolist())
        differ += props[0] != props[1]
    assert differ > 0


@pytest.mark.parametrize("trim_block", [True, False])
def test_sample_block_reports_its_q(trim_block):
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target)
    drafter = DFlashDrafter(model, sample_block=True, trim_block=trim_block)
    out = target.forward(np.array(PROMPT[:-1]), hidden_layers=drafter.hidden_layers)
    drafter.reset(np.array(PROMPT), out.hidden)
    sp = SamplingParams(0.8, top_k=5)
    prop = drafter.propose(np.array(PROMPT), 4, sp, np.random.default_rng(0))
    assert prop.q.shape == (4, 40)
    if trim_block:  # the block [bonus, MASK x 4]: 5 positions, not 8
        block = model.mask_block(PROMPT[-1])[:5]
        logits = model.forward_block(drafter.cache, block)
        full = model.draft_block(drafter.cache, PROMPT[-1])[:4]
        assert not np.allclose(logits, full)  # the trailing masks did matter
    else:
        logits = model.draft_block(drafter.cache, PROMPT[-1])[:4]
    np.testing.assert_allclose(prop.q, fs.kernels.probs(np.ascontiguousarray(logits), 0.8, 5, 1.0))
    assert all(prop.q[j, x] > 0 for j, x in enumerate(prop.tokens))
    greedy = drafter.propose(np.array(PROMPT), 4, SamplingParams(0.0), np.random.default_rng(0))
    assert greedy.q is None and greedy.tokens.tolist() == np.argmax(logits, 1).tolist()


def test_exact_distribution_audit():
    results = run_distribution_audit()
    by_name = {r.name: r for r in results}
    for name, r in by_name.items():
        assert r.passed, (name, r.figures)
        if "negative" in name:
            assert r.figures["tv"] > 0.01
        else:
            assert r.figures["tv"] < 1e-9 and abs(r.figures["mass"] - 1) < 1e-9
    assert {"dflash_exact_single_step[t1]", "dflash_exact_multi_step[t1]",
            "dflash_exact_sample_block[t1]", "dflash_negative_control_wrong_q[t1]"} <= set(by_name)


def test_exact_audit_catches_a_wrong_q_on_the_single_step_drafter():
    """Power check of the enumeration: an argmax block that reports softmax q must fail."""
    target, model = toy_setup()
    sp = SamplingParams(1.0)
    oracle = ExactOracle(target, sp, model.config.tap_layers)
    truth = exact_target_law(target, AUDIT_PROMPT, 2, sp, oracle)
    drafter = DFlashDrafter(model)

    def wrong(seq, g, sampling):
        drafter.reset(np.array(seq), oracle.hidden_before_last(seq))
        logits = model.draft_block(drafter.cache, seq[-1])[:g]
        q = fs.kernels.probs(np.ascontiguousarray(logits), 1.0)
        return [(1.0, np.argmax(logits, 1), q)]

    law = exact_speculative_law(target, drafter, AUDIT_PROMPT, 2, 2, sp, wrong, oracle)
    assert total_variation(truth, law) > 0.01


@pytest.mark.parametrize("name", ["dflash_block_reference", "dflash_context_cache",
                                  "dflash_greedy_equality"])
def test_registered_audit_checks(backend, name):
    from fastspec import audit
    import fastspec.audit.dflash  # noqa: F401  (registers the checks)
    assert {"dflash_exact_distribution", name} <= {c.name for c in audit.CHECKS}
    report = audit.run_audit(quick=True, names=[name])
    assert report["checks"][name]["passed"], report["checks"][name]


@pytest.mark.slow
def test_monte_carlo_through_the_real_loop(backend):
    """20k real speculative runs: single-step DFlash passes, the wrong-q control fails."""
    from fastspec.audit import chi_square_test
    target, model = toy_setup()
    sp = SamplingParams(1.0)
    law = exact_target_law(target, AUDIT_PROMPT, 2, sp)
    keys = sorted(law)
    probs = np.array([law[k] for k in keys])
    index = {k: i for i, k in enumerate(keys)}
    for drafter, should_pass in ((DFlashDrafter(model), True),
                                 (WrongQDenoiseDrafter(model, 2), False)):
        counts = np.zeros(len(keys), dtype=np.int64)
        for i in range(20_000):
            res = fs.speculative_generate(target, drafter, AUDIT_PROMPT, 2, gamma=3,
                                          temperature=1.0, seed=10_000 + i)
            counts[index[tuple(res.tokens)]] += 1
        test = chi_square_test(counts, probs)
        assert (test["p_value"] >= 1e-3) == should_pass, test


# --- persistence -----------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    target = small_llama(qk_norm=True)
    model = DFlashModel.random(DFlashConfig(block_size=6, n_layers=2), target, seed=5)
    assert model.config.qk_norm
    path = tmp_path / "dflash.npz"
    model.save(path)
    with np.load(path, allow_pickle=False) as f:
        keys = set(f.files)
        cfg = json.loads(str(f["config"]))
        assert f["fc.weight"].shape == (32, 2 * 32)
        assert f["layers.1.self_attn.k_proj.weight"].shape == (2 * 8, 32)
    assert {"config", "fc.weight", "hidden_norm.weight", "norm.weight",
            "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight",
            "layers.0.self_attn.q_norm.weight", "layers.0.mlp.gate_proj.weight"} <= keys
    assert cfg["tap_layers"] == list(model.config.tap_layers) and cfg["mask_token_id"] == 39
    loaded = DFlashModel.load(path, target)
    assert loaded.config == model.config
    cache = model.new_cache()
    np.testing.assert_array_equal(loaded.draft_block(cache, 2), model.draft_block(cache, 2))


def test_load_rejects_another_target(tmp_path):
    target = small_llama()
    path = tmp_path / "d.npz"
    DFlashModel.random(DFlashConfig(), target).save(path)
    with pytest.raises(ValueError, match="fc.weight"):
        DFlashModel.load(path, small_llama(dim=48, n_heads=4, n_kv_heads=2))
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashModel.load(path, small_llama(vocab_size=20))
    with pytest.raises(ValueError, match="tap_layers"):
        DFlashModel.load(path, small_llama(n_layers=1))
    target.save(tmp_path / "t.npz")
    with pytest.raises(ValueError, match="not a fastspec DFlash file"):
        DFlashModel.load(tmp_path / "t.npz", target)
    with pytest.raises(TypeError, match="target"):
        DFlashModel.load(path, "target")


# --- bad input -------------------------------------------------------------------------------

def test_drafter_rejects_bad_arguments():
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target)
    with pytest.raises(ValueError, match="denoise_steps"):
        DFlashDrafter(model, denoise_steps=0)
    with pytest.raises(ValueError, match="denoise_steps"):
        DFlashDrafter(model, denoise_steps=8)
    with pytest.raises(ValueError, match="sample_block"):
        DFlashDrafter(model, denoise_steps=2, sample_block=True)
    with pytest.raises(TypeError, match="DFlashModel"):
        DFlashDrafter(target)
    with pytest.raises(TypeError, match="trim_block"):
        DFlashDrafter(model, trim_block="yes")
    d = DFlashDrafter(model)
    assert d.max_gamma == 7 and d.hidden_layers == model.config.tap_layers
    with pytest.raises(ValueError, match="hidden"):
        d.reset(np.array(PROMPT), None)
    with pytest.raises(ValueError, match="rows"):
        d.reset(np.array(PROMPT), {t: np.zeros((3, 32)) for t in d.hidden_layers})
    with pytest.raises(ValueError, match="tapped target layer"):
        d.reset(np.array(PROMPT), {0: np.zeros((7, 32))})
    out = target.forward(np.array(PROMPT[:-1]), hidden_layers=d.hidden_layers)
    d.reset(np.array(PROMPT), out.hidden)
    with pytest.raises(ValueError, match="len\\(seq\\) - 1"):
        d.propose(np.array(PROMPT + [3]), 4, SamplingParams(), np.random.default_rng(0))
    with pytest.raises(ValueError, match="does not continue"):
        d.commit(np.array(PROMPT + [1, 2, 3]), 0, {t: np.zeros((1, 32)) for t in d.hidden_layers})
    assert len(d.propose(np.array(PROMPT), 0, SamplingParams(), np.random.default_rng(0))) == 0


def test_model_rejects_bad_arguments():
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=4), target)
    cache = model.new_cache()
    with pytest.raises(ValueError, match="bonus_token"):
        model.draft_block(cache, 40)
    with pytest.raises(ValueError, match="len\\(block_tokens\\)"):
        model.forward_block(cache, [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="block_tokens"):
        model.forward_block(cache, [1, 99])
    with pytest.raises(ValueError, match="features"):
        model.append_context(cache, np.zeros((2, 31)))
    with pytest.raises(ValueError, match="does not match"):
        model.draft_block(target.new_cache(), 1)
    with pytest.raises(ValueError, match="capacity"):
        model.append_context(cache, np.zeros((model.max_positions, 32)))
    with pytest.raises(ValueError, match="fc must have shape"):
        DFlashModel(model.config, target, model.fc[:, :5], model.hidden_norm, model.layers, model.norm)
    with pytest.raises(TypeError, match="Transformer"):
        DFlashModel.random(DFlashConfig(), object())


@pytest.mark.hf
@pytest.mark.parametrize("factors", [None, [1.0, 2.5, 4.0, 4.0]], ids=["plain", "llama3"])
def test_matches_the_torch_trainer(tmp_path, factors):
    """Weights exported by fastspec.training (torch) give the same block logits here, with
    the drafter's own RoPE divisors too."""
    torch = pytest.importorskip("torch")
    from fastspec import training as T
    tcfg = dict(vocab_size=260, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                ffn_dim=48, max_seq_len=64, norm="rmsnorm", positional="rope",
                activation="swiglu", tie_embeddings=True, rope_theta=10000.0, norm_eps=1e-5,
                qk_norm=True, dtype="float32")
    dcfg = T.dflash_config(tcfg, n_layers=2, block_size=6)
    if factors is not None:
        dcfg["rope_freq_factors"] = factors
    torch.manual_seed(0)
    tm = T.build_transformer(tcfg)
    dm = T.build_dflash(dcfg, tcfg)
    with torch.no_grad():  # O(1) random weights: the trainer's 0.02 init makes logits ~0
        for m in (tm, dm):
            for _, p in m.named_parameters():
                p.copy_(1.0 + 0.1 * torch.randn(p.shape) if p.dim() == 1
                        else torch.randn(p.shape) / p.shape[1] ** 0.5)
    T.export_npz(tm, tcfg, tmp_path / "t.npz", dtype="float32")
    T.export_npz(dm, dcfg, tmp_path / "d.npz", dtype="float32")
    target = fs.Transformer.load(tmp_path / "t.npz", dtype="float64")
    model = fs.DFlashModel.load(tmp_path / "d.npz", target)
    assert model.config.to_dict() == {**dcfg, "tap_layers": list(dcfg["tap_layers"])}
    seq = np.random.default_rng(0).integers(0, 256, size=20)
    P, B = 13, 6
    out = target.forward(seq[:P], hidden_layers=model.config.tap_layers)
    cache = model.new_cache()
    model.append_context(cache, model.context_features(out.hidden))
    block = model.mask_block(int(seq[P]))
    block[3] = 7
    mine = model.forward_block(cache, block).copy()
    with torch.no_grad():
        _, hid = tm(torch.from_numpy(seq[None, :P]), hidden_layers=set(dcfg["tap_layers"]),
                    return_logits=False)
        ctx = dm.context(torch.cat([hid[t].float() for t in dcfg["tap_layers"]], -1))
        emb = torch.nn.functional.embedding(torch.from_numpy(block[None]), tm.model.embed_tokens.weight)
        mask = torch.ones(B, P + B, dtype=torch.bool)
        theirs = dm(emb, torch.arange(P, P + B), ctx, torch.arange(P), mask, tm.head_weight())
    np.testing.assert_allclose(mine, theirs[0, 1:].numpy(), rtol=0, atol=2e-5)


def test_config_head_defaults_follow_the_trainer():
    tiny = fs.ModelConfig.tiny_llama(n_kv_heads=2)
    r = DFlashConfig(n_heads=4).resolve(tiny)
    assert (r.n_heads, r.n_kv_heads, r.head_dim) == (4, 2, 32)
    r = DFlashConfig(n_heads=3).resolve(tiny)
    assert (r.n_heads, r.n_kv_heads, r.head_dim) == (3, 3, 32)
    target = fs.Transformer.random(tiny.replace(n_layers=2, max_seq_len=64, dtype="float64"), 0)
    model = DFlashModel.random(DFlashConfig(n_heads=3, block_size=4), target)
    seq = np.arange(9)
    out = target.forward(seq, hidden_layers=model.config.tap_layers)
    cache = model.new_cache()
    model.append_context(cache, model.context_features(out.hidden))
    np.testing.assert_allclose(model.draft_block(cache, 9),
                               model.draft_block_reference(out.hidden, model.mask_block(9)),
                               rtol=1e-10, atol=1e-10)


def test_block_forward_fuzz(backend):
    """Random shapes, contexts and partially filled blocks: cache path == explicit reference."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
    @hypothesis.given(heads=st.sampled_from([(2, 1), (2, 2), (4, 2)]), head_dim=st.sampled_from([4, 8]),
                      n_layers=st.integers(1, 2), B=st.integers(2, 16), P=st.integers(0, 20),
                      qk_norm=st.booleans(), seed=st.integers(0, 2**16))
    def check(heads, head_dim, n_layers, B, P, qk_norm, seed):
        rng = np.random.default_rng(seed)
        target = fs.Transformer.random(fs.ModelConfig(
            vocab_size=12, dim=16, n_layers=2, n_heads=2, ffn_dim=24, max_seq_len=40,
            dtype="float64"), seed=seed)
        model = DFlashModel.random(DFlashConfig(block_size=B, n_layers=n_layers, n_heads=heads[0],
                                                n_kv_heads=heads[1], head_dim=head_dim,
                                                qk_norm=qk_norm, tap_layers=(1,)), target, seed)
        seq = rng.integers(0, 12, size=P + 1)
        hidden = {1: np.zeros((0, 16))}
        cache = model.new_cache()
        if P:
            hidden = target.forward(seq[:P], hidden_layers=(1,)).hidden
            model.append_context(cache, model.context_features(hidden))
        block = model.mask_block(int(seq[P]))
        fill = rng.random(B) < 0.3
        fill[0] = False
        block[fill] = rng.integers(0, 12, size=int(fill.sum()))
        n = int(rng.integers(2, B + 1))
        np.testing.assert_allclose(model.forward_block(cache, block[:n]),
                                   model.draft_block_reference(hidden, block[:n]),
                                   rtol=1e-10, atol=1e-10)

    check()

