"""Transformer: cache/block equivalence, causality, rollback, backends, families, persistence."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.model.functional import apply_rope, rms_norm
from fastspec.model import ModelConfig, Transformer

from _helpers import RTOL, needs_cython

CONFIGS = {
    "toy": dict(vocab_size=11, dim=16, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=32,
                norm="layernorm", positional="learned", activation="tanh",
                tie_embeddings=False, max_seq_len=48),
    "toy-gelu": dict(vocab_size=11, dim=12, n_layers=2, n_heads=3, ffn_dim=20,
                     norm="layernorm", positional="learned", activation="gelu",
                     tie_embeddings=False, max_seq_len=48),
    "llama-gqa": dict(vocab_size=37, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=40,
                      max_seq_len=48),
    "qwen3-untied": dict(vocab_size=37, dim=32, n_layers=3, n_heads=4, n_kv_heads=1,
                         head_dim=12, ffn_dim=40, qk_norm=True, tie_embeddings=False,
                         max_seq_len=48, rope_theta=500.0),
    "qwen2-bias": dict(vocab_size=37, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=40,
                       qkv_bias=True, max_seq_len=48),
}


def make(name, dtype, seed=0):
    return Transformer.random(ModelConfig(dtype=np.dtype(dtype).name, **CONFIGS[name]), seed=seed)


def tol(dtype):
    return dict(rtol=RTOL[dtype], atol=RTOL[dtype] * 10)


@pytest.fixture(params=sorted(CONFIGS))
def family(request):
    return request.param


def ids_for(model, n, seed=1):
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n)


def test_chunks_match_one_pass(backend, dtype, family):
    model = make(family, dtype)
    ids = ids_for(model, 29)
    full_cache = model.new_cache()
    full = model.forward(ids, full_cache, hidden_layers=(0, -1))
    cache = model.new_cache()
    logits, hid0, hid_last, pos = [], [], [], 0
    for size in (3, 1, 7, 2, 16):
        out = model.forward(ids[pos:pos + size], cache, hidden_layers=(0, -1))
        logits.append(out.logits)
        hid0.append(out.hidden[0])
        hid_last.append(out.hidden[model.config.n_layers - 1])
        pos += size
    assert cache.length == full_cache.length == 29
    np.testing.assert_allclose(np.concatenate(logits), full.logits, **tol(dtype))
    np.testing.assert_allclose(np.concatenate(hid0), full.hidden[0], **tol(dtype))
    np.testing.assert_allclose(np.concatenate(hid_last),
                               full.hidden[model.config.n_layers - 1], **tol(dtype))
    np.testing.assert_allclose(cache.k[:, :, :29], full_cache.k[:, :, :29], **tol(dtype))
    np.testing.assert_allclose(cache.v[:, :, :29], full_cache.v[:, :, :29], **tol(dtype))
    assert full.logits.dtype == dtype and full.logits.shape == (29, model.config.vocab_size)


def test_forward_without_cache_is_a_fresh_sequence(backend, dtype):
    model = make("llama-gqa", dtype)
    ids = ids_for(model, 10)
    a = model.forward(ids).logits
    b = model.forward(ids, model.new_cache()).logits
    np.testing.assert_array_equal(a, b)


def test_causal_invariance(backend, dtype, family):
    model = make(family, dtype)
    ids = ids_for(model, 12)
    changed = ids.copy()
    changed[-1] = (changed[-1] + 1) % model.config.vocab_size
    a = model.forward(ids).logits
    b = model.forward(changed).logits
    np.testing.assert_array_equal(a[:-1], b[:-1])
    assert not np.allclose(a[-1], b[-1])


def test_rollback_equals_never_fed(backend, dtype, family):
    model = make(family, dtype)
    ids = ids_for(model, 20)
    cache = model.new_cache()
    model.forward(ids[:10], cache)
    model.forward(ids_for(model, 6, seed=7), cache)  # rejected draft
    cache.crop(10)
    again = model.forward(ids[10:], cache).logits
    clean = model.new_cache()
    model.forward(ids[:10], clean)
    np.testing.assert_array_equal(again, model.forward(ids[10:], clean).logits)


@needs_cython
def test_backends_agree(dtype, family):
    model = make(family, dtype, seed=3)
    ids = ids_for(model, 21)
    results = {}
    for name in ("numpy", "cython"):
        with fs.using_backend(name):
            cache = model.new_cache()
            first = model.forward(ids[:13], cache, hidden_layers=(1,))
            second = model.forward(ids[13:], cache, causal=False)
            one = model.forward(ids[:1], cache)
        results[name] = (first.logits, first.hidden[1], second.logits, one.logits,
                         cache.k[:, :, :cache.length], cache.v[:, :, :cache.length])
    for a, b in zip(results["numpy"], results["cython"]):
        scale = np.max(np.abs(a))
        assert np.max(np.abs(a - b)) <= RTOL[dtype] * scale


def explicit_forward(model, ids, causal):
    """A from-scratch forward with a full attention matrix (no cache, no kernels)."""
    c = model.config
    n = len(ids)
    x = model.embed[ids].astype(np.float64)
    if c.positional == "learned":
        x = x + model.pos_embed[:n]
    cos, sin = (None, None) if model.rope_cos is None else (model.rope_cos[:n], model.rope_sin[:n])
    mask = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    for lw in model.layers:
        h = model.norm(x, lw.attn_norm)
        q = (h @ lw.wq).reshape(n, c.n_heads, c.head_dim)
        k = (h @ lw.wk).reshape(n, c.n_kv_heads, c.head_dim)
        v = (h @ lw.wv).reshape(n, c.n_kv_heads, c.head_dim)
        if lw.q_bias is not None:
            q = q + lw.q_bias.reshape(c.n_heads, c.head_dim)
            k = k + lw.k_bias.reshape(c.n_kv_heads, c.head_dim)
            v = v + lw.v_bias.reshape(c.n_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = rms_norm(q, lw.q_norm, c.norm_eps), rms_norm(k, lw.k_norm, c.norm_eps)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        g = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(c.head_dim)
        s = np.where(mask[None], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("hij,jhd->ihd", w, v).reshape(n, -1) @ lw.wo
        h = model.norm(x, lw.mlp_norm)
        if c.activation == "swiglu":
            u = h @ lw.w_gate
            f = u / (1 + np.exp(-u)) * (h @ lw.w_up)
        elif c.activation == "tanh":
            f = np.tanh(h @ lw.w_up)
        else:
            u = h @ lw.w_up
            f = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
        x = x + f @ lw.w_down
    return model.norm(x, model.final_norm) @ model.head


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_matches_explicit_reference(backend, family, causal):
    model = make(family, np.float64)
    ids = ids_for(model, 9)
    got = model.forward(ids, causal=causal).logits
    np.testing.assert_allclose(got, explicit_forward(model, ids, causal), rtol=1e-10, atol=1e-10)


def test_forward_embeddings_does_not_advance(backend, dtype):
    model = make("qwen3-untied", dtype)
    ids = ids_for(model, 14)
    cache = model.new_cache()
    model.forward(ids[:10], cache)
    x = model.embed[ids[10:]]
    out = model.forward_embeddings(x, cache, hidden_layers=(0,), causal=False)
    assert cache.length == 10
    ref_cache = model.new_cache()
    model.forward(ids[:10], ref_cache)
    ref = model.forward(ids[10:], ref_cache, hidden_layers=(0,), causal=False)
    np.testing.assert_allclose(out.logits, ref.logits, **tol(dtype))
    np.testing.assert_allclose(out.hidden[0], ref.hidden[0], **tol(dtype))


def test_write_context_kv_matches_projection(backend, dtype):
    model = make("qwen3-untied", dtype)
    c = model.config
    feats = np.random.default_rng(5).standard_normal((6, c.dim)).astype(dtype)
    cache = model.new_cache()
    model.forward(ids_for(model, 4), cache)
    model.write_context_kv(feats, cache)
    assert cache.length == 10
    pos = np.arange(4, 10)
    for i, lw in enumerate(model.layers):
        k = rms_norm((feats @ lw.wk).reshape(6, c.n_kv_heads, c.head_dim), lw.k_norm, c.norm_eps)
        k = apply_rope(k, model.rope_cos[pos], model.rope_sin[pos])
        v = (feats @ lw.wv).reshape(6, c.n_kv_heads, c.head_dim)
        np.testing.assert_allclose(cache.k[i, :, 4:10], k.transpose(1, 0, 2), **tol(dtype))
        np.testing.assert_allclose(cache.v[i, :, 4:10], v.transpose(1, 0, 2), **tol(dtype))
    before = cache.k.copy()
    model.write_context_kv(feats[:2], cache, layer=-1, advance=False)
    assert cache.length == 10
    np.testing.assert_array_equal(cache.k[:-1], before[:-1])


def test_out_buffer_is_filled_and_returned(backend):
    model = make("llama-gqa", np.float32)
    out = np.empty((3, model.config.vocab_size), np.float32)
    res = model.forward(ids_for(model, 3), out=out)
    assert res.logits is out
    np.testing.assert_allclose(out, model.forward(ids_for(model, 3)).logits, rtol=1e-6)
    with pytest.raises(ValueError, match="out"):
        model.forward(ids_for(model, 3), out=np.empty((2, model.config.vocab_size), np.float32))


@pytest.mark.parametrize("weight_dtype", [None, "float16", "bfloat16", "q8_0"])
def test_logit_rows_are_the_last_rows_of_a_full_step(backend, dtype, weight_dtype):
    # a prefill asks for the last row's logits (vanilla) or none (speculative): those rows are
    # the same bits as in a full step, the cache is the same, and the next step agrees
    if weight_dtype is not None and dtype == np.float64:
        pytest.skip("compressed weights compute in float32")
    if weight_dtype == "q8_0":  # blocks of 32 inputs
        cfg = ModelConfig(vocab_size=37, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                          ffn_dim=96, max_seq_len=32)
        model = Transformer.random(cfg, seed=0).quantize("q8_0")
    else:
        model = make("llama-gqa", dtype)
        if weight_dtype is not None:
            model = model.with_weight_dtype(weight_dtype)
    ids = ids_for(model, 9)
    full_cache = model.new_cache()
    full = model.step(ids, full_cache).logits.copy()
    following = model.step(ids[:1], full_cache).logits.copy()
    for k in (0, 1, 4, 9):
        cache = model.new_cache()
        got = model.step(ids, cache, logit_rows=k).logits
        assert got.shape == (k, model.config.vocab_size)
        np.testing.assert_array_equal(got, full[9 - k:])
        assert cache.length == 9
        np.testing.assert_array_equal(model.step(ids[:1], cache).logits, following)
    out = np.empty((2, model.config.vocab_size), dtype)
    assert model.step(ids, model.new_cache(), logit_rows=2, out=out).logits is out
    with pytest.raises(ValueError, match="out"):
        model.step(ids, model.new_cache(), logit_rows=2, out=np.empty_like(full))
    for bad, error in ((-1, ValueError), (10, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="logit_rows"):
            model.step(ids, model.new_cache(), logit_rows=bad)


def test_bad_arguments(backend):
    model = make("llama-gqa", np.float32)
    with pytest.raises(ValueError, match="ids must be in"):
        model.forward([0, 37])
    with pytest.raises(TypeError, match="ids must be integers"):
        model.forward([0.5])
    with pytest.raises(ValueError, match="ids must not be empty"):
        model.forward([], model.new_cache())
    with pytest.raises(ValueError, match="hidden_layers"):
        model.forward([1], hidden_layers=(2,))
    cache = model.new_cache(capacity=4)
    model.forward([1, 2, 3], cache)
    with pytest.raises(ValueError, match="capacity"):
        model.forward([1, 2], cache)
    assert cache.length == 3
    with pytest.raises((TypeError, ValueError)):
        model.forward([1], make("qwen3-untied", np.float32).new_cache())
    with pytest.raises((TypeError, ValueError)):
        model.forward([1], make("llama-gqa", np.float64).new_cache())
    with pytest.raises(ValueError, match="x must be"):
        model.forward_embeddings(np.zeros((2, 5), np.float32), model.new_cache())


def test_npz_round_trip(tmp_path, family):
    model = make(family, np.float32)
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = Transformer.load(path)
    assert loaded.config == model.config
    ids = ids_for(model, 8)
    np.testing.assert_array_equal(loaded.forward(ids).logits, model.forward(ids).logits)
    as64 = Transformer.load(path, dtype="float64")
    assert as64.forward(ids).logits.dtype == np.float64


def test_config_validation():
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig(vocab_size=4, dim=8, n_layers=1, n_heads=3, head_dim=4, n_kv_heads=2)
    with pytest.raises(ValueError, match="norm"):
        ModelConfig(vocab_size=4, dim=8, n_layers=1, n_heads=2, norm="batchnorm")
    cfg = ModelConfig.tiny_llama()
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.ffn_dim) == (260, 256, 4, 8, 704)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@needs_cython
def test_threaded_products_agree():
    from fastspec.kernels import _isa
    model = make("llama-gqa", np.float64)
    # its FFN (256 x 1088) holds FS_LIN_PARALLEL_MIN weights or more: threads split it
    big = Transformer.random(ModelConfig.tiny_llama(dtype="float64", n_layers=1, ffn_dim=1088,
                                                    max_seq_len=32))
    threads = _isa.get_threads()
    with fs.using_backend("cython"):
        for m in (model, big):
            ids = ids_for(m, 9)
            try:
                _isa.set_threads(1)
                one = m.forward(ids).logits
                _isa.set_threads(2)
                two = m.forward(ids).logits
            finally:
                _isa.set_threads(threads)
            np.testing.assert_array_equal(two, one)  # the same bits


@needs_cython
def test_set_threads_rejects_zero():
    from fastspec.kernels import _isa
    with pytest.raises(ValueError, match="n must be"):
        _isa.set_threads(0)


@needs_cython
@pytest.mark.parametrize("weight_dtype", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_block_rows_are_bit_identical_to_decode_steps(weight_dtype, head_dim):
    # What greedy speculative decoding compares: the logits of a verification block (n rows)
    # and those of the decode steps that vanilla decoding would run, one token at a time.
    # The fused float32 forward computes each row the same way in both (linear: products in
    # k order; attention: per-row tiles), so they agree bit for bit, not just within 1e-6.
    with fs.using_backend("cython"):
        cfg = ModelConfig(vocab_size=53, dim=4 * head_dim, n_layers=2, n_heads=4, n_kv_heads=2,
                          ffn_dim=3 * head_dim + 8, max_seq_len=300, weight_dtype=weight_dtype)
        model = Transformer.random(cfg, seed=3)
        ids = ids_for(model, 150)
        block_cache, step_cache = model.new_cache(), model.new_cache()
        model.forward(ids[:141], block_cache)
        model.forward(ids[:141], step_cache)
        block = model.forward(ids[141:], block_cache, hidden_layers=(0,))
        steps = [model.forward(ids[i:i + 1], step_cache, hidden_layers=(0,)) for i in range(141, 150)]
    np.testing.assert_array_equal(block.logits, np.concatenate([s.logits for s in steps]))
    np.testing.assert_array_equal(block.hidden[0], np.concatenate([s.hidden[0] for s in steps]))
    np.testing.assert_array_equal(block_cache.k[:, :, :150], step_cache.k[:, :, :150])
