"""Hypothesis fuzzing of speculative_generate's arguments, valid and invalid mixed.

An independent oracle says whether each drawn argument set is valid. Invalid sets must raise
TypeError/ValueError (and leave the caller's cache untouched); valid ones must return tokens in
range, at most max_new_tokens of them, stopping at eos, and at temperature 0 exactly the tokens
of fs.generate. A few examples per backend by default; the `slow` copies run 500.
"""
from __future__ import annotations

import math
import operator

import numpy as np
from hypothesis import strategies as st

import fastspec as fs

from _helpers import fast_and_slow

V, MAX_SEQ = 12, 24


def _is_int(x) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _valid(prompt, max_new, gamma, temperature, top_k, top_p, seed, eos) -> bool:
    if not prompt or not all(0 <= t < V for t in prompt):
        return False
    if not _is_int(max_new) or max_new < 1 or len(prompt) + max_new > MAX_SEQ:
        return False
    if gamma != "adaptive" and not (_is_int(gamma) and 1 <= gamma <= 4096):
        return False
    if not (math.isfinite(temperature) and temperature >= 0):
        return False
    if not (_is_int(top_k) and top_k >= 0):
        return False
    if not 0 < top_p <= 1:
        return False
    if seed is not None and not (_is_int(seed) and 0 <= seed <= 2**63 - 1):
        return False
    return eos is None or (_is_int(eos) and 0 <= eos < V)


_MODELS = {}


def _models():
    if not _MODELS:
        cfg = fs.ModelConfig(vocab_size=V, dim=16, n_layers=2, n_heads=2, ffn_dim=32,
                             max_seq_len=MAX_SEQ)
        target = fs.Transformer.random(cfg, seed=0)
        draft = fs.Transformer.random(cfg.replace(n_layers=1), seed=1)
        _MODELS.update(target=target, draft=draft,
                       dflash=fs.DFlashModel.random(fs.DFlashConfig(block_size=4), target, seed=2))
    return _MODELS


def _drafter(kind):
    m = _models()
    if kind == "draft":
        return fs.DraftModelDrafter(m["draft"])
    if kind == "ngram":
        return fs.NgramDrafter()
    return fs.DFlashDrafter(m["dflash"], denoise_steps=2 if kind == "dflash2" else 1)


def _spec_property(backend, prompt, max_new, gamma, temperature, top_k, top_p, seed, eos,
                   kind, with_cache):
    target = _models()["target"]
    cache = target.new_cache()
    target.forward([1, 2, 3], cache)
    before = (cache.length, cache.k.copy(), cache.v.copy())
    kwargs = dict(gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                  eos_token_id=eos, cache=cache if with_cache else None)
    valid = _valid(prompt, max_new, gamma, temperature, top_k, top_p, seed, eos)
    try:
        result = fs.speculative_generate(target, _drafter(kind), prompt, max_new, **kwargs)
    except (TypeError, ValueError):
        assert not valid, "a valid argument set was refused"
        assert cache.length == before[0]
        np.testing.assert_array_equal(cache.k, before[1])
        np.testing.assert_array_equal(cache.v, before[2])
        return
    assert valid, "an invalid argument set was accepted"
    tokens = result.tokens
    assert 1 <= len(tokens) <= max_new
    assert all(0 <= t < V for t in tokens)
    if eos is not None and eos in tokens:
        assert tokens.index(eos) == len(tokens) - 1
    elif len(tokens) < max_new:
        raise AssertionError("stopped early without eos")
    if temperature == 0:
        assert tokens == fs.generate(target, prompt, max_new, eos_token_id=eos).tokens


_floats = st.sampled_from([0.0, 0.5, 1.0, 1.7, -0.1, math.nan, math.inf, -math.inf])

test_speculative_args_fuzz, test_speculative_args_fuzz_slow = fast_and_slow(
    fast=25,
    backend=st.sampled_from(fs.available_backends()),
    prompt=st.lists(st.integers(-2, V + 1), max_size=6),
    max_new=st.one_of(st.integers(-1, 22), st.sampled_from([2.0, None, "4"])),
    gamma=st.one_of(st.integers(-1, 6), st.sampled_from(["adaptive", "fast", 2.5, True, None])),
    temperature=st.one_of(st.just(0.0), _floats),
    top_k=st.one_of(st.integers(-1, 14), st.sampled_from([1.5, None])),
    top_p=st.sampled_from([1.0, 0.9, 0.3, 0.0, -0.5, 1.5, math.nan]),
    seed=st.one_of(st.none(), st.integers(-1, 2**64)),
    eos=st.one_of(st.none(), st.integers(-1, V)),
    kind=st.sampled_from(["draft", "ngram", "dflash", "dflash2"]),
    with_cache=st.booleans(),
)(_spec_property)
