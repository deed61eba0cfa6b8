"""The open issues' "Done when" figures, each measured on this CPU and set against its goal.

Issue 29 (quantized weights: Q8_0, Q4_0, Q4_1 with integer products) and issue 30 (float
verification at the FMA peak, threads on a shared machine) write their goals for an
AVX2-only CPU (an AMD EPYC Zen 3). This script measures every one of them in one run, with
the measurement helpers the benches already use, and prints one table::

    python bench/goals.py [--quick] [--no-peers] [--repeat N] [--json OUT]

(from the source tree, or from a copy of ``bench/`` beside an installed fastspec; about 8
minutes on a 2-vCPU Zen 4, 3 with ``--quick``). Each figure is a ratio measured in one run:
verify_k is the time of a step of k positions over the decode step, timed interleaved
(``_quant.verify_costs``); decode against the stream bound pairs each step with a read of
as many bytes (``_quant.decode_vs_stream``); the demo rows run ``fastspec demo``'s
methods (:func:`fastspec.tools.demo.run_methods`, the fastest of 3 repeats, at the default
thread count); the threads rows are ``test_bench_threads.thread_ratios``; the llama.cpp
rows :func:`fastspec.tools.llama_peers.llama_peers` (skipped without ``llama_cpp``).

Paths: every product runs on the path fastspec picks (``native``) and, where that is not
AVX2, again forced onto AVX2 (``avx2``: the instructions an AVX2-only CPU runs, timed on this
core; attention keeps this CPU's best variant). Only on a CPU without AVX-512 are the avx2
rows the goals' machine; elsewhere they are a proxy, and the table's first line says which.
The AMX goals apply where the native path is ``amx``.

On a shared machine one run can land in a noisy minute (on a 2-vCPU Zen 4 guest the same
2-thread verify_8 read 1.28 and 1.57 steps within the hour). ``--repeat N`` measures every
part N times, one pass after another, and reports each goal's median over the passes, its
verdict, and the range of the passes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import operator
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

OPS = {"<=": operator.le, ">=": operator.ge}


@dataclass
class Row:
    """One goal set against one measurement."""

    issue: int
    goal: str
    path: str
    threads: int
    value: float
    op: str
    bound: float
    values: list[float] = field(default_factory=list)  # every pass's value (``--repeat``)

    @property
    def verdict(self) -> str:
        """``met``, or ``missed by N%`` (how far the value is from the bound, relative)."""
        if self.value != self.value:  # nan: not measured
            return "not measured"
        if OPS[self.op](self.value, self.bound):
            return "met"
        miss = abs(self.value / self.bound - 1)
        return f"missed by {miss:.1%}" if miss < 0.1 else f"missed by {miss:.0%}"


def table(rows: list[Row]) -> list[str]:
    """Markdown lines of ``rows``: issue, goal, path, threads, value, bound and verdict; and
    the range of the passes where a row has more than one."""
    passes = any(len(r.values) > 1 for r in rows)
    out = ["| issue | goal | path | threads | measured | goal | verdict |"
           + (" passes (min-max) |" if passes else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if passes else "")]
    for r in rows:
        line = (f"| {r.issue} | {r.goal} | {r.path} | {r.threads} | {r.value:.2f} | "
                f"{r.op} {r.bound:g} | {r.verdict} |")
        if passes:
            v = [x for x in r.values if not math.isnan(x)]
            line += (f" {len(r.values)} ({min(v):.2f}-{max(v):.2f}) |" if v else
                     f" {len(r.values)} (not measured) |")
        out.append(line)
    return out


def combine(passes: list[list[Row]]) -> list[Row]:
    """One row a goal from one or more passes: the median of its measured values (``nan``
    where no pass measured it), with every pass's value in ``values``; in the order the goals
    first appear."""
    seen: dict[tuple, list[Row]] = {}
    for rows in passes:
        for r in rows:
            seen.setdefault((r.issue, r.goal, r.path, r.threads, r.op, r.bound), []).append(r)
    out = []
    for same in seen.values():
        values = [r.value for r in same]
        measured = [v for v in values if not math.isnan(v)]
        out.append(replace(same[0], value=statistics.median(measured) if measured else math.nan,
                           values=values))
    return out


def machine() -> dict:
    """The CPU, its features and paths, and whether it is the goals' machine (AVX2, no
    AVX-512)."""
    import fastspec as fs
    from fastspec.tools.environment import cpu_name

    info = fs.kernels.isa_info()
    feats = info["features"]
    return {"cpu": cpu_name(), "features": [k for k, v in feats.items() if v],
            "paths": list(info["available"]), "native": info["selected"],
            "goal_machine": bool(feats.get("avx2")) and not feats.get("avx512f"),
            "threads_default": fs.get_threads(), "load_average": os.getloadavg()[0]}


@contextlib.contextmanager
def on_path(name: str):
    """Run the products on ``name`` (``native``: the automatic choice) and the compiled
    backend; restore the previous path and thread count."""
    import fastspec as fs

    prev, threads = fs.kernels.isa_info()["forced"], fs.get_threads()
    with fs.using_backend("cython"):
        fs.kernels.set_isa(None if name == "native" else name)
        try:
            yield
        finally:
            fs.kernels.set_isa(prev)
            fs.set_threads(threads)


def paths() -> list[str]:
    """``native``, and ``avx2`` where the native path is another."""
    import fastspec as fs

    info = fs.kernels.isa_info()
    return ["native"] + (["avx2"] if "avx2" in info["available"] and info["selected"] != "avx2"
                         else [])


def quantized(rows: list[Row], quick: bool) -> None:
    """Issue 29: decode against the stream bound and verify_8 / verify_16 of the real SmolLM2
    file (q8_0: converted at load; q4_1: its own blocks), and the Qwen3-0.6B shape's decode."""
    import fastspec as fs
    from _quant import QWEN3_06B, decode_vs_stream, random_quantized, verify_costs

    try:
        path = fs.models.find("smollm2")
    except (KeyError, FileNotFoundError) as exc:
        print(f"goals: the SmolLM2 file is missing ({exc}); skipping issue 29's products",
              file=sys.stderr)
        return
    verify_goals = {("q8_0", 1): (2.0, 3.5), ("q4_1", 1): (3.0, 5.5),
                    ("q8_0", 2): (1.3, 2.0), ("q4_1", 2): (1.8, 3.0)}
    for kind in ("q8_0", "q4_1"):
        model = fs.Transformer.load(path, weight_dtype=kind)
        for p in paths():
            with on_path(p):
                name = fs.kernels.isa_info()["selected"]
                for threads in (1, 2):
                    fs.set_threads(threads)
                    if threads == 1:
                        d = decode_vs_stream(model, pairs=6 if quick else 12)
                        rows.append(Row(29, f"real {kind} decode / stream bound", name, 1,
                                        d["fraction_of_stream_bound"], ">=", 0.9))
                    v = verify_costs(model, ks=(1, 8, 16), rounds=3 if quick else 7)
                    for k, bound in zip((8, 16), verify_goals[kind, threads]):
                        rows.append(Row(29, f"real {kind} verify_{k} (steps)", name, threads,
                                        v[f"verify_{k}_steps"], "<=", bound))
                    if name == "amx" and kind == "q8_0" and threads == 1:
                        rows.append(Row(29, "AMX: real q8_0 verify_16 (steps)", name, 1,
                                        v["verify_16_steps"], "<=", 1.2))
        del model
    if quick:
        return
    for kind in ("q8_0", "q4_1"):
        model = random_quantized(QWEN3_06B, kind)
        for p in paths():
            with on_path(p):
                fs.set_threads(1)
                d = decode_vs_stream(model)
                rows.append(Row(29, f"Qwen3-0.6B shape {kind} decode / stream bound",
                                fs.kernels.isa_info()["selected"], 1,
                                d["fraction_of_stream_bound"], ">=", 0.9))
        del model


def floats(rows: list[Row], quick: bool) -> None:
    """Issue 30: verify_8 / verify_16 of the SmolLM-135M shape (bf16, random) at 1 and 2
    threads and of the embedded target (float16, context 300) at 1 thread."""
    import fastspec as fs
    from _quant import verify_costs
    from fastspec.tools.rounds import smollm_config

    goals = {1: (1.8, 3.5), 2: (1.3, 2.0)}
    model = fs.Transformer.random(smollm_config(weight_dtype="bfloat16"), seed=0)
    for p in paths():
        with on_path(p):
            name = fs.kernels.isa_info()["selected"]
            for threads in (1, 2):
                fs.set_threads(threads)
                v = verify_costs(model, ks=(1, 8, 16), rounds=3 if quick else 7)
                for k, bound in zip((8, 16), goals[threads]):
                    rows.append(Row(30, f"SmolLM-135M shape bf16 verify_{k} (steps)", name,
                                    threads, v[f"verify_{k}_steps"], "<=", bound))
                if name == "amx" and threads == 1:
                    rows.append(Row(30, "AMX: SmolLM-135M shape bf16 verify_16 (steps)", name,
                                    1, v["verify_16_steps"], "<=", 1.3))
    del model
    if not fs.pretrained.available():
        return
    target = fs.pretrained.load().target
    for p in paths():
        with on_path(p):
            name = fs.kernels.isa_info()["selected"]
            fs.set_threads(1)
            v = verify_costs(target, ks=(1, 8, 16), context=300, rounds=5 if quick else 15)
            for k, bound in ((8, 2.5), (16, 4.0)):
                rows.append(Row(30, f"embedded target f16 verify_{k} (steps)", name, 1,
                                v[f"verify_{k}_steps"], "<=", bound))
            if name == "amx":
                rows.append(Row(30, "AMX: embedded target verify_16 (steps)", name, 1,
                                v["verify_16_steps"], "<=", 1.6))


def demo(rows: list[Row], quick: bool) -> None:
    """Issues 30 (float16) and 29 (q8_0): ``fastspec demo``'s greedy speedups of the n-gram
    drafter and DFlash over vanilla, at the default thread count."""
    import fastspec as fs
    from fastspec.text.corpus import heldout_prompts
    from fastspec.tools.demo import run_methods

    if not fs.pretrained.available():
        return
    goals = {"float16": (30, {"ngram": 1.3, "dflash": 1.3}),
             "q8_0": (29, {"ngram": 1.5, "dflash": 1.8})}
    threads = fs.get_threads()
    for dtype, (issue, bounds) in goals.items():
        bundle = fs.pretrained.load(weight_dtype=dtype)
        ids = bundle.tokenizer.encode(heldout_prompts(1)[0], add_bos=True)  # demo's prompt
        for p in paths():
            with on_path(p):
                res = run_methods(bundle, ids, 256, 0.0, ("vanilla",) + tuple(bounds),
                                  repeats=1 if quick else 3)
                for r in res[1:]:
                    if not r.identical:
                        raise AssertionError(f"demo {r.method} ({dtype}, {p}) differs from "
                                             "vanilla at greedy")
                    rows.append(Row(issue, f"demo {dtype} {r.method} speedup",
                                    fs.kernels.isa_info()["selected"], threads, r.speedup,
                                    ">=", bounds[r.method]))


def threads_rows(rows: list[Row], quick: bool) -> None:
    """Issue 30: 2 threads over 1 for the SmolLM-135M shape's decode step (bf16), idle and
    beside a busy loop on the first CPU."""
    import fastspec as fs
    from fastspec.tools.rounds import smollm_config
    from test_bench_threads import CONTEXT, thread_ratios

    if len(os.sched_getaffinity(0)) < 2:
        print("goals: one CPU: no thread rows", file=sys.stderr)
        return
    model = fs.Transformer.random(smollm_config(max_seq_len=CONTEXT + 8,
                                                weight_dtype="bfloat16"), seed=0)
    for p in paths():
        with on_path(p):
            t = thread_ratios(model, rounds=3 if quick else 7)
            name = fs.kernels.isa_info()["selected"]
            rows.append(Row(30, "decode 2 threads / 1, beside a busy loop", name, 2,
                            t["busy_2_over_1"], "<=", 1.05))
            rows.append(Row(30, "decode 2 threads / 1, idle", name, 2, t["idle_2_over_1"],
                            "<=", 0.77))


def peers(rows: list[Row], quick: bool) -> None:
    """Issue 29: fastspec against llama.cpp on the real file, at 1 and 2 threads."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("goals: llama_cpp is not installed ([peers] extra): no llama.cpp rows",
              file=sys.stderr)
        return
    from fastspec.tools.llama_peers import goal_ratios, llama_peers

    for threads in (1, 2):
        report = llama_peers(threads=threads, requests=2 if quick else 4)
        for name, value, goal in goal_ratios(report):
            op, bound = goal.split()
            rows.append(Row(29, f"real q4_1 {name}", "native", threads, value, op,
                            float(bound)))


PARTS = {"quantized": quantized, "floats": floats, "demo": demo, "threads": threads_rows,
         "peers": peers}


def main(argv: list[str] | None = None) -> int:
    """Measure the goals and print the table; return 0 (a missed goal is a finding, not an
    error)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer rounds, no Qwen3-0.6B shape, 2 llama.cpp requests")
    ap.add_argument("--no-peers", action="store_true", help="skip llama.cpp")
    ap.add_argument("--only", nargs="+", choices=sorted(PARTS), metavar="PART",
                    help=f"measure only these parts ({', '.join(sorted(PARTS))})")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="measure every part N times (one pass after another) and report "
                         "each goal's median and the range of the passes (default 1)")
    ap.add_argument("--json", metavar="OUT", help="write the machine and the rows as JSON")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, not {args.repeat}")
    import fastspec as fs

    if "cython" not in fs.available_backends():
        print("goals: needs the compiled backend", file=sys.stderr)
        return 2
    m = machine()
    which = ("an AVX2-only CPU: the goals' machine" if m["goal_machine"] else
             "not an AVX2-only CPU: the avx2 rows are a proxy (AVX2 instructions on this core)")
    print(f"CPU: {m['cpu']}; paths {', '.join(m['paths'])} (native {m['native']}); {which}; "
          f"load average {m['load_average']:.1f}", file=sys.stderr)
    passes: list[list[Row]] = []
    t0 = time.perf_counter()
    for n in range(args.repeat):
        passes.append([])
        for name, part in PARTS.items():
            if (args.only and name not in args.only) or (name == "peers" and args.no_peers):
                continue
            tag = f"pass {n + 1} of {args.repeat}, " if args.repeat > 1 else ""
            print(f"goals: {name} ({tag}{time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            part(passes[-1], args.quick)
    rows = combine(passes)
    m["elapsed_s"] = time.perf_counter() - t0
    m["passes"] = args.repeat
    print("\n".join(table(rows)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": m, "rows": [asdict(r) | {"verdict": r.verdict} for r in rows]},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
