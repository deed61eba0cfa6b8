"""Hugging Face folders and the bounded safetensors parser (no transformers needed)."""
import json

import numpy as np
import pytest

from fastspec.formats.hf_folder import read_hf, read_safetensors, save_hf, write_safetensors
from fastspec.model import ModelConfig, Transformer


def small(**kw):
    fields = dict(vocab_size=29, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=24,
                  max_seq_len=32)
    fields.update(kw)
    return Transformer.random(ModelConfig(**fields), seed=2)


def raw_file(path, header, data=b"", header_len=None):
    raw = json.dumps(header).encode()
    n = len(raw) if header_len is None else header_len
    path.write_bytes(n.to_bytes(8, "little") + raw + data)
    return path


def test_write_read_round_trip(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
               "b": np.linspace(0, 1, 5), "c": np.array([1, 2], np.int64),
               "h": np.array([0.5, -2.0], np.float16)}
    write_safetensors(tmp_path / "t.safetensors", tensors)
    back = read_safetensors(tmp_path / "t.safetensors")
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(back[k], v)
    only = read_safetensors(tmp_path / "t.safetensors", ["b"], dtype="float32")
    assert list(only) == ["b"] and only["b"].dtype == np.float32


def test_bf16_and_f16_are_converted(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    f16 = values.astype("<f2").tobytes()
    header = {"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
              "y": {"dtype": "F16", "shape": [2, 2], "data_offsets": [8, 16]}}
    path = raw_file(tmp_path / "b.safetensors", header, bf16 + f16)
    got = read_safetensors(path, dtype="float64")
    np.testing.assert_array_equal(got["x"], values)
    np.testing.assert_array_equal(got["y"], values.reshape(2, 2))
    assert read_safetensors(path, ["x"])["x"].dtype == np.float32


@pytest.mark.parametrize("case, message", [
    ("empty", "no header length"),
    ("oversized header", "exceeds the file size"),
    ("huge header", "exceeds the file size"),
    ("truncated data", "outside the"),
    ("wrong dtype", "unsupported dtype"),
    ("wrong shape", "needs 24 bytes"),
    ("negative shape", "invalid shape"),
    ("not json", "not valid JSON"),
    ("missing tensor", "missing tensors"),
])
def test_malformed_files_give_clear_errors(tmp_path, case, message):
    good = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    path = tmp_path / "bad.safetensors"
    if case == "empty":
        path.write_bytes(b"\x01\x02")
    elif case == "oversized header":
        raw_file(path, good, b"\0" * 24, header_len=10_000)
    elif case == "huge header":  # must fail before trying to allocate 2**60 bytes
        raw_file(path, good, b"\0" * 24, header_len=2**60)
    elif case == "truncated data":
        raw_file(path, good, b"\0" * 10)
    elif case == "wrong dtype":
        raw_file(path, {"w": {"dtype": "Q7", "shape": [2, 3], "data_offsets": [0, 24]}}, b"\0" * 24)
    elif case == "wrong shape":
        raw_file(path, {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, b"\0" * 24)
    elif case == "negative shape":
        raw_file(path, {"w": {"dtype": "F32", "shape": [-2, 3], "data_offsets": [0, 24]}}, b"\0" * 24)
    elif case == "not json":
        path.write_bytes((5).to_bytes(8, "little") + b"{oops" + b"\0" * 8)
    else:
        raw_file(path, good, b"\0" * 24)
    with pytest.raises(ValueError, match=message):
        read_safetensors(path, ["v"] if case == "missing tensor" else None)


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=False, qk_norm=True),
                                dict(qkv_bias=True), dict(dtype="float64", head_dim=6)],
                         ids=["llama-tied", "qwen3-untied", "qwen2-bias", "float64-headdim"])
def test_hf_folder_round_trip(tmp_path, kw):
    model = small(**kw)
    save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 2
    loaded = Transformer.load(tmp_path, dtype=model.config.dtype)
    assert loaded.config == model.config
    ids = np.arange(10) % 29
    np.testing.assert_array_equal(loaded.forward(ids).logits, model.forward(ids).logits)


def test_sharded_folder(tmp_path):
    model = small(tie_embeddings=False)
    sd = model.state_dict()
    names = sorted(sd)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        write_safetensors(tmp_path / file, {k: sd[k] for k in keys})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    save_hf(model, tmp_path / "single")
    (tmp_path / "config.json").write_text((tmp_path / "single" / "config.json").read_text())
    loaded = Transformer.load(tmp_path)
    np.testing.assert_array_equal(loaded.forward([1, 2, 3]).logits, model.forward([1, 2, 3]).logits)


def test_unknown_architecture_and_missing_tensor(tmp_path):
    model = small()
    save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, architectures=["GPT2LMHeadModel"])))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        Transformer.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = model.state_dict()
    del sd["model.layers.1.mlp.up_proj.weight"]
    write_safetensors(tmp_path / "model.safetensors", sd)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        Transformer.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, rope_scaling={"rope_type": "yarn"})))
    with pytest.raises(ValueError, match="yarn"):
        Transformer.load(tmp_path)
    with pytest.raises(ValueError, match="config.json"):
        read_hf(tmp_path / "nowhere")


def test_toy_cannot_be_exported(tmp_path):
    with pytest.raises(ValueError, match="npz"):
        save_hf(Transformer.random(ModelConfig.toy()), tmp_path)
