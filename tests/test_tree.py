"""Tree proposals: validation, depths, ancestor mask, block layout, greedy verification."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.drafters.base import Proposal
from fastspec.kernels.tree_shape import (MAX_TREE_NODES, ancestor_mask, block_parents,
                                         chain_parents, check_parents)
from fastspec.drafters.base import TreeProposal
from fastspec.decoding.tree import verify_tree_greedy, verify_tree_rejection

I = np.int64
PARENTS = np.array([-1, -1, 0, 0, 2, 1], dtype=I)


def test_depths_and_ancestors():
    assert check_parents(PARENTS).tolist() == [1, 1, 2, 2, 3, 2]
    mask = ancestor_mask(PARENTS)
    assert np.flatnonzero(mask[4]).tolist() == [0, 2, 4]
    assert np.flatnonzero(mask[5]).tolist() == [1, 5]
    assert mask.sum() == 1 + 1 + 2 + 2 + 3 + 2
    assert block_parents(PARENTS).tolist() == [-1, 0, 0, 1, 1, 3, 2]
    assert chain_parents(3).tolist() == [-1, 0, 1]


@pytest.mark.parametrize("parents,word", [
    ([-1, 1], r"parents\[1\] = 1"),          # points at itself
    ([-1, 2, 0], r"parents\[1\] = 2"),       # points forward
    ([-2], r"parents\[0\] = -2"),            # out of range
    ([-1, 0, 1, 2], "depth 4 exceeds the room left"),
])
def test_bad_parents(parents, word):
    with pytest.raises(ValueError, match=word):
        check_parents(np.array(parents, dtype=I), room=3)


def test_bad_tree_size_and_type():
    with pytest.raises(ValueError, match="more than the maximum"):
        check_parents(chain_parents(MAX_TREE_NODES + 1))
    with pytest.raises(ValueError, match="one entry per token"):
        TreeProposal(np.zeros(2, dtype=I), parents=np.array([-1], dtype=I))
    with pytest.raises(ValueError, match="integer ndarray"):
        check_parents([-1, 0])


def test_tree_proposal_is_a_proposal():
    t = TreeProposal(np.array([5, 6, 7], dtype=I), parents=np.array([-1, -1, 0], dtype=I))
    assert isinstance(t, Proposal) and len(t) == 3 and t.depth == 2 and not t.is_chain()
    assert TreeProposal(np.array([5, 6], dtype=I), parents=chain_parents(2)).is_chain()


def _onehot_logits(winners, vocab=8):
    logits = np.zeros((len(winners), vocab))
    logits[np.arange(len(winners)), winners] = 1.0
    return logits


def test_greedy_follows_the_argmax_path():
    tokens = np.array([3, 4, 1, 2, 6, 5], dtype=I)   # parents PARENTS
    # root argmax 4 -> node 1; node 1's argmax 5 -> node 5 (leaf) -> bonus from row 6
    logits = _onehot_logits([4, 0, 5, 0, 0, 0, 7])
    path, nxt = verify_tree_greedy(tokens, PARENTS, logits)
    assert path.tolist() == [1, 5] and nxt == 7
    # root argmax 3 -> node 0; its argmax 2 -> node 3 (first child 1 is not it); then leaf
    logits = _onehot_logits([3, 2, 0, 0, 6, 0, 0])
    path, nxt = verify_tree_greedy(tokens, PARENTS, logits)
    assert path.tolist() == [0, 3] and nxt == 6
    path, nxt = verify_tree_greedy(tokens, PARENTS, _onehot_logits([7, 0, 0, 0, 0, 0, 0]))
    assert path.tolist() == [] and nxt == 7


def test_chain_tree_agrees_with_chain_kernels(backend):
    rng = np.random.default_rng(5)
    for _ in range(50):
        g = int(rng.integers(0, 6))
        tokens = rng.integers(0, 4, g).astype(I)
        logits = rng.normal(size=(g + 1, 4))
        n_acc, nxt = fs.kernels.verify_greedy(tokens, logits)
        path, nxt_t = verify_tree_greedy(tokens, chain_parents(g), logits)
        assert (len(path), nxt_t) == (n_acc, nxt) and path.tolist() == list(range(n_acc))
        p = fs.kernels.probs(logits, 1.0)
        u = rng.random(g + 1)
        n_acc, nxt = fs.kernels.verify_rejection(tokens, p, None, u)
        path, nxt_t = verify_tree_rejection(tokens, chain_parents(g), p, None, u)
        assert (len(path), nxt_t) == (n_acc, nxt)


def test_verifier_bad_input():
    tokens = np.array([1, 2], dtype=I)
    with pytest.raises(ValueError, match="target_logits must have shape"):
        verify_tree_greedy(tokens, chain_parents(2), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 2\)"):
        verify_tree_greedy(tokens, chain_parents(2), np.zeros((3, 2)))
    p = np.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="uniforms must have shape"):
        verify_tree_rejection(tokens, chain_parents(2), p, None, np.zeros(2))
    with pytest.raises(ValueError, match="q must have shape"):
        verify_tree_rejection(tokens, chain_parents(2), p, np.zeros((3, 4)), np.zeros(3))
