"""generate(): vanilla decoding, one target call per new token, and what both loops check.

The target's distribution is :func:`fastspec.kernels.probs` (temperature -> top-k -> top-p;
temperature 0 is argmax) and every random draw comes from ``numpy.random.default_rng(seed)``,
so a run is reproducible from its seed on either backend. :mod:`fastspec.decoding.speculative`
shares the argument checks below.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from fastspec.kernels.checks import check_index, check_sampling_params
from fastspec.kernels.cache import KVCache
from fastspec.drafters.base import Target
from fastspec.decoding.sampling import SamplingParams, next_token
from fastspec.decoding.stats import DecodeStats, GenerationResult

__all__ = ["generate", "check_generation", "cache_for", "score_cells", "holds_cache"]


def check_generation(model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed,
                  eos_token_id):
    """Validate the arguments shared by both loops; return normalised values."""
    prompt = model.check_ids(prompt_ids, "prompt_ids")
    max_new_tokens = check_index(max_new_tokens, "max_new_tokens", 1, 2**31 - 1)
    temperature, top_k, top_p = check_sampling_params(temperature, top_k, top_p)
    if seed is not None:  # None: fresh OS entropy, as numpy.random.default_rng(None)
        check_index(seed, "seed", 0, 2**63 - 1)
    vocab = model.config.vocab_size
    if eos_token_id is not None:
        eos_token_id = check_index(eos_token_id, "eos_token_id", 0, vocab - 1)
    total = prompt.shape[0] + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(f"prompt_ids ({prompt.shape[0]} tokens) + max_new_tokens "
                         f"({max_new_tokens}) = {total} exceeds max_seq_len "
                         f"{model.config.max_seq_len}")
    return prompt, max_new_tokens, SamplingParams(temperature, top_k, top_p), eos_token_id


def cache_for(model, cache, needed):
    """The caller's ``cache`` checked to hold ``needed`` positions, or a new one."""
    if cache is None:
        return model.new_cache(needed)
    model.check_cache(cache)
    if cache.capacity < needed:
        raise ValueError(f"cache capacity {cache.capacity} is smaller than the {needed} "
                         "positions this generation needs")
    return cache


def score_cells(config, n, past):
    """Attention score cells of ``n`` new positions after ``past`` cached ones (a counter of
    DecodeStats)."""
    return config.n_layers * config.n_heads * n * (past + n)


def holds_cache(fn):
    """Hold a caller's ``cache=`` for the whole call (KVCache.claim): another thread may not
    reset or write it meanwhile (RuntimeError for that thread)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        cache = kwargs.get("cache")
        if type(cache) is not KVCache:
            return fn(*args, **kwargs)
        with cache.claim():
            return fn(*args, **kwargs)
    return wrapper


@holds_cache
def generate(model: Target, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, eos_token_id: int | None = None,
             use_cache: bool = True, *, cache: KVCache | None = None) -> GenerationResult:
    """Decode autoregressively from ``model``, one target call per new token.

    Parameters
    ----------
    model : Transformer
    prompt_ids : sequence of int, length >= 1
    max_new_tokens : int, >= 1
    temperature, top_k, top_p : sampling settings (see :func:`fastspec.kernels.probs`);
        ``temperature == 0`` is greedy.
    seed : int or None
        Seed of the ``numpy.random.default_rng`` that supplies one uniform per sampled token
        (None: not reproducible).
    eos_token_id : int, optional
        Stop right after emitting it.
    use_cache : bool, default True
        False recomputes the whole prefix for every token (the reference path).
    cache : KVCache, optional
        Reuse this cache (reset first) instead of allocating one.

    Returns
    -------
    GenerationResult
    """
    prompt, max_new, sampling, eos = check_generation(model, prompt_ids, max_new_tokens,
                                                   temperature, top_k, top_p, seed, eos_token_id)
    if use_cache:
        cache = cache_for(model, cache, prompt.shape[0] + max_new)
    rng = np.random.default_rng(seed)
    cfg = model.config
    stats = DecodeStats()
    start_time = time.perf_counter()
    n = prompt.shape[0]
    seq = np.empty(n + max_new, dtype=np.int64)
    seq[:n] = prompt
    if use_cache:
        cache.reset()
        logits = model.step(prompt, cache, logit_rows=1).logits  # the last row's: the next token
        stats.target_score_cells += score_cells(cfg, n, 0)
        stats.target_positions += n
    else:
        logits = model.forward(prompt).logits
        stats.target_score_cells += score_cells(cfg, n, 0)
        stats.target_positions += n
    stats.target_calls += 1
    stats.prefill_s = time.perf_counter() - start_time
    step_logits = np.empty((1, cfg.vocab_size), dtype=np.dtype(cfg.dtype))  # reused output
    emitted = 0
    while True:
        token = next_token(logits[-1:], sampling, rng)
        seq[n] = token
        n += 1
        emitted += 1
        if emitted == max_new or token == eos:
            break
        if use_cache:
            logits = model.step(seq[n - 1:n], cache, out=step_logits).logits
        else:
            logits = model.forward(seq[:n]).logits
    # Counters of the emitted - 1 decode steps (steps after the last token are never run).
    steps = emitted - 1
    stats.target_calls += steps
    first, last = prompt.shape[0] + 1, prompt.shape[0] + steps  # sequence lengths fed
    if use_cache:
        stats.target_positions += steps
        stats.target_score_cells += cfg.n_layers * cfg.n_heads * (first + last) * steps // 2
    else:
        stats.target_positions += (first + last) * steps // 2
        stats.target_score_cells += cfg.n_layers * cfg.n_heads * sum(
            k * k for k in range(first, last + 1))
    stats.elapsed_s = time.perf_counter() - start_time
    stats.new_tokens = emitted
    stats.rounds = emitted
    return GenerationResult(seq[prompt.shape[0]:n].tolist(), stats)
