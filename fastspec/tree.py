"""Tree proposals and their lossless verification (greedy and recursive rejection sampling).

A drafter may propose a tree instead of a chain: ``tokens[i]`` with parent ``parents[i]``,
where ``-1`` is the root (the last committed token) and every parent comes before its child
(topological order). The target scores all nodes in one forward (each node sees the committed
context and its own ancestors; :meth:`fastspec.Transformer.step` with ``tree_parents``), and
verification walks down from the root:

- greedy: follow the child whose token is the target's argmax, as long as one exists;
- sampling: at each node, test its children in order, child ``x`` with probability
  ``min(1, p_res(x) / q(x))`` (``q`` one-hot for deterministic siblings, so ``p_res(x)``),
  where ``p_res`` starts as the target's ``p`` at the node and, after each rejected sibling,
  becomes ``normalise(max(p_res - q_sibling, 0))`` (one-hot: ``p_res`` with that token
  zeroed). If every child is rejected the next token is drawn from the final ``p_res``;
  after an accepted leaf the bonus is drawn from the leaf's ``p``.

This keeps the target law exactly whenever ``q[i]`` is the law node ``i`` was drawn from
given its path and its earlier siblings: deterministic siblings (one-hot), siblings drawn
independently, or siblings drawn *without replacement* (:func:`sample_tree_without_replacement`:
sibling ``k`` from ``q`` with siblings ``1 .. k-1`` removed and renormalised, which is the row
it reports). Proof, by induction on the number ``m`` of siblings still to test at a node whose
residual is ``t``: with none left the draw is from ``t``. Otherwise the next sibling ``x`` is
drawn from ``r`` (any law fixed by the draws so far), accepted with ``min(1, t(x) / r(x))``,
and on rejection the rest runs on ``t' = normalise(max(t - r, 0))``, which does not depend on
``x``; by induction it yields ``t'`` whatever the later siblings' laws (so they may depend on
``x``, as without replacement they do), hence ``P(y) = min(t(y), r(y)) + (1 - sum min(t, r))
t'(y) = t(y)``. A rejected ``x`` has ``t(x) < r(x)``, so ``t'(x) = 0``: a token is never
emitted twice at one node and a without-replacement sibling needs no special case. The
accepted child's subtree was drawn given its path only, so the argument repeats one level
down. Whether a further sibling is drawn may depend on the draws so far (a stopping rule);
it must not depend on the sibling's own value. The audit ``tree_exact_law_without_replacement``
enumerates this law; reporting the un-removed ``q`` for every sibling is caught.

A chain is the tree with ``parents[i] = i - 1``. Block layout used by the loop: row 0 of the
target's logits is the root, row ``i + 1`` is node ``i``.

Like the kernels, the verifiers take their randomness as input: ``uniforms`` of shape
``(N + 1,)``, ``uniforms[i]`` for the test of node ``i`` (each node is tested at most once) and
``uniforms[N]`` for the final draw. The verification arithmetic is NumPy here (a node is
tested at most once, so a round costs O(N V)); the attention and cache kernels it relies on
(:func:`fastspec.kernels.tree_attention`, :func:`fastspec.kernels.compact_kv`) have both
backends.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastspec._checks import check_uniforms
from fastspec._reference import _inverse_cdf
from fastspec.drafters.base import Proposal

__all__ = ["MAX_TREE_NODES", "TreeProposal", "check_parents", "tree_depths", "ancestor_mask",
           "block_parents", "verify_tree_greedy", "verify_tree_rejection", "chain_parents",
           "sample_tree_without_replacement"]

#: Largest tree (nodes, root excluded) the loop and the tree attention accept.
MAX_TREE_NODES = 256


def chain_parents(n: int) -> np.ndarray:
    """Return the parents ``[-1, 0, 1, ..., n - 2]`` of a chain of ``n`` nodes."""
    return np.arange(-1, n - 1, dtype=np.int64)


def check_parents(parents, n: int | None = None, max_nodes: int = MAX_TREE_NODES,
                  room: int | None = None, name: str = "parents") -> np.ndarray:
    """Validate a parent array; return the depth of every node (children of the root: 1).

    Parameters
    ----------
    parents : ndarray of shape (N,), integer
        ``parents[i]`` in ``[-1, i)``: -1 for a child of the root, else an earlier node.
    n : int, optional
        Required length (the number of tokens).
    max_nodes : int
        Largest accepted ``N``.
    room : int, optional
        Largest accepted depth (the positions left in the cache / the generation).

    Returns
    -------
    depths : ndarray of shape (N,), int64

    Raises
    ------
    ValueError
        Naming the first offending node, before any work is done.
    """
    if not isinstance(parents, np.ndarray) or parents.ndim != 1 or parents.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer ndarray, got {type(parents).__name__} "
                         f"{getattr(parents, 'shape', '')}")
    size = parents.shape[0]
    if n is not None and size != n:
        raise ValueError(f"{name} must have one entry per token ({n}), got {size}")
    if size > max_nodes:
        raise ValueError(f"tree has {size} nodes, more than the maximum {max_nodes}")
    par = parents.astype(np.int64, copy=False)
    bad = np.flatnonzero((par < -1) | (par >= np.arange(size)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {int(par[i])} must be in [-1, {i}): a parent comes "
                         "before its child (topological order) and inside the tree")
    depths = tree_depths(par)
    if room is not None and size and int(depths.max()) > room:
        raise ValueError(f"tree depth {int(depths.max())} exceeds the room left ({room} "
                         "positions)")
    return depths


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """Return the depth of each node of a valid parent array (children of the root: 1)."""
    depths = np.empty(parents.shape[0], dtype=np.int64)
    for i, par in enumerate(parents.tolist()):
        depths[i] = 1 if par < 0 else depths[par] + 1
    return depths


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """Return ``mask`` (N, N) bool: ``mask[i, j]`` when node ``j`` is ``i`` or an ancestor."""
    size = parents.shape[0]
    mask = np.zeros((size, size), dtype=bool)
    for i, par in enumerate(parents.tolist()):
        if par >= 0:
            mask[i] = mask[par]
        mask[i, i] = True
    return mask


def block_parents(parents: np.ndarray) -> np.ndarray:
    """Parents of the target block ``[root, *nodes]`` (N + 1,): the root's is -1, node
    ``i`` (row ``i + 1``) hangs under row ``parents[i] + 1``."""
    out = np.empty(parents.shape[0] + 1, dtype=np.int64)
    out[0] = -1
    out[1:] = parents
    out[1:] += 1
    return out


def _children(parents: np.ndarray) -> list[list[int]]:
    """``kids[r]``: the nodes under block row ``r`` (row 0 the root), in order."""
    kids: list[list[int]] = [[] for _ in range(parents.shape[0] + 1)]
    for i, par in enumerate(parents.tolist()):
        kids[par + 1].append(i)
    return kids


@dataclass
class TreeProposal(Proposal):
    """A drafter's tree: ``tokens[i]`` under ``parents[i]`` (-1: the root), topological order.

    Attributes
    ----------
    tokens : ndarray of shape (N,), int64
    q : ndarray of shape (N, V) or None
        The distribution node ``i`` was drawn from given its path and its earlier siblings
        (independently, or without replacement: see the module notes), or None for
        deterministic nodes (one-hot rule).
    parents : ndarray of shape (N,), int64
    """

    parents: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, np.ndarray) or self.tokens.ndim != 1:
            raise ValueError("tokens must be a 1-D ndarray")
        self.depths = check_parents(self.parents, self.tokens.shape[0])

    @property
    def depth(self) -> int:
        """Length of the longest root-to-node path (0 for an empty tree)."""
        return int(self.depths.max()) if self.depths.size else 0

    def is_chain(self) -> bool:
        """True when ``parents`` is ``[-1, 0, 1, ...]``."""
        return bool(np.array_equal(self.parents, chain_parents(self.tokens.shape[0])))


def _check_tree_args(tokens, parents, rows, name):
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError("tokens must be a 1-D integer ndarray")
    size = tokens.shape[0]
    check_parents(parents, size)
    if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[0] != size + 1:
        raise ValueError(f"{name} must have shape ({size + 1}, V), got "
                         f"{getattr(rows, 'shape', type(rows).__name__)}")
    if size and (tokens.min() < 0 or tokens.max() >= rows.shape[1]):
        raise ValueError(f"tokens must be in [0, {rows.shape[1]})")
    return size


def verify_tree_greedy(tokens: np.ndarray, parents: np.ndarray,
                       target_logits: np.ndarray) -> tuple[np.ndarray, int]:
    """Accept the longest root-to-node path whose tokens are the target's argmax.

    Parameters
    ----------
    tokens, parents : ndarray of shape (N,), integer
    target_logits : ndarray of shape (N + 1, V)
        Row 0 scores the position after the root, row ``i + 1`` the position after node ``i``.

    Returns
    -------
    path : ndarray of shape (n_accepted,), int64
        Accepted node indices, root side first.
    next_token : int
        The target's argmax after the last accepted node (correction or bonus).
    """
    _check_tree_args(tokens, parents, target_logits, "target_logits")
    kids = _children(parents)
    best = np.argmax(target_logits, axis=1)
    path: list[int] = []
    row = 0
    while True:
        want = int(best[row])
        nxt = next((c for c in kids[row] if int(tokens[c]) == want), None)
        if nxt is None:
            return np.array(path, dtype=np.int64), want
        path.append(nxt)
        row = nxt + 1


def verify_tree_rejection(tokens: np.ndarray, parents: np.ndarray, p: np.ndarray,
                          q: np.ndarray | None, uniforms: np.ndarray,
                          normalise: bool = True) -> tuple[np.ndarray, int]:
    """Recursive rejection sampling down a tree; keeps the target distribution exactly.

    Parameters
    ----------
    tokens, parents : ndarray of shape (N,), integer
    p : ndarray of shape (N + 1, V)
        Target probabilities; row 0 after the root, row ``i + 1`` after node ``i``.
    q : ndarray of shape (N, V) or None
        Distribution node ``i`` was drawn from, given its path and its earlier siblings;
        ``q[i, tokens[i]] > 0``. None: deterministic nodes (one-hot rule).
    uniforms : ndarray of shape (N + 1,), float64 in [0, 1)
        ``uniforms[i]`` tests node ``i``; ``uniforms[N]`` draws the final token.
    normalise : bool, default True
        False reuses the un-normalised residual: a wrong rule, kept only as the audit's
        negative control.

    Returns
    -------
    path : ndarray of shape (n_accepted,), int64
    next_token : int
        Drawn from the residual after all children of the last accepted node were rejected,
        else the bonus from that leaf's ``p``.
    """
    size = _check_tree_args(tokens, parents, p, "p")
    if q is not None and (not isinstance(q, np.ndarray) or q.shape != (size, p.shape[1])):
        raise ValueError(f"q must have shape {(size, p.shape[1])}, got "
                         f"{getattr(q, 'shape', type(q).__name__)}")
    if q is not None and size:
        drawn = q[np.arange(size), tokens]
        bad = np.flatnonzero(~(drawn > 0))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"q[{i}, tokens[{i}]] = {float(drawn[i])!r}: node {i} cannot have "
                             f"been drawn from q[{i}] (it must be > 0)")
    check_uniforms(uniforms, size + 1)
    kids = _children(parents)
    path: list[int] = []
    row = 0
    while True:
        residual = p[row].astype(np.float64)
        accepted = None
        for c in kids[row]:
            x = int(tokens[c])
            qx = 1.0 if q is None else float(q[c, x])
            if uniforms[c] * qx < residual[x]:
                accepted = c
                break
            if q is None:
                residual = residual.copy()
                residual[x] = 0.0
            else:
                residual = np.maximum(residual - q[c].astype(np.float64), 0.0)
            total = residual.sum()
            if not total > 0:  # only through rounding: the rejection had probability ~0
                residual = p[row].astype(np.float64)
            elif normalise:
                residual = residual / total
        if accepted is None:
            return np.array(path, dtype=np.int64), _inverse_cdf(residual, float(uniforms[size]))
        path.append(accepted)
        row = accepted + 1


class _DepthLaw:
    """One depth's law ``max(depth_q[d - 1], 0)`` with its running sum and support, prepared
    once, so that each sibling's draw without replacement costs one pass, the write of its row:
    the earlier siblings' tokens are a short list subtracted from the running sum, not a copy
    of the law with them zeroed. :meth:`of_depths` prepares every depth in one allocation per
    array: at a large vocabulary fresh pages cost more than the arithmetic."""

    def __init__(self, weights: np.ndarray, cumulative: np.ndarray, support: int):
        self.weights, self.cumulative, self.support = weights, cumulative, support

    @classmethod
    def of_depths(cls, depth_q: np.ndarray, depth: int) -> list[_DepthLaw]:
        """The laws of depths ``1 .. depth`` (rows ``0 .. depth - 1`` of ``depth_q``)."""
        weights = np.maximum(depth_q[:depth], 0.0, dtype=np.float64)
        cumulative = np.cumsum(weights, axis=1)
        support = np.count_nonzero(weights, axis=1)
        return [cls(weights[d], cumulative[d], int(support[d])) for d in range(depth)]

    def draw(self, removed: list[int], u: float, q_out: np.ndarray) -> int:
        """Draw with ``uniforms`` value ``u`` from the law without the ``removed`` tokens (each
        in its support, no repeats); write that law, renormalised, to ``q_out`` (V,) and return
        the token, or -1 (``q_out`` untouched) when no mass is left."""
        w = self.weights
        if len(removed) >= self.support:
            return -1
        gone = sorted(removed)
        # mass removed up to and including each removed token, in token order
        steps = np.cumsum(w[gone]) if gone else np.zeros(0)
        total = float(self.cumulative[-1] - (steps[-1] if gone else 0.0))
        if not total > 0:  # rounding ate a tiny remainder: sum it exactly
            rest = w.copy()
            rest[gone] = 0.0
            total = float(rest.sum())
            if not total > 0:
                return -1
        np.divide(w, total, out=q_out)
        q_out[gone] = 0.0
        # inverse CDF of the remaining law: between removed tokens j and j + 1 its running sum
        # is cumulative - steps[j], so search each segment for the first sum past u * total
        target = u * total
        lo = 0
        for j in range(len(gone) + 1):
            hi = gone[j] if j < len(gone) else w.shape[0]
            shift = steps[j - 1] if j else 0.0
            x = lo + int(np.searchsorted(self.cumulative[lo:hi], target + shift, side="right"))
            if x < hi:
                break
            lo = hi + 1
        else:
            return int(np.flatnonzero(q_out > 0)[-1])  # u * total rounded past the last sum
        if q_out[x] > 0:
            return x
        # rounding across a removed token landed on a zero weight: its next drawable token
        later = np.flatnonzero(q_out[x:] > 0)
        return x + int(later[0]) if later.size else int(np.flatnonzero(q_out > 0)[-1])


def sample_tree_without_replacement(parents: np.ndarray, depth_q: np.ndarray,
                                    uniforms: np.ndarray
                                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fill a tree shape with tokens, each node's siblings drawn without replacement.

    Node ``i`` at depth ``d`` is drawn (inverse CDF with ``uniforms[i]``) from ``depth_q[d - 1]``
    with the tokens of its earlier siblings removed and renormalised; that row is its ``q``,
    as :func:`verify_tree_rejection` needs (see the module notes for why the law is kept).
    When a node's law has no mass left (all of ``depth_q``'s support already drawn) it is
    dropped with its subtree: a stopping rule on earlier draws only.

    Parameters
    ----------
    parents : ndarray of shape (N,), integer
        The shape (a valid parent array, e.g. from a best-first tree).
    depth_q : ndarray of shape (D, V)
        The law of the tokens at depth ``1 .. D`` (``D`` at least the tree's depth); rows
        sum to 1.
    uniforms : ndarray of shape (N,), float64 in [0, 1)

    Returns
    -------
    tokens : ndarray of shape (M,), int64
    q : ndarray of shape (M, V), float64
    parents : ndarray of shape (M,), int64
        The kept nodes (``M <= N``), in the input's order, re-indexed.
    """
    depths = check_parents(parents)
    size = parents.shape[0]
    if (not isinstance(depth_q, np.ndarray) or depth_q.ndim != 2
            or (size and depth_q.shape[0] < int(depths.max()))):
        raise ValueError("depth_q must have shape (D, V) with D >= the tree depth "
                         f"{int(depths.max()) if size else 0}, got "
                         f"{getattr(depth_q, 'shape', type(depth_q).__name__)}")
    check_uniforms(uniforms, size)
    vocab = depth_q.shape[1]
    new_index = np.full(size, -1, dtype=np.int64)
    tokens = np.empty(size, dtype=np.int64)
    q = np.empty((size, vocab), dtype=np.float64)
    out_parents = np.empty(size, dtype=np.int64)
    laws = _DepthLaw.of_depths(depth_q, int(depths.max()) if size else 0)
    drawn: dict[int, list[int]] = {}  # block row -> tokens its earlier children drew
    kept = 0
    for i, par in enumerate(parents.tolist()):
        if par >= 0 and new_index[par] < 0:
            continue  # the parent was dropped
        law = laws[depths[i] - 1]
        removed = drawn.setdefault(par + 1, [])
        x = law.draw(removed, float(uniforms[i]), q[kept])
        if x < 0:
            continue  # no mass left
        tokens[kept] = x
        out_parents[kept] = -1 if par < 0 else new_index[par]
        new_index[i] = kept
        kept += 1
        removed.append(x)
    # q[:kept] is a C-contiguous view: copying its rows again would double the work at a
    # large vocabulary
    return tokens[:kept].copy(), q[:kept], out_parents[:kept].copy()
