"""``fastspec seeds``: rerun a founding experiment (000 or 002) and write DIR/results.json."""
from __future__ import annotations

import argparse
import sys

from fastspec.cli.args import add_backend_option, add_threads_option
from fastspec.kernels import set_backend

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``seeds`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "seeds", help="rerun a founding experiment (000 or 002) and write DIR/results.json",
        description="Rerun one of the two experiments fastspec grew out of on fastspec's own "
                    "models, kernels and engine: 000 (the DFlash toy: W_mix drafter, MLP "
                    "target, the exact audit of its acceptance rule) or 002 (the KV-cache and "
                    "speculative-decoding audit). Writes DIR/results.json; exit status 1 if "
                    "a check fails, 2 on bad input (nothing written).")
    p.add_argument("seed", metavar="NAME", help="000 or 002")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="folder for results.json (default: ./seed_NAME)")
    add_backend_option(p, "seeds_backend", "this run")
    p.add_argument("--seed-file", metavar="PATH",
                   help="the seed document: its own NumPy code is timed beside fastspec's")
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the seed; return 0 if its checks passed, 1 if one failed, 2 on bad input."""
    from fastspec import seeds
    from fastspec.seeds.report import check_out_dir, write_report

    if args.seed not in seeds.SEED_NAMES:
        print(f"fastspec seeds: unknown seed {args.seed!r}; known seeds: "
              f"{', '.join(seeds.SEED_NAMES)}", file=sys.stderr)
        return 2
    try:
        # Every bad input is refused here, before any work and before anything is written.
        seed_module = None if args.seed_file is None else seeds.load_seed(args.seed, args.seed_file)
        out = check_out_dir(args.out or f"seed_{args.seed}")
        if args.seeds_backend:
            set_backend(args.seeds_backend)
        report = seeds.run_seed(args.seed, seed_module)
    except seeds.SeedInputError as exc:
        print(f"fastspec seeds: {exc}", file=sys.stderr)
        return 2
    print(seeds.summary(args.seed, report))
    path = write_report(report, out)
    print(f"report written to {path}")
    return 0 if report["passed"] else 1
