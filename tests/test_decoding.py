"""generate() and speculative_generate(): equality with the reference, stopping rules, stats,
argument validation."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.drafters.base import Proposal

from _helpers import PREFIX, toy


@pytest.fixture(scope="module")
def pair():
    return toy(71, 2), toy(71, 1)


def drafters(target, draft):
    return {"draft_model": fs.DraftModelDrafter(draft), "ngram": fs.NgramDrafter()}


class Recording:
    """Wraps a drafter and records every gamma it is asked for."""

    def __init__(self, inner):
        self.inner = inner
        self.hidden_layers = inner.hidden_layers
        self.max_gamma = inner.max_gamma
        self.gammas = []

    def reset(self, prompt, hidden):
        self.inner.reset(prompt, hidden)

    def propose(self, seq, gamma, sampling, rng):
        self.gammas.append((len(seq), gamma))
        return self.inner.propose(seq, gamma, sampling, rng)

    def commit(self, seq, n_accepted, hidden):
        self.inner.commit(seq, n_accepted, hidden)


class Fixed:
    """Drafter that returns a fixed proposal (for bad-proposal tests)."""

    hidden_layers = ()
    max_gamma = None

    def __init__(self, tokens, q=None):
        self.tokens, self.q = tokens, q

    def reset(self, prompt, hidden):
        pass

    def propose(self, seq, gamma, sampling, rng):
        return Proposal(np.asarray(self.tokens, dtype=np.int64), self.q)

    def commit(self, seq, n_accepted, hidden):
        pass


# --- vanilla -------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [69, 70, 71])
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_cached_equals_full_prefix(backend, seed, temperature):
    model = toy(seed, 2)
    a = fs.generate(model, PREFIX, 48, temperature=temperature, top_k=5, seed=seed)
    b = fs.generate(model, PREFIX, 48, temperature=temperature, top_k=5, seed=seed,
                    use_cache=False)
    assert a.tokens == b.tokens
    assert len(a.tokens) == 48
    assert a.stats.target_calls == 48 and b.stats.target_calls == 48
    assert a.stats.target_positions == 8 + 47
    assert b.stats.target_positions == sum(range(8, 8 + 48))
    assert a.stats.mean_accepted_length == 1.0


def test_vanilla_sampling_is_seeded():
    model = toy(70, 2)
    a = fs.generate(model, PREFIX, 20, temperature=1.0, seed=3).tokens
    assert a == fs.generate(model, PREFIX, 20, temperature=1.0, seed=3).tokens
    assert any(fs.generate(model, PREFIX, 20, temperature=1.0, seed=s).tokens != a
               for s in range(4, 8))


def test_vanilla_first_token_law():
    model = toy(69, 2)
    p = fs.kernels.module("numpy").probs(model.forward(np.array(PREFIX)).logits[-1:], 1.0)[0]
    n = 4000
    counts = np.bincount([fs.generate(model, PREFIX, 1, temperature=1.0, seed=s).tokens[0]
                          for s in range(n)], minlength=8)
    # 5 sigma binomial band per cell
    assert np.all(np.abs(counts / n - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_vanilla_eos_and_reused_cache(pair):
    target, _ = pair
    full = fs.generate(target, PREFIX, 48).tokens
    eos = full[10]
    cut = full[:full.index(eos) + 1]
    cache = target.new_cache()
    assert fs.generate(target, PREFIX, 48, eos_token_id=eos, cache=cache).tokens == cut
    assert fs.generate(target, PREFIX, 48, cache=cache).tokens == full


# --- speculative: greedy equality ------------------------------------------------------------

@pytest.mark.parametrize("seed", [69, 70, 71])
@pytest.mark.parametrize("gamma", [1, 4, 8, "adaptive"])
def test_greedy_equality(backend, seed, gamma):
    target, draft = toy(seed, 2), toy(seed, 1)
    expected = fs.generate(target, PREFIX, 48).tokens
    for name, drafter in drafters(target, draft).items():
        res = fs.speculative_generate(target, drafter, PREFIX, 48, gamma=gamma, seed=seed)
        assert res.tokens == expected, name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_greedy_equality_across_backends(dtype):
    if len(fs.available_backends()) < 2:
        pytest.skip("needs both backends")
    target, draft = toy(71, 2, dtype), toy(71, 1, dtype)
    out = {}
    for b in fs.available_backends():
        with fs.using_backend(b):
            out[b] = (fs.generate(target, PREFIX, 48).tokens,
                      fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 48,
                                              gamma=4).tokens,
                      fs.speculative_generate(target, fs.NgramDrafter(), PREFIX, 48,
                                              gamma=4).tokens)
    first = out[fs.available_backends()[0]]
    assert all(v == first for v in out.values())
    assert first[0] == first[1] == first[2]


def test_greedy_equality_llama_family():
    cfg = fs.ModelConfig(vocab_size=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                         max_seq_len=128, dtype="float64")
    target = fs.Transformer.random(cfg, 1)
    draft = fs.Transformer.random(cfg.replace(n_layers=1), 1)
    prompt = [3, 17, 5, 3, 17, 9]
    expected = fs.generate(target, prompt, 40).tokens
    for drafter in (fs.DraftModelDrafter(draft), fs.NgramDrafter(), fs.DraftModelDrafter(target)):
        assert fs.speculative_generate(target, drafter, prompt, 40, gamma=5).tokens == expected


def test_sampled_speculative_is_seeded(pair):
    target, draft = pair
    kw = dict(gamma=4, temperature=0.9, top_p=0.95, seed=11)
    a = fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 30, **kw).tokens
    b = fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 30, **kw).tokens
    assert a == b and len(a) == 30


# --- identity draft, stats, trace ---------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_identity_draft_accepts_everything(pair, temperature):
    target, _ = pair
    res = fs.speculative_generate(target, fs.DraftModelDrafter(target), PREFIX, 48, gamma=4,
                                  temperature=temperature, seed=5, trace=True)
    for r in res.stats.trace:
        assert r["accepted"] == r["proposed"]
        assert r["bonus"] == (r["proposed"] > 0)
    # 48 = 9 full rounds of 4 + bonus, then gamma is cut to 2 in the last round (2 + bonus)
    assert [r["proposed"] for r in res.stats.trace] == [4] * 9 + [2]
    assert res.stats.acceptance_rate == 1.0
    assert res.stats.mean_accepted_length == pytest.approx(4.8)


def test_stats_are_consistent(pair):
    target, draft = pair
    res = fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 48, gamma=4,
                                  temperature=1.0, seed=3, trace=True)
    s = res.stats
    assert s.new_tokens == len(res.tokens) == 48
    assert s.target_calls == s.rounds + 1  # prefill of prompt[:-1]
    assert s.drafted == sum(r["proposed"] for r in s.trace) == s.proposed_at.sum()
    assert s.accepted == sum(r["accepted"] for r in s.trace) == s.accepted_at.sum()
    assert s.new_tokens == s.accepted + s.rounds
    assert s.mean_accepted_length == pytest.approx(48 / s.rounds)
    assert s.target_positions == 7 + s.drafted + s.rounds
    assert s.draft_calls > 0 and s.draft_positions >= s.draft_calls
    assert s.target_score_cells > 0 and s.draft_score_cells > 0
    assert np.all(s.accepted_at <= s.proposed_at)
    assert np.all(np.diff(s.accepted_at) <= 0)  # a later position needs the earlier ones
    d = s.to_dict()
    assert d["trace"] and d["tokens_per_s"] > 0


# --- stopping rules ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["draft_model", "ngram"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_max_new_tokens_and_last_round_gamma(pair, name, gamma):
    target, draft = pair
    expected = fs.generate(target, PREFIX, 48).tokens
    for count in (1, 2, 3, 7, 20):
        rec = Recording(drafters(target, draft)[name])
        res = fs.speculative_generate(target, rec, PREFIX, count, gamma=gamma)
        assert res.tokens == expected[:count]
        for length, g in rec.gammas:
            remaining = count - (length - len(PREFIX))
            assert 1 <= g <= min(gamma, remaining - 1)


@pytest.mark.parametrize("name", ["draft_model", "ngram", "identity"])
def test_eos_stops_right_after_it(pair, name):
    target, draft = pair
    expected = fs.generate(target, PREFIX, 48).tokens
    for position in (0, 5, 20):
        eos = expected[position]
        cut = expected[:expected.index(eos) + 1]
        drafter = (fs.DraftModelDrafter(target) if name == "identity"
                   else drafters(target, draft)[name])
        cache = target.new_cache()
        res = fs.speculative_generate(target, drafter, PREFIX, 48, gamma=8, eos_token_id=eos,
                                      cache=cache)
        assert res.tokens == cut
        assert res.stats.new_tokens == len(cut)
        assert cache.length == len(PREFIX) + len(cut) - 1


def test_prompt_of_one_token(pair):
    target, draft = pair
    expected = fs.generate(target, [3], 20).tokens
    assert fs.speculative_generate(target, fs.DraftModelDrafter(draft), [3], 20).tokens == expected
    assert fs.speculative_generate(target, fs.NgramDrafter(), [3], 20).tokens == expected


def test_capacity_exactly_full():
    target = toy(69, 2, max_seq_len=24)
    draft = toy(69, 1, max_seq_len=24)
    expected = fs.generate(target, PREFIX, 16).tokens
    assert len(expected) == 16
    assert fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 16,
                                   gamma=8).tokens == expected


def test_small_draft_capacity_is_clamped():
    target = toy(69, 2, max_seq_len=64)
    draft = toy(69, 1, max_seq_len=20)
    expected = fs.generate(target, PREFIX, 40).tokens
    assert fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 40,
                                   gamma=4).tokens == expected


# --- argument validation --------------------------------------------------------------------

BAD = [
    (dict(prompt_ids=[]), ValueError, "prompt_ids"),
    (dict(prompt_ids=[0, 8]), ValueError, "prompt_ids"),
    (dict(prompt_ids=[0, -1]), ValueError, "prompt_ids"),
    (dict(prompt_ids=[0.5]), TypeError, "prompt_ids"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens"),
    (dict(max_new_tokens=10_000), ValueError, "max_seq_len"),
    (dict(temperature=-0.1), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(eos_token_id=8), ValueError, "eos_token_id"),
    (dict(seed=-1), ValueError, "seed"),
]


@pytest.mark.parametrize("kwargs,error,word", BAD)
def test_bad_arguments(pair, kwargs, error, word):
    target, draft = pair
    args = dict(prompt_ids=PREFIX, max_new_tokens=8)
    args.update(kwargs)
    with pytest.raises(error, match=word):
        fs.generate(target, **args)
    cache = target.new_cache()
    drafter = fs.DraftModelDrafter(draft)
    fs.speculative_generate(target, drafter, PREFIX, 8, cache=cache)
    before = (cache.length, drafter.cache.length)
    with pytest.raises(error, match=word):
        fs.speculative_generate(target, drafter, cache=cache, **args)
    assert (cache.length, drafter.cache.length) == before


@pytest.mark.parametrize("gamma,error", [(0, ValueError), (-2, ValueError), (2.5, TypeError),
                                         (True, TypeError), ("fast", ValueError),
                                         (None, TypeError)])
def test_bad_gamma(pair, gamma, error):
    target, draft = pair
    with pytest.raises(error, match="gamma"):
        fs.speculative_generate(target, fs.NgramDrafter(), PREFIX, 8, gamma=gamma)


def test_bad_drafter_and_proposals(pair):
    target, _ = pair
    with pytest.raises(TypeError, match="drafter"):
        fs.speculative_generate(target, object(), PREFIX, 8)
    with pytest.raises(ValueError, match="more than gamma"):
        fs.speculative_generate(target, Fixed([1, 2, 3]), PREFIX, 8, gamma=2)
    with pytest.raises(ValueError, match="outside"):
        fs.speculative_generate(target, Fixed([1, 8]), PREFIX, 8, gamma=2)
    with pytest.raises(ValueError, match="q"):
        fs.speculative_generate(target, Fixed([1, 2], q=np.full((3, 8), 1 / 8)), PREFIX, 8,
                                gamma=2, temperature=1.0)


def test_cache_of_wrong_model_rejected(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="cache"):
        fs.generate(target, PREFIX, 4, cache=draft.new_cache())
    with pytest.raises(ValueError, match="capacity"):
        fs.generate(target, PREFIX, 4, cache=target.new_cache(8))


def test_adaptive_gamma_grows_and_shrinks(pair):
    target, draft = pair
    res = fs.speculative_generate(target, fs.DraftModelDrafter(target), PREFIX, 120,
                                  gamma="adaptive", trace=True)
    gammas = [r["gamma"] for r in res.stats.trace]
    assert gammas[:4] == [4, 6, 8, 10] and max(gammas) == 16
    res = fs.speculative_generate(target, fs.DraftModelDrafter(draft), PREFIX, 60,
                                  gamma="adaptive", trace=True)
    for before, after in zip(res.stats.trace, res.stats.trace[1:]):
        if before["accepted"] < before["proposed"]:
            assert after["gamma"] <= max(before["gamma"] - 1, 1)
        assert 1 <= after["gamma"] <= 16
