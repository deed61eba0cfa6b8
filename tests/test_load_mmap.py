"""``Transformer.load(folder, mmap=True)``: tensors already in their storage dtype are maps of
the safetensors file (the projections as transposed views), not read copies; the model is the
same model, bit for bit."""
from __future__ import annotations

import mmap
import tracemalloc

import numpy as np
import pytest

import fastspec as fs
from fastspec.formats.hf_folder import iter_hf, read_hf_config

CFG = fs.ModelConfig(vocab_size=2000, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256,
                     max_seq_len=64, qk_norm=True)


def is_mapped(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is a memory map (walks the chain of bases)."""
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


@pytest.fixture(scope="module", params=[("bfloat16", True), ("float16", True),
                                        ("bfloat16", False)])
def folder(request, tmp_path_factory):
    dtype, tied = request.param
    path = tmp_path_factory.mktemp(f"{dtype}-{'tied' if tied else 'untied'}")
    cfg = CFG.replace(tie_embeddings=tied)
    fs.Transformer.random(cfg, seed=4).with_weight_dtype(dtype).save(path)
    return path, dtype


def test_mapped_model_is_the_read_model(folder, backend):
    path, dtype = folder
    read = fs.Transformer.load(path, weight_dtype=dtype)
    mapped = fs.Transformer.load(path, weight_dtype=dtype, mmap=True)
    for lw in mapped.layers:
        for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            a = getattr(lw, k)
            assert is_mapped(a) and a.T.flags.c_contiguous, k  # the file's (out, in), viewed
    assert is_mapped(mapped.embed) and mapped.embed.flags.c_contiguous
    assert is_mapped(mapped.head)
    for (k, a), b in zip(mapped.state_dict().items(), read.state_dict().values()):
        assert a.dtype == b.dtype and np.array_equal(a, b), k
    ids = np.arange(1, 20) % CFG.vocab_size
    np.testing.assert_array_equal(mapped.forward(ids).logits, read.forward(ids).logits)
    a = fs.generate(mapped, ids[:5], 8, temperature=0.0).tokens
    b = fs.generate(read, ids[:5], 8, temperature=0.0).tokens
    assert list(a) == list(b)


def test_tensors_that_need_converting_are_read(folder):
    path, dtype = folder
    wide = fs.Transformer.load(path, weight_dtype="float32", mmap=True)
    # the file's bf16/f16 matrices are widened (read); its float32 norms may be mapped
    assert not any(is_mapped(a) for lw in wide.layers for a in lw.arrays().values() if a.ndim == 2)
    assert not is_mapped(wide.embed)
    ref = fs.Transformer.load(path, weight_dtype="float32")
    np.testing.assert_array_equal(wide.forward([1, 2, 3]).logits, ref.forward([1, 2, 3]).logits)


def _traced_load(path, **kw):
    """Return (bytes :mod:`tracemalloc` saw allocated and still alive after the load, model)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        model = fs.Transformer.load(path, **kw)
        return tracemalloc.get_traced_memory()[0] - before, model
    finally:
        tracemalloc.stop()


def test_mapping_reads_nothing_and_writes_stay_private(folder):
    path, dtype = folder
    read, _ = _traced_load(path, weight_dtype=dtype)
    alive, model = _traced_load(path, weight_dtype=dtype, mmap=True)
    assert alive < 0.1 * read, (alive, read)  # only norms, rope tables and Python objects
    config = read_hf_config(path, weight_dtype=dtype)
    on_disk = dict(iter_hf(path, config))["model.layers.0.self_attn.q_proj.weight"]
    first = np.asarray(on_disk).copy()
    model.layers[0].wq[:] = 0  # copy-on-write: this process's pages only
    model.invalidate()
    assert not np.any(model.layers[0].wq)
    np.testing.assert_array_equal(np.asarray(on_disk), first)
    again = fs.Transformer.load(path, weight_dtype=dtype, mmap=True)
    np.testing.assert_array_equal(again.layers[0].wq, first.T)


def test_mmap_refuses_npz(tmp_path):
    path = tmp_path / "m.npz"
    fs.Transformer.random(CFG).save(path)
    with pytest.raises(ValueError, match="mmap=True maps Hugging Face folders"):
        fs.Transformer.load(path, mmap=True)
