"""fastspec.kernels.arena (one huge-page mapping for a model's matrices) and
fastspec.kernels.quant.gather (a quantized model's matrices moved into one, in order)."""
import mmap

import numpy as np
import pytest

from fastspec.kernels.arena import ALIGN, HUGE_PAGE, WeightArena, in_arena
from fastspec.kernels.quant import QuantMatrix, gather, linear_q


def test_arena_hands_out_aligned_arrays_in_order_from_a_huge_page_boundary():
    arena = WeightArena(WeightArena.padded(100 * 4) + WeightArena.padded(3) + 64)
    a = arena.take(100, np.float32)
    b = arena.take(3, np.uint8)
    c = arena.take(16, np.float32)
    assert a.shape == (100,) and a.dtype == np.float32 and b.shape == (3,)
    assert a.ctypes.data % HUGE_PAGE == 0
    assert b.ctypes.data == a.ctypes.data + 448 and c.ctypes.data == b.ctypes.data + ALIGN
    with pytest.raises(MemoryError, match="overrun"):
        arena.take(1, np.uint8)


def test_padded_rounds_up_to_the_alignment():
    assert [WeightArena.padded(n) for n in (0, 1, 64, 65, 128)] == [0, 64, 64, 128, 128]


def test_copy_is_equal_read_only_and_outlives_the_arena_object():
    src = np.arange(1000, dtype=np.float32).reshape(10, 100)
    arena = WeightArena(WeightArena.padded(src.nbytes))
    c = arena.copy(src)
    del arena
    np.testing.assert_array_equal(c, src.reshape(-1))
    assert not c.flags.writeable and in_arena(c) and in_arena(c[5:].view(np.uint8))


def test_in_arena_is_false_for_other_memory(tmp_path):
    assert not in_arena(np.zeros(10))
    path = tmp_path / "m.bin"
    path.write_bytes(bytes(64))
    assert not in_arena(np.memmap(path, np.uint8, "r"))  # a file mapping is not an arena
    anon = mmap.mmap(-1, 4096)
    assert not in_arena(np.frombuffer(anon, np.uint8))


def _qm(kind, out, inp, seed):
    rng = np.random.default_rng(seed)
    return QuantMatrix.from_float(kind, rng.standard_normal((out, inp)).astype(np.float32))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_gather_moves_bytes_in_order_once_per_object_and_leaves_the_inputs(kind):
    a, b, c = _qm(kind, 24, 64, 0), _qm(kind, 8, 32, 1), _qm(kind, 40, 96, 2)
    before = [m.packed for m in (a, b, c)]
    out = gather([a, b, a, c])
    assert [m.packed is p for m, p in zip((a, b, c), before)] == [True] * 3  # inputs untouched
    assert out[0] is out[2] and out[0] is not a
    assert all(in_arena(m.packed) and not m.packed.flags.writeable for m in out)
    starts = [out[i].packed.ctypes.data for i in (0, 1, 3)]
    assert starts == sorted(starts) and starts[0] % HUGE_PAGE == 0
    for m, o in zip((a, b, a, c), out):
        assert (o.kind, o.shape) == (m.kind, m.shape)
        np.testing.assert_array_equal(o.packed, m.packed)
    x = np.random.default_rng(3).standard_normal((2, 96)).astype(np.float32)
    np.testing.assert_array_equal(linear_q(x, out[3]), linear_q(x, c))


def test_gather_keeps_matrices_already_in_an_arena():
    a, b = gather([_qm("q8_0", 8, 32, 0), _qm("q8_0", 16, 32, 1)])
    c = _qm("q8_0", 8, 64, 2)
    out = gather([a, c, b])
    assert out[0] is a and out[2] is b and out[1] is not c and in_arena(out[1].packed)
    assert gather([a, b]) == [a, b]
