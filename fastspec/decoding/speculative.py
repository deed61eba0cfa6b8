"""speculative_generate(): lossless speculative decoding, a drafter's tokens verified per round.

Like :func:`fastspec.decoding.vanilla.generate` it forms the target's distribution with
:func:`fastspec.kernels.probs` (temperature -> top-k -> top-p; temperature 0 is argmax) and
takes every random draw from ``numpy.random.default_rng(seed)``, so a run is reproducible from
its seed on either backend.

The speculative loop keeps the invariant documented in :mod:`fastspec.drafters.base`: between
rounds the target's cache holds the committed sequence minus its last token. A round feeds
``[seq[-1], *proposal]`` to the target in one forward, verifies (greedy:
:func:`fastspec.kernels.verify_greedy`; sampling: :func:`fastspec.kernels.verify_rejection`),
crops the cache back to ``len(new_seq) - 1`` and tells the drafter what was committed.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from fastspec import kernels
from fastspec.kernels.checks import check_index, int_range
from fastspec.kernels.cache import KVCache
from fastspec.drafters.base import Drafter, Proposal, Target
from fastspec.decoding.stats import DecodeStats, GenerationResult
from fastspec.decoding.vanilla import cache_for, check_generation, holds_cache, score_cells
from fastspec.kernels.tree_shape import MAX_TREE_NODES, block_parents, check_parents
from fastspec.decoding.verify import verify_block, verify_tree

__all__ = ["speculative_generate", "plan_speculative", "run_plan", "SpeculativePlan",
           "ADAPTIVE_GAMMA_START", "ADAPTIVE_GAMMA_MAX"]

#: ``gamma="adaptive"`` starts here and stays within ``[1, ADAPTIVE_GAMMA_MAX]``.
ADAPTIVE_GAMMA_START = 4
ADAPTIVE_GAMMA_MAX = 16


# --- speculative -----------------------------------------------------------------------------

def _check_gamma(gamma):
    if isinstance(gamma, str):
        if gamma != "adaptive":
            raise ValueError(f"gamma must be a positive integer or 'adaptive', got {gamma!r}")
        return None
    return check_index(gamma, "gamma", 1, 4096)


#: What the loop needs from a drafter (checked with hasattr: a runtime Protocol isinstance
#: check costs tens of microseconds, too much for short generations run many times).
_DRAFTER_ATTRS = ("reset", "propose", "commit", "hidden_layers", "max_gamma")


def _drafter_counters(drafter) -> tuple[int, int, int] | None:
    """Read the optional cumulative counters a drafter with a model exposes."""
    calls = getattr(drafter, "forward_calls", None)
    if calls is None:
        return None
    return calls, getattr(drafter, "forward_positions", 0), getattr(drafter, "score_cells", 0)


@holds_cache
def speculative_generate(target: Target, drafter: Drafter, prompt_ids, max_new_tokens: int,
                         gamma: int | str = 4, temperature: float = 0.0, top_k: int = 0,
                         top_p: float = 1.0, seed: int = 0, eos_token_id: int | None = None,
                         trace: bool = False, *, cache: KVCache | None = None,
                         callback: Callable[[np.ndarray, int], None] | None = None,
                         ) -> GenerationResult:
    """Decode with a drafter proposing blocks that ``target`` verifies losslessly.

    Greedy (``temperature == 0``) output equals :func:`generate`'s greedy output token for
    token; sampled output has exactly the target's distribution (drafters with a known
    ``q`` are verified by rejection sampling, deterministic ones with the one-hot rule).

    Parameters
    ----------
    target : Transformer
    drafter : Drafter
        See :mod:`fastspec.drafters.base` for the protocol and the loop invariant.
    prompt_ids : sequence of int, length >= 1
    max_new_tokens : int, >= 1
    gamma : int >= 1 or "adaptive"
        Draft tokens per round (fewer in the last round, so that ``max_new_tokens`` is never
        exceeded, and never more than ``drafter.max_gamma``). ``"adaptive"`` starts at 4,
        grows by 2 after a fully accepted block and shrinks by 1 after a rejection, within
        ``[1, 16]``.
    temperature, top_k, top_p : sampling settings of the target (and of sampling drafters).
    seed : int or None
        Seed of the ``numpy.random.default_rng`` shared by drafter and verifier.
    eos_token_id : int, optional
        Stop right after it; nothing after it is emitted.
    trace : bool
        Record a dict per round in ``stats.trace``.
    cache : KVCache, optional
        Reuse this target cache (reset first) instead of allocating one.
    callback : callable, optional
        ``callback(seq, n_committed)`` after every round with the committed sequence
        (used by the rollback audit).

    Returns
    -------
    GenerationResult
    """
    plan = plan_speculative(target, drafter, prompt_ids, max_new_tokens, gamma, temperature,
                            top_k, top_p, seed, eos_token_id, cache)
    return run_plan(plan, np.random.default_rng(seed), trace, callback)


class SpeculativePlan:
    """Validated arguments and reusable scratch of speculative runs (one target + drafter).

    Building it does every check; :func:`run_plan` then only decodes. The audit builds one plan
    and runs it with many seeds.
    """

    __slots__ = ("target", "drafter", "prompt", "max_new", "sampling", "eos", "gamma_fixed",
                 "hidden_layers", "g_cap", "cache", "seq", "block", "uniforms", "empty",
                 "block_logits", "block_probs")

    def __init__(self, target, drafter, prompt, max_new, sampling, eos, gamma_fixed,
                 hidden_layers, g_cap, cache):
        self.target, self.drafter, self.prompt, self.max_new = target, drafter, prompt, max_new
        self.sampling, self.eos, self.gamma_fixed = sampling, eos, gamma_fixed
        self.hidden_layers, self.g_cap, self.cache = hidden_layers, g_cap, cache
        # Scratch reused by every round and run: the committed sequence, the block, uniforms.
        self.seq = np.empty(prompt.shape[0] + max_new + 1, dtype=np.int64)
        self.seq[:prompt.shape[0]] = prompt
        self.block = np.empty(g_cap + 1, dtype=np.int64)
        self.uniforms = np.empty(g_cap + 1, dtype=np.float64)
        self.empty = np.zeros(0, dtype=np.int64)
        cfg = target.config
        self.block_logits = np.empty((g_cap + 1, cfg.vocab_size), dtype=np.dtype(cfg.dtype))
        # the target's sampled distribution, rewritten each round (greedy rounds never use it)
        self.block_probs = (None if sampling.temperature == 0.0
                            else np.empty_like(self.block_logits))


def plan_speculative(target, drafter, prompt_ids, max_new_tokens, gamma, temperature, top_k,
                     top_p, seed, eos_token_id, cache) -> SpeculativePlan:
    """Validate the arguments of :func:`speculative_generate`; touch no cache."""
    prompt, max_new, sampling, eos = check_generation(target, prompt_ids, max_new_tokens,
                                                   temperature, top_k, top_p, seed, eos_token_id)
    gamma_fixed = _check_gamma(gamma)
    if not all(hasattr(drafter, a) for a in _DRAFTER_ATTRS):
        raise TypeError(f"drafter must implement the Drafter protocol (reset, propose, commit, "
                        f"hidden_layers, max_gamma), got {type(drafter).__name__}")
    hidden_layers = target.check_hidden_layers(drafter.hidden_layers)
    check_target = getattr(drafter, "check_target", None)
    if check_target is not None:  # drafters bound to one target (DFlash) refuse another
        check_target(target)
    max_gamma = drafter.max_gamma
    if max_gamma is not None:
        max_gamma = check_index(max_gamma, "drafter.max_gamma", 1, 2**31 - 1)
    needed = prompt.shape[0] + max_new
    if cache is None:  # room for the widest tree the drafter announces (else trees are cut)
        tree_room = getattr(drafter, "max_tree_nodes", None) or 0
        needed = max(needed, min(needed + tree_room, target.config.max_seq_len))
    cache = cache_for(target, cache, needed)
    g_cap = ADAPTIVE_GAMMA_MAX if gamma_fixed is None else gamma_fixed
    if max_gamma is not None:
        g_cap = min(g_cap, max_gamma)
    return SpeculativePlan(target, drafter, prompt, max_new, sampling, eos, gamma_fixed,
                           hidden_layers, g_cap, cache)


def run_plan(plan: SpeculativePlan, rng: np.random.Generator, trace: bool = False, callback=None,
             verify_rejection=None, verify_tree_rejection=None) -> GenerationResult:
    """Decode once according to ``plan``; the loop behind :func:`speculative_generate`.

    ``verify_rejection`` (chains) and ``verify_tree_rejection`` (trees) replace the verifiers
    (the audit's negative controls pass broken ones); None means the real ones.
    The pool's workers stay awake across the rounds (:func:`fastspec.kernels.keep_threads_awake`).
    """
    with kernels.keep_threads_awake():
        return _run_rounds(plan, rng, trace, callback, verify_rejection, verify_tree_rejection)


def _run_rounds(plan: SpeculativePlan, rng: np.random.Generator, trace: bool, callback,
                verify_rejection, verify_tree_rejection) -> GenerationResult:
    """The body of :func:`run_plan`."""
    target, drafter, cache = plan.target, plan.drafter, plan.cache
    prompt, max_new, sampling, eos = plan.prompt, plan.max_new, plan.sampling, plan.eos
    gamma_fixed, hidden_layers, g_cap = plan.gamma_fixed, plan.hidden_layers, plan.g_cap
    seq, block, uniforms, empty_tokens = plan.seq, plan.block, plan.uniforms, plan.empty
    block_logits = plan.block_logits
    n_prompt = prompt.shape[0]
    cfg = target.config
    vocab = cfg.vocab_size
    gamma_now = min(ADAPTIVE_GAMMA_START, g_cap) if gamma_fixed is None else g_cap
    stats = DecodeStats(trace=[] if trace else None)
    # Rounds by proposal depth and by accepted count (Python ints, turned into the cumulative
    # proposed_at / accepted_at arrays at the end): small NumPy operations cost several
    # microseconds a round right after a forward, whose weights have left the caches.
    depth_rounds = [0] * (g_cap + 1)
    accept_rounds = [0] * (g_cap + 1)
    counters0 = _drafter_counters(drafter)
    p_dtype = np.dtype(cfg.dtype)

    start_time = time.perf_counter()
    cache.reset()
    if n_prompt > 1:
        out = target.step(prompt[:-1], cache, hidden_layers=hidden_layers, logit_rows=0)
        stats.target_calls += 1
        stats.target_positions += n_prompt - 1
        stats.target_score_cells += score_cells(cfg, n_prompt - 1, 0)
        hidden = out.hidden
    else:
        hidden = {layer: np.zeros((0, cfg.dim), dtype=p_dtype) for layer in hidden_layers}
    drafter.reset(prompt.copy(), hidden)
    stats.prefill_s = time.perf_counter() - start_time

    n = n_prompt  # committed length; the cache holds n - 1 positions
    emitted = 0
    propose_calls = 0
    while emitted < max_new:
        # Reserve one position for the correction/bonus token: g may be 0 in the last round.
        g = min(gamma_now, max_new - emitted - 1)
        parents = None
        if g > 0:
            proposal = drafter.propose(seq[:n], g, sampling, rng)
            propose_calls += 1
            tokens, q, parents = _check_proposal(proposal, g, vocab, cache.capacity - n)
            g_used = tokens.shape[0]
        else:
            tokens, q, g_used = empty_tokens, None, 0
        if parents is None:
            block[0] = seq[n - 1]
            block[1:g_used + 1] = tokens
            out = target.step(block[:g_used + 1], cache, hidden_layers=hidden_layers,
                              out=block_logits[:g_used + 1])
            n_acc, after = verify_block(tokens, out.logits, q, sampling, rng, uniforms,
                                        verify_rejection, plan.block_probs)
            path = None
        else:
            # One forward over [root, *nodes], each node seeing its ancestors; then the
            # accepted path's K/V rows (n + node) move to n .. and the rest is cropped.
            out = target.step(np.concatenate((seq[n - 1:n], tokens)), cache,
                              hidden_layers=hidden_layers, tree_parents=block_parents(parents))
            path, after = verify_tree(tokens, parents, out.logits, q, sampling, rng,
                                      verify_tree_rejection)
            n_acc = path.shape[0]
            kernels.compact_kv(cache.k, cache.v, n, path + n)
        stats.target_calls += 1
        stats.target_positions += g_used + 1
        stats.target_score_cells += score_cells(cfg, g_used + 1, n - 1)
        cache.crop(n + n_acc)
        seq[n:n + n_acc] = tokens[:n_acc] if path is None else tokens[path]
        seq[n + n_acc] = after
        round_start = n
        n += n_acc + 1
        emitted += n_acc + 1
        depth = g_used if parents is None else int(check_parents(parents).max())
        stats.rounds += 1
        stats.drafted += g_used
        stats.accepted += n_acc
        if g_used:
            depth_rounds[depth] += 1
            accept_rounds[n_acc] += 1
        stopped = False
        if eos is not None:
            hits = np.flatnonzero(seq[round_start:n] == eos)
            if hits.size:
                # Nothing after eos is emitted; the cache keeps the invariant for that prefix.
                n = round_start + int(hits[0]) + 1
                emitted = n - n_prompt
                cache.crop(min(cache.length, n - 1))
                stopped = True
        if trace:
            stats.trace.append(dict(
                prefix_length=round_start, gamma=g, proposed=g_used, accepted=n_acc,
                next_token=int(after), bonus=bool(g_used and n_acc == depth),
                tree_nodes=None if parents is None else g_used,
                tokens=seq[round_start:n].tolist(), target_cache_length=cache.length))
        if stopped:
            break
        committed_hidden = out.hidden
        if hidden_layers and path is None:
            committed_hidden = {layer: h[:n_acc + 1] for layer, h in out.hidden.items()}
        elif hidden_layers and path is not None:  # the root and the accepted path's rows
            rows = np.concatenate(([0], path + 1))
            committed_hidden = {layer: h[rows] for layer, h in out.hidden.items()}
        drafter.commit(seq[:n], n_acc, committed_hidden)
        if callback is not None:
            callback(seq[:n], n)
        if gamma_fixed is None and g_used:
            if n_acc == depth and depth == g:
                gamma_now = min(gamma_now + 2, g_cap)
            elif n_acc < depth:
                gamma_now = max(gamma_now - 1, 1)

    stats.elapsed_s = time.perf_counter() - start_time
    stats.new_tokens = emitted
    # proposed_at[i]: rounds whose depth exceeds i; accepted_at[i]: rounds accepting > i tokens
    stats.proposed_at = np.cumsum(depth_rounds[:0:-1], dtype=np.int64)[::-1].copy()
    stats.accepted_at = np.cumsum(accept_rounds[:0:-1], dtype=np.int64)[::-1].copy()
    counters1 = _drafter_counters(drafter)
    if counters0 is not None and counters1 is not None:
        stats.draft_calls = counters1[0] - counters0[0]
        stats.draft_positions = counters1[1] - counters0[1]
        stats.draft_score_cells = counters1[2] - counters0[2]
    else:
        stats.draft_calls = propose_calls
    return GenerationResult(seq[n_prompt:n].tolist(), stats)


def _check_proposal(proposal, g: int, vocab: int, room: int
                    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validate a drafter's proposal; return ``(tokens int64 (g',), q or None, parents)``.

    ``parents`` is None for a chain (also a tree shaped like one). A tree deeper than
    ``g`` or wider than :data:`fastspec.decoding.tree.MAX_TREE_NODES` is an error; one with more nodes
    than the ``room`` left in the cache keeps its first ``room`` nodes (a topological prefix
    is a tree).
    """
    if not isinstance(proposal, Proposal):
        raise TypeError(f"drafter.propose must return a Proposal, got {type(proposal).__name__}")
    tokens = proposal.tokens
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError("drafter proposal tokens must be a 1-D integer ndarray, got "
                         f"{type(tokens).__name__} {getattr(tokens, 'shape', '')}")
    count = tokens.shape[0]
    parents = getattr(proposal, "parents", None)
    if parents is not None:
        depths = check_parents(parents, count, MAX_TREE_NODES, None, "drafter proposal parents")
        if count and int(depths.max()) > g:
            raise ValueError(f"drafter proposed a tree of depth {int(depths.max())}, more than "
                             f"gamma = {g}")
        if np.array_equal(depths, np.arange(1, count + 1)):
            parents = None
        elif count > room:
            count = room
            tokens, parents = tokens[:count], parents[:count]
        if parents is not None:
            parents = np.ascontiguousarray(parents, dtype=np.int64)
    if parents is None and count > g:
        raise ValueError(f"drafter proposed {count} tokens, more than gamma = {g}")
    if count:
        low, high = int_range(tokens)
        if low < 0 or high >= vocab:
            raise ValueError(f"drafter proposed token ids outside [0, {vocab}): {tokens.tolist()}")
    if tokens.dtype != np.int64 or not tokens.flags.c_contiguous:
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    q = proposal.q
    if q is not None and parents is not None and count < proposal.tokens.shape[0]:
        q = q[:count]  # the tree was cut to the room left
    if q is not None:
        if not isinstance(q, np.ndarray) or q.shape != (count, vocab):
            raise ValueError(f"drafter proposal q must have shape {(count, vocab)}, got "
                             f"{getattr(q, 'shape', type(q).__name__)}")
        if not q.flags.c_contiguous:
            q = np.ascontiguousarray(q)
        if parents is not None and count:  # a node its own q cannot draw: a drafter's bug
            bad = np.flatnonzero(~(q[np.arange(count), tokens] > 0))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"drafter proposal q[{i}, tokens[{i}]] = "
                                 f"{float(q[i, tokens[i]])!r}: tree node {i} cannot have been "
                                 f"drawn from q[{i}] (it must be > 0)")
    return tokens, q, parents
