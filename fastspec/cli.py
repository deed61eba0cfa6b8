"""The ``fastspec`` console script.

Each subcommand is a ``_add_<name>(sub)`` function that registers its parser (with
``set_defaults(run=...)``) and a ``_run_<name>(args) -> int`` that returns the exit status.
"""
from __future__ import annotations

import argparse
import sys

import fastspec as fs


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="print the version, backend and build information",
                       description="Print the version, the active backend and the available ones.")
    p.set_defaults(run=_run_info)


def _run_info(args) -> int:
    print(f"fastspec {fs.__version__}; backend {fs.backend()}; "
          f"available {', '.join(fs.available_backends())}")
    return 0


def _add_audit(sub) -> None:
    p = sub.add_parser(
        "audit", help="run the correctness audits (exit status 1 on any failure)",
        description="Run fastspec's correctness audits: cache/block equivalence, causal "
                    "invariance, greedy equality, identity draft, rollback, the exact "
                    "distribution audit and its negative controls. Prints a summary table; "
                    "exit status 1 if any check fails.")
    p.add_argument("--out", metavar="PATH", help="write the full report as JSON to PATH")
    p.add_argument("--quick", action="store_true",
                   help="20 000 instead of 100 000 runs per distribution audit")
    p.add_argument("--samples", type=int, metavar="N",
                   help="runs per distribution audit (overrides --quick)")
    p.add_argument("--check", action="append", metavar="NAME", dest="checks",
                   help="run only this check or group (repeatable)")
    p.add_argument("--backend", dest="audit_backend", choices=("cython", "numpy"),
                   help="kernel backend for this audit (same as the global --backend)")
    p.set_defaults(run=_run_audit)


def _run_audit(args) -> int:
    from fastspec import audit

    if args.audit_backend:
        fs.set_backend(args.audit_backend)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastspec", description="Lossless speculative decoding on the CPU.")
    parser.add_argument("--version", action="version", version=f"fastspec {fs.__version__}")
    parser.add_argument("--backend", choices=("cython", "numpy"),
                        help="kernel backend (default: cython when built)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_info(sub)
    _add_audit(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backend:
        fs.set_backend(args.backend)
    run = getattr(args, "run", None)
    if args.command is None or run is None:
        return _run_info(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
