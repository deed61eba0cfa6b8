"""Exact audit of seed 000's acceptance rule: the law of 3 emitted tokens, enumerated.

For each rule of :func:`fastspec.seeds.seed000.speculative_decode`, the law of the first
``n_new`` tokens is computed exactly — every denoising fill the drafter can make, with its
probability, every verification outcome (accept with ``min(1, p/q)`` or ``p(x)``; correction
from ``normalise(max(p - q, 0))`` or ``p`` without ``x``), the seed's loop (``t_1`` sampled by
the target, no bonus after a fully accepted block) — and compared in total variation with the
target's own law, computed by fastspec's oracle :func:`fastspec.audit.exact_target_law`.

Why a reduced configuration: the seed's ``q`` for a position depends on the WHOLE filled block
(``W_mix`` mixes the positions), so the law of even the first verified token needs the law of
the whole block: ``V ** B`` fills per context, 1000 ** 8 at the seed's sizes. The audit keeps
the seed's architecture, widths, weight recipe, schedule (half the positions at temperature
0.8, then the rest) and loop, and shrinks the vocabulary to 8 and the block to 4 tokens
(:data:`AUDIT_CONFIG`): 8 ** 4 = 4 096 fills per context, all enumerated, and the 8 ** 3 = 512
continuations of the prompt are exact to float rounding. The target being context-free, its
next-token law is one table ``P[x]`` (V x V) and the state between rounds is the last token.
"""
from __future__ import annotations

import itertools

import numpy as np

from fastspec.drafters.base import SamplingParams
from fastspec import audit
from fastspec.seeds.seed000 import (RULES, MLPTarget, Seed000Config, WMixDrafter,
                                    pick_positions, speculative_decode)

__all__ = ["AUDIT_CONFIG", "SHARP_CONFIG", "PROMPT", "draft_law", "exact_speculative_law",
           "exact_target_law", "loop_counts", "run_audit"]

#: The audited configuration: the seed's system with vocabulary 8 and blocks of 4 tokens.
AUDIT_CONFIG = Seed000Config(vocab_size=8, block_size=4)
#: The same with both LM heads scaled by 300: peaked laws, where a simulation has power.
SHARP_CONFIG = Seed000Config(vocab_size=8, block_size=4, logit_scale=300.0)
#: The seed's prompt.
PROMPT = (1, 2, 3, 4, 5)
N_NEW = 3


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``kernels.probs(logits, temperature)`` over the last axis, for many rows at once.

    The enumeration evaluates hundreds of thousands of rows; the NumPy twin of the kernel
    takes them one at a time. Same formula (max subtracted, float64); equal to rounding.
    """
    z = logits / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def draft_law(drafter: WMixDrafter, fused: np.ndarray, rule: str):
    """Every block the drafter can propose after context ``fused``, with its probability.

    Returns
    -------
    weights : ndarray of shape (N,)
        Probability of each block (they sum to 1).
    blocks : ndarray of shape (N, B), int64
    q : ndarray of shape (N, B, V) or None
        What the rule verifies with (None for the one-hot rule).
    """
    cfg = drafter.config
    V, B = cfg.vocab_size, cfg.block_size
    start = np.full((1, B), cfg.mask_token_id, dtype=np.int64)
    if rule == "independent":
        p = softmax(drafter.logits(fused, start))[0]                  # (B, V)
        blocks = np.array(list(itertools.product(range(V), repeat=B)), dtype=np.int64)
        weights = np.prod(p[np.arange(B), blocks], axis=1)
        return weights, blocks, np.broadcast_to(p, (blocks.shape[0], B, V))
    blocks, masked, weights = start, np.ones((1, B), dtype=bool), np.ones(1)
    for step, count in enumerate(drafter.schedule):
        logits = drafter.logits(fused, blocks)                         # (N, B, V)
        p = softmax(logits)
        fill = softmax(logits, cfg.early_temperature) if step < cfg.denoise_steps - 1 else p
        combos = np.array(list(itertools.product(range(V), repeat=count)), dtype=np.int64)
        picks = np.stack([pick_positions(p[n], masked[n], count) for n in range(len(blocks))])
        rows = np.repeat(np.arange(len(blocks)), len(combos))         # parent of each child
        cols = picks[rows]                                             # (N', count)
        values = np.tile(combos, (len(blocks), 1))                     # (N', count)
        blocks = blocks[rows].copy()
        masked = masked[rows].copy()
        np.put_along_axis(blocks, cols, values, axis=1)
        np.put_along_axis(masked, cols, False, axis=1)
        weights = weights[rows] * np.prod(fill[rows[:, None], cols, values], axis=1)
    q = None if rule == "one_hot" else softmax(drafter.logits(fused, blocks))
    return weights, blocks, q


class _Enumerator:
    """Exact law of the seed's loop with one rule; memoised by (last token, tokens left)."""

    def __init__(self, target: MLPTarget, drafter: WMixDrafter, rule: str) -> None:
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        self.target, self.drafter, self.rule = target, drafter, rule
        self.V = target.config.vocab_size
        self.P = target.probs_table()                                  # (V, V)
        self.hidden = target.run(np.arange(self.V))[1]                 # (V, H)
        self.memo: dict[tuple[int, int], np.ndarray] = {}

    def law(self, last: int, r: int) -> np.ndarray:
        """Dense law (V ** r,) of the next ``r`` tokens after committed token ``last``."""
        if r == 0:
            return np.ones(1)
        key = (last, r)
        if key not in self.memo:
            V, size = self.V, self.V ** (r - 1)
            out = np.zeros(V ** r)
            for t in np.flatnonzero(self.P[last] > 0):                 # t_1 from the target
                tail = np.ones(1) if r == 1 else self._round(last, int(t), r - 1)
                out[t * size:(t + 1) * size] += self.P[last, t] * tail
            self.memo[key] = out
        return self.memo[key]

    def _table(self, r: int) -> np.ndarray:
        return np.stack([self.law(y, r) for y in range(self.V)])      # (V, V ** r)

    def _round(self, last: int, t_1: int, m: int) -> np.ndarray:
        """Law (V ** m,) of the ``m`` tokens after ``t_1``: this block's verification, then on."""
        V, B = self.V, self.drafter.config.block_size
        weights, blocks, q = draft_law(self.drafter, self.drafter.fuse(self.hidden[last], t_1),
                                       self.rule)
        n = np.arange(blocks.shape[0])
        out = np.zeros(V ** m)
        alive, prefix = weights.copy(), np.zeros(blocks.shape[0], dtype=np.int64)
        prev = np.full(blocks.shape[0], t_1)
        for i in range(min(B, m)):
            x = blocks[:, i]
            p = self.P[prev]                                           # (N, V)
            if q is None:
                qx, residual = 1.0, p.copy()
                residual[n, x] = 0.0
            else:
                qx, residual = q[n, i, x], np.maximum(p - q[:, i], 0.0)
            accept = np.minimum(1.0, p[n, x] / qx)
            total = residual.sum(axis=1)
            empty = ~(total > 0)  # only where accept == 1 (as in the kernel: fall back to p)
            residual[empty] = p[empty]
            residual /= residual.sum(axis=1, keepdims=True)
            rest = m - i - 1
            table = self._table(rest)                                  # (V, V ** rest)
            head = (prefix[:, None] * V + np.arange(V)) * V ** rest      # (N, V): prefix, y
            idx = head[:, :, None] + np.arange(V ** rest)
            mass = (alive * (1.0 - accept))[:, None, None] * residual[:, :, None] * table[None]
            out += np.bincount(idx.ravel(), mass.ravel(), minlength=V ** m)
            alive = alive * accept
            prefix = prefix * V + x
            prev = x
        rest = m - min(B, m)                                           # 0, or a new round
        table = self._table(rest)
        idx = (prefix * V ** rest)[:, None] + np.arange(V ** rest)
        out += np.bincount(idx.ravel(), (alive[:, None] * table[prev]).ravel(), minlength=V ** m)
        return out


def _as_law(dense: np.ndarray, V: int, n: int) -> dict:
    return {tuple(int(c) for c in np.unravel_index(i, (V,) * n)): float(dense[i])
            for i in np.flatnonzero(dense)}


def exact_speculative_law(config: Seed000Config = AUDIT_CONFIG, rule: str = "seed",
                          prompt=PROMPT, n_new: int = N_NEW) -> dict:
    """Return ``{continuation: probability}`` of ``n_new`` tokens of the seed's loop, ``rule``."""
    target = MLPTarget(config)
    enum = _Enumerator(target, WMixDrafter(config, target), rule)
    return _as_law(enum.law(int(prompt[-1]), n_new), config.vocab_size, n_new)


def exact_target_law(config: Seed000Config = AUDIT_CONFIG, prompt=PROMPT,
                     n_new: int = N_NEW) -> dict:
    """Return the target's own law of ``n_new`` tokens (fastspec's exact-law oracle)."""
    # The oracle only calls target.forward(ids, hidden_layers=()).logits, which MLPTarget has.
    target = MLPTarget(config)
    return audit.exact_target_law(target, list(prompt), n_new,  # type: ignore[arg-type]
                                         SamplingParams(1.0))


def loop_counts(config: Seed000Config, rule: str, runs: int, seed: int = 0) -> np.ndarray:
    """Counts (V ** 3,) of the 3 tokens of ``runs`` seeded runs of the real loop (kernels)."""
    target = MLPTarget(config)
    drafter = WMixDrafter(config, target)
    V = config.vocab_size
    counts = np.zeros(V ** N_NEW, dtype=np.int64)
    for i in range(runs):
        tokens, _ = speculative_decode(target, drafter, PROMPT, N_NEW,
                                       np.random.default_rng(seed + i), rule)
        counts[(tokens[0] * V + tokens[1]) * V + tokens[2]] += 1
    return counts


def _dense(law: dict, V: int) -> np.ndarray:
    return np.array([law.get(k, 0.0) for k in itertools.product(range(V), repeat=N_NEW)])


def _tvs(config: Seed000Config) -> tuple[dict, dict, dict]:
    truth = exact_target_law(config)
    laws = {rule: exact_speculative_law(config, rule) for rule in RULES}
    tvs = {f"{_KEYS[rule]}_tv": audit.total_variation(truth, law)
           for rule, law in laws.items()}
    tvs.update({f"{_KEYS[rule]}_mass": float(sum(law.values())) for rule, law in laws.items()})
    tvs["target_mass"] = float(sum(truth.values()))
    return tvs, truth, laws


_KEYS = {"seed": "seed_rule", "one_hot": "corrected_rule", "independent": "independent_draft"}


def run_audit(config: Seed000Config = AUDIT_CONFIG, sharp: Seed000Config = SHARP_CONFIG,
              mc_runs: int = 1000, mc_seed: int = 0) -> dict:
    """Exact TV of every rule against the target's law; the real loop checked by simulation.

    ``config`` (default: the seed's models at vocabulary 8, blocks of 4) gives the headline
    ``seed_rule_tv``, ``corrected_rule_tv`` (one-hot) and ``independent_draft_tv``. The seed's
    untrained models are nearly uniform, so a Monte Carlo there cannot tell laws apart; the
    simulation runs on ``sharp`` (the same with both LM heads scaled, peaked laws): ``mc_runs``
    seeded runs of :func:`speculative_decode` per rule (seed, one-hot) must fit the
    ENUMERATED law of that rule (chi-square p >= 1e-3, nothing impossible), which ties the
    enumeration to the loop that runs; the seed rule's runs must also be rejected by the
    TARGET's law (p < 1e-3).
    """
    tvs, _, _ = _tvs(config)
    result = dict(config=dict(vars(config)), prompt=list(PROMPT), n_new=N_NEW,
                  continuations=config.vocab_size ** N_NEW, **tvs,
                  method="exact enumeration of every block fill and verification outcome "
                         "(reduced vocabulary and block: see fastspec.seeds.seed000_audit); "
                         "target law from fastspec.audit.exact_target_law")
    sharp_tvs, truth, laws = _tvs(sharp)
    monte_carlo = {}
    for rule in (("seed", "one_hot") if mc_runs else ()):
        counts = loop_counts(sharp, rule, mc_runs, mc_seed)
        fit = audit.chi_square_test(counts, _dense(laws[rule], sharp.vocab_size))
        vs_target = audit.chi_square_test(counts, _dense(truth, sharp.vocab_size))
        monte_carlo[rule] = dict(runs=mc_runs, p_value_vs_enumerated=fit["p_value"],
                                 df=fit["df"], impossible=fit["impossible_count"],
                                 tv_vs_enumerated=fit["tv"], p_value_vs_target=vs_target["p_value"],
                                 tv_vs_target=vs_target["tv"])
    result["sharpened"] = dict(config=dict(vars(sharp)), **sharp_tvs, monte_carlo=monte_carlo)
    return result
