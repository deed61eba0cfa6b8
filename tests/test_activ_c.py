"""Compile and run tests/c/activ.c: the C core's float activations (fs_expf_nonpos and
fs_silu_f in fs_common.h, the SwiGLU of float models) stay within 3e-7 relative of exp and 4 ulp
of silu computed in double, and give 0 below -87. Needs the source tree (csrc/) and a C
compiler; skipped otherwise.
"""
from _helpers import needs_c_harness, run_c_harness


@needs_c_harness
def test_float_activations(tmp_path):
    run_c_harness("activ", [], tmp_path)
