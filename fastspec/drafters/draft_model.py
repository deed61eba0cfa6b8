"""DraftModelDrafter: a small autoregressive model proposes tokens sampled from its own q."""
from __future__ import annotations

import numpy as np

from fastspec import kernels
from fastspec.drafters.base import Proposal, SamplingParams

__all__ = ["DraftModelDrafter"]


class DraftModelDrafter:
    """Propose ``gamma`` tokens with a small causal model that keeps its own KV cache.

    The draft cache always holds a prefix of the committed sequence (plus, during
    :meth:`propose`, the tokens being drafted). After a round it is cropped to what is still
    valid; after a fully accepted block it lags the committed sequence by one token (the last
    proposal was never fed), and the next :meth:`propose` catches up in the same forward call
    that drafts the first token.

    Proposals use the target's sampling settings: argmax at temperature 0 (then ``q`` is None,
    the proposal is deterministic), otherwise a draw from
    ``q = kernels.probs(logits, temperature, top_k, top_p)``, returned as ``Proposal.q``.

    Parameters
    ----------
    model : Transformer
        Must share the target's vocabulary.

    Notes
    -----
    No tree proposals (issue 16 lists them as optional here). The verifier would take them as
    they are (siblings drawn without replacement from ``q`` with their rows reported, see
    :func:`fastspec.decoding.tree.sample_tree_without_replacement`), but every branch needs its own draft
    forwards: ``Transformer.step(tree_parents=...)`` scores a tree hanging off a linear cache
    in one call, so growing one level at a time re-feeds the whole tree so far (about depth x
    nodes draft positions per round, in the fused runner). The embedded draft model's
    chain already breaks even at best (docs/RESULTS.md), so that cost was not spent.

    Attributes
    ----------
    cache : KVCache
        The draft model's cache.
    forward_calls, forward_positions, score_cells : int
        Cumulative workload counters (read by :func:`fastspec.speculative_generate`).
    """

    hidden_layers: tuple[int, ...] = ()
    max_gamma: int | None = None

    def __init__(self, model) -> None:
        if not hasattr(model, "step") or not hasattr(model, "new_cache"):
            raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
        self.model = model
        self.cache = model.new_cache()
        cfg = model.config
        self._vocab = cfg.vocab_size
        self._cells_per = cfg.n_layers * cfg.n_heads
        self._q = np.empty((0, self._vocab), dtype=np.dtype(cfg.dtype))
        self._tokens = np.empty(0, dtype=np.int64)
        self._step = np.empty(1, dtype=np.int64)
        self._step_logits = np.empty((1, self._vocab), dtype=np.dtype(cfg.dtype))
        self.forward_calls = 0
        self.forward_positions = 0
        self.score_cells = 0

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def check_target(self, target) -> None:
        """Raise ValueError unless ``target`` has the draft model's vocabulary size (the two must
        share a tokenizer). Called by :func:`fastspec.speculative_generate` before any work."""
        got = getattr(getattr(target, "config", None), "vocab_size", None)
        if got != self._vocab:
            raise ValueError(f"the draft model's vocabulary ({self._vocab} ids) differs from the "
                             f"target's ({got} ids): a draft model must share the target's "
                             "tokenizer")

    def _scratch(self, gamma: int) -> None:
        if self._tokens.shape[0] < gamma:
            self._tokens = np.empty(gamma, dtype=np.int64)
            self._q = np.empty((gamma, self._vocab), dtype=self._q.dtype)

    def reset(self, prompt: np.ndarray, hidden=None) -> None:
        """Forget the previous sequence and prefill the prompt but its last token.

        Prefilling here, not in the first :meth:`propose`, puts the draft model's prompt pass
        where the target's is (``stats.prefill_s``), outside the decoding rounds.
        """
        if prompt.shape[0] > self.cache.capacity:
            raise ValueError(f"prompt has {prompt.shape[0]} tokens, more than the draft model's "
                             f"max_seq_len {self.cache.capacity}")
        self.cache.reset()
        if prompt.shape[0] > 1:
            self._forward(prompt[:-1], logit_rows=0)  # no logits: the cache is the point

    def _forward(self, ids: np.ndarray, out: np.ndarray | None = None,
                 logit_rows: int | None = None) -> np.ndarray:
        cache = self.cache
        past = cache.length
        logits = self.model.step(ids, cache, out=out, logit_rows=logit_rows).logits
        n = ids.shape[0]
        self.forward_calls += 1
        self.forward_positions += n
        self.score_cells += self._cells_per * n * (past + n)
        return logits

    def propose(self, seq: np.ndarray, gamma: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Draft up to ``gamma`` tokens after ``seq`` (fewer only if the draft cache is full).

        Returns
        -------
        Proposal
            ``tokens`` (g,) int64 and ``q`` (g, V) (a view of a reused buffer, valid until
            the next call), or ``q=None`` at temperature 0.
        """
        n = seq.shape[0]
        cache = self.cache
        if cache.length >= n:  # the caller rewound the sequence without a reset
            cache.crop(max(n - 1, 0))
        # The cache must hold every drafted position but the last: n + g - 1 <= capacity.
        gamma = min(gamma, cache.capacity - n + 1)
        if gamma <= 0:
            return Proposal(self._tokens[:0].copy(), None)
        self._scratch(gamma)
        tokens, qbuf = self._tokens, self._q
        greedy = sampling.temperature == 0.0
        logits = self._forward(seq[cache.length:n])
        step = self._step
        for i in range(gamma):
            row = logits[-1:]
            if greedy:
                token = int(row[0].argmax())
            else:
                q = kernels.probs(row, sampling.temperature, sampling.top_k, sampling.top_p)
                qbuf[i] = q[0]
                token = self._choose(qbuf[i], rng)
            tokens[i] = token
            if i + 1 < gamma:
                step[0] = token
                logits = self._forward(step, self._step_logits)
        return Proposal(tokens[:gamma].copy(), None if greedy else qbuf[:gamma])

    def _choose(self, q: np.ndarray, rng: np.random.Generator) -> int:
        """Draw the proposal from ``q`` (V,) with one uniform (inverse CDF)."""
        return int(kernels.sample(q, rng.random()))

    def commit(self, seq: np.ndarray, n_accepted: int, hidden=None) -> None:
        """Crop the draft cache to the part of it that the committed ``seq`` confirms."""
        # Positions up to the last accepted token are valid; the correction/bonus (seq[-1])
        # was never fed, so at most len(seq) - 1 positions survive.
        keep = seq.shape[0] - 1
        if self.cache.length > keep:
            self.cache.crop(keep)

    def __repr__(self) -> str:
        return f"DraftModelDrafter({self.model!r})"
