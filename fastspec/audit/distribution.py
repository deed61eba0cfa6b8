"""The seeded distribution audit: many real speculative runs against the exact target law.

The toy target (vocabulary 8) continues :data:`DIST_PREFIX` by 3 tokens; every one of the
512 continuations has its exact probability from :mod:`fastspec.audit.oracle`. Runs go
through the real decoding loop, drafters, kernels and random streams; a chi-square test and
the count of impossible continuations decide. The negative controls (a verifier that
resamples from p instead of the residual, a drafter reporting a q other than the one it drew
from) must fail the same test.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from fastspec import kernels
from fastspec.audit.oracle import exact_continuation_probs
from fastspec.audit.registry import ALPHA, DRAFTERS, PREFIX
from fastspec.audit.stats import chi_square_test
from fastspec.decoding import plan_speculative, run_plan
from fastspec.drafters.base import Proposal
from fastspec.decoding.sampling import SamplingParams
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.model import ForwardOutput, ModelConfig, Transformer

__all__ = ["MemoModel", "ArgmaxDraftModelDrafter", "WrongQDrafter", "broken_verify_rejection",
           "DIST_SETTINGS", "distribution_audit", "dist_drafters"]


# --- a model with memoised logits, for the many short distribution runs ---------------------

class MemoCache:
    """KV-cache stand-in for :class:`MemoModel`: remembers the tokens of its positions."""

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


class MemoModel:
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

    def new_cache(self, capacity=None) -> MemoCache:
        return MemoCache(self.config.max_seq_len if capacity is None else capacity)

    def check_cache(self, cache) -> None:
        if not isinstance(cache, MemoCache):
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

    def step(self, ids, cache, *, hidden_layers=(), out=None, logit_rows=None):
        if logit_rows is None:
            return self.forward(ids, cache, hidden_layers, out)
        result = self._forward(ids, cache, hidden_layers)
        result.logits = result.logits[result.logits.shape[0] - logit_rows:]
        if out is not None:
            out[...] = result.logits
            result.logits = out
        return result

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
                return ForwardOutput(hit, {})
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
        return ForwardOutput(logits, hidden)


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


# --- the audit ------------------------------------------------------------------------------

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
    :class:`MemoModel` for speed). Run ``i`` uses seed ``base_seed + i``.
    """
    target_model = Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed)
    exact = exact_continuation_probs(target_model, DIST_PREFIX, DIST_NEW_TOKENS, sampling)
    target = MemoModel(target_model)
    cache = target.new_cache()
    vocab = target.config.vocab_size
    counts = np.zeros(vocab ** DIST_NEW_TOKENS, dtype=np.int64)
    prompt = np.array(DIST_PREFIX, dtype=np.int64)
    t0 = time.perf_counter()
    rounds = drafted = accepted = 0
    # One validated plan, many seeded runs: the loop is the public one minus re-validation.
    plan = plan_speculative(target, drafter, prompt, DIST_NEW_TOKENS, gamma, sampling.temperature,
                 sampling.top_k, sampling.top_p, 0, None, cache)
    default_rng = np.random.default_rng
    for i in range(samples):
        res = run_plan(plan, default_rng(base_seed + i), False, None, verifier)
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


def dist_drafters(seed: int = DIST_SEED) -> dict[str, Any]:
    draft = MemoModel(Transformer.random(ModelConfig.toy(n_layers=1, dtype="float64"), seed))
    target = Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed)
    out = {name: factory(target, draft) for name, factory in DRAFTERS.items()}
    out["draft_model_argmax"] = ArgmaxDraftModelDrafter(draft)
    return out
