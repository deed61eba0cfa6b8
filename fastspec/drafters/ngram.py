"""NgramDrafter: prompt lookup — propose what followed the latest earlier match of the suffix."""
from __future__ import annotations

import numpy as np

from fastspec.kernels.checks import check_index
from fastspec.drafters.base import Proposal, SamplingParams, TreeProposal
from fastspec.kernels.tree_shape import MAX_TREE_NODES

__all__ = ["NgramDrafter", "TUNED_NGRAM"]

#: ``max_ngram`` and ``min_ngram`` of :meth:`NgramDrafter.tuned`, the n-gram drafter of
#: ``fastspec demo`` and ``eval`` (chain and tree), ``generate --drafter ngram`` and the
#: llama.cpp comparison.
TUNED_NGRAM = {"max_ngram": 8, "min_ngram": 3}


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
    tree : bool, default False
        Offer up to ``max_branches`` continuations (the most recent matches of the longest
        suffix first, then of shorter ones) as a tree of shared prefixes
        (:class:`fastspec.decoding.tree.TreeProposal`) when the context has several; a chain when
        they agree.
    max_branches : int, default 4
        Continuations per tree.
    max_tree_nodes : int, default 64
        Node budget of a tree (later continuations are cut to fit).
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1,
                 max_proposal: int | None = None, tree: bool = False, max_branches: int = 4,
                 max_tree_nodes: int = 64) -> None:
        self.max_ngram = check_index(max_ngram, "max_ngram", 1, 64)
        self.min_ngram = check_index(min_ngram, "min_ngram", 1, self.max_ngram)
        self.max_proposal = (None if max_proposal is None
                             else check_index(max_proposal, "max_proposal", 1, 2**31 - 1))
        self.max_gamma = self.max_proposal
        self.tree = bool(tree)
        self.max_branches = check_index(max_branches, "max_branches", 1, MAX_TREE_NODES)
        self.max_tree_nodes = (check_index(max_tree_nodes, "max_tree_nodes", 1, MAX_TREE_NODES)
                               if self.tree else None)
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._ends: dict[tuple[int, ...], list[int]] = {}  # tree mode: every occurrence
        self._indexed = 0  # n-grams ending at positions < _indexed are in the index

    @classmethod
    def tuned(cls, **kwargs) -> NgramDrafter:
        """The n-gram drafter fastspec's commands use: suffixes of 8 down to 3 tokens.

        A one- or two-token suffix matches almost everywhere and predicts little: on the
        SmolLM2 Q4_1 file's grounded requests (greedy, gamma 7, suffixes up to 8), rounds
        drafted from a one-token match accepted 0.51 of 7 tokens on average (77% none), from a
        two-token match 2.10, from three tokens or more 5-6. Where a verified position costs
        a sizeable part of a decode step (AVX2 and Zen 4 CPUs: 0.2-0.5), the weak matches
        cost more than they give. Measured 2026-12-04 on an AMD EPYC Zen 4 (1 thread, greedy,
        gamma 7, median speedup over vanilla; max_ngram 3 / min_ngram 1 before): SmolLM2
        grounded 1.00-1.04x -> 1.17x, open 1.16-1.39x -> 1.43x; the embedded models' 20
        held-out prompts 1.14x -> 1.24x. Trees (``tree=True``, gamma 7) gained more, as
        every weak match adds a branch: SmolLM2 grounded 0.75x -> 1.17x, open 0.89x -> 1.32x,
        embedded 0.50x -> 0.80x. Where verification is nearly free (AMX), the weak matches
        should be worth about what they cost (an estimate; not measured there).

        Parameters
        ----------
        **kwargs
            Other :class:`NgramDrafter` arguments (``max_proposal``...), or overrides of
            :data:`TUNED_NGRAM`.
        """
        return cls(**{**TUNED_NGRAM, **kwargs})

    def reset(self, prompt: np.ndarray, hidden=None) -> None:
        """Forget the previous sequence and index the prompt."""
        self._tokens = []
        self._index = {}
        self._ends = {}
        self._indexed = 0
        self._sync(prompt)

    def _sync(self, seq: np.ndarray) -> None:
        toks = self._tokens
        n = seq.shape[0]
        if n < len(toks):  # rewound without a reset: rebuild
            self._tokens, self._index, self._ends, self._indexed = [], {}, {}, 0
            toks = self._tokens
        if n > len(toks):
            toks.extend(seq[len(toks):n].tolist())
        # Index n-grams ending before the last position: the suffix itself must not match
        # its own occurrence, and a match needs at least one following token.
        index = self._index
        lo, hi = self.min_ngram, self.max_ngram
        ends = self._ends if self.tree else None
        for end in range(self._indexed, n - 1):
            for size in range(lo, min(hi, end + 1) + 1):
                key = tuple(toks[end - size + 1:end + 1])
                index[key] = end
                if ends is not None:
                    ends.setdefault(key, []).append(end)
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
                return np.array(self._continuation(end, gamma), dtype=np.int64)
        return np.zeros(0, dtype=np.int64)

    def _continuation(self, end: int, gamma: int) -> list[int]:
        toks = self._tokens
        out = toks[end + 1:end + 1 + gamma]
        # A match close to the end implies a period: keep copying the proposal itself.
        period = len(toks) - 1 - end
        while len(out) < gamma:
            out.append(out[len(out) - period])
        return out

    def lookup_tree(self, seq: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(tokens, parents)``: the distinct continuations of the suffix's matches as
        a tree of shared prefixes (see :mod:`fastspec.decoding.tree`), possibly empty."""
        self._sync(seq)
        toks = self._tokens
        n = len(toks)
        if self.max_proposal is not None:
            gamma = min(gamma, self.max_proposal)
        tokens: list[int] = []
        parents: list[int] = []
        child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        seen: set[int] = set()
        branches = 0
        budget = self.max_tree_nodes or MAX_TREE_NODES
        for size in range(min(self.max_ngram, n), self.min_ngram - 1, -1):
            ends = self._ends.get(tuple(toks[n - size:]), ())
            # The most recent matches first; scan a bounded number of them.
            for end in ends[:-4 * self.max_branches - 1:-1]:
                if end in seen or branches == self.max_branches or len(tokens) == budget:
                    continue
                seen.add(end)
                node, grew = -1, False
                for tok in self._continuation(end, gamma):
                    nxt = child.get((node, tok))
                    if nxt is None:
                        if len(tokens) == budget:
                            break
                        nxt = child[(node, tok)] = len(tokens)
                        tokens.append(tok)
                        parents.append(node)
                        grew = True
                    node = nxt
                branches += grew
        return np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64)

    def propose(self, seq: np.ndarray, gamma: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Propose up to ``gamma`` tokens copied from the latest match (``q`` is None); in tree
        mode, the tree of the matches' continuations (depth up to ``gamma``)."""
        if self.tree:
            tokens, parents = self.lookup_tree(seq, gamma)
            return TreeProposal(tokens, None, parents)
        return Proposal(self.lookup(seq, gamma), None)

    def commit(self, seq: np.ndarray, n_accepted: int, hidden=None) -> None:
        """Index the newly committed tokens."""
        self._sync(seq)

    def __repr__(self) -> str:
        tree = (f", tree=True, max_branches={self.max_branches}, "
                f"max_tree_nodes={self.max_tree_nodes}") if self.tree else ""
        return (f"NgramDrafter(max_ngram={self.max_ngram}, min_ngram={self.min_ngram}, "
                f"max_proposal={self.max_proposal}{tree})")
