"""The core checks of ``fastspec audit``: the forward pass, the decoding loop, the laws.

What is audited (toy configs in float64 unless said otherwise):

- cache/block equivalence and causal invariance of the forward pass;
- greedy equality: speculative == vanilla greedy, seeds 69-71, gamma 1/4/8, every drafter;
- identity draft: draft == target, every round fully accepted and a bonus emitted;
- rollback: after every round the caches equal a fresh recompute of the committed prefix;
- stopping rules: ``max_new_tokens`` and ``eos_token_id``;
- exact distribution (:mod:`fastspec.audit.distribution`): vocabulary 8, 3 new tokens, all
  512 continuations; many seeded speculative runs must pass a chi-square test against the
  exact target law, for every drafter, at temperature 1 and with top-k / top-p, and the
  negative controls must fail it.
"""
from __future__ import annotations

import math

import numpy as np

from fastspec.audit.distribution import (DIST_GAMMA, DIST_NEW_TOKENS, DIST_PREFIX, DIST_SEED,
                                         DIST_SETTINGS, MemoModel, WrongQDrafter,
                                         broken_verify_rejection, dist_drafters,
                                         distribution_audit)
from fastspec.audit.registry import (ALPHA, DRAFTERS, GAMMAS, NEW_TOKENS, PREFIX, SEEDS,
                                     AuditContext, register_check)
from fastspec.decoding import generate, speculative_generate
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.model import ModelConfig, Transformer

__all__ = ["check_cache_block_equivalence", "check_causal_invariance",
           "check_vanilla_cache_equality", "check_greedy_equality", "check_identity_draft",
           "check_rollback", "check_stopping_rules", "check_exact_distribution",
           "check_negative_controls"]


# --- checks: forward pass ------------------------------------------------------------------

#: Chunk sizes of the cache/block equivalence check (29 positions, as in seed 002).
CHUNKS = (3, 1, 7, 2, 16)


def chunked_forward(model, ids: np.ndarray, chunks=CHUNKS):
    """Run ``ids`` once whole and once in ``chunks`` on fresh caches.

    Returns
    -------
    full_logits, full_cache, chunked_logits, chunked_cache
    """
    full_cache = model.new_cache()
    full = model.forward(ids, full_cache).logits
    cache, parts, start = model.new_cache(), [], 0
    for size in chunks:
        parts.append(model.forward(ids[start:start + size], cache).logits)
        start += size
    return full, full_cache, np.concatenate(parts), cache


@register_check("cache_block_equivalence", group="model")
def check_cache_block_equivalence(ctx: AuditContext) -> dict:
    """Chunked cached forward == one full forward (logits and cache), toy float64."""
    model = ctx.model(69, 2)
    ids = np.array((PREFIX * 4)[:29], dtype=np.int64)
    full, full_cache, chunked, cache = chunked_forward(model, ids)
    logit_err = float(np.max(np.abs(full - chunked)))
    cache_err = max(float(np.max(np.abs(full_cache.k[..., :29, :] - cache.k[..., :29, :]))),
                    float(np.max(np.abs(full_cache.v[..., :29, :] - cache.v[..., :29, :]))))
    cfg = model.config
    cached_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * 29 * cfg.head_dim * 8
    return dict(passed=logit_err <= 1e-10 and cache_err <= 1e-10 and cache.length == 29,
                max_logit_error=logit_err, max_cache_error=cache_err, chunks=list(CHUNKS),
                cached_length=cache.length, cached_bytes=cached_bytes, tolerance=1e-10)


@register_check("causal_invariance", group="model")
def check_causal_invariance(ctx: AuditContext) -> dict:
    """Changing the last token leaves every earlier position's logits unchanged."""
    model = ctx.model(69, 2)
    ids = np.array((PREFIX * 4)[:29], dtype=np.int64)
    base = model.forward(ids).logits
    worst = 0.0
    for delta in range(1, model.config.vocab_size):
        altered = ids.copy()
        altered[-1] = (altered[-1] + delta) % model.config.vocab_size
        worst = max(worst, float(np.max(np.abs(base[:-1] - model.forward(altered).logits[:-1]))))
    return dict(passed=worst <= 1e-12, max_earlier_logit_change=worst, tolerance=1e-12)


# --- checks: decoding ------------------------------------------------------------------------

@register_check("vanilla_cache_equality", group="decoding")
def check_vanilla_cache_equality(ctx: AuditContext) -> dict:
    """Cached vanilla decoding == full-prefix recompute (greedy and sampled)."""
    rows = []
    for seed in SEEDS:
        model = ctx.model(seed, 2)
        for temperature in (0.0, 1.0):
            a = generate(model, PREFIX, NEW_TOKENS, temperature=temperature, seed=seed).tokens
            b = generate(model, PREFIX, NEW_TOKENS, temperature=temperature, seed=seed,
                         use_cache=False).tokens
            rows.append(dict(seed=seed, temperature=temperature, equal=a == b))
    return dict(passed=all(r["equal"] for r in rows), cases=rows)


@register_check("greedy_equality", group="decoding")
def check_greedy_equality(ctx: AuditContext) -> dict:
    """Greedy speculative == greedy vanilla, seeds 69-71 x gamma 1/4/8 x every drafter."""
    rows = []
    for seed in SEEDS:
        target, draft = ctx.model(seed, 2), ctx.model(seed, 1)
        expected = generate(target, PREFIX, NEW_TOKENS, use_cache=False).tokens
        for name, factory in DRAFTERS.items():
            for gamma in GAMMAS:
                res = speculative_generate(target, factory(target, draft), PREFIX, NEW_TOKENS,
                                           gamma=gamma, seed=seed)
                s = res.stats
                rows.append(dict(seed=seed, drafter=name, gamma=gamma,
                                 equal=res.tokens == expected, rounds=s.rounds,
                                 drafted=s.drafted, accepted=s.accepted,
                                 tau=round(s.mean_accepted_length, 4),
                                 target_calls=s.target_calls, target_positions=s.target_positions))
    return dict(passed=all(r["equal"] for r in rows), prefix=PREFIX, new_tokens=NEW_TOKENS,
                cases=rows)


@register_check("identity_draft", group="decoding")
def check_identity_draft(ctx: AuditContext) -> dict:
    """Draft == target: every round fully accepted and its bonus token emitted."""
    rows = []
    for seed in SEEDS:
        target = ctx.model(seed, 2)
        for temperature in (0.0, 1.0):
            res = speculative_generate(target, DraftModelDrafter(target), PREFIX, NEW_TOKENS,
                                       gamma=4, temperature=temperature, seed=seed, trace=True)
            rounds = res.stats.trace
            full = all(r["accepted"] == r["proposed"] for r in rounds)
            bonus = all(r["bonus"] for r in rounds if r["proposed"])
            rows.append(dict(seed=seed, temperature=temperature, rounds=len(rounds),
                             all_accepted=full, bonus_every_round=bonus,
                             tau=round(res.stats.mean_accepted_length, 4)))
    return dict(passed=all(r["all_accepted"] and r["bonus_every_round"] for r in rows),
                cases=rows)


def _fresh_cache_error(model: Transformer, seq: np.ndarray, cache) -> float:
    """Max abs difference between ``cache`` and a fresh recompute of ``seq``."""
    length = seq.shape[0]
    if cache.length != length:
        return math.inf
    if length == 0:
        return 0.0
    fresh = model.new_cache()
    model.forward(seq, fresh)
    return max(float(np.max(np.abs(fresh.k[:, :, :length] - cache.k[:, :, :length]))),
               float(np.max(np.abs(fresh.v[:, :, :length] - cache.v[:, :, :length]))))


@register_check("rollback", group="decoding")
def check_rollback(ctx: AuditContext) -> dict:
    """After every round the caches equal a fresh recompute of the committed prefix."""
    rows = []
    for seed in SEEDS[:2] if ctx.quick else SEEDS:
        target, draft = ctx.model(seed, 2), ctx.model(seed, 1)
        for name, factory in DRAFTERS.items():
            for temperature in (0.0, 1.0):
                drafter = factory(target, draft)
                cache = target.new_cache()
                worst = {"target": 0.0, "draft": 0.0}
                lags = set()

                def after_round(seq, n, drafter=drafter, cache=cache, worst=worst, lags=lags):
                    worst["target"] = max(worst["target"],
                                          _fresh_cache_error(target, seq[:n - 1], cache))
                    dcache = getattr(drafter, "cache", None)
                    if isinstance(drafter, DraftModelDrafter) and dcache is not None:
                        lags.add(n - 1 - dcache.length)
                        worst["draft"] = max(worst["draft"], _fresh_cache_error(
                            drafter.model, seq[:dcache.length], dcache))

                res = speculative_generate(target, drafter, PREFIX, NEW_TOKENS, gamma=4,
                                           temperature=temperature, seed=seed, cache=cache,
                                           callback=after_round)
                rows.append(dict(seed=seed, drafter=name, temperature=temperature,
                                 rounds=res.stats.rounds, max_target_error=worst["target"],
                                 max_draft_error=worst["draft"],
                                 draft_lags=sorted(int(x) for x in lags)))
    ok = all(r["max_target_error"] <= 1e-10 and r["max_draft_error"] <= 1e-10
             and set(r["draft_lags"]) <= {0, 1} for r in rows)
    return dict(passed=ok, tolerance=1e-10, cases=rows)


@register_check("stopping_rules", group="decoding")
def check_stopping_rules(ctx: AuditContext) -> dict:
    """max_new_tokens is exact and nothing follows eos_token_id, for every drafter."""
    rows = []
    target, draft = ctx.model(71, 2), ctx.model(71, 1)
    expected = generate(target, PREFIX, NEW_TOKENS).tokens
    eos = expected[len(expected) // 2]
    cut = expected[:expected.index(eos) + 1]
    for name, factory in DRAFTERS.items():
        for gamma in (1, 3, 8):
            for count in (1, 2, 5, 17):
                res = speculative_generate(target, factory(target, draft), PREFIX, count,
                                           gamma=gamma)
                rows.append(dict(drafter=name, gamma=gamma, max_new_tokens=count,
                                 ok=res.tokens == expected[:count]))
            res = speculative_generate(target, factory(target, draft), PREFIX, NEW_TOKENS,
                                       gamma=gamma, eos_token_id=eos)
            rows.append(dict(drafter=name, gamma=gamma, eos_token_id=eos, ok=res.tokens == cut))
    return dict(passed=all(r["ok"] for r in rows), cases=rows)


# --- checks: exact distribution ------------------------------------------------------------

@register_check("exact_distribution", group="distribution")
def check_exact_distribution(ctx: AuditContext) -> dict:
    """Speculative sampling reproduces the exact target law (chi-square, TV), every drafter."""
    rows = []
    samples = ctx.samples
    for name, drafter in dist_drafters().items():
        for label, sampling in DIST_SETTINGS.items():
            r = distribution_audit(drafter, sampling, samples)
            rows.append(dict(drafter=name, setting=label, **r))
    return dict(passed=all(r["passed"] for r in rows), alpha=ALPHA, prefix=DIST_PREFIX,
                new_tokens=DIST_NEW_TOKENS, vocab=8, continuations=8 ** DIST_NEW_TOKENS,
                gamma=DIST_GAMMA, logits="full-prefix recompute, memoised per prefix",
                cases=rows)


@register_check("negative_controls", group="distribution")
def check_negative_controls(ctx: AuditContext) -> dict:
    """Broken verifier (residual p) and wrong-q drafter must FAIL the distribution test."""
    samples = ctx.samples
    draft = MemoModel(Transformer.random(ModelConfig.toy(n_layers=1, dtype="float64"),
                                         DIST_SEED))
    sampling = DIST_SETTINGS["temperature_1"]
    rows = []
    r = distribution_audit(DraftModelDrafter(draft), sampling, samples,
                           verifier=broken_verify_rejection)
    rows.append(dict(control="verifier_residual_p", detected=not r["passed"], **r))
    r = distribution_audit(WrongQDrafter(draft), sampling, samples)
    rows.append(dict(control="argmax_drafter_reports_softmax_q", detected=not r["passed"], **r))
    return dict(passed=all(r["detected"] for r in rows), alpha=ALPHA, cases=rows)
