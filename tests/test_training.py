"""One optimizer step of each trainer on a tiny corpus (the ``[train]`` extra: torch)."""
import numpy as np
import pytest

import fastspec as fs

torch = pytest.importorskip("torch")
from fastspec import training  # noqa: E402

SHAPE = ["--dim", "32", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "48"]
LOOP = ["--steps", "1", "--batch", "2", "--seq", "32", "--eval-every", "1", "--eval-windows",
        "2", "--final-eval-windows", "2", "--warmup", "1", "--log-every", "1", "--no-bf16"]


def _corpus(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n).astype(np.uint16)


def test_one_step_of_each_trainer(tmp_path, capsys):
    data = (_corpus(4000, 0), _corpus(1200, 1))
    target, draft, dflash = tmp_path / "t.npz", tmp_path / "d.npz", tmp_path / "f.npz"
    args = training.build_parser().parse_args(
        ["target", "--out", str(target), "--layers", "2", "--max-seq-len", "64", *SHAPE, *LOOP])
    args.name = "target"
    training.train_target(args, data)
    args = training.build_parser().parse_args(
        ["draft", "--target", str(target), "--out", str(draft), "--init-embed", *SHAPE, *LOOP])
    args.name = "draft"
    training.train_draft(args, data)
    args = training.build_parser().parse_args(
        ["dflash", "--target", str(target), "--out", str(dflash), "--block-size", "4",
         "--anchors", "2", "--episodes", "2", "--val-episodes", "2", "--gen-batch", "2",
         "--prompt-min", "8", "--prompt-max", "12", "--eval-rows", "2", "--final-eval-rows", "2",
         "--miss-frac", "0.5", *LOOP])
    args.name = "dflash"
    training.train_dflash(args, data)
    log = capsys.readouterr().err
    for name in ("target", "draft", "dflash"):
        assert f"[{name}] exported" in log and f"[{name}] done: 1 steps" in log
    # Every export loads into fastspec and runs.
    t = fs.Transformer.load(target)
    d = fs.Transformer.load(draft)
    f = fs.DFlashModel.load(dflash, t)
    assert (t.config.n_layers, d.config.n_layers, f.config.block_size) == (2, 1, 4)
    res = fs.speculative_generate(t, fs.DFlashDrafter(f), [1, 2, 3, 4], 6)
    assert res.tokens == fs.generate(t, [1, 2, 3, 4], 6).tokens

    # A drafter may start from another block size's weights (no weight depends on it), but
    # not from another layer count.
    wider = tmp_path / "f8.npz"
    args = training.build_parser().parse_args(
        ["dflash", "--target", str(target), "--out", str(wider), "--block-size", "8",
         "--init", str(dflash), "--anchors", "2", "--episodes", "2", "--val-episodes", "2",
         "--gen-batch", "2", "--prompt-min", "8", "--prompt-max", "12", "--eval-rows", "2",
         "--final-eval-rows", "2", *LOOP])
    args.name = "dflash"
    training.train_dflash(args, data)
    assert fs.DFlashModel.load(wider, t).config.block_size == 8
    args.layers, args.out = 3, str(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="--init"):
        training.train_dflash(args, data)


def test_export_checks_the_weight_schema(tmp_path):
    cfg = training.model_config(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32,
                                max_seq_len=16)
    model = training.build_transformer(cfg)
    training.export_npz(model, cfg, tmp_path / "ok.npz")
    with pytest.raises(ValueError, match="schema"):
        training.export_npz(model, {**cfg, "n_layers": 2}, tmp_path / "bad.npz")
