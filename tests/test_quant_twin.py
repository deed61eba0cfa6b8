"""The NumPy twin of the quantized products (fastspec.kernels._reference_quant) on its own: its
emulated fused multiply-add is correctly rounded where float64 arithmetic rounds twice (sums
that land on a float32 midpoint, normal and subnormal), and its products do not depend on the
column chunks it runs its float steps in. tests/test_quant_kernels.py holds it against the
compiled kernels, bit for bit."""
from fractions import Fraction

import numpy as np
import pytest

from fastspec.kernels import _reference_quant as R
from fastspec.kernels import quant as Q


def _rn32(x: Fraction) -> np.float32:
    """``x`` rounded to float32, to nearest, ties to even (exact rational arithmetic)."""
    f = np.float32(float(x))
    best = None
    for g in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))):
        if np.isfinite(g):
            key = (abs(Fraction(float(g)) - x), int(np.float32(g).view(np.uint32)) & 1)
            best = min(best, (key, g)) if best else (key, g)
    return best[1]


def _midpoint_cases():
    """(a, b, c) float32 with a * b + c = m +- d: m a float32 midpoint, 0 < d < half a float64
    unit of m, so float64 rounds the sum onto m and a plain rounding of it to float32 breaks
    the tie the wrong way. 24-bit mantissas whose product is 2^47 + k (0 < k < 2^17) make a
    product p = 2^-24 (1 + k 2^-47): c = 1 puts the midpoint 1 + 2^-24 just below the sum, c =
    1 + 2^-22 with -p puts 1 + 3 * 2^-24 just above it; scaled by powers of two. In float32's
    subnormal range p = 2^-150 (1 + k 2^-47) (half its spacing) and c = an even multiple of
    2^-149 (or 2 more with -p) of at least 2^-127, so that k 2^-197 stays below half a float64
    unit of the sum."""
    pairs = []
    for ma in range(2**23 + 1, 2**23 + 200000):
        k = (-(2**47)) % ma
        if 0 < k < 2**17 and k % 2:
            pairs.append((ma, (2**47 + k) // ma))
        if len(pairs) == 12:
            break
    cases = []
    for i, (ma, mb) in enumerate(pairs):
        for sign in (1, -1):
            for scale in (0, -60, 40, -100):  # a stays normal
                cases.append((ma * 2.0 ** (scale - 47), sign * mb * 2.0 ** -24,
                              (1.0 if sign > 0 else 1.0 + 2.0 ** -22) * 2.0 ** scale))
            for cm in (2**22 + 2 * i, 2**23 - 4 - 2 * i):  # subnormal sums, c >= 2^-127
                cases.append((ma * 2.0 ** -100, sign * mb * 2.0 ** -97,
                              (cm if sign > 0 else cm + 2) * 2.0 ** -149))
    return (np.array(v, np.float32) for v in zip(*cases))


def test_twin_fma_is_correctly_rounded_at_float32_midpoints():
    a, b, c = _midpoint_cases()
    want = np.array([_rn32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                     for x, y, z in zip(a, b, c)], np.float32)
    got = R._fma32(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the negative control: rounding the float64 sum to float32 gets every one of them wrong,
    # so each case does land on a midpoint (normal and subnormal)
    twice = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (twice.view(np.uint32) != want.view(np.uint32)).all()


def test_twin_rows_gather_any_ids():
    """Duplicate, unsorted and no ids read the same rows as the whole matrix."""
    rng = np.random.default_rng(4)
    for kind in Q.QUANT_KINDS:
        W = Q.QuantMatrix.from_float(kind, rng.standard_normal((37, 64)).astype(np.float32))
        whole = R.rows(kind, W.packed, 64, 37, np.arange(37))
        ids = np.array([36, 3, 3, 17, 0, 36, 9])
        got = R.rows(kind, W.packed, 64, 37, ids)
        assert np.array_equal(got.view(np.uint32), whole[ids].view(np.uint32))
        assert R.rows(kind, W.packed, 64, 37, ids[:0]).shape == (0, 64)


@pytest.mark.parametrize("kind", Q.QUANT_KINDS)
def test_twin_products_do_not_depend_on_the_column_chunks(kind, monkeypatch):
    rng = np.random.default_rng(3)
    W = Q.QuantMatrix.from_float(kind, rng.standard_normal((37, 96)).astype(np.float32))
    x = rng.standard_normal((5, 96)).astype(np.float32)
    bias = rng.standard_normal(37).astype(np.float32)
    start = rng.standard_normal((5, 37)).astype(np.float32)
    got = []
    for chunk in (R._CHUNK, 80, 8):  # all 37 columns at once, 2 panels, 1 panel (the least)
        monkeypatch.setattr(R, "_CHUNK", chunk)
        out = start.copy()
        R.linear(kind, x, W.packed, 96, 37, bias, out, True)
        got.append(out.view(np.uint32))
    assert all(np.array_equal(got[0], g) for g in got[1:])
