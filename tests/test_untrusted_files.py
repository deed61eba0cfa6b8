"""Untrusted weight files: malformed ``.npz`` models and DFlash drafters are refused with a clear
error, nothing is unpickled and nothing large is allocated. (Malformed safetensors headers are
in tests/test_checkpoints.py; Hugging Face folders with a bad config.json are here.)"""
from __future__ import annotations

import io
import json
import resource
import zipfile

import numpy as np
import pytest

import fastspec as fs
from fastspec.formats.hf_folder import write_safetensors

Q0 = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def target():
    return fs.Transformer.random(fs.ModelConfig(vocab_size=24, dim=16, n_layers=2, n_heads=2,
                                                ffn_dim=32, max_seq_len=32), seed=0)


@pytest.fixture(scope="module")
def dflash(target):
    return fs.DFlashModel.random(fs.DFlashConfig(block_size=4), target, seed=1)


def npy_bytes(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=True)
    return buf.getvalue()


def npy_header(shape, descr="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def write_zip(path, members: dict[str, bytes], compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def members_of(config: dict, sd: dict) -> dict[str, bytes]:
    out = {"config.npy": npy_bytes(np.array(json.dumps(config)))}
    out.update({k + ".npy": npy_bytes(v) for k, v in sd.items()})
    return out


def model_variant(case, target):
    """Members of a model file broken in the way ``case`` says."""
    cfg, sd = target.config.to_dict(), dict(target.state_dict())
    m = members_of(cfg, sd)
    if case == "missing config":
        del m["config.npy"]
    elif case == "config not JSON":
        m["config.npy"] = npy_bytes(np.array("{oops"))
    elif case == "config a JSON number":
        m["config.npy"] = npy_bytes(np.array("5"))
    elif case == "config a JSON list":
        m["config.npy"] = npy_bytes(np.array("[1, 2]"))
    elif case == "config unknown key":
        m["config.npy"] = npy_bytes(np.array(json.dumps({**cfg, "exec": "rm -rf /"})))
    elif case == "config bad value":
        m["config.npy"] = npy_bytes(np.array(json.dumps({**cfg, "dim": "16"})))
    elif case == "config as bytes":
        m["config.npy"] = npy_bytes(np.frombuffer(json.dumps(cfg).encode(), np.uint8))
    elif case == "config as pickled object":
        m["config.npy"] = npy_bytes(np.array([cfg], dtype=object))
    elif case == "config huge vocab":
        m["config.npy"] = npy_bytes(np.array(json.dumps({**cfg, "vocab_size": 2**31 - 1})))
    elif case == "missing tensor":
        del m[Q0 + ".npy"]
    elif case == "wrong shape":
        m[Q0 + ".npy"] = npy_bytes(sd[Q0][:, :3])
    elif case == "int tensor":
        m[Q0 + ".npy"] = npy_bytes(sd[Q0].astype(np.int32))
    elif case == "string tensor":
        m[Q0 + ".npy"] = npy_bytes(sd[Q0].astype(str))
    elif case == "complex tensor":
        m[Q0 + ".npy"] = npy_bytes(sd[Q0].astype(np.complex64))
    elif case == "object tensor (pickle)":
        m[Q0 + ".npy"] = npy_bytes(np.array([{"x": 1}] * 4, dtype=object))
    elif case == "huge declared shape":
        m[Q0 + ".npy"] = npy_header((10**11,)) + b"\0" * 64
    elif case == "declared 1 GiB, 64 bytes present":
        m[Q0 + ".npy"] = npy_header((2**28,)) + b"\0" * 64
    elif case == "not an npy member":
        m["payload.py"] = b"import os\n"
    elif case == "bad npy magic":
        m[Q0 + ".npy"] = b"\x93NUMPX" + m[Q0 + ".npy"][6:]
    else:
        raise AssertionError(case)
    return m


MODEL_CASES = [
    ("missing config", ValueError, "config"),
    ("config not JSON", ValueError, "JSON"),
    ("config a JSON number", ValueError, "JSON object"),
    ("config a JSON list", ValueError, "JSON object"),
    ("config unknown key", ValueError, "unknown ModelConfig keys"),
    ("config bad value", TypeError, "dim"),
    ("config as bytes", ValueError, "config"),
    ("config as pickled object", ValueError, "object arrays"),
    ("config huge vocab", ValueError, "embed"),
    ("missing tensor", KeyError, Q0),
    ("wrong shape", ValueError, "wq"),
    ("int tensor", ValueError, "floating point"),
    ("string tensor", ValueError, "floating point"),
    ("complex tensor", ValueError, "floating point"),
    ("object tensor (pickle)", ValueError, "object arrays"),
    ("huge declared shape", ValueError, "declares shape"),
    ("declared 1 GiB, 64 bytes present", ValueError, "declares shape"),
    ("not an npy member", ValueError, "payload.py"),
    ("bad npy magic", ValueError, Q0),
]


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("case, error, pattern", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_malformed_model_npz(tmp_path, target, case, error, pattern):
    path = write_zip(tmp_path / "m.npz", model_variant(case, target))
    peak = _maxrss_mb()
    with pytest.raises(error, match=pattern):
        fs.Transformer.load(path)
    assert _maxrss_mb() - peak < 64, "a malformed file made the loader allocate a lot"


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_good_model_npz_still_loads(tmp_path, target, compression):
    path = write_zip(tmp_path / "m.npz", members_of(target.config.to_dict(), target.state_dict()),
                     compression)
    loaded = fs.Transformer.load(path)
    np.testing.assert_array_equal(loaded.forward([1, 2, 3]).logits, target.forward([1, 2, 3]).logits)


def test_fortran_order_and_float16_tensors_load(tmp_path, target):
    sd = dict(target.state_dict())
    sd[Q0] = np.asfortranarray(sd[Q0])
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"].astype(np.float16)
    path = write_zip(tmp_path / "m.npz", members_of(target.config.to_dict(), sd))
    loaded = fs.Transformer.load(path)
    np.testing.assert_array_equal(loaded.layers[0].wq, target.layers[0].wq)


@pytest.mark.parametrize("cut", [0, 7, 100, 0.5, -30])
def test_truncated_model_npz(tmp_path, target, cut):
    good = tmp_path / "good.npz"
    target.save(good)
    raw = good.read_bytes()
    cut = int(len(raw) * cut) if isinstance(cut, float) else cut
    path = tmp_path / "t.npz"
    path.write_bytes(raw[:cut])
    with pytest.raises(ValueError, match="t.npz"):
        fs.Transformer.load(path)


def test_forged_zip_sizes_are_refused_before_allocating(tmp_path, target):
    """A member whose zip directory claims 100 GB decompressed from a few bytes."""
    path = write_zip(tmp_path / "m.npz", members_of(target.config.to_dict(), target.state_dict()),
                     zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    # Patch the uncompressed size (central directory offset 24) of the first entry.
    cd = raw.rfind(b"PK\x01\x02", 0, len(raw))
    first = raw.find(b"PK\x01\x02")
    assert first <= cd
    raw[first + 24:first + 28] = (0xFFFFFFF0).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    peak = _maxrss_mb()
    with pytest.raises(ValueError):
        fs.Transformer.load(path)
    assert _maxrss_mb() - peak < 64


def test_random_bytes_named_npz(tmp_path):
    path = tmp_path / "r.npz"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match="r.npz"):
        fs.Transformer.load(path)


def test_missing_file_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        fs.Transformer.load(tmp_path / "nope.npz")


# --- DFlash files ------------------------------------------------------------------------------

def dflash_variant(case, dflash):
    cfg, sd = dflash.config.to_dict(), dict(dflash.state_dict())
    m = members_of(cfg, sd)
    if case == "missing config":
        del m["config.npy"]
    elif case == "missing fc":
        del m["fc.weight.npy"]
    elif case == "config garbage":
        m["config.npy"] = npy_bytes(np.array("\x00\x01garbage"))
    elif case == "config unknown key":
        m["config.npy"] = npy_bytes(np.array(json.dumps({**cfg, "payload": 1})))
    elif case == "config block_size 1":
        m["config.npy"] = npy_bytes(np.array(json.dumps({**cfg, "block_size": 1})))
    elif case == "missing layer tensor":
        del m["norm.weight.npy"]
    elif case == "wrong shape":
        m["fc.weight.npy"] = npy_bytes(sd["fc.weight"][:, :5])
    elif case == "int tensor":
        m["norm.weight.npy"] = npy_bytes(sd["norm.weight"].astype(np.int64))
    elif case == "object tensor (pickle)":
        m["norm.weight.npy"] = npy_bytes(np.array([None, None], dtype=object))
    elif case == "huge declared shape":
        m["norm.weight.npy"] = npy_header((2**40,), "<f8") + b"\0" * 8
    else:
        raise AssertionError(case)
    return m


DFLASH_CASES = [
    ("missing config", ValueError, "not a fastspec DFlash file"),
    ("missing fc", ValueError, "fc.weight"),
    ("config garbage", ValueError, "JSON"),
    ("config unknown key", ValueError, "unknown DFlashConfig keys"),
    ("config block_size 1", ValueError, "block_size"),
    ("missing layer tensor", KeyError, "norm.weight"),
    ("wrong shape", ValueError, "fc.weight"),
    ("int tensor", ValueError, "floating point"),
    ("object tensor (pickle)", ValueError, "object arrays"),
    ("huge declared shape", ValueError, "declares shape"),
]


@pytest.mark.parametrize("case, error, pattern", DFLASH_CASES, ids=[c[0] for c in DFLASH_CASES])
def test_malformed_dflash_npz(tmp_path, target, dflash, case, error, pattern):
    path = write_zip(tmp_path / "d.npz", dflash_variant(case, dflash))
    peak = _maxrss_mb()
    with pytest.raises(error, match=pattern):
        fs.DFlashModel.load(path, target)
    assert _maxrss_mb() - peak < 64


def test_truncated_dflash_npz(tmp_path, target, dflash):
    good = tmp_path / "d.npz"
    dflash.save(good)
    raw = good.read_bytes()
    for cut in (0, 9, len(raw) // 3, len(raw) - 10):
        path = tmp_path / f"d{cut}.npz"
        path.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match=path.name):
            fs.DFlashModel.load(path, target)


# --- Hugging Face folders: config.json ----------------------------------------------------------

@pytest.mark.parametrize("text, pattern", [
    ("{oops", "config.json"),
    ("[1, 2]", "config.json"),
    ('{"architectures": ["EvilForCausalLM"]}', "unsupported architecture"),
    ('{"architectures": ["LlamaForCausalLM"], "hidden_size": 16}', "num_attention_heads"),
])
def test_bad_hf_config_json(tmp_path, target, text, pattern):
    write_safetensors(tmp_path / "model.safetensors", {"x": np.zeros(2, np.float32)})
    (tmp_path / "config.json").write_text(text)
    with pytest.raises((ValueError, KeyError), match=pattern):
        fs.Transformer.load(tmp_path)
