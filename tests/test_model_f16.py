"""weight_dtype="float16": matrices stored in float16, float32 compute, bit-identical results.

Every comparison is exact (``assert_array_equal``) against the float32 model whose weights are
the same float16 values widened to float32, on both backends.
"""
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec.model import ModelConfig, Transformer

from _helpers import MODEL_CONFIGS, needs_cython

needs_data = pytest.mark.skipif(not fs.pretrained.available(), reason="embedded models missing")

MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")

CONFIGS = MODEL_CONFIGS


def pair(name, seed=0):
    """Return (float16-weight model, float32 model on the same widened weights)."""
    m16 = Transformer.random(ModelConfig.tiny_llama(weight_dtype="float16", **CONFIGS[name]),
                             seed=seed)
    return m16, m16.with_weight_dtype("float32")


@pytest.fixture(params=sorted(CONFIGS))
def models(request):
    return pair(request.param)


@pytest.fixture(scope="module")
def embedded():
    if not fs.pretrained.available():
        pytest.skip("embedded models missing")
    return fs.pretrained.load(), fs.pretrained.load(weight_dtype="float32")


def eq(a, b):
    np.testing.assert_array_equal(a, b)


# --- config --------------------------------------------------------------------------------

def test_config_values_and_bad_combinations():
    c = ModelConfig.tiny_llama(weight_dtype="float16")
    assert c.weight_dtype == "float16" and c.matrix_dtype == "float16"
    assert ModelConfig.tiny_llama().weight_dtype is None
    assert ModelConfig.tiny_llama().matrix_dtype == "float32"
    # equal to dtype: normalised to None (so configs compare equal)
    assert ModelConfig.tiny_llama(weight_dtype="float32") == ModelConfig.tiny_llama()
    assert ModelConfig.tiny_llama("float64", weight_dtype="float64").weight_dtype is None
    with pytest.raises(ValueError, match="'float16' needs dtype 'float32'"):
        ModelConfig.tiny_llama("float64", weight_dtype="float16")
    with pytest.raises(ValueError, match="does not match dtype"):
        ModelConfig.tiny_llama("float64", weight_dtype="float32")
    with pytest.raises(ValueError, match="does not match dtype"):
        ModelConfig.tiny_llama("float32", weight_dtype="float64")
    with pytest.raises(ValueError, match="weight_dtype must be"):
        ModelConfig.tiny_llama(weight_dtype="float8")
    with pytest.raises(ValueError, match="needs dtype"):
        c.replace(dtype="float64")


def test_config_dict_round_trip_and_old_dicts():
    c = ModelConfig.tiny_llama(weight_dtype="float16")
    d = json.loads(json.dumps(c.to_dict()))
    assert d["weight_dtype"] == "float16"
    assert ModelConfig.from_dict(d) == c
    plain = ModelConfig.tiny_llama().to_dict()
    assert "weight_dtype" not in plain  # readable by versions without the field
    assert ModelConfig.from_dict(plain).weight_dtype is None


def test_arrays_and_dtypes(models):
    m16, m32 = models
    for m, wdt in ((m16, np.float16), (m32, np.float32)):
        assert m.embed.dtype == wdt and m.head.dtype == wdt
        assert m.embed.flags.c_contiguous
        # a tied head is the embedding's transpose, uncopied; an untied one is C-contiguous
        assert (np.shares_memory(m.head, m.embed) if m.config.tie_embeddings
                else m.head.flags.c_contiguous)
        for lw in m.layers:
            for k, a in lw.arrays().items():
                assert a.dtype == (wdt if k in MATRICES else np.float32), k
                assert a.flags.c_contiguous
        for a in (m.final_norm, m.pos_embed, m.rope_cos):
            assert a is None or a.dtype == np.float32
    # the float32 model holds exactly the widened float16 values
    eq(m32.embed, m16.embed.astype(np.float32))
    eq(m32.layers[0].wq, m16.layers[0].wq.astype(np.float32))
    # float32 -> float16 -> float32 is the identity on these values
    back = m32.with_weight_dtype("float16")
    eq(back.head, m16.head)
    assert back.config == m16.config


# --- bit-identical forward ------------------------------------------------------------------

def _run_all(model, ids, block, layers):
    """Prefill, n=1 decode steps, an n=9 block and a non-causal block on one cache."""
    cache = model.new_cache()
    out = [model.forward(ids[:20], cache, hidden_layers=layers)]
    for t in ids[20:26]:
        out.append(model.forward([t], cache, hidden_layers=layers))
    out.append(model.forward(block, cache, hidden_layers=layers))
    out.append(model.forward(block[:5], cache, causal=False))
    return out, cache


def test_forward_bit_identical(backend, models):
    m16, m32 = models
    rng = np.random.default_rng(5)
    V = m16.config.vocab_size
    ids, block = rng.integers(0, V, 26), rng.integers(0, V, 9)
    layers = (0, -1)
    a, ca = _run_all(m16, ids, block, layers)
    b, cb = _run_all(m32, ids, block, layers)
    for x, y in zip(a, b):
        eq(x.logits, y.logits)
        assert x.hidden.keys() == y.hidden.keys()
        for k in x.hidden:
            eq(x.hidden[k], y.hidden[k])
    eq(ca.k, cb.k)
    eq(ca.v, cb.v)


def test_forward_embeddings_and_context_kv_bit_identical(backend, models):
    m16, m32 = models
    c = m16.config
    rng = np.random.default_rng(6)
    feats = rng.normal(size=(7, c.dim)).astype(np.float32)
    x = rng.normal(size=(9, c.dim)).astype(np.float32)
    res = []
    for m in (m16, m32):
        cache = m.new_cache()
        m.write_context_kv(feats, cache)
        m.write_context_kv(feats[:3], cache, layer=-1, advance=False)
        o1 = m.forward_embeddings(x, cache, hidden_layers=[1], causal=False)
        o2 = m.forward_embeddings(x[:1], cache)
        res.append((o1, o2, cache))
    (a1, a2, ca), (b1, b2, cb) = res
    eq(a1.logits, b1.logits)
    eq(a1.hidden[1], b1.hidden[1])
    eq(a2.logits, b2.logits)
    eq(ca.k, cb.k)
    eq(ca.v, cb.v)


@needs_cython
def test_backends_agree_within_rounding(models):
    m16, _ = models
    ids = np.arange(30) % m16.config.vocab_size
    with fs.using_backend("cython"):
        a = m16.forward(ids).logits
    with fs.using_backend("numpy"):
        b = m16.forward(ids).logits
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@needs_cython
def test_runner_refuses_wrong_weight_arrays():
    m16, _ = pair("llama-gqa")
    m16.layers[0].wq = m16.layers[0].wq.astype(np.float32)  # a float32 matrix in a f16 model
    m16.invalidate()
    with fs.using_backend("cython"), pytest.raises(TypeError, match="float16"):
        m16.forward([1, 2])


def test_greedy_generate_identical(backend, models):
    m16, m32 = models
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    a = fs.generate(m16, prompt, 64)
    b = fs.generate(m32, prompt, 64)
    assert a.tokens == b.tokens and len(a.tokens) == 64


# --- persistence ----------------------------------------------------------------------------

def test_npz_round_trip_keeps_weight_dtype(tmp_path, models):
    m16, _ = models
    path = tmp_path / "m.npz"
    m16.save(path)
    back = Transformer.load(path)
    assert back.config == m16.config
    eq(back.layers[0].w_down, m16.layers[0].w_down)
    ids = np.arange(12) % m16.config.vocab_size
    eq(back.forward(ids).logits, m16.forward(ids).logits)
    assert Transformer.load(path, weight_dtype="float32").config.weight_dtype is None
    # float64 compute cannot keep float16 matrices: they follow dtype
    assert Transformer.load(path, dtype="float64").config.matrix_dtype == "float64"
    with pytest.raises(ValueError, match="needs dtype"):
        Transformer.load(path, dtype="float64", weight_dtype="float16")


def test_hf_round_trip_with_weight_dtype(tmp_path):
    m16, _ = pair("qwen2-bias")
    m16.save(tmp_path / "hf")
    back = Transformer.load(tmp_path / "hf", weight_dtype="float16")
    assert back.config.weight_dtype == "float16"
    ids = np.arange(12)
    eq(back.forward(ids).logits, m16.forward(ids).logits)


# --- the embedded models and DFlash ---------------------------------------------------------

@needs_data
def test_pretrained_default_is_float16(embedded):
    b16, b32 = embedded
    for m in (b16.target, b16.draft):
        assert m.config.weight_dtype == "float16" and m.embed.dtype == np.float16
    assert b16.dflash.layers[0].wq.dtype == np.float16
    assert b32.target.config.weight_dtype is None and b32.target.embed.dtype == np.float32
    assert fs.pretrained.load("float64").target.config.matrix_dtype == "float64"


@needs_data
def test_pretrained_target_bit_identical(backend, embedded):
    (b16, b32) = embedded
    rng = np.random.default_rng(7)
    ids, block = rng.integers(0, 256, 300), rng.integers(0, 256, 9)
    taps = b16.dflash.config.tap_layers
    out = []
    for m in (b16.target, b32.target):
        cache = m.new_cache(320)
        p = m.forward(ids, cache, hidden_layers=taps)
        steps = [m.forward([t], cache).logits for t in block[:3]]
        v = m.forward(block, cache, hidden_layers=taps)
        out.append((p, steps, v))
    (p1, s1, v1), (p2, s2, v2) = out
    eq(p1.logits, p2.logits)
    for t in taps:
        eq(p1.hidden[t], p2.hidden[t])
        eq(v1.hidden[t], v2.hidden[t])
    for x, y in zip(s1, s2):
        eq(x, y)
    eq(v1.logits, v2.logits)


@needs_data
def test_pretrained_dflash_speculative_identical(backend, embedded):
    b16, b32 = embedded
    prompt = list(b16.tokenizer.encode("The quick brown fox "))
    res = []
    for b in (b16, b32):
        drafter = fs.DFlashDrafter(b.dflash)
        res.append(fs.speculative_generate(b.target, drafter, prompt, 64))
    assert res[0].tokens == res[1].tokens
    assert res[0].stats.target_calls == res[1].stats.target_calls
    assert res[0].tokens == fs.generate(b16.target, prompt, 64).tokens


@needs_data
def test_dflash_block_bit_identical(backend, embedded):
    b16, b32 = embedded
    prompt = np.array(b16.tokenizer.encode("Once upon a time, "))
    blocks = []
    for b in (b16, b32):
        m = b.dflash
        out = b.target.forward(prompt, hidden_layers=m.config.tap_layers)
        cache = m.new_cache()
        m.append_context(cache, m.context_features(out.hidden))
        blocks.append(m.draft_block(cache, int(prompt[-1])).copy())
        ref = m.draft_block_reference(out.hidden, m.mask_block(int(prompt[-1])))
        np.testing.assert_allclose(blocks[-1], ref, rtol=1e-3, atol=1e-3)
    eq(blocks[0], blocks[1])


@needs_cython
def test_threaded_products_bit_identical():
    """Column blocks split between the pool's threads change nothing."""
    from fastspec.kernels import _isa

    # products of >= FS_LIN_PARALLEL_MIN weights are split (fs_linear.c): the FFN (256 x 1088)
    # and the head (256 x 1030); 1030 columns leave a remainder that is not a multiple of 16
    m16 = Transformer.random(ModelConfig.tiny_llama(weight_dtype="float16", vocab_size=1030,
                                                    ffn_dim=1088, n_layers=1, max_seq_len=64),
                             seed=2)
    m32 = m16.with_weight_dtype("float32")
    ids = np.arange(20) % m16.config.vocab_size
    threads = _isa.get_threads()
    with fs.using_backend("cython"):
        try:
            _isa.set_threads(1)
            single = m16.forward(ids).logits
            _isa.set_threads(2)
            eq(m16.forward(ids).logits, m32.forward(ids).logits)
            eq(m16.forward(ids[:1]).logits, m32.forward(ids[:1]).logits)
            eq(m16.forward(ids).logits, single)
        finally:
            _isa.set_threads(threads)
