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
    unit of m, so float64 rounds the sum onto m. 24-bit mantissas whose product is 2^47 + k
    (0 < k < 2^17) make a * b = 2^-24 (1 + k 2^-47); c = 1 puts 1 + 2^-24 just below the sum,
    c = 1 + 2^-22 with a negative product puts 1 + 3 * 2^-24 just above it; then all scaled
    by powers of two down to float32's subnormal range."""
    pairs = []
    for ma in range(2**23 + 1, 2**23 + 200000):
        k = (-(2**47)) % ma
        if 0 < k < 2**17 and k % 2:
            pairs.append((ma, (2**47 + k) // ma))
        if len(pairs) == 12:
            break
    cases = []
    for ma, mb in pairs:
        for scale in (0, -60, 40, -126, -140):
            for sign in (1, -1):
                cases.append((ma * 2.0 ** (scale - 47), sign * mb * 2.0 ** -24,
                              (1.0 if sign > 0 else 1.0 + 2.0 ** -22) * 2.0 ** scale))
    return (np.array(v, np.float32) for v in zip(*cases))


def test_twin_fma_is_correctly_rounded_at_float32_midpoints():
    a, b, c = _midpoint_cases()
    want = np.array([_rn32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                     for x, y, z in zip(a, b, c)], np.float32)
    got = R._fma32(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the negative control: rounding the float64 sum to float32 gets many of them wrong, so
    # the cases do land on midpoints
    twice = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (twice.view(np.uint32) != want.view(np.uint32)).sum() >= len(want) // 4


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
