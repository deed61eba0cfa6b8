"""The fused runner's tree step: sequence positions and an ancestor mask inside one nogil call.

``Transformer.step(tree_parents=...)`` hands the runner ``positions`` and ``tree_mask`` on the
Cython backend; the NumPy backend runs the layer path (``_layers_numpy`` with
``kernels.tree_attention``), the oracle here. Rows are written at ``cache.length + i`` and
rotated (or position-embedded) at ``cache.length + depth_i - 1``.
"""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels.tree_shape import MAX_TREE_NODES, ancestor_mask, tree_depths

from _helpers import GEMMA, MODEL_CONFIGS, RTOL, needs_cython

I = np.int64
#: weight_dtype -> (rtol, atol) of fused vs NumPy logits; float16/bfloat16 as in their own
#: tests (bf16: an input within a float32 ulp of a bf16 boundary may round either way).
TOL = {("float64", None): (1e-9, 1e-9), ("float32", None): (1e-4, 1e-4),
       ("float32", "float16"): (1e-4, 1e-4), ("float32", "bfloat16"): (0.0, 1e-2)}


def random_parents(rng, n):
    """A random tree of ``n`` nodes in topological order (parents in [-1, i))."""
    return np.array([rng.integers(-1, i) for i in range(n)], dtype=I)


def model_of(family, dt, weight_dtype=None, **over):
    cfg = fs.ModelConfig(**{**MODEL_CONFIGS[family], "dtype": dt, **over})
    model = fs.Transformer.random(cfg, seed=3)
    return model.with_weight_dtype(weight_dtype) if weight_dtype else model


def tree_step(model, context, ids, parents, backend, monkeypatch, hidden=(0, -1)):
    """Logits, hidden states and cache of a tree step after ``context``, on ``backend``."""
    with fs.using_backend(backend), monkeypatch.context() as m:
        if backend == "cython":  # the fused runner must take the tree, not the layer path
            m.setattr(model, "_layers_numpy", None)
        cache = model.new_cache()
        model.step(context, cache)
        out = model.step(ids, cache, tree_parents=parents, hidden_layers=hidden)
    return out, cache


def check_close(fused, ref, cache_f, cache_r, rtol, atol):
    scale = max(float(np.abs(ref.logits).max()), 1.0) if rtol == 0 else 1.0
    np.testing.assert_allclose(fused.logits, ref.logits, rtol=rtol, atol=atol * scale)
    for layer, h in ref.hidden.items():
        np.testing.assert_allclose(fused.hidden[layer], h, rtol=rtol,
                                   atol=atol * max(float(np.abs(h).max()), 1.0))
    assert cache_f.length == cache_r.length
    n = cache_r.length
    kscale = max(float(np.abs(cache_r.k[:, :, :n]).max()), 1.0)
    np.testing.assert_allclose(cache_f.k[:, :, :n], cache_r.k[:, :, :n], rtol=rtol,
                               atol=atol * kscale)


CASES = [(fam, dt, None) for fam in sorted(MODEL_CONFIGS) for dt in ("float32", "float64")]
CASES += [(fam, "float32", w) for fam in ("llama-gqa", "qwen3-untied")
          for w in ("float16", "bfloat16")]


@needs_cython
@pytest.mark.parametrize("family,dt,weight_dtype", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_tree_step_matches_numpy_layers(family, dt, weight_dtype, seed, monkeypatch):
    model = model_of(family, dt, weight_dtype)
    rng = np.random.default_rng(seed)
    V = model.config.vocab_size
    n = int(rng.integers(5, 20))
    parents = random_parents(rng, n)
    assert not np.array_equal(tree_depths(parents), np.arange(1, n + 1))  # a real tree
    context = rng.integers(0, V, int(rng.integers(1, 30)))
    ids = rng.integers(0, V, n)
    fused, cf = tree_step(model, context, ids, parents, "cython", monkeypatch)
    ref, cr = tree_step(model, context, ids, parents, "numpy", monkeypatch)
    check_close(fused, ref, cf, cr, *TOL[(dt, weight_dtype)])


@needs_cython
@pytest.mark.parametrize("family,dt", [("toy", "float64"), ("llama-gqa", "float64"),
                                       ("qwen2-bias", "float32")])
def test_fused_tree_step_long_context(family, dt, monkeypatch):
    """Past 1024 keys the double template's masked attention runs its online softmax over key
    tiles, and a star (every node under the root) leaves whole tiles of node keys hidden from
    a row; float32 with head_dim 16 runs the tiled kernel over many tiles of 128 keys."""
    model = model_of(family, dt, max_seq_len=1400, vocab_size=50)
    rng = np.random.default_rng(7)
    context = rng.integers(0, 50, 1100)
    for parents in (random_parents(rng, 24), np.full(MAX_TREE_NODES, -1, dtype=I)):
        ids = rng.integers(0, 50, parents.shape[0])
        fused, cf = tree_step(model, context, ids, parents, "cython", monkeypatch)
        ref, cr = tree_step(model, context, ids, parents, "numpy", monkeypatch)
        check_close(fused, ref, cf, cr, *TOL[(dt, None)])


def _runner(model):
    from fastspec.model import _model
    return _model.TransformerRunner(model)


@needs_cython
@pytest.mark.parametrize("family", ["llama-gqa", "toy", "qwen3-untied"])
@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_chain_through_mask_equals_causal(family, dt):
    """positions start + i with a lower-triangular all-true mask is the plain causal step."""
    model = model_of(family, dt)
    runner = _runner(model)
    rng = np.random.default_rng(2)
    context, ids = rng.integers(0, model.config.vocab_size, (2, 9))
    outs = []
    for tree in (False, True):
        cache = model.new_cache()
        runner.forward(context, cache.k, cache.v, 0)
        kw = dict(positions=np.arange(9, 18, dtype=np.int32),
                  tree_mask=np.tril(np.ones((9, 9), dtype=bool))) if tree else {}
        logits, hidden = runner.forward(ids, cache.k, cache.v, 9, hidden_layers=(0,), **kw)
        outs.append((logits, hidden[0], cache.k[:, :, :18].copy()))
    rtol = 10 * RTOL[np.dtype(dt).type]
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


@needs_cython
def test_positions_move_rope_and_learned_embedding():
    """A node at depth d is rotated (or embedded) at cache.length + d - 1: equal to a plain
    forward of the node alone at that position, whatever block row it is written to."""
    for family in ("llama-gqa", "toy"):
        model = model_of(family, "float64")
        runner = _runner(model)
        cache = model.new_cache()
        runner.forward([1, 2, 3], cache.k, cache.v, 0)
        # node 1 is a second child of the root: position 3, row 4
        mask = np.array([[1, 0], [0, 1]], dtype=np.uint8)
        tree, _ = runner.forward([5, 6], cache.k, cache.v, 3,
                                 positions=np.array([3, 3], dtype=I), tree_mask=mask)
        alone, _ = runner.forward([6], cache.k, cache.v, 3)
        np.testing.assert_allclose(tree[1], alone[0], rtol=1e-12, atol=1e-12)
        shifted, _ = runner.forward([6], cache.k, cache.v, 3, positions=np.array([4], dtype=I))
        assert np.abs(shifted[0] - alone[0]).max() > 1e-6  # the position does matter


@needs_cython
def test_runner_rejects_bad_positions_and_masks():
    model = model_of("llama-gqa", "float32")
    runner = _runner(model)
    cache = model.new_cache()
    runner.forward([1, 2], cache.k, cache.v, 0)
    before = cache.k.copy()
    good_pos, good_mask = np.array([2, 3, 3], dtype=I), ancestor_mask(np.array([-1, 0, 0]))
    max_pos = model.config.max_seq_len
    bad = [
        (dict(positions=[2, 3, 3]), TypeError, "positions must be an int32 or int64 ndarray"),
        (dict(positions=np.array([2., 3., 3.])), TypeError, "positions must be an int32"),
        (dict(positions=np.array([2, 3], dtype=I)), ValueError, r"shape \(3,\)"),
        (dict(positions=np.array([2, -1, 3], dtype=I)), ValueError,
         rf"positions must be in \[0, {max_pos}\), got positions\[1\] = -1"),
        (dict(positions=np.array([2, 3, max_pos], dtype=np.int32)), ValueError,
         rf"got positions\[2\] = {max_pos}"),
        (dict(tree_mask=good_mask.astype(I)), TypeError, "tree_mask must be a bool or uint8"),
        (dict(tree_mask=good_mask.tolist()), TypeError, "tree_mask must be a bool or uint8"),
        (dict(tree_mask=good_mask[:2, :2]), ValueError, r"tree_mask must have shape \(3, 3\)"),
        (dict(tree_mask=good_mask & ~np.eye(3, dtype=bool) | np.eye(3, k=-1, dtype=bool)),
         ValueError, r"true diagonal .* tree_mask\[0, 0\] = 0"),
        (dict(tree_mask=good_mask | np.eye(3, k=1, dtype=bool)), ValueError,
         r"lower-triangular .* tree_mask\[0, 1\] set"),
        (dict(tree_mask=good_mask, causal=False), ValueError, "tree_mask needs causal=True"),
    ]
    for kw, exc, match in bad:
        kw = {"positions": good_pos, "tree_mask": good_mask, **kw}
        with pytest.raises(exc, match=match):
            runner.forward([4, 5, 6], cache.k, cache.v, 2, **kw)
    np.testing.assert_array_equal(cache.k, before)  # nothing was written
    runner.forward([4, 5, 6], cache.k, cache.v, 2, positions=good_pos, tree_mask=good_mask)
    assert not np.array_equal(cache.k, before)


@needs_cython
@pytest.mark.parametrize("n,length,head_dim,shape", [
    (1, 1100, 8, "tree"), (8, 1100, 8, "tree"), (257, 1400, 8, "star"), (8, 1100, 272, "tree"),
    (5, 40, 16, "tree"), (257, 1400, 16, "star"), (9, 300, 64, "tree"), (9, 300, 256, "tree"),
    (12, 200, 8, "any"), (12, 200, 32, "any")])
def test_tree_attention_kernel_backends_agree(dtype, n, length, head_dim, shape):
    """The masked C kernels (fastspec.kernels.tree_attention on Cython) against their NumPy
    twin. Double template: one row past 1024 keys (caller's scratch), the online softmax
    (whole tiles hidden by a star), head_dim over 256, short ranges. Tiled float32 kernel
    (head_dim a multiple of 16 up to 256): many tiles, Gemma's 256. Any mask with a true
    diagonal, not only a tree's."""
    rng = np.random.default_rng(n + head_dim)
    H, Hkv = 4, 2
    k = rng.normal(size=(Hkv, length + 3, head_dim)).astype(dtype)
    v = rng.normal(size=(Hkv, length + 3, head_dim)).astype(dtype)
    q = rng.normal(size=(n, H, head_dim)).astype(dtype)
    if shape == "any":
        mask = (rng.random((n, n)) < 0.4) | np.eye(n, dtype=bool)
    else:
        mask = ancestor_mask(np.full(n, -1, dtype=I) if shape == "star"
                             else random_parents(rng, n))
    got = fs.kernels.module("cython").tree_attention(q, k, v, length, mask)
    want = fs.kernels.module("numpy").tree_attention(q, k, v, length, mask)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype])


@needs_cython
@pytest.mark.parametrize("backend", ["cython"], indirect=True)  # whatever FASTSPEC_BACKEND says
@pytest.mark.parametrize("weight_dtype", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [16, 64, 256])
@pytest.mark.parametrize("family", [{}, dict(nope_layers=(1,)), GEMMA])
def test_tree_node_is_bit_identical_to_decode_of_its_path(weight_dtype, head_dim, family,
                                                           backend):
    """float32, a head size of the tiled attention kernel, up to 16 rows: every node's logits
    and K/V rows are those of decoding its path token by token, bit for bit (what makes greedy
    tree decoding equal vanilla decoding exactly); with a NoPE layer too (SmolLM3's), and with
    Gemma 3's GeGLU, sandwich norms and local RoPE layer."""
    cfg = fs.ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         head_dim=head_dim, ffn_dim=96, max_seq_len=96, dtype="float32",
                         weight_dtype=weight_dtype, **family)
    model = fs.Transformer.random(cfg, seed=5)
    rng = np.random.default_rng(head_dim)
    context = rng.integers(0, 97, 37)
    parents = np.array([-1, 0, 0, 1, 1, 2, -1, 6, 3, 8, 3, 0, 11, 5, 7], dtype=I)
    ids = rng.integers(0, 97, parents.shape[0])
    cache = model.new_cache()
    model.step(context, cache)
    tree = model.step(ids, cache, tree_parents=parents, hidden_layers=(0,))
    depths = tree_depths(parents)
    for i in range(parents.shape[0]):
        path = np.flatnonzero(ancestor_mask(parents)[i])
        dec = model.new_cache()
        model.step(context, dec)
        for node in path:
            out = model.step(ids[node:node + 1], dec, hidden_layers=(0,))
        np.testing.assert_array_equal(tree.logits[i], out.logits[0])
        np.testing.assert_array_equal(tree.hidden[0][i], out.hidden[0][0])
        row, pos = 37 + i, 37 + depths[i] - 1
        np.testing.assert_array_equal(cache.k[:, :, row], dec.k[:, :, pos])
        np.testing.assert_array_equal(cache.v[:, :, row], dec.v[:, :, pos])
