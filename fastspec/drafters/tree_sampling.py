"""Filling a tree shape with tokens drawn without replacement among siblings.

:func:`sample_tree_without_replacement` draws each node from its depth's law with its earlier
siblings' tokens removed and renormalised, and reports that row as the node's ``q``: the law
:func:`fastspec.decoding.tree.verify_tree_rejection` needs to stay lossless (see that module's
notes for the proof).
"""
from __future__ import annotations

import numpy as np

from fastspec.kernels.checks import check_uniforms
from fastspec.kernels.tree_shape import check_parents

__all__ = ["sample_tree_without_replacement"]


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
