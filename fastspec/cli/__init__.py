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
    isa = fs.kernels.isa_info()
    if isa["selected"] is None:
        print("matrix products: NumPy only (compiled extension not built)")
        return 0
    feats = " ".join(k for k, v in isa["features"].items() if v) or "none"
    how = f"forced by FASTSPEC_ISA/set_isa ({isa['forced']})" if isa["forced"] else "automatic"
    path = isa["selected"]
    print(f"CPU features: {feats}")
    print(f"matrix products: {path} kernels ({how}); paths on this CPU: "
          f"{', '.join(isa['available'])}; with kernels: {', '.join(isa['kernels'])}")
    print(f"weight storage -> compute path (compiled backend, {path}):")
    print("  float32   packed float32 panels, float32 multiply-adds")
    print("  float16   binary16 panels widened to float32 in registers (F16C), float32 "
          "multiply-adds; bit-identical to float32 on the widened weights")
    print("  bfloat16  bf16 bit patterns widened by a 16-bit shift in registers; every product's "
          "input rounded to bf16 (nearest even), float32 multiply-adds")
    missing = [n for n in ("avx512bf16", "amx") if n not in isa["kernels"]]
    if missing:
        have = [n for n in missing if n in isa["available"]]
        print(f"  (no {'/'.join(missing)} kernels in this build"
              + (f"; this CPU has {', '.join(have)})" if have else
                 f"; this CPU lacks {', '.join(missing)} anyway)"))
    return 0


def _add_audit(sub) -> None:
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


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo", help="speculative decoding of the embedded models on held-out code",
        description="Generate a continuation of a held-out standard-library prompt with the "
                    "embedded target, using vanilla decoding, the draft model, the n-gram "
                    "drafter and DFlash; print the text once and a table of tokens/s, speedup "
                    "over vanilla, tau, acceptance rate and whether the output is identical "
                    "to vanilla.")
    p.add_argument("--prompt", help="prompt text (default: a held-out code prompt)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=256, metavar="N",
                   help="tokens to generate (default 256)")
    p.add_argument("--temperature", type=_non_negative_float, default=0.0,
                   help="0 = greedy (default); > 0 samples")
    p.add_argument("--drafter", choices=("all", "draft", "ngram", "ngram_tree", "dflash",
                                         "dflash_tree"), default="all",
                   help="which drafter(s) to compare with vanilla (default all; *_tree: the "
                        "drafter proposing trees)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--repeats", type=_positive_int, default=1,
                   help="timed runs per method, fastest reported (default 1)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> int:
    from fastspec.tools.demo import demo_main

    return demo_main(args)


def _add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a prompt, streamed as it is accepted",
        description="Speculative decoding of a prompt with the embedded models, or with a "
                    "Llama/Qwen2/Qwen3 Hugging Face folder (--model DIR, its tokenizer.json "
                    "needs the [hf] extra). Streams the text to stdout, then prints tokens/s, "
                    "tau and target calls to stderr.")
    p.add_argument("--model", metavar="DIR", help="Hugging Face folder (default: embedded)")
    p.add_argument("--drafter", metavar="SPEC",
                   help="none | ngram | draft:DIR | dflash:DIR (embedded: draft, dflash); "
                        "default dflash (embedded) or ngram (--model)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (default: read stdin)")
    src.add_argument("--prompt-ids", metavar="IDS", help="prompt token ids, comma separated "
                     "(no tokenizer needed; the output is printed as ids)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128, metavar="N",
                   help="tokens to generate (default 128)")
    p.add_argument("--temperature", type=_non_negative_float, default=0.0,
                   help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="1 = off (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--gamma", type=_gamma, default=None, metavar="G",
                   help="draft tokens per round, an int or 'adaptive' (default: per drafter)")
    p.add_argument("--json", action="store_true", help="print the text and figures as JSON")
    p.add_argument("--weight-dtype", choices=("auto", "bfloat16", "float16", "float32"),
                   default="auto",
                   help="storage of a --model folder's matrices (default auto: the folder's "
                        "own dtype when it is bfloat16 or float16, else float32; 16-bit "
                        "matrices halve the bytes each decode step reads)")
    p.add_argument("--mmap", action="store_true",
                   help="map a --model folder's safetensors instead of reading them: tensors "
                        "already in their storage dtype are not read at load (the first "
                        "forward packs them) and their pages stay reclaimable page cache")
    p.add_argument("--threads", type=_positive_int, default=1, metavar="N",
                   help="threads of the compiled runner's matrix products (default 1). More "
                        "help on an idle machine; on a busy one also set "
                        "OMP_WAIT_POLICY=PASSIVE in the environment")
    p.set_defaults(run=_run_generate)


def _run_generate(args) -> int:
    from fastspec.cli.generate import generate_main

    if args.threads != 1:
        try:
            from fastspec.kernels import _isa
        except ImportError:
            print("fastspec: --threads needs the compiled extension; running on one thread",
                  file=sys.stderr)
        else:
            _isa.set_threads(args.threads)
    return generate_main(args)


def _add_eval(sub) -> None:
    p = sub.add_parser(
        "eval", help="evaluate every drafter on held-out prompts (JSON + markdown)",
        description="Run vanilla and every drafter, chain and tree, on held-out prompts at "
                    "the given temperatures; write per-run results and tau/speedup summaries as JSON, "
                    "and optionally docs/RESULTS.md.")
    p.add_argument("--prompts", type=_positive_int, default=20, help="number of prompts (20)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=256, metavar="N")
    p.add_argument("--temperatures", type=_non_negative_float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="eval_results.json", help="JSON output path")
    p.add_argument("--markdown", metavar="PATH", help="also write a markdown summary here")
    p.add_argument("--methods", nargs="+", metavar="M",
                   choices=("draft", "ngram", "ngram_tree", "dflash", "dflash_tree"),
                   help="drafters to run (default all: draft ngram ngram_tree dflash "
                        "dflash_tree; *_tree propose trees); vanilla always runs")
    p.add_argument("--gamma", type=_gamma, default=None, metavar="G",
                   help="draft tokens per round for every drafter, an int or 'adaptive' "
                        "(default: each drafter's tuned default, "
                        "fastspec.tools.demo.DEFAULT_GAMMA)")
    p.set_defaults(run=_run_eval)


def _run_eval(args) -> int:
    from fastspec.tools.demo import eval_main

    return eval_main(args)


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark suite: machine limits, kernels, scaling, peers",
        description="Measure the machine (streaming bandwidth, GEMM), the kernels (Cython vs "
                    "NumPy), decode cost vs context, speedup vs gamma/block size, and with "
                    "--peers Hugging Face transformers on the same weights. Quick by default.")
    p.add_argument("--full", action="store_true", help="all sizes (slower)")
    p.add_argument("--peers", action="store_true", help="compare with transformers ([hf] extra)")
    p.add_argument("--out", default="bench_results.json", help="JSON output path")
    p.add_argument("--plot-dir", metavar="DIR", help="write PNG plots here ([plot] extra)")
    p.add_argument("--markdown", metavar="PATH", help="also write a markdown report (docs/PERFORMANCE.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_bench)


def _run_bench(args) -> int:
    from fastspec.tools.benchmark import bench_main

    return bench_main(args)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train the embedded models ([train] extra: torch)",
                       description="Train the target, draft or DFlash model on the standard "
                                   "library; all arguments after 'train' are passed on "
                                   "(see 'fastspec train --help').", add_help=False)
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_run_train)


def _run_train(args) -> int:
    try:
        from fastspec import training
    except ImportError as exc:
        print(f"fastspec train needs the [train] extra (torch==2.13.0): {exc}", file=sys.stderr)
        return 2
    return int(training.main(args.train_args) or 0)


def _add_seeds(sub) -> None:
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
    p.add_argument("--backend", dest="seeds_backend", choices=("cython", "numpy"),
                   help="kernel backend for this run (same as the global --backend)")
    p.add_argument("--seed-file", metavar="PATH",
                   help="the seed document: its own NumPy code is timed beside fastspec's")
    p.set_defaults(run=_run_seeds)


def _run_seeds(args) -> int:
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
            fs.set_backend(args.seeds_backend)
        report = seeds.run_seed(args.seed, seed_module)
    except seeds.SeedInputError as exc:
        print(f"fastspec seeds: {exc}", file=sys.stderr)
        return 2
    print(seeds.summary(args.seed, report))
    path = write_report(report, out)
    print(f"report written to {path}")
    return 0 if report["passed"] else 1


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _gamma(text: str):
    """``--gamma``: a positive int or "adaptive"."""
    return text if text == "adaptive" else _positive_int(text)


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastspec", description="Lossless speculative decoding on the CPU.")
    parser.add_argument("--version", action="version", version=f"fastspec {fs.__version__}")
    parser.add_argument("--backend", choices=("cython", "numpy"),
                        help="kernel backend (default: cython when built)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_info(sub)
    _add_audit(sub)
    _add_demo(sub)
    _add_generate(sub)
    _add_eval(sub)
    _add_bench(sub)
    _add_train(sub)
    _add_seeds(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # a caller's backend survives main(), whatever --backend or a command selects
    with fs.using_backend(args.backend or fs.backend()):
        run = getattr(args, "run", None)
        if args.command is None or run is None:
            return _run_info(args)
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
