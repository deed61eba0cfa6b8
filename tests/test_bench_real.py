"""The real-size bench rows, on a tiny shape: the folder loads, the row is complete."""
import json

import numpy as np

import fastspec as fs
from fastspec.tools.bench_real import REAL_SHAPES, real_size_rows, write_random_folder

TINY = fs.ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                      max_seq_len=128, qk_norm=True)


def test_random_folder_loads_as_its_config(tmp_path):
    size = write_random_folder(TINY, tmp_path)
    model = fs.Transformer.load(tmp_path)
    assert model.config.replace(max_seq_len=128) == TINY.replace(max_seq_len=128)
    assert size == (tmp_path / "model.safetensors").stat().st_size
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float16"
    assert np.isfinite(model.forward(np.arange(5)).logits).all()


def test_rows_are_complete():
    (row,) = real_size_rows({"tiny": TINY}, dram_GBps=10.0, new_tokens=4)
    assert row["shape"] == "tiny" and row["new_tokens"] == 4
    assert row["peak_rss_load_bytes"] >= 0 and row["load_s"] > 0 and row["tokens_per_s"] > 0
    assert 0 < row["fraction_of_dram_bound"]


def test_shapes_match_the_published_configs():
    q = REAL_SHAPES["Qwen3-0.6B"]
    assert (q.vocab_size, q.n_layers, q.dim, q.n_heads, q.n_kv_heads, q.head_dim, q.ffn_dim,
            q.qk_norm, q.tie_embeddings) == (151936, 28, 1024, 16, 8, 128, 3072, True, True)
    s = REAL_SHAPES["SmolLM-135M"]
    assert (s.vocab_size, s.n_layers, s.dim) == (49152, 30, 576)
