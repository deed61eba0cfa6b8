"""Argument types and options that several ``fastspec`` commands share.

The types are ``type=`` callables of :mod:`argparse`: they return the parsed value or raise
``argparse.ArgumentTypeError``, which argparse prints as a usage error (exit status 2).
"""
from __future__ import annotations

import argparse

from fastspec.kernels import MAX_THREADS, threads_info

__all__ = ["positive_int", "thread_count", "non_negative_float", "gamma_or_adaptive",
           "add_backend_option", "add_sampling_options", "add_threads_option",
           "apply_threads_option", "add_kv_dtype_option", "WEIGHT_DTYPES", "MODEL_SOURCES"]

#: What ``--model`` takes (:func:`fastspec.models.resolve`), for the commands' help.
MODEL_SOURCES = ("a GGUF file, a catalog name (smollm2), a model Ollama pulled (llama3.2:1b or "
                 "ollama:NAME) or a Hugging Face folder")

#: ``--weight-dtype`` choices of the commands that load a model: float storage, or GGUF's
#: quantized blocks (q8_0, q4_0, q4_1; a GGUF file's own blocks of that kind are used as they
#: are, other matrices are converted at load).
WEIGHT_DTYPES = ("float32", "float16", "bfloat16", "q8_0", "q4_0", "q4_1")


def positive_int(text: str) -> int:
    """Parse an int >= 1 (``--max-new-tokens``, ``--repeats``, ...)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def thread_count(text: str) -> int:
    """Parse ``--threads``: an int in [1, MAX_THREADS]."""
    value = positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_THREADS}, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """Parse a float >= 0 (``--temperature``); NaN is refused."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def gamma_or_adaptive(text: str) -> int | str:
    """Parse ``--gamma``: a positive int or ``"adaptive"``."""
    return text if text == "adaptive" else positive_int(text)


def add_backend_option(parser: argparse.ArgumentParser, dest: str, what: str) -> None:
    """Add a command's own ``--backend`` (stored in ``dest``: the global one keeps its name).

    ``what`` names the work it selects the kernels for ("this audit", "this run").
    """
    parser.add_argument("--backend", dest=dest, choices=("cython", "numpy"),
                        help=f"kernel backend for {what} (same as the global --backend)")


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--temperature``, ``--top-k``, ``--top-p``, ``--seed`` and ``--gamma`` (the options
    of every command that decodes speculatively with one drafter)."""
    parser.add_argument("--temperature", type=non_negative_float, default=0.0,
                        help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="1 = off (default)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--gamma", type=gamma_or_adaptive, default=None, metavar="G",
                        help="draft tokens per round, an int or 'adaptive' (default: per "
                             "drafter)")


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--threads N`` (every command has it; :func:`apply_threads_option` applies it
    before the command runs). Unset, the library's default stands (the CPUs this process
    may run on, or ``FASTSPEC_THREADS``)."""
    info = threads_info()
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N",
                        help=f"threads of the compiled kernels, 1 to {MAX_THREADS} (default "
                             f"{info['default']}: {info['default_from']}); the outputs are "
                             "the same at every count")


def apply_threads_option(args: argparse.Namespace) -> None:
    """Set the library's thread count from ``args.threads`` when the command line gave one."""
    threads = getattr(args, "threads", None)
    if threads is not None:
        from fastspec.kernels import set_threads

        set_threads(threads)


def add_kv_dtype_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--kv-dtype`` (the commands that decode with a loaded model)."""
    parser.add_argument("--kv-dtype", choices=("float32", "float16"), default=None,
                        help="dtype of the target's key/value cache (default: the model's "
                             "compute dtype, float32); float16 halves the bytes a decode step "
                             "reads from it (faster at long contexts where the head size is a "
                             "multiple of 16 up to 256), its values rounded to binary16")
