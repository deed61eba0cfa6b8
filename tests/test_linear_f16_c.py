"""Compile and run tests/c/linear_f16.c: f32h == f32 bit for bit in every kernel variant.

The Python tests exercise only the variant this CPU dispatches to; this one runs the baseline,
AVX2+F16C and AVX-512F+F16C builds side by side (those the CPU supports), and the scalar build
of compilers without GNU C extensions. Needs the source tree
(csrc/) and a C compiler; skipped otherwise (e.g. when testing an installed wheel).
"""
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "c" / "linear_f16.c"
CC = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]


@pytest.mark.skipif(not (ROOT / "csrc" / "fs_linear.h").is_file(), reason="no source tree")
@pytest.mark.skipif(shutil.which(CC) is None, reason=f"no C compiler {CC!r}")
@pytest.mark.parametrize("flags", [[], ["-DFS_TEST_PORTABLE"]], ids=["gnu-variants", "portable"])
def test_float16_kernels_bit_identical(tmp_path, flags):
    exe = tmp_path / "linear_f16"
    # the build flags of setup.py (no -march: the variants carry their own targets)
    # (about 10 s for the six GNU C variants of the unrolled tiles, 1 s for the portable build)
    cmd = [CC, "-O3", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi", *flags,
           f"-I{ROOT / 'csrc'}", str(SRC), "-o", str(exe), "-lm"]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failures" in run.stdout
