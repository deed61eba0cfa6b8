"""The DFlash drafter's audits: exact distribution, block reference, context cache, greedy.

The exact audit (:func:`fastspec.audit.oracle.exact_speculative_law`) enumerates, for a tiny vocabulary, every way the speculative process can unfold over
``n_new`` tokens — every proposal the drafter can make (with its probability) and every
verification outcome (accept with ``min(1, p/q)``, or one-hot ``p(x)``; residual
``normalise(max(p - q, 0))`` or ``p`` without ``x``; bonus from ``p``) — and compares the
resulting law of the continuation with the target's own law, computed exactly by enumerating
``p(x_1) p(x_2 | x_1) ...``. A lossless drafter matches to rounding (total variation ~1e-15);
the negative control, multi-step denoising with *sampled* fills reported with the final
forward's probabilities as ``q`` (the mistake of the seed toy), does not.

The enumeration calls the real drafter (``reset`` + ``propose``) at every committed state; the
incremental cache (``commit``) is checked against ``reset`` separately.

Checks registered with ``fastspec audit`` (group ``dflash``): ``dflash_block_reference``,
``dflash_context_cache``, ``dflash_greedy_equality`` and ``dflash_exact_distribution`` (the
exact enumeration above plus the engine's seeded chi-square audit through the real loop, with
the wrong-q control expected to fail).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from fastspec import kernels
from fastspec.audit.distribution import DIST_SEED, DIST_SETTINGS, distribution_audit
from fastspec.audit.oracle import ExactOracle, exact_speculative_law, exact_target_law
from fastspec.audit.registry import NEW_TOKENS, PREFIX, SEEDS, register_check
from fastspec.audit.stats import chi_square_expected, total_variation
from fastspec.decoding import generate, speculative_generate
from fastspec.drafters.dflash_model import DFlashConfig, DFlashModel
from fastspec.drafters.base import Proposal
from fastspec.decoding.sampling import SamplingParams
from fastspec.drafters.dflash import DFlashDrafter, denoise_schedule
from fastspec.model import ModelConfig, Transformer

__all__ = ["WrongQDenoiseDrafter", "run_distribution_audit", "toy_setup", "AUDIT_PROMPT",
           "DFlashAuditResult", "check_block_reference", "check_context_cache",
           "check_greedy_equality", "check_exact_distribution"]

#: Prefix of the engine audits (DESIGN/issue 4).
AUDIT_PROMPT = (0, 1, 3, 2, 4, 1, 5, 6)
#: A lossless drafter's law must match the target's within this TV distance (float64).
EXACT_TOL = 1e-9


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
        oracle = ExactOracle(target, sp, model.config.tap_layers)
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
    oracle = ExactOracle(target, sp, model.config.tap_layers)
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


# --- checks registered with ``fastspec audit`` (group "dflash") ------------------------------

def _toy_target(seed: int) -> Transformer:
    return Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed)


def _toy_dflash(target: Transformer, block_size: int, seed: int = 1) -> DFlashModel:
    return DFlashModel.random(DFlashConfig(block_size=block_size, mask_token_id=7), target, seed)


def _llama_target(qk_norm: bool) -> Transformer:
    cfg = ModelConfig(vocab_size=40, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=48,
                      max_seq_len=96, dtype="float64", qk_norm=qk_norm)
    return Transformer.random(cfg, seed=3)


@register_check("dflash_block_reference", group="dflash")
def check_block_reference(ctx) -> dict:
    """DFlash block forward (context cache + kernels) == explicit full-attention reference."""
    rows = []
    cases = [("toy", _toy_target(69), 8), ("llama_gqa", _llama_target(False), 8),
             ("llama_qk_norm", _llama_target(True), 16)]
    for name, target, B in cases:
        model = DFlashModel.random(DFlashConfig(block_size=B, mask_token_id=7), target, seed=2)
        seq = np.random.default_rng(0).integers(0, 8, size=24)
        out = target.forward(seq, hidden_layers=model.config.tap_layers)
        worst = 0.0
        for P in (0, 1, 9, 23):
            cache = model.new_cache()
            hidden = {t: h[:P] for t, h in out.hidden.items()}
            model.append_context(cache, model.context_features(hidden))
            got = model.draft_block(cache, int(seq[P]))
            want = model.draft_block_reference(hidden, model.mask_block(int(seq[P])))
            worst = max(worst, float(np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))))
        rows.append(dict(case=name, block_size=B, max_rel_error=worst))
    return dict(passed=all(r["max_rel_error"] <= 1e-10 for r in rows), tolerance=1e-10,
                dtype="float64", cases=rows)


@register_check("dflash_context_cache", group="dflash")
def check_context_cache(ctx) -> dict:
    """After every round the drafter's context K/V equal a recompute from the committed prefix."""
    rows = []
    for seed in SEEDS[:2] if ctx.quick else SEEDS:
        target = _toy_target(seed)
        model = _toy_dflash(target, 8)
        for temperature in (0.0, 1.0):
            drafter = DFlashDrafter(model, denoise_steps=1)
            worst = [0.0]

            def after_round(seq, n, drafter=drafter, worst=worst):
                L = n - 1
                fresh = model.new_cache()
                out = target.forward(np.asarray(seq[:L]), hidden_layers=model.config.tap_layers)
                model.append_context(fresh, model.context_features(out.hidden))
                if drafter.cache.length != L:
                    worst[0] = math.inf
                    return
                worst[0] = max(worst[0],
                               float(np.max(np.abs(fresh.k[:, :, :L] - drafter.cache.k[:, :, :L]))),
                               float(np.max(np.abs(fresh.v[:, :, :L] - drafter.cache.v[:, :, :L]))))

            res = speculative_generate(target, drafter, PREFIX, NEW_TOKENS,
                                              gamma=4, temperature=temperature, seed=seed,
                                              callback=after_round)
            rows.append(dict(seed=seed, temperature=temperature, rounds=res.stats.rounds,
                             max_error=worst[0]))
    return dict(passed=all(r["max_error"] <= 1e-10 for r in rows), tolerance=1e-10, cases=rows)


@register_check("dflash_greedy_equality", group="dflash")
def check_greedy_equality(ctx) -> dict:
    """Greedy DFlash speculative == vanilla greedy: B 2/8/16, denoise_steps 1/3, seeds 69-71."""
    rows = []
    for seed in SEEDS:
        target = _toy_target(seed)
        expected = generate(target, PREFIX, NEW_TOKENS, use_cache=False).tokens
        for B in (2, 8, 16):
            model = _toy_dflash(target, B, seed + 1)
            for steps in (1, 3):
                if steps > B - 1:
                    continue
                for gamma in sorted({1, 4, B - 1}):
                    res = speculative_generate(target, DFlashDrafter(model, steps),
                                                      PREFIX, NEW_TOKENS,
                                                      gamma=gamma, seed=seed)
                    s = res.stats
                    rows.append(dict(seed=seed, block_size=B, denoise_steps=steps, gamma=gamma,
                                     equal=res.tokens == expected, rounds=s.rounds,
                                     drafted=s.drafted, accepted=s.accepted,
                                     draft_calls=s.draft_calls, target_calls=s.target_calls))
    return dict(passed=all(r["equal"] for r in rows), prefix=PREFIX,
                new_tokens=NEW_TOKENS, cases=rows)


@register_check("dflash_exact_distribution", group="dflash")
def check_exact_distribution(ctx) -> dict:
    """Exact law of DFlash speculative sampling == target law; the wrong-q control is caught.

    Two parts. (1) Exact enumeration (:func:`run_distribution_audit`): single-step, 2-step
    denoising and sample_block, at temperature 1 and with top-k/top-p, TV < 1e-9; the
    sampled multi-step drafter reporting the final forward's q must show TV > 1e-3.
    (2) The real decoding loop (the engine's seeded chi-square audit, 1/5 of its sample
    count): single-step, 2-step and sample_block DFlash pass, the wrong-q control fails.
    """
    exact = [dict(name=r.name, passed=bool(r.passed), **r.figures) for r in run_distribution_audit()]
    samples = max(2000, ctx.samples // 5)
    target = _toy_target(DIST_SEED)
    model = _toy_dflash(target, 5)
    sampling = DIST_SETTINGS["temperature_1"]
    mc = []
    for name, drafter, should_pass in (
            ("single_step", DFlashDrafter(model), True),
            ("multi_step_2", DFlashDrafter(model, denoise_steps=2), True),
            ("sample_block", DFlashDrafter(model, sample_block=True), True),
            ("negative_control_wrong_q", WrongQDenoiseDrafter(model, 2), False)):
        r = distribution_audit(drafter, sampling, samples)
        mc.append(dict(drafter=name, expected_to_pass=should_pass,
                       ok=r["passed"] == should_pass, **r))
    return dict(passed=all(e["passed"] for e in exact) and all(m["ok"] for m in mc),
                exact=exact, monte_carlo=mc)
