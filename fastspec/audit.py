"""Correctness audits of the model core and the decoding engine (``fastspec audit``).

Each audit is a *check*: a function that takes an :class:`AuditContext` and returns a dict of
figures with a boolean ``"passed"`` entry (an exception counts as a failure). Checks live in a
small registry so that other modules can add theirs::

    from fastspec.audit import register_check

    @register_check("dflash_greedy_equality", group="dflash")
    def _dflash_greedy(ctx):
        ...
        return {"passed": ok, "mismatches": 0}

:func:`run_audit` runs every registered check (importing the optional modules that register
more, such as the DFlash drafter's) and returns a JSON-serialisable report.

What is audited (toy configs in float64 unless said otherwise):

- cache/block equivalence and causal invariance of the forward pass;
- greedy equality: speculative == vanilla greedy, seeds 69-71, gamma 1/4/8, every drafter;
- identity draft: draft == target, every round fully accepted and a bonus emitted;
- rollback: after every round the caches equal a fresh recompute of the committed prefix;
- exact distribution: vocabulary 8, 3 new tokens, all 512 continuations enumerated; many
  seeded speculative runs must pass a chi-square test against the exact target law (and no
  impossible continuation may appear), for every drafter, at temperature 1 and with
  top-k / top-p; the negative controls (a verifier that resamples from p instead of the
  residual, a drafter reporting a q other than the one it drew from) must fail the same test.
"""
from __future__ import annotations

import importlib
import json
import math
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import fastspec
from fastspec import _reference, kernels
from fastspec.decoding import _plan, _run, generate, speculative_generate
from fastspec.drafters.base import Proposal
from fastspec.sampling import SamplingParams
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.drafters.ngram import NgramDrafter
from fastspec.model import ModelConfig, Transformer

__all__ = ["AuditContext", "Check", "CHECKS", "register_check", "run_audit", "format_report",
           "chi_square_test", "exact_continuation_probs", "PREFIX", "SEEDS", "GAMMAS",
           "toy_pair", "DRAFTERS", "register_drafter"]

#: The seed experiment's prompt, seeds and block sizes.
PREFIX = [0, 1, 3, 2, 4, 1, 5, 6]
SEEDS = (69, 70, 71)
GAMMAS = (1, 4, 8)
NEW_TOKENS = 48
#: Chi-square p-value below which a distribution audit fails (fixed seeds: deterministic).
ALPHA = 1e-3
#: Modules imported by :func:`run_audit` if present; they register their own checks.
OPTIONAL_CHECK_MODULES = ("fastspec.dflash_audit",)


# --- registry --------------------------------------------------------------------------------

@dataclass
class Check:
    """A registered audit: ``fn(ctx) -> dict`` with a boolean ``"passed"``."""

    name: str
    fn: Callable[["AuditContext"], dict]
    group: str = "core"
    description: str = ""


#: Registered checks, in run order.
CHECKS: list[Check] = []


def register_check(name: str, group: str = "core", description: str = ""):
    """Decorator that adds ``fn(ctx) -> dict`` to :data:`CHECKS` under ``name``.

    Registering an existing name replaces it (so re-importing a module is harmless).
    """
    def decorate(fn):
        check = Check(name, fn, group, description or (fn.__doc__ or "").strip().split("\n")[0])
        for i, existing in enumerate(CHECKS):
            if existing.name == name:
                CHECKS[i] = check
                break
        else:
            CHECKS.append(check)
        return fn
    return decorate


#: Drafters every decoding audit runs: name -> factory(target, draft_model) -> Drafter.
DRAFTERS: dict[str, Callable[[Transformer, Transformer], Any]] = {
    "draft_model": lambda target, draft: DraftModelDrafter(draft),
    "ngram": lambda target, draft: NgramDrafter(max_ngram=3),
}


def register_drafter(name: str, factory: Callable[[Transformer, Transformer], Any]) -> None:
    """Add a drafter to the greedy-equality, rollback and distribution audits.

    ``factory(target, draft_model)`` returns a fresh drafter for the given toy target (2
    layers) and toy draft model (1 layer) of the same seed, float64.
    """
    DRAFTERS[name] = factory


@dataclass
class AuditContext:
    """Settings shared by the checks.

    Attributes
    ----------
    quick : bool
        Fewer samples in the distribution audit (for tests and CI).
    samples : int
        Speculative runs per distribution audit.
    """

    quick: bool = False
    samples: int = 100_000
    figures: dict = field(default_factory=dict)

    def model(self, seed: int, n_layers: int, vocab_size: int = 8) -> Transformer:
        """Return the toy float64 model of ``seed`` with ``n_layers`` (cached)."""
        key = ("toy", seed, n_layers, vocab_size)
        cache = self.figures.setdefault("_models", {})
        if key not in cache:
            cfg = ModelConfig.toy(vocab_size=vocab_size, n_layers=n_layers, dtype="float64")
            cache[key] = Transformer.random(cfg, seed)
        return cache[key]


def toy_pair(seed: int) -> tuple[Transformer, Transformer]:
    """Return the toy float64 target (2 layers) and draft (1 layer) of ``seed``."""
    return (Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed),
            Transformer.random(ModelConfig.toy(n_layers=1, dtype="float64"), seed))


# --- statistics ------------------------------------------------------------------------------

def chi_square_sf(statistic: float, df: int) -> float:
    """Upper tail P(X >= statistic) of a chi-square with ``df`` degrees of freedom.

    Wilson-Hilferty cube-root normal approximation (accurate to about 1e-3 absolute for
    df >= 10, which is what the audit uses; exact for df == 1, 2 via closed forms).
    """
    if df <= 0:
        return 1.0
    if statistic <= 0:
        return 1.0
    if df == 1:
        return math.erfc(math.sqrt(statistic / 2.0))
    if df == 2:
        return math.exp(-statistic / 2.0)
    k = float(df)
    z = ((statistic / k) ** (1.0 / 3.0) - (1.0 - 2.0 / (9.0 * k))) / math.sqrt(2.0 / (9.0 * k))
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def chi_square_test(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> dict:
    """Pearson chi-square goodness of fit of ``counts`` to ``probs``.

    Cells whose expected count is below ``min_expected`` are pooled into one cell (kept only
    if the pool itself reaches ``min_expected``; otherwise merged into the smallest kept
    cell). Zero-probability cells are excluded and reported separately: any count there is an
    impossible outcome.

    Returns
    -------
    dict
        ``statistic, df, p_value, cells, pooled_cells, impossible_count, tv``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    total = counts.sum()
    possible = probs > 0
    impossible = int(counts[~possible].sum())
    expected = probs * total
    big = possible & (expected >= min_expected)
    small = possible & ~big
    obs = list(counts[big])
    exp = list(expected[big])
    pooled = int(small.sum())
    if pooled:
        o, e = counts[small].sum(), expected[small].sum()
        if e >= min_expected or not exp:
            obs.append(o)
            exp.append(e)
        else:
            j = int(np.argmin(exp))
            obs[j] += o
            exp[j] += e
    obs_a, exp_a = np.array(obs), np.array(exp)
    statistic = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    df = len(obs) - 1
    tv = float(0.5 * np.abs(counts / total - probs).sum()) if total else 0.0
    return dict(statistic=statistic, df=df, p_value=chi_square_sf(statistic, df),
                cells=len(obs), pooled_cells=pooled, impossible_count=impossible, tv=tv)


def exact_continuation_probs(model: Transformer, prefix, new_tokens: int,
                             sampling: SamplingParams) -> np.ndarray:
    """Exact probability of each of the ``V ** new_tokens`` continuations of ``prefix``.

    Every step's distribution is the NumPy oracle's ``probs`` of a full (uncached)
    recompute: the law a lossless decoder must reproduce. Index of ``(x1, ..., xk)`` is
    ``x1 * V**(k-1) + ... + xk``.
    """
    vocab = model.config.vocab_size
    law = np.ones(1)
    frontier = [list(prefix)]
    for _ in range(new_tokens):
        rows = []
        for seq in frontier:
            logits = model.forward(np.array(seq, dtype=np.int64)).logits[-1:]
            rows.append(_reference.probs(np.ascontiguousarray(logits, dtype=np.float64),
                                         sampling.temperature, sampling.top_k,
                                         sampling.top_p)[0])
        law = (law[:, None] * np.array(rows)).reshape(-1)
        frontier = [seq + [x] for seq in frontier for x in range(vocab)]
    return law


# --- a model with memoised logits, for the many short distribution runs ---------------------

class _MemoCache:
    """KV-cache stand-in for :class:`_MemoModel`: remembers the tokens of its positions."""

    def __init__(self, capacity: int) -> None:
        self.tokens: list[int] = []
        self._capacity = capacity

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self._capacity

    def crop(self, length: int) -> None:
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"length must be in [0, {len(self.tokens)}], got {length}")
        del self.tokens[length:]

    def reset(self) -> None:
        self.tokens.clear()


class _MemoModel:
    """Wraps a Transformer; ``forward`` returns full-recompute logits memoised per prefix.

    The distribution audit runs the real decoding loop, drafters, kernels and random streams
    hundreds of thousands of times over the same few hundred prefixes; memoising the model's
    logits per prefix keeps that fast on either backend without changing any probability
    (the cache itself is audited separately by the rollback check).
    """

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.config = model.config
        self._memo: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._calls: dict[tuple[tuple[int, ...], tuple[int, ...]], np.ndarray] = {}

    def check_ids(self, ids, name="ids"):
        return self.model.check_ids(ids, name)

    def check_hidden_layers(self, layers):
        return self.model.check_hidden_layers(layers)

    def new_cache(self, capacity=None) -> _MemoCache:
        return _MemoCache(self.config.max_seq_len if capacity is None else capacity)

    def check_cache(self, cache) -> None:
        if not isinstance(cache, _MemoCache):
            raise TypeError("the memoised audit model needs its own cache")

    def _row(self, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        entry = self._memo.get(key)
        if entry is None:
            layers = range(self.config.n_layers)
            out = self.model.forward(np.array(key, dtype=np.int64), hidden_layers=layers)
            hidden = np.stack([out.hidden[layer] for layer in layers], axis=1)  # (n, L, dim)
            for j in range(1, len(key) + 1):
                self._memo.setdefault(key[:j], (out.logits[j - 1].copy(), hidden[j - 1].copy()))
            entry = self._memo[key]
        return entry

    def step(self, ids, cache, *, hidden_layers=(), out=None):
        return self.forward(ids, cache, hidden_layers, out)

    def forward(self, ids, cache=None, hidden_layers=(), out=None):
        result = self._forward(ids, cache, hidden_layers)
        if out is not None:
            out[...] = result.logits
            result.logits = out
        return result

    def _forward(self, ids, cache, hidden_layers):
        if cache is None:
            cache = self.new_cache()
        tokens = cache.tokens
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        if not hidden_layers:
            # Fast path: the whole call's logits memoised under (committed, new) tokens.
            key = (tuple(tokens), tuple(ids))
            hit = self._calls.get(key)
            if hit is not None:
                if len(tokens) + len(ids) > cache.capacity:
                    raise ValueError("memo cache capacity exceeded")
                tokens.extend(ids)
                return fastspec.ForwardOutput(hit, {})
        layers = self.check_hidden_layers(hidden_layers)
        if len(tokens) + len(ids) > cache.capacity:
            raise ValueError("memo cache capacity exceeded")
        rows, hidden_rows = [], []
        for t in ids:
            tokens.append(int(t))
            logits, hidden = self._row(tuple(tokens))
            rows.append(logits)
            hidden_rows.append(hidden)
        hidden = {}
        logits = np.array(rows)
        if layers:
            stacked = np.array(hidden_rows)
            hidden = {layer: np.ascontiguousarray(stacked[:, layer]) for layer in layers}
        else:
            logits.flags.writeable = False  # shared by every later identical call
            self._calls[(tuple(tokens[:len(tokens) - len(ids)]), tuple(ids))] = logits
        return fastspec.ForwardOutput(logits, hidden)


# --- drafters and verifiers used only by the audit ------------------------------------------

class ArgmaxDraftModelDrafter(DraftModelDrafter):
    """Draft model whose proposals are its argmax (deterministic, ``q`` None): lossless."""

    def _choose(self, q, rng):
        return int(q.argmax())

    def propose(self, seq, gamma, sampling, rng):
        proposal = super().propose(seq, gamma, sampling, rng)
        return Proposal(proposal.tokens, None)


class WrongQDrafter(DraftModelDrafter):
    """NEGATIVE CONTROL: proposes the argmax but reports the q it did not sample from."""

    def _choose(self, q, rng):
        return int(q.argmax())


def broken_verify_rejection(draft_tokens, p, q, uniforms):
    """NEGATIVE CONTROL: rejection sampling whose correction is drawn from p, not max(p-q, 0)."""
    g = draft_tokens.shape[0]
    for i in range(g):
        x = int(draft_tokens[i])
        qx = 1.0 if q is None else float(q[i, x])
        if uniforms[i] * qx < p[i, x]:
            continue
        return i, int(kernels.sample(p[i], float(uniforms[g])))
    return g, int(kernels.sample(p[g], float(uniforms[g])))


# --- checks: forward pass ------------------------------------------------------------------

@register_check("cache_block_equivalence", group="model")
def check_cache_block_equivalence(ctx: AuditContext) -> dict:
    """Chunked cached forward == one full forward (logits and cache), toy float64."""
    model = ctx.model(69, 2)
    ids = np.array((PREFIX * 4)[:29], dtype=np.int64)
    full_cache = model.new_cache()
    full = model.forward(ids, full_cache).logits
    cache, parts, start = model.new_cache(), [], 0
    for size in (3, 1, 7, 2, 16):
        parts.append(model.forward(ids[start:start + size], cache).logits)
        start += size
    chunked = np.concatenate(parts)
    logit_err = float(np.max(np.abs(full - chunked)))
    cache_err = max(float(np.max(np.abs(full_cache.k[..., :29, :] - cache.k[..., :29, :]))),
                    float(np.max(np.abs(full_cache.v[..., :29, :] - cache.v[..., :29, :]))))
    cfg = model.config
    cached_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * 29 * cfg.head_dim * 8
    return dict(passed=logit_err <= 1e-10 and cache_err <= 1e-10 and cache.length == 29,
                max_logit_error=logit_err, max_cache_error=cache_err, chunks=[3, 1, 7, 2, 16],
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

#: Sampling settings of the distribution audit. In the combined one both filters bind on the
#: toy target: 216 continuations survive top-k 6 alone, 120 top-p 0.8 alone, 70 both.
DIST_SETTINGS = {
    "temperature_1": SamplingParams(1.0, 0, 1.0),
    "top_k_6_top_p_0.8": SamplingParams(1.0, 6, 0.8),
}
DIST_PREFIX = PREFIX
DIST_NEW_TOKENS = 3
DIST_GAMMA = 4
DIST_SEED = 69


def distribution_audit(drafter, sampling: SamplingParams, samples: int, *, seed: int = DIST_SEED,
                       verifier=None, gamma: int = DIST_GAMMA, base_seed: int = 1_000_000
                       ) -> dict:
    """Run ``samples`` seeded speculative generations of 3 tokens and test their law.

    The target is the toy model of ``seed`` with vocabulary 8 (logits memoised per prefix);
    ``drafter`` must be built on models of the same vocabulary (wrap a draft model in
    :class:`_MemoModel` for speed). Run ``i`` uses seed ``base_seed + i``.
    """
    target_model = Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed)
    exact = exact_continuation_probs(target_model, DIST_PREFIX, DIST_NEW_TOKENS, sampling)
    target = _MemoModel(target_model)
    cache = target.new_cache()
    vocab = target.config.vocab_size
    counts = np.zeros(vocab ** DIST_NEW_TOKENS, dtype=np.int64)
    prompt = np.array(DIST_PREFIX, dtype=np.int64)
    t0 = time.perf_counter()
    rounds = drafted = accepted = 0
    # One validated plan, many seeded runs: the loop is the public one minus re-validation.
    plan = _plan(target, drafter, prompt, DIST_NEW_TOKENS, gamma, sampling.temperature,
                 sampling.top_k, sampling.top_p, 0, None, cache)
    default_rng = np.random.default_rng
    for i in range(samples):
        res = _run(plan, default_rng(base_seed + i), False, None, verifier)
        x = res.tokens
        counts[(x[0] * vocab + x[1]) * vocab + x[2]] += 1
        rounds += res.stats.rounds
        drafted += res.stats.drafted
        accepted += res.stats.accepted
    elapsed = time.perf_counter() - t0
    test = chi_square_test(counts, exact)
    passed = test["p_value"] >= ALPHA and test["impossible_count"] == 0
    nonzero = int((exact > 0).sum())
    return dict(passed=passed, samples=samples, p_value=test["p_value"],
                chi_square=test["statistic"], df=test["df"], tv=test["tv"],
                tv_noise_scale=float(math.sqrt(nonzero / (2 * math.pi * samples))),
                impossible_count=test["impossible_count"], pooled_cells=test["pooled_cells"],
                support=nonzero, acceptance_rate=accepted / drafted if drafted else 0.0,
                mean_rounds=rounds / samples, elapsed_s=elapsed,
                runs_per_s=samples / elapsed if elapsed > 0 else math.inf)


def _dist_drafters(seed: int = DIST_SEED) -> dict[str, Any]:
    draft = _MemoModel(Transformer.random(ModelConfig.toy(n_layers=1, dtype="float64"), seed))
    target = Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed)
    out = {name: factory(target, draft) for name, factory in DRAFTERS.items()}
    out["draft_model_argmax"] = ArgmaxDraftModelDrafter(draft)
    return out


def _dist_samples(ctx: AuditContext) -> int:
    return ctx.samples


@register_check("exact_distribution", group="distribution")
def check_exact_distribution(ctx: AuditContext) -> dict:
    """Speculative sampling reproduces the exact target law (chi-square, TV), every drafter."""
    rows = []
    samples = _dist_samples(ctx)
    for name, drafter in _dist_drafters().items():
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
    samples = _dist_samples(ctx)
    draft = _MemoModel(Transformer.random(ModelConfig.toy(n_layers=1, dtype="float64"),
                                          DIST_SEED))
    sampling = DIST_SETTINGS["temperature_1"]
    rows = []
    r = distribution_audit(DraftModelDrafter(draft), sampling, samples,
                           verifier=broken_verify_rejection)
    rows.append(dict(control="verifier_residual_p", detected=not r["passed"], **r))
    r = distribution_audit(WrongQDrafter(draft), sampling, samples)
    rows.append(dict(control="argmax_drafter_reports_softmax_q", detected=not r["passed"], **r))
    return dict(passed=all(r["detected"] for r in rows), alpha=ALPHA, cases=rows)


# --- running -------------------------------------------------------------------------------

def environment() -> dict:
    """Versions and backend of this run."""
    return dict(python=platform.python_version(), numpy=np.__version__,
                platform=platform.platform(), machine=platform.machine(),
                fastspec=fastspec.__version__, backend=kernels.backend(),
                available_backends=list(kernels.available_backends()))


def _load_optional_checks() -> tuple[list[str], dict[str, str]]:
    """Import the modules that register more checks; return (loaded, import errors)."""
    loaded, errors = [], {}
    for name in OPTIONAL_CHECK_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                errors[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # reported as a failed check, never hidden
            errors[name] = f"{type(exc).__name__}: {exc}"
        else:
            loaded.append(name)
    return loaded, errors


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    return x


def run_audit(quick: bool = False, samples: int | None = None, names=None,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run the registered checks and return the report.

    Parameters
    ----------
    quick : bool
        20 000 instead of 100 000 runs per distribution audit, fewer rollback seeds.
    samples : int, optional
        Override the number of runs per distribution audit.
    names : iterable of str, optional
        Run only these checks (or groups).
    progress : callable, optional
        Called with a line of text after each check.

    Returns
    -------
    dict
        ``passed``, ``environment``, ``config``, ``checks`` (name -> figures with
        ``passed``, ``seconds`` and, on an exception, ``error``).
    """
    loaded, import_errors = _load_optional_checks()
    ctx = AuditContext(quick=quick, samples=samples or (20_000 if quick else 100_000))
    wanted = None if names is None else set(names)
    unknown = set() if wanted is None else wanted - {c.name for c in CHECKS} - {c.group for c in CHECKS}
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {[c.name for c in CHECKS]}")
    results = {}
    if wanted is None:
        for module, error in import_errors.items():
            results[f"import {module}"] = dict(group="import", description="optional checks",
                                               passed=False, error=error, seconds=0.0)
    t_all = time.perf_counter()
    for check in CHECKS:
        if wanted is not None and check.name not in wanted and check.group not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            figures = check.fn(ctx)
            if not isinstance(figures, dict) or "passed" not in figures:
                raise TypeError(f"check {check.name} must return a dict with 'passed'")
            figures["passed"] = bool(figures["passed"])
        except Exception as exc:  # a crashing check is a failed check, reported in full
            figures = dict(passed=False, error=f"{type(exc).__name__}: {exc}",
                           traceback=traceback.format_exc())
        figures["seconds"] = time.perf_counter() - t0
        figures = {"group": check.group, "description": check.description, **figures}
        results[check.name] = figures
        if progress is not None:
            progress(f"{'PASS' if figures['passed'] else 'FAIL'}  {check.name}  "
                     f"({figures['seconds']:.1f} s)")
    report = dict(passed=bool(results) and all(r["passed"] for r in results.values()),
                  environment=environment(),
                  config=dict(quick=quick, distribution_samples=ctx.samples, prefix=PREFIX,
                              seeds=list(SEEDS), gammas=list(GAMMAS), new_tokens=NEW_TOKENS,
                              dtype="float64", toy_target_layers=2, toy_draft_layers=1,
                              drafters=list(DRAFTERS), alpha=ALPHA, extra_modules=loaded),
                  checks=results, seconds=time.perf_counter() - t_all)
    return _jsonable(report)


def format_report(report: dict) -> str:
    """Return a readable summary table of :func:`run_audit`'s report."""
    lines = [f"fastspec {report['environment']['fastspec']} audit — backend "
             f"{report['environment']['backend']}, numpy {report['environment']['numpy']}, "
             f"python {report['environment']['python']}"]
    width = max([len(n) for n in report["checks"]] + [5])
    lines.append(f"{'check':<{width}}  result  seconds  figures")
    for name, r in report["checks"].items():
        lines.append(f"{name:<{width}}  {'PASS' if r['passed'] else 'FAIL':<6}  "
                     f"{r['seconds']:7.2f}  {_headline(name, r)}")
    lines.append(f"overall: {'PASS' if report['passed'] else 'FAIL'} "
                 f"({report['seconds']:.1f} s)")
    return "\n".join(lines)


def _headline(name: str, r: dict) -> str:
    if "error" in r:
        return r["error"]
    if name == "cache_block_equivalence":
        return f"max logit err {r['max_logit_error']:.1e}, cache err {r['max_cache_error']:.1e}"
    if name == "causal_invariance":
        return f"max earlier-logit change {r['max_earlier_logit_change']:.1e}"
    if name in ("exact_distribution", "negative_controls"):
        parts = []
        for c in r["cases"]:
            label = c.get("control") or f"{c['drafter']}/{c['setting']}"
            parts.append(f"{label}: p={c['p_value']:.3g} tv={c['tv']:.4f}")
        return f"{r['cases'][0]['samples']} runs each; " + "; ".join(parts)
    if name == "rollback":
        return (f"max target err {max(c['max_target_error'] for c in r['cases']):.1e}, "
                f"draft err {max(c['max_draft_error'] for c in r['cases']):.1e}, "
                f"{len(r['cases'])} runs")
    cases = r.get("cases")
    if isinstance(cases, list):
        return f"{len(cases)} cases"
    return ""


def write_report(report: dict, path) -> None:
    """Write the report as indented JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def main(argv=None) -> int:  # pragma: no cover - thin wrapper, the CLI is the entry point
    from fastspec.cli import main as cli_main
    return cli_main(["audit", *(argv if argv is not None else sys.argv[1:])])
