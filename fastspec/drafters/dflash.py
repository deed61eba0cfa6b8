"""DFlashDrafter: block-diffusion proposals from a :class:`fastspec.DFlashModel`."""
from __future__ import annotations

import heapq
from typing import Mapping

import numpy as np

from fastspec import kernels
from fastspec.kernels.checks import check_index
from fastspec.drafters.dflash_model import DFlashModel
from fastspec.drafters.base import Proposal, SamplingParams, TreeProposal
from fastspec.drafters.tree_sampling import sample_tree_without_replacement
from fastspec.kernels.tree_shape import MAX_TREE_NODES
from fastspec.model.functional import rope_inv_freq, rotate_half_into

__all__ = ["DFlashDrafter", "denoise_schedule", "best_first_tree"]


def denoise_schedule(n_positions: int, steps: int) -> list[int]:
    """Return how many positions each denoising step fills: ``steps`` near-equal counts.

    Earlier steps take the remainder (``[3, 2, 2]`` for 7 positions in 3 steps); when there
    are fewer positions than steps, one position per step.
    """
    steps = max(1, min(steps, n_positions))
    base, extra = divmod(n_positions, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def _top_tokens(logp: np.ndarray, width: int) -> np.ndarray:
    """``np.argsort(-logp, axis=1, kind="stable")[:, :width]`` without sorting whole rows.

    A row's ``width`` best are its values above the ``width``-th best (sorted) and then that
    value's ties in token order, which is what the stable sort lists first. At V = 151936 the
    full sort of a 15-row block took 0.3 s, several target steps.
    """
    g, vocab = logp.shape
    neg = -logp
    if 8 * width >= vocab:  # the kept share of a row is large: a partition would save little
        return np.argsort(neg, axis=1, kind="stable")[:, :width]
    kth = np.partition(neg, width - 1, axis=1)[:, width - 1]
    top = np.empty((g, width), dtype=np.intp)
    for r in range(g):
        row, t = neg[r], kth[r]
        better = np.flatnonzero(row < t)
        better = better[np.argsort(row[better], kind="stable")]
        ties = np.flatnonzero(row == t)[:width - better.size]
        if better.size + ties.size < width:  # NaNs in the row: the sort's order for them
            top[r] = np.argsort(row, kind="stable")[:width]
        else:
            top[r, :better.size] = better
            top[r, better.size:] = ties
    return top


def best_first_tree(logp: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Grow a tree best-first over independent per-position distributions.

    A node is a prefix ``(x_1, ..., x_d)`` scored ``sum_j logp[j - 1, x_j]`` (the product of
    its probabilities); the ``budget`` best prefixes form the tree. A child never scores above
    its parent, so nodes come out in topological order, and siblings by falling probability
    (the order in which verification tests them).

    Parameters
    ----------
    logp : ndarray of shape (g, V)
        Log-probabilities of block positions ``1 .. g``.
    budget : int
        Number of nodes, ``>= 1``.

    Returns
    -------
    tokens, parents : ndarray of shape (min(budget, ...),), int64
    """
    # The likeliest tokens of every position, best first: no node needs more than `budget`.
    top = _top_tokens(logp, min(budget, logp.shape[1]))
    return _best_first(top, np.take_along_axis(logp, top, axis=1).astype(np.float64), budget)


def _best_first(top: np.ndarray, top_lp: np.ndarray, budget: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`best_first_tree` from each position's best tokens ``top`` (g, width), best
    first, and their log-probabilities ``top_lp`` (g, width), float64: the drafter ranks the
    tokens on its logits or probabilities and takes logarithms of these few only."""
    g, width = top.shape
    tokens: list[int] = []
    parents: list[int] = []
    # entries: (-score, tie, parent node, parent score, depth index, rank among top tokens)
    heap = [(-top_lp[0, 0], 0, -1, 0.0, 0, 0)]
    tie = 1
    while heap and len(tokens) < budget:
        neg, _, parent, base, depth, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(int(top[depth, rank]))
        parents.append(parent)
        if rank + 1 < width:  # the next sibling
            heapq.heappush(heap, (-(base + top_lp[depth, rank + 1]), tie, parent, base, depth,
                                  rank + 1))
            tie += 1
        if depth + 1 < g:  # the first child
            heapq.heappush(heap, (neg - top_lp[depth + 1, 0], tie, node, -neg, depth + 1, 0))
            tie += 1
    return np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64)


def _logits_tree(logits: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """``best_first_tree(log_softmax(logits), budget)``, ranked on the logits (a log-softmax
    keeps a row's order) with the logarithms of the kept tokens only: at V = 151936 the
    float64 log-softmax of a block cost more than a target step."""
    top = _top_tokens(logits, min(budget, logits.shape[1]))
    peak = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - peak).sum(axis=1, keepdims=True, dtype=np.float64))
    top_lp = (np.take_along_axis(logits, top, axis=1).astype(np.float64) - peak) - lse
    return _best_first(top, top_lp, budget)


def _probs_tree(q: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """``best_first_tree(log(max(q, 1e-300)), budget)`` for probabilities ``q`` (g, V), ranked
    on ``q`` (the logarithm keeps its order) with the logarithms of the kept tokens only."""
    top = _top_tokens(q, min(budget, q.shape[1]))
    top_lp = np.log(np.maximum(np.take_along_axis(q, top, axis=1).astype(np.float64), 1e-300))
    return _best_first(top, top_lp, budget)


class DFlashDrafter:
    """Drafter that proposes a block of tokens with one (or a few) DFlash forwards.

    Parameters
    ----------
    model : DFlashModel
        The drafter network bound to the target being decoded.
    denoise_steps : int, default 1
        1: one forward of ``[bonus, MASK * (B-1)]``, proposals = argmax of each masked
        position. ``k > 1``: confidence-ordered unmasking — each step fills the most confident
        still-masked positions (about ``g / k`` of them, by top softmax probability) with their
        argmax and re-runs the block with them in place, until all ``g`` proposed positions are
        filled (``min(k, g)`` forwards).
    sample_block : bool, default False
        Single step only: draw each position independently from its own distribution ``q``
        (the draft logits under the run's temperature/top-k/top-p) and report that ``q``. At
        temperature 0 it is the argmax drafter.
    trim_block : bool, default True
        Proposing ``g < block_size - 1`` tokens, run the block ``[bonus, MASK * g]`` (``g + 1``
        positions) rather than all ``block_size``: the masks past the proposal only reached
        the kept positions through attention. Measured on 8 held-out prompts with an embedded
        drafter: greedy tau 3.08 -> 3.02 at gamma 3 and 2.62 -> 2.59 at gamma 2, for a block
        forward of 0.72 instead of 1.09 target decode steps at gamma 3 (``round_costs`` in
        :mod:`fastspec.tools.rounds`).
    tree_budget : int, optional
        Propose a tree of up to this many nodes, grown best-first over the block's
        per-position distributions (:func:`best_first_tree`; the product of probabilities),
        depth up to ``gamma``, verified in one target forward. None: the argmax chain. Needs
        ``denoise_steps=1``. With ``sample_block=False`` (or at temperature 0) the nodes are
        the best-first tokens, deterministic, verified with the one-hot rule. With
        ``sample_block=True`` at temperature > 0 the same best-first *shape* (grown over the
        run's ``q``) is filled by sampling: each node's siblings are drawn without replacement
        from its depth's ``q`` and reported with the law each was drawn from
        (:func:`fastspec.decoding.tree.sample_tree_without_replacement`), which the multi-draft rule
        verifies exactly (audit ``tree_exact_law_without_replacement``).

    Notes
    -----
    Losslessness. Deterministic proposals (the default and every multi-step variant) report
    ``q = None`` and are verified with the one-hot rule (accept ``x`` with probability
    ``p(x)``, else resample from ``p`` without ``x``), which reproduces the target's
    distribution exactly at any temperature.

    ``sample_block=True`` may report per-position ``q`` because, given the context, the block
    positions are drawn *independently* from the marginals of one forward, so the joint
    proposal law is ``prod_j q_j(x_j)`` and ``q_j`` is exactly the conditional law of token
    ``j`` given the earlier proposed tokens — what rejection sampling needs.

    A *sampled* multi-step variant may not: there a position's distribution depends on the
    tokens sampled into other positions in earlier steps and on the confidence ordering
    (itself random), so the token at position ``j`` is not drawn from any single row that
    one forward produces; in particular the final forward's per-position probabilities (run
    with all positions filled) are not the law the block was drawn from. Using them as ``q``
    (the mistake of the toy this project grew from) biases the output; the DFlash audit's
    negative control shows it failing. Hence multi-step proposals are argmax fills, verified
    one-hot.
    """

    def __init__(self, model: DFlashModel, denoise_steps: int = 1, sample_block: bool = False,
                 context_window: int | None = None, trim_block: bool = True,
                 tree_budget: int | None = None) -> None:
        if not isinstance(model, DFlashModel):
            raise TypeError(f"model must be a DFlashModel, got {type(model).__name__}")
        B = model.config.block_size
        self.denoise_steps = check_index(denoise_steps, "denoise_steps", 1, B - 1)
        if not isinstance(sample_block, (bool, np.bool_)):
            raise TypeError(f"sample_block must be a bool, got {sample_block!r}")
        if sample_block and self.denoise_steps > 1:
            raise ValueError(f"sample_block=True needs denoise_steps=1, got {denoise_steps}: a "
                             "multi-step sampled block has no per-position q (see the class notes)")
        if not isinstance(trim_block, (bool, np.bool_)):
            raise TypeError(f"trim_block must be a bool, got {trim_block!r}")
        if tree_budget is not None:
            tree_budget = check_index(tree_budget, "tree_budget", 1, MAX_TREE_NODES)
            if self.denoise_steps > 1:
                raise ValueError(f"tree_budget needs denoise_steps=1, got denoise_steps="
                                 f"{denoise_steps} (multi-step blocks have no per-position "
                                 "distributions to grow a tree over)")
        self.tree_budget = tree_budget
        #: Read by the loop to size its cache for the widest tree.
        self.max_tree_nodes = tree_budget
        self.model = model
        self.sample_block = bool(sample_block)
        self.trim_block = bool(trim_block)
        self.hidden_layers: tuple[int, ...] = tuple(model.config.tap_layers)
        self.max_gamma: int | None = B - 1
        self.cache = model.new_cache()
        if context_window is None:
            context_window = model.context_window
        self.context_window = (None if context_window is None else
                               check_index(context_window, "context_window", 1, self.cache.capacity))
        #: Context positions dropped from the front by the sliding window (absolute position
        #: of the cache's first entry).
        self._offset = 0
        self._block = np.empty(B, dtype=np.int64)
        #: Cumulative counters (never reset): block forwards, block positions pushed through
        #: the drafter, attention score cells (layers x heads x queries x keys).
        self.forward_calls = 0
        self.forward_positions = 0
        self.score_cells = 0

    def __repr__(self) -> str:
        return (f"DFlashDrafter(block_size={self.model.config.block_size}, "
                f"denoise_steps={self.denoise_steps}, sample_block={self.sample_block}, "
                f"trim_block={self.trim_block}, tree_budget={self.tree_budget})")

    def check_target(self, target) -> None:
        """Raise ValueError unless ``target`` has the width and vocabulary the drafter reads.

        Called by :func:`fastspec.speculative_generate` before any cache is touched.
        """
        want, got = self.model.target.config, getattr(target, "config", None)
        if got is None or (got.dim, got.vocab_size) != (want.dim, want.vocab_size):
            shape = None if got is None else (got.dim, got.vocab_size)
            raise ValueError(f"target (dim, vocab_size) = {shape} does not match the DFlash "
                             f"drafter's target ({want.dim}, {want.vocab_size})")

    # --- protocol -------------------------------------------------------------------------

    def reset(self, prompt: np.ndarray, hidden: Mapping[int, np.ndarray] | None) -> None:
        """Rebuild the context cache from the prompt's first ``len(prompt) - 1`` hidden states."""
        prompt = self.model.target.check_ids(prompt, "prompt")
        n = prompt.shape[0] - 1
        self.cache.reset()
        self._offset = 0
        if n == 0 and not hidden:
            return
        self.model.append_hidden(self.cache, self._hidden_rows(hidden, n), 0)
        self._slide()

    def propose(self, seq: np.ndarray, gamma: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Propose ``min(gamma, block_size - 1)`` tokens following ``seq``."""
        seq = np.asarray(seq)
        gamma = check_index(gamma, "gamma", 0, 2**31 - 1)
        P = seq.shape[0] - 1
        if self.cache.length + self._offset != P:
            raise ValueError(f"the drafter's context holds {self.cache.length + self._offset} positions but seq "
                             f"has {seq.shape[0]} tokens (expected len(seq) - 1 = {P}); call "
                             "reset/commit with every verification result")
        g = min(gamma, self.model.config.block_size - 1)
        if g == 0:
            return Proposal(np.zeros(0, dtype=np.int64), None)
        block = self._block  # reused every round: [bonus, MASK, ...]
        block[0] = check_index(int(seq[-1]), "seq[-1]", 0, self.model.target.config.vocab_size - 1)
        block[1:] = self.model.config.mask_token_id
        if self.trim_block:
            block = block[:g + 1]
        if self.denoise_steps == 1:
            logits = self._forward(block)[:g]
            if self.tree_budget is not None:
                if self.sample_block and not sampling.greedy:
                    return self._sampled_tree(logits, sampling, rng)
                tokens, parents = _logits_tree(logits, self.tree_budget)
                return TreeProposal(tokens, None, parents)
            if self.sample_block and not sampling.greedy:
                q = kernels.probs(np.ascontiguousarray(logits), sampling.temperature,
                                  sampling.top_k, sampling.top_p)
                u = rng.random(g)
                tokens = np.array([kernels.sample(q[j], float(u[j])) for j in range(g)],
                                  dtype=np.int64)
                return Proposal(tokens, q)
            return Proposal(np.argmax(logits, axis=1).astype(np.int64), None)
        return Proposal(self._denoise(block, g), None)

    def commit(self, seq: np.ndarray, n_accepted: int,
               hidden: Mapping[int, np.ndarray] | None) -> None:
        """Append the context features of the ``n_accepted + 1`` newly committed positions."""
        seq = np.asarray(seq)
        n_new = check_index(n_accepted, "n_accepted", 0, 2**31 - 1) + 1
        start = seq.shape[0] - 1 - n_new - self._offset
        if not 0 <= start <= self.cache.length:
            raise ValueError(f"commit of {n_new} positions ending at len(seq) - 1 = "
                             f"{seq.shape[0] - 1} does not continue the drafter's context of "
                             f"{self.cache.length} positions")
        self.model.append_hidden(self.cache, self._hidden_rows(hidden, n_new), start)
        self._slide()

    def _slide(self) -> None:
        """Keep the context within ``context_window`` positions (checked after each append).

        A drafter trained on short sequences never saw more context keys than its training
        length; beyond it acceptance collapses. RoPE scores depend only on relative positions,
        so the drafter can keep the last positions, moved to the front of the buffer with
        their keys rotated back by the number of dropped positions: the block then sits at the
        same relative distances as in a fresh run over that window. When the context outgrows
        the window, it is cut to ``W - min(32, W // 2)`` positions, so the copy and rotation
        run once every few dozen positions, not every round, and the context stays within
        ``[W - min(32, W // 2), W]``.
        """
        W = self.context_window
        if W is None or self.cache.length <= W:
            return
        keep = W - min(32, W // 2)
        drop = self.cache.length - keep
        k, v = self.cache.k, self.cache.v  # (layers, kv heads, capacity, head_dim)
        _rotate_into(k[:, :, :keep], k[:, :, drop:drop + keep], -drop,
                     self.model.config.rope_theta, self.model.config.rope_freq_factors)
        v[:, :, :keep] = v[:, :, drop:drop + keep]  # overlapping ranges: numpy copies via a buffer
        self.cache.crop(keep)
        self._offset += drop

    # --- internals ------------------------------------------------------------------------

    def _hidden_rows(self, hidden, n):
        """The first ``n`` rows of every tapped layer's hidden states."""
        if hidden is None:
            raise ValueError(f"DFlashDrafter needs the target's hidden states of layers "
                             f"{list(self.hidden_layers)}, got None")
        return {t: _rows(hidden, t, n) for t in self.hidden_layers}

    def _forward(self, block):
        c, n = self.model.config, block.shape[0]
        self.forward_calls += 1
        self.forward_positions += n
        self.score_cells += c.n_layers * c.n_heads * n * (self.cache.length + n)
        if self.cache.length + n > self.cache.capacity:
            raise ValueError(f"context of {self.cache.length} positions plus a block of {n} "
                             f"exceeds the drafter's cache capacity {self.cache.capacity}")
        # Own cache, ids built from valid tokens: skip forward_block's re-validation.
        return self.model.forward_block(self.cache, block)

    def _sampled_tree(self, logits, sampling, rng):
        """A best-first shape over the run's ``q``, its siblings drawn without replacement.

        The shape depends on the context only (never on the draws), so each node's reported
        row is exactly the law it was drawn from given its path and earlier siblings.
        """
        q = kernels.probs(np.ascontiguousarray(logits), sampling.temperature, sampling.top_k,
                          sampling.top_p)
        # Tokens outside top-k/top-p score far below every allowed one: they enter the shape
        # only when the budget outgrows the support, and the sampler then drops them.
        _, shape = _probs_tree(q, self.tree_budget)
        tokens, q_rows, parents = sample_tree_without_replacement(
            shape, q, rng.random(shape.shape[0]))
        return TreeProposal(tokens, q_rows, parents)

    def _denoise(self, block, g):
        """Confidence-ordered argmax unmasking of block positions 1..g (deterministic)."""
        masked = np.ones(g, dtype=bool)
        for count in denoise_schedule(g, self.denoise_steps):
            logits = self._forward(block)[:g]
            best = np.argmax(logits, axis=1)
            # Top softmax probability = 1 / sum(exp(l - max)), in float64 without a float64
            # copy of the block (at V = 151936 each pass costs); masked-out rows sort last.
            z = np.subtract(logits, logits[np.arange(g), best][:, None], dtype=np.float64)
            conf = 1.0 / np.exp(z, out=z).sum(axis=1)
            conf[~masked] = -1.0
            order = np.argsort(-conf, kind="stable")[:count]
            block[1 + order] = best[order]
            masked[order] = False
        return block[1:1 + g].copy()


def _rotate_into(out: np.ndarray, keys: np.ndarray, shift: int, theta: float,
                 freq_factors: tuple[float, ...] | None = None) -> None:
    """Write RoPE'd ``keys`` (..., head_dim) rotated by ``shift`` positions to ``out`` (same
    shape, may overlap ``keys``): angles in float64 (each frequency divided by its
    ``freq_factors`` entry, as :func:`~fastspec.model.functional.rope_tables`), arithmetic in
    the keys' dtype."""
    angle = shift * rope_inv_freq(keys.shape[-1], theta, freq_factors)
    rotate_half_into(out, keys, np.cos(angle).astype(keys.dtype), np.sin(angle).astype(keys.dtype))


def _rows(hidden, layer, n):
    if layer not in hidden:
        raise ValueError(f"hidden has no entry for tapped target layer {layer}")
    a = np.asarray(hidden[layer])
    if a.ndim != 2 or a.shape[0] != n:
        raise ValueError(f"hidden[{layer}] must have {n} rows (the newly committed positions), "
                         f"got shape {a.shape}")
    return a
