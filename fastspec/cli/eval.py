"""``fastspec eval``: every drafter on held-out prompts, written as JSON (and markdown)."""
from __future__ import annotations

import argparse

from fastspec.cli.args import gamma_or_adaptive, non_negative_float, positive_int

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``eval`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "eval", help="evaluate every drafter on held-out prompts (JSON + markdown)",
        description="Run vanilla and every drafter, chain and tree, on held-out prompts at "
                    "the given temperatures; write per-run results and tau/speedup summaries as JSON, "
                    "and optionally docs/RESULTS.md.")
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the evaluation (:func:`fastspec.tools.demo.eval_main`); return its exit status."""
    from fastspec.tools.demo import eval_main

    return eval_main(args)
