"""``fastspec bench``: the benchmark suite (machine limits, kernels, scaling, peers)."""
from __future__ import annotations

import argparse

from fastspec.cli.args import add_threads_option

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``bench`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "bench", help="benchmark suite: machine limits, kernels, scaling, peers",
        description="Measure the machine (streaming bandwidth, GEMM), the kernels (Cython vs "
                    "NumPy), decode cost vs context, speedup vs gamma/block size, and with "
                    "--peers Hugging Face transformers on the same weights. Quick by default.")
    p.add_argument("--full", action="store_true", help="all sizes (slower)")
    p.add_argument("--peers", action="store_true",
                   help="compare with transformers ([hf] extra) and, with llama-cpp-python "
                        "([peers] extra) and the SmolLM2 GGUF file, with llama.cpp on it")
    p.add_argument("--out", default="bench_results.json", help="JSON output path")
    p.add_argument("--plot-dir", metavar="DIR", help="write PNG plots here ([plot] extra)")
    p.add_argument("--markdown", metavar="PATH",
                   help="also write a markdown report (docs/PERFORMANCE.md); an existing file "
                        "keeps its dated sections ('(measured ...)' headings), and its previous "
                        "headline tables as one more when they come from another CPU")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmarks (:func:`fastspec.tools.benchmark.bench_main`); return its status."""
    from fastspec.tools.benchmark import bench_main

    return bench_main(args)
