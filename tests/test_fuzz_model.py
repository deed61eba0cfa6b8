"""Hypothesis fuzzing of the model forward: random small configs of every family combination,
random ids fed in random chunks; the fused Cython runner and the NumPy twin must agree, and
chunked (cached) decoding must equal one whole-sequence forward. A few examples by default;
the `slow` copies run 500 (FASTSPEC_SLOW=1 or -m slow)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import fastspec as fs

from _helpers import BACKENDS, fast_and_slow


@st.composite
def configs(draw):
    n_kv = draw(st.integers(1, 3))
    n_heads = n_kv * draw(st.integers(1, 3))
    positional = draw(st.sampled_from(["rope", "learned"]))
    head_dim = draw(st.sampled_from([2, 4, 6, 8] if positional == "rope" else [1, 3, 4, 5, 8]))
    explicit_head_dim = draw(st.booleans())
    dim = draw(st.integers(2, 24)) if explicit_head_dim else n_heads * head_dim
    return fs.ModelConfig(
        vocab_size=draw(st.integers(1, 40)), dim=dim, n_layers=draw(st.integers(1, 3)),
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, ffn_dim=draw(st.integers(1, 40)),
        max_seq_len=draw(st.integers(1, 40)), norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        positional=positional, activation=draw(st.sampled_from(["swiglu", "tanh", "gelu"])),
        tie_embeddings=draw(st.booleans()), dtype=draw(st.sampled_from(["float32", "float64"])),
        qk_norm=draw(st.booleans()), qkv_bias=draw(st.booleans()),
        rope_theta=draw(st.sampled_from([10.0, 10000.0, 1e6])))


def _tol(dtype, ref):
    scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    return (2e-4, 2e-4 * scale) if dtype == "float32" else (1e-9, 1e-9 * scale)


def _run_chunks(model, ids, cuts, layers, backend):
    cache = model.new_cache()
    logits, hidden = [], {l % model.config.n_layers: [] for l in layers}
    with fs.using_backend(backend):
        for a, b in zip(cuts[:-1], cuts[1:]):
            out = model.forward(ids[a:b], cache, hidden_layers=layers)
            logits.append(out.logits.copy())
            assert sorted(out.hidden) == sorted(hidden)
            for l in hidden:
                hidden[l].append(out.hidden[l].copy())
    assert cache.length == len(ids)
    return np.concatenate(logits), {l: np.concatenate(h) for l, h in hidden.items()}


def _whole(model, ids, backend):
    with fs.using_backend(backend):
        return model.forward(ids).logits


def _forward_property(config, seed, data):
    model = fs.Transformer.random(config, seed=seed)
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(1, config.max_seq_len), label="n")
    ids = rng.integers(0, config.vocab_size, n)
    cuts = sorted(set([0, n] + data.draw(st.lists(st.integers(1, n), max_size=4), label="cuts")))
    layers = data.draw(st.lists(st.integers(-config.n_layers, config.n_layers - 1), max_size=2),
                       label="hidden_layers")
    norm_layers = sorted({l % config.n_layers for l in layers})
    results = {b: _run_chunks(model, ids, cuts, layers, b) for b in BACKENDS}
    whole = {b: _whole(model, ids, b) for b in BACKENDS}
    ref_logits, ref_hidden = results["numpy"]
    assert ref_logits.shape == (n, config.vocab_size)
    assert np.isfinite(ref_logits).all()
    rtol, atol = _tol(config.dtype, ref_logits)
    for b in BACKENDS:
        logits, hidden = results[b]
        assert logits.dtype == np.dtype(config.dtype)
        np.testing.assert_allclose(logits, ref_logits, rtol=rtol, atol=atol, err_msg=b)
        np.testing.assert_allclose(whole[b], ref_logits, rtol=rtol, atol=atol, err_msg=b + " whole")
        assert sorted(hidden) == norm_layers
        for l in norm_layers:
            np.testing.assert_allclose(hidden[l], ref_hidden[l], rtol=rtol,
                                       atol=_tol(config.dtype, ref_hidden[l])[1], err_msg=f"{b} {l}")


test_forward_fuzz, test_forward_fuzz_slow = fast_and_slow(
    config=configs(), seed=st.integers(0, 2**16), data=st.data())(_forward_property)


def _forward_embeddings_property(config, seed, data):
    """The DFlash block path: forward_embeddings leaves the cache length and agrees across
    backends, causal or not."""
    model = fs.Transformer.random(config, seed=seed)
    rng = np.random.default_rng(seed)
    p = data.draw(st.integers(0, config.max_seq_len - 1), label="prefix")
    n = data.draw(st.integers(1, config.max_seq_len - p), label="n")
    causal = data.draw(st.booleans(), label="causal")
    x = rng.standard_normal((n, config.dim)).astype(config.dtype)
    prefix = rng.integers(0, config.vocab_size, p)
    got = {}
    for b in BACKENDS:
        with fs.using_backend(b):
            cache = model.new_cache()
            if p:
                model.forward(prefix, cache)
            got[b] = model.forward_embeddings(x, cache, causal=causal).logits.copy()
        assert cache.length == p
    rtol, atol = _tol(config.dtype, got["numpy"])
    for b in BACKENDS:
        np.testing.assert_allclose(got[b], got["numpy"], rtol=rtol, atol=atol, err_msg=b)


test_forward_embeddings_fuzz, test_forward_embeddings_fuzz_slow = fast_and_slow(
    config=configs(), seed=st.integers(0, 2**16), data=st.data())(_forward_embeddings_property)
