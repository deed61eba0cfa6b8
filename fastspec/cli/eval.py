"""``fastspec eval``: every drafter on held-out prompts (embedded models), or the n-gram drafters
on a real chat model's request suite (``--model FILE --suite grounded|open``); JSON and markdown."""
from __future__ import annotations

import argparse

from fastspec.cli.args import (MODEL_SOURCES, WEIGHT_DTYPES, add_kv_dtype_option,
                               add_threads_option, gamma_or_adaptive, non_negative_float,
                               positive_int)

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``eval`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "eval", help="evaluate every drafter on held-out prompts (JSON + markdown)",
        description="Run vanilla and every drafter, chain and tree, on held-out prompts at "
                    "the given temperatures; write per-run results and tau/speedup summaries as JSON, "
                    "and optionally docs/RESULTS.md. With --model, run a real chat model (a GGUF "
                    "file or a Hugging Face folder) on a built-in request suite instead: "
                    "vanilla, n-gram and n-gram tree.")
    p.add_argument("--model", metavar="PATH",
                   help=f"a chat model: {MODEL_SOURCES}, with a chat template")
    p.add_argument("--suite", choices=("grounded", "open"), default="grounded",
                   help="with --model: input-grounded edits (12) or open-ended requests (4)")
    p.add_argument("--weight-dtype", choices=("auto",) + WEIGHT_DTYPES, default="auto",
                   help="with --model: storage dtype of the matrices (default auto: the "
                        "file's own, as in fastspec generate)")
    p.add_argument("--prompts", type=positive_int, default=20, help="number of prompts (20)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N")
    p.add_argument("--temperatures", type=non_negative_float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="eval_results.json", help="JSON output path")
    p.add_argument("--markdown", metavar="PATH", help="also write a markdown summary here")
    p.add_argument("--methods", nargs="+", metavar="M",
                   choices=("draft", "ngram", "ngram_tree", "dflash", "dflash_tree"),
                   help="drafters to run (default all: draft ngram ngram_tree dflash "
                        "dflash_tree; *_tree propose trees); vanilla always runs")
    p.add_argument("--gamma", type=gamma_or_adaptive, default=None, metavar="G",
                   help="draft tokens per round for every drafter, an int or 'adaptive' "
                        "(default: each drafter's tuned default, "
                        "fastspec.tools.demo.DEFAULT_GAMMA)")
    add_kv_dtype_option(p)
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the evaluation (:func:`fastspec.tools.demo.eval_main`, or
    :func:`fastspec.tools.real_eval.eval_model_main` with ``--model``); return its exit
    status."""
    if args.model:
        from fastspec.tools.real_eval import REAL_METHODS, eval_model_main

        bad = [m for m in args.methods or () if m not in REAL_METHODS]
        if bad:
            raise SystemExit(f"fastspec eval: --model runs {', '.join(REAL_METHODS)} only "
                             f"(no draft model or DFlash drafter for it), got {bad}")
        return eval_model_main(args)
    from fastspec.tools.demo import eval_main

    return eval_main(args)
