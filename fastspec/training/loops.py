"""The three training loops: target, draft (distilled) and DFlash, on a step or time budget."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from fastspec.formats import json_io
from fastspec.tools.progress import Progress
from fastspec.drafters.dflash_config import CONTEXT_WINDOW_KEY
from fastspec.training.data import (dflash_rows, lm_batch, load_episodes, make_greedy_episodes,
                                    sample_anchors, save_episodes)
from fastspec.training.modules import autocast, build_dflash, build_transformer, n_params
from fastspec.training.objectives import (branch_greedy_labels, dflash_loss, dflash_packed_logits,
                                          distill_loss, evaluate_bpb, evaluate_dflash, lm_loss,
                                          miss_anchors)
from fastspec.training.weights import (dflash_config, export_npz, load_dflash_npz,
                                       load_transformer_npz, model_config)

__all__ = ["Budget", "train_target", "train_draft", "train_dflash"]


class Budget:
    """Training length in steps (reproducible) or in wall-clock minutes (for shared machines).

    With ``steps`` the schedule position is ``step / steps``; with ``minutes`` it is the
    elapsed fraction of the time budget, so a run ends on time with a finished learning-rate
    decay even when the machine is shared (the log records the number of steps it reached).
    """

    def __init__(self, steps: int | None, minutes: float | None):
        if not steps and not minutes:
            raise ValueError("give --steps or --minutes")
        self.steps = int(steps) if steps else None
        self.seconds = None if steps else float(minutes) * 60.0
        self.t0 = time.time()
        self.step = 0

    def start(self) -> None:
        self.t0 = time.time()
        self.step = 0

    def fraction(self) -> float:
        """Return the schedule position in [0, 1]."""
        if self.steps:
            return min(1.0, self.step / self.steps)
        return min(1.0, (time.time() - self.t0) / self.seconds)

    def done(self) -> bool:
        return self.fraction() >= 1.0

    def lr(self, peak: float, warmup: int, final_frac: float = 0.1) -> float:
        """Linear warmup over `warmup` steps, then cosine decay to ``final_frac * peak``."""
        if self.step < warmup:
            return peak * (self.step + 1) / warmup
        f = self.fraction()
        return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * f)))


def _adamw(params, lr: float, wd: float):
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )


def _setup(args) -> tuple[Budget, Progress]:
    """Seed torch, set its threads; return the budget and the progress log of a run."""
    torch.set_num_threads(max(1, args.threads))
    torch.manual_seed(args.seed)
    return (Budget(args.steps, args.minutes),
            Progress(args.steps, args.name, inline=False, every=args.log_every, unit="tok"))


def _corpus(data):
    """(train, validation) token arrays: `data` if given, else the standard-library corpus."""
    if data is not None:
        return data
    from fastspec.text.corpus import load_tokens

    return load_tokens("train"), load_tokens("validation")


def _run(args, budget: Budget, prog: Progress, opt, step_fn, tokens_per_step: int,
         evaluate, export) -> int:
    """Run ``step_fn`` (one optimizer step; returns the progress figures) until the budget ends.

    Sets the learning rate of every step, calls ``evaluate(step)`` every ``--eval-every``
    steps and ``export()`` every ``--export-every`` minutes and at the end. Returns the
    number of steps.
    """
    budget.start()
    prog.start()
    last_export = time.time()
    step = 0
    while not budget.done():
        lr = budget.lr(args.lr, args.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        figures = step_fn()
        step = budget.step = budget.step + 1
        prog.update(units=tokens_per_step, fraction=budget.fraction(), **figures, lr=lr)
        if step % args.eval_every == 0:
            evaluate(step)
        if time.time() - last_export > args.export_every * 60:
            export()
            last_export = time.time()
            prog.log(f"exported {args.out} at step {step}")
    export()
    prog.log(f"exported {args.out} at step {step} (final)")
    return step


def _lm_run(args, budget, prog, opt, model, cfg, val, step_fn) -> None:
    """The target's and the draft's loop: validation bits/byte, exports, final fp32 figure."""
    def evaluate(step):
        bpb = evaluate_bpb(model, val, seq=args.seq, max_windows=args.eval_windows,
                           bf16=args.bf16)
        prog.log(f"step {step} val_bpb {bpb:.4f}")

    step = _run(args, budget, prog, opt, step_fn, args.batch * args.seq, evaluate,
                lambda: export_npz(model, cfg, args.out))
    if args.fp32_copy:
        export_npz(model, cfg, args.fp32_copy, dtype="float32")
    bpb = evaluate_bpb(model, val, seq=512, max_windows=args.final_eval_windows, bf16=False)
    prog.log(f"final val_bpb (fp32, seq 512, {args.final_eval_windows} windows) {bpb:.4f}")
    prog.log(f"done: {step} steps, {step * args.batch * args.seq:,} tokens, "
             f"{prog.elapsed / 60:.1f} min")


def _init_from(model, path, cfg, load, free=()) -> None:
    """Load `path`'s weights into `model`; config keys in `free` may differ (no weight shape
    depends on them, e.g. a DFlash drafter's block size)."""
    init, icfg = load(path)
    if {k: v for k, v in icfg.items() if k not in free} != {
            k: v for k, v in cfg.items() if k not in free}:
        raise ValueError(f"--init {path} has config {icfg}, expected {cfg}")
    model.load_state_dict(init.state_dict())


def train_target(args, data=None) -> None:
    """Train the target byte LM and export it (arguments: ``fastspec train target``).

    `data` is an optional (train, validation) pair of token arrays; default: the corpus.
    """
    budget, prog = _setup(args)
    cfg = model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_dim=args.ffn_dim,
                       max_seq_len=args.max_seq_len, qk_norm=args.qk_norm,
                       tie_embeddings=not args.untied)
    model = build_transformer(cfg, seed=args.seed)
    train, val = _corpus(data)
    if args.init:
        _init_from(model, args.init, cfg, load_transformer_npz)
        prog.log(f"initialised from {args.init}")
    prog.log(f"config {json_io.dumps(cfg)}")
    prog.log(f"params {n_params(model):,}; train tokens {len(train):,}; val tokens {len(val):,}")
    opt = _adamw(list(model.parameters()), args.lr, args.wd)
    rng = np.random.default_rng(args.seed if args.data_seed is None else args.data_seed)
    ema = None

    def step_fn():
        nonlocal ema
        x, y = lm_batch(train, rng, args.batch, args.seq)
        with autocast(args.bf16):
            logits, _ = model(x)
        loss = lm_loss(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        value = loss.item()
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        return {"loss": value, "ema_bpb": ema / math.log(2)}

    _lm_run(args, budget, prog, opt, model, cfg, val, step_fn)


def _frozen_target(path, seq: int):
    """Load the target ``.npz`` for distillation or DFlash training: eval mode, no gradients.

    Raises
    ------
    ValueError
        ``seq`` beyond a target's ``sliding_window`` (Gemma 3's: the torch target attends
        over every position, the same within the window only).
    """
    target, tcfg = load_transformer_npz(path)
    window = tcfg.get("sliding_window")
    if window is not None and seq > window:
        raise ValueError(f"--seq {seq} exceeds the target's sliding_window {window}")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target, tcfg


def train_draft(args, data=None) -> None:
    """Train the 1-layer draft model by distillation (arguments: ``fastspec train draft``)."""
    budget, prog = _setup(args)
    target, tcfg = _frozen_target(args.target, args.seq)
    cfg = model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_dim=args.ffn_dim,
                       max_seq_len=tcfg["max_seq_len"], qk_norm=args.qk_norm,
                       tie_embeddings=not args.untied)
    model = build_transformer(cfg, seed=args.seed)
    if args.init:
        _init_from(model, args.init, cfg, load_transformer_npz)
    elif args.init_embed and cfg["dim"] == tcfg["dim"]:
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    train, val = _corpus(data)
    prog.log(f"config {json_io.dumps(cfg)}")
    prog.log(f"params {n_params(model):,}; distilling from {args.target} (alpha_kd {args.kd})")
    opt = _adamw(list(model.parameters()), args.lr, args.wd)
    rng = np.random.default_rng(args.seed if args.data_seed is None else args.data_seed)

    def step_fn():
        x, y = lm_batch(train, rng, args.batch, args.seq)
        with torch.no_grad(), autocast(args.bf16):
            tlogits, _ = target(x)
        with autocast(args.bf16):
            logits, _ = model(x)
        loss, ce, kl = distill_loss(logits, tlogits, y, args.kd)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        return {"ce_bpb": ce.item() / math.log(2), "kl": kl.item()}

    _lm_run(args, budget, prog, opt, model, cfg, val, step_fn)


def _episodes(args, target, rng, train_tok, val_tok, prog):
    """The (train, validation) greedy episodes: from ``--episodes-cache`` or generated."""
    cache = Path(args.episodes_cache) if args.episodes_cache else None
    if cache is not None and cache.exists():
        tr, va = load_episodes(cache)
        prog.log(f"loaded {len(tr[0])} + {len(va[0])} greedy episodes from {cache}")
        return tr, va
    t0 = time.time()
    va = make_greedy_episodes(target, val_tok, args.val_episodes, rng, args.seq, args.prompt_min,
                              args.prompt_max, args.gen_batch, args.target_bf16)
    tr = make_greedy_episodes(target, train_tok, args.episodes, rng, args.seq, args.prompt_min,
                              args.prompt_max, args.gen_batch, args.target_bf16, prog)
    prog.log(f"generated {len(tr[0])} + {len(va[0])} greedy episodes in {time.time() - t0:.0f} s")
    if cache is not None:
        save_episodes(cache, tr, va)
    return tr, va


def train_dflash(args, data=None) -> None:
    """Train the DFlash drafter on the target's greedy continuations (``fastspec train dflash``)."""
    budget, prog = _setup(args)
    target, tcfg = _frozen_target(args.target, args.seq)
    dcfg = dflash_config(tcfg, n_layers=args.layers, block_size=args.block_size,
                         tap_layers=args.tap_layers or None)
    dmodel = build_dflash(dcfg, tcfg, seed=args.seed)
    if args.init:
        _init_from(dmodel, args.init, dcfg, lambda path: load_dflash_npz(path, tcfg),
                   free=("block_size",))
    else:
        with torch.no_grad():  # start on the target's output scale (the head is the target's)
            dmodel.norm.weight.copy_(target.model.norm.weight)
    prog.log(f"config {json_io.dumps(dcfg)}")
    prog.log(f"params {n_params(dmodel):,}")
    rng = np.random.default_rng(args.seed)
    train_tok, val_tok = _corpus(data)
    T, m, taps = args.seq, args.anchors, dcfg["tap_layers"]
    tr, va = _episodes(args, target, rng, train_tok, val_tok, prog)
    params = list(dmodel.parameters())
    opt = _adamw(params, args.lr, args.wd)

    def step_fn():
        seqs, plens = dflash_rows(rng, args.batch, T, tr, train_tok, args.episode_frac)
        st = torch.from_numpy(seqs)
        with torch.no_grad(), autocast(args.target_bf16):
            cache: list = []
            logits, hid = target(st, cache=cache, hidden_layers=set(taps))
            tap = torch.cat([hid[t].float() for t in taps], dim=-1)
        mismatch = np.zeros(seqs.shape, dtype=bool)
        mismatch[:, 1:] = (logits[:, :-1].float().argmax(-1) != st[:, 1:]).numpy()
        anchors = torch.from_numpy(sample_anchors(rng, plens, T, m, mismatch, args.mismatch_frac))
        if args.miss_frac > 0:
            anchors = miss_anchors(dmodel, target, dcfg, st, plens, tap, anchors,
                                   args.miss_frac, rng, args.bf16)
        labels = branch_greedy_labels(target, st, anchors, logits, cache,
                                      dcfg["block_size"], args.target_bf16)
        lg = dflash_packed_logits(dmodel, target, dcfg, st, anchors, args.bf16, tap=tap)
        loss, hits = dflash_loss(lg, labels, args.gamma_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        return {"loss": loss.item(), "acc1": float(hits[:, :, 0].mean()), "acc": float(hits.mean())}

    def evaluate(step):
        ev = evaluate_dflash(dmodel, target, dcfg, va, val_tok, n_rows=args.eval_rows)
        prog.log(f"step {step} eval {json_io.dumps(ev)}")

    # the context the drafter learns to read, for DFlashModel.context_window after loading
    saved = {**dcfg, CONTEXT_WINDOW_KEY: args.seq - dcfg["block_size"]}
    step = _run(args, budget, prog, opt, step_fn, args.batch * m * dcfg["block_size"], evaluate,
                lambda: export_npz(dmodel, saved, args.out))
    if args.fp32_copy:
        export_npz(dmodel, saved, args.fp32_copy, dtype="float32")
    ev = evaluate_dflash(dmodel, target, dcfg, va, val_tok, n_rows=args.final_eval_rows)
    prog.log(f"final eval (fp32, held-out) {json_io.dumps(ev)}")
    prog.log(f"done: {step} steps, {prog.elapsed / 60:.1f} min")
