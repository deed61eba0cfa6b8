"""The draft-model and n-gram drafters: proposals, cache sync, incremental index."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastspec as fs
from fastspec.decoding.sampling import SamplingParams

from _helpers import PREFIX, toy

GREEDY = SamplingParams()


def arr(x):
    return np.asarray(x, dtype=np.int64)


def test_protocol_and_exports():
    for d in (fs.DraftModelDrafter(toy(1, 1)), fs.NgramDrafter()):
        assert isinstance(d, fs.Drafter)
        assert d.hidden_layers == ()
    from fastspec.drafters import DraftModelDrafter, NgramDrafter, Proposal
    assert fs.Proposal is Proposal and fs.SamplingParams is SamplingParams
    assert fs.DraftModelDrafter is DraftModelDrafter and fs.NgramDrafter is NgramDrafter


# --- n-gram ---------------------------------------------------------------------------

def brute_force(seq, gamma, max_ngram, min_ngram, max_proposal=None):
    """Rescan the whole sequence: the specification NgramDrafter implements incrementally."""
    seq = list(seq)
    n = len(seq)
    if max_proposal is not None:
        gamma = min(gamma, max_proposal)
    for size in range(min(max_ngram, n), min_ngram - 1, -1):
        suffix = seq[n - size:]
        for end in range(n - 2, size - 2, -1):
            if seq[end - size + 1:end + 1] == suffix:
                out = seq[end + 1:end + 1 + gamma]
                period = n - 1 - end
                while len(out) < gamma:
                    out.append(out[len(out) - period])
                return out
    return []


def test_ngram_lookup_examples():
    d = fs.NgramDrafter(max_ngram=3)
    rng = np.random.default_rng(0)
    d.reset(arr([1, 2, 3, 4, 1, 2]), None)
    assert d.propose(arr([1, 2, 3, 4, 1, 2]), 3, GREEDY, rng).tokens.tolist() == [3, 4, 1]
    assert d.propose(arr([1, 2, 3, 4, 1, 2]), 3, GREEDY, rng).q is None
    # the longest n-gram wins over a more recent shorter match
    d.reset(arr([7, 5, 9, 6, 5, 8, 7, 5]), None)
    assert d.propose(arr([7, 5, 9, 6, 5, 8, 7, 5]), 2, GREEDY, rng).tokens.tolist() == [9, 6]
    # the most recent occurrence of the same n-gram wins
    d.reset(arr([5, 1, 5, 2, 5]), None)
    assert d.propose(arr([5, 1, 5, 2, 5]), 1, GREEDY, rng).tokens.tolist() == [2]
    # no match: empty proposal
    d.reset(arr([1, 2, 3]), None)
    assert len(d.propose(arr([1, 2, 3]), 4, GREEDY, rng)) == 0
    # a match that runs into the end continues periodically
    d.reset(arr([4, 4, 4]), None)
    assert d.propose(arr([4, 4, 4]), 5, GREEDY, rng).tokens.tolist() == [4] * 5
    d.reset(arr([1, 2, 1, 2]), None)
    assert d.propose(arr([1, 2, 1, 2]), 5, GREEDY, rng).tokens.tolist() == [1, 2, 1, 2, 1]


def test_ngram_max_proposal_and_min_ngram():
    d = fs.NgramDrafter(max_ngram=2, min_ngram=2, max_proposal=2)
    assert d.max_gamma == 2
    rng = np.random.default_rng(0)
    seq = arr([1, 2, 3, 4, 5, 9, 2])
    d.reset(seq, None)
    assert len(d.propose(seq, 4, GREEDY, rng)) == 0  # only a 1-gram would match
    seq = arr([1, 2, 3, 4, 5, 1, 2])
    d.reset(seq, None)
    assert d.propose(seq, 4, GREEDY, rng).tokens.tolist() == [3, 4]


def test_ngram_tuned_drafts_from_three_tokens_of_suffix_or_more():
    from fastspec.drafters.ngram import TUNED_NGRAM

    d = fs.NgramDrafter.tuned()
    assert (d.max_ngram, d.min_ngram, d.tree) == (TUNED_NGRAM["max_ngram"],
                                                  TUNED_NGRAM["min_ngram"], False) == (8, 3, False)
    rng = np.random.default_rng(0)
    seq = arr([1, 2, 3, 4, 5, 9, 2, 3])  # the suffix [2, 3] matches, no longer one
    d.reset(seq, None)
    assert len(d.propose(seq, 4, GREEDY, rng)) == 0
    assert fs.NgramDrafter().propose(seq, 4, GREEDY, rng).tokens.tolist() == [4, 5, 9, 2]
    seq = arr([7, 1, 2, 3, 4, 5, 0, 7, 1, 2, 3])  # a 4-token suffix: the longest match wins
    d.reset(seq, None)
    assert d.propose(seq, 4, GREEDY, rng).tokens.tolist() == [4, 5, 0, 7]
    assert fs.NgramDrafter.tuned(min_ngram=1, max_proposal=2).max_gamma == 2
    tree = fs.NgramDrafter.tuned(tree=True)
    assert (tree.max_ngram, tree.min_ngram, tree.tree) == (8, 3, True)
    seq = arr([1, 2, 3, 4, 5, 9, 2, 3])
    tree.reset(seq, None)
    assert len(tree.propose(seq, 4, GREEDY, rng).tokens) == 0  # no branch from [2, 3]
    with pytest.raises(ValueError):
        fs.NgramDrafter.tuned(max_ngram=2)  # below the tuned min_ngram


@pytest.mark.parametrize("kwargs", [dict(max_ngram=0), dict(min_ngram=4, max_ngram=3),
                                    dict(max_proposal=0), dict(max_ngram=2.5)])
def test_ngram_bad_arguments(kwargs):
    with pytest.raises((ValueError, TypeError)):
        fs.NgramDrafter(**kwargs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 4),
       st.integers(1, 3), st.integers(1, 6))
def test_ngram_incremental_matches_rescan(tokens, max_ngram, min_ngram, gamma):
    min_ngram = min(min_ngram, max_ngram)
    d = fs.NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    rng = np.random.default_rng(0)
    start = max(1, len(tokens) // 3)
    d.reset(arr(tokens[:start]), None)
    for n in range(start, len(tokens) + 1):
        seq = arr(tokens[:n])
        got = d.propose(seq, gamma, GREEDY, rng).tokens.tolist()
        assert got == brute_force(tokens[:n], gamma, max_ngram, min_ngram)
        d.commit(seq, 0, None)


# --- draft model -----------------------------------------------------------------------

def test_draft_model_greedy_proposals_follow_its_argmax():
    draft = toy(70, 1)
    d = fs.DraftModelDrafter(draft)
    d.reset(arr(PREFIX), None)
    prop = d.propose(arr(PREFIX), 6, GREEDY, np.random.default_rng(0))
    assert prop.q is None
    assert prop.tokens.tolist() == fs.generate(draft, PREFIX, 6).tokens
    assert d.cache.length == len(PREFIX) + 5  # the last proposal is never fed


def test_draft_model_sampled_proposals_report_q():
    draft = toy(70, 1)
    d = fs.DraftModelDrafter(draft)
    d.reset(arr(PREFIX), None)
    sampling = SamplingParams(0.8, 4, 0.9)
    prop = d.propose(arr(PREFIX), 5, sampling, np.random.default_rng(1))
    assert prop.q.shape == (5, 8)
    np.testing.assert_allclose(prop.q.sum(axis=1), 1.0)
    assert np.all(prop.q[np.arange(5), prop.tokens] > 0)
    assert np.all((prop.q > 0).sum(axis=1) <= 4)  # top-k applied
    seq = list(PREFIX)
    for i, t in enumerate(prop.tokens):  # each q row is the draft's law after the prefix
        logits = draft.forward(arr(seq)).logits[-1:]
        np.testing.assert_allclose(prop.q[i], fs.kernels.probs(logits, 0.8, 4, 0.9)[0],
                                   atol=1e-12)
        seq.append(int(t))


def fresh_error(model, seq, cache):
    fresh = model.new_cache()
    if len(seq):
        model.forward(arr(seq), fresh)
    L = len(seq)
    assert cache.length == L
    return max(np.max(np.abs(fresh.k[:, :, :L] - cache.k[:, :, :L]), initial=0),
               np.max(np.abs(fresh.v[:, :, :L] - cache.v[:, :, :L]), initial=0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_cache_tracks_committed_prefix(temperature):
    target, draft = toy(71, 2), toy(71, 1)
    d = fs.DraftModelDrafter(draft)
    lags = set()

    def check(seq, n):
        lag = n - 1 - d.cache.length
        lags.add(lag)
        assert lag in (0, 1)
        assert fresh_error(draft, seq[:d.cache.length].tolist(), d.cache) <= 1e-12

    fs.speculative_generate(target, d, PREFIX, 48, gamma=4, temperature=temperature, seed=2,
                            callback=check)
    assert 0 in lags


def test_draft_model_reuse_across_generations():
    target, draft = toy(71, 2), toy(71, 1)
    d = fs.DraftModelDrafter(draft)
    a = fs.speculative_generate(target, d, PREFIX, 30, gamma=3).tokens
    b = fs.speculative_generate(target, d, [5, 4, 3], 30, gamma=3).tokens
    assert a == fs.generate(target, PREFIX, 30).tokens
    assert b == fs.generate(target, [5, 4, 3], 30).tokens


def test_draft_model_counters_and_capacity():
    draft = toy(71, 1, max_seq_len=12)
    d = fs.DraftModelDrafter(draft)
    d.reset(arr(PREFIX), None)
    prop = d.propose(arr(PREFIX), 10, GREEDY, np.random.default_rng(0))
    assert len(prop) == 12 - len(PREFIX) + 1  # clamped to the draft cache
    assert d.forward_calls == 1 + len(prop)  # the prompt prefill (in reset), then one per token
    assert d.forward_positions == len(PREFIX) + len(prop) - 1
    with pytest.raises(ValueError, match="max_seq_len"):
        d.reset(arr(list(range(8)) * 2), None)
    with pytest.raises(TypeError, match="model"):
        fs.DraftModelDrafter("not a model")
