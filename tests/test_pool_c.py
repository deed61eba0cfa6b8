"""Compile and run tests/c/pool.c: the C core's thread pool (csrc/fs_pool.c) runs every chunk of
every job exactly once, at any thread count (more than the CPUs too), for nchunks 0, 1 and
huge, many tiny jobs, two submitters at once, a nested call and after fork(); both with the
default spin and with FASTSPEC_SPIN_US=0, and in the portable build (condition variables
instead of futexes). Needs the source tree (csrc/) and a C compiler; skipped otherwise.
"""
import pytest

from _helpers import needs_c_harness, run_c_harness


@pytest.mark.parametrize("flags", [[], ["-DFS_TEST_PORTABLE"]], ids=["futex", "portable"])
@needs_c_harness
def test_pool_runs_every_chunk_once(tmp_path, flags):
    run_c_harness("pool", flags, tmp_path)
