"""DecodeStats and GenerationResult: what a generation did, so that a speedup can be explained."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DecodeStats", "GenerationResult"]


@dataclass
class DecodeStats:
    """Counters of one generation: what was done, so that a speedup can be explained.

    Attributes
    ----------
    new_tokens : int
        Tokens emitted (``len(result.tokens)``).
    rounds : int
        Target verification calls after the prefill (one per emitted token for vanilla
        decoding; one per draft/verify round for speculative decoding).
    drafted, accepted : int
        Draft tokens proposed and accepted, over all rounds.
    target_calls, draft_calls : int
        Forward calls of the target (prefill included) and of the drafter's model (for
        drafters without a model: ``propose`` calls).
    target_positions, draft_positions : int
        Positions pushed through each model.
    target_score_cells, draft_score_cells : int
        Attention score cells computed, ``n_layers * n_heads * n * (past + n)`` per call.
    elapsed_s : float
        Wall time of the whole call, prefill included.
    prefill_s : float
        Wall time before the decoding loop: the prompt's forward (and the drafter's reset,
        which builds its own context). ``elapsed_s - prefill_s`` is the decoding time.
    proposed_at, accepted_at : ndarray of shape (max_gamma,), int64
        ``proposed_at[i]``: rounds whose proposal had a token at block position ``i``;
        ``accepted_at[i]``: rounds in which that token was accepted.
    trace : list of dict or None
        Per-round records when requested (``trace=True``).
    """

    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    target_positions: int = 0
    draft_positions: int = 0
    target_score_cells: int = 0
    draft_score_cells: int = 0
    elapsed_s: float = 0.0
    prefill_s: float = 0.0
    proposed_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trace: list | None = None

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens emitted per target verification call (1.0 for vanilla decoding)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Emitted tokens per second of wall time."""
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else math.inf

    @property
    def decode_s(self) -> float:
        """Wall time after the prefill (``elapsed_s - prefill_s``)."""
        return self.elapsed_s - self.prefill_s

    @property
    def per_position_acceptance(self) -> np.ndarray:
        """``accepted_at / proposed_at`` (NaN where nothing was proposed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.accepted_at / self.proposed_at

    def to_dict(self) -> dict[str, Any]:
        """Return every counter and derived figure as JSON-serialisable values."""
        d = {name: getattr(self, name) for name in (
            "new_tokens", "rounds", "drafted", "accepted", "target_calls", "draft_calls",
            "target_positions", "draft_positions", "target_score_cells", "draft_score_cells",
            "elapsed_s", "prefill_s", "decode_s", "mean_accepted_length", "acceptance_rate",
            "tokens_per_s")}
        d["proposed_at"] = self.proposed_at.tolist()
        d["accepted_at"] = self.accepted_at.tolist()
        if self.trace is not None:
            d["trace"] = self.trace
        return d


@dataclass
class GenerationResult:
    """Result of :func:`generate` / :func:`speculative_generate`.

    Attributes
    ----------
    tokens : list of int
        The new tokens only (an ``eos_token_id`` that stopped generation is included).
    stats : DecodeStats
    """

    tokens: list[int]
    stats: DecodeStats


# --- validation ------------------------------------------------------------------------------
