"""Training data: corpus windows, the target's greedy episodes and DFlash anchors.

The corpus is the interpreter's standard library (:mod:`fastspec.text.corpus`), tokenised by
:class:`fastspec.text.tokenizer.ByteTokenizer`.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from fastspec.tools.progress import Progress
from fastspec.training.modules import autocast

__all__ = ["lm_batch", "greedy_generate", "make_greedy_episodes", "load_episodes",
           "save_episodes", "dflash_rows", "sample_anchors"]


def lm_batch(tokens: np.ndarray, rng: np.random.Generator, batch: int, seq: int):
    """Return inputs and next-token targets, LongTensors of shape (batch, seq), from random windows."""
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    x = np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)
    x = torch.from_numpy(x)
    return x[:, :-1], x[:, 1:]


def greedy_generate(model, prompts, n_new: int, bf16: bool = False):
    """Greedy continuations of equal-length prompts with a KV cache, batched (torch).

    Kept rather than :func:`fastspec.generate`: it decodes a whole batch of prompts at once
    with the torch model being trained (optionally under bfloat16 autocast, ``--target-bf16``),
    and its argmax decides the labels; fastspec's float32 kernels may break near-ties the
    other way, so episodes would not be exactly those of the recipe.

    Parameters
    ----------
    model : fastspec.training.modules.Transformer
    prompts : LongTensor of shape (B, P)
    n_new : int

    Returns
    -------
    LongTensor of shape (B, n_new)
    """
    model.eval()
    out = []
    with torch.no_grad(), autocast(bf16):
        cache: list = []
        logits, _ = model(prompts, start=0, cache=cache)
        nxt = logits[:, -1].float().argmax(-1)
        pos = prompts.shape[1]
        for i in range(n_new):
            out.append(nxt)
            if i == n_new - 1:
                break
            logits, _ = model(nxt[:, None], start=pos, cache=cache)
            pos += 1
            nxt = logits[:, -1].float().argmax(-1)
    return torch.stack(out, dim=1)


def make_greedy_episodes(target, tokens: np.ndarray, n_episodes: int, rng: np.random.Generator,
                         length: int, prompt_min: int, prompt_max: int, batch: int,
                         bf16: bool = False, prog: Progress | None = None):
    """Return episodes: a corpus prompt followed by the target's greedy continuation.

    Every episode has `length` tokens; its prompt length is drawn once per generation batch in
    ``[prompt_min, prompt_max]`` so that batched decoding needs no padding.

    Returns
    -------
    seqs : ndarray of shape (n_episodes, length), int64
    plens : ndarray of shape (n_episodes,), int64
    """
    seqs, plens = [], []
    t0 = time.time()
    while len(seqs) < n_episodes:
        plen = int(rng.integers(prompt_min, prompt_max + 1))
        starts = rng.integers(0, len(tokens) - plen - 1, size=batch)
        p = torch.from_numpy(np.stack([tokens[s : s + plen] for s in starts]).astype(np.int64))
        g = greedy_generate(target, p, length - plen, bf16=bf16)
        for row in torch.cat([p, g], dim=1).numpy():
            seqs.append(row)
            plens.append(plen)
        if prog is not None:
            prog.log(f"greedy episodes {len(seqs)}/{n_episodes} ({time.time() - t0:.0f} s)")
    return np.stack(seqs[:n_episodes]), np.array(plens[:n_episodes], dtype=np.int64)


def load_episodes(path: str | Path):
    """Return the (train, validation) episodes of an episodes cache, each (seqs, plens).

    The cache is the trainer's own file (int16 tokens, so not a weight file for
    :func:`fastspec.formats.npz.read_npz`); it is read without pickles.
    """
    with np.load(path, allow_pickle=False) as z:
        return ((z["tr_seq"].astype(np.int64), z["tr_plen"]),
                (z["va_seq"].astype(np.int64), z["va_plen"]))


def save_episodes(path: str | Path, train, validation) -> None:
    """Write the episodes cache read by :func:`load_episodes`."""
    np.savez(path, tr_seq=train[0].astype(np.int16), tr_plen=train[1],
             va_seq=validation[0].astype(np.int16), va_plen=validation[1])


def dflash_rows(rng, batch: int, T: int, episodes, corpus: np.ndarray, episode_frac: float):
    """Draw a batch of rows: greedy episodes (with prompt lengths) and corpus windows."""
    seqs = np.zeros((batch, T), dtype=np.int64)
    plens = []
    e_seqs, e_plens = episodes
    for b in range(batch):
        if len(e_seqs) and rng.random() < episode_frac:
            i = int(rng.integers(len(e_seqs)))
            seqs[b] = e_seqs[i][:T]
            plens.append(int(e_plens[i]))
        else:
            s = int(rng.integers(0, len(corpus) - T))
            seqs[b] = corpus[s : s + T]
            plens.append(0)
    return seqs, plens


def sample_anchors(rng, rows_plen, T: int, m: int, mismatch, mismatch_frac: float):
    """Anchors per row: ~mismatch_frac on positions whose token the target did not predict.

    rows_plen : sequence of prompt lengths (0 for pure corpus rows); greedy-episode rows
    draw their other anchors from ``[plen - 1, T)`` (the last prompt token and the greedy
    continuation), corpus rows from ``[1, T)``. mismatch : (Bt, T) bool array, True where
    ``seq[t] != argmax target(seq[:t])``.
    """
    out = np.zeros((len(rows_plen), m), dtype=np.int64)
    for b, plen in enumerate(rows_plen):
        lo = max(1, plen - 1) if plen > 0 else 1
        cand = np.arange(lo, T)
        mis = np.flatnonzero(mismatch[b, 1:]) + 1
        n_mis = min(len(mis), int(round(m * mismatch_frac))) if mismatch_frac > 0 else 0
        pick = list(rng.choice(mis, size=n_mis, replace=False)) if n_mis else []
        rest = np.setdiff1d(cand, pick)
        pick += list(rng.choice(rest, size=m - len(pick), replace=len(rest) < m - len(pick)))
        out[b] = np.sort(pick)
    return out
