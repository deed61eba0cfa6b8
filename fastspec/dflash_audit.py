"""Exact distribution audit of the DFlash drafter, with the toy's wrong-q negative control.

The audit enumerates, for a tiny vocabulary, every way the speculative process can unfold over
``n_new`` tokens — every proposal the drafter can make (with its probability) and every
verification outcome (accept with ``min(1, p/q)``, or one-hot ``p(x)``; residual
``normalise(max(p - q, 0))`` or ``p`` without ``x``; bonus from ``p``) — and compares the
resulting law of the continuation with the target's own law, computed exactly by enumerating
``p(x_1) p(x_2 | x_1) ...``. A lossless drafter matches to rounding (total variation ~1e-15);
the negative control, multi-step denoising with *sampled* fills reported with the final
forward's probabilities as ``q`` (the mistake of the seed toy), does not.

The enumeration calls the real drafter (``reset`` + ``propose``) at every committed state; the
incremental cache (``commit``) is checked against ``reset`` separately in the tests.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fastspec import kernels
from fastspec.dflash import DFlashConfig, DFlashModel
from fastspec.drafters.base import Proposal, SamplingParams
from fastspec.drafters.dflash import DFlashDrafter, denoise_schedule
from fastspec.model import ModelConfig, Transformer

__all__ = ["WrongQDenoiseDrafter", "exact_target_law", "exact_speculative_law",
           "total_variation", "run_distribution_audit", "AUDIT_PROMPT", "DFlashAuditResult"]

#: Prefix of the engine audits (DESIGN/issue 4).
AUDIT_PROMPT = (0, 1, 3, 2, 4, 1, 5, 6)
#: A lossless drafter's law must match the target's within this TV distance (float64).
EXACT_TOL = 1e-9

Law = dict[tuple[int, ...], float]


class WrongQDenoiseDrafter(DFlashDrafter):
    """NEGATIVE CONTROL ONLY: sampled multi-step denoising that reports a q it did not sample from.

    Each step samples the fills of the most confident masked positions from their current
    distributions; after the last step one more forward runs on the filled block and its
    per-position probabilities are reported as ``q`` — the seed toy's verifier. This is not
    lossless (see :class:`fastspec.DFlashDrafter`'s notes) and exists to show the audit catches it.
    """

    def __init__(self, model: DFlashModel, denoise_steps: int = 2) -> None:
        super().__init__(model, denoise_steps=denoise_steps)

    def propose(self, seq, gamma, sampling, rng):
        seq = np.asarray(seq)
        g = min(gamma, self.model.config.block_size - 1)
        if g == 0:
            return Proposal(np.zeros(0, dtype=np.int64), None)
        block = self.model.mask_block(int(seq[-1]))
        masked = np.ones(g, dtype=bool)
        for count in denoise_schedule(g, self.denoise_steps):
            p = self._step_probs(block, g, sampling)
            for j in self._pick(p, masked, count):
                block[1 + j] = kernels.sample(p[j], float(rng.random()))
                masked[j] = False
        q = self._step_probs(block, g, sampling)
        return Proposal(block[1:1 + g].copy(), q)

    def _step_probs(self, block, g, sampling):
        logits = np.ascontiguousarray(self._forward(block)[:g])
        return kernels.probs(logits, max(sampling.temperature, 1e-6), sampling.top_k, sampling.top_p)

    @staticmethod
    def _pick(p, masked, count):
        conf = p.max(axis=1).astype(np.float64)
        conf[~masked] = -1.0
        return np.argsort(-conf, kind="stable")[:count]

    def proposal_law(self, seq, g, sampling):
        """Every (probability, tokens, reported q) this drafter can return for ``seq``."""
        out = []
        start = self.model.mask_block(int(seq[-1]))

        def walk(block, masked, steps, prob):
            if not steps:
                q = self._step_probs(block, g, sampling)
                out.append((prob, block[1:1 + g].copy(), q))
                return
            p = self._step_probs(block, g, sampling)
            picks = self._pick(p, masked, steps[0])
            rest = masked.copy()
            rest[picks] = False
            supports = [np.flatnonzero(p[j] > 0) for j in picks]
            for fill in itertools.product(*supports):
                b = block.copy()
                b[1 + picks] = fill
                walk(b, rest, steps[1:], prob * float(np.prod([p[j, x] for j, x in zip(picks, fill)])))

        walk(start, np.ones(g, dtype=bool), denoise_schedule(g, self.denoise_steps), 1.0)
        return out


def _independent_law(drafter, seq, g, sampling, rng):
    prop = drafter.propose(np.asarray(seq), g, sampling, rng)
    if prop.q is None:
        return [(1.0, prop.tokens, None)]
    q = prop.q
    out = []
    for toks in itertools.product(*[np.flatnonzero(q[j] > 0) for j in range(len(prop))]):
        prob = float(np.prod([q[j, x] for j, x in enumerate(toks)]))
        out.append((prob, np.array(toks, dtype=np.int64), q))
    return out


class _TargetOracle:
    """Memoised exact next-token distributions and hidden states of a target."""

    def __init__(self, target: Transformer, sampling: SamplingParams, hidden_layers):
        self.target, self.sampling, self.layers = target, sampling, tuple(hidden_layers)
        self._p: dict[tuple[int, ...], np.ndarray] = {}
        self._h: dict[tuple[int, ...], dict] = {}
        self.calls = 0

    def p_next(self, seq: tuple[int, ...]) -> np.ndarray:
        if seq not in self._p:
            self.calls += 1
            out = self.target.forward(np.array(seq), hidden_layers=self.layers)
            s = self.sampling
            self._p[seq] = kernels.probs(np.ascontiguousarray(out.logits[-1:]), s.temperature,
                                         s.top_k, s.top_p)[0].astype(np.float64)
            self._h[seq] = out.hidden
        return self._p[seq]

    def hidden_before_last(self, seq: tuple[int, ...]) -> dict:
        """Hidden states of ``seq[:-1]`` (the context the drafter sees)."""
        if len(seq) == 1:
            return {t: np.zeros((0, self.target.config.dim)) for t in self.layers}
        self.p_next(seq[:-1])
        return self._h[seq[:-1]]


def exact_target_law(target: Transformer, prompt, n_new: int, sampling: SamplingParams,
                     oracle: _TargetOracle | None = None) -> Law:
    """Return ``{continuation: probability}`` of the target's own sampling over ``n_new`` tokens."""
    oracle = oracle or _TargetOracle(target, sampling, ())
    law: Law = {}

    def walk(seq, prob, r):
        if r == 0:
            law[seq[len(prompt):]] = law.get(seq[len(prompt):], 0.0) + prob
            return
        p = oracle.p_next(seq)
        for y in np.flatnonzero(p > 0):
            walk(seq + (int(y),), prob * p[y], r - 1)

    prompt = tuple(int(t) for t in prompt)
    walk(prompt, 1.0, n_new)
    return law


def _verification_law(seq, tokens, q, oracle):
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


def exact_speculative_law(target: Transformer, drafter: DFlashDrafter, prompt, n_new: int,
                          gamma: int, sampling: SamplingParams,
                          proposal_law: Callable | None = None,
                          oracle: _TargetOracle | None = None) -> Law:
    """Return the exact law of ``n_new`` tokens of speculative decoding with ``drafter``.

    At every committed state the drafter is ``reset`` to it (context = target hidden states of
    ``seq[:-1]``) and its proposals are enumerated with their probabilities: a deterministic
    proposal has probability 1; a proposal with ``q`` is enumerated over the product of its
    rows (independent positions), unless ``proposal_law(seq, g, sampling)`` describes it.
    Each round proposes ``min(gamma, remaining)`` tokens; emissions past ``n_new`` are cut.
    """
    oracle = oracle or _TargetOracle(target, sampling, drafter.hidden_layers)
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


def total_variation(a: Law, b: Law) -> float:
    """Return ``0.5 * sum |a - b|`` over the union of supports."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def chi_square_expected(truth: Law, other: Law, n_samples: int) -> float:
    """Expected Pearson statistic ``n * sum (o - t)^2 / t`` of ``n`` samples from ``other``."""
    return n_samples * sum((other.get(k, 0.0) - t) ** 2 / t for k, t in truth.items() if t > 0) + \
        (np.inf if any(v > 0 and truth.get(k, 0.0) == 0 for k, v in other.items()) else 0.0)


@dataclass
class DFlashAuditResult:
    """One check: ``passed`` is True when the outcome is the expected one."""

    name: str
    passed: bool
    figures: dict = field(default_factory=dict)


def toy_setup(block_size: int = 4, seed: int = 0, dtype: str = "float64"):
    """Return ``(target, dflash_model)``: the toy target (vocab 8, 2 layers) and a random drafter.

    The toy vocabulary has no MASK token; the drafter uses id 7 (``vocab_size - 1``).
    """
    target = Transformer.random(ModelConfig.toy(vocab_size=8, dtype=dtype), seed=seed)
    model = DFlashModel.random(DFlashConfig(block_size=block_size, mask_token_id=7), target,
                               seed=seed + 1)
    return target, model


def run_distribution_audit(n_new: int = 3, gamma: int = 3, block_size: int = 4,
                           seed: int = 0) -> list[DFlashAuditResult]:
    """Run the exact DFlash distribution audit and its negative control on the toy target.

    Checks (each ``passed`` when it turns out as it must):

    - ``dflash_exact_single_step`` (temperature 1, and with top-k 3 / top-p 0.9): argmax block
      verified one-hot, TV to the target law < 1e-9;
    - ``dflash_exact_multi_step``: 2-step confidence-ordered argmax denoising, one-hot, TV < 1e-9;
    - ``dflash_exact_sample_block``: independent per-position sampling with its own q, TV < 1e-9;
    - ``dflash_negative_control_wrong_q``: sampled 2-step denoising with the final forward's
      probabilities as q must be *detected*: TV > 1e-3 (expected chi-square at 100k samples
      is reported too).
    """
    target, model = toy_setup(block_size, seed)
    settings = [("t1", SamplingParams(1.0)), ("t1_topk3_topp0.9", SamplingParams(1.0, 3, 0.9))]
    results = []
    for tag, sp in settings:
        oracle = _TargetOracle(target, sp, model.config.tap_layers)
        truth = exact_target_law(target, AUDIT_PROMPT, n_new, sp, oracle)
        cases = [("single_step", DFlashDrafter(model), None),
                 ("multi_step", DFlashDrafter(model, denoise_steps=2), None),
                 ("sample_block", DFlashDrafter(model, sample_block=True), None)]
        for name, drafter, law_fn in cases:
            t0 = time.perf_counter()
            law = exact_speculative_law(target, drafter, AUDIT_PROMPT, n_new, gamma, sp, law_fn, oracle)
            tv = total_variation(truth, law)
            results.append(DFlashAuditResult(
                f"dflash_exact_{name}[{tag}]", tv < EXACT_TOL,
                {"tv": tv, "tol": EXACT_TOL, "mass": sum(law.values()), "support": len(law),
                 "n_new": n_new, "gamma": gamma, "block_size": block_size,
                 "seconds": round(time.perf_counter() - t0, 3)}))
    sp = SamplingParams(1.0)
    oracle = _TargetOracle(target, sp, model.config.tap_layers)
    truth = exact_target_law(target, AUDIT_PROMPT, n_new, sp, oracle)
    bad = WrongQDenoiseDrafter(model, denoise_steps=2)
    law = exact_speculative_law(target, bad, AUDIT_PROMPT, n_new, gamma, sp,
                                lambda s, g, spp: bad.proposal_law(s, g, spp), oracle)
    tv = total_variation(truth, law)
    chi = chi_square_expected(truth, law, 100_000)
    results.append(DFlashAuditResult(
        "dflash_negative_control_wrong_q[t1]", tv > 1e-3,
        {"tv": tv, "expected_chi_square_100k": chi, "cells": len(truth),
         "mass": sum(law.values()), "note": "passed means the wrong-q verifier was detected"}))
    return results
