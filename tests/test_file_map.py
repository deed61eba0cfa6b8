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


def test_a_quantized_load_releases_every_packed_tensor(tmp_path, monkeypatch):
    """Each matrix of a quantized GGUF load is released once it is packed (a permuted llama
    ``attn_q``/``attn_k`` included: the pages released are the file's, whatever was read)."""
    gguf = pytest.importorskip("gguf")
    from _gguf_writer import write_model

    path = tmp_path / "m.gguf"
    write_model(path, "llama", dim=256, ffn=512, types=(gguf.GGMLQuantizationType.Q4_K,
                                                         gguf.GGMLQuantizationType.Q8_0))
    released = []
    release = FileMap.release
    monkeypatch.setattr(FileMap, "release",
                        lambda self, part: released.append(part.nbytes) or release(self, part))
    model = fs.Transformer.load(path, weight_dtype="auto")
    file = fs.formats.gguf.GGUFFile(path)
    want = sorted(t._t.data.nbytes for _, t in file.tensors(model.config) if t.ndim == 2)
    assert sorted(released) == want and len(want) == 2 * 7 + 2  # layers, embedding, head


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
