"""The exact-law oracle: the law a lossless decoder must reproduce, on the NumPy reference.

:class:`ExactOracle` gives a target's next-token distribution after any prefix: the NumPy
twin's ``probs`` of the logits of a full, uncached forward of that prefix, run on the NumPy
backend whatever backend is active, so the law does not depend on the compiled code under
audit. Every exact law here comes from it: the target's own sampling law
(:func:`exact_target_law`, :func:`exact_continuation_probs`) and the law of speculative
decoding with a drafter, enumerated over every proposal and verification outcome
(:func:`exact_speculative_law`).
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from fastspec import kernels
from fastspec.drafters.base import SamplingParams
from fastspec.model import Transformer

__all__ = ["Law", "ExactOracle", "exact_target_law", "exact_continuation_probs",
           "exact_speculative_law"]

#: A law over continuations: ``{tokens: probability}``.
Law = dict[tuple[int, ...], float]


@contextmanager
def _numpy_backend() -> Iterator[None]:
    """Run the block on the NumPy backend. The switch is process-wide: the audit is serial."""
    previous = kernels.backend()
    kernels.set_backend("numpy")
    try:
        yield
    finally:
        kernels.set_backend(previous)


class ExactOracle:
    """Memoised exact next-token distributions (and hidden states) of ``target``.

    Parameters
    ----------
    target : Transformer
    sampling : SamplingParams
        Temperature, top-k and top-p of the law.
    hidden_layers : iterable of int, default ()
        Target layers whose hidden states :meth:`hidden_before_last` returns (a DFlash
        drafter's taps).
    """

    def __init__(self, target: Transformer, sampling: SamplingParams, hidden_layers=()) -> None:
        self.target, self.sampling, self.layers = target, sampling, tuple(hidden_layers)
        self._p: dict[tuple[int, ...], np.ndarray] = {}
        self._h: dict[tuple[int, ...], dict] = {}
        #: Number of target forwards run so far.
        self.calls = 0

    def p_next(self, seq: tuple[int, ...]) -> np.ndarray:
        """Return the float64 distribution of shape (vocab_size,) of the token after ``seq``."""
        if seq not in self._p:
            self.calls += 1
            s = self.sampling
            with _numpy_backend():
                out = self.target.forward(np.array(seq, dtype=np.int64), hidden_layers=self.layers)
            logits = np.ascontiguousarray(out.logits[-1:], dtype=np.float64)
            self._p[seq] = kernels.module("numpy").probs(logits, s.temperature, s.top_k, s.top_p)[0]
            self._h[seq] = out.hidden
        return self._p[seq]

    def hidden_before_last(self, seq: tuple[int, ...]) -> dict:
        """Hidden states of ``seq[:-1]`` (the context a DFlash drafter sees)."""
        if len(seq) == 1:
            return {t: np.zeros((0, self.target.config.dim)) for t in self.layers}
        self.p_next(seq[:-1])
        return self._h[seq[:-1]]

    def law(self, prompt, n_new: int) -> Law:
        """Return ``{continuation: probability}`` of ``n_new`` tokens sampled after ``prompt``."""
        prompt = tuple(int(t) for t in prompt)
        law: Law = {}

        def walk(seq, prob, r):
            if r == 0:
                key = seq[len(prompt):]
                law[key] = law.get(key, 0.0) + prob
                return
            p = self.p_next(seq)
            for y in np.flatnonzero(p > 0):
                walk(seq + (int(y),), prob * p[y], r - 1)

        walk(prompt, 1.0, n_new)
        return law


def exact_target_law(target: Transformer, prompt, n_new: int, sampling: SamplingParams,
                     oracle: ExactOracle | None = None) -> Law:
    """Return ``{continuation: probability}`` of the target's own sampling over ``n_new`` tokens."""
    return (oracle or ExactOracle(target, sampling)).law(prompt, n_new)


def exact_continuation_probs(model: Transformer, prefix, new_tokens: int,
                             sampling: SamplingParams) -> np.ndarray:
    """Exact probability of each of the ``V ** new_tokens`` continuations of ``prefix``.

    The law of :class:`ExactOracle` as an array: the index of ``(x1, ..., xk)`` is
    ``x1 * V**(k-1) + ... + xk``; impossible continuations have probability 0.
    """
    vocab = model.config.vocab_size
    out = np.zeros(vocab ** new_tokens)
    for tokens, prob in exact_target_law(model, prefix, new_tokens, sampling).items():
        index = 0
        for x in tokens:
            index = index * vocab + x
        out[index] = prob
    return out


def _independent_law(drafter, seq, g, sampling, rng):
    """Every (probability, tokens, q) of a proposal whose positions are drawn independently."""
    prop = drafter.propose(np.asarray(seq), g, sampling, rng)
    if prop.q is None:
        return [(1.0, prop.tokens, None)]
    q = prop.q
    out = []
    for toks in itertools.product(*[np.flatnonzero(q[j] > 0) for j in range(len(prop))]):
        prob = float(np.prod([q[j, x] for j, x in enumerate(toks)]))
        out.append((prob, np.array(toks, dtype=np.int64), q))
    return out


def _verification_law(seq, tokens, q, oracle: ExactOracle):
    """Every (probability, emitted tokens) of one verification of ``tokens`` after ``seq``."""
    out = []
    alive = 1.0
    for i, x in enumerate(int(t) for t in tokens):
        p = oracle.p_next(seq + tuple(int(t) for t in tokens[:i]))
        qx = 1.0 if q is None else float(q[i, x])
        accept = min(1.0, p[x] / qx)
        if accept < 1.0:
            if q is None:
                res = p.copy()
                res[x] = 0.0
            else:
                res = np.maximum(p - q[i].astype(np.float64), 0.0)
            res /= res.sum()
            head = tuple(int(t) for t in tokens[:i])
            for y in np.flatnonzero(res > 0):
                out.append((alive * (1.0 - accept) * res[y], head + (int(y),)))
        alive *= accept
        if alive == 0.0:
            return out
    p = oracle.p_next(seq + tuple(int(t) for t in tokens))
    for y in np.flatnonzero(p > 0):
        out.append((alive * p[y], tuple(int(t) for t in tokens) + (int(y),)))
    return out


def exact_speculative_law(target: Transformer, drafter, prompt, n_new: int, gamma: int,
                          sampling: SamplingParams, proposal_law: Callable | None = None,
                          oracle: ExactOracle | None = None) -> Law:
    """Return the exact law of ``n_new`` tokens of speculative decoding with ``drafter``.

    At every committed state the drafter is ``reset`` to it (context = target hidden states of
    ``seq[:-1]``) and its proposals are enumerated with their probabilities: a deterministic
    proposal has probability 1; a proposal with ``q`` is enumerated over the product of its
    rows (independent positions), unless ``proposal_law(seq, g, sampling)`` describes it.
    Each round proposes ``min(gamma, remaining)`` tokens; emissions past ``n_new`` are cut.
    """
    oracle = oracle or ExactOracle(target, sampling, drafter.hidden_layers)
    rng = np.random.default_rng(0)  # only used to obtain q from sampled drafters
    memo: dict[tuple[tuple[int, ...], int], Law] = {}

    def sublaw(seq, r):
        """Law of the next ``r`` tokens from committed state ``seq`` (memoised)."""
        if r == 0:
            return {(): 1.0}
        if (seq, r) in memo:
            return memo[seq, r]
        drafter.reset(np.array(seq), oracle.hidden_before_last(seq))
        g = min(gamma, r)
        props = (proposal_law(seq, g, sampling) if proposal_law is not None
                 else _independent_law(drafter, seq, g, sampling, rng))
        branches: dict[tuple[int, ...], float] = {}
        for p_prop, tokens, q in props:
            for p_ver, emitted in _verification_law(seq, tokens, q, oracle):
                emitted = emitted[:r]
                branches[emitted] = branches.get(emitted, 0.0) + p_prop * p_ver
        law: Law = {}
        for emitted, prob in branches.items():
            for rest, p_rest in sublaw(seq + emitted, r - len(emitted)).items():
                law[emitted + rest] = law.get(emitted + rest, 0.0) + prob * p_rest
        memo[seq, r] = law
        return law

    return sublaw(tuple(int(t) for t in prompt), n_new)
