"""The command line of the trainer: ``fastspec train`` and ``python -m fastspec.training``::

    python -m fastspec.training target --minutes 65 --out fastspec/data/target.npz
    python -m fastspec.training draft  --target fastspec/data/target.npz --minutes 10
    python -m fastspec.training dflash --target fastspec/data/target.npz --minutes 25
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from fastspec.training.loops import train_dflash, train_draft, train_target

__all__ = ["build_parser", "main"]


def _common(p: argparse.ArgumentParser, out: str, lr: float, batch: int, seq: int) -> None:
    p.add_argument("--out", default=out, help=f"output .npz (default {out})")
    p.add_argument("--steps", type=int, default=None, help="number of optimizer steps")
    p.add_argument("--minutes", type=float, default=None,
                   help="wall-clock budget; the schedule follows the elapsed fraction of it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seq", type=int, default=seq, help="training sequence length")
    p.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="train in float32 (default: bfloat16 autocast)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-windows", type=int, default=100)
    p.add_argument("--final-eval-windows", type=int, default=400)
    p.add_argument("--export-every", type=float, default=5.0, help="minutes between exports")
    p.add_argument("--name", default=None, help="label of the log lines")
    p.add_argument("--fp32-copy", default=None,
                   help="also write the final weights in float32 to this path (for checks)")


def _shape(p: argparse.ArgumentParser, dim: int, layers: int, heads: int, kv: int) -> None:
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--kv-heads", type=int, default=kv)
    p.add_argument("--ffn-dim", type=int, default=None, help="default 2.75*dim rounded to 32")
    p.add_argument("--qk-norm", action="store_true")
    p.add_argument("--untied", action="store_true", help="separate lm_head")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``fastspec train``."""
    data = Path(__file__).resolve().parent.parent / "data"
    p = argparse.ArgumentParser(
        prog="fastspec train",
        description="Train fastspec's embedded byte-level models on the Python standard "
                    "library (needs PyTorch).",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("target", help="train the target byte LM")
    _common(t, str(data / "target.npz"), lr=2e-3, batch=16, seq=512)
    _shape(t, 256, 4, 8, 4)
    t.add_argument("--max-seq-len", type=int, default=2048)
    t.add_argument("--init", default=None,
                   help="start from the weights of this .npz (same config), e.g. to resume")
    t.add_argument("--data-seed", type=int, default=None,
                   help="seed of the batch order (default: --seed)")

    d = sub.add_parser("draft", help="train the 1-layer draft model (distilled from the target)")
    _common(d, str(data / "draft.npz"), lr=3e-3, batch=16, seq=512)
    _shape(d, 256, 1, 8, 4)
    d.add_argument("--target", default=str(data / "target.npz"))
    d.add_argument("--kd", type=float, default=0.8,
                   help="weight of KL(target || draft); 1 - kd goes to corpus cross-entropy")
    d.add_argument("--init-embed", action="store_true",
                   help="initialise the embedding from the target's (same dim only)")
    d.add_argument("--init", default=None,
                   help="start from the weights of this .npz (same config), e.g. to resume")
    d.add_argument("--data-seed", type=int, default=None,
                   help="seed of the batch order (default: --seed)")

    f = sub.add_parser("dflash", help="train the DFlash block drafter on greedy continuations")
    _common(f, str(data / "dflash.npz"), lr=2e-3, batch=8, seq=256)
    f.add_argument("--target", default=str(data / "target.npz"))
    f.add_argument("--layers", type=int, default=2)
    f.add_argument("--block-size", type=int, default=8)
    f.add_argument("--tap-layers", type=int, nargs="*", default=None)
    f.add_argument("--anchors", type=int, default=16, help="anchor blocks per sequence")
    f.add_argument("--gamma-w", type=float, default=4.0,
                   help="position weight exp(-(k-1)/gamma_w) of block row k")
    f.add_argument("--episode-frac", type=float, default=0.6,
                   help="share of rows that are greedy episodes (the rest: corpus windows)")
    f.add_argument("--miss-frac", type=float, default=0.0,
                   help="share of episode-row anchors moved to where the drafter's own block "
                        "first misses (round starts of greedy decoding); costs a probe forward")
    f.add_argument("--mismatch-frac", type=float, default=0.25,
                   help="share of anchors on tokens the target did not predict")
    f.add_argument("--episodes", type=int, default=1024, help="training greedy episodes")
    f.add_argument("--val-episodes", type=int, default=64)
    f.add_argument("--eval-rows", type=int, default=32)
    f.add_argument("--final-eval-rows", type=int, default=64)
    f.add_argument("--gen-batch", type=int, default=64)
    f.add_argument("--prompt-min", type=int, default=32)
    f.add_argument("--prompt-max", type=int, default=160)
    f.add_argument("--target-bf16", action="store_true",
                   help="run the (frozen) target in bfloat16 too (labels may differ on ties)")
    f.add_argument("--init", default=None,
                   help="start from the weights of this .npz (same config), e.g. to resume")
    f.add_argument("--episodes-cache", default=None,
                   help=".npz to store/reuse the generated greedy episodes")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fastspec train`` / ``python -m fastspec.training``.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (without the program name); defaults to ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status.
    """
    args = build_parser().parse_args(argv)
    if args.name is None:
        args.name = args.cmd
    {"target": train_target, "draft": train_draft, "dflash": train_dflash}[args.cmd](args)
    return 0
