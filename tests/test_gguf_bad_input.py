"""Bad GGUF files (issue 28, "Bad input"): every one a ValueError naming the file and the field,
nothing allocated from a header value before it is checked against the file's size
(fastspec.formats.gguf_header), and a hypothesis fuzz of the header's fields.

Fields are patched in place in a small valid file (tests/_gguf_writer.py); :func:`slots`
finds each integer field of its header (counts, lengths, types, dimensions, offsets).
"""
from __future__ import annotations

import os
import resource
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from hypothesis import strategies as st  # noqa: E402

import fastspec as fs  # noqa: E402
from fastspec.cli import main  # noqa: E402
from fastspec.formats.gguf import read_metadata  # noqa: E402
from fastspec.formats.gguf_header import check_header  # noqa: E402

from _gguf_writer import TYPES, write_model  # noqa: E402
from _helpers import fast_and_slow  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

TMP = Path(tempfile.mkdtemp(prefix="fastspec-gguf-fuzz-"))
SMALL = dict(arch="llama", dim=64, ffn=128, n_layers=1, n_heads=2, n_kv=1, types=TYPES[:3])


def slots(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Field kind -> ``(offset, size)`` of every integer field of the file's header."""
    r = gguf.GGUFReader(path)
    base = r.data.ctypes.data
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def at(kind: str, a: np.ndarray, i: int = 0) -> None:
        out[kind].append((a.ctypes.data - base + i * a.itemsize, a.itemsize))

    out.update(version=[(4, 4)], tensor_count=[(8, 8)], kv_count=[(16, 8)])
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        at("key length", f.parts[0])
        at("value type", f.parts[2])
        if f.types[0] == V.STRING:
            at("string length", f.parts[3])
        elif f.types[0] == V.ARRAY:
            at("element type", f.parts[3])
            at("array length", f.parts[4])
            if f.types[1] == V.STRING:
                for part in f.parts[5:25:2]:
                    at("string length", part)
    for t in r.tensors:
        name_len, _, n_dims, dims, ttype, offset = t.field.parts
        at("tensor name length", name_len)
        at("n_dims", n_dims)
        for j in range(len(dims)):
            at("dimension", dims, j)
        at("tensor type", ttype)
        at("tensor offset", offset)
    return dict(out)


def _valid() -> tuple[bytes, dict[str, list[tuple[int, int]]]]:
    path = TMP / "valid.gguf"
    write_model(path, **SMALL)
    return path.read_bytes(), slots(path)


VALID, SLOTS = _valid()


def patched(edits: dict[tuple[str, int], int], cut: int | None = None) -> bytes:
    """The valid file with field ``(kind, index)`` set to each value (wrapped to its width)."""
    raw = bytearray(VALID)
    for (kind, i), value in edits.items():
        off, size = SLOTS[kind][i % len(SLOTS[kind])]
        raw[off:off + size] = (value % 2 ** (8 * size)).to_bytes(size, "little")
    return bytes(raw[:cut])


def _write(data: bytes, name: str = "bad.gguf") -> Path:
    path = TMP / name
    path.write_bytes(data)
    return path


def _load_both(path: Path) -> None:
    """read_metadata and Transformer.load: a load or a ValueError naming the file."""
    for load in (read_metadata, fs.Transformer.load):
        try:
            load(path)
        except ValueError as exc:
            assert str(path) in str(exc), exc


# --- explicit cases --------------------------------------------------------------------------

def _tensor(name: str) -> int:
    return [t.name for t in gguf.GGUFReader(TMP / "valid.gguf").tensors].index(name)


def _key(name: str) -> int:
    keys = [k for k in gguf.GGUFReader(TMP / "valid.gguf").fields if not k.startswith("GGUF.")]
    return keys.index(name)


def _array(name: str) -> int:
    """Index of array ``name`` among the file's arrays."""
    r = gguf.GGUFReader(TMP / "valid.gguf")
    return [k for k, f in r.fields.items() if f.types and f.types[0] == V.ARRAY].index(name)


def _embd_dims() -> int:
    return 2 * _tensor("token_embd.weight")  # every tensor before it is a matrix too


CASES = {
    "wrong magic": (lambda: b"GGML" + VALID[4:], "magic b'GGML'"),
    "version 1": (lambda: patched({("version", 0): 1}), "GGUF version 1"),
    "version 2**31": (lambda: patched({("version", 0): 2**31}), "version"),
    "empty file": (lambda: b"", "0 bytes is too short"),
    "truncated in the vocabulary": (lambda: VALID[:1500], "tokenizer.ggml.tokens"),
    "truncated in the tensor data": (lambda: VALID[:-100], "'output.weight' of type Q4_1"),
    "tensor_count 2**60": (lambda: patched({("tensor_count", 0): 2**60}), "tensor_count = 2**60"),
    "kv_count 2**60": (lambda: patched({("kv_count", 0): 2**60}), "kv_count = 2**60"),
    "key of 2**62 bytes": (lambda: patched({("key length", 3): 2**62}), "key #3 of 2**62 bytes"),
    "string of 2**62 bytes": (lambda: patched({("string length", 0): 2**62}),
                              "general.architecture"),
    "array of 2**40 tokens": (lambda: patched({("array length", _array("tokenizer.ggml.tokens")):
                                               2**40}),
                              "'tokenizer.ggml.tokens': an array of 2**40 elements"),
    "unknown value type": (lambda: patched({("value type", 0): 13}), "unknown value type 13"),
    "unknown element type": (lambda: patched({("element type", 0): 99}),
                             "unknown array element type 99"),
    "unknown tensor type": (lambda: patched({("tensor type", 0): 255}), "unknown type 255"),
    "n_dims 5": (lambda: patched({("n_dims", 0): 5}), "n_dims = 5"),
    "dims overflow": (lambda: patched({("dimension", 0): 2**62 + 32, ("dimension", 1): 2**62}),
                      "past the end of the file"),
    "dims past the file": (lambda: patched({("dimension", _embd_dims() + 1): 10**6}),
                           "'token_embd.weight'"),
    "rows not whole blocks": (lambda: patched({("dimension", 0): 65}), "block of 32"),
    "offset past the file": (lambda: patched({("tensor offset", 0): 2**40}),
                             "past the end of the file"),
    "offset misaligned": (lambda: patched({("tensor offset", 1): 3}), "alignment 32"),
}


def _fmt(match: str) -> str:
    """``2**N`` in a case's expected message stands for its decimal value."""
    import re
    return re.sub(r"2\*\*(\d+)", lambda m: str(2 ** int(m.group(1))), match)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_header_is_named(case):
    make, match = CASES[case]
    path = _write(make())
    for load in (read_metadata, fs.Transformer.load):
        with pytest.raises(ValueError, match="bad.gguf") as err:
            load(path)
        assert _fmt(match) in str(err.value), err.value


def test_alignment_must_be_a_uint32_power_of_two(tmp_path):
    for value, vtype in ((48, V.UINT32), (0, V.UINT32), (64, V.UINT64)):
        path = tmp_path / "bad.gguf"
        write_model(path, **SMALL, metadata={"general.alignment": (value, vtype)})
        with pytest.raises(ValueError, match="'general.alignment' must be a uint32 power"):
            read_metadata(path)
    write_model(path, **SMALL, metadata={"general.alignment": (64, V.UINT32)})
    assert check_header(path, gguf.GGML_QUANT_SIZES).alignment == 64
    fs.Transformer.load(path)


def test_shapes_contradicting_the_metadata(tmp_path):
    path = tmp_path / "bad.gguf"
    write_model(path, **SMALL, metadata={"llama.feed_forward_length": (256, V.UINT32)})
    with pytest.raises(ValueError, match=r"bad.gguf: tensor 'blk.0.ffn_up.weight' has shape "
                                         r"\(128, 64\), the config needs \(256, 64\)"):
        fs.Transformer.load(path)


def test_architecture_of_another_type():
    from fastspec.formats.gguf import GGUFFile

    f = GGUFFile(TMP / "valid.gguf")
    f.architecture = ["llama"]  # what a value type flipped from string to array could give
    with pytest.raises(ValueError, match=r"valid.gguf: general.architecture \['llama'\]"):
        f.config()


def test_header_layout_matches_the_reader():
    layout = check_header(TMP / "valid.gguf", gguf.GGML_QUANT_SIZES)
    r = gguf.GGUFReader(TMP / "valid.gguf")
    assert (layout.version, layout.alignment, layout.data_offset) == (3, 32, r.data_offset)
    assert (layout.tensor_count, layout.kv_count) == (len(r.tensors), len(r.fields) - 3)


def test_chat_template_reaching_for_internals_is_a_value_error(tmp_path):
    path = tmp_path / "evil.gguf"
    write_model(path, **SMALL, metadata={
        "tokenizer.chat_template": ("{{ ''.__class__.__mro__ }}", V.STRING)})
    _, tok = fs.load_pretrained(path)
    with pytest.raises(ValueError, match="evil.gguf.*sandbox forbids"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_cli_exits_2_on_a_bad_file(capsys):
    path = _write(patched({("kv_count", 0): 2**60}))
    rc = main(["generate", "--model", str(path), "--prompt", "hi", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.gguf" in err and "kv_count" in err


# --- fuzz ------------------------------------------------------------------------------------

VALUES = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 31, 32, 255, 2**31, 2**32 - 1,
                                    2**40, 2**60, 2**62, 2**63, 2**64 - 1]),
                   st.integers(0, 2**64 - 1))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _header_property(edits, flips, cut):
    raw = bytearray(patched({(kind, i): v for kind, i, v in edits}))
    header_end = check_header(TMP / "valid.gguf", gguf.GGML_QUANT_SIZES).data_offset
    for pos, value in flips:
        raw[pos % header_end] = value
    path = _write(bytes(raw[:cut]), f"fuzz-{os.getpid()}.gguf")
    peak = _peak_mb()
    _load_both(path)
    assert _peak_mb() - peak < 256, "a fuzzed file made the loader allocate a lot"


test_header_fuzz, test_header_fuzz_slow = fast_and_slow(
    fast=40, deadline=20_000,
    edits=st.lists(st.tuples(st.sampled_from(sorted(SLOTS)), st.integers(0, 10**6), VALUES),
                   max_size=3),
    flips=st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=3),
    cut=st.one_of(st.none(), st.integers(0, len(VALID))),
)(_header_property)
