"""Tree verification keeps the target law: exact recursion over the tree, then Monte Carlo of
the real verifier against it; the un-normalised residual (negative control) is caught by both."""
import numpy as np
import pytest

from fastspec import audit
from fastspec.audit import chi_square_test
from fastspec.audit.tree import tree_law_tv, tree_round_law
from fastspec.drafters.tree_sampling import sample_tree_without_replacement
from fastspec.kernels.tree_shape import tree_depths
from fastspec.decoding.tree import verify_tree_rejection

V = 4


def _dist(seed, prefix, vocab=V, peak=2.0):
    rng = np.random.default_rng([seed, len(prefix), *prefix])
    p = rng.dirichlet(np.full(vocab, 0.7)) ** peak
    return p / p.sum()


def target(prefix):
    return _dist(1, prefix)


def draft(prefix, k):
    return _dist(2 + k, prefix)


PREFIX = (3, 1)
# root with three children (second has a child with two children), a leaf chain
TREES = [
    ([0, 1, 2, 1, 3, 0], [-1, -1, -1, 1, 1, 3]),
    ([2, 0, 0, 1], [-1, 0, 1, 2]),             # a chain
    ([1, 1, 3], [-1, -1, -1]),                 # duplicate sibling tokens
    ([], []),                                  # empty tree: one target step
]


@pytest.mark.parametrize("tokens,parents", TREES)
def test_deterministic_tree_keeps_target_law(tokens, parents):
    assert tree_law_tv(target, PREFIX, tokens, parents) < 1e-12


def test_sampled_siblings_keep_target_law():
    parents = [-1, -1, 0, 0, 1]
    assert tree_law_tv(target, PREFIX, None, parents, q_of=draft) < 1e-12


def test_unnormalised_residual_is_caught_exactly():
    tokens, parents = TREES[0]
    assert tree_law_tv(target, PREFIX, tokens, parents, normalise=False) > 1e-3
    assert tree_law_tv(target, PREFIX, None, [-1, -1, 0], q_of=draft, normalise=False) > 1e-3


def _block_p(tokens, parents):
    rows = [target(PREFIX)]
    for i in range(len(tokens)):
        path, node = [], i
        while node >= 0:
            path.append(tokens[node])
            node = parents[node]
        rows.append(target(PREFIX + tuple(path[::-1])))
    return np.array(rows)


def _monte_carlo(tokens, parents, draws, normalise):
    tok, par = np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64)
    p = _block_p(tokens, parents)
    rng = np.random.default_rng(0)
    counts = {}
    for _ in range(draws):
        path, nxt = verify_tree_rejection(tok, par, p, None, rng.random(len(tokens) + 1),
                                          normalise=normalise)
        key = tuple(tok[path].tolist()) + (nxt,)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _chi_square_p(counts, law):
    keys = sorted(law)
    assert set(counts) <= set(keys)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    result = chi_square_test(observed, np.array([law[k] for k in keys]))
    assert result["impossible_count"] == 0
    return result["p_value"]


@pytest.mark.parametrize("normalise", [True, False])
def test_verifier_matches_exact_law_monte_carlo(normalise):
    tokens, parents = TREES[0]
    law = tree_round_law(target, PREFIX, tokens, parents)
    pvalue = _chi_square_p(_monte_carlo(tokens, parents, 6000, normalise), law)
    if normalise:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


def test_sampled_siblings_monte_carlo():
    """Sampled nodes verified with their q reproduce the oracle's law (drafts drawn here)."""
    parents = [-1, -1, 0]
    law = tree_round_law(target, PREFIX, None, parents, q_of=draft)
    rng = np.random.default_rng(1)
    par = np.array(parents, dtype=np.int64)
    counts = {}
    for _ in range(6000):
        tok = np.empty(3, dtype=np.int64)
        q = np.empty((3, V))
        for i, (parent, k) in enumerate([(-1, 0), (-1, 1), (0, 0)]):
            pre = PREFIX if parent < 0 else PREFIX + (int(tok[parent]),)
            q[i] = draft(pre, k)
            tok[i] = rng.choice(V, p=q[i])
        p = np.array([target(PREFIX), target(PREFIX + (int(tok[0]),)),
                      target(PREFIX + (int(tok[1]),)),
                      target(PREFIX + (int(tok[0]), int(tok[2])))])
        path, nxt = verify_tree_rejection(tok, par, p, q, rng.random(4))
        key = tuple(tok[path].tolist()) + (nxt,)
        counts[key] = counts.get(key, 0) + 1
    assert _chi_square_p(counts, law) > 1e-3


def test_registered_tree_audit_passes():
    report = audit.run_audit(quick=True, names=["tree_exact_law"])
    result = report["checks"]["tree_exact_law"]
    assert result["passed"] is True and report["passed"]
    assert max(result["tv"]) < 1e-12 and min(result["negative_control_tv"]) > 1e-3


# --- siblings drawn without replacement -----------------------------------------------------

WOR = dict(q_of=draft, siblings="without_replacement")


@pytest.mark.parametrize("parents", [[-1, -1, -1], [-1, -1, 0, 0], [-1, 0, 0, -1]])
def test_without_replacement_siblings_keep_target_law(parents):
    assert tree_law_tv(target, PREFIX, None, parents, **WOR) < 1e-12


@pytest.mark.parametrize("parents", [[-1, -1, -1], [-1, -1, 0, 0]])
def test_without_replacement_negative_controls_are_caught(parents):
    # the independent rule (un-removed q) on without-replacement draws, the un-normalised residual
    assert tree_law_tv(target, PREFIX, None, parents, report_base_q=True, **WOR) > 1e-3
    assert tree_law_tv(target, PREFIX, None, parents, normalise=False, **WOR) > 1e-3


def test_without_replacement_draws_distinct_siblings():
    par = np.array([-1, -1, -1, 0, 0], dtype=np.int64)
    depth_q = np.array([draft(PREFIX, 0), draft(PREFIX, 0)])
    rng = np.random.default_rng(3)
    for _ in range(200):
        tok, q, kept = sample_tree_without_replacement(par, depth_q, rng.random(5))
        np.testing.assert_array_equal(kept, par)
        assert len(set(tok[:3].tolist())) == 3 and tok[3] != tok[4]
        np.testing.assert_allclose(q.sum(axis=1), 1.0)
        assert q[1, tok[0]] == 0 and q[2, tok[0]] == 0 and q[2, tok[1]] == 0
        assert (q[np.arange(5), tok] > 0).all()


def test_without_replacement_drops_nodes_once_support_is_used_up():
    # support of two tokens: the third sibling and its subtree are dropped, the rest re-indexed
    depth_q = np.array([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    par = np.array([-1, -1, -1, 2, 0], dtype=np.int64)
    tok, q, kept = sample_tree_without_replacement(par, depth_q, np.full(5, 0.1))
    assert tok.tolist() == [0, 1, 0] and kept.tolist() == [-1, -1, 0]
    np.testing.assert_allclose(q[1], [0.0, 1.0, 0.0, 0.0])


def _wor_reference(parents, depth_q, uniforms):
    """sample_tree_without_replacement written plainly: each sibling's law is a copy of its
    depth's row with the earlier siblings' tokens zeroed, drawn by inverse CDF."""
    depths = tree_depths(parents)
    new_index = np.full(len(parents), -1)
    tokens, q, kept, left = [], [], [], {}
    for i, par in enumerate(parents.tolist()):
        if par >= 0 and new_index[par] < 0:
            continue
        law = left.get(par + 1, np.maximum(depth_q[depths[i] - 1].astype(np.float64), 0.0))
        total = law.sum()
        if not total > 0:
            continue
        cumulative = np.cumsum(law)
        hits = np.flatnonzero(cumulative > uniforms[i] * cumulative[-1])
        x = int(hits[0]) if hits.size else int(np.flatnonzero(law > 0)[-1])
        tokens.append(x)
        q.append(law / total)
        kept.append(-1 if par < 0 else new_index[par])
        new_index[i] = len(tokens) - 1
        left[par + 1] = law.copy()
        left[par + 1][x] = 0.0
    return np.array(tokens, dtype=np.int64), np.array(q).reshape(-1, depth_q.shape[1]), kept


@pytest.mark.parametrize("vocab", [1, 2, 7, 300])
def test_without_replacement_matches_the_plain_sampler(vocab):
    """The fast sampler (one pass per sibling) against the plain one: same tokens, same q rows
    within rounding, over sparse and dense laws, uniforms at 0 and near 1, and siblings that
    use up the support."""
    rng = np.random.default_rng(vocab)
    for trial in range(60):
        n = int(rng.integers(1, 12))
        par = np.array([-1] + [int(rng.integers(-1, i)) for i in range(n - 1)], dtype=np.int64)
        depth_q = rng.random((n, vocab)) * (rng.random((n, vocab)) < rng.uniform(0.2, 1.0))
        depth_q[:, int(rng.integers(vocab))] += 0.01  # every row has some mass
        if trial % 3 == 0:
            depth_q = depth_q.astype(np.float32) - 0.001  # float32 rows, negative entries
        elif trial % 3 == 1:
            depth_q = depth_q.astype(np.float32)
        u = rng.random(n)
        u[rng.random(n) < 0.2] = 0.0
        u[rng.random(n) < 0.2] = np.nextafter(1.0, 0.0)
        tok, q, kept = sample_tree_without_replacement(par, depth_q, u)
        want_tok, want_q, want_kept = _wor_reference(par, depth_q, u)
        np.testing.assert_array_equal(tok, want_tok)
        np.testing.assert_array_equal(kept, want_kept)
        np.testing.assert_allclose(q, want_q, rtol=1e-12, atol=1e-15)


def _wor_monte_carlo(parents, draws, report_base_q):
    """The real sampler + verifier; base q the same at every node (one DFlash-like row/depth)."""
    par = np.array(parents, dtype=np.int64)
    n = len(parents)
    rng = np.random.default_rng(5)
    counts = {}
    for _ in range(draws):
        depth_q = np.array([draft(PREFIX, 0)] * 2)
        tok, q, kept = sample_tree_without_replacement(par, depth_q, rng.random(n))
        rows = [target(PREFIX)]
        for i in range(tok.shape[0]):
            path, node = [], i
            while node >= 0:
                path.append(int(tok[node]))
                node = int(kept[node])
            rows.append(target(PREFIX + tuple(path[::-1])))
        told = np.array([draft(PREFIX, 0)] * tok.shape[0]) if report_base_q else q
        path, nxt = verify_tree_rejection(tok, kept, np.array(rows), told,
                                          rng.random(tok.shape[0] + 1))
        key = tuple(tok[path].tolist()) + (nxt,)
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("report_base_q", [False, True])
def test_without_replacement_monte_carlo(report_base_q):
    """Children's q of one depth do not depend on the path here (DFlash's case)."""
    parents = [-1, -1, -1]
    depth_q_of = lambda prefix, k: draft(PREFIX, 0)  # noqa: E731
    law = tree_round_law(target, PREFIX, None, parents, q_of=depth_q_of,
                         siblings="without_replacement")
    pvalue = _chi_square_p(_wor_monte_carlo(parents, 6000, report_base_q), law)
    if report_base_q:
        assert pvalue < 1e-6
    else:
        assert pvalue > 1e-3


def test_verifier_refuses_a_node_its_q_cannot_draw():
    tok, par = np.array([1, 2], dtype=np.int64), np.array([-1, -1], dtype=np.int64)
    q = np.full((2, V), 0.25)
    q[1, 2] = 0.0
    p = np.full((3, V), 0.25)
    with pytest.raises(ValueError, match=r"q\[1, tokens\[1\]\]"):
        verify_tree_rejection(tok, par, p, q, np.zeros(3))


def test_sample_tree_bad_input():
    par = np.array([-1, 0], dtype=np.int64)
    with pytest.raises(ValueError, match="depth_q"):
        sample_tree_without_replacement(par, np.full((1, V), 0.25), np.zeros(2))
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        sample_tree_without_replacement(np.array([-1, 1]), np.full((2, V), 0.25), np.zeros(2))
    with pytest.raises(ValueError, match="uniforms"):
        sample_tree_without_replacement(par, np.full((2, V), 0.25), np.zeros(3))


def test_oracle_bad_arguments():
    with pytest.raises(ValueError, match="siblings must be one of"):
        tree_round_law(target, PREFIX, None, [-1], q_of=draft, siblings="with_replacement")
    with pytest.raises(ValueError, match="report_base_q needs"):
        tree_round_law(target, PREFIX, None, [-1], q_of=draft, report_base_q=True)


def test_registered_without_replacement_audit_passes():
    name = "tree_exact_law_without_replacement"
    report = audit.run_audit(quick=True, names=[name])
    result = report["checks"][name]
    assert result["passed"] is True and report["passed"]
    assert max(result["tv"]) < 1e-12 and min(result["negative_control_tv"]) > 1e-3
