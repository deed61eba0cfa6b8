"""``fastspec.formats.file_map.FileMap``: a model file mapped copy-on-write, whose pages a
quantized load hands back once it has packed them (``FileMap.release``), so that the load's
peak memory is the packed weights and not also the file. The bytes read after a release are
the file's, unchanged."""
from __future__ import annotations

import mmap

import numpy as np
import pytest

import fastspec as fs
from fastspec.formats.file_map import FileMap

PAGE = mmap.PAGESIZE


def resident(path) -> int | None:
    """Resident bytes of this process's maps of ``path`` (/proc/self/smaps); None where that
    cannot be read."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and len(head) > 1 and len(head[1]) == 4:  # a map's header
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


@pytest.fixture
def mapped(tmp_path):
    path = tmp_path / "bytes.bin"
    data = np.random.default_rng(0).integers(0, 256, 40 * PAGE, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    fm = FileMap(path)
    assert int(fm.data.astype(np.int64).sum()) == int(data.astype(np.int64).sum())  # all read
    if resident(path) != 40 * PAGE or not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("no /proc/self/smaps or madvise here")
    return path, fm, data


def test_release_drops_the_whole_pages_and_keeps_the_bytes(mapped):
    path, fm, data = mapped
    part = fm.data[3 * PAGE + 100:30 * PAGE + 50]  # whole pages 4..29
    assert fm.release(part)
    assert resident(path) == (40 - 26) * PAGE
    np.testing.assert_array_equal(fm.data, data)  # read again from the file, unchanged
    assert resident(path) == 40 * PAGE


def test_release_of_what_is_not_a_whole_page_of_the_map(mapped):
    path, fm, data = mapped
    for part in (fm.data[PAGE + 1:2 * PAGE + 7],  # no whole page
                 fm.data[:0],
                 fm.data[::2],  # not contiguous
                 np.array(fm.data[:4 * PAGE])):  # a copy
        assert not fm.release(part)
    assert resident(path) == 40 * PAGE


def record_releases(monkeypatch) -> list[tuple[int, int]]:
    """The (offset in the file's map, bytes) of every FileMap.release from now on."""
    spans: list[tuple[int, int]] = []
    release = FileMap.release
    monkeypatch.setattr(FileMap, "release", lambda self, part: spans.append(
        (part.ctypes.data - self._base, part.nbytes)) or release(self, part))
    return spans


def released_bytes(spans, file, tensor) -> int:
    """How far from its start ``tensor``'s bytes are covered by released spans, without a
    gap (0: none of it released)."""
    start = tensor._t.data.ctypes.data - file._map._base
    stop, at = start + tensor._t.data.nbytes, start
    for a, n in sorted(s for s in spans if start <= s[0] < stop):
        if a > at:
            break
        at = max(at, a + n)
    return at - start


def test_a_quantized_load_releases_every_packed_tensor(tmp_path, monkeypatch):
    """Each matrix of a quantized GGUF load is released once it is packed (a permuted llama
    ``attn_q``/``attn_k`` included: the pages released are the file's, whatever was read)."""
    gguf = pytest.importorskip("gguf")
    from _gguf_writer import write_model

    path = tmp_path / "m.gguf"
    write_model(path, "llama", dim=256, ffn=512, types=(gguf.GGMLQuantizationType.Q4_K,
                                                         gguf.GGMLQuantizationType.Q8_0))
    spans = record_releases(monkeypatch)
    model = fs.Transformer.load(path, weight_dtype="auto")
    file = fs.formats.gguf.GGUFFile(path)
    mats = [t for _, t in file.tensors(model.config) if t.ndim == 2]
    assert len(mats) == 2 * 7 + 2  # layers, embedding, head
    for t in mats:
        assert released_bytes(spans, file, t) == t._t.data.nbytes, t.name


def test_float_tensors_lent_as_views_are_never_released(tmp_path):
    """F32/F16 tensors of the map may be writable views lent out (``GGUFTensor.mapped``, a
    model loaded with ``mmap=True``): packing one as q8_0 must not drop what was written into
    them (MADV_DONTNEED discards a private page's writes); a quantized tensor's pages are."""
    gguf = pytest.importorskip("gguf")
    from _gguf_writer import write_model

    Q = gguf.GGMLQuantizationType
    path = tmp_path / "m.gguf"
    write_model(path, "qwen2", dim=256, ffn=512, types=(Q.F32, Q.F16, Q.Q8_0))
    file = fs.formats.gguf.GGUFFile(path)
    kinds = set()
    for _, t in file.tensors(file.config()):
        if t.ndim == 2 and t.type_name in ("F32", "F16"):
            view = t.mapped()
            view[...] = 2.0
            t.quant("q8_0")
            assert (view == 2.0).all(), t.name
            kinds.add(t.type_name)
    assert kinds == {"F32", "F16"}


def test_a_float_load_releases_what_it_dequantized(tmp_path, monkeypatch):
    """A float load dequantizes each quantized tensor chunk by chunk (``GGUFTensor.read``) and
    releases each chunk's pages once converted: together they cover every quantized matrix;
    no F16 tensor's bytes are released (they may be lent out as views)."""
    gguf = pytest.importorskip("gguf")
    from _gguf_writer import write_model

    Q = gguf.GGMLQuantizationType
    path = tmp_path / "m.gguf"
    write_model(path, "llama", dim=256, ffn=512, types=(Q.Q4_K, Q.Q8_0, Q.F16))
    spans = record_releases(monkeypatch)
    monkeypatch.setattr(fs.formats.gguf_tensor, "_CHUNK", 3 * 256)  # several chunks a matrix
    fs.Transformer.load(path, weight_dtype="float32")
    file = fs.formats.gguf.GGUFFile(path)
    kinds = set()
    for _, t in file.tensors(file.config()):
        if t.ndim == 2:
            want = 0 if t.type_name == "F16" else t._t.data.nbytes
            assert released_bytes(spans, file, t) == want, t.name
            kinds.add(t.type_name)
    assert kinds == {"Q4_K", "Q8_0", "F16"}
