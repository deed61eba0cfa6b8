"""float16 (IEEE binary16) K/V caches in the kernels: ``attention`` and ``tree_attention`` with
float32 queries over a float16 cache give, bit for bit, the result of the same call on the
cache widened to float32 (widening is exact), on both backends and every attention variant
(the tiled kernel's head sizes 32, 64, 128, 256 and the double template's 72, 272); a row alone
equals the same row inside a block; ``cache_write`` and ``compact_kv`` move float16 rows (and
round float32 rows into a float16 cache as numpy's astype); bad dtype combinations are
TypeErrors. The cache rows past ``length`` are NaN: a kernel that read them would show it."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels.tree_shape import ancestor_mask

from _helpers import BACKENDS, RTOL, isa_params

F16, F32 = np.float16, np.float32
TILED = (32, 64, 128, 256)
FALLBACK = (72, 272)
NS = (1, 2, 3, 8, 13, 17)
GROUPS = (1, 3, 4)
LENGTHS = (1, 5, 127, 128, 129, 300, 1100)


@pytest.fixture
def kern(backend):
    """The kernel module of the backend under test."""
    return fs.kernels.module(backend)


@pytest.fixture(params=["native"] + isa_params(names=("avx2", "portable")))
def isa(request, backend):
    """The attention variant: the CPU's own, and (compiled backend) the forced AVX2 and
    portable paths (the baseline variant widens with the scalar conversion)."""
    if request.param != "native":
        if backend != "cython":
            pytest.skip("the ISA paths are the compiled backend's")
        fs.kernels.set_isa(request.param)
    yield request.param
    if request.param != "native":
        fs.kernels.set_isa(None)


def _cache(rng, n_kv, length, head_dim, extra=3):
    """float16 k, v (n_kv, length + extra, head_dim): random values, a few subnormal, rows past
    length NaN; and their float32 widening."""
    shape = (n_kv, length + extra, head_dim)
    k = 2.0 * rng.standard_normal(shape)
    v = rng.standard_normal(shape)
    for a in (k, v):  # binary16 subnormals (below 6.1e-5): the scalar widening's other branch
        a[rng.random(shape) < 0.05] *= 1e-6
        a[:, length:] = np.nan
    k16, v16 = k.astype(F16), v.astype(F16)
    return k16, v16, k16.astype(F32), v16.astype(F32)


def _same(a, b):
    assert a.dtype == b.dtype == F32
    assert np.isfinite(a).all()
    assert np.array_equal(a, b)


def _combos(rng, head_dim):
    """(n, group, length, causal, window) cases: every n, group and length, causal and not,
    causal ones with windows 1, 7 and length too (a subset of the full product, seeded)."""
    out = []
    for length in LENGTHS:
        for n in NS:
            if n > length:
                continue
            for group in GROUPS:
                out.append((n, group, length, False, None))
                out.append((n, group, length, True, None))
            # windows on one group a case, rotating (every group and window appears)
            for w in (1, 7, length):
                out.append((n, GROUPS[rng.integers(3)], length, True, w))
    return out


@pytest.mark.parametrize("head_dim", TILED + FALLBACK)
def test_attention_float16_cache_is_the_widened_cache_bits(kern, isa, head_dim):
    rng = np.random.default_rng(head_dim)
    for n, group, length, causal, window in _combos(rng, head_dim):
        n_kv = 1 if length >= 1100 else 2
        k16, v16, k32, v32 = _cache(rng, n_kv, length, head_dim)
        q = rng.standard_normal((n, n_kv * group, head_dim)).astype(F32)
        got = kern.attention(q, k16, v16, length, causal=causal, window=window)
        want = kern.attention(q, k32, v32, length, causal=causal, window=window)
        _same(got, want)
        out = np.full_like(q, np.nan)  # out= too
        assert kern.attention(q, k16, v16, length, causal, out, window) is out
        _same(out, want)


def _random_tree(rng, n, window=None):
    """Parents (parent < child) of a random tree whose depth d keeps d + 1 <= window."""
    parents, depth = [], []
    for i in range(n):
        options = [-1] + [j for j in range(i) if window is None or depth[j] + 2 <= window]
        p = options[rng.integers(len(options))] if rng.random() < 0.6 else (
            i - 1 if i - 1 in options else -1)
        parents.append(p)
        depth.append(0 if p < 0 else depth[p] + 1)
    return np.array(parents, dtype=np.int64)


@pytest.mark.parametrize("head_dim", TILED + FALLBACK)
def test_tree_attention_float16_cache_is_the_widened_cache_bits(kern, isa, head_dim):
    rng = np.random.default_rng(100 + head_dim)
    for context in (0, 1, 127, 300, 1100):
        for n in (1, 3, 8, 13, 17):
            for window in (None, 7, 40):
                if window is not None and context + n <= window:
                    continue
                mask = ancestor_mask(_random_tree(rng, n, window))
                group = GROUPS[rng.integers(3)]
                length = context + n
                k16, v16, k32, v32 = _cache(rng, 2, length, head_dim)
                q = rng.standard_normal((n, 2 * group, head_dim)).astype(F32)
                got = kern.tree_attention(q, k16, v16, length, mask, window=window)
                want = kern.tree_attention(q, k32, v32, length, mask, window=window)
                _same(got, want)


@pytest.mark.parametrize("head_dim", TILED + FALLBACK)
@pytest.mark.parametrize("window", [None, 5])
def test_row_alone_equals_row_in_block_float16(backend, kern, isa, head_dim, window):
    """Query i of a block == a decode step (n = 1) at length - n + i + 1, bit for bit (the
    compiled kernels' promise; the twin's einsum does not make it)."""
    if backend != "cython":
        pytest.skip("bit-identical rows are the compiled kernels' promise")
    rng = np.random.default_rng(7 + head_dim)
    for length, n, group in ((40, 8, 3), (300, 13, 1), (129, 17, 4), (1100, 3, 3)):
        k16, v16, _, _ = _cache(rng, 2, length, head_dim)
        q = rng.standard_normal((n, 2 * group, head_dim)).astype(F32)
        block = kern.attention(q, k16, v16, length, window=window)
        for i in range(n):
            alone = kern.attention(q[i:i + 1], k16, v16, length - n + i + 1, window=window)
            _same(alone[0], block[i])


@pytest.mark.skipif(not {"cython", "numpy"} <= set(BACKENDS), reason="needs both backends")
@pytest.mark.parametrize("head_dim", (64, 72))
def test_compiled_float16_matches_twin(head_dim):
    rng = np.random.default_rng(3)
    comp, twin = fs.kernels.module("cython"), fs.kernels.module("numpy")
    for n, group, length, causal, window in [(1, 3, 300, True, None), (8, 4, 1100, True, None),
                                             (13, 1, 129, False, None), (5, 3, 300, True, 7)]:
        k16, v16, _, _ = _cache(rng, 2, length, head_dim)
        q = rng.standard_normal((n, 2 * group, head_dim)).astype(F32)
        got = comp.attention(q, k16, v16, length, causal=causal, window=window)
        want = twin.attention(q, k16, v16, length, causal=causal, window=window)
        np.testing.assert_allclose(got, want, rtol=RTOL[F32], atol=RTOL[F32])
        mask = ancestor_mask(_random_tree(rng, n))
        got = comp.tree_attention(q, k16, v16, length, mask)
        want = twin.tree_attention(q, k16, v16, length, mask)
        np.testing.assert_allclose(got, want, rtol=RTOL[F32], atol=RTOL[F32])


# ---- cache_write and compact_kv ------------------------------------------------------------

def _special_values(rng, shape):
    """float32 values across binary16's range: random, subnormal, halfway ties, past the
    largest (-> inf), infinities and NaNs."""
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-9, 6, shape)).astype(F32)
    flat = x.reshape(-1)
    specials = np.array([6e-8, -3e-8, 2.9802322e-08, 5.960464e-08, 65504.0, 65519.99, 65520.0,
                         -1e6, np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1.0009765625 / 2,
                         2049.0, 2051.0, 1e-5, -6.097555e-05], dtype=F32)
    flat[:specials.size] = specials
    return x


def _bits(a):
    return a.view(np.uint16)


def test_cache_write_float16(kern):
    rng = np.random.default_rng(5)
    cache = rng.standard_normal((3, 40, 16)).astype(F16)
    want = cache.copy()
    new = _special_values(rng, (7, 3, 16))
    kern.cache_write(cache, new, 11)  # float32 rows, rounded
    with np.errstate(over="ignore"):  # past binary16's largest: inf, as the kernel
        want[:, 11:18] = new.transpose(1, 0, 2).astype(F16)
    assert np.array_equal(_bits(cache), _bits(want))
    new16 = rng.standard_normal((4, 3, 16)).astype(F16)
    kern.cache_write(cache, new16, 36)  # float16 rows, copied
    want[:, 36:40] = new16.transpose(1, 0, 2)
    assert np.array_equal(_bits(cache), _bits(want))
    kern.cache_write(cache, new16[:0], 40)  # nothing
    assert np.array_equal(_bits(cache), _bits(want))


def test_cache_write_float16_rounding_everywhere(kern):
    """Every float32 bit pattern class: 2^20 random bit patterns, rounded as numpy's astype."""
    rng = np.random.default_rng(6)
    bits = rng.integers(0, 2**32, (2**20,), dtype=np.uint64).astype(np.uint32)
    new = bits.view(F32).reshape(-1, 1, 64)
    cache = np.zeros((1, new.shape[0], 64), F16)
    kern.cache_write(cache, new, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        want = new[:, 0].astype(F16)
    assert np.array_equal(_bits(cache[0]), _bits(want))


def test_compact_kv_float16(kern):
    rng = np.random.default_rng(8)
    k = rng.standard_normal((2, 3, 30, 8)).astype(F16)
    v = rng.standard_normal((2, 3, 30, 8)).astype(F16)
    k[0, 0, 5] = np.nan  # moved as bits
    rows = np.array([12, 14, 15, 20, 29], dtype=np.int64)
    wk, wv = k.copy(), v.copy()
    wk[:, :, 10:15] = wk[:, :, rows]
    wv[:, :, 10:15] = wv[:, :, rows]
    kern.compact_kv(k, v, 10, rows)
    assert np.array_equal(_bits(k), _bits(wk)) and np.array_equal(_bits(v), _bits(wv))


# ---- bad dtype combinations ------------------------------------------------------------------

def test_float16_bad_dtypes(kern):
    q = np.zeros((1, 2, 16), F32)
    k16 = np.zeros((1, 4, 16), F16)
    k32 = np.zeros((1, 4, 16), F32)
    mask = np.ones((1, 1), bool)
    with pytest.raises(TypeError, match="v_cache must have dtype float16, got float32"):
        kern.attention(q, k16, k32, 4)
    with pytest.raises(TypeError, match="v_cache must have dtype float32, got float16"):
        kern.attention(q, k32, k16, 4)
    with pytest.raises(TypeError, match="float16 k_cache needs float32 q, got q float64"):
        kern.attention(q.astype(np.float64), k16, k16, 4)
    with pytest.raises(TypeError, match="q must be float32 or float64, got float16"):
        kern.attention(q.astype(F16), k16, k16, 4)
    with pytest.raises(TypeError, match="float16 k_cache needs float32 q, got q float64"):
        kern.tree_attention(q.astype(np.float64), k16, k16, 4, mask)
    with pytest.raises(TypeError, match="v_cache must have dtype float16, got float32"):
        kern.tree_attention(q, k16, k32, 4, mask)
    with pytest.raises(TypeError, match="out must be float32 or float64, got float16"):
        kern.attention(q, k16, k16, 4, out=np.zeros((1, 2, 16), F16))
    with pytest.raises(TypeError, match="new must be float32 or float16, got float64"):
        kern.cache_write(k16, np.zeros((1, 1, 16)), 0)
    with pytest.raises(TypeError, match="new must be float32 or float64, got float16"):
        kern.cache_write(k32, np.zeros((1, 1, 16), F16), 0)
    with pytest.raises(TypeError, match="v must have dtype float16, got float32"):
        kern.compact_kv(k16[None], k32[None], 0, np.zeros(0, np.int64))
    with pytest.raises(TypeError, match="k_cache must be float32, float64 or float16, got int16"):
        kern.attention(q, k16.view(np.int16), k16, 4)
