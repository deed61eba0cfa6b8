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
independently, or siblings drawn *without replacement*
(:func:`fastspec.drafters.tree_sampling.sample_tree_without_replacement`:
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

import numpy as np

from fastspec.kernels import inverse_cdf
from fastspec.kernels.checks import check_uniforms
from fastspec.kernels.tree_shape import check_parents

__all__ = ["verify_tree_greedy", "verify_tree_rejection"]


def _children(parents: np.ndarray) -> list[list[int]]:
    """``kids[r]``: the nodes under block row ``r`` (row 0 the root), in order."""
    kids: list[list[int]] = [[] for _ in range(parents.shape[0] + 1)]
    for i, par in enumerate(parents.tolist()):
        kids[par + 1].append(i)
    return kids


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
            return np.array(path, dtype=np.int64), inverse_cdf(residual, float(uniforms[size]))
        path.append(accepted)
        row = accepted + 1
