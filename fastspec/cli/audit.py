"""``fastspec audit``: run the correctness audits, print the table, optionally write JSON."""
from __future__ import annotations

import argparse
import sys

from fastspec.cli.args import add_backend_option, add_threads_option
from fastspec.kernels import set_backend

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``audit`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "audit", help="run the correctness audits (exit status 1 on any failure)",
        description="Run fastspec's correctness audits: cache/block equivalence, causal "
                    "invariance, greedy equality, identity draft, rollback, the exact "
                    "distribution audit and its negative controls, the exact laws of tree "
                    "verification (group 'tree': deterministic, independent and "
                    "without-replacement siblings). Prints a summary table; "
                    "exit status 1 if any check fails.")
    p.add_argument("--out", metavar="PATH", help="write the full report as JSON to PATH")
    p.add_argument("--quick", action="store_true",
                   help="20 000 instead of 100 000 runs per distribution audit")
    p.add_argument("--samples", type=int, metavar="N",
                   help="runs per distribution audit (overrides --quick)")
    p.add_argument("--check", action="append", metavar="NAME", dest="checks",
                   help="run only this check or group (repeatable)")
    add_backend_option(p, "audit_backend", "this audit")
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the audits; return 0 if every check passed, 1 if one failed, 2 on bad input."""
    from fastspec import audit  # the audits import the whole stack: only when asked for

    if args.audit_backend:
        set_backend(args.audit_backend)
    if args.samples is not None and args.samples < 100:
        print(f"fastspec audit: --samples must be >= 100, got {args.samples}", file=sys.stderr)
        return 2
    report = audit.run_audit(quick=args.quick, samples=args.samples, names=args.checks,
                             progress=lambda line: print(line, flush=True))
    print(audit.format_report(report))
    if args.out:
        audit.write_report(report, args.out)
        print(f"report written to {args.out}")
    return 0 if report["passed"] else 1
