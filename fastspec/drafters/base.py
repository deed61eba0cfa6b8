"""The Target and Drafter protocols: what the speculative loop asks of its two models.

The loop (``fastspec.speculative_generate``) keeps this invariant between rounds: the target's
cache holds the committed sequence ``seq`` minus its last token (``len(seq) - 1`` positions).
Each round:

1. ``proposal = drafter.propose(seq, gamma, sampling, rng)``: up to ``gamma`` tokens that
   would follow ``seq``; ``proposal.q`` is the per-position distribution they were sampled
   from, or None for deterministic proposals (verified with the one-hot rule). A
   :class:`fastspec.decoding.tree.TreeProposal` adds ``parents``: a tree of depth <= ``gamma`` whose
   nodes the target scores in one forward (each seeing its ancestors only); the accepted
   path is kept and the drafter's ``hidden`` rows are the root's and that path's.
2. The target runs ``[seq[-1], *proposal.tokens]`` (g + 1 positions) in one forward, also
   returning the hidden states of ``drafter.hidden_layers``.
3. Verification accepts ``n_accepted`` tokens and yields ``next_token`` (correction or bonus).
   The target cache is cropped to ``len(seq) + n_accepted``.
4. ``drafter.commit(new_seq, n_accepted, hidden)``: ``new_seq = seq + accepted + [next_token]``;
   ``hidden[l]`` holds the target layer-``l`` outputs of the ``n_accepted + 1`` positions that
   became committed context (``seq[-1]`` and the accepted tokens), so drafters that read the
   target's hidden states (DFlash) are fed without a second target call.

At the start, ``drafter.reset(prompt, hidden)`` receives the prompt and the hidden states of
its first ``len(prompt) - 1`` positions (the target's prefill).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol, runtime_checkable

import numpy as np

from fastspec.kernels.cache import KVCache
from fastspec.kernels.tree_shape import chain_parents, check_parents

if TYPE_CHECKING:  # annotations only: the model module does not import the protocols
    from fastspec.model.config import ModelConfig
    from fastspec.model.output import ForwardOutput

__all__ = ["Drafter", "Proposal", "Target", "TreeProposal", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution is formed: temperature -> top-k -> top-p.

    ``temperature == 0`` is greedy decoding. Drafters that sample use the same settings.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Proposal:
    """Tokens proposed by a drafter for one round.

    Attributes
    ----------
    tokens : ndarray of shape (g,), int64
        Proposed continuation, ``0 <= g <= gamma``.
    q : ndarray of shape (g, V) or None
        Distribution each token was sampled from; None for deterministic proposals.
    """

    tokens: np.ndarray
    q: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@runtime_checkable
class Drafter(Protocol):
    """What :func:`fastspec.speculative_generate` needs from a drafter."""

    #: Target layers whose hidden states the drafter consumes (empty for most drafters).
    hidden_layers: tuple[int, ...]
    #: Largest block the drafter can propose in one round (None: unbounded).
    max_gamma: int | None

    def reset(self, prompt: np.ndarray, hidden: dict[int, np.ndarray] | None) -> None:
        """Start a new generation from ``prompt`` (1-D int64)."""

    def propose(self, seq: np.ndarray, gamma: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Propose up to ``gamma`` tokens following the committed sequence ``seq``."""

    def commit(self, seq: np.ndarray, n_accepted: int,
               hidden: dict[int, np.ndarray] | None) -> None:
        """Learn the verification result; ``seq`` is the new committed sequence."""


@runtime_checkable
class Target(Protocol):
    """What :func:`fastspec.generate` and :func:`fastspec.speculative_generate` need from the
    model being decoded (:class:`fastspec.Transformer` is one; the audit's memoised model is
    another)."""

    #: Shape and sampling-relevant sizes (``vocab_size``, ``dim``, ``n_layers``, ``n_heads``,
    #: ``max_seq_len``, ``dtype``).
    config: ModelConfig

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """Return an empty cache for this model."""

    def check_cache(self, cache: KVCache) -> None:
        """Raise TypeError/ValueError unless ``cache`` fits this model."""

    def check_hidden_layers(self, hidden_layers: Iterable[int]) -> tuple[int, ...]:
        """Return the sorted, non-negative layer indices of ``hidden_layers``."""

    def step(self, ids, cache: KVCache, *, hidden_layers: Iterable[int] = (),
             out: np.ndarray | None = None, tree_parents: np.ndarray | None = None,
             logit_rows: int | None = None) -> ForwardOutput:
        """Append ``ids`` to ``cache`` and return their logits (and requested hidden states);
        with ``tree_parents``, the new positions form a tree (needed for tree proposals only);
        with ``logit_rows``, only the logits of the last ``logit_rows`` positions (the
        prefills ask for 1 or 0)."""

    def forward(self, ids, cache: KVCache | None = None, hidden_layers: Iterable[int] = (),
                out: np.ndarray | None = None) -> ForwardOutput:
        """:meth:`step`, or a whole sequence on a temporary cache when ``cache`` is None."""


@dataclass
class TreeProposal(Proposal):
    """A drafter's tree: ``tokens[i]`` under ``parents[i]`` (-1: the root), topological order.

    Attributes
    ----------
    tokens : ndarray of shape (N,), int64
    q : ndarray of shape (N, V) or None
        The distribution node ``i`` was drawn from given its path and its earlier siblings
        (independently, or without replacement: see the module notes), or None for
        deterministic nodes (one-hot rule).
    parents : ndarray of shape (N,), int64
    """

    parents: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, np.ndarray) or self.tokens.ndim != 1:
            raise ValueError("tokens must be a 1-D ndarray")
        self.depths = check_parents(self.parents, self.tokens.shape[0])

    @property
    def depth(self) -> int:
        """Length of the longest root-to-node path (0 for an empty tree)."""
        return int(self.depths.max()) if self.depths.size else 0

    def is_chain(self) -> bool:
        """True when ``parents`` is ``[-1, 0, 1, ...]``."""
        return bool(np.array_equal(self.parents, chain_parents(self.tokens.shape[0])))
