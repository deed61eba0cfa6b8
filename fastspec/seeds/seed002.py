"""Seed 002 reproduced on fastspec: the KV-cache and speculative-decoding audit (``results.json``).

Seed 002 is a NumPy experiment on an untrained toy decoder (vocabulary 8, width 16, 2 heads,
LayerNorm, learned positions, tanh FFN; a 2-layer target and a 1-layer draft). This module
reruns it with fastspec's own pieces — ``Transformer`` built from ``ModelConfig.toy``
(whose random initialisation draws the seed's weights, in the seed's order, from the same
``default_rng(seed)``), ``KVCache``, ``generate``, ``speculative_generate``,
``DraftModelDrafter`` and the verification kernels — and writes a report with the seed's
top-level keys and fields:

- ``kv``: chunked cached forward == one full forward, cache == recompute, bytes and shape
  of the 29 cached positions measured from the cache buffers, causal invariance;
- ``greedy_checks``: seeds 69-71 x gamma 1/4/8, speculative == vanilla greedy, with the
  seed's in-round audit (each target forward == a full recompute; both caches == a fresh
  recompute after every round);
- ``sampling_cache_traces``: sampled runs with the target and draft cache length per round;
- ``identity_draft``: draft == target, no rejected round;
- ``distribution_check``: the analytic mass conservation over the seed's four (p, q) pairs
  (two with disjoint supports) and the 200 000-draw Monte Carlo at seed 6900, where the wrong
  fallback (resample from p) recovers its exact wrong law (TV 0.06);
- ``timing`` (7 samples after one warm-up, medians) and ``workload`` per job.

With ``seed_file`` (the seed document), the seed's own NumPy code runs in the same process on
the same jobs: its medians and the ratio ``seed / fastspec`` sit beside each timing, and its
greedy tokens are compared with fastspec's (same weights, so they must be equal).
"""
from __future__ import annotations

import numpy as np

from fastspec.decoding import generate, speculative_generate
from fastspec.drafters import DraftModelDrafter
from fastspec.kernels import backend
from fastspec.kernels.cache import KVCache
from fastspec.model import ModelConfig, Transformer
from fastspec import audit, kernels
from fastspec.audit.core import CHUNKS, chunked_forward
from fastspec.seeds.report import environment, load_seed_file, seed_path, time_samples

__all__ = ["run", "distribution_check", "PREFIX", "NEW_TOKENS", "PAIRS", "SEED_MARKERS"]

PREFIX = [0, 1, 3, 2, 4, 1, 5, 6]
NEW_TOKENS = 48
SEEDS = (69, 70, 71)
GAMMAS = (1, 4, 8)
#: The seed's four (p, q) pairs: a typical one, p == q, and two with disjoint supports.
PAIRS = [([.1, .6, .3], [.7, .2, .1]), ([.2, .3, .5], [.2, .3, .5]),
         ([0., 1., 0.], [1., 0., 0.]), ([.4, .6, 0.], [0., .5, .5])]
MC_SEED = 6900
MC_DRAWS = 200_000
#: Draws of the Monte Carlo also run one by one through the active backend's kernels.
KERNEL_DRAWS = 10_000
REPEATS = 7
TOL = 1e-10
#: Strings and names that identify the seed 002 document (``--seed-file``).
SEED_MARKERS = ("def sampling_audit", "class Decoder", "def speculative", "6900")
SEED_NAMES = ("Decoder", "baseline", "speculative", "crop")


def _toy(seed: int, layers: int) -> Transformer:
    return Transformer.random(ModelConfig.toy(n_layers=layers, dtype="float64"), seed)


def _cache_error(model, seq, cache) -> float:
    """Max abs difference between ``cache``'s valid positions and a recompute of ``seq``."""
    seq = np.asarray(seq, dtype=np.int64)
    if cache.length != seq.shape[0]:
        return float("inf")
    if seq.shape[0] == 0:
        return 0.0
    fresh = model.new_cache()
    model.forward(seq, fresh)
    return max(max(float(np.max(np.abs(cache.keys(l) - fresh.keys(l)))),
                   float(np.max(np.abs(cache.values(l) - fresh.values(l)))))
               for l in range(cache.n_layers))


class _AuditedTarget:
    """The target with the seed's in-round audit: each step's logits == a full recompute.

    Delegates everything to the model; ``committed`` (set from the loop's callback) names the
    tokens the cache holds, so a forward of ``ids`` at ``cache.length`` can be recomputed
    from position 0.
    """

    def __init__(self, model: Transformer, prompt) -> None:
        self.model = model
        self.committed = np.asarray(prompt, dtype=np.int64)
        self.checks = 0
        self.max_error = 0.0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, ids, cache, **kwargs):
        start = cache.length
        out = self.model.step(ids, cache, **kwargs)
        full = np.concatenate([self.committed[:start], np.asarray(ids, dtype=np.int64)])
        ref = self.model.forward(full).logits[start:]
        ref = ref[ref.shape[0] - out.logits.shape[0]:]  # logit_rows: the last rows only
        if out.logits.size:
            self.max_error = max(self.max_error, float(np.max(np.abs(out.logits - ref))))
        self.checks += 1
        return out


def _speculative(target, draft, count, gamma, temperature, seed):
    """One audited speculative run; returns (tokens, seed-style stats, per-round trace, audit)."""
    checked = _AuditedTarget(target, PREFIX)
    drafter = DraftModelDrafter(draft)
    worst = {"target": 0.0, "draft": 0.0}
    draft_lengths, lags = [], set()

    def after_round(seq, n):
        checked.committed = np.array(seq[:n])
        dcache = drafter.cache
        draft_lengths.append(dcache.length)
        lags.add(n - 1 - dcache.length)
        worst["draft"] = max(worst["draft"], _cache_error(draft, seq[:dcache.length], dcache))

    cache = target.new_cache()
    res = speculative_generate(checked, drafter, PREFIX, count, gamma=gamma,
                               temperature=temperature, seed=seed, trace=True, cache=cache,
                               callback=after_round)
    worst["target"] = _cache_error(target, (PREFIX + res.tokens)[:-1], cache)
    rounds = res.stats.trace
    stats = dict(rounds=len(rounds), proposed=sum(r["proposed"] for r in rounds),
                 examined=sum(min(r["accepted"] + 1, r["proposed"]) for r in rounds),
                 accepted=sum(r["accepted"] for r in rounds),
                 rejected_rounds=sum(r["accepted"] < r["proposed"] for r in rounds),
                 full_rounds=sum(r["accepted"] == r["proposed"] for r in rounds))
    trace = [dict(prefix_length=r["prefix_length"], proposed=r["proposed"],
                  accepted=r["accepted"], target_cache_length=r["target_cache_length"],
                  draft_cache_length=draft_lengths[i] if i < len(draft_lengths) else None)
             for i, r in enumerate(rounds)]
    ok = (len(res.tokens) == count and checked.checks == res.stats.target_calls
          and checked.max_error <= TOL and worst["draft"] <= TOL and worst["target"] <= TOL
          and lags <= {0, 1})
    audit_figures = dict(block_logit_checks=checked.checks, max_block_logit_error=checked.max_error,
                         max_draft_cache_error=worst["draft"],
                         final_target_cache_error=worst["target"],
                         draft_lags=sorted(lags), passed=ok)
    return res.tokens, stats, trace, audit_figures


def _kv_check() -> tuple[dict, list]:
    t = _toy(69, 2)
    ids = np.array((PREFIX * 4)[:29], dtype=np.int64)
    full, _, chunked, cache = chunked_forward(t, ids)
    err = float(np.max(np.abs(full - chunked)))
    cache_err = _cache_error(t, ids, cache)
    # Measured from the buffers: the views of the valid positions of every layer's K and V.
    views = [a for l in range(cache.n_layers) for a in (cache.keys(l), cache.values(l))]
    cache_bytes = sum(a.nbytes for a in views)
    altered = ids.copy()
    altered[-1] = (altered[-1] + 1) % t.config.vocab_size
    change = float(np.max(np.abs(full[:-1] - t.forward(altered).logits[:-1])))
    kv = dict(max_logit_error=err, shape=list(cache.keys(0).shape), bytes=cache_bytes,
              cached_length=cache.length, causal_invariance=change <= 1e-12,
              max_cache_error=cache_err, max_earlier_logit_change=change,
              allocated_bytes=cache.nbytes, capacity=cache.capacity, chunks=list(CHUNKS))
    checks = [("kv: chunked forward == full forward", err <= TOL),
              ("kv: cache == recompute", cache_err <= TOL),
              ("kv: measured bytes == 2*2*2*29*8*8", cache_bytes == 2 * 2 * 2 * 29 * 8 * 8),
              ("kv: cached length 29", cache.length == 29),
              ("kv: causal invariance", change <= 1e-12)]
    return kv, checks


def distribution_check(draws: int = MC_DRAWS, seed: int = MC_SEED,
                       kernel_draws: int = KERNEL_DRAWS) -> dict:
    """The seed's sampling audit with fastspec's verification rule and kernels.

    Analytic part: for each of :data:`PAIRS`, the law of the emitted token under the rule of
    :func:`fastspec.kernels.verify_rejection` (accept ``x ~ q`` with ``min(1, p/q)``, else
    draw from ``normalise(max(p - q, 0))``) is ``min(p, q) + max(p - q, 0) == p``; the kernel
    is also run on every proposable token of every pair (a 5 x 5 grid of uniforms) and must
    never emit a token outside ``p``'s support.

    Monte Carlo: ``draws`` proposals from q = [.7, .2, .1] checked against p = [.1, .6, .3]
    with ``default_rng(seed)`` (three uniforms per draw: proposal, accept test, correction,
    each used by inverse CDF as the kernels do). The correct rule must give TV < 0.01; the
    wrong fallback (correction drawn from p, :func:`fastspec.audit.broken_verify_rejection`)
    must recover its exact wrong law ``min(p, q) + (1 - sum min(p, q)) p`` (TV 0.06) within
    0.01. The draws are computed vectorised; the first ``kernel_draws`` are also run one by
    one through ``kernels.sample``, ``kernels.verify_rejection`` and the broken verifier, which
    must return the same tokens.
    """
    errors, support_violations = [], 0
    grid = (np.arange(5) + 0.5) / 5
    for p_list, q_list in PAIRS:
        pair_p, pair_q = np.array(p_list), np.array(q_list)
        errors.append(_rule_law_error(pair_p, pair_q))
        p2 = np.ascontiguousarray(np.stack([pair_p, pair_p]))
        q1 = np.ascontiguousarray(pair_q[None, :])
        for x in np.flatnonzero(pair_q > 0):
            for ua in grid:
                for ur in grid:
                    n_acc, nxt = kernels.verify_rejection(np.array([x]), p2, q1, np.array([ua, ur]))
                    token = int(x) if n_acc == 1 else int(nxt)
                    support_violations += int(not pair_p[token] > 0)
    p, q = np.array(PAIRS[0][0]), np.array(PAIRS[0][1])
    rng = np.random.default_rng(seed)
    u = rng.random((3, draws))
    candidates = _inverse_cdf(q, u[0])
    keep = u[1] * q[candidates] < p[candidates]
    actual = np.where(keep, candidates, _inverse_cdf(np.maximum(p - q, 0.0), u[2]))
    wrong = np.where(keep, candidates, _inverse_cdf(p, u[2]))
    mismatches = _kernel_mismatches(p, q, u, candidates, actual, wrong, min(kernel_draws, draws))
    freq = np.bincount(actual, minlength=3) / draws
    wrong_freq = np.bincount(wrong, minlength=3) / draws
    wrong_law = np.minimum(p, q) + (1 - np.minimum(p, q).sum()) * p
    result = dict(draws=draws, seed=seed, p=p.tolist(), q=q.tolist(), frequency=freq.tolist(),
                  tv=float(np.abs(freq - p).sum() / 2),
                  wrong_fallback_frequency=wrong_freq.tolist(),
                  wrong_fallback_tv=float(np.abs(wrong_freq - p).sum() / 2),
                  wrong_theoretical_tv=float(np.abs(wrong_law - p).sum() / 2),
                  wrong_law=wrong_law.tolist(),
                  wrong_law_max_error=float(np.max(np.abs(wrong_freq - wrong_law))),
                  analytic_max_error=max(errors), analytic_cases=len(PAIRS),
                  kernel_support_violations=support_violations,
                  kernel_agreement=dict(draws=min(kernel_draws, draws), mismatches=mismatches,
                                        backend=backend()))
    return result


def _rule_law_error(p: np.ndarray, q: np.ndarray) -> float:
    """Max |law - p| of the emitted token: accepted mass ``q min(1, p/q)`` plus the
    rejected mass times ``normalise(max(p - q, 0))`` (no rejection: no residual needed)."""
    accepted = np.where(q > 0, q * np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)
    residual = np.maximum(p - q, 0.0)
    law = accepted + ((1.0 - accepted.sum()) * residual / residual.sum()
                      if residual.sum() > 0 else 0.0)
    return float(np.max(np.abs(law - p)))


def _inverse_cdf(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Vectorised ``kernels.sample``: the first index whose cumulative weight exceeds u * sum."""
    cumulative = np.cumsum(weights)
    idx = np.searchsorted(cumulative, u * cumulative[-1], side="right")
    return np.minimum(idx, np.flatnonzero(weights > 0)[-1])


def _kernel_mismatches(p, q, u, candidates, actual, wrong, n) -> int:
    """Run the first ``n`` draws through the kernels one by one; count disagreements."""
    p2, q1, q0 = np.stack([p, p]), q[None, :].copy(), q.copy()
    token = np.zeros(1, dtype=np.int64)
    uniforms = np.zeros(2)
    bad = 0
    for i in range(n):
        x = int(kernels.sample(q0, float(u[0, i])))
        token[0] = x
        uniforms[0], uniforms[1] = u[1, i], u[2, i]
        n_acc, nxt = kernels.verify_rejection(token, p2, q1, uniforms)
        w_acc, w_nxt = audit.broken_verify_rejection(token, p2, q1, uniforms)
        bad += int(x != candidates[i] or (x if n_acc == 1 else nxt) != actual[i]
                   or (x if w_acc == 1 else w_nxt) != wrong[i])
    return bad


def _distribution_checks(d: dict) -> list:
    return [("distribution: analytic mass conservation (4 pairs)",
             d["analytic_max_error"] <= 1e-15),
            ("distribution: kernel never leaves p's support", d["kernel_support_violations"] == 0),
            ("distribution: vectorised draws == kernels", d["kernel_agreement"]["mismatches"] == 0),
            ("distribution: correct rule TV < 0.01", d["tv"] < 0.01),
            ("distribution: wrong fallback TV > 0.04", d["wrong_fallback_tv"] > 0.04),
            ("distribution: wrong fallback recovers its law within 0.01",
             d["wrong_law_max_error"] <= 0.01)]


def _decoding_checks(count: int) -> tuple[dict, list]:
    checks, greedy, traces = [], [], []
    for seed in SEEDS:
        t, d = _toy(seed, 2), _toy(seed, 1)
        expected = generate(t, PREFIX, count, use_cache=False).tokens
        cached_equal = expected == generate(t, PREFIX, count, use_cache=True).tokens
        checks.append((f"seed {seed}: cached vanilla == full-prefix vanilla", cached_equal))
        for gamma in GAMMAS:
            tokens, stats, _, figures = _speculative(t, d, count, gamma, 0.0, seed)
            equal = tokens == expected
            checks.append((f"seed {seed} gamma {gamma}: greedy speculative == vanilla", equal))
            checks.append((f"seed {seed} gamma {gamma}: in-round audit", figures["passed"]))
            greedy.append(dict(seed=seed, gamma=gamma, greedy_equal=equal, **stats,
                               audit=figures))
        _, stats, trace, figures = _speculative(t, d, count, 4, 1.0, seed)
        checks.append((f"seed {seed}: sampled run audit", figures["passed"]))
        traces.append(dict(seed=seed, mode="sampling", stats=stats, rounds=trace, audit=figures))
    t = _toy(69, 2)
    _, identity, _, figures = _speculative(t, t, 12, 4, 1.0, 69)
    identity["audit"] = figures
    checks.append(("identity draft: no rejected round", identity["rejected_rounds"] == 0))
    checks.append(("identity draft: audit", figures["passed"]))
    return dict(greedy_checks=greedy, sampling_cache_traces=traces, identity_draft=identity), checks


def _timing(repeats: int, seed_module) -> tuple[dict, dict, dict, dict | None]:
    t, d = _toy(69, 2), _toy(69, 1)
    last = {}

    def job(name, fn):
        def run():
            last[name] = fn()
        return run

    jobs = {"full_prefix": lambda: generate(t, PREFIX, NEW_TOKENS, use_cache=False),
            "kv_cache": lambda: generate(t, PREFIX, NEW_TOKENS, use_cache=True),
            "speculative_g4": lambda: speculative_generate(t, DraftModelDrafter(d), PREFIX,
                                                           NEW_TOKENS, gamma=4, seed=69)}
    timing, workload = {}, {}
    for name, fn in jobs.items():
        timing[name] = time_samples(job(name, fn), repeats)
        s = last[name].stats
        workload[name] = dict(target_calls=s.target_calls, draft_calls=s.draft_calls,
                              target_layer_tokens=s.target_positions * t.config.n_layers,
                              target_score_cells=s.target_score_cells)
    if seed_module is None:
        for name in timing:
            timing[name].update(seed_ms=None, seed_median_ms=None, ratio_seed_over_fastspec=None)
        return timing, workload, {}, None
    st, sd = seed_module.Decoder(69), seed_module.Decoder(69, layers=1)
    seed_jobs = {"full_prefix": lambda: seed_module.baseline(st, PREFIX, NEW_TOKENS, False),
                 "kv_cache": lambda: seed_module.baseline(st, PREFIX, NEW_TOKENS, True),
                 "speculative_g4": lambda: seed_module.speculative(st, sd, PREFIX, NEW_TOKENS, 4,
                                                                   True, 69)[0]}
    seed_workload, comparison = {}, {}
    for name, fn in seed_jobs.items():
        def counted(fn=fn, name=name):
            st.reset_counts()
            sd.reset_counts()
            last["seed_" + name] = fn()
        s = time_samples(counted, repeats)
        timing[name].update(seed_ms=s["ms"], seed_median_ms=s["median_ms"],
                            ratio_seed_over_fastspec=s["median_ms"] / timing[name]["median_ms"])
        seed_workload[name] = dict(target_calls=st.calls, draft_calls=sd.calls,
                                   target_layer_tokens=st.projected_tokens,
                                   target_score_cells=st.score_cells)
        comparison[f"{name}_tokens_equal"] = (list(last["seed_" + name][len(PREFIX):])
                                              == last[name].tokens)
    ids = np.array((PREFIX * 4)[:29], dtype=np.int64)
    comparison["max_logit_difference"] = max(
        float(np.max(np.abs(seed_module.Decoder(s, layers=n).forward(ids.tolist())[0]
                            - _toy(s, n).forward(ids).logits)))
        for s in SEEDS for n in (1, 2))
    return timing, workload, seed_workload, comparison


def run(seed_file=None, *, draws: int = MC_DRAWS, kernel_draws: int = KERNEL_DRAWS,
        repeats: int = REPEATS, new_tokens: int = NEW_TOKENS) -> dict:
    """Run seed 002's experiment on fastspec; return the report (``passed`` says if all held).

    Parameters
    ----------
    seed_file : path, optional
        The seed 002 document; its own NumPy code is timed on the same jobs (ratio column).
    draws, kernel_draws : int
        Monte Carlo draws, and how many of them also run one by one through the kernels.
    repeats : int
        Timed samples per job (after one warm-up).
    new_tokens : int
        Tokens of the decoding checks (the seed's 48; the timing always uses 48).

    Raises
    ------
    fastspec.seeds.report.SeedInputError
        If ``seed_file`` is not the seed 002 document (checked before any work).
    """
    seed_module = (None if seed_file is None
                   else load_seed_file(seed_file, SEED_MARKERS, SEED_NAMES, "002"))
    kv, checks = _kv_check()
    decoding, more = _decoding_checks(new_tokens)
    checks += more
    dist = distribution_check(draws, MC_SEED, kernel_draws)
    checks += _distribution_checks(dist)
    timing, workload, seed_workload, comparison = _timing(repeats, seed_module)
    if comparison is not None:
        checks += [(f"seed code: {k}", v) for k, v in comparison.items() if k.endswith("_equal")]
        checks.append(("seed code: same weights (logits within 1e-12)",
                       comparison["max_logit_difference"] <= 1e-12))
    cfg = ModelConfig.toy(dtype="float64")
    report = dict(
        environment=environment(),
        config=dict(prefix=PREFIX, new_tokens=new_tokens, vocab=cfg.vocab_size, dim=cfg.dim,
                    heads=cfg.n_heads, target_layers=2, draft_layers=1, trained=False,
                    model="fs.Transformer.random(fs.ModelConfig.toy(n_layers=L, "
                          "dtype='float64'), seed)",
                    timing_repeats=repeats, seed_file=seed_path(seed_file)),
        kv=kv, **decoding, distribution_check=dist, timing=timing, workload=workload)
    if seed_module is not None:
        report["workload_seed"] = seed_workload
        report["seed_comparison"] = comparison
    report["checks"] = [dict(name=name, passed=bool(ok)) for name, ok in checks]
    report["passed"] = all(ok for _, ok in checks)
    return report


def summary(report: dict) -> str:
    """A few lines for the terminal: the checks that failed, TVs and the timing table."""
    d = report["distribution_check"]
    lines = [f"seed 002 on fastspec (backend {report['environment']['backend']}): "
             f"{'PASS' if report['passed'] else 'FAIL'}, {len(report['checks'])} checks"]
    lines += [f"  FAILED: {c['name']}" for c in report["checks"] if not c["passed"]]
    lines.append(f"  kv: max logit error {report['kv']['max_logit_error']:.1e}, "
                 f"{report['kv']['bytes']} bytes, shape {report['kv']['shape']}")
    lines.append(f"  distribution: TV {d['tv']:.4f} (correct rule), {d['wrong_fallback_tv']:.4f} "
                 f"(wrong fallback; exact {d['wrong_theoretical_tv']:.4f}), {d['draws']} draws")
    for name, t in report["timing"].items():
        ratio = t.get("ratio_seed_over_fastspec")
        seed_part = "" if ratio is None else f"; seed {t['seed_median_ms']:.2f} ms, x{ratio:.1f}"
        lines.append(f"  {name:<15} median {t['median_ms']:.2f} ms{seed_part}")
    return "\n".join(lines)
