"""Sliding-window attention (Gemma 3's local layers): the kernels' ``window`` against their NumPy
twin and a brute-force softmax, a row's bits alone and in a block (a tree node's and its
path's), the model past its window (blocks equal decode steps, speculative equals vanilla,
transformers' and llama.cpp's Gemma 3) and the bad arguments. Every window is also removed as
a negative control that must change the result."""
import numpy as np
import pytest

import fastspec as fs
from fastspec import ModelConfig, Transformer
from fastspec.formats.hf_folder import hf_config
from fastspec.kernels import _reference
from fastspec.kernels.tree_shape import ancestor_mask, chain_parents

from _helpers import (GEMMA3_HF, MODEL_CONFIGS, RTOL, assert_close_rel, hf_reference,
                      llama_cpp_logits, path_logits, undone as _undone)

I = np.int64
#: transformers' Gemma3ForCausalLM of the Gemma 3 tests, a window of 8 in a context of 256.
TINY = dict(GEMMA3_HF, sliding_window=8)
IDS = np.random.default_rng(11).integers(0, 300, 40)


@pytest.fixture
def kern(backend):
    """The kernel module of the backend under test."""
    return fs.kernels.module(backend)


def _qkv(rng, n, n_heads, n_kv, head_dim, capacity, dtype):
    q = rng.standard_normal((n, n_heads, head_dim)).astype(dtype)
    k = (2 * rng.standard_normal((n_kv, capacity, head_dim))).astype(dtype)
    v = rng.standard_normal((n_kv, capacity, head_dim)).astype(dtype)
    return q, k, v


def _parents(rng, n, window):
    """A random tree of ``n`` nodes (topological order) whose depth d_i keeps d_i + 1 <= window;
    a node hangs under its predecessor half of the time (deep paths)."""
    parents, depth = [], []
    for i in range(n):
        options = [-1] + [j for j in range(i) if depth[j] + 2 <= window]
        p = i - 1 if (i - 1 in options and rng.random() < 0.5) else options[
            rng.integers(len(options))]
        parents.append(p)
        depth.append(0 if p < 0 else depth[p] + 1)
    return np.array(parents, dtype=I)


def brute(q, k, v, length, window=None, mask=None):
    """Each query's softmax over the keys it sees, picked one by one, in float64: query i of a
    block sits at p = length - n + i; a tree node (``mask``) at length - n + d_i, its ancestor j
    at length - n + d_j; a key at position a is seen iff p - window < a <= p."""
    n, n_heads, head_dim = q.shape
    group, base = n_heads // k.shape[0], length - n
    out = np.zeros((n, n_heads, head_dim))
    for i in range(n):
        if mask is None:
            rows = at = np.arange(base + i + 1)
        else:
            nodes = np.flatnonzero(mask[i])
            rows = np.concatenate([np.arange(base), base + nodes])
            at = np.concatenate([np.arange(base), base + mask.sum(axis=1)[nodes] - 1])
        if window is not None:
            rows = rows[at > at[-1] - window]  # the query itself is the last key
        for h in range(n_heads):
            keys = k[h // group, rows].astype(np.float64)
            s = keys @ q[i, h].astype(np.float64) / np.sqrt(head_dim)
            w = np.exp(s - s.max())
            out[i, h] = w @ v[h // group, rows].astype(np.float64) / w.sum()
    return out


# ---- (a) the backend's kernel against its twin ----------------------------------------------

SHAPES = [(d, n, g) for d in (16, 64, 72, 256, 272) for n in (1, 3, 16) for g in (1, 4)]


@pytest.mark.parametrize("head_dim,n,group", SHAPES, ids=lambda x: str(x))
def test_attention_window_matches_twin(kern, dtype, head_dim, n, group):
    rng = np.random.default_rng(head_dim + 7 * n + group)
    length = 150  # past one tile of 128 keys
    q, k, v = _qkv(rng, n, 2 * group, 2, head_dim, length + 5, dtype)
    for window in (1, 5, 64, length):
        got = kern.attention(q, k, v, length, window=window)
        assert got.dtype == dtype and got.shape == q.shape
        want = _reference.attention(q, k, v, length, window=window)
        assert_close_rel(got, want.astype(np.float64), RTOL[dtype])


@pytest.mark.parametrize("head_dim,n,group", SHAPES, ids=lambda x: str(x))
def test_tree_attention_window_matches_twin(kern, dtype, head_dim, n, group):
    rng = np.random.default_rng(head_dim + 7 * n + group)
    base = 140
    q, k, v = _qkv(rng, n, 2 * group, 2, head_dim, base + n + 3, dtype)
    for window in (1, 5, 64, base + n):
        mask = ancestor_mask(_parents(rng, n, window))
        got = kern.tree_attention(q, k, v, base + n, mask, window=window)
        assert got.dtype == dtype and got.shape == q.shape
        want = _reference.tree_attention(q, k, v, base + n, mask, window=window)
        assert_close_rel(got, want.astype(np.float64), RTOL[dtype])


# ---- (b) the twin against the brute-force formula --------------------------------------------

@pytest.mark.parametrize("n,n_heads,n_kv,head_dim,length,window", [
    (1, 4, 1, 16, 40, 5), (6, 4, 2, 8, 30, 1), (16, 8, 2, 72, 150, 64), (9, 2, 2, 16, 20, 7),
    (3, 4, 4, 256, 70, 5), (12, 6, 3, 12, 12, 4)])
def test_twin_matches_brute_force(dtype, n, n_heads, n_kv, head_dim, length, window):
    rng = np.random.default_rng(length + window)
    q, k, v = _qkv(rng, n, n_heads, n_kv, head_dim, length + 2, dtype)
    got = _reference.attention(q, k, v, length, window=window)
    assert_close_rel(got, brute(q, k, v, length, window), RTOL[dtype])
    # negative controls: no window, and a window one key longer or shorter, are other results
    full = _reference.attention(q, k, v, length)
    assert not np.allclose(got, full, rtol=1e-3, atol=1e-3)
    for other in (window - 1, window + 1):
        if other >= 1:
            assert not np.allclose(got, brute(q, k, v, length, other), rtol=1e-3, atol=1e-3)
    if window == 1:  # a query sees itself only: its own value row
        rows = length - n + np.arange(n)
        want = np.repeat(v[:, rows], n_heads // n_kv, axis=0).transpose(1, 0, 2)
        assert_close_rel(got, want.astype(np.float64), RTOL[dtype])
    # the tree twin: context clipped at the node's position, ancestors kept
    parents = _parents(rng, n, window)
    mask = ancestor_mask(parents)
    tree = _reference.tree_attention(q, k, v, length, mask, window=window)
    assert_close_rel(tree, brute(q, k, v, length, window, mask), RTOL[dtype])
    if length - n + 1 > window:
        assert not np.allclose(tree, _reference.tree_attention(q, k, v, length, mask),
                               rtol=1e-3, atol=1e-3)


def test_window_at_least_length_is_no_window(kern, dtype):
    rng = np.random.default_rng(5)
    for head_dim in (16, 72):
        q, k, v = _qkv(rng, 5, 4, 2, head_dim, 40, dtype)
        mask = ancestor_mask(np.array([-1, 0, 0, 1, 3], dtype=I))
        for length in (5, 37):
            plain = kern.attention(q, k, v, length)
            tree = kern.tree_attention(q, k, v, length, mask)
            for window in (length, length + 1, 2**20):
                np.testing.assert_array_equal(kern.attention(q, k, v, length, window=window),
                                              plain)
                np.testing.assert_array_equal(
                    kern.tree_attention(q, k, v, length, mask, window=window), tree)


# ---- (c) bit identity: a row alone and in a block, a node and its path -----------------------

@pytest.mark.parametrize("head_dim", [16, 64, 256, 272])
@pytest.mark.parametrize("n_heads,n_kv", [(4, 2), (4, 1), (1, 1)])
@pytest.mark.parametrize("window", [1, 5, 64])
def test_windowed_row_is_bit_identical_alone_and_in_a_block(kern, head_dim, n_heads, n_kv,
                                                            window):
    rng = np.random.default_rng(head_dim + window)
    n, length = 9, 150
    q, k, v = _qkv(rng, n, n_heads, n_kv, head_dim, length + 4, np.float32)
    block = kern.attention(q, k, v, length, window=window)
    for i in range(n):
        alone = kern.attention(q[i:i + 1], k, v, length - n + i + 1, window=window)
        np.testing.assert_array_equal(alone[0], block[i], err_msg=f"query {i}")


@pytest.mark.parametrize("head_dim", [16, 64, 128, 256, 72, 272])
@pytest.mark.parametrize("base", [3, 140])
@pytest.mark.parametrize("window", [4, 64])
def test_tree_node_equals_its_path_as_a_chain(backend, kern, dtype, head_dim, base, window):
    """float32 on the compiled backend with a head size of the tiled kernel (a multiple of 16 up
    to 256): the same bits; otherwise (double-accumulating template, twin) within rounding."""
    rng = np.random.default_rng(head_dim + base + window)
    n = 15
    parents = _parents(rng, n, window)
    mask = ancestor_mask(parents)
    q, k, v = _qkv(rng, n, 4, 2, head_dim, base + n + 2, dtype)
    tree = kern.tree_attention(q, k, v, base + n, mask, window=window)
    exact = (backend == "cython" and dtype == np.float32 and head_dim % 16 == 0
             and head_dim <= 256)
    for i in range(n):
        path = np.flatnonzero(mask[i])
        kc = np.ascontiguousarray(np.concatenate([k[:, :base], k[:, base + path]], axis=1))
        vc = np.ascontiguousarray(np.concatenate([v[:, :base], v[:, base + path]], axis=1))
        chain = kern.attention(q[path], kc, vc, base + path.size, window=window)
        if exact:
            np.testing.assert_array_equal(tree[i], chain[-1], err_msg=f"node {i}")
        else:
            assert_close_rel(tree[i], chain[-1].astype(np.float64), RTOL[dtype])
    if base + 1 > window:  # negative control: the window cut this tree's context
        assert not np.allclose(tree, kern.tree_attention(q, k, v, base + n, mask), rtol=1e-3,
                               atol=1e-3)


# ---- (d) the model past its window ------------------------------------------------------------

def gemma(seed=3, **over):
    """MODEL_CONFIGS' Gemma-shaped model, layers 0 and 2 local with a window of 6, context 96."""
    cfg = ModelConfig(**{**MODEL_CONFIGS["gemma3"], "local_layers": (0, 2), "sliding_window": 6,
                         "max_seq_len": 96, **over})
    return Transformer.random(cfg, seed=seed)


def test_model_block_equals_decode_steps(backend):
    model = gemma()
    ids = np.random.default_rng(0).integers(0, 70, 40)
    whole = model.forward(ids).logits
    scale = float(np.abs(whole).max())
    for chunk in (1, 7):  # prefill 1 + decode steps; prefill in chunks of 7
        cache = model.new_cache()
        got = np.concatenate([model.forward(ids[s:s + chunk], cache).logits
                              for s in range(0, 40, chunk)])
        assert cache.length == 40
        if backend == "cython":
            np.testing.assert_array_equal(got, whole, err_msg=f"chunks of {chunk}")
        else:
            np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5 * scale)
    with fs.using_backend("numpy"):  # the compiled runner against the layer-by-layer twin
        model.invalidate()
        twin = model.forward(ids).logits
    model.invalidate()
    np.testing.assert_allclose(whole, twin, rtol=0, atol=1e-5 * scale)


def test_model_window_removed_changes_logits_past_it(backend):
    """Negative control: the same weights without the window agree up to position 5 (a window
    of 6 sees every earlier key there) and differ at every position from 6 on."""
    model = gemma()
    ids = np.random.default_rng(0).integers(0, 70, 40)
    got = model.forward(ids).logits
    full = _undone(model, sliding_window=None).forward(ids).logits
    scale = float(np.abs(full).max())
    np.testing.assert_allclose(got[:6], full[:6], rtol=0, atol=1e-5 * scale)
    diff = np.abs(got - full).max(axis=1)
    assert (diff[6:] > 1e-4 * scale).all(), diff
    assert diff.max() > 1e-2 * scale


def test_model_tree_node_equals_decode_of_its_path(backend):
    """A tree step after 37 positions (local layers: the node's window reaches back from its
    depth's position): every node's logits are those of decoding its path token by token, bit
    for bit on the compiled runner (float32, head_dim 16), within rounding on the twin."""
    model = gemma()
    rng = np.random.default_rng(6)
    context, parents = rng.integers(0, 70, 37), np.array(
        [-1, 0, 0, 1, 1, 2, -1, 6, 3, 8, 3, 0, 11, 5, 7], dtype=I)  # depths up to 5
    ids = rng.integers(0, 70, parents.shape[0])
    outs = []
    for m in (model, _undone(model, sliding_window=None)):
        cache = m.new_cache()
        m.step(context, cache)
        outs.append(m.step(ids, cache, tree_parents=parents).logits)
    tree, scale = outs[0], float(np.abs(outs[0]).max())
    assert np.abs(tree - outs[1]).max() > 1e-2 * scale  # negative control: no window
    paths = path_logits(model, context, ids, parents)
    if backend == "cython":
        np.testing.assert_array_equal(tree, paths)
    else:
        np.testing.assert_allclose(tree, paths, rtol=0, atol=1e-5 * scale)


def test_speculative_equals_vanilla_far_past_the_window(backend):
    """Greedy speculative decoding (n-gram chains and trees, a draft model, the target as its
    own draft: whole blocks accepted) equals greedy vanilla over 60 new tokens, prompt and
    output 14 windows long."""
    target = gemma(seed=5)
    prompt = np.random.default_rng(1).integers(0, 70, 12).tolist() * 2
    vanilla = fs.generate(target, prompt, 60).tokens
    assert len(vanilla) == 60 and len(set(vanilla)) >= 10  # not one token repeated
    # negative control: the window changes the greedy output
    assert fs.generate(_undone(target, sliding_window=None), prompt, 60).tokens != vanilla
    draft = Transformer.random(target.config.replace(n_layers=1, local_layers=(0,)), seed=4)
    drafters = {"ngram": fs.NgramDrafter(max_ngram=3),
                "ngram tree": fs.NgramDrafter(max_ngram=3, tree=True),
                "draft model": fs.DraftModelDrafter(draft),
                "itself": fs.DraftModelDrafter(target)}
    for name, drafter in drafters.items():
        res = fs.speculative_generate(target, drafter, prompt, 60, gamma=4)
        assert res.tokens == vanilla, name


# ---- (e) transformers' and llama.cpp's Gemma 3 with a window shorter than the context ----------

def test_loaders_keep_the_full_context():
    c = hf_config(dict(TINY, architectures=["Gemma3ForCausalLM"]))
    assert (c.max_seq_len, c.sliding_window, c.local_layers) == (256, 8, (0, 1, 2, 3, 4))
    ModelConfig(**{**MODEL_CONFIGS["gemma3"], "sliding_window": 6, "max_seq_len": 4096})


@pytest.mark.hf
def test_folder_matches_transformers_past_the_window(tmp_path):
    ref = hf_reference("Gemma3ForCausalLM", TINY, IDS, tmp_path)
    ours = Transformer.load(tmp_path)
    assert (ours.config.max_seq_len, ours.config.sliding_window) == (256, 8)
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, rtol=0, atol=1e-4 * scale)
    cache = ours.new_cache()  # decode steps too
    steps = np.concatenate([ours.forward(IDS[i:i + 1], cache).logits for i in range(40)])
    np.testing.assert_allclose(steps, ref, rtol=0, atol=1e-4 * scale)
    flat = _undone(ours, sliding_window=None).forward(IDS).logits  # negative control
    assert np.abs(flat - ref).max() > 1e-2 * scale


def test_gguf_matches_llama_cpp_past_the_window(tmp_path):
    """A gemma3 file whose window (8) is shorter than its context (512): llama.cpp's tolerance
    of tests/test_gemma3.py (its GELU reads an fp16 table)."""
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V
    from _gguf_writer import write_model
    path = tmp_path / "g.gguf"
    key = "gemma3.attention.sliding_window"
    write_model(path, arch="gemma3", dim=64, n_layers=7, n_heads=4, n_kv=2, head_dim=32, ffn=96,
                types=(Q.F32,), metadata={key: (8, V.UINT32)}, drop=(key,))
    ours = Transformer.load(path)
    assert (ours.config.max_seq_len, ours.config.sliding_window) == (512, 8)
    ref = llama_cpp_logits(path, IDS)
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, rtol=0, atol=2e-3 * scale)
    flat = _undone(ours, sliding_window=None).forward(IDS).logits  # negative control
    assert np.abs(flat - ref).max() > 1e-2 * scale


# ---- (f) bad arguments --------------------------------------------------------------------------

@pytest.mark.parametrize("window, error", [(0, ValueError), (-1, ValueError),
                                           (2.5, TypeError), (True, TypeError),
                                           (False, TypeError)])
def test_bad_window(kern, window, error):
    """An integer below 1 is a ValueError, a non-integer (a bool too) a TypeError, as every
    integer argument of the kernels."""
    q, k, v = _qkv(np.random.default_rng(0), 2, 2, 1, 16, 8, np.float32)
    with pytest.raises(error, match="window"):
        kern.attention(q, k, v, 6, window=window)
    with pytest.raises(error, match="window"):
        kern.tree_attention(q, k, v, 6, ancestor_mask(chain_parents(2)), window=window)


def test_window_needs_causal_and_a_shallow_tree(kern):
    q, k, v = _qkv(np.random.default_rng(0), 4, 2, 1, 16, 8, np.float32)
    kern.attention(q, k, v, 6, causal=False)  # no window: fine
    with pytest.raises(ValueError, match="causal"):
        kern.attention(q, k, v, 6, causal=False, window=3)
    chain = ancestor_mask(chain_parents(4))  # depth 3: d + 1 = 4 keys of its own
    kern.tree_attention(q, k, v, 6, chain, window=4)
    with pytest.raises(ValueError, match="window"):
        kern.tree_attention(q, k, v, 6, chain, window=3)
    star = ancestor_mask(np.full(4, -1, dtype=I))  # every node at depth 0
    assert_close_rel(kern.tree_attention(q, k, v, 6, star, window=1).astype(np.float64),
                     np.repeat(v[:, 2:6], 2, axis=0).transpose(1, 0, 2), RTOL[np.float32])


def test_model_with_a_window_refuses_non_causal_steps(backend):
    """As the kernels: past the window (20 ids) and within it (5), on both backends."""
    model = gemma()
    for n in (5, 20):
        with pytest.raises(ValueError, match="causal"):
            model.forward(np.arange(n), causal=False)


@pytest.mark.parametrize("length", [40, 1030, 1300])  # two-pass; rows either side of 1024
@pytest.mark.parametrize("head_dim", [16, 72, 256])
@pytest.mark.parametrize("n_heads", [2, 4])  # one query a kv head; grouped (the online path)
@pytest.mark.parametrize("window", [None, 1024])
def test_float64_rows_are_bit_identical(backend, kern, length, head_dim, n_heads, window):
    """A float64 block's rows (the double template) are the bits of each query alone on the
    compiled backend, a window or not: a row's scores cover its own keys only, and a row takes
    the path (two passes over up to 1024 keys, the online softmax or row by row beyond) that
    it takes alone, whatever the block's size."""
    if backend == "numpy":
        pytest.skip("the twin's float64 rows agree to rounding only")
    q, k, v = _qkv(np.random.default_rng(head_dim), 16, n_heads, 2, head_dim, length,
                   np.float64)
    block = kern.attention(q, k, v, length, window=window)
    for i in range(16):
        alone = kern.attention(q[i:i + 1].copy(), k, v, length - 15 + i, window=window)
        assert np.array_equal(alone[0], block[i]), i


def test_context_entries_refuse_non_causal_steps(backend):
    """forward_embeddings (a DFlash stack's entry) with a window: causal only, on both
    backends (the compiled runner refuses it for every entry)."""
    model = gemma()
    x = np.zeros((20, model.config.dim), dtype=np.float32)
    with pytest.raises(ValueError, match="causal"):
        model.forward_embeddings(x, model.new_cache(), causal=False)
    model.forward_embeddings(x, model.new_cache())


def test_model_refuses_a_tree_deeper_than_its_window(backend):
    """A node's ancestors must lie inside its window (the kernels' precondition)."""
    model = gemma(sliding_window=2)
    cache = model.new_cache()
    model.step(np.arange(5), cache)
    model.step(np.arange(3), cache, tree_parents=np.array([-1, 0, 0]))  # depth 2: fits
    cache.crop(5)
    with pytest.raises(ValueError, match="sliding window 2"):
        model.step(np.arange(4), cache, tree_parents=np.array([-1, 0, 1, 0]))  # depth 3
