"""Every kernel against its NumPy twin and against an independent float64 formula.

Runs over backend x dtype (fixtures in conftest.py, formulas in _helpers.py). Under the NumPy backend the twin
comparisons are trivially true; the independent formulas are what test the twin itself.
"""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import _reference

from _helpers import RTOL, assert_close_rel, naive_attention, naive_probs_row, random_rows


@pytest.fixture
def kern(backend):
    """The kernel module of the backend under test."""
    return fs.kernels.module(backend)


# ---- attention -----------------------------------------------------------------------------

ATTENTION_SHAPES = [
    # n, n_heads, n_kv_heads, head_dim, capacity, length, causal
    (1, 8, 8, 64, 128, 128, True),      # decode step, length = capacity
    (5, 4, 2, 16, 5, 5, True),          # n = length = capacity
    (3, 6, 1, 7, 20, 11, True),         # H_kv = 1, odd head_dim
    (4, 2, 2, 1, 9, 4, False),          # head_dim 1, non-causal (DFlash block)
    (9, 8, 2, 64, 1500, 1300, True),    # length > 1024: the scratch path
    (7, 3, 3, 300, 40, 33, True),       # head_dim > one accumulator chunk
    (6, 4, 4, 128, 64, 64, False),      # specialised head_dim 128, non-causal
    (2, 4, 2, 32, 1100, 1030, False),   # specialised 32, rows > 1, long: online softmax
    (17, 4, 4, 128, 1200, 1100, True),  # online softmax at the largest head_dim it takes
    (3, 2, 1, 130, 1030, 1030, True),   # long, several rows, head_dim too big for online
    # float32 tiled kernel (head_dim a multiple of 16, <= 256): key tiles of 128
    (3, 4, 2, 48, 300, 129, True),      # one key past a tile, 3 vector chunks
    (5, 6, 2, 80, 260, 256, True),      # rows of a kv head not a multiple of 4; 5 chunks
    (2, 2, 1, 16, 130, 127, False),     # one key short of a tile, smallest head_dim
    (6, 4, 1, 112, 400, 385, True),     # 24 rows per kv head, several tiles, 7 chunks
    (1, 2, 2, 144, 70, 65, True),       # 9 chunks (AVX-512), 18 (AVX2)
    (5, 4, 1, 256, 300, 290, True),     # Gemma's head size, the largest: 20 rows a kv head
    (1, 2, 2, 272, 70, 65, True),       # head_dim over 256: the double template
]


@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "n{}H{}Hkv{}D{}C{}L{}{}".format(
    *s[:6], "c" if s[6] else "nc"))
def test_attention_matches_float64_formula_and_twin(kern, dtype, shape):
    n, n_heads, n_kv, head_dim, capacity, length, causal = shape
    rng = np.random.default_rng(sum(shape))
    q = rng.standard_normal((n, n_heads, head_dim)).astype(dtype)
    k = (2 * rng.standard_normal((n_kv, capacity, head_dim))).astype(dtype)
    v = rng.standard_normal((n_kv, capacity, head_dim)).astype(dtype)
    got = kern.attention(q, k, v, length, causal)
    assert got.dtype == dtype and got.shape == q.shape and got.flags.c_contiguous
    expected = naive_attention(q, k, v, length, causal)
    assert_close_rel(got, expected, RTOL[dtype])
    assert_close_rel(got, _reference.attention(q, k, v, length, causal).astype(np.float64),
                     RTOL[dtype])


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128, 256, 20, 272])
@pytest.mark.parametrize("length", [9, 128, 129, 300])
@pytest.mark.parametrize("n_heads,n_kv", [(4, 2), (3, 1), (1, 1), (4, 1), (10, 2)])
def test_attention_row_is_bit_identical_alone_and_in_a_block(kern, head_dim, length, n_heads,
                                                             n_kv):
    # Greedy speculative decoding compares a verification forward (n queries) with decode
    # steps (one query): each query's float32 result must not depend on its neighbours (an
    # odd number of rows per kv head puts a row in a pass of its own alone and beside
    # another in a block; groups of 4 and 5 put the rows of one query in value passes of 3 + 1
    # and 3 + 2 rows alone, and of 6 rows in the block).
    rng = np.random.default_rng(head_dim + length)
    n = 9
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = (2 * rng.standard_normal((n_kv, length + 4, head_dim))).astype(np.float32)
    v = rng.standard_normal((n_kv, length + 4, head_dim)).astype(np.float32)
    block = kern.attention(q, k, v, length)
    for i in range(n):
        alone = kern.attention(q[i:i + 1], k, v, length - n + i + 1)
        np.testing.assert_array_equal(alone[0], block[i], err_msg=f"query {i}")


def test_attention_ignores_positions_beyond_length(kern, dtype):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 4, 8)).astype(dtype)
    k = rng.standard_normal((2, 16, 8)).astype(dtype)
    v = rng.standard_normal((2, 16, 8)).astype(dtype)
    k[:, 10:] = np.nan
    v[:, 10:] = np.inf
    got = kern.attention(q, k, v, 10)
    assert np.isfinite(got).all()
    assert_close_rel(got, naive_attention(q, k, v, 10, True), RTOL[dtype])


def test_attention_causal_first_query_sees_only_its_prefix(kern, dtype):
    # With n = length, query 0 sees key 0 only, so its output is exactly value 0.
    rng = np.random.default_rng(2)
    q = rng.standard_normal((4, 2, 5)).astype(dtype)
    k = rng.standard_normal((2, 4, 5)).astype(dtype)
    v = rng.standard_normal((2, 4, 5)).astype(dtype)
    got = kern.attention(q, k, v, 4, causal=True)
    np.testing.assert_allclose(got[0], v[:, 0], rtol=RTOL[dtype])


def test_attention_float32_within_1e5_of_float64(kern):
    # Large scores make float32 accumulation visible; the kernel must accumulate in double.
    rng = np.random.default_rng(3)
    q = (4 * rng.standard_normal((2, 4, 64))).astype(np.float32)
    k = (4 * rng.standard_normal((4, 2048, 64))).astype(np.float32)
    v = rng.standard_normal((4, 2048, 64)).astype(np.float32)
    got = kern.attention(q, k, v, 2048)
    exact = naive_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            2048, True)
    assert_close_rel(got, exact, 1e-5)


def test_attention_without_heads_returns_empty(kern, dtype):
    q = np.zeros((2, 0, 4), dtype=dtype)
    k = np.zeros((1, 3, 4), dtype=dtype)
    got = kern.attention(q, k, k, 3)
    assert got.shape == (2, 0, 4) and got.dtype == dtype


def test_attention_writes_into_out(kern, dtype):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4, 8)).astype(dtype)
    k = rng.standard_normal((4, 6, 8)).astype(dtype)
    out = np.full(q.shape, 7.0, dtype=dtype)
    result = kern.attention(q, k, k, 6, True, out)
    assert result is out
    assert_close_rel(out, naive_attention(q, k, k, 6, True), RTOL[dtype])


def test_attention_accepts_read_only_inputs(kern, dtype):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 4)).astype(dtype)
    k = rng.standard_normal((1, 3, 4)).astype(dtype)
    for a in (q, k):
        a.flags.writeable = False
    assert_close_rel(kern.attention(q, k, k, 3), naive_attention(q, k, k, 3, True), RTOL[dtype])


# ---- cache_write / KVCache -------------------------------------------------------------------

@pytest.mark.parametrize("n, start, capacity", [(1, 0, 8), (3, 5, 8), (8, 0, 8), (0, 8, 8),
                                                (1, 7, 8)])
def test_cache_write_matches_twin(kern, dtype, n, start, capacity):
    rng = np.random.default_rng(n * 10 + start)
    cache = rng.standard_normal((3, capacity, 5)).astype(dtype)
    before = cache.copy()
    new = rng.standard_normal((n, 3, 5)).astype(dtype)
    assert kern.cache_write(cache, new, start) is None
    expected = before.copy()
    expected[:, start:start + n] = new.transpose(1, 0, 2)
    np.testing.assert_array_equal(cache, expected)


def test_kv_cache_append_and_crop(kern, dtype):
    """append = cache_write at length then advance; crop only moves the length."""
    cache = fs.KVCache(n_layers=2, n_kv_heads=2, capacity=16, head_dim=4, dtype=dtype)
    rng = np.random.default_rng(6)
    history = []
    for n in (3, 1, 4):
        new_k = rng.standard_normal((n, 2, 4)).astype(dtype)
        for layer in range(2):
            kern.cache_write(cache.k[layer], new_k, cache.length)
            kern.cache_write(cache.v[layer], -new_k, cache.length)
        cache.advance(n)
        history.append(new_k)
    expected = np.concatenate(history).transpose(1, 0, 2)
    np.testing.assert_array_equal(cache.keys(1), expected)
    np.testing.assert_array_equal(cache.values(0), -expected)
    buffer_id = id(cache.k)
    cache.crop(4)
    assert cache.length == 4 and id(cache.k) == buffer_id
    np.testing.assert_array_equal(cache.keys(0), expected[:, :4])
    q = rng.standard_normal((1, 2, 4)).astype(dtype)
    got = kern.attention(q, cache.k[0], cache.v[0], cache.length)
    assert_close_rel(got, naive_attention(q, cache.keys(0), cache.values(0), 4, True),
                     RTOL[dtype])


# ---- probs -----------------------------------------------------------------------------------

PROBS_PARAMS = [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 50, 1.0), (1.0, 50, 0.5), (0.0, 0, 1.0),
                (2.0, 1, 1.0), (1.0, 0, 0.01), (1.0, 10**6, 0.999), (0.5, 3, 0.2)]


@pytest.mark.parametrize("temperature, top_k, top_p", PROBS_PARAMS)
def test_probs_matches_formula_and_twin(kern, dtype, temperature, top_k, top_p):
    rng = np.random.default_rng(7)
    logits = (3 * rng.standard_normal((3, 500))).astype(dtype)
    got = kern.probs(logits, temperature, top_k, top_p)
    assert got.dtype == dtype and got.shape == logits.shape
    twin = _reference.probs(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(got > 0, twin > 0)
    np.testing.assert_allclose(got, twin, rtol=RTOL[dtype], atol=RTOL[dtype] * 1e-3)
    for r in range(3):
        expected = naive_probs_row(logits[r], temperature, top_k, top_p)
        np.testing.assert_array_equal(got[r] > 0, expected > 0)
        np.testing.assert_allclose(got[r], expected, rtol=RTOL[dtype], atol=1e-12)


def test_probs_one_dimensional_and_vocab_one(kern, dtype):
    got = kern.probs(np.array([0.3], dtype=dtype), 0.8, 1, 0.5)
    assert got.shape == (1,) and got[0] == 1
    row = np.array([1.0, 2.0, 0.5], dtype=dtype)
    np.testing.assert_allclose(kern.probs(row), np.exp(row - 2) / np.exp(row - 2).sum(),
                               rtol=RTOL[dtype])


def test_probs_greedy_ties_take_first_index(kern, dtype):
    got = kern.probs(np.array([[1, 5, 5, 2], [7, 7, 7, 7]], dtype=dtype), 0.0)
    np.testing.assert_array_equal(got, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_probs_top_k_keeps_ties_at_kth(kern, dtype):
    got = kern.probs(np.array([1, 3, 3, 2, 3, 0], dtype=dtype), 1.0, top_k=2)
    np.testing.assert_allclose(got, [0, 1 / 3, 1 / 3, 0, 1 / 3, 0], rtol=RTOL[dtype])


@pytest.mark.parametrize("top_k", [1, 50, 3000])  # heap below vocab / 64, selection above
def test_probs_top_k_large_vocab_with_ties(kern, dtype, top_k):
    rng = np.random.default_rng(3)
    logits = rng.integers(-40, 40, (2, 5003)).astype(dtype)  # every value repeated ~60 times
    got = kern.probs(logits, 0.8, top_k)
    twin = _reference.probs(logits, 0.8, top_k)
    np.testing.assert_array_equal(got > 0, twin > 0)
    np.testing.assert_allclose(got, twin, rtol=RTOL[dtype], atol=1e-12)
    kth = np.sort(logits, axis=1)[:, -top_k]
    np.testing.assert_array_equal(got > 0, logits >= kth[:, None])


@pytest.mark.parametrize("temperature, top_k, top_p", PROBS_PARAMS)
def test_probs_into_a_reused_buffer(kern, dtype, temperature, top_k, top_p):
    rng = np.random.default_rng(11)
    logits = (3 * rng.standard_normal((3, 500))).astype(dtype)
    out = np.full_like(logits, np.nan)  # stale contents must not leak into the result
    got = kern.probs(logits, temperature, top_k, top_p, out=out)
    assert got is out
    np.testing.assert_array_equal(out, kern.probs(logits, temperature, top_k, top_p))
    row = kern.probs(logits[1], temperature, top_k, top_p, out=out[2])  # 1-D into a row view
    np.testing.assert_array_equal(row, out[1])


def test_probs_out_errors(kern):
    logits = np.zeros((2, 5))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 5\)"):
        kern.probs(logits, out=np.zeros((2, 4)))
    with pytest.raises(TypeError, match="out must have dtype float64"):
        kern.probs(logits, out=np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        kern.probs(logits, out=np.zeros((5, 2)).T)
    ro = np.zeros((2, 5))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writable"):
        kern.probs(logits, out=ro)
    with pytest.raises(ValueError, match="out must not overlap logits"):
        kern.probs(logits, out=logits)


@pytest.mark.parametrize("dtype, ints, near, temperature", [
    (np.float32, np.int32, 1e-30, 1e290),
    (np.float64, np.int64, 1e-10, 1e300),
])
def test_probs_top_k_when_temperature_merges_neighbours(kern, dtype, ints, near, temperature):
    """Divided by the temperature, consecutive logits near ``near`` land on the same subnormal
    doubles: top-k keeps every token whose *scaled* logit ties the k-th, beyond the k largest."""
    bits = dtype(near).view(ints) + np.arange(4000, dtype=ints)
    logits = np.random.default_rng(0).permutation(bits).view(dtype)
    got = kern.probs(logits, temperature, 50)
    twin = _reference.probs(logits, temperature, 50)
    np.testing.assert_array_equal(got > 0, twin > 0)
    np.testing.assert_allclose(got, twin, rtol=RTOL[dtype])
    assert np.count_nonzero(got) > 50  # the merge happened: the test reaches that path


@pytest.mark.parametrize("top_p, expected", [
    (0.5, [0.5, 0.5, 0, 0]),          # mass before the third equal token is 0.5: cut
    (0.6, [1 / 3, 1 / 3, 1 / 3, 0]),  # 0.5 < 0.6: the third is kept, the fourth is not
    (0.25, [1, 0, 0, 0]),             # only the lowest index among the ties
    (1.0, [0.25] * 4),
])
def test_probs_top_p_cut_inside_ties(kern, dtype, top_p, expected):
    got = kern.probs(np.zeros(4, dtype=dtype), 1.0, 0, top_p)
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype])


def test_probs_top_p_ties_broken_by_lower_index(kern, dtype):
    # p = [0.2, 0.4, 0.2, 0.2]: order is 1, 0, 2, 3; with top_p 0.7 keep 1, 0, 2.
    logits = np.log(np.array([0.2, 0.4, 0.2, 0.2])).astype(dtype)
    got = kern.probs(logits, 1.0, 0, 0.7)
    np.testing.assert_allclose(got, [0.25, 0.5, 0.25, 0], rtol=RTOL[dtype] * 10)


def test_probs_top_p_peaked_and_flat_large_vocab(kern, dtype):
    # A large V exercises the partial (exponent-bucket) selection in both regimes.
    rng = np.random.default_rng(8)
    for scale in (0.3, 8.0):
        logits = (scale * rng.standard_normal(20000)).astype(dtype)
        got = kern.probs(logits, 1.0, 0, 0.9)
        twin = _reference.probs(logits, 1.0, 0, 0.9)
        np.testing.assert_array_equal(got > 0, twin > 0)
        np.testing.assert_allclose(got, twin, rtol=RTOL[dtype], atol=1e-12)


# ---- sample ----------------------------------------------------------------------------------

def test_sample_matches_twin_and_definition(kern, dtype):
    rng = np.random.default_rng(9)
    for trial in range(40):
        vocab = int(rng.integers(1, 60))
        w = rng.random(vocab).astype(dtype)
        w[rng.random(vocab) < 0.3] = 0
        if not w.sum() > 0:
            w[-1] = 1
        for u in (0.0, float(rng.random()), 1 - 2**-53):
            got = kern.sample(w, u)
            assert got == _reference.sample(w, u)
            cum = np.cumsum(w.astype(np.float64))
            hits = np.flatnonzero(cum > u * cum[-1])
            assert got == (hits[0] if hits.size else np.flatnonzero(w)[-1])
            assert w[got] > 0


# ---- verify_greedy ---------------------------------------------------------------------------

def test_verify_greedy_matches_definition(kern, dtype):
    rng = np.random.default_rng(10)
    for trial in range(60):
        g, vocab = int(rng.integers(0, 6)), int(rng.integers(1, 12))
        logits = rng.integers(-3, 3, (g + 1, vocab)).astype(dtype)  # many ties
        best = np.argmax(logits, axis=1)
        draft = best[:g].copy()
        if g and rng.random() < 0.7:
            i = int(rng.integers(0, g))
            draft[i] = rng.integers(0, vocab)
        expected = next(((i, int(best[i])) for i in range(g) if draft[i] != best[i]),
                        (g, int(best[g])))
        for tokens in (draft.astype(np.int64), draft.astype(np.int32), draft.astype(np.uint16)):
            assert kern.verify_greedy(tokens, logits) == expected
            assert _reference.verify_greedy(tokens, logits) == expected


# ---- verify_rejection ------------------------------------------------------------------------

@pytest.mark.parametrize("with_q", [True, False], ids=["q", "onehot"])
def test_verify_rejection_matches_twin_bit_for_bit(kern, dtype, with_q):
    rng = np.random.default_rng(11)
    for trial in range(150):
        g, vocab = int(rng.integers(0, 6)), int(rng.integers(1, 40))
        p = random_rows(rng, g + 1, vocab, dtype)
        q = random_rows(rng, g, vocab, dtype) if with_q else None
        draft = np.array([rng.choice(vocab, p=(q[i] / q[i].sum(dtype=np.float64)).astype(np.float64)
                                     if with_q else None)
                          for i in range(g)], dtype=np.int64)
        uniforms = rng.random(g + 1)
        uniforms[: g] *= rng.random() * 2  # vary the acceptance rate
        uniforms = np.minimum(uniforms, 1 - 2**-53)
        got = kern.verify_rejection(draft, p, q, uniforms)
        assert got == _reference.verify_rejection(draft, p, q, uniforms)
        n_acc, token = got
        assert 0 <= n_acc <= g and 0 <= token < vocab
        assert p[n_acc, token] > 0


def test_verify_rejection_accept_rule_and_residual(kern, dtype):
    p = np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]], dtype=dtype)
    q = np.array([[0.25, 0.5, 0.25]], dtype=dtype)
    draft = np.array([1])
    # u * q < p  <=>  u < 0.5: accepted, then the bonus from p[1] by inverse CDF
    assert kern.verify_rejection(draft, p, q, np.array([0.49, 0.1])) == (1, 0)
    assert kern.verify_rejection(draft, p, q, np.array([0.49, 0.45])) == (1, 1)
    # rejected: residual max(p - q, 0) = [0.25, 0, 0] -> always token 0
    assert kern.verify_rejection(draft, p, q, np.array([0.51, 0.99])) == (0, 0)
    # one-hot q: accept when u < p[x] = 0.25; residual p without x = [0.5, 0, 0.25]
    assert kern.verify_rejection(draft, p, None, np.array([0.2, 0.0])) == (1, 0)
    assert kern.verify_rejection(draft, p, None, np.array([0.3, 0.5])) == (0, 0)
    assert kern.verify_rejection(draft, p, None, np.array([0.3, 0.7])) == (0, 2)


def test_verify_rejection_degenerate_cases(kern, dtype):
    # V = 1: every token is 0, always accepted
    one = np.ones((3, 1), dtype=dtype)
    assert kern.verify_rejection(np.zeros(2, np.int64), one, one[:2], np.array([0.9, 0.9, 0.5])) \
        == (2, 0)
    assert kern.verify_rejection(np.zeros(2, np.int64), one, None, np.array([0.9, 0.9, 0.5])) \
        == (2, 0)
    # g = 0: only the bonus draw
    p = np.array([[0.1, 0.9]], dtype=dtype)
    assert kern.verify_rejection(np.zeros(0, np.int64), p, None, np.array([0.05])) == (0, 0)
    assert kern.verify_rejection(np.zeros(0, np.int64), p, np.zeros((0, 2), dtype),
                                 np.array([0.5])) == (0, 1)
    # q == p: always accepted
    rng = np.random.default_rng(12)
    pp = random_rows(rng, 4, 9, dtype)
    draft = np.array([int(np.argmax(r)) for r in pp[:3]])
    assert kern.verify_rejection(draft, pp, pp[:3].copy(), np.full(4, 0.999))[0] == 3


# ---- threads -------------------------------------------------------------------------------

def test_kernels_give_the_same_results_from_several_threads(kern):
    """The compiled kernels release the GIL and keep their scratch per thread."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(13)
    jobs = []
    for t in range(8):
        length = 1100 + 50 * t  # long enough for the scratch-buffer attention path
        q = rng.standard_normal((1, 4, 16)).astype(np.float32)
        k = rng.standard_normal((4, length, 16)).astype(np.float32)
        logits = rng.standard_normal(3000 + 500 * t)
        p = random_rows(rng, 5, 2000 + 100 * t, np.float64)
        draft = rng.integers(0, p.shape[1], 4)
        jobs.append((q, k, length, logits, p, draft, rng.random(5)))

    def work(job):
        q, k, length, logits, p, draft, u = job
        return (kern.attention(q, k, k, length), kern.probs(logits, 0.8, 0, 0.9),
                kern.verify_rejection(draft, p, None, u))

    expected = [work(job) for job in jobs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            for got, want in zip(pool.map(work, jobs), expected):
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
                assert got[2] == want[2]
