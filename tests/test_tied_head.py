"""A tied head is a view of the embedding: one copy in memory, packed by the runner from there.

The packers read the transpose of a C-contiguous matrix as they read the matrix itself (bit
for bit, every layout), so a model whose head is ``embed.T`` computes exactly what the same
model with a C-contiguous copy of the head computes.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fastspec.drafters.dflash_model import DFlashConfig, DFlashModel
from fastspec.model import ModelConfig, Transformer

from _helpers import needs_cython

SHAPES = [(1, 1), (1, 17), (17, 1), (3, 16), (5, 33), (31, 47), (33, 16), (64, 100), (40, 130)]


def tied(weight_dtype=None, dtype="float32", **kw):
    cfg = dict(vocab_size=53, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=40,
               max_seq_len=64, dtype=dtype, weight_dtype=weight_dtype)
    cfg.update(kw)
    return Transformer.random(ModelConfig(**cfg), seed=5)


def with_copied_head(m: Transformer) -> Transformer:
    return Transformer(m.config, m.embed, m.layers, np.ascontiguousarray(m.head), m.final_norm,
                       m.pos_embed)


@needs_cython
@pytest.mark.parametrize("kind", ["float32", "float16", "bf16", "bf16-tiles"])
def test_packing_a_transpose_equals_packing_its_copy(kind):
    from fastspec.model import _model_weights
    rng = np.random.default_rng(0)
    dtype = {"float32": np.float32, "float16": np.float16}.get(kind, np.uint16)
    for rows, cols in SHAPES:
        src = rng.normal(size=(cols, rows)).astype(np.float32)
        src = src.view(np.uint16)[:, 1::2].copy() if dtype == np.uint16 else src.astype(dtype)
        view = src.T  # (rows, cols), not C-contiguous unless a side is 1
        got = _model_weights._packed(view, None, kind == "bf16-tiles")
        want = _model_weights._packed(np.ascontiguousarray(view), None, kind == "bf16-tiles")
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"{kind} {rows}x{cols}")


@needs_cython
def test_packing_refuses_other_strides():
    from fastspec.model import _model_weights
    a = np.zeros((8, 64), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="C-contiguous or the transpose"):
        _model_weights._packed(a)


@pytest.mark.parametrize("weight_dtype", [None, "float16", "bfloat16"])
def test_tied_head_is_a_view_of_the_embedding(weight_dtype, tmp_path):
    m = tied(weight_dtype)
    assert m.head.base is not None and np.shares_memory(m.head, m.embed)
    np.testing.assert_array_equal(m.head, m.embed.T)
    assert np.shares_memory(m.with_weight_dtype(weight_dtype).head, m.embed)
    for path in (tmp_path / "m.npz", tmp_path / "hf"):
        m.save(path)
        back = Transformer.load(path, weight_dtype=weight_dtype)
        assert np.shares_memory(back.head, back.embed), path
        np.testing.assert_array_equal(back.head, m.head)
    # an untied model keeps its own head, and a copied head stays a copy
    assert not np.shares_memory(tied(weight_dtype, tie_embeddings=False).head,
                                tied(weight_dtype, tie_embeddings=False).embed)
    assert not np.shares_memory(with_copied_head(m).head, m.embed)


@pytest.mark.parametrize("dtype,weight_dtype", [("float32", None), ("float32", "float16"),
                                                ("float32", "bfloat16"), ("float64", None)])
def test_tied_view_computes_what_a_copied_head_computes(backend, dtype, weight_dtype):
    m = tied(weight_dtype, dtype)
    ids = np.random.default_rng(1).integers(0, m.config.vocab_size, 11)
    view, copy = m.forward(ids).logits, with_copied_head(m).forward(ids).logits
    if backend == "cython":  # the same packed bits (float64: read in place from a C copy)
        np.testing.assert_array_equal(view, copy)
    else:  # BLAS may take another path for a transposed operand
        np.testing.assert_allclose(view, copy, rtol=1e-5 if dtype == "float32" else 1e-12,
                                   atol=1e-5 if dtype == "float32" else 1e-12)


def test_updating_the_embedding_updates_the_tied_head(backend):
    m = tied()
    ids = [1, 2, 3]
    before = m.forward(ids).logits
    m.embed[:] *= 2.0  # both the lookups and the head double
    m.invalidate()
    ref = with_copied_head(m).forward(ids).logits
    after = m.forward(ids).logits
    np.testing.assert_allclose(after, ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(after, before)


def test_a_drafter_shares_its_targets_tied_head_object():
    target = tied()
    drafter = DFlashModel.random(DFlashConfig(), target)
    assert drafter._stack.head is target.head  # runners share packed copies by identity


def test_loading_a_tied_folder_keeps_one_copy(tmp_path):
    cfg = dict(vocab_size=4096, dim=64, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64)
    tied(None, **cfg).with_weight_dtype("bfloat16").save(tmp_path)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        m = Transformer.load(tmp_path, weight_dtype="bfloat16")
        alive = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stored = sum(a.nbytes for a in m.state_dict().values())  # the head is not in it
    assert "lm_head.weight" not in m.state_dict() and "head" not in m.state_dict()
    # the embedding is most of the model: a second copy of it would make this about 1.9
    assert alive < 1.1 * stored, f"{alive / stored:.2f}x the stored weights"
