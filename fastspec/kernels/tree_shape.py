"""The shape of a tree of positions: parent arrays, their validation, depths, ancestor masks.

A tree of ``N`` nodes is a parent array ``parents`` of shape (N,): ``parents[i]`` is -1 for a
child of the root (the last committed token) or an earlier node (topological order). A chain
is ``[-1, 0, 1, ...]``. The target scores a tree in one forward with
:func:`fastspec.kernels.tree_attention` over :func:`ancestor_mask`; drafters build trees
(:mod:`fastspec.drafters`) and the loop verifies them (:mod:`fastspec.decoding.tree`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["MAX_TREE_NODES", "chain_parents", "check_parents", "tree_depths", "ancestor_mask",
           "block_parents"]

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
