"""The real-size bench rows, on a tiny shape: the folder loads, the rows are complete, and the
transformers comparison agrees token for token where the two compute the same function."""
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec.tools.bench_real import (REAL_SHAPES, measure_folder, real_size_markdown,
                                       real_size_rows, real_size_text, write_random_folder)

TINY = fs.ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                      max_seq_len=128, qk_norm=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_random_folder_loads_as_its_config(tmp_path, dtype):
    size = write_random_folder(TINY, tmp_path, dtype=dtype)
    model = fs.Transformer.load(tmp_path)
    assert model.config.replace(max_seq_len=128) == TINY.replace(max_seq_len=128)
    assert size == (tmp_path / "model.safetensors").stat().st_size
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == dtype
    assert np.isfinite(model.forward(np.arange(5)).logits).all()


def test_random_folder_refuses_other_dtypes(tmp_path):
    with pytest.raises(ValueError, match="dtype must be"):
        write_random_folder(TINY, tmp_path, dtype="float32")


def test_rows_are_complete():
    rows = real_size_rows({"tiny": TINY}, weight_dtypes=("bfloat16", "float32"), new_tokens=4,
                          repeats=1)
    bf16, f32 = rows
    assert (bf16["weight_dtype"], f32["weight_dtype"]) == ("bfloat16", "float32")
    for r in rows:
        assert r["shape"] == "tiny" and r["load_s"] > 0 and r["peak_rss_load_bytes"] >= 0
        assert r["weight_bytes"] > 0 and r["threads"] == 1
    assert 0 < bf16["fraction_of_stream_bound"] and bf16["tokens_per_s"] > 0
    assert 0 < bf16["fraction_paired_median"] and bf16["kv_read_bytes"] > 0
    q25, q75 = bf16["fraction_paired_quartiles"]
    assert q25 <= bf16["fraction_paired_median"] <= q75
    assert bf16["decode_step_s"] <= bf16["decode_step_median_s"]
    assert bf16["step_bytes"] < f32["step_bytes"]  # 16-bit matrices: half the bytes
    assert "decode_step_s" not in f32  # float32 rows: the load only
    assert len(real_size_text(rows)) == 2
    assert [line.split(" | ")[1] for line in real_size_markdown(rows)[-2:]] == ["bfloat16", "float32"]


def test_sampled_round_row(tmp_path):
    write_random_folder(TINY, tmp_path)
    row = measure_folder(tmp_path, "bfloat16", new_tokens=3, repeats=1, sampled=True)
    assert row["sampled_round_s"] > 0 and row["sampled_round_over_step"] > 0


def test_real_peers_float32_outputs_match_transformers(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fastspec.tools.real_peers import real_peers, real_peers_markdown

    write_random_folder(TINY, tmp_path)
    rep = real_peers(tmp_path, new_tokens=6, prompt_len=8, threads=(1,), repeats=1)
    same = {(r["a"], r["b"]): r["identical"] for r in rep["identical"]}
    # the same function of the same weights: every token must agree
    assert same[("fastspec float32", "transformers float32")]
    assert {r["system"] for r in rep["rows"]} == {"fastspec bf16", "fastspec float32",
                                                  "transformers bf16", "transformers float32"}
    assert all(r["ratio"] > 0 for r in rep["ratios"])
    assert real_peers_markdown(rep)[0].startswith("## Greedy decoding")


def test_shapes_match_the_published_configs():
    q = REAL_SHAPES["Qwen3-0.6B"]
    assert (q.vocab_size, q.n_layers, q.dim, q.n_heads, q.n_kv_heads, q.head_dim, q.ffn_dim,
            q.qk_norm, q.tie_embeddings) == (151936, 28, 1024, 16, 8, 128, 3072, True, True)
    s = REAL_SHAPES["SmolLM-135M"]
    assert (s.vocab_size, s.n_layers, s.dim) == (49152, 30, 576)
