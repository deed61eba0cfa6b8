"""DFlash trees: best-first growth over the block's distributions, lossless in the loop."""
import itertools

import numpy as np
import pytest

import fastspec as fs
from fastspec import DFlashConfig, DFlashModel
from fastspec.drafters.dflash import best_first_tree
from fastspec.kernels.tree_shape import MAX_TREE_NODES, check_parents
from fastspec.drafters.base import TreeProposal

PROMPT = [0, 1, 3, 2, 4, 1, 5, 6]


def small_llama(dtype="float64"):
    return fs.Transformer.random(fs.ModelConfig(
        vocab_size=40, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=48,
        max_seq_len=128, dtype=dtype), seed=3)


@pytest.mark.parametrize("kind", ["normal", "ties", "minus_inf", "nan"])
def test_top_tokens_is_the_stable_sort_head(kind):
    """best_first_tree's selection of each row's best tokens (a partition, then a sort of the
    few above the cut) lists what the full stable sort lists first, ties in token order."""
    from fastspec.drafters.dflash import _top_tokens
    rng = np.random.default_rng(len(kind))
    for _ in range(40):
        vocab, g = int(rng.integers(1, 3000)), int(rng.integers(1, 6))
        width = int(rng.integers(1, min(vocab, 80) + 1))
        x = (rng.integers(-4, 4, (g, vocab)).astype(np.float64) if kind == "ties"
             else rng.standard_normal((g, vocab)).astype(np.float32))
        if kind == "minus_inf":
            x[rng.random((g, vocab)) < 0.5] = -np.inf
        if kind == "nan":
            x[rng.random((g, vocab)) < 0.95] = np.nan
        np.testing.assert_array_equal(_top_tokens(x, width),
                                      np.argsort(-x, axis=1, kind="stable")[:, :width])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_drafter_trees_rank_like_best_first_tree(dtype):
    """The drafter's greedy and sampled tree shapes (ranked on logits or probabilities, with
    logarithms of the kept tokens only) are best_first_tree's over the full log-probabilities,
    also when the budget outgrows a top-k support (ties)."""
    from fastspec.drafters.dflash import _logits_tree, _probs_tree
    rng = np.random.default_rng(7)
    for _ in range(10):
        g, vocab = int(rng.integers(1, 8)), int(rng.integers(2, 2000))
        budget = int(rng.integers(1, 70))
        logits = (3 * rng.standard_normal((g, vocab))).astype(dtype)
        z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        for got, want in zip(_logits_tree(logits, budget), best_first_tree(logp, budget)):
            np.testing.assert_array_equal(got, want)
        q = fs.kernels.probs(logits, 1.0, int(rng.integers(1, 40)))
        want = best_first_tree(np.log(np.maximum(q.astype(np.float64), 1e-300)), budget)
        for got, w in zip(_probs_tree(q, budget), want):
            np.testing.assert_array_equal(got, w)


def test_best_first_tree_is_the_budget_best_prefixes():
    rng = np.random.default_rng(0)
    for _ in range(20):
        g, vocab, budget = 3, 4, int(rng.integers(1, 30))
        logp = np.log(rng.dirichlet(np.ones(vocab), size=g))
        tokens, parents = best_first_tree(logp, budget)
        depths = check_parents(parents)
        scores = []
        for i in range(tokens.shape[0]):
            node, score = i, 0.0
            while node >= 0:
                score += logp[depths[node] - 1, tokens[node]]
                node = parents[node]
            scores.append(score)
        every = sorted((sum(logp[j, x[j]] for j in range(d)) for d in range(1, g + 1)
                        for x in itertools.product(range(vocab), repeat=d)), reverse=True)
        assert tokens.shape[0] == min(budget, len(every))
        np.testing.assert_allclose(sorted(scores, reverse=True), every[:len(scores)])
        # siblings by falling probability
        for par in set(parents.tolist()):
            kids = np.flatnonzero(parents == par)
            lp = logp[depths[kids[0]] - 1, tokens[kids]]
            assert (np.diff(lp) <= 0).all()


@pytest.mark.parametrize("budget", [1, 6, 24])
def test_dflash_tree_greedy_equals_vanilla(backend, budget):
    target = small_llama()
    expected = fs.generate(target, PROMPT, 40).tokens
    model = DFlashModel.random(DFlashConfig(block_size=8), target, seed=8)
    for gamma in (1, 4, 7):
        drafter = fs.DFlashDrafter(model, tree_budget=budget)
        res = fs.speculative_generate(target, drafter, PROMPT, 40, gamma=gamma, trace=True)
        assert res.tokens == expected, (gamma, budget)
        assert res.stats.target_calls == res.stats.rounds + 1
        if budget > 1 and gamma > 1:
            assert any(r["tree_nodes"] for r in res.stats.trace)


def test_dflash_tree_proposal_shape():
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target, seed=8)
    drafter = fs.DFlashDrafter(model, tree_budget=10)
    seq = np.array(PROMPT)
    out = target.forward(seq[:-1], hidden_layers=drafter.hidden_layers)
    drafter.reset(seq, out.hidden)
    prop = drafter.propose(seq, 5, fs.SamplingParams(), np.random.default_rng(0))
    assert isinstance(prop, TreeProposal) and len(prop) == 10 and prop.depth <= 5
    # the argmax chain's first token is the tree's first node
    drafter2 = fs.DFlashDrafter(model)
    drafter2.reset(seq, out.hidden)
    chain = drafter2.propose(seq, 5, fs.SamplingParams(), None)
    assert prop.tokens[0] == chain.tokens[0] and prop.parents[0] == -1


def test_dflash_tree_sampling_is_seeded_and_runs(backend):
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target, seed=8)
    runs = [fs.speculative_generate(target, fs.DFlashDrafter(model, tree_budget=12), PROMPT, 30,
                                    gamma=5, temperature=1.0, seed=4).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 30


def test_dflash_tree_bad_input():
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target, seed=8)
    for bad in (0, -3, MAX_TREE_NODES + 1):
        with pytest.raises(ValueError, match="tree_budget must be in"):
            fs.DFlashDrafter(model, tree_budget=bad)
    with pytest.raises(TypeError, match="tree_budget must be an integer"):
        fs.DFlashDrafter(model, tree_budget=2.5)
    with pytest.raises(ValueError, match="denoise_steps=1"):
        fs.DFlashDrafter(model, tree_budget=4, denoise_steps=2)
    with pytest.raises(ValueError, match="denoise_steps=1, got denoise_steps=3"):
        fs.DFlashDrafter(model, tree_budget=4, denoise_steps=3, sample_block=False)


def test_dflash_sampled_tree_proposal():
    """sample_block=True at temperature > 0: the best-first shape, siblings drawn without
    replacement, each node's q the law it was drawn from; at temperature 0 the argmax tree."""
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target, seed=8)
    seq = np.array(PROMPT)
    out = target.forward(seq[:-1], hidden_layers=model.config.tap_layers)
    sampled = fs.DFlashDrafter(model, tree_budget=12, sample_block=True)
    sampled.reset(seq, out.hidden)
    prop = sampled.propose(seq, 5, fs.SamplingParams(1.0, 0, 1.0),
                           np.random.default_rng(0))
    assert isinstance(prop, TreeProposal) and len(prop) == 12 and prop.q.shape == (12, 40)
    np.testing.assert_allclose(prop.q.sum(axis=1), 1.0)
    for par in set(prop.parents.tolist()):
        kids = np.flatnonzero(prop.parents == par)
        assert len(set(prop.tokens[kids].tolist())) == kids.size  # no repeated sibling
        for k, c in enumerate(kids):  # earlier siblings removed from a sibling's law
            assert (prop.q[c, prop.tokens[kids[:k]]] == 0).all() and prop.q[c, prop.tokens[c]] > 0
    argmax = fs.DFlashDrafter(model, tree_budget=12)
    argmax.reset(seq, out.hidden)
    greedy = fs.SamplingParams()
    a = argmax.propose(seq, 5, greedy, None)
    sampled.reset(seq, out.hidden)
    b = sampled.propose(seq, 5, greedy, None)
    assert b.q is None and b.tokens.tolist() == a.tokens.tolist()


@pytest.mark.parametrize("budget", [1, 12])
def test_dflash_sampled_tree_in_the_loop(backend, budget):
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=8), target, seed=8)
    expected = fs.generate(target, PROMPT, 30).tokens
    make = lambda: fs.DFlashDrafter(model, tree_budget=budget, sample_block=True)  # noqa: E731
    assert fs.speculative_generate(target, make(), PROMPT, 30, gamma=5).tokens == expected
    runs = [fs.speculative_generate(target, make(), PROMPT, 30, gamma=5, temperature=1.0,
                                    top_k=5, seed=4, trace=True) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 30


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_rounds_keep_caches_equal_to_recompute(backend, temperature):
    """After every tree round, the target's cache (compacted path) and the DFlash context
    (committed hidden rows) equal a recompute of the committed sequence."""
    target = small_llama()
    model = DFlashModel.random(DFlashConfig(block_size=6), target, seed=1)
    drafter = fs.DFlashDrafter(model, tree_budget=12)
    cache = target.new_cache()
    errors = []

    def after_round(seq, n):
        L = n - 1
        committed = np.array(seq[:L])
        ref = target.new_cache()
        out = target.step(committed, ref, hidden_layers=model.config.tap_layers)
        fresh = model.new_cache()
        model.append_context(fresh, model.context_features(out.hidden))
        assert cache.length == L and drafter.cache.length == L
        errors.append(max(np.abs(ref.k[:, :, :L] - cache.k[:, :, :L]).max(),
                          np.abs(ref.v[:, :, :L] - cache.v[:, :, :L]).max(),
                          np.abs(fresh.k[:, :, :L] - drafter.cache.k[:, :, :L]).max(),
                          np.abs(fresh.v[:, :, :L] - drafter.cache.v[:, :, :L]).max()))

    res = fs.speculative_generate(target, drafter, PROMPT, 30, gamma=5, temperature=temperature,
                                  seed=4, callback=after_round, cache=cache, trace=True)
    assert len(errors) >= 5 and max(errors) <= 1e-10
    assert sum(r["tree_nodes"] is not None for r in res.stats.trace) >= 3


class _BaseQTree(fs.DFlashDrafter):
    """NEGATIVE CONTROL: siblings drawn without replacement, reported with the un-removed q of
    their depth (the independent-siblings rule)."""

    def _sampled_tree(self, logits, sampling, rng):
        prop = super()._sampled_tree(logits, sampling, rng)
        q = fs.kernels.probs(np.ascontiguousarray(logits), sampling.temperature,
                             sampling.top_k, sampling.top_p).astype(np.float64)
        prop.q = np.ascontiguousarray(q[check_parents(prop.parents) - 1])
        return prop


@pytest.mark.parametrize("broken", [False, True])
def test_dflash_sampled_tree_has_the_target_law(broken):
    """The real loop on a toy target (vocabulary 8): the law of the first two tokens."""
    from fastspec.audit import chi_square_test, exact_continuation_probs
    from fastspec.decoding import plan_speculative, run_plan

    target = fs.Transformer.random(fs.ModelConfig.toy(n_layers=2, dtype="float64"), 69)
    model = DFlashModel.random(DFlashConfig(block_size=4, mask_token_id=7), target, seed=2)
    prompt = [1, 2, 3, 1, 2, 4]
    exact = exact_continuation_probs(target, prompt, 2, fs.SamplingParams(1.0, 0, 1.0))
    drafter = (_BaseQTree if broken else fs.DFlashDrafter)(model, tree_budget=6,
                                                           sample_block=True)
    plan = plan_speculative(target, drafter, np.array(prompt), 3, 2, 1.0, 0, 1.0, 0, None, None)
    counts = np.zeros(64)
    for i in range(2000):
        x = run_plan(plan, np.random.default_rng(20_000 + i)).tokens
        counts[x[0] * 8 + x[1]] += 1
    test = chi_square_test(counts, exact)
    if broken:
        assert test["p_value"] < 1e-4
    else:
        assert test["p_value"] > 1e-3 and test["impossible_count"] == 0
