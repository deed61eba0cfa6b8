"""``fastspec train``: train the embedded models (the ``[train]`` extra: torch)."""
from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``train`` on the subparsers ``sub``; its arguments belong to the trainer."""
    p = sub.add_parser("train", help="train the embedded models ([train] extra: torch)",
                       description="Train the target, draft or DFlash model on the standard "
                                   "library; all arguments after 'train' are passed on "
                                   "(see 'fastspec train --help').",
                       # No option of its own: a prefix no argument starts with makes every
                       # argument, --help and leading options included, one of train_args
                       # (argparse leaves a leading option out of a REMAINDER positional).
                       add_help=False, prefix_chars="\0")
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run :func:`fastspec.training.main` on the passed-on arguments; 2 without torch."""
    try:
        from fastspec import training
    except ImportError as exc:
        print(f"fastspec train needs the [train] extra (torch==2.13.0): {exc}", file=sys.stderr)
        return 2
    return int(training.main(args.train_args) or 0)
