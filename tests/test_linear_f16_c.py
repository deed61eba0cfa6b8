"""Compile and run tests/c/linear_f16.c: f32h == f32 bit for bit in every kernel variant.

The Python tests exercise only the variant this CPU dispatches to; this one runs the baseline,
AVX2+F16C and AVX-512F+F16C builds side by side (those the CPU supports), and the scalar build
of compilers without GNU C extensions. Needs the source tree
(csrc/) and a C compiler; skipped otherwise (e.g. when testing an installed wheel).
"""
import pytest

from _helpers import needs_c_harness, run_c_harness


@pytest.mark.parametrize("flags", [[], ["-DFS_TEST_PORTABLE"]], ids=["gnu-variants", "portable"])
@needs_c_harness
def test_float16_kernels_bit_identical(tmp_path, flags):
    # about 10 s for the six GNU C variants of the unrolled tiles, 1 s for the portable build
    run_c_harness("linear_f16", flags, tmp_path)
