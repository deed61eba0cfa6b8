"""``fastspec demo``: every drafter against vanilla decoding of the embedded models."""
from __future__ import annotations

import argparse

from fastspec.cli.args import (MODEL_SOURCES, add_kv_dtype_option, add_threads_option,
                               non_negative_float, positive_int)

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``demo`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "demo", help="speculative decoding of the embedded models on held-out code",
        description="Generate a continuation of a held-out standard-library prompt with the "
                    "embedded target, using vanilla decoding, the draft model, the n-gram "
                    "drafter and DFlash; print the text once and a table of tokens/s, speedup "
                    "over vanilla, tau, acceptance rate and whether the output is identical "
                    "to vanilla.")
    p.add_argument("--model", metavar="PATH",
                   help=f"a chat model instead of the embedded ones: {MODEL_SOURCES}; runs "
                        "vanilla, ngram and ngram_tree on a grounded request (type hints) "
                        "rendered by its chat template")
    p.add_argument("--prompt", help="prompt text (default: a held-out code prompt; with "
                                    "--model, the user message)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N",
                   help="tokens to generate (default 256)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 = greedy (default); > 0 samples")
    p.add_argument("--drafter", choices=("all", "draft", "ngram", "ngram_tree", "dflash",
                                         "dflash_tree"), default="all",
                   help="which drafter(s) to compare with vanilla (default all; *_tree: the "
                        "drafter proposing trees)")
    p.add_argument("--weight-dtype", choices=("auto", "float16", "float32", "bfloat16", "q8_0",
                                              "q4_0", "q4_1"), default="auto", metavar="DTYPE",
                   help="storage of the models' matrices: auto (default: the files' own, "
                        "float16 for the embedded models; with --model as in fastspec "
                        "generate, a GGUF file's Q8_0/Q4_0/Q4_1 blocks as they are), "
                        "float16, float32, bfloat16, or quantized q8_0, q4_0, q4_1 (derived "
                        "from the embedded weights at load; with --model a GGUF file's blocks "
                        "of that kind are kept, others converted)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="timed runs per method, fastest reported (default 1)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    add_kv_dtype_option(p)
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo (:func:`fastspec.tools.demo.demo_main`); return its exit status."""
    from fastspec.tools.demo import demo_main

    return demo_main(args)
