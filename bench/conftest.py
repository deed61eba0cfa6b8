"""pytest-benchmark suites. Run: pytest bench/ --benchmark-only [--benchmark-json out.json].

The suites time one thread unless ``FASTSPEC_THREADS`` says otherwise (the library's default
is every CPU of the process): their ratios and the issues' 1-thread goals compare kernels, not
thread counts; bench/test_bench_threads.py sets its own counts."""
import os

import pytest

import fastspec as fs


@pytest.fixture(autouse=True, scope="session")
def _one_thread_unless_asked():
    if not os.environ.get("FASTSPEC_THREADS", "").strip():
        fs.set_threads(1)
    yield
