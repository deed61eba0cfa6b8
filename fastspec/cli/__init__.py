"""The ``fastspec`` console script: :func:`build_parser` and :func:`main`.

Each command is a module of this package (``info``, ``audit``, ``demo``, ``generate``,
``eval``, ``bench``, ``quantize``, ``train``, ``seeds``) with ``add_parser(sub)``, which registers its parser
with ``set_defaults(run=run)``, and ``run(args) -> int``, which returns the exit status.
Shared argument types live in :mod:`fastspec.cli.args`; every command has ``--threads``
(:func:`fastspec.cli.args.add_threads_option`), applied here before the command runs. A command module imports its engine
(audits, tools, seeds, training) when it runs, so ``fastspec --help`` stays quick. This is the
top layer: it may import every other package of fastspec; nothing imports it.
"""
from __future__ import annotations

import argparse
import sys

from fastspec.cli import audit, bench, chat, demo, generate, info, quantize, seeds, train
from fastspec.cli.args import apply_threads_option
from fastspec.cli import eval as eval_command  # the module, not the builtin
from fastspec.kernels import backend, using_backend
from fastspec.version import __version__

__all__ = ["build_parser", "main"]

#: The command modules, in the order ``fastspec --help`` lists them.
COMMANDS = (info, audit, demo, generate, chat, eval_command, bench, quantize, train, seeds)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``fastspec`` with every command's subparser."""
    parser = argparse.ArgumentParser(
        prog="fastspec", description="Lossless speculative decoding on the CPU.")
    parser.add_argument("--version", action="version", version=f"fastspec {__version__}")
    parser.add_argument("--backend", choices=("cython", "numpy"),
                        help="kernel backend (default: cython when built)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fastspec`` with ``argv`` (default: the process's); return the exit status.

    Without a command it runs ``info``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_threads_option(args)  # before any work
    # a caller's backend survives main(), whatever --backend or a command selects
    with using_backend(args.backend or backend()):
        run = getattr(args, "run", None)
        if args.command is None or run is None:
            return info.run(args)
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
