"""Training objectives and evaluations: next-byte cross-entropy, distillation, DFlash blocks.

The DFlash objective follows the paper's recipe adapted to a CPU budget: several anchor
blocks per sequence in one packed forward, labels from the target's greedy continuation of
each anchor, position-weighted cross-entropy (docs/MODELS.md).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fastspec.training.data import dflash_rows, sample_anchors
from fastspec.training.modules import apply_rope, autocast

__all__ = ["lm_loss", "distill_loss", "evaluate_bpb", "branch_greedy_labels",
           "dflash_packed_logits", "dflash_targets", "dflash_loss", "miss_anchors",
           "evaluate_dflash"]


def lm_loss(logits, y):
    """Mean next-token cross-entropy (nats) of logits (B, T, V) against targets (B, T)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def distill_loss(logits, teacher_logits, y, kd: float):
    """``kd * KL(teacher || student) + (1 - kd) * CE``; returns (loss, ce, kl)."""
    lf = logits.float().reshape(-1, logits.shape[-1])
    ce = F.cross_entropy(lf, y.reshape(-1))
    tp = F.softmax(teacher_logits.float().reshape(-1, lf.shape[-1]), -1)
    kl = F.kl_div(F.log_softmax(lf, -1), tp, reduction="batchmean")
    return kd * kl + (1 - kd) * ce, ce, kl


def evaluate_bpb(model, tokens: np.ndarray, seq: int = 512, max_windows: int = 400,
                 bf16: bool = False, batch: int = 8) -> float:
    """Return bits per byte of `model` on `tokens` (non-overlapping windows, evenly spaced).

    Only targets that are bytes (< 256) count; BOS targets (file starts) are skipped. Each
    window is scored from its own start (no carried context).
    """
    n_win = (len(tokens) - 1) // seq
    idx = np.linspace(0, n_win - 1, num=min(n_win, max_windows)).astype(np.int64)
    tot, cnt = 0.0, 0
    model.eval()
    with torch.no_grad(), autocast(bf16):
        for b in range(0, len(idx), batch):
            rows = [tokens[i * seq : i * seq + seq + 1] for i in idx[b : b + batch]]
            x = torch.from_numpy(np.stack(rows).astype(np.int64))
            logits, _ = model(x[:, :-1])
            y = x[:, 1:]
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="none")
            keep = (y.reshape(-1) < 256).float()
            tot += float((loss * keep).sum())
            cnt += int(keep.sum())
    model.train()
    return tot / max(cnt, 1) / math.log(2)


def branch_greedy_labels(target, seqs, anchors, logits, cache, block_size: int, bf16: bool):
    """Greedy continuations of the target from every anchor, batched over all anchors.

    For anchor ``a`` of a row, the label block is ``[seq[a], g1, ..., g_{B-1}]`` where ``g`` is
    the target's greedy continuation of ``seq[: a + 1]``: exactly what a DFlash block anchored
    at ``a`` should propose, whether ``seq[a]`` was the target's own choice or not.

    Parameters
    ----------
    seqs : LongTensor of shape (Bt, T)
    anchors : LongTensor of shape (Bt, m), values in [0, T)
    logits : Tensor of shape (Bt, T, V)
        Target logits over `seqs` (row t predicts position t + 1).
    cache : list of [k, v] per layer, each (Bt, Hkv, T, D)
        Target K/V (after RoPE) over `seqs`.

    Returns
    -------
    LongTensor of shape (Bt, m, block_size)
    """
    Bt, T = seqs.shape
    m = anchors.shape[1]
    labels = torch.empty((Bt, m, block_size), dtype=torch.long)
    labels[:, :, 0] = torch.gather(seqs, 1, anchors)
    nxt = logits.float().argmax(-1)  # (Bt, T)
    labels[:, :, 1] = torch.gather(nxt, 1, anchors)
    if block_size <= 2:
        return labels
    # The m branches of a row are m queries of that row: each sees the row's window keys up to
    # its anchor, plus the keys it generated itself (no copy of the window cache per branch).
    win_mask = torch.arange(T)[None, None, :] <= anchors[:, :, None]  # (Bt, m, T)
    eye = torch.eye(m, dtype=torch.bool)[None].expand(Bt, -1, -1)  # (Bt, m, m)
    new_k: list[list] = [[] for _ in cache]
    new_v: list[list] = [[] for _ in cache]
    cur = labels[:, :, 1]  # (Bt, m)
    with torch.no_grad(), autocast(bf16):
        for k in range(2, block_size):
            pos = anchors + (k - 1)  # positions of `cur`
            tables = tuple(None if t is None else (t[0][:, None], t[1][:, None])
                           for t in target.rope_tables(pos))  # (Bt, 1, m, D) each
            x = target.embed_ids(cur)  # (Bt, m, dim)
            mask = torch.cat([win_mask] + [eye] * (k - 1), dim=2)[:, None]
            for li, layer in enumerate(target.model.layers):
                h = layer.input_layernorm(x)
                q, kk, vv = layer.self_attn.qkv(h)
                turn = target.layer_rope(li, tables)
                if turn is not None:
                    q, kk = apply_rope(q, *turn), apply_rope(kk, *turn)
                new_k[li].append(kk)
                new_v[li].append(vv)
                K = torch.cat([cache[li][0].to(kk.dtype)] + new_k[li], dim=2)
                V = torch.cat([cache[li][1].to(vv.dtype)] + new_v[li], dim=2)
                x = layer.add_mlp(layer.add_attention(x, layer.self_attn.attend(q, K, V,
                                                                                 mask=mask)))
            lg = F.linear(target.model.norm(x), target.head_weight())
            cur = lg.float().argmax(-1)
            labels[:, :, k] = cur
    return labels


def dflash_packed_logits(dmodel, target, dcfg, seqs, anchors, bf16: bool, tap=None):
    """Drafter logits for several anchor blocks per sequence, in one forward.

    Parameters
    ----------
    seqs : LongTensor of shape (Bt, T)
    anchors : LongTensor of shape (Bt, m)
        Anchor positions (>= 1); block j of a row is ``[seq[a_j], MASK * (B-1)]`` at
        positions ``a_j .. a_j+B-1``. It attends the context features of positions ``< a_j``
        and its own block (non-causally), never the other blocks: a block-sparse mask.
    tap : Tensor of shape (Bt, T, n_taps*dim), optional
        Concatenated target hidden states of the tapped layers (computed when None).

    Returns
    -------
    Tensor of shape (Bt, m, B, V)
    """
    Bs = dcfg["block_size"]
    taps = dcfg["tap_layers"]
    Bt, T = seqs.shape
    m = anchors.shape[1]
    if tap is None:
        with torch.no_grad(), autocast(bf16):
            _, hid = target(seqs, hidden_layers=set(taps), return_logits=False)
            tap = torch.cat([hid[t].float() for t in taps], dim=-1)
    emb_w = target.model.embed_tokens.weight
    head_w = target.head_weight()
    pos = (anchors[:, :, None] + torch.arange(Bs)).reshape(Bt, m * Bs)  # (Bt, Q)
    block_tok = torch.full((Bt, m, Bs), dcfg["mask_token_id"], dtype=torch.long)
    block_tok[:, :, 0] = torch.gather(seqs, 1, anchors)
    block_tok = block_tok.reshape(Bt, m * Bs)
    ctx_mask = torch.arange(T)[None, None, :] < anchors.repeat_interleave(Bs, 1)[:, :, None]
    blk = torch.arange(m).repeat_interleave(Bs)
    blk_mask = (blk[:, None] == blk[None, :]).expand(Bt, -1, -1)
    mask = torch.cat([ctx_mask, blk_mask], dim=-1)[:, None]  # (Bt, 1, Q, T + Q)
    with autocast(bf16):
        ctx = dmodel.context(tap)
        logits = dmodel(F.embedding(block_tok, emb_w), pos, ctx, torch.arange(T), mask, head_w)
    return logits.float().reshape(Bt, m, Bs, -1)


def dflash_targets(target, dcfg, seqs, anchors, bf16: bool):
    """Target pass for a DFlash batch: tapped hidden states and greedy branch labels.

    Returns
    -------
    tap : Tensor of shape (Bt, T, n_taps*dim)
    labels : LongTensor of shape (Bt, m, B)
    """
    taps = dcfg["tap_layers"]
    with torch.no_grad(), autocast(bf16):
        cache: list = []
        logits, hid = target(seqs, cache=cache, hidden_layers=set(taps))
        tap = torch.cat([hid[t].float() for t in taps], dim=-1)
    labels = branch_greedy_labels(target, seqs, anchors, logits, cache, dcfg["block_size"], bf16)
    return tap, labels


def dflash_loss(logits, labels, gamma_w: float = 4.0):
    """Weighted cross-entropy: block row k = 1..B-1 weighs exp(-(k-1)/gamma_w).

    Returns (loss, hits) with hits the (Bt, m, B-1) float tensor of argmax matches.
    """
    Bs = logits.shape[2]
    lg, lab = logits[:, :, 1:], labels[:, :, 1:]
    w = torch.exp(-torch.arange(Bs - 1, dtype=torch.float32) / gamma_w)
    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1), reduction="none")
    ce = ce.reshape(lab.shape)
    loss = (ce * w).sum() / (w.sum() * lab.shape[0] * lab.shape[1])
    hits = (lg.detach().argmax(-1) == lab).float()
    return loss, hits


def miss_anchors(dmodel, target, dcfg, seqs, plens, tap, anchors, miss_frac: float, rng,
                 bf16: bool):
    """Move ~``miss_frac`` of the episode rows' anchors to where a decoding round would start.

    In greedy speculative decoding a round starts right after the drafter's first miss: the
    anchor is the target's correction token and the drafter has just failed on that context.
    Uniform anchors under-sample these harder positions (they overstate tau). For episode
    rows (the target's own greedy continuations, so block labels are the next tokens), probe
    the current drafter at uniform continuation anchors ``a`` without gradients; where its
    argmax first misses at block row ``k``, ``a + k`` is a round start. Returns the new
    (Bt, m) anchors, sorted per row.
    """
    Bs = dcfg["block_size"]
    Bt, T = seqs.shape
    out = anchors.numpy().copy()
    rows = [b for b in range(Bt) if plens[b] > 0]
    n_move = int(round(out.shape[1] * miss_frac))
    if not rows or n_move == 0:
        return anchors
    probe = np.stack([np.sort(rng.integers(max(1, plens[b] - 1), T - Bs, out.shape[1]))
                      for b in rows])
    with torch.no_grad():
        lg = dflash_packed_logits(dmodel, target, dcfg, seqs[rows], torch.from_numpy(probe),
                                  bf16, tap=tap[rows])
    guess = lg[:, :, 1:].argmax(-1).numpy()                          # (R, m, B-1)
    truth = seqs[rows].numpy()[np.arange(len(rows))[:, None, None],
                               probe[:, :, None] + np.arange(1, Bs)]  # (R, m, B-1)
    miss = guess != truth
    for i, b in enumerate(rows):
        has = miss[i].any(-1)
        starts = probe[i][has] + miss[i][has].argmax(-1) + 1
        starts = np.unique(starts[starts < T])
        if len(starts):
            pick = rng.choice(starts, size=min(n_move, len(starts)), replace=False)
            keep = rng.choice(out.shape[1], size=out.shape[1] - len(pick), replace=False)
            out[b] = np.sort(np.concatenate([out[b][keep], pick]))
    return torch.from_numpy(out)


def evaluate_dflash(dmodel, target, dcfg, episodes, corpus: np.ndarray, n_rows: int = 64,
                    m: int = 8, seed: int = 1234, batch: int = 8) -> dict[str, Any]:
    """Per-position accuracy of the drafter on held-out data, in float32.

    Three anchor kinds: ``greedy`` (anchors inside the target's greedy continuation of a
    validation prompt: the steady state of greedy speculative decoding), ``corpus`` (random
    anchors in validation text) and ``mismatch`` (validation positions whose token the target
    did not predict: the situation after sampling a token the drafter could not foresee).
    Labels are always the target's greedy continuation from the anchor. Also reports the mean
    length of the correct prefix of the B-1 drafted tokens (tau - 1 for greedy verification
    if every block were drafted at such anchors).
    """
    dmodel.eval()
    T = episodes[0].shape[1]
    res: dict[str, Any] = {}
    with torch.no_grad():
        for kind in ("greedy", "corpus", "mismatch"):
            rng = np.random.default_rng(seed)
            hits = []
            for b0 in range(0, n_rows, batch):
                nb = min(batch, n_rows - b0)
                if kind == "greedy":
                    idx = np.arange(b0, b0 + nb) % len(episodes[0])
                    seqs = episodes[0][idx][:, :T]
                    plens = [int(episodes[1][i]) + 1 for i in idx]  # anchors in continuation
                else:
                    seqs, plens = dflash_rows(rng, nb, T, ([], []), corpus, 0.0)
                st = torch.from_numpy(seqs)
                lg, _ = target(st)
                mismatch = np.zeros(seqs.shape, dtype=bool)
                mismatch[:, 1:] = (lg[:, :-1].argmax(-1) != st[:, 1:]).numpy()
                anchors = torch.from_numpy(sample_anchors(
                    rng, plens, T, m, mismatch, 1.0 if kind == "mismatch" else 0.0))
                tap, labels = dflash_targets(target, dcfg, st, anchors, False)
                logits = dflash_packed_logits(dmodel, target, dcfg, st, anchors, False, tap=tap)
                _, h = dflash_loss(logits, labels)
                hits.append(h.reshape(-1, h.shape[-1]))
            c = torch.cat(hits)
            res[kind] = {
                "acc_per_position": [round(float(v), 4) for v in c.mean(0)],
                "mean_accepted_prefix": round(float(torch.cumprod(c, -1).sum(-1).mean()), 4),
                "n_blocks": int(c.shape[0]),
            }
    dmodel.train()
    return res
