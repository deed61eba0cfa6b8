"""Hypothesis fuzzing of the weight-file loaders with random and mutated bytes.

read_safetensors, Transformer.load (.npz) and DFlashModel.load must either load or raise a
ValueError-class error (KeyError/TypeError for a missing tensor or a config value of the wrong
type; OSError for I/O), never crash, hang or allocate much memory (peak RSS is checked).
A few examples by default; the `slow` copies run 500 each.
"""
from __future__ import annotations

import json
import os
import resource
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

import fastspec as fs
from fastspec.formats.hf_folder import read_safetensors, write_safetensors

from _helpers import fast_and_slow

ALLOWED = (ValueError, KeyError, TypeError, OSError)
TMP = Path(tempfile.mkdtemp(prefix="fastspec-fuzz-"))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _target():
    return fs.Transformer.random(fs.ModelConfig(vocab_size=16, dim=8, n_layers=1, n_heads=2,
                                                ffn_dim=8, max_seq_len=8), seed=0)


TARGET = _target()
DFLASH = fs.DFlashModel.random(fs.DFlashConfig(block_size=3), TARGET, seed=1)


def _good_files():
    files = {}
    write_safetensors(TMP / "good.safetensors",
                      {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                       "b": np.ones(4, np.float64)})
    files["safetensors"] = (TMP / "good.safetensors").read_bytes()
    TARGET.save(TMP / "m.npz")
    files["model"] = (TMP / "m.npz").read_bytes()
    DFLASH.save(TMP / "d.npz")
    files["dflash"] = (TMP / "d.npz").read_bytes()
    with zipfile.ZipFile(TMP / "m.npz") as src, \
            zipfile.ZipFile(TMP / "mz.npz", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    files["model-deflated"] = (TMP / "mz.npz").read_bytes()
    return files


GOOD = _good_files()


def _load(kind, path):
    if kind == "safetensors":
        out = read_safetensors(path)
        for a in out.values():
            assert isinstance(a, np.ndarray)
        return out
    if kind == "dflash":
        return fs.DFlashModel.load(path, TARGET)
    return fs.Transformer.load(path)


def _check(kind, data: bytes):
    suffix = ".safetensors" if kind == "safetensors" else ".npz"
    path = TMP / f"fuzz-{os.getpid()}{suffix}"
    path.write_bytes(data)
    peak = _peak_mb()
    try:
        _load(kind, path)
    except ALLOWED:
        pass
    assert _peak_mb() - peak < 256, "a fuzzed file made the loader allocate a lot"


def _random_bytes_property(kind, data):
    _check(kind, data)


test_random_bytes_fuzz, test_random_bytes_fuzz_slow = fast_and_slow(
    fast=20, kind=st.sampled_from(["safetensors", "model", "dflash"]),
    data=st.one_of(st.binary(max_size=3000),
                   st.binary(max_size=200).map(lambda b: b"PK\x03\x04" + b)),
)(_random_bytes_property)


def _mutation_property(kind, edits, cut):
    raw = bytearray(GOOD[kind])
    for pos, value in edits:
        raw[pos % len(raw)] = value
    if cut is not None:
        raw = raw[:cut % (len(raw) + 1)]
    _check("model" if kind == "model-deflated" else kind, bytes(raw))


test_mutated_file_fuzz, test_mutated_file_fuzz_slow = fast_and_slow(
    fast=30, kind=st.sampled_from(sorted(GOOD)),
    edits=st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 2**20)),
)(_mutation_property)


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@st.composite
def _headers(draw):
    """Plausible-looking safetensors headers with random fields."""
    entries = {}
    for name in draw(st.lists(st.text(max_size=6), max_size=3)):
        entry = {"dtype": draw(st.one_of(st.sampled_from(["F32", "F64", "BF16", "I8", "Q7"]), _json)),
                 "shape": draw(st.one_of(st.lists(st.integers(-2, 2**45), max_size=4), _json)),
                 "data_offsets": draw(st.one_of(st.lists(st.integers(-8, 2**62), max_size=3), _json))}
        if draw(st.booleans()):
            entry[draw(st.text(max_size=4))] = draw(_json)
        entries[name] = entry
    if draw(st.booleans()):
        entries["__metadata__"] = draw(_json)
    return draw(st.one_of(st.just(entries), _json))


def _header_property(header, data_len, declared_extra):
    text = json.dumps(header).encode()
    n = len(text) + declared_extra
    _check("safetensors", n.to_bytes(8, "little", signed=False) + text + b"\0" * data_len)


test_safetensors_header_fuzz, test_safetensors_header_fuzz_slow = fast_and_slow(
    fast=30, header=_headers(), data_len=st.integers(0, 64),
    declared_extra=st.sampled_from([0, 0, 0, 1, -1, 2**40]),
)(_header_property)


@st.composite
def _npz_members(draw):
    """Zip files of .npy members with random headers and configs."""
    cfg = TARGET.config.to_dict()
    if draw(st.booleans()):
        cfg[draw(st.sampled_from(sorted(cfg)))] = draw(_json)
    members = {"config.npy": _npy(np.array(json.dumps(cfg)))}
    sd = TARGET.state_dict()
    for name in draw(st.lists(st.sampled_from(sorted(sd)), unique=True, max_size=len(sd))):
        members[name + ".npy"] = _npy(sd[name])
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(sd) + ["x"])) + ".npy"
        descr = draw(st.sampled_from(["<f4", ">f8", "<i4", "|O", "<U3", "<c8", "|b1", "<f2", "V8"]))
        shape = tuple(draw(st.lists(st.integers(0, 2**36), max_size=3)))
        header = "{'descr': %r, 'fortran_order': %s, 'shape': %r, }" % (
            descr, draw(st.booleans()), shape)
        header = header.ljust(118) + "\n"
        members[name] = (b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                         + header.encode() + draw(st.binary(max_size=64)))
    return members, draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))


def _npy(a) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _npz_property(spec):
    members, compression = spec
    path = TMP / f"fuzz-{os.getpid()}.npz"
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    _check("model", path.read_bytes())


test_npz_structure_fuzz, test_npz_structure_fuzz_slow = fast_and_slow(
    fast=30, spec=_npz_members())(_npz_property)
