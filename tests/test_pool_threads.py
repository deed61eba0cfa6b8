"""The thread count (``fs.set_threads``, ``FASTSPEC_THREADS``, ``--threads``) and the C pool
behind it: the outputs are the same bits at every thread count (more threads than CPUs too),
for every float product (float32, float16, bfloat16 on each path, float64) at odd shapes, in a
forward and in greedy generation; bad values are refused with errors that name them."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import fastspec as fs
from fastspec.cli import build_parser, main

from _helpers import needs_cython

THREADS = (1, 2, 3, 5)


@pytest.fixture
def keep_threads():
    """Restore the thread count the test found."""
    n = fs.get_threads()
    yield
    fs.set_threads(n)


def _model(dtype="float32", weight_dtype=None, seed=0):
    # the FFN (192 x 1400: 29 panels, a remainder) and the head (192 x 2999) are split between
    # threads (FS_LIN_PARALLEL_MIN weights or more); the attention products (192 x 192,
    # 192 x 64) stay on the caller at one row and are split in blocks of enough rows
    # (FS_LIN_PARALLEL_MACS multiply-adds)
    cfg = fs.ModelConfig(vocab_size=2999, dim=192, n_layers=2, n_heads=6, n_kv_heads=2,
                         ffn_dim=1400, max_seq_len=64, dtype=dtype, weight_dtype=weight_dtype)
    return fs.Transformer.random(cfg, seed=seed)


def _paths_for(weight_dtype):
    """The compiled paths worth a run: every path with kernels on this CPU for bf16 (amx and
    avx512bf16 run only their bf16 products in the tile layout), the automatic one otherwise."""
    if weight_dtype != "bfloat16":
        return [None]
    info = fs.kernels.isa_info()
    return [p for p in info["kernels"] if p in info["available"] and p != "portable"] or [None]


CASES = [("float32", None), ("float32", "float16"), ("float32", "bfloat16"), ("float64", None)]


@needs_cython
@pytest.mark.parametrize("dtype,weight_dtype", CASES, ids=["f32", "f16", "bf16", "f64"])
def test_forward_is_the_same_bits_at_every_thread_count(keep_threads, dtype, weight_dtype):
    model = _model(dtype, weight_dtype)
    ids = np.arange(1, 24) * 131 % model.config.vocab_size
    for path in _paths_for(weight_dtype):
        fs.kernels.set_isa(path)
        try:
            with fs.using_backend("cython"):
                runs = {}
                for t in THREADS + (2, 1):  # and back: the pool resizes between products
                    fs.set_threads(t)
                    runs.setdefault(t, []).append(
                        (model.forward(ids).logits, model.forward(ids[:16]).logits,
                         model.forward(ids[:1]).logits))
        finally:
            fs.kernels.set_isa(None)
        want = runs[1][0]
        for t, outs in runs.items():
            for got in outs:
                for g, w in zip(got, want):
                    assert np.array_equal(g, w), (path, t)  # the same bits


@needs_cython
@pytest.mark.parametrize("n,n_heads,n_kv,head_dim,length", [
    (16, 9, 3, 64, 300),   # the SmolLM shape's verify_16: 16 x 3 rows per kv head, 8 blocks each
    (1, 9, 3, 64, 300),    # its decode step (above FS_ATTN_PARALLEL_MIN: 3 blocks)
    (7, 4, 2, 32, 611),    # odd: a short last block, another head size
    (3, 4, 4, 16, 40),     # below the threshold: on the caller at every count
])
def test_attention_is_the_same_bits_at_every_thread_count(keep_threads, n, n_heads, n_kv,
                                                          head_dim, length):
    # the float32 kernel hands its blocks (causal) and nodes (tree) to the pool from
    # FS_ATTN_PARALLEL_MIN multiply-adds: every thread count must give the bits of one thread
    from fastspec.kernels import _kernels_attention as ka
    from fastspec.kernels.tree_shape import ancestor_mask

    rng = np.random.default_rng(n * 1000 + length)
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_kv, length + 5, head_dim)).astype(np.float32)
    v = rng.standard_normal((n_kv, length + 5, head_dim)).astype(np.float32)
    mask = ancestor_mask(np.array([-1] + [i // 2 for i in range(n - 1)]))
    runs = {}
    for t in THREADS + (1,):
        fs.set_threads(t)
        runs.setdefault(t, []).append((ka.attention(q, k, v, length),
                                       ka.attention(q, k, v, length, causal=False),
                                       ka.tree_attention(q, k, v, length, mask)))
    want = runs[1][0]
    assert all(np.isfinite(w).all() for w in want)
    for t, outs in runs.items():
        for got in outs:
            for g, w in zip(got, want):
                assert np.array_equal(g, w), t


# A prompt (48 rows) and a 40-node tree after it, at 1, 2 and 3 threads, with the workers kept
# awake (FASTSPEC_SPIN_US: 1 s), so that the layers' row-wise phases (norms, RoPE and the
# cache write, the activation) run on the threads from FS_ROWS_PARALLEL_MIN rows (fs_model.inc).
_PROMPT_SCRIPT = r"""
import sys
import numpy as np
import fastspec as fs
dtype, weight_dtype = sys.argv[1], None if sys.argv[2] == "none" else sys.argv[2]
cfg = fs.ModelConfig(vocab_size=2999, dim=192, n_layers=2, n_heads=6, n_kv_heads=2,
                     ffn_dim=1408, max_seq_len=128, dtype=dtype, weight_dtype=weight_dtype)
model = fs.Transformer.random(cfg, seed=5)
# 16 rows go to the threads from 512 wide (fs_rows_run: chunks of FS_POOL_CHUNK_MIN_COST or more)
wide = fs.Transformer.random(fs.ModelConfig(
    vocab_size=2999, dim=512, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=1024,
    max_seq_len=128, dtype=dtype, weight_dtype=weight_dtype), seed=6)
ids = np.arange(1, 49) * 131 % 2999
nodes = np.arange(7, 47) * 37 % 2999
parents = np.array([-1] + [(i - 1) // 2 for i in range(1, 40)], dtype=np.int32)
runs = {}
with fs.using_backend("cython"):
    for t in (1, 2, 3, 1, 2, 3):
        fs.set_threads(t)
        cache = model.new_cache()
        prompt = model.step(ids, cache).logits
        tree = model.step(nodes, cache, tree_parents=parents).logits
        wcache = wide.new_cache()
        wide.step(ids[:20], wcache)
        block = wide.step(nodes[:16], wcache).logits  # FS_ROWS_PARALLEL_MIN rows
        runs.setdefault(t, []).append((prompt, tree, block))
want = runs[1][0]
assert all(np.isfinite(w).all() for w in want)
same = [np.array_equal(g, w) for outs in runs.values() for got in outs for g, w in zip(got, want)]
sys.exit(0 if all(same) else 1)
"""


@needs_cython
@pytest.mark.parametrize("dtype,weight_dtype", CASES + [("float32", "q8_0")],
                         ids=["f32", "f16", "bf16", "f64", "q8_0"])
def test_prompt_and_tree_rows_are_the_same_bits_at_every_thread_count(dtype, weight_dtype):
    env = {**os.environ, "FASTSPEC_SPIN_US": "1000000"}
    run = subprocess.run([sys.executable, "-c", _PROMPT_SCRIPT, dtype, weight_dtype or "none"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


@needs_cython
@pytest.mark.parametrize("weight_dtype", [None, "bfloat16"], ids=["f32", "bf16"])
def test_greedy_generation_is_the_same_at_every_thread_count(keep_threads, weight_dtype):
    model = _model(weight_dtype=weight_dtype, seed=1)
    prompt = [5, 17, 300, 2000, 9]
    with fs.using_backend("cython"):
        runs = {}
        for t in THREADS:
            fs.set_threads(t)
            runs[t] = fs.generate(model, prompt, 24).tokens
    assert all(r == runs[1] for r in runs.values()), runs


def test_keep_threads_awake_pairs_its_calls_even_on_errors(monkeypatch):
    """The context manager enters and leaves the pool's keeping once each, nested blocks too,
    and leaves it when the block raises."""
    import fastspec.kernels as kernels

    calls = []

    class FakeIsa:
        @staticmethod
        def keep_awake(on):
            calls.append(bool(on))

    monkeypatch.setattr(kernels, "_isa", FakeIsa)
    with pytest.raises(RuntimeError, match="inside"):
        with kernels.keep_threads_awake():
            with kernels.keep_threads_awake():
                assert calls == [True, True]
                raise RuntimeError("inside")
    assert calls == [True, True, False, False]
    monkeypatch.setattr(kernels, "_isa", None)  # no compiled core: a plain block
    with kernels.keep_threads_awake():
        pass
    assert calls == [True, True, False, False]


@needs_cython
@pytest.mark.skipif("FASTSPEC_SPIN_US" in os.environ, reason="the spin is set by hand")
def test_keep_threads_awake_lengthens_the_pools_spin(keep_threads):
    """Inside the block, after a product split between threads, the pool's waiting threads
    spin 1 ms (FS_POOL_KEEP_SPIN_NS) instead of 30 us; before and after it, 30 us. The pool
    stops keeping for a second after a keeping caller lost its CPU (a busy machine): each try
    waits that second out first, and three tries must not all meet one."""
    import time

    isa = fs.kernels._isa
    model = _model(seed=3)
    cache = model.new_cache(16)
    fs.set_threads(2)
    seen = []
    with fs.using_backend("cython"):
        for _ in range(3):
            cache.reset()
            model.step([5, 17], cache)  # the workers started; products split (see _model)
            time.sleep(1.1)
            outside = isa._spin_limit_ns()
            with fs.kernels.keep_threads_awake():
                model.step([9], cache)
                inside = isa._spin_limit_ns()
            seen.append((outside, inside, isa._spin_limit_ns()))
            if seen[-1] == (30_000, 1_000_000, 30_000):
                break
    assert seen[-1] == (30_000, 1_000_000, 30_000), seen


@needs_cython
@pytest.mark.parametrize("gamma", [3, "adaptive"])
def test_speculative_rounds_keep_threads_awake_and_match_vanilla(keep_threads, monkeypatch,
                                                                  gamma):
    """Every target call of a speculative run happens inside keep_threads_awake (so the
    workers spin through the Python between rounds), and the greedy output equals vanilla's
    at every thread count."""
    import contextlib

    import fastspec.kernels as kernels

    depth = [0]
    inside, outside = [0], [0]
    real_keep = kernels.keep_threads_awake

    @contextlib.contextmanager
    def counting_keep():
        depth[0] += 1
        try:
            with real_keep():
                yield
        finally:
            depth[0] -= 1

    model = _model(seed=2)
    real_step = type(model).step

    def counting_step(self, *args, **kwargs):
        (inside if depth[0] else outside)[0] += 1
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(kernels, "keep_threads_awake", counting_keep)
    monkeypatch.setattr(type(model), "step", counting_step)
    prompt = [5, 17, 300, 2000, 9, 5, 17, 300]
    with fs.using_backend("cython"):
        want = fs.generate(model, prompt, 24).tokens
        assert outside[0] > 0 and inside[0] == 0  # vanilla decoding does not keep
        outside[0] = 0
        for t in THREADS:
            fs.set_threads(t)
            got = fs.speculative_generate(model, fs.NgramDrafter(), prompt, 24,
                                          gamma=gamma).tokens
            assert got == want, (t, got, want)
    assert inside[0] > 0 and outside[0] == 0 and depth[0] == 0


def test_threads_from_two_python_threads_at_once(keep_threads):
    """Two Python threads decoding at once share the one pool (one gets the workers, the
    other runs its chunks itself): both get the serial results."""
    import threading

    fs.set_threads(3)
    models = [_model(seed=s) for s in (2, 3)]
    prompt = [1, 2, 3]
    want = [fs.generate(m, prompt, 12).tokens for m in models]
    got = [None, None]

    def run(i):
        got[i] = [fs.generate(models[i], prompt, 12).tokens for _ in range(3)]

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [[w] * 3 for w in want]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
@needs_cython
def test_a_forked_child_runs_its_own_pool(keep_threads):
    fs.set_threads(2)
    model = _model(weight_dtype="float16", seed=4)
    ids = np.arange(9)
    with fs.using_backend("cython"):
        want = model.forward(ids).logits  # the workers run in the parent now
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            try:
                fs.set_threads(3)
                ok = all(np.array_equal(model.forward(ids).logits, want) for _ in range(3))
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert np.array_equal(model.forward(ids).logits, want)


# ---- the count ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,error", [(0, ValueError), (-1, ValueError), (1025, ValueError),
                                       (10**9, ValueError), (True, TypeError),
                                       (2.0, TypeError), ("2", TypeError), (None, TypeError)])
def test_set_threads_refuses_bad_values(keep_threads, bad, error):
    before = fs.get_threads()
    with pytest.raises(error, match=f"n must be .*got {bad!r}" if error is TypeError
                       else f"n must be in \\[1, 1024\\], got {bad}"):
        fs.set_threads(bad)
    assert fs.get_threads() == before


def test_set_threads_takes_integers(keep_threads):
    for n in (1, np.int64(3), 1024, 2):
        fs.set_threads(n)
        assert fs.get_threads() == int(n)
    info = fs.kernels.threads_info()
    assert info["threads"] == 2 and info["set"]


def _import_with(env: dict, code: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=300)


def test_the_default_is_the_cpus_of_the_process():
    env = {"FASTSPEC_THREADS": ""}
    run = _import_with(env, "import fastspec as fs; print(fs.get_threads(), "
                            "fs.kernels.threads_info()['default_from'])")
    assert run.returncode == 0, run.stderr
    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert run.stdout.split()[0] == str(want)


@pytest.mark.parametrize("value", ["3", " 1 "])
def test_fastspec_threads_sets_the_default(value):
    run = _import_with({"FASTSPEC_THREADS": value},
                       "import fastspec as fs; print(fs.get_threads(), "
                       "fs.kernels.threads_info()['default_from'])")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == value.strip()
    assert "FASTSPEC_THREADS" in run.stdout


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "1025"])
def test_a_bad_fastspec_threads_is_a_clear_error(value):
    run = _import_with({"FASTSPEC_THREADS": value}, "import fastspec")
    assert run.returncode != 0
    assert f"FASTSPEC_THREADS must be an integer in [1, 1024], got {value!r}" in run.stderr


# ---- the command line -------------------------------------------------------------------------

def _commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices


@pytest.mark.parametrize("name", [n for n in _commands() if n != "train"])
def test_every_command_takes_threads(name):
    """``--threads`` parses on every command (``train`` passes every argument to its trainer,
    whose own ``--threads`` sets torch's)."""
    opts = {a.dest: a for a in _commands()[name]._actions}
    assert "threads" in opts and opts["threads"].default is None


def test_threads_option_is_applied_before_the_command(keep_threads, capsys):
    assert main(["info", "--threads", "3"]) == 0
    assert fs.get_threads() == 3
    assert "threads: 3 (set by --threads" in capsys.readouterr().out
    for bad in ("0", "1025", "x"):
        with pytest.raises(SystemExit):
            main(["info", "--threads", bad])
        assert "--threads" in capsys.readouterr().err
    assert fs.get_threads() == 3


def test_info_says_how_the_default_was_chosen(capsys):
    run = _import_with({"FASTSPEC_THREADS": "2"},
                       "from fastspec.cli import main; main(['info'])")
    assert run.returncode == 0, run.stderr
    assert "threads: 2 (default: FASTSPEC_THREADS=2)" in run.stdout
