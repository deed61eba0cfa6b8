"""``fastspec eval --model FILE --suite grounded|open``: drafters on a real chat model.

Each request of the suite (:mod:`fastspec.tools.eval_suites`) is rendered with the model's chat
template, then decoded by fastspec's cached vanilla loop and by every drafter asked for, one
after the other on the same prompt (so a busy neighbour slows all of them alike), at each
temperature. Reported per drafter and temperature: the median speedup over vanilla, the mean
tau (tokens per target call) and, at temperature 0, whether every output equals vanilla's.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from fastspec.formats import json_io
from fastspec.kernels import backend
from fastspec.models.catalog import resolve
from fastspec.models.pretrained import load_pretrained
from fastspec.tools.demo import run_methods, summary_stats
from fastspec.tools.environment import environment
from fastspec.tools.eval_suites import Request, suite
from fastspec.tools.markdown import supersede_section
from fastspec.tools.progress import Progress
from fastspec.version import __version__

__all__ = ["REAL_METHODS", "evaluate", "summarize", "summary_markdown", "eval_model_main"]

#: Drafters that need nothing but the target (n-gram prompt lookup, chain and tree).
REAL_METHODS = ("ngram", "ngram_tree")


def evaluate(model, tokenizer, requests: Sequence[Request], temperatures: Sequence[float],
             max_new_tokens: int, methods: Sequence[str] = REAL_METHODS, seed: int = 0,
             gamma=None, progress: Progress | None = None) -> list[dict]:
    """Run vanilla and ``methods`` on every request at every temperature.

    Parameters
    ----------
    model : Transformer
    tokenizer : HFTokenizer
        With a chat template; its first stop id ends a reply.
    requests : sequence of Request
    temperatures : sequence of float
    max_new_tokens : int
    methods : sequence of str
        Drafters of :func:`fastspec.tools.demo.run_methods` that need no draft model.
    seed : int
    gamma : int or "adaptive", optional
        Default: each drafter's tuned default.
    progress : Progress, optional

    Returns
    -------
    list of dict
        One row per (temperature, request): its kind, prompt length and the
        :class:`~fastspec.tools.demo.MethodResult` of each method (without token lists).
    """
    bundle = SimpleNamespace(target=model, draft=None, dflash=None)
    eos = tokenizer.stop_ids[0] if tokenizer.stop_ids else None
    rows = []
    for temperature in temperatures:
        for req in requests:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": req.message}],
                                                add_generation_prompt=True, tokenize=True)
            results = run_methods(bundle, ids, max_new_tokens, temperature, methods=methods,
                                  seed=seed, gamma=gamma, eos_token_id=eos)
            rows.append({"temperature": temperature, "kind": req.kind, "source": req.source,
                         "prompt_tokens": len(ids),
                         "methods": {r.method: {k: v for k, v in asdict(r).items()
                                                if k != "tokens"} | {"new_tokens": len(r.tokens)}
                                     for r in results}})
            if progress is not None:
                progress.update()
    return rows


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Per (temperature, method): vanilla tokens/s, median speedup, mean tau, identical."""
    out = []
    for temperature in sorted({r["temperature"] for r in rows}):
        group = [r for r in rows if r["temperature"] == temperature]
        names = list(group[0]["methods"])
        for method in names:
            runs = [r["methods"][method] for r in group]
            speed = summary_stats([m["speedup"] for m in runs])
            out.append({
                "temperature": temperature, "method": method, "requests": len(runs),
                "tokens_per_s": summary_stats([m["tokens_per_s"] for m in runs])["median"],
                "speedup": speed["median"], "speedup_min": speed["min"],
                "speedup_max": speed["max"],
                "tau": summary_stats([m["tau"] for m in runs])["mean"],
                "identical": all(m["identical"] for m in runs) if temperature == 0 else None,
            })
    return out


def summary_markdown(summary: Sequence[dict], title: str) -> str:
    """Render :func:`summarize` output as a markdown table under ``title``."""
    lines = [f"**{title}**", "",
             "| T | method | requests | tok/s (median) | speedup (median, min-max) | tau | "
             "greedy identical |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        ident = "" if s["identical"] is None else ("yes" if s["identical"] else "**no**")
        lines.append(f"| {s['temperature']:g} | {s['method']} | {s['requests']} | "
                     f"{s['tokens_per_s']:.1f} | {s['speedup']:.2f}x "
                     f"({s['speedup_min']:.2f}-{s['speedup_max']:.2f}) | {s['tau']:.2f} | "
                     f"{ident} |")
    return "\n".join(lines) + "\n"


def _section(report: dict, args, file_name: str, text: str) -> tuple[str, str]:
    """The markdown section of one ``eval --model`` run: heading (by the model file's name, so
    a catalog name and a path write the same section) and body."""
    env = report["environment"]
    command = (f"fastspec eval --model {args.model} --suite {args.suite}"
               + f" --temperatures {' '.join(f'{t:g}' for t in args.temperatures)}"
               f" --max-new-tokens {args.max_new_tokens}"
               + (f" --weight-dtype {args.weight_dtype}"
                  if args.weight_dtype not in (None, "auto") else "")
               + (f" --kv-dtype {args.kv_dtype}" if getattr(args, "kv_dtype", None) else "")
               + f" --markdown {args.markdown}")
    body = (f"Generated by `{command}` at {env['time_utc']} UTC on {env['cpu']} ({env['cpus']} "
            f"CPUs, {env['isa']} matrix products, {env.get('threads', 1)} thread(s)).\n\n{text}")
    return f"Real model: {file_name}, suite {args.suite}", body


def eval_model_main(args) -> int:
    """The ``eval --model`` command: load, run the suite, write JSON (and markdown)."""
    path = resolve(args.model)
    t0 = time.perf_counter()
    model, tokenizer = load_pretrained(path, weight_dtype=args.weight_dtype,
                                       kv_dtype=getattr(args, "kv_dtype", None))
    load_s = time.perf_counter() - t0
    requests = suite(args.suite)[:args.prompts]
    methods = args.methods or REAL_METHODS
    progress = Progress(len(requests) * len(args.temperatures), f"eval {args.suite}")
    rows = evaluate(model, tokenizer, requests, args.temperatures, args.max_new_tokens,
                    methods, args.seed, args.gamma, progress)
    progress.close()
    summary = summarize(rows)
    title = (f"{path.name} ({model.config.matrix_dtype} matrices), suite {args.suite}, "
             f"{len(requests)} requests, {args.max_new_tokens} new tokens at most, "
             f"{backend()} backend")
    text = summary_markdown(summary, title)
    print(text)
    report = {"fastspec": __version__, "model": str(path), "suite": args.suite,
              "weight_dtype": model.config.matrix_dtype,
              "kv_dtype": model.kv_dtype or model.config.dtype, "load_s": load_s,
              "environment": environment(), "summary": summary, "rows": rows}
    with open(args.out, "w") as f:
        json_io.dump(report, f, indent=1)
    if args.markdown:  # its own section: the file may hold the embedded models' tables
        # (and another CPU's section of the same name stays, dated)
        md = Path(args.markdown)
        old = md.read_text() if md.is_file() else ""
        md.write_text(supersede_section(old, *_section(report, args, path.name, text)))
    bad = [s for s in summary if s["identical"] is False]
    if bad:
        print(f"greedy outputs differ from vanilla: {[s['method'] for s in bad]}",
              file=sys.stderr)
        return 1
    return 0
