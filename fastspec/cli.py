"""The ``fastspec`` console script."""
from __future__ import annotations

import argparse
import sys

import fastspec as fs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastspec", description="Lossless speculative decoding on the CPU.")
    parser.add_argument("--version", action="version", version=f"fastspec {fs.__version__}")
    parser.add_argument("--backend", choices=("cython", "numpy"),
                        help="kernel backend (default: cython when built)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="print the version, backend and build information")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backend:
        fs.set_backend(args.backend)
    if args.command in (None, "info"):
        print(f"fastspec {fs.__version__}; backend {fs.backend()}; "
              f"available {', '.join(fs.available_backends())}")
        return 0
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
