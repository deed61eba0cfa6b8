"""Tree attention and the tree step: every node's logits equal a causal forward of its path."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels.tree_shape import ancestor_mask, chain_parents

from _helpers import BACKENDS, RTOL, toy

I = np.int64
PARENTS = np.array([-1, 0, 0, 1, -1, 4, 2, 3], dtype=I)


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def test_tree_attention_is_causal_attention_of_each_path(backend, dtype):
    rng = np.random.default_rng(0)
    ctx, n, H, Hkv, D = 5, PARENTS.shape[0], 4, 2, 8
    k = rng.normal(size=(Hkv, ctx + n + 3, D)).astype(dtype)
    v = rng.normal(size=(Hkv, ctx + n + 3, D)).astype(dtype)
    q = rng.normal(size=(n, H, D)).astype(dtype)
    out = fs.kernels.tree_attention(q, k, v, ctx + n, ancestor_mask(PARENTS))
    for i in range(n):
        rows = list(range(ctx)) + [ctx + j for j in _path(PARENTS, i)]
        want = fs.kernels.attention(q[i:i + 1], np.ascontiguousarray(k[:, rows]),
                                    np.ascontiguousarray(v[:, rows]), len(rows))
        np.testing.assert_allclose(out[i], want[0], rtol=RTOL[dtype] * 10, atol=RTOL[dtype])
    # a chain mask is plain causal attention
    chain = fs.kernels.tree_attention(q, k, v, ctx + n, ancestor_mask(chain_parents(n)))
    np.testing.assert_allclose(chain, fs.kernels.attention(q, k, v, ctx + n),
                               rtol=RTOL[dtype] * 10, atol=RTOL[dtype])


@pytest.mark.parametrize("length", [8, 13])
def test_tree_attention_backends_agree(dtype, length):
    rng = np.random.default_rng(length)
    n = PARENTS.shape[0]
    k = rng.normal(size=(2, 16, 8)).astype(dtype)
    v = rng.normal(size=(2, 16, 8)).astype(dtype)
    q = rng.normal(size=(n, 4, 8)).astype(dtype)
    mask = ancestor_mask(PARENTS)
    outs = [fs.kernels.module(b).tree_attention(q, k, v, length, mask) for b in BACKENDS]
    for o in outs[1:]:
        assert o.dtype == dtype
        np.testing.assert_allclose(o, outs[0], rtol=RTOL[dtype], atol=RTOL[dtype])


def test_tree_attention_bad_mask(backend):
    q = np.zeros((2, 2, 4))
    k = np.zeros((2, 6, 4))
    with pytest.raises(TypeError, match="tree_mask must be a bool"):
        fs.kernels.tree_attention(q, k, k, 4, np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"tree_mask must have shape \(2, 2\)"):
        fs.kernels.tree_attention(q, k, k, 4, np.ones((3, 3), dtype=bool))
    with pytest.raises(ValueError, match="diagonal"):
        fs.kernels.tree_attention(q, k, k, 4, np.zeros((2, 2), dtype=bool))


def test_compact_kv(backend, dtype):
    rng = np.random.default_rng(1)
    k = rng.normal(size=(2, 3, 12, 4)).astype(dtype)
    v = rng.normal(size=(2, 3, 12, 4)).astype(dtype)
    k0, v0 = k.copy(), v.copy()
    rows = np.array([4, 6, 9], dtype=I)
    fs.kernels.compact_kv(k, v, 4, rows)
    np.testing.assert_array_equal(k[:, :, 4:7], k0[:, :, rows])
    np.testing.assert_array_equal(v[:, :, 4:7], v0[:, :, rows])
    np.testing.assert_array_equal(k[:, :, :4], k0[:, :, :4])
    for bad in ([5, 4], [3], [4, 12], [4, 4]):
        with pytest.raises(ValueError, match="rows must increase"):
            fs.kernels.compact_kv(k, v, 4, np.array(bad, dtype=I))


MODELS = {
    "toy": lambda dt: toy(3, 2, dt),   # learned positions
    "llama": lambda dt: fs.Transformer.random(fs.ModelConfig(
        vocab_size=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
        max_seq_len=64, dtype=dt), 2),  # RoPE, grouped-query attention
}


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_tree_step_equals_path_forwards(backend, family, dt):
    model = MODELS[family](dt)
    rng = np.random.default_rng(4)
    context = rng.integers(0, model.config.vocab_size, 6)
    ids = rng.integers(0, model.config.vocab_size, PARENTS.shape[0])
    cache = model.new_cache()
    model.step(context, cache)
    out = model.step(ids, cache, tree_parents=PARENTS, hidden_layers=(0,))
    assert cache.length == 6 + PARENTS.shape[0]
    tol = dict(rtol=1e-4, atol=1e-4) if dt == "float32" else dict(rtol=1e-9, atol=1e-9)
    for i in range(PARENTS.shape[0]):
        seq = np.concatenate([context, ids[_path(PARENTS, i)]])
        ref = model.forward(seq, hidden_layers=(0,))
        np.testing.assert_allclose(out.logits[i], ref.logits[-1], **tol)
        np.testing.assert_allclose(out.hidden[0][i], ref.hidden[0][-1], **tol)


def test_tree_step_bad_input():
    model = toy(3, 1, max_seq_len=12)
    cache = model.new_cache()
    model.step([1, 2, 3], cache)
    with pytest.raises(ValueError, match=r"tree_parents\[1\] = 3"):
        model.step([1, 2, 3], cache, tree_parents=np.array([-1, 3, 0], dtype=I))
    with pytest.raises(ValueError, match="one entry per token"):
        model.step([1, 2, 3], cache, tree_parents=np.array([-1, 0], dtype=I))
    with pytest.raises(ValueError, match="exceeds the room left"):  # 3 + depth 10 > 12
        model.step([1] * 10, cache, tree_parents=chain_parents(10))
    with pytest.raises(ValueError, match="causal"):
        model.step([1, 2], cache, tree_parents=np.array([-1, -1], dtype=I), causal=False)
    assert cache.length == 3
