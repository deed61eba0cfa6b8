"""NgramDrafter: prompt lookup — propose what followed the latest earlier match of the suffix."""
from __future__ import annotations

import numpy as np

from fastspec._checks import check_index
from fastspec.drafters.base import Proposal
from fastspec.sampling import SamplingParams

__all__ = ["NgramDrafter"]


class NgramDrafter:
    """Deterministic drafter that copies from the context (prompt lookup decoding).

    For ``n`` from ``max_ngram`` down to ``min_ngram``, the last ``n`` tokens of the committed
    sequence are looked up among the earlier n-grams of the sequence; at the most recent
    match, the tokens that followed it are proposed (up to ``gamma`` and ``max_proposal``;
    a match that runs into the end of the sequence is continued periodically).
    Without a match the proposal is empty and the round is a plain target step.

    The index maps each n-gram to the position where its latest occurrence ends; it is
    extended incrementally as the committed sequence grows (committed tokens are never
    rolled back), so a round costs ``O(max_ngram)`` dictionary operations plus the new tokens.
    Proposals are deterministic, so ``Proposal.q`` is None (one-hot verification).

    Parameters
    ----------
    max_ngram : int, default 3
    min_ngram : int, default 1
    max_proposal : int, optional
        Cap on proposed tokens per round (default: gamma).
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1,
                 max_proposal: int | None = None) -> None:
        self.max_ngram = check_index(max_ngram, "max_ngram", 1, 64)
        self.min_ngram = check_index(min_ngram, "min_ngram", 1, self.max_ngram)
        self.max_proposal = (None if max_proposal is None
                             else check_index(max_proposal, "max_proposal", 1, 2**31 - 1))
        self.max_gamma = self.max_proposal
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending at positions < _indexed are in the index

    def reset(self, prompt: np.ndarray, hidden=None) -> None:
        """Forget the previous sequence and index the prompt."""
        self._tokens = []
        self._index = {}
        self._indexed = 0
        self._sync(prompt)

    def _sync(self, seq: np.ndarray) -> None:
        toks = self._tokens
        n = seq.shape[0]
        if n < len(toks):  # rewound without a reset: rebuild
            self._tokens, self._index, self._indexed = [], {}, 0
            toks = self._tokens
        if n > len(toks):
            toks.extend(seq[len(toks):n].tolist())
        # Index n-grams ending before the last position: the suffix itself must not match
        # its own occurrence, and a match needs at least one following token.
        index = self._index
        lo, hi = self.min_ngram, self.max_ngram
        for end in range(self._indexed, n - 1):
            for size in range(lo, min(hi, end + 1) + 1):
                index[tuple(toks[end - size + 1:end + 1])] = end
        self._indexed = max(self._indexed, n - 1)

    def lookup(self, seq: np.ndarray, gamma: int) -> np.ndarray:
        """Return the proposal for ``seq`` (1-D int64, possibly empty)."""
        self._sync(seq)
        toks = self._tokens
        n = len(toks)
        if self.max_proposal is not None:
            gamma = min(gamma, self.max_proposal)
        index = self._index
        for size in range(min(self.max_ngram, n), self.min_ngram - 1, -1):
            end = index.get(tuple(toks[n - size:]))
            if end is not None:
                out = toks[end + 1:end + 1 + gamma]
                # A match close to the end implies a period: keep copying the proposal itself.
                period = n - 1 - end
                while len(out) < gamma:
                    out.append(out[len(out) - period])
                return np.array(out, dtype=np.int64)
        return np.zeros(0, dtype=np.int64)

    def propose(self, seq: np.ndarray, gamma: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Propose up to ``gamma`` tokens copied from the latest match (``q`` is None)."""
        return Proposal(self.lookup(seq, gamma), None)

    def commit(self, seq: np.ndarray, n_accepted: int, hidden=None) -> None:
        """Index the newly committed tokens."""
        self._sync(seq)

    def __repr__(self) -> str:
        return (f"NgramDrafter(max_ngram={self.max_ngram}, min_ngram={self.min_ngram}, "
                f"max_proposal={self.max_proposal})")
