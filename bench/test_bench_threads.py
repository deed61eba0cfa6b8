"""Two threads against one: a decode step at the SmolLM-135M shape (bf16 weights, random, 30
layers) on an idle machine and beside a busy loop (another process spinning on the first CPU of
this process), with the C core's thread pool (csrc/fs_pool.c)::

    OPENBLAS_NUM_THREADS=1 pytest bench/test_bench_threads.py --benchmark-only -s

Everything is measured in one run and interleaved: each round times ``STEPS`` decode steps at 1
and at 2 threads (in alternating order), idle, then again with the busy loop running; the
figures are medians over the rounds of those per-step times and of the per-round ratios
(2 threads / 1 thread), so a neighbour's load drifts into both sides of each ratio alike.
Goals (issue 30, on an AVX2 CPU): beside a busy loop, 2 threads no more than 5% slower than 1
(``busy_2_over_1 <= 1.05``); idle, at least 1.3x faster (``idle_2_over_1 <= 0.77``). A 2-vCPU
VM whose vCPUs share one core's memory path cannot show the idle speedup; the busy ratio is
what the pool's spin-then-sleep waits and dynamic chunks are for. ``isa`` runs the products on
the automatic path and on AVX2 (the target machine's).

Measured on the shared 2-vCPU Xeon VM (load average 5-20 from other users; 2026-12-02): idle
``idle_2_over_1`` 1.10-1.18, ``busy_2_over_1`` 0.84-0.90 when the load was moderate and
0.22-0.29 when it was heavy (2 threads beside the busy loop then ran at the quiet machine's
1-thread speed, ~20 ms, with OpenMP's passive wait as well: the VM's scheduling, not the
pool). The OpenMP build this pool replaced, with its default wait: 8-29x slower at 2 threads.
On the same VM quiet (load average 1.2, 09:07 UTC, products split from 262144 weights): idle
``idle_2_over_1`` 0.71 (amx path) and 0.72 (avx2), ``busy_2_over_1`` 0.91 and 0.98.
On an AMD EPYC Zen 5 KVM guest (2 vCPUs, 2026-12-03, builds alternated, two runs each):
before the wake gap of csrc/fs_pool.c ``busy_2_over_1`` 1.17-1.28 and ``idle_2_over_1``
0.69-0.79; after it 1.03-1.09 and 0.73-0.81.

``test_prompt_after_idle_two_threads_vs_one``: the embedded float16 target's 256-token demo
prompt, each timed after ``IDLE_S`` of sleep (a user's prompt comes after idle), at 1 and 2
threads alternately, and at 2 threads right after another prompt; ``after_idle_2_over_1`` is
the median of the per-round ratios. Before the pool kept its workers awake through a prompt
(fs_pool_keep_awake) a 2-vCPU KVM guest gave the second thread nothing after idle (the woken
worker landed on the caller's CPU and slept between the prompt's jobs).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import fastspec as fs
from fastspec.tools.rounds import smollm_config

CONTEXT = 64
ROUNDS = 7
STEPS = 8
IDLE_S = 0.1

pytestmark = pytest.mark.skipif("cython" not in fs.available_backends(),
                                reason="needs the compiled backend")


@contextlib.contextmanager
def busy_loop():
    """Run ``python -c 'while True: pass'`` pinned to the first CPU of this process."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    pin = (lambda: os.sched_setaffinity(0, {cpus[0]})) if hasattr(os, "sched_setaffinity") \
        else None
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)
    try:
        time.sleep(0.05)  # let it start spinning
        yield
    finally:
        proc.kill()
        proc.wait()


def decode_steps(model, context: int = CONTEXT):
    """Return ``step(k)``: the mean seconds of k decode steps at ``context`` positions."""
    cache = model.new_cache(context + 2)
    model.forward(np.arange(context) % 200, cache)
    tok = np.array([7])
    out = np.empty((1, model.config.vocab_size), np.float32)

    def step(k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            model.step(tok, cache, out=out)
            cache.crop(context)
        return (time.perf_counter() - t0) / k

    return step


def thread_ratios(model, rounds: int = ROUNDS, steps: int = STEPS, busy: bool = True) -> dict:
    """Interleaved decode-step times at 1 and 2 threads, idle and (``busy``) beside a busy
    loop; medians in ms and the medians of the per-round ratios (2 threads / 1 thread)."""
    step = decode_steps(model)
    before = fs.get_threads()
    times: dict[str, list[float]] = {}
    try:
        for t in (1, 2):
            fs.set_threads(t)
            step(2)  # warm-up: the workers start, the caches fill
        for r in range(rounds):
            for load in ("idle", "busy") if busy else ("idle",):
                with busy_loop() if load == "busy" else contextlib.nullcontext():
                    for t in ((1, 2) if r % 2 == 0 else (2, 1)):
                        fs.set_threads(t)
                        step(1)
                        times.setdefault(f"{load}_{t}", []).append(step(steps))
    finally:
        fs.set_threads(before)
    out = {f"{k}_ms": 1e3 * float(np.median(v)) for k, v in times.items()}
    for load in ("idle", "busy") if busy else ("idle",):
        pairs = np.array(times[f"{load}_2"]) / np.array(times[f"{load}_1"])
        out[f"{load}_2_over_1"] = float(np.median(pairs))
    return out


@pytest.fixture(scope="module")
def smollm_bf16():
    return fs.Transformer.random(smollm_config(max_seq_len=CONTEXT + 8,
                                               weight_dtype="bfloat16"), seed=0)


@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_decode_two_threads_vs_one(benchmark, smollm_bf16, isa):
    benchmark.group = "threads-decode-smollm-bf16"
    path = None if isa == "auto" else isa
    if path is not None and path not in fs.kernels.isa_info()["available"]:
        path = None  # this CPU lacks it: the automatic path, named in the results
    before = fs.get_threads()
    with fs.using_backend("cython"):
        fs.kernels.set_isa(path)
        try:
            quick = dict(rounds=1, steps=1) if benchmark.disabled else {}
            res = thread_ratios(smollm_bf16, **quick)
            res["path"] = fs.kernels.isa_info()["selected"]
            res["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else os.cpu_count()
            res["goal"] = "busy_2_over_1 <= 1.05; idle_2_over_1 <= 0.77 (AVX2 CPU)"
            benchmark.extra_info.update(res)
            print("\n" + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in res.items()))
            step = decode_steps(smollm_bf16)
            fs.set_threads(2)
            benchmark.pedantic(lambda: step(1), rounds=5, iterations=5)
        finally:
            fs.kernels.set_isa(None)
            fs.set_threads(before)


def prompt_after_idle(model, ids, rounds: int = ROUNDS, idle_s: float = IDLE_S) -> dict:
    """Per round, in alternating order: the prompt at 1 and at 2 threads, each after ``idle_s``
    of sleep; then at 2 threads right after another prompt. Medians in ms and of the per-round
    ratios."""
    before = fs.get_threads()
    times: dict[str, list[float]] = {}

    def prompt() -> float:
        cache = model.new_cache(len(ids) + 8)
        t0 = time.perf_counter()
        model.step(ids, cache)
        return time.perf_counter() - t0

    try:
        for t in (1, 2):
            fs.set_threads(t)
            prompt()  # warm-up: the workers start, the caches fill
        for r in range(rounds):
            for t in ((1, 2) if r % 2 == 0 else (2, 1)):
                fs.set_threads(t)
                time.sleep(idle_s)
                times.setdefault(f"after_idle_{t}", []).append(prompt())
            fs.set_threads(2)
            prompt()
            times.setdefault("back_to_back_2", []).append(prompt())
    finally:
        fs.set_threads(before)
    out = {f"{k}_ms": 1e3 * float(np.median(v)) for k, v in times.items()}
    a1, a2, b2 = (np.array(times[k]) for k in ("after_idle_1", "after_idle_2", "back_to_back_2"))
    out["after_idle_2_over_1"] = float(np.median(a2 / a1))
    out["after_idle_over_back_to_back_2"] = float(np.median(a2 / b2))
    return out


def test_prompt_after_idle_two_threads_vs_one(benchmark):
    benchmark.group = "threads-prompt-after-idle-embedded-f16"
    from fastspec.models import pretrained
    from fastspec.tools.demo import _default_prompt
    bundle = pretrained.load(weight_dtype="float16")
    ids = np.array(bundle.tokenizer.encode(_default_prompt(), add_bos=True))
    before = fs.get_threads()
    with fs.using_backend("cython"):
        try:
            quick = dict(rounds=1) if benchmark.disabled else {}
            res = prompt_after_idle(bundle.target, ids, **quick)
            res["rows"] = int(len(ids))
            res["path"] = fs.kernels.isa_info()["selected"]
            benchmark.extra_info.update(res)
            print("\n" + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in res.items()))
            fs.set_threads(2)
            benchmark.pedantic(lambda: bundle.target.step(ids, bundle.target.new_cache(
                len(ids) + 8)), rounds=3, iterations=1)
        finally:
            fs.set_threads(before)
