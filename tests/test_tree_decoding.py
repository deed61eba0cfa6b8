"""Tree proposals in the speculative loop: greedy output equals vanilla; sampled output has
the target law (negative control: the un-normalised residual); n-gram trees."""
import functools

import numpy as np
import pytest

import fastspec as fs
from fastspec.audit import chi_square_test, exact_continuation_probs
from fastspec.decoding import plan_speculative, run_plan
from fastspec.decoding.sampling import SamplingParams
from fastspec.kernels.tree_shape import MAX_TREE_NODES
from fastspec.drafters.base import TreeProposal
from fastspec.decoding.tree import verify_tree_rejection

from _helpers import toy

I = np.int64


def _prompts(count=20, vocab=6, seed=0):
    """Short prompts over a few tokens: many repeated n-grams with different continuations."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(8, 24))).tolist() for _ in range(count)]


def test_ngram_tree_offers_every_continuation():
    d = fs.NgramDrafter(max_ngram=2, tree=True)
    seq = np.array([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 8, 1, 2], dtype=I)
    d.reset(seq)
    prop = d.propose(seq, 3, SamplingParams(), np.random.default_rng(0))
    assert isinstance(prop, TreeProposal)
    paths = set()
    for i in range(len(prop)):
        path, node = [], i
        while node >= 0:
            path.append(int(prop.tokens[node]))
            node = prop.parents[node]
        paths.add(tuple(path[::-1]))
    # most recent match first: 3 8 1, then 4 9 1, then 3 9 1 (sharing the node 3)
    assert {(3, 8, 1), (4, 9, 1), (3, 9, 1)} <= paths
    assert prop.tokens[0] == 3 and len(prop) == 8
    # one match: a chain
    d.reset(np.array([5, 6, 7, 5, 6], dtype=I))
    chain = d.propose(np.array([5, 6, 7, 5, 6], dtype=I), 2, SamplingParams(), None)
    assert chain.tokens.tolist() == [7, 5] and chain.is_chain()


def test_ngram_tree_budget():
    d = fs.NgramDrafter(max_ngram=1, tree=True, max_branches=8, max_tree_nodes=5)
    seq = np.array([0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0], dtype=I)
    d.reset(seq)
    prop = d.propose(seq, 3, SamplingParams(), None)
    assert len(prop) == 5
    with pytest.raises(ValueError, match="max_tree_nodes"):
        fs.NgramDrafter(tree=True, max_tree_nodes=0)
    with pytest.raises(ValueError, match="max_branches"):
        fs.NgramDrafter(tree=True, max_branches=0)


@pytest.mark.parametrize("gamma", [3, "adaptive"])
def test_tree_greedy_equals_vanilla(backend, gamma):
    target = toy(71, 2)
    vocab = target.config.vocab_size
    for prompt in _prompts(vocab=min(vocab, 6)):
        expected = fs.generate(target, prompt, 24).tokens
        res = fs.speculative_generate(target, fs.NgramDrafter(tree=True), prompt, 24,
                                      gamma=gamma)
        assert res.tokens == expected


def test_tree_greedy_equals_vanilla_llama_family(backend):
    cfg = fs.ModelConfig(vocab_size=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=64, max_seq_len=128, dtype="float64")
    target = fs.Transformer.random(cfg, 1)
    for prompt in _prompts(seed=3):
        expected = fs.generate(target, prompt, 30).tokens
        res = fs.speculative_generate(target, fs.NgramDrafter(max_ngram=2, tree=True),
                                      prompt, 30, gamma=4, trace=True)
        assert res.tokens == expected
        assert all(r["target_cache_length"] == r["prefix_length"] + len(r["tokens"]) - 1
                   for r in res.stats.trace)


def test_trees_were_verified():
    """The greedy tests above do exercise trees (and trees accept more than chains)."""
    target = toy(71, 2)
    tree_rounds = acc_tree = acc_chain = 0
    for prompt in _prompts():
        res = fs.speculative_generate(target, fs.NgramDrafter(tree=True), prompt, 24,
                                      gamma=3, trace=True)
        tree_rounds += sum(r["tree_nodes"] is not None for r in res.stats.trace)
        acc_tree += res.stats.accepted
        acc_chain += fs.speculative_generate(target, fs.NgramDrafter(), prompt, 24,
                                             gamma=3).stats.accepted
    assert tree_rounds > 20
    assert acc_tree >= acc_chain


class _FixedTree:
    """A drafter proposing a fixed 3-branch tree (depth <= gamma) after any context (the
    target's three likeliest tokens after DIST_PROMPT, each followed by its likeliest)."""
    hidden_layers = ()
    max_gamma = None
    max_tree_nodes = 6

    def reset(self, prompt, hidden=None):
        pass

    def propose(self, seq, gamma, sampling, rng):
        tokens = np.array([3, 4, 6, 4, 4, 4], dtype=I)[:3 if gamma == 1 else 6]
        parents = np.array([-1, -1, -1, 0, 1, 2], dtype=I)[:tokens.shape[0]]
        return TreeProposal(tokens, None, parents)

    def commit(self, seq, n_accepted, hidden=None):
        pass


DIST_PROMPT = [1, 2, 3, 1, 2, 4]


@pytest.mark.parametrize("broken", [False, True])
def test_tree_sampling_has_the_target_law(broken):
    target = toy(69, 2)
    vocab = target.config.vocab_size
    sampling = SamplingParams(1.0, 0, 1.0)
    # the law of the first two of three tokens: 64 cells, enough power for the control
    exact = exact_continuation_probs(target, DIST_PROMPT, 2, sampling)
    plan = plan_speculative(target, _FixedTree(), np.array(DIST_PROMPT, dtype=I), 3, 2, 1.0, 0,
                            1.0, 0, None, None)
    verify = functools.partial(verify_tree_rejection, normalise=False) if broken else None
    counts = np.zeros(vocab ** 2)
    for i in range(3000):
        x = run_plan(plan, np.random.default_rng(10_000 + i), verify_tree_rejection=verify).tokens
        counts[x[0] * vocab + x[1]] += 1
    test = chi_square_test(counts, exact)
    if broken:
        assert test["p_value"] < 1e-4
    else:
        assert test["p_value"] > 1e-3 and test["impossible_count"] == 0


def test_bad_tree_proposals():
    target = toy(71, 1)

    class Deep(_FixedTree):
        def propose(self, seq, gamma, sampling, rng):
            return TreeProposal(np.arange(gamma + 1, dtype=I), None,
                                np.arange(-1, gamma, dtype=I))

    with pytest.raises(ValueError, match="more than gamma"):
        fs.speculative_generate(target, Deep(), [1, 2, 3], 8, gamma=3)

    class Forward(_FixedTree):
        def propose(self, seq, gamma, sampling, rng):
            p = TreeProposal(np.zeros(2, dtype=I), None, np.array([-1, 0], dtype=I))
            p.parents = np.array([1, -1], dtype=I)  # corrupted after construction
            return p

    with pytest.raises(ValueError, match=r"parents\[0\] = 1"):
        fs.speculative_generate(target, Forward(), [1, 2, 3], 8, gamma=3)

    class Wide(_FixedTree):
        def propose(self, seq, gamma, sampling, rng):
            n = MAX_TREE_NODES + 1
            p = TreeProposal(np.zeros(2, dtype=I), None, np.array([-1, -1], dtype=I))
            p.tokens, p.parents = np.zeros(n, dtype=I), np.full(n, -1, dtype=I)
            return p

    with pytest.raises(ValueError, match=f"more than the maximum {MAX_TREE_NODES}"):
        fs.speculative_generate(target, Wide(), [1, 2, 3], 8, gamma=3)

    class ZeroQ(_FixedTree):
        def propose(self, seq, gamma, sampling, rng):
            p = super().propose(seq, gamma, sampling, rng)
            p.q = np.full((len(p), 8), 1 / 8)
            p.q[2, p.tokens[2]] = 0.0
            return p

    calls = []

    class Counting:  # the target is never stepped for the bad round
        def __getattr__(self, name):
            return getattr(target, name)

        def step(self, ids, cache, **kw):
            calls.append(len(ids))
            return target.step(ids, cache, **kw)

    with pytest.raises(ValueError, match=r"q\[2, tokens\[2\]\] = 0.0: tree node 2"):
        fs.speculative_generate(Counting(), ZeroQ(), [1, 2, 3], 8, gamma=3, temperature=1.0)
    assert calls == [2]  # the prefill only


def test_tree_is_cut_to_the_room_left_in_a_small_cache(backend):
    """A caller's cache sized for the generation only: trees are cut to the rows left."""
    target = toy(71, 2)
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]
    expected = fs.generate(target, prompt, 12).tokens
    cache = target.new_cache(len(prompt) + 12)
    res = fs.speculative_generate(target, _FixedTree(), prompt, 12, gamma=2, cache=cache,
                                  trace=True)
    assert res.tokens == expected
    nodes = [r["tree_nodes"] for r in res.stats.trace if r["gamma"] == 2]
    assert nodes[0] == 6 and nodes[-1] < 6  # cut near the end
