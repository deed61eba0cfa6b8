"""``fastspec demo`` and ``fastspec eval``: speculative decoding of the embedded models on real text.

Both compare every drafter against fastspec's own cached vanilla decoding of the same target,
on held-out standard-library code, and check that greedy outputs are identical.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fastspec.decoding import generate, speculative_generate
from fastspec.drafters import DraftModelDrafter, NgramDrafter
from fastspec.drafters.dflash import DFlashDrafter
from fastspec.formats import json_io
from fastspec.kernels import backend
from fastspec.version import __version__
from fastspec.tools.environment import environment
from fastspec.tools.progress import Progress

__all__ = ["METHODS", "DFLASH_TREE_BUDGET", "DEFAULT_GAMMA", "MethodResult", "default_gamma",
           "run_methods", "summary_stats", "format_table", "demo_main", "eval_main", "is_looping",
           "results_markdown"]

#: Methods in display order; "vanilla" is the baseline. "*_tree" are the tree-proposing
#: variants of the same drafter (verified in one target step per round).
METHODS = ("vanilla", "draft", "ngram", "ngram_tree", "dflash", "dflash_tree")

#: Node budget of the DFlash trees in ``fastspec eval`` / ``demo`` (issue 16's figure).
DFLASH_TREE_BUDGET = 16

#: Draft tokens per round of each drafter, greedy and sampling: the fastest of gamma 1-7 and
#: "adaptive" in a scan of ``fastspec eval --gamma G`` over the 20 held-out prompts (see
#: docs/RESULTS.md and the round costs in docs/PERFORMANCE.md). Verifying a position costs
#: 0.1-0.2 of a decode step here, so gamma stays short where acceptance is low (temperature 1).
#: "adaptive" grows after fully accepted blocks and shrinks after rejections.
DEFAULT_GAMMA = {("draft", False): 3, ("draft", True): 2,
                 ("ngram", False): 7, ("ngram", True): 3,
                 ("dflash", False): 5, ("dflash", True): 3,
                 # Trees: the tree's depth limit (not scanned). A tree spends its budget on
                 # width where the drafter is unsure, so it may reach deeper than a chain.
                 ("ngram_tree", False): 7, ("ngram_tree", True): 3,
                 ("dflash_tree", False): 7, ("dflash_tree", True): 7}


def default_gamma(method: str, temperature: float):
    """Return the gamma :func:`run_methods` uses for ``method`` at ``temperature``."""
    return DEFAULT_GAMMA[(method, temperature > 0)]


@dataclass
class MethodResult:
    """One method's run on one prompt."""

    method: str
    tokens: list[int]
    elapsed_s: float
    tokens_per_s: float
    tau: float = 1.0
    acceptance_rate: float = float("nan")
    target_calls: int = 0
    identical: bool = True
    speedup: float = 1.0
    gamma: int | str | None = None
    extra: dict = field(default_factory=dict)


def _runner(bundle, method: str, gamma, eos_token_id: int | None = None) -> Callable:
    """Return ``run(ids, max_new_tokens, temperature, seed) -> result`` for ``method``."""
    target = bundle.target
    if method == "vanilla":
        return lambda ids, n, t, s: generate(target, ids, n, temperature=t, seed=s,
                                             eos_token_id=eos_token_id)
    if method == "draft":
        make = lambda: DraftModelDrafter(bundle.draft)  # noqa: E731
    elif method == "ngram":
        make = NgramDrafter.tuned
    elif method == "ngram_tree":
        make = lambda: NgramDrafter.tuned(tree=True)  # noqa: E731
    elif method == "dflash":
        # Sampled blocks at temperature > 0 (argmax at 0): on 20 held-out prompts at T=1
        # (phase-7 drafter), tau 2.09 vs 1.87 for argmax proposals at gamma 2 (2.26 vs 2.18
        # at gamma 3).
        make = lambda: DFlashDrafter(bundle.dflash, sample_block=True)  # noqa: E731
    elif method == "dflash_tree":
        # At temperature > 0 siblings sampled without replacement (argmax tree at 0): on 8
        # held-out prompts, 128 tokens, T=1, budget 16, gamma 7: tau 3.20 vs 3.03 for the
        # argmax tree verified one-hot.
        make = lambda: DFlashDrafter(bundle.dflash, sample_block=True,  # noqa: E731
                                        tree_budget=DFLASH_TREE_BUDGET)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    g = gamma
    if method.startswith("dflash") and isinstance(gamma, int):
        g = min(gamma, bundle.dflash.config.block_size - 1)
    return lambda ids, n, t, s: speculative_generate(target, make(), ids, n, gamma=g,
                                                     temperature=t, seed=s,
                                                     eos_token_id=eos_token_id)


def run_methods(bundle, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                methods: Sequence[str] = METHODS, seed: int = 0, gamma: int | None = None,
                repeats: int = 1, eos_token_id: int | None = None) -> list[MethodResult]:
    """Run each method on one prompt (after a short warm-up of each) and compare with vanilla.

    Parameters
    ----------
    bundle : fastspec.models.pretrained.Bundle
        Or any object with a ``target`` (and the ``draft``/``dflash`` the methods need).
    prompt_ids : sequence of int
    max_new_tokens : int
    temperature : float
    methods : sequence of str
        Subset of :data:`METHODS`; vanilla is always run first as the baseline.
    gamma : int or "adaptive", optional
        Draft length per round (default: :func:`default_gamma` of each method).
    repeats : int
        Timed runs per method, in rounds that run every method once; the fastest of each is
        reported (outputs are identical across runs).
    eos_token_id : int, optional
        Stop after this token (a chat model's end of turn).

    Returns
    -------
    list of MethodResult
    """
    order = ["vanilla"] + [m for m in methods if m != "vanilla"]
    runs, best = {}, {}
    for method in order:
        g = gamma or (None if method == "vanilla" else default_gamma(method, temperature))
        runs[method] = (_runner(bundle, method, g, eos_token_id), g)
        runs[method][0](prompt_ids, min(8, max_new_tokens), temperature, seed)  # warm-up
    # the repeats interleave the methods (round after round), so a machine that speeds up or
    # slows down during the run moves every method alike
    for _ in range(repeats):
        for method in order:
            t0 = time.perf_counter()
            res = runs[method][0](prompt_ids, max_new_tokens, temperature, seed)
            dt = time.perf_counter() - t0
            if method not in best or dt < best[method][1]:
                best[method] = (res, dt)
    results = []
    baseline = None
    for method in order:
        g = runs[method][1]
        res, dt = best[method]
        tokens = list(res.tokens)
        stats = getattr(res, "stats", None)
        r = MethodResult(method=method, tokens=tokens, elapsed_s=dt,
                         tokens_per_s=len(tokens) / dt if dt > 0 else float("inf"), gamma=g)
        if method == "vanilla":
            baseline = r
            r.target_calls = len(tokens)
        else:
            r.tau = float(stats.mean_accepted_length)
            r.acceptance_rate = float(stats.acceptance_rate)
            r.target_calls = int(stats.target_calls)
            # tokens/s over vanilla's: the elapsed ratio when both emit the same tokens (an
            # end of turn may stop a sampled run earlier or later than vanilla's)
            r.speedup = r.tokens_per_s / baseline.tokens_per_s if dt > 0 else float("inf")
            r.identical = tokens == baseline.tokens
        results.append(r)
    return results


def format_table(results: Sequence[MethodResult], temperature: float) -> str:
    """Render results as a fixed-width table, one row per method under a header.

    The method column is as wide as the longest name, so every row's columns line up.
    """
    same = "identical"
    width = max([len("method")] + [len(r.method) for r in results])
    head = (f"{'method':<{width}} {'gamma':>8} {'tokens/s':>9} {'speedup':>8} {'tau':>6} "
            f"{'accept':>7} {'target calls':>13} {same:>10}")
    lines = [head, "-" * len(head)]
    for r in results:
        acc = "-" if r.method == "vanilla" else f"{r.acceptance_rate:6.1%}"
        tau = "-" if r.method == "vanilla" else f"{r.tau:6.2f}"
        # Sampled runs consume randomness differently, so only greedy outputs can match.
        if r.method == "vanilla" or temperature > 0:
            ident = "-"
        else:
            ident = "yes" if r.identical else "no"
        gamma = "-" if r.gamma is None else str(r.gamma)
        lines.append(f"{r.method:<{width}} {gamma:>8} {r.tokens_per_s:9.1f} {r.speedup:7.2f}x "
                     f"{tau:>6} {acc:>7} {r.target_calls:13d} {ident:>10}")
    return "\n".join(lines)


def _default_prompt() -> str:
    from fastspec.text.corpus import heldout_prompts

    return heldout_prompts(1)[0]


def _model_bundle(args):
    """``(bundle, tokenizer, prompt text, prompt ids, methods, eos)`` of ``demo --model``: a
    chat model, its first grounded request (or ``--prompt``) as a user turn, the drafters that
    need no draft model."""
    from types import SimpleNamespace

    from fastspec.models.catalog import resolve
    from fastspec.models.pretrained import load_pretrained
    from fastspec.tools.eval_suites import suite

    model, tok = load_pretrained(resolve(args.model),
                                 weight_dtype=getattr(args, "weight_dtype", None) or "auto",
                                 kv_dtype=getattr(args, "kv_dtype", None))
    prompt = args.prompt if args.prompt is not None else suite("grounded")[0].message
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, tokenize=True)
    real = ("vanilla", "ngram", "ngram_tree")
    if args.drafter not in ("all",) + real:
        raise ValueError(f"--model runs {', '.join(real[1:])} (no draft model or DFlash "
                         f"drafter for it), got --drafter {args.drafter}")
    methods = real if args.drafter == "all" else ("vanilla", args.drafter)
    bundle = SimpleNamespace(target=model, draft=None, dflash=None)
    return bundle, tok, prompt, ids, methods, tok.stop_ids[0] if tok.stop_ids else None


def demo_main(args) -> int:
    """Entry point of ``fastspec demo`` (``args`` from the CLI parser)."""
    from fastspec.models import pretrained

    if getattr(args, "model", None):
        try:
            bundle, tok, prompt, ids, methods, eos = _model_bundle(args)
        except (FileNotFoundError, ValueError) as exc:
            print(f"fastspec demo: {exc}", file=sys.stderr)
            return 2
        return _demo(args, bundle, tok, prompt, ids, methods, eos)
    if not pretrained.available():
        print("fastspec demo: the embedded model files are not installed "
              f"(looked in {pretrained.data_dir()})", file=sys.stderr)
        return 1
    bundle = pretrained.load(weight_dtype=getattr(args, "weight_dtype", None),  # auto: float16
                             kv_dtype=getattr(args, "kv_dtype", None))
    tok = bundle.tokenizer
    prompt = args.prompt if args.prompt is not None else _default_prompt()
    ids = tok.encode(prompt, add_bos=True)
    methods = METHODS if args.drafter == "all" else ("vanilla", args.drafter)
    return _demo(args, bundle, tok, prompt, ids, methods, None)


def _demo(args, bundle, tok, prompt: str, ids: list[int], methods: Sequence[str],
          eos: int | None) -> int:
    """Run and print the demo of ``methods`` on ``ids`` (``eos``: a chat model's end of turn)."""
    room = bundle.target.config.max_seq_len - len(ids)
    if room < 1:
        print(f"fastspec demo: the prompt has {len(ids)} tokens; the target holds "
              f"{bundle.target.config.max_seq_len}", file=sys.stderr)
        return 2
    n = min(args.max_new_tokens, room)
    print(f"fastspec {__version__} demo  backend={backend()}  temperature={args.temperature}  "
          f"new tokens={n}", file=sys.stderr)
    results = run_methods(bundle, ids, n, args.temperature, methods, seed=args.seed,
                          repeats=args.repeats, eos_token_id=eos)
    if args.json:
        out = {"prompt": prompt, "backend": backend(), "temperature": args.temperature,
               "max_new_tokens": n, "text": tok.decode(results[0].tokens),
               "results": [dict(asdict(r), tokens=None) for r in results]}
        json_io.dump(out, sys.stdout, indent=2)
        print()
    else:
        print("=" * 72)
        print(prompt, end="")
        print("\033[1m" if sys.stdout.isatty() else "", end="")
        print(tok.decode(results[0].tokens), end="")
        print("\033[0m" if sys.stdout.isatty() else "")
        print("=" * 72)
        print(format_table(results, args.temperature))
    bad = [r.method for r in results if args.temperature == 0 and not r.identical]
    if bad:
        print(f"fastspec demo: greedy outputs differ from vanilla for {bad}", file=sys.stderr)
        return 1
    return 0


def is_looping(tokens: Sequence[int], run: int = 32) -> bool:
    """Return True if ``tokens`` contains ``run`` identical consecutive bytes."""
    count = 1
    for a, b in zip(tokens, tokens[1:]):
        count = count + 1 if a == b else 1
        if count >= run:
            return True
    return False


def summary_stats(values: Sequence[float]) -> dict:
    """``n``, mean, min, median and max of ``values`` (``{"n": 0}`` when empty)."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.fmean(values), "min": min(values),
            "median": statistics.median(values), "max": max(values)}


def eval_main(args) -> int:
    """Entry point of ``fastspec eval``: held-out prompts x temperatures x drafters -> JSON."""
    from fastspec.models import pretrained
    from fastspec.text.corpus import heldout_prompts

    bundle = pretrained.load(kv_dtype=getattr(args, "kv_dtype", None))
    tok = bundle.tokenizer
    prompts = heldout_prompts(args.prompts)
    chosen = getattr(args, "methods", None) or METHODS
    methods = ("vanilla",) + tuple(m for m in METHODS[1:] if m in chosen)
    runs = []
    total = len(prompts) * len(args.temperatures)
    bar = Progress(total, "eval")
    for temperature in args.temperatures:
        for i, prompt in enumerate(prompts):
            ids = tok.encode(prompt, add_bos=True)
            results = run_methods(bundle, ids, args.max_new_tokens, temperature, methods,
                                  seed=args.seed + i, gamma=getattr(args, "gamma", None))
            looping = is_looping(results[0].tokens)
            for r in results:
                runs.append({"prompt": i, "temperature": temperature, "looping": looping,
                             **{k: v for k, v in asdict(r).items() if k != "tokens"}})
            bar.update()
    bar.close()
    summary = {}
    for temperature in args.temperatures:
        for subset in ("non_looping", "looping", "all"):
            for method in methods[1:]:
                sel = [r for r in runs if r["method"] == method and r["temperature"] == temperature
                       and (subset == "all" or r["looping"] == (subset == "looping"))]
                summary[f"T={temperature}/{subset}/{method}"] = {
                    "tau": summary_stats([r["tau"] for r in sel]),
                    "speedup": summary_stats([r["speedup"] for r in sel]),
                    "identical": sum(r["identical"] for r in sel) if temperature == 0 else None,
                    "gamma": sel[0]["gamma"] if sel else None,
                }
    report = {"environment": environment(), "max_new_tokens": args.max_new_tokens,
              "n_prompts": len(prompts), "temperatures": args.temperatures,
              "methods": list(methods), "dflash_tree_budget": DFLASH_TREE_BUDGET,
              "kv_dtype": bundle.target.kv_dtype or bundle.target.config.dtype,
              "summary": summary, "runs": runs}
    Path(args.out).write_text(json_io.dumps(report, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    if args.markdown:
        from fastspec.tools.markdown import keep_dated

        # keep the real-model sections that eval --model wrote, the dated sections, and the
        # previous headline tables when another CPU made them
        path, text = Path(args.markdown), results_markdown(report)
        path.write_text(keep_dated(path.read_text(), text, keep=("Real model",))
                        if path.is_file() else text)
        print(f"wrote {args.markdown}", file=sys.stderr)
    return 0


def results_markdown(report: dict) -> str:
    """Render an eval report as ``docs/RESULTS.md`` (generated, never typed)."""
    env = report["environment"]
    lines = ["# Results: speculative decoding of the embedded models",
             "",
             "Generated by `fastspec eval --markdown docs/RESULTS.md` (the embedded models) and "
             "`fastspec eval --model FILE --suite grounded|open --markdown docs/RESULTS.md` (the "
             "\"Real model\" sections at the end, which the first keeps); do not edit by hand.",
             "",
             f"{report['n_prompts']} held-out prompts (standard-library validation files), "
             f"{report['max_new_tokens']} new tokens, backend `{env['backend']}`, "
             f"Python {env['python']}, NumPy {env['numpy']}, {env['cpus']} CPUs "
             f"({env['machine'] or env['processor']}), CPU: {env.get('cpu') or '?'}; matrix "
             f"products: {env.get('isa', '?')}; {env.get('threads', 1)} thread(s), "
             f"{report.get('kv_dtype', 'float32')} KV cache, run at {env['time_utc']} UTC.",
             "",
             "Speedup is wall-clock tokens/s over fastspec's own cached vanilla decoding of the "
             "same target; tau is tokens emitted per target verification call. A prompt is "
             "*looping* when its vanilla continuation contains a run of 32 identical bytes; the "
             "headline is the non-looping set. `*_tree` rows: the same drafter proposing trees "
             f"(DFlash: budget {report.get('dflash_tree_budget', DFLASH_TREE_BUDGET)} nodes, "
             "siblings sampled without replacement at temperature > 0; n-gram: several "
             "continuations), verified in one target step per round.", ""]
    for temperature in report["temperatures"]:
        for subset in ("non_looping", "looping", "all"):
            methods = report.get("methods", METHODS)[1:]
            rows = [(m, report["summary"][f"T={temperature}/{subset}/{m}"]) for m in methods]
            n = rows[0][1]["tau"].get("n", 0)
            if not n:
                continue
            lines += [f"## temperature {temperature}, {subset.replace('_', '-')} prompts ({n})", "",
                      "| drafter | gamma | tau mean | speedup mean | speedup min | median | max | "
                      "greedy identical |",
                      "|---|---|---|---|---|---|---|---|"]
            for m, s in rows:
                t, sp = s["tau"], s["speedup"]
                ident = "-" if s["identical"] is None else f"{s['identical']}/{n}"
                lines.append(f"| {m} | {s.get('gamma', '-')} | {t['mean']:.2f} | {sp['mean']:.2f}x | "
                             f"{sp['min']:.2f}x | {sp['median']:.2f}x | {sp['max']:.2f}x | {ident} |")
            lines.append("")
    return "\n".join(lines)
