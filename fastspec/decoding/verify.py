"""Verification of a drafted block: greedy match or lossless rejection sampling.

The arithmetic lives in the kernels (:func:`fastspec.kernels.verify_greedy`,
:func:`fastspec.kernels.verify_rejection`, :func:`fastspec.kernels.probs`); this module only
chooses between them and supplies the uniforms, so the decoding loop reads as one call.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from fastspec import kernels
from fastspec.drafters.base import SamplingParams
from fastspec.decoding.tree import verify_tree_greedy, verify_tree_rejection

__all__ = ["verify_block", "verify_tree"]


def verify_block(draft_tokens: np.ndarray, target_logits: np.ndarray, q: np.ndarray | None,
                 sampling: SamplingParams, rng: np.random.Generator,
                 uniforms: np.ndarray | None = None,
                 verify_rejection: Callable | None = None,
                 probs_out: np.ndarray | None = None) -> tuple[int, int]:
    """Verify ``g`` drafted tokens against the target's ``g + 1`` logits rows.

    Parameters
    ----------
    draft_tokens : ndarray of shape (g,), int64
    target_logits : ndarray of shape (g + 1, V)
        Row ``i`` scores the position of ``draft_tokens[i]``; row ``g`` the bonus position.
    q : ndarray of shape (g, V) or None
        The distribution the tokens were drawn from; None for deterministic proposals
        (one-hot rule). Ignored when greedy.
    sampling : SamplingParams
        ``temperature == 0``: greedy match (no randomness). Otherwise the target's
        ``p = probs(target_logits, temperature, top_k, top_p)`` and rejection sampling with
        ``g + 1`` uniforms drawn from ``rng``.
    rng : numpy.random.Generator
    uniforms : ndarray of shape (>= g + 1,), float64, optional
        Scratch to draw into (avoids an allocation per round).
    verify_rejection : callable, optional
        Replacement for :func:`fastspec.kernels.verify_rejection` (negative controls).
    probs_out : ndarray of shape (>= g + 1, V), optional
        Scratch for ``p`` (the dtype of ``target_logits``, C-contiguous), reused across rounds
        instead of a fresh ``(g + 1, V)`` array each time.

    Returns
    -------
    n_accepted : int
    next_token : int
        Correction after a rejection, else the bonus token.
    """
    g = draft_tokens.shape[0]
    if sampling.temperature == 0.0:
        n_acc, nxt = kernels.verify_greedy(draft_tokens, target_logits)
        return int(n_acc), int(nxt)
    p = kernels.probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p,
                      out=None if probs_out is None else probs_out[:g + 1])
    if uniforms is None:
        u = rng.random(g + 1)
    else:
        u = uniforms[:g + 1]
        rng.random(out=u)
    if q is not None and q.dtype != p.dtype:
        q = np.ascontiguousarray(q, dtype=p.dtype)
    verifier = kernels.verify_rejection if verify_rejection is None else verify_rejection
    n_acc, nxt = verifier(draft_tokens, p, q, u)
    return int(n_acc), int(nxt)


def verify_tree(tokens: np.ndarray, parents: np.ndarray, target_logits: np.ndarray,
                q: np.ndarray | None, sampling: SamplingParams, rng: np.random.Generator,
                verify: Callable | None = None) -> tuple[np.ndarray, int]:
    """Verify a drafted tree of ``N`` nodes against the target's ``N + 1`` logits rows.

    Parameters
    ----------
    tokens, parents : ndarray of shape (N,), int64
        See :mod:`fastspec.decoding.tree`.
    target_logits : ndarray of shape (N + 1, V)
        Row 0 after the root (the last committed token), row ``i + 1`` after node ``i``.
    q : ndarray of shape (N, V) or None
        As in :func:`verify_block`, per node.
    sampling : SamplingParams
        ``temperature == 0``: :func:`fastspec.decoding.tree.verify_tree_greedy`; otherwise
        :func:`fastspec.decoding.tree.verify_tree_rejection` on ``probs(target_logits)`` with ``N + 1``
        uniforms from ``rng``.
    rng : numpy.random.Generator
    verify : callable, optional
        Replacement for :func:`fastspec.decoding.tree.verify_tree_rejection` (negative controls).

    Returns
    -------
    path : ndarray of shape (n_accepted,), int64
        The accepted nodes, root side first.
    next_token : int
    """
    if sampling.temperature == 0.0:
        return verify_tree_greedy(tokens, parents, target_logits)
    p = kernels.probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)
    u = rng.random(tokens.shape[0] + 1)
    verifier = verify_tree_rejection if verify is None else verify
    path, nxt = verifier(tokens, parents, p, q, u)
    return path, int(nxt)
