"""Loading a Hugging Face folder holds the finished model plus one file tensor, never two copies.

NumPy reports its data allocations to :mod:`tracemalloc`, so the peak of traced memory during
``Transformer.load`` against what stays alive afterwards (the model) measures the loader's
transient copies without timing anything. The negative control builds the same model from
``read_hf``'s full state dict, which does hold a second copy, and must fail the same bound.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fastspec as fs
from fastspec.formats.hf_folder import read_hf

# Untied, many small tensors: the largest file tensor is about 5% of the model, so a loader
# that keeps every raw tensor until the end needs about 2x and one that streams about 1.05x.
CFG = fs.ModelConfig(vocab_size=512, dim=128, n_layers=8, n_heads=4, n_kv_heads=2,
                     ffn_dim=256, max_seq_len=64, tie_embeddings=False, qk_norm=True)
BOUND = 1.3


def _folder(tmp_path, file_dtype: str):
    path = tmp_path / file_dtype
    fs.Transformer.random(CFG, seed=0).with_weight_dtype(file_dtype).save(path)
    return path


def _peak_over_final(load) -> tuple[float, object]:
    """Return (peak traced bytes during ``load()`` / bytes still alive after it, the model)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        model = load()
        alive, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (peak - before) / (alive - before), model


@pytest.mark.parametrize("file_dtype,weight_dtype", [
    ("bfloat16", "bfloat16"), ("bfloat16", "float16"), ("bfloat16", None),
    ("float16", "float16"), ("float16", None)])
def test_load_holds_no_second_copy(tmp_path, file_dtype, weight_dtype):
    folder = _folder(tmp_path, file_dtype)
    ratio, model = _peak_over_final(lambda: fs.Transformer.load(folder, weight_dtype=weight_dtype))
    assert ratio < BOUND, f"peak is {ratio:.2f}x the loaded weights"
    # and it is the same model as the one built from the whole state dict
    ref = fs.Transformer.from_state_dict(*read_hf(folder, weight_dtype=weight_dtype))
    for (k, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        assert a.dtype == b.dtype and np.array_equal(a, b), k


def test_negative_control_whole_state_dict_exceeds_bound(tmp_path):
    folder = _folder(tmp_path, "bfloat16")
    ratio, _ = _peak_over_final(
        lambda: fs.Transformer.from_state_dict(*read_hf(folder, weight_dtype="bfloat16")))
    assert ratio > 1.6, f"the control should hold about two copies, measured {ratio:.2f}x"
