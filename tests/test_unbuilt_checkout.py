"""A test run over a package whose compiled modules are missing stops and says how to build
them, instead of testing the NumPy twin alone; FASTSPEC_BACKEND=numpy still runs it on purpose."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fastspec as fs

TESTS = Path(__file__).resolve().parent


def _pure_copy(tmp_path: Path) -> Path:
    """The package's Python files only (as in a checkout before any build), with this suite's
    conftest and helpers and one trivial test."""
    src = Path(fs.__file__).resolve().parent
    shutil.copytree(src, tmp_path / "fastspec", ignore=shutil.ignore_patterns(
        "*.so", "*.pyd", "*.c", "__pycache__", "data"))
    (tmp_path / "fastspec" / "data").mkdir()
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("conftest.py", "_helpers.py"):
        shutil.copy(TESTS / name, suite / name)
    (suite / "test_one.py").write_text("import fastspec\n\ndef test_one():\n"
                                       "    assert fastspec.backend() == 'numpy'\n")
    return suite


def _run(suite: Path, backend: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FASTSPEC_BACKEND"}
    env["PYTHONPATH"] = str(suite.parent)
    if backend:
        env["FASTSPEC_BACKEND"] = backend
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(suite)], cwd=suite, env=env, capture_output=True, text=True,
                          timeout=300)


def test_an_unbuilt_package_stops_the_run_with_how_to_build(tmp_path):
    suite = _pure_copy(tmp_path)
    done = _run(suite, None)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "not built" in out and "build_ext --inplace" in out and "FASTSPEC_BACKEND=numpy" in out
    assert "1 passed" not in out


def test_the_numpy_twin_still_runs_on_purpose(tmp_path):
    suite = _pure_copy(tmp_path)
    done = _run(suite, "numpy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
