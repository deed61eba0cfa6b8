"""``fastspec quantize``: a model's matrices to Q8_0, Q4_0 or Q4_1 blocks, written as GGUF."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fastspec.cli.args import add_threads_option

__all__ = ["add_parser", "run", "EMBEDDED"]

#: Input names of the embedded models (``fastspec.pretrained``).
EMBEDDED = ("embedded:target", "embedded:draft")


def add_parser(sub) -> None:
    """Register ``quantize`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "quantize", help="write a model with quantized weights (q8_0, q4_0, q4_1) as GGUF",
        description="Quantize a model's matrices (embedding, head, attention and MLP "
                    "projections) to GGUF's blocks of 32 and write a GGUF file that fastspec, "
                    "llama.cpp and transformers' GGUF loader read. Norms and biases stay F32. "
                    "From a GGUF file, its tokenizer and other metadata are copied and its "
                    "blocks of the requested type are kept byte for byte.")
    p.add_argument("input", metavar="IN",
                   help="a .gguf file, a Hugging Face folder (Llama/Qwen2/Qwen3/Phi-3/"
                        "Granite), an .npz written by fastspec, a catalog name (smollm2), a "
                        "model Ollama pulled (llama3.2:1b or ollama:NAME), or "
                        f"{' / '.join(EMBEDDED)} (the embedded models)")
    p.add_argument("output", metavar="OUT", help="the GGUF file to write (.gguf)")
    p.add_argument("--type", dest="kind", required=True, choices=("q8_0", "q4_0", "q4_1"),
                   help="block type of the matrices")
    p.add_argument("--keep-native", action="store_true",
                   help="keep a GGUF input's Q8_0/Q4_0/Q4_1 matrices as they are even when "
                        "of another type than --type (e.g. a Q8_0 embedding in a Q4_1 file); "
                        "default: every matrix becomes --type")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    add_threads_option(p)
    p.set_defaults(run=run)


def _load(source: str, kind: str):
    """Return ``(model, the GGUF file to copy metadata from or None)`` for input ``source``."""
    from fastspec.model.transformer import Transformer

    if source in EMBEDDED:
        from fastspec.models import pretrained
        if not pretrained.available():
            raise FileNotFoundError(f"{source}: the embedded model files are not installed "
                                    f"(looked in {pretrained.data_dir()})")
        bundle = pretrained.load()
        return getattr(bundle, source.split(":")[1]), None
    from fastspec.formats.gguf_header import is_gguf
    from fastspec.models.catalog import resolve
    path = resolve(source)
    if is_gguf(path):
        # native: blocks of the file's Q8_0/Q4_0/Q4_1 tensors kept, other types converted
        return Transformer.load(path, weight_dtype=kind), path
    if path.is_dir() or path.suffix == ".npz":
        return Transformer.load(path), None
    raise ValueError(f"{path}: not a .gguf file, an .npz file or a Hugging Face folder")


def run(args: argparse.Namespace) -> int:
    """Quantize ``args.input`` into ``args.output``; return the exit status (0, or 2 on a bad
    input or output, with the reason on stderr)."""
    from fastspec.formats.gguf_write import save_gguf
    from fastspec.model.quantized import quantize_model
    from fastspec.tools.progress import Progress

    out = Path(args.output)
    if out.suffix.lower() != ".gguf":
        print(f"fastspec quantize: OUT must end in .gguf, got {out}", file=sys.stderr)
        return 2
    if out.exists() and not args.force:
        print(f"fastspec quantize: {out} exists (pass --force to overwrite)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        if not args.quiet:
            print(f"loading {args.input} ...", file=sys.stderr)
        model, source = _load(args.input, args.kind)
        bar = None if args.quiet else Progress(len(model.layers) + 2, "quantize")
        qmodel = quantize_model(model, args.kind, keep_native=args.keep_native,
                                progress=None if bar is None else lambda d, t: bar.update())
        if bar is not None:
            bar.close()
        del model
        save_gguf(qmodel, out, source=source, name=Path(str(args.input)).stem)
    except (FileNotFoundError, ValueError, KeyError, ImportError) as exc:
        print(f"fastspec quantize: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        kinds = sorted({m.kind for m in _matrices(qmodel)})
        nbytes = sum(m.nbytes for m in {id(m): m for m in _matrices(qmodel)}.values())
        print(f"wrote {out}: {qmodel.config.n_layers} layers, matrices {'+'.join(kinds)} "
              f"({nbytes / 2**20:.1f} MiB), file {out.stat().st_size / 2**20:.1f} MiB, "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _matrices(model) -> list:
    from fastspec.model.quantized import is_quant
    mats = [model.embed, model.head] + [a for lw in model.layers for a in lw.arrays().values()]
    return [a for a in mats if is_quant(a)]
