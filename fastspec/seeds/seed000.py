"""Seed 000 reproduced on fastspec: the NumPy DFlash toy, its decoding loop and its timing table.

The system of seed 000, written with fastspec's kernels (:func:`fastspec.kernels.probs` for
every softmax with temperature, :func:`fastspec.kernels.sample` for every draw,
:func:`fastspec.kernels.verify_rejection` for every verification):

- :class:`MLPTarget`: a context-free target, ``logits = relu-MLP(embed[token]) @ lm_head``
  (vocabulary 1000, width 64, 4 layers); the next-token law depends on the last token only.
- :class:`WMixDrafter`: the block drafter: KV injection of the target's last hidden state
  plus the embedding of the token the target just sampled (``t_1``), learned positional
  embeddings, a concat-projection, and the ``W_mix`` (block x block) sequence-mixing matrix.
- Denoising (:func:`seed_schedule`): all-MASK block, two steps in confidence order (half the
  positions, then the rest); fills of every step but the last are drawn at temperature 0.8.
- The seed's loop (:func:`speculative_decode`): the target samples ``t_1``, the drafter
  drafts a block of 8 after it, one target forward verifies it; a rejection emits the
  correction, a fully accepted block no bonus.

The acceptance rule is selectable (``rule``):

- ``"seed"``: the seed's own rule, ``q`` = the probabilities of one more forward over the
  filled block. The fills were not drawn from that ``q`` (they were drawn step by step, the
  first ones sharpened), so this rule is LOSSY;
- ``"one_hot"``: the corrected rule for an order-dependent fill, the proposal treated as
  deterministic (accept ``x`` with ``p(x)``, else draw from ``p`` without ``x``): lossless,
  and the final forward is no longer needed;
- ``"independent"``: the other correction, a one-step draft whose positions are drawn
  independently from the all-MASK forward, verified with those per-position ``q``: lossless.

The exact audit of the rules is :mod:`fastspec.seeds.seed000_audit`, the timing table
:mod:`fastspec.seeds.seed000_timing`. Weights are drawn with the
seed's recipe (``numpy.random.RandomState(42)`` for the target, ``789`` for the drafter, same
shapes, scales and order), so with ``--seed-file`` the seed's own code computes the same
logits and is timed beside this one.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from fastspec.decoding import DecodeStats
from fastspec.model import ForwardOutput
from fastspec import kernels

__all__ = ["Seed000Config", "MLPTarget", "WMixDrafter", "Clock", "seed_schedule",
           "pick_positions", "vanilla_decode", "speculative_decode", "RULES"]

#: Acceptance rules of :func:`speculative_decode`.
RULES = ("seed", "one_hot", "independent")


@dataclass(frozen=True)
class Seed000Config:
    """Sizes and seeds of seed 000's system (defaults: the seed's).

    Attributes
    ----------
    vocab_size, hidden_dim, n_layers : int
        Target (and drafter) vocabulary, width, and number of target layers.
    block_size : int
        Draft tokens per block (the size of ``W_mix``).
    denoise_steps : int
        Denoising steps (fills of every step but the last drawn at ``early_temperature``).
    mask_token_id : int
        The MASK id (an ordinary token id too, as in the seed).
    early_temperature : float
        Temperature of the early denoising fills.
    target_seed, draft_seed : int
        ``numpy.random.RandomState`` seeds of the weights.
    logit_scale : float
        Multiplies both LM heads (1.0: the seed). The seed's untrained models are nearly
        uniform; a larger scale gives peaked, trained-like distributions to the audit.
    """

    vocab_size: int = 1000
    hidden_dim: int = 64
    n_layers: int = 4
    block_size: int = 8
    denoise_steps: int = 2
    mask_token_id: int = 0
    early_temperature: float = 0.8
    target_seed: int = 42
    draft_seed: int = 789
    logit_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_dim", "n_layers", "block_size", "denoise_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id must be in [0, {self.vocab_size}), "
                             f"got {self.mask_token_id}")
        if not (math.isfinite(self.logit_scale) and self.logit_scale > 0):
            raise ValueError(f"logit_scale must be > 0, got {self.logit_scale}")
        if not self.early_temperature > 0:
            raise ValueError(f"early_temperature must be > 0, got {self.early_temperature}")


class MLPTarget:
    """Seed 000's context-free target: a ReLU MLP over each token's embedding.

    Parameters
    ----------
    config : Seed000Config
    """

    def __init__(self, config: Seed000Config) -> None:
        self.config = config
        H, V = config.hidden_dim, config.vocab_size
        rng = np.random.RandomState(config.target_seed)
        self.layers = [rng.randn(H, H) * 0.1 for _ in range(config.n_layers)]
        self.lm_head = rng.randn(H, V) * 0.1 * config.logit_scale
        self.token_embed = rng.randn(V, H) * 0.1

    def run(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(logits (n, V), hidden (n, H))`` of the positions ``ids`` (position-wise)."""
        h = self.token_embed[np.asarray(ids, dtype=np.int64)]
        for i, w in enumerate(self.layers):
            h = h @ w
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return np.ascontiguousarray(h @ self.lm_head), h

    def forward(self, ids, cache=None, hidden_layers=()) -> ForwardOutput:
        """``Transformer.forward``'s shape of result, for fastspec's exact-law oracles."""
        return ForwardOutput(self.run(ids)[0], {})

    def probs_table(self) -> np.ndarray:
        """Return ``P`` of shape (V, V): ``P[x]`` is the next-token law after token ``x``."""
        return kernels.probs(self.run(np.arange(self.config.vocab_size))[0], 1.0)


class WMixDrafter:
    """Seed 000's block drafter: KV injection, positional embeddings and ``W_mix`` mixing.

    Parameters
    ----------
    config : Seed000Config
    target : MLPTarget
        Supplies the embedding of ``t_1`` fused into the context.
    """

    def __init__(self, config: Seed000Config, target: MLPTarget) -> None:
        self.config, self.target = config, target
        H, V, B = config.hidden_dim, config.vocab_size, config.block_size
        rng = np.random.RandomState(config.draft_seed)
        self.w_proj = rng.randn(H, H) * 0.1
        self.w_block = rng.randn(2 * H, H) * 0.2
        self.w_mix = rng.randn(B, B) * 0.1
        self.pos_embed = rng.randn(B, H) * 0.1
        self.lm_head = rng.randn(H, V) * 0.1 * config.logit_scale
        self.token_embed = rng.randn(V, H) * 0.1
        self.schedule = seed_schedule(B, config.denoise_steps)

    def fuse(self, target_hidden: np.ndarray, t_1: int) -> np.ndarray:
        """Context of a block: the target's last hidden state plus the embedding of ``t_1``."""
        return target_hidden + self.target.token_embed[t_1]

    def logits(self, fused: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Block logits of shape (N, B, V) for contexts ``fused`` (H,) or (N, H), blocks (N, B)."""
        H = self.config.hidden_dim
        ctx = np.atleast_2d(fused) @ self.w_proj                      # (N or 1, H)
        emb = self.token_embed[blocks] + self.pos_embed               # (N, B, H)
        # concat([ctx, emb]) @ w_block, split so the context row is projected once per block.
        hidden = (ctx @ self.w_block[:H])[:, None, :] + emb @ self.w_block[H:]
        hidden = np.maximum(np.einsum("ij,njh->nih", self.w_mix, hidden), 0.0)
        return hidden @ self.lm_head

    def step_probs(self, fused, blocks, temperature: float = 1.0) -> np.ndarray:
        """``kernels.probs`` of :meth:`logits`, shape (N, B, V)."""
        logits = self.logits(fused, blocks)
        n, b, v = logits.shape
        return kernels.probs(np.ascontiguousarray(logits.reshape(n * b, v)),
                             temperature).reshape(n, b, v)

    def draft(self, fused: np.ndarray, rng: np.random.Generator, rule: str = "seed"):
        """Draft one block; return ``(tokens (B,) int64, q (B, V) or None, forwards)``.

        ``q`` is what the rule verifies with: the final forward's probabilities ("seed"),
        None ("one_hot"), or the all-MASK forward's probabilities ("independent").
        """
        cfg = self.config
        block = np.full((1, cfg.block_size), cfg.mask_token_id, dtype=np.int64)
        if rule == "independent":
            p = self.step_probs(fused, block)[0]
            tokens = np.array([kernels.sample(row, rng.random()) for row in p], dtype=np.int64)
            return tokens, p, 1
        masked = np.ones(cfg.block_size, dtype=bool)
        forwards = 0
        for step, count in enumerate(self.schedule):
            logits = self.logits(fused, block)[0]
            forwards += 1
            p = kernels.probs(np.ascontiguousarray(logits), 1.0)
            fill = (kernels.probs(np.ascontiguousarray(logits), cfg.early_temperature)
                    if step < cfg.denoise_steps - 1 else p)
            for j in pick_positions(p, masked, count):
                block[0, j] = kernels.sample(fill[j], rng.random())
                masked[j] = False
        if rule == "one_hot":
            return block[0], None, forwards
        return block[0], self.step_probs(fused, block)[0], forwards + 1


def seed_schedule(block_size: int, steps: int) -> list[int]:
    """Positions unmasked per step, as the seed: ``max(1, remaining // steps_left)``, last all."""
    counts, remaining = [], block_size
    for step in range(steps):
        if remaining == 0:
            break
        n = remaining if step == steps - 1 else max(1, remaining // (steps - step))
        counts.append(n)
        remaining -= n
    return counts


def pick_positions(p: np.ndarray, masked: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` masked positions of highest confidence ``max p`` (ties: lower index)."""
    conf = p.max(axis=-1).astype(np.float64)
    conf[~masked] = -np.inf
    return np.argsort(-conf, kind="stable")[:count]


@dataclass
class Clock:
    """Seconds spent in target forwards and in drafting, accumulated by the decoding loops."""

    target_s: float = 0.0
    draft_s: float = 0.0


def vanilla_decode(target: MLPTarget, prompt, max_new_tokens: int,
                   rng: np.random.Generator) -> tuple[list[int], DecodeStats]:
    """Sample ``max_new_tokens`` from the target, one target call per token."""
    stats = DecodeStats()
    begin = time.perf_counter()
    last = int(prompt[-1])
    tokens = []
    for _ in range(max_new_tokens):
        # Position-wise target: the newest position is all a step needs (no prefix recompute).
        logits, _ = target.run([last])
        last = int(kernels.sample(kernels.probs(logits, 1.0)[0], rng.random()))
        tokens.append(last)
    stats.new_tokens = stats.rounds = stats.target_calls = stats.target_positions = len(tokens)
    stats.elapsed_s = time.perf_counter() - begin
    return tokens, stats


def speculative_decode(target: MLPTarget, drafter: WMixDrafter, prompt, max_new_tokens: int,
                       rng: np.random.Generator, rule: str = "seed",
                       clock: Clock | None = None) -> tuple[list[int], DecodeStats]:
    """The seed's DFlash loop: target samples ``t_1``, drafter drafts a block, target verifies.

    Parameters
    ----------
    target : MLPTarget
    drafter : WMixDrafter
    prompt : sequence of int
    max_new_tokens : int
    rng : numpy.random.Generator
        Every uniform (target samples, draft fills, verification) comes from it.
    rule : {"seed", "one_hot", "independent"}
        Acceptance rule (see the module docstring); only "seed" is lossy.
    clock : optional
        Accumulates the time spent in target and drafter forwards.

    Returns
    -------
    tokens : list of int
    stats : fastspec.DecodeStats
        ``target_calls`` counts the ``t_1`` forwards and the verifications (the seed's
        "target forwards"); ``accepted`` counts accepted draft tokens (corrections excluded).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    B = drafter.config.block_size
    stats = DecodeStats()
    clock = clock if clock is not None else Clock()
    begin = time.perf_counter()
    last = int(prompt[-1])
    out: list[int] = []
    while len(out) < max_new_tokens:
        t0 = time.perf_counter()
        logits, hidden = target.run([last])
        clock.target_s += time.perf_counter() - t0
        stats.target_calls += 1
        stats.target_positions += 1
        t_1 = int(kernels.sample(kernels.probs(logits, 1.0)[0], rng.random()))
        out.append(t_1)
        if len(out) == max_new_tokens:
            break
        t0 = time.perf_counter()
        tokens, q, forwards = drafter.draft(drafter.fuse(hidden[-1], t_1), rng, rule)
        t1 = time.perf_counter()
        verify_logits, _ = target.run(np.concatenate([[t_1], tokens]))
        clock.draft_s += t1 - t0
        clock.target_s += time.perf_counter() - t1
        stats.draft_calls += forwards
        stats.target_calls += 1
        stats.target_positions += B + 1
        n_acc, nxt = kernels.verify_rejection(tokens, kernels.probs(verify_logits, 1.0), q,
                                              rng.random(B + 1))
        # A rejection emits the correction; a fully accepted block no bonus (the seed's loop).
        emitted = tokens[:n_acc].tolist() + ([int(nxt)] if n_acc < B else [])
        out.extend(emitted[:max_new_tokens - len(out)])
        last = out[-1]
        stats.rounds += 1
        stats.drafted += B
        stats.accepted += int(n_acc)
    stats.new_tokens = len(out)
    stats.elapsed_s = time.perf_counter() - begin
    return out, stats


# --- the command: audit + timing table -------------------------------------------------------

#: The seed's prompt, tokens per run and number of timed runs.
PROMPT = (1, 2, 3, 4, 5)
NEW_TOKENS = 20
RUNS = 10
#: Strings and names that identify the seed 000 document (``--seed-file``).
SEED_MARKERS = ("class DFlashDraftModel", "W_mix", "def vanilla_generate",
                "_block_diffusion_draft")
SEED_NAMES = ("TargetModel", "DFlashDraftModel", "DFlashDecoder", "vanilla_generate")
#: A lossless rule's exact TV must be below this (float64 rounding); the seed's above LOSSY.
EXACT_TOL = 1e-12
LOSSY = 1e-3
