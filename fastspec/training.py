"""Training of the embedded default models (the ``[train]`` extra; needs PyTorch).

This module holds PyTorch twins of the NumPy forward passes described in ``docs/FORMATS.md``
(the Llama-style target/draft transformer and the DFlash block-diffusion drafter), with
parameter names equal to the Hugging Face keys of that format, so ``state_dict()`` is the
weight file. It also holds the training loops and a command line::

    python -m fastspec.training target --minutes 65 --out fastspec/data/target.npz
    python -m fastspec.training draft  --target fastspec/data/target.npz --minutes 10
    python -m fastspec.training dflash --target fastspec/data/target.npz --minutes 25

(``fastspec train ...`` forwards its arguments to :func:`main`.) PyTorch is imported lazily so
that ``import fastspec.training`` works without it; every function that needs it imports it.

The corpus is the interpreter's standard library (:mod:`fastspec.corpus`), tokenised by
:class:`fastspec.tokenizer.ByteTokenizer`. Weight files are ``.npz`` with a ``"config"`` key
(JSON) and float16 weights; fastspec computes in float32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .tokenizer import ByteTokenizer

__all__ = [
    "Budget",
    "Progress",
    "model_config",
    "dflash_config",
    "build_transformer",
    "build_dflash",
    "export_npz",
    "load_transformer_npz",
    "load_dflash_npz",
    "evaluate_bpb",
    "greedy_generate",
    "train_target",
    "train_draft",
    "train_dflash",
    "main",
]

TOK = ByteTokenizer()


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "fastspec.training needs PyTorch: pip install 'fastspec[train]' (or torch)"
        ) from exc
    return torch


# ----------------------------------------------------------------------------------------------
# Configs (plain dicts, exactly the JSON keys of docs/FORMATS.md)
# ----------------------------------------------------------------------------------------------


def model_config(
    dim: int = 256,
    n_layers: int = 4,
    n_heads: int = 8,
    n_kv_heads: int = 4,
    head_dim: int | None = None,
    ffn_dim: int | None = None,
    max_seq_len: int = 2048,
    tie_embeddings: bool = True,
    rope_theta: float = 10000.0,
    norm_eps: float = 1e-5,
    qk_norm: bool = False,
    vocab_size: int = TOK.vocab_size,
) -> dict[str, Any]:
    """Return a Llama-style ``ModelConfig`` dict with every key of docs/FORMATS.md.

    Parameters
    ----------
    dim, n_layers, n_heads, n_kv_heads : int
        Width, depth, query heads and key/value heads (``n_heads % n_kv_heads == 0``).
    head_dim : int, optional
        Defaults to ``dim // n_heads``.
    ffn_dim : int, optional
        SwiGLU hidden width; defaults to ``2.75 * dim`` rounded up to a multiple of 32.
    max_seq_len : int, default 2048
    tie_embeddings : bool, default True
    rope_theta, norm_eps : float
    qk_norm : bool, default False
    vocab_size : int, default 260

    Returns
    -------
    dict
    """
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads must be a multiple of n_kv_heads, got {n_heads}, {n_kv_heads}")
    if head_dim is None:
        head_dim = dim // n_heads
    if ffn_dim is None:
        ffn_dim = int(math.ceil(2.75 * dim / 32) * 32)
    return {
        "vocab_size": int(vocab_size),
        "dim": int(dim),
        "n_layers": int(n_layers),
        "n_heads": int(n_heads),
        "n_kv_heads": int(n_kv_heads),
        "head_dim": int(head_dim),
        "ffn_dim": int(ffn_dim),
        "max_seq_len": int(max_seq_len),
        "norm": "rmsnorm",
        "positional": "rope",
        "activation": "swiglu",
        "tie_embeddings": bool(tie_embeddings),
        "rope_theta": float(rope_theta),
        "norm_eps": float(norm_eps),
        "qk_norm": bool(qk_norm),
        "dtype": "float32",
    }


def dflash_config(
    target_cfg: dict[str, Any],
    n_layers: int = 2,
    block_size: int = 8,
    tap_layers: Sequence[int] | None = None,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
    head_dim: int | None = None,
    ffn_dim: int | None = None,
) -> dict[str, Any]:
    """Return a ``DFlashConfig`` dict (docs/FORMATS.md, section DFlash) for `target_cfg`.

    Parameters
    ----------
    target_cfg : dict
        Config of the target the drafter serves.
    n_layers : int, default 2
    block_size : int, default 8
    tap_layers : sequence of int, optional
        Target layers whose outputs feed the drafter; defaults to ``n_layers`` (of the
        drafter, at least 2) layers spread evenly over the target, ending at the last one.
    n_heads, n_kv_heads, head_dim, ffn_dim : int, optional
        Default to the target's.

    Returns
    -------
    dict
    """
    L = target_cfg["n_layers"]
    if tap_layers is None:
        k = min(L, max(2, n_layers))
        tap_layers = sorted({round((i + 1) * L / k) - 1 for i in range(k)})
    tap_layers = [int(t) for t in tap_layers]
    if not tap_layers or any(t < 0 or t >= L for t in tap_layers):
        raise ValueError(f"tap_layers must be target layer indices in [0, {L}), got {tap_layers}")
    return {
        "block_size": int(block_size),
        "n_layers": int(n_layers),
        "tap_layers": tap_layers,
        "n_heads": int(n_heads or target_cfg["n_heads"]),
        "n_kv_heads": int(n_kv_heads or target_cfg["n_kv_heads"]),
        "head_dim": int(head_dim or target_cfg["head_dim"]),
        "ffn_dim": int(ffn_dim or target_cfg["ffn_dim"]),
        "qk_norm": bool(target_cfg["qk_norm"]),
        "rope_theta": float(target_cfg["rope_theta"]),
        "norm_eps": float(target_cfg["norm_eps"]),
        "mask_token_id": int(TOK.mask_id),
    }


# ----------------------------------------------------------------------------------------------
# Torch modules (built lazily so the module imports without torch)
# ----------------------------------------------------------------------------------------------

_MODULES: dict[str, Any] = {}


def _modules() -> dict[str, Any]:
    """Define the torch module classes once, on first use."""
    if _MODULES:
        return _MODULES
    torch = _torch()
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, dim: int, eps: float):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight.float()).to(x.dtype)

    def rope_cos_sin(positions, head_dim: int, theta: float):
        """cos, sin of shape positions.shape + (head_dim,) (HF rotate-half layout)."""
        inv_freq = theta ** (
            -torch.arange(0, head_dim // 2, dtype=torch.float64) * 2.0 / head_dim
        )
        ang = positions.to(torch.float64)[..., None] * inv_freq
        ang = torch.cat([ang, ang], dim=-1)
        return torch.cos(ang).float(), torch.sin(ang).float()

    def apply_rope(x, cos, sin):
        # x (..., T, D); cos/sin broadcastable to it
        d = x.shape[-1] // 2
        x1, x2 = x[..., :d], x[..., d:]
        rot = torch.cat([-x2, x1], dim=-1)
        return (x.float() * cos + rot.float() * sin).to(x.dtype)

    class Attention(nn.Module):
        def __init__(self, dim, n_heads, n_kv_heads, head_dim, qk_norm, eps):
            super().__init__()
            self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
            self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
            self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
            self.qk_norm = qk_norm
            if qk_norm:
                self.q_norm = RMSNorm(head_dim, eps)
                self.k_norm = RMSNorm(head_dim, eps)

        def qkv(self, h):
            """(B, T, dim) -> q (B, H, T, D), k, v (B, Hkv, T, D), before RoPE."""
            B, T, _ = h.shape
            q = self.q_proj(h).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(h).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(h).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            if self.qk_norm:
                q = self.q_norm(q)
                k = self.k_norm(k)
            return q, k, v

        def attend(self, q, k, v, mask=None, causal=False):
            rep = self.n_heads // self.n_kv_heads
            if rep > 1:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            B, H, T, D = a.shape
            return self.o_proj(a.transpose(1, 2).reshape(B, T, H * D))

    class MLP(nn.Module):
        def __init__(self, dim, ffn_dim):
            super().__init__()
            self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
            self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
            self.down_proj = nn.Linear(ffn_dim, dim, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self, dim, n_heads, n_kv_heads, head_dim, ffn_dim, qk_norm, eps):
            super().__init__()
            self.input_layernorm = RMSNorm(dim, eps)
            self.self_attn = Attention(dim, n_heads, n_kv_heads, head_dim, qk_norm, eps)
            self.post_attention_layernorm = RMSNorm(dim, eps)
            self.mlp = MLP(dim, ffn_dim)

    class LlamaBody(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["dim"])
            self.layers = nn.ModuleList(
                DecoderLayer(
                    cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"],
                    cfg["ffn_dim"], cfg["qk_norm"], cfg["norm_eps"],
                )
                for _ in range(cfg["n_layers"])
            )
            self.norm = RMSNorm(cfg["dim"], cfg["norm_eps"])

    class Transformer(nn.Module):
        """Llama-style causal LM; ``state_dict()`` keys are the HF keys of FORMATS.md."""

        def __init__(self, cfg):
            super().__init__()
            self.cfg = dict(cfg)
            self.model = LlamaBody(cfg)
            if not cfg["tie_embeddings"]:
                self.lm_head = nn.Linear(cfg["dim"], cfg["vocab_size"], bias=False)

        def head_weight(self):
            return self.model.embed_tokens.weight if self.cfg["tie_embeddings"] else self.lm_head.weight

        def forward(self, ids, start: int = 0, cache=None, hidden_layers=(), return_logits=True):
            """Run `ids` (B, T) at positions start..start+T-1.

            cache : None (no cache; start must be 0) or a list of [k, v] per layer holding
                positions < start, extended in place. Returns (logits (B, T, V) or None,
                {layer: hidden (B, T, dim)}).
            """
            B, T = ids.shape
            x = self.model.embed_tokens(ids)
            pos = torch.arange(start, start + T, device=ids.device)
            cos, sin = rope_cos_sin(pos, self.cfg["head_dim"], self.cfg["rope_theta"])
            hidden = {}
            for li, layer in enumerate(self.model.layers):
                h = layer.input_layernorm(x)
                q, k, v = layer.self_attn.qkv(h)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
                if cache is not None:
                    if len(cache) <= li:
                        cache.append([k, v])
                    else:
                        cache[li][0] = torch.cat([cache[li][0], k], dim=2)
                        cache[li][1] = torch.cat([cache[li][1], v], dim=2)
                    k, v = cache[li]
                if k.shape[2] == T:
                    a = layer.self_attn.attend(q, k, v, causal=True)
                elif T == 1:
                    a = layer.self_attn.attend(q, k, v)
                else:
                    S = k.shape[2]
                    qi = torch.arange(S - T, S, device=ids.device)[:, None]
                    mask = torch.arange(S, device=ids.device)[None, :] <= qi
                    a = layer.self_attn.attend(q, k, v, mask=mask)
                x = x + a
                x = x + layer.mlp(layer.post_attention_layernorm(x))
                if li in hidden_layers:
                    hidden[li] = x
            logits = None
            if return_logits:
                logits = F.linear(self.model.norm(x), self.head_weight())
            return logits, hidden

    class DFlashLayer(nn.Module):
        def __init__(self, dim, n_heads, n_kv_heads, head_dim, ffn_dim, qk_norm, eps):
            super().__init__()
            self.input_layernorm = RMSNorm(dim, eps)
            self.self_attn = Attention(dim, n_heads, n_kv_heads, head_dim, qk_norm, eps)
            self.post_attention_layernorm = RMSNorm(dim, eps)
            self.mlp = MLP(dim, ffn_dim)

    class DFlash(nn.Module):
        """DFlash drafter with KV injection; ``state_dict()`` keys are those of FORMATS.md."""

        def __init__(self, dcfg, target_cfg):
            super().__init__()
            self.cfg = dict(dcfg)
            dim = target_cfg["dim"]
            self.fc = nn.Linear(len(dcfg["tap_layers"]) * dim, dim, bias=False)
            self.hidden_norm = RMSNorm(dim, dcfg["norm_eps"])
            self.layers = nn.ModuleList(
                DFlashLayer(
                    dim, dcfg["n_heads"], dcfg["n_kv_heads"], dcfg["head_dim"], dcfg["ffn_dim"],
                    dcfg["qk_norm"], dcfg["norm_eps"],
                )
                for _ in range(dcfg["n_layers"])
            )
            self.norm = RMSNorm(dim, dcfg["norm_eps"])

        def context(self, taps):
            """taps (B, P, n_taps*dim) -> context features (B, P, dim)."""
            return self.hidden_norm(self.fc(taps))

        def forward(self, block_emb, block_pos, ctx, ctx_pos, mask, head_weight):
            """Draft logits for blocks.

            block_emb (B, Q, dim): embedded block tokens (several blocks may be packed);
            block_pos (Q,) or (B, Q) positions; ctx (B, P, dim) context features at
            positions ctx_pos (P,); mask (Q, P+Q) or (B, 1, Q, P+Q) boolean, True = attend.
            Returns logits (B, Q, V).
            """
            D, th = self.cfg["head_dim"], self.cfg["rope_theta"]
            cq, sq = rope_cos_sin(block_pos, D, th)
            ck, sk = rope_cos_sin(ctx_pos, D, th)
            if cq.dim() == 3:  # (B, Q, D) -> (B, 1, Q, D)
                cq, sq = cq[:, None], sq[:, None]
            if ck.dim() == 3:
                ck, sk = ck[:, None], sk[:, None]
            x = block_emb
            for layer in self.layers:
                h = layer.input_layernorm(x)
                att = layer.self_attn
                q, kb, vb = att.qkv(h)
                _, kc, vc = att.qkv(ctx)
                q, kb = apply_rope(q, cq, sq), apply_rope(kb, cq, sq)
                kc = apply_rope(kc, ck, sk)
                k = torch.cat([kc, kb], dim=2)
                v = torch.cat([vc, vb], dim=2)
                x = x + att.attend(q, k, v, mask=mask)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            return F.linear(self.norm(x), head_weight)

    _MODULES.update(
        RMSNorm=RMSNorm, Transformer=Transformer, DFlash=DFlash,
        rope_cos_sin=rope_cos_sin, apply_rope=apply_rope,
    )
    return _MODULES


def _init_weights(module, n_layers: int, seed: int) -> None:
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(module.named_parameters()):
        if p.dim() == 1:
            torch.nn.init.ones_(p)
            continue
        std = 0.02
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std = 0.02 / math.sqrt(2 * n_layers)
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def build_transformer(cfg: dict[str, Any], seed: int = 0):
    """Return a freshly initialised torch ``Transformer`` for `cfg` (seeded)."""
    m = _modules()["Transformer"](cfg)
    _init_weights(m, cfg["n_layers"], seed)
    return m


def build_dflash(dcfg: dict[str, Any], target_cfg: dict[str, Any], seed: int = 0):
    """Return a freshly initialised torch ``DFlash`` drafter (seeded)."""
    m = _modules()["DFlash"](dcfg, target_cfg)
    _init_weights(m, dcfg["n_layers"], seed)
    return m


def n_params(module) -> int:
    """Return the number of parameters of a torch module."""
    return int(sum(p.numel() for p in module.parameters()))


# ----------------------------------------------------------------------------------------------
# Export / import of the .npz format
# ----------------------------------------------------------------------------------------------


def export_npz(module, cfg: dict[str, Any], path: str | Path, dtype: str = "float16") -> Path:
    """Write `module`'s weights and `cfg` to `path` in the fastspec ``.npz`` format.

    Parameters
    ----------
    module : torch.nn.Module
        A ``Transformer`` or ``DFlash``; its ``state_dict()`` keys are the HF keys.
    cfg : dict
        Its config; stored as JSON under key ``"config"``.
    path : str or Path
        Output file; written atomically (temporary file + rename).
    dtype : {"float16", "float32"}, default "float16"
        Storage dtype of the weights.

    Returns
    -------
    Path
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {"config": np.array(json.dumps(cfg, sort_keys=True))}
    for k, v in module.state_dict().items():
        arrays[k] = v.detach().float().cpu().numpy().astype(dtype)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path


def _read_npz(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as z:
        cfg = json.loads(str(z["config"]))
        w = {k: z[k].astype(np.float32) for k in z.files if k != "config"}
    return cfg, w


def load_transformer_npz(path: str | Path):
    """Return (torch Transformer in float32, config) from a fastspec ``.npz``."""
    torch = _torch()
    cfg, w = _read_npz(path)
    m = _modules()["Transformer"](cfg)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
    return m, cfg


def load_dflash_npz(path: str | Path, target_cfg: dict[str, Any]):
    """Return (torch DFlash in float32, config) from a fastspec ``.npz``."""
    torch = _torch()
    cfg, w = _read_npz(path)
    m = _modules()["DFlash"](cfg, target_cfg)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
    return m, cfg


# ----------------------------------------------------------------------------------------------
# Helpers: progress, data, schedule, evaluation
# ----------------------------------------------------------------------------------------------


class Progress:
    """A plain-text progress line on stderr (no tqdm): step, metrics, tokens/s, elapsed, eta."""

    def __init__(self, name: str, budget: "Budget | None" = None, every: int = 10, stream=None):
        self.name, self.budget, self.every = name, budget, every
        self.stream = stream or sys.stderr
        self.t0 = time.time()
        self.tokens = 0

    def start(self) -> None:
        self.t0 = time.time()
        self.tokens = 0

    def update(self, step: int, tokens: int, **metrics: float) -> None:
        self.tokens += tokens
        if step % self.every:
            return
        el = time.time() - self.t0
        tps = self.tokens / max(el, 1e-9)
        ms = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        pct, eta = "", ""
        if self.budget is not None:
            pct = f" ({100 * self.budget.fraction():.1f}%)"
            eta = f" | eta {self.budget.eta() / 60:.1f} min"
        print(
            f"[{self.name}] step {step}{pct} {ms} | {tps:,.0f} tok/s | "
            f"elapsed {el / 60:.1f} min{eta}",
            file=self.stream, flush=True,
        )

    def log(self, msg: str) -> None:
        print(f"[{self.name}] {msg}", file=self.stream, flush=True)


def _batch(tokens: np.ndarray, rng: np.random.Generator, batch: int, seq: int):
    torch = _torch()
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    x = np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)
    x = torch.from_numpy(x)
    return x[:, :-1], x[:, 1:]


def _autocast(enabled: bool):
    torch = _torch()
    import contextlib

    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def evaluate_bpb(model, tokens: np.ndarray, seq: int = 512, max_windows: int = 400,
                 bf16: bool = False, batch: int = 8) -> float:
    """Return bits per byte of `model` on `tokens` (non-overlapping windows, evenly spaced).

    Only targets that are bytes (< 256) count; BOS targets (file starts) are skipped. Each
    window is scored from its own start (no carried context).
    """
    torch = _torch()
    import torch.nn.functional as F

    n_win = (len(tokens) - 1) // seq
    idx = np.linspace(0, n_win - 1, num=min(n_win, max_windows)).astype(np.int64)
    tot, cnt = 0.0, 0
    model.eval()
    with torch.no_grad(), _autocast(bf16):
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


def greedy_generate(model, prompts, n_new: int, bf16: bool = False):
    """Greedy continuations of equal-length prompts with a KV cache.

    Parameters
    ----------
    model : Transformer (torch)
    prompts : LongTensor of shape (B, P)
    n_new : int

    Returns
    -------
    LongTensor of shape (B, n_new)
    """
    torch = _torch()
    model.eval()
    out = []
    with torch.no_grad(), _autocast(bf16):
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


def _set_threads(n: int) -> None:
    torch = _torch()
    torch.set_num_threads(max(1, n))


def _adamw(params, lr: float, wd: float):
    torch = _torch()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )


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

    def eta(self) -> float:
        """Seconds left."""
        el = time.time() - self.t0
        f = self.fraction()
        return el / max(f, 1e-9) * (1 - f) if f > 0 else float("nan")


# ----------------------------------------------------------------------------------------------
# Target
# ----------------------------------------------------------------------------------------------


def train_target(args) -> None:
    """Train the target byte LM on the standard library and export it (see ``main``)."""
    torch = _torch()
    import torch.nn.functional as F

    from .corpus import load_tokens

    _set_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_dim=args.ffn_dim,
                       max_seq_len=args.max_seq_len, qk_norm=args.qk_norm,
                       tie_embeddings=not args.untied)
    model = build_transformer(cfg, seed=args.seed)
    train = load_tokens("train")
    val = load_tokens("validation")
    prog = Progress(args.name, Budget(args.steps, args.minutes), every=args.log_every)
    if args.init:
        init, icfg = load_transformer_npz(args.init)
        if icfg != cfg:
            raise ValueError(f"--init {args.init} has config {icfg}, expected {cfg}")
        model.load_state_dict(init.state_dict())
        prog.log(f"initialised from {args.init}")
    prog.log(f"config {json.dumps(cfg)}")
    prog.log(f"params {n_params(model):,}; train tokens {len(train):,}; val tokens {len(val):,}")
    opt = _adamw(list(model.parameters()), args.lr, args.wd)
    rng = np.random.default_rng(args.seed if args.data_seed is None else args.data_seed)

    ema = None

    def step_fn():
        nonlocal ema
        x, y = _batch(train, rng, args.batch, args.seq)
        with _autocast(args.bf16):
            logits, _ = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        value = loss.item()
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        return {"loss": value, "ema_bpb": ema / math.log(2)}

    _lm_loop(args, prog, opt, model, cfg, val, step_fn)


def _lm_loop(args, prog, opt, model, cfg, val, step_fn) -> None:
    """Run ``step_fn`` (one optimizer step; returns the progress fields) until the budget ends.

    Sets the learning rate of every step, evaluates validation bits/byte every
    ``--eval-every`` steps, exports every ``--export-every`` minutes and at the end (plus a
    float32 copy with ``--fp32-copy``), then logs the final float32 validation figure.
    """
    budget = prog.budget
    budget.start()
    prog.start()
    last_export = time.time()
    step = 0
    while not budget.done():
        lr = budget.lr(args.lr, args.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        fields = step_fn()
        step = budget.step = budget.step + 1
        prog.update(step, args.batch * args.seq, **fields, lr=lr)
        if step % args.eval_every == 0:
            bpb = evaluate_bpb(model, val, seq=args.seq, max_windows=args.eval_windows,
                               bf16=args.bf16)
            prog.log(f"step {step} val_bpb {bpb:.4f}")
        if time.time() - last_export > args.export_every * 60:
            export_npz(model, cfg, args.out)
            last_export = time.time()
            prog.log(f"exported {args.out} at step {step}")
    export_npz(model, cfg, args.out)
    prog.log(f"exported {args.out} at step {step} (final)")
    if args.fp32_copy:
        export_npz(model, cfg, args.fp32_copy, dtype="float32")
    bpb = evaluate_bpb(model, val, seq=512, max_windows=args.final_eval_windows, bf16=False)
    prog.log(f"final val_bpb (fp32, seq 512, {args.final_eval_windows} windows) {bpb:.4f}")
    prog.log(f"done: {step} steps, {step * args.batch * args.seq:,} tokens, "
             f"{(time.time() - prog.t0) / 60:.1f} min")


# ----------------------------------------------------------------------------------------------
# Draft (distilled from the target)
# ----------------------------------------------------------------------------------------------


def _frozen_target(path):
    """Load the target ``.npz`` for distillation or DFlash training: eval mode, no gradients."""
    target, tcfg = load_transformer_npz(path)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target, tcfg


def train_draft(args) -> None:
    """Train the 1-layer draft model by distillation from the target (see ``main``)."""
    torch = _torch()
    import torch.nn.functional as F

    from .corpus import load_tokens

    _set_threads(args.threads)
    torch.manual_seed(args.seed)
    target, tcfg = _frozen_target(args.target)
    cfg = model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_dim=args.ffn_dim,
                       max_seq_len=tcfg["max_seq_len"], qk_norm=args.qk_norm,
                       tie_embeddings=not args.untied)
    model = build_transformer(cfg, seed=args.seed)
    if args.init:
        init, icfg = load_transformer_npz(args.init)
        if icfg != cfg:
            raise ValueError(f"--init {args.init} has config {icfg}, expected {cfg}")
        model.load_state_dict(init.state_dict())
    elif args.init_embed and cfg["dim"] == tcfg["dim"]:
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    train = load_tokens("train")
    val = load_tokens("validation")
    prog = Progress(args.name, Budget(args.steps, args.minutes), every=args.log_every)
    prog.log(f"config {json.dumps(cfg)}")
    prog.log(f"params {n_params(model):,}; distilling from {args.target} (alpha_kd {args.kd})")
    opt = _adamw(list(model.parameters()), args.lr, args.wd)
    rng = np.random.default_rng(args.seed if args.data_seed is None else args.data_seed)

    def step_fn():
        x, y = _batch(train, rng, args.batch, args.seq)
        with torch.no_grad(), _autocast(args.bf16):
            tlogits, _ = target(x)
        with _autocast(args.bf16):
            logits, _ = model(x)
        lf = logits.float().reshape(-1, logits.shape[-1])
        ce = F.cross_entropy(lf, y.reshape(-1))
        tp = F.softmax(tlogits.float().reshape(-1, lf.shape[-1]), -1)
        kd = F.kl_div(F.log_softmax(lf, -1), tp, reduction="batchmean")
        loss = args.kd * kd + (1 - args.kd) * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        return {"ce_bpb": ce.item() / math.log(2), "kl": kd.item()}

    _lm_loop(args, prog, opt, model, cfg, val, step_fn)


# ----------------------------------------------------------------------------------------------
# DFlash
# ----------------------------------------------------------------------------------------------


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
    torch = _torch()
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
    torch = _torch()
    import torch.nn.functional as F

    mods = _modules()
    rope_cos_sin, apply_rope = mods["rope_cos_sin"], mods["apply_rope"]
    cfg = target.cfg
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
    with torch.no_grad(), _autocast(bf16):
        for k in range(2, block_size):
            pos = anchors + (k - 1)  # positions of `cur`
            cos, sin = rope_cos_sin(pos, cfg["head_dim"], cfg["rope_theta"])
            cos, sin = cos[:, None], sin[:, None]  # (Bt, 1, m, D)
            x = target.model.embed_tokens(cur)  # (Bt, m, dim)
            mask = torch.cat([win_mask] + [eye] * (k - 1), dim=2)[:, None]
            for li, layer in enumerate(target.model.layers):
                h = layer.input_layernorm(x)
                q, kk, vv = layer.self_attn.qkv(h)
                q, kk = apply_rope(q, cos, sin), apply_rope(kk, cos, sin)
                new_k[li].append(kk)
                new_v[li].append(vv)
                K = torch.cat([cache[li][0].to(kk.dtype)] + new_k[li], dim=2)
                V = torch.cat([cache[li][1].to(vv.dtype)] + new_v[li], dim=2)
                x = x + layer.self_attn.attend(q, K, V, mask=mask)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
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
    torch = _torch()
    import torch.nn.functional as F

    Bs = dcfg["block_size"]
    taps = dcfg["tap_layers"]
    Bt, T = seqs.shape
    m = anchors.shape[1]
    if tap is None:
        with torch.no_grad(), _autocast(bf16):
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
    with _autocast(bf16):
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
    torch = _torch()
    taps = dcfg["tap_layers"]
    with torch.no_grad(), _autocast(bf16):
        cache: list = []
        logits, hid = target(seqs, cache=cache, hidden_layers=set(taps))
        tap = torch.cat([hid[t].float() for t in taps], dim=-1)
    labels = branch_greedy_labels(target, seqs, anchors, logits, cache, dcfg["block_size"], bf16)
    return tap, labels


def dflash_loss(logits, labels, gamma_w: float = 4.0):
    """Weighted cross-entropy: block row k = 1..B-1 weighs exp(-(k-1)/gamma_w).

    Returns (loss, hits) with hits the (Bt, m, B-1) float tensor of argmax matches.
    """
    torch = _torch()
    import torch.nn.functional as F

    Bs = logits.shape[2]
    lg, lab = logits[:, :, 1:], labels[:, :, 1:]
    w = torch.exp(-torch.arange(Bs - 1, dtype=torch.float32) / gamma_w)
    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1), reduction="none")
    ce = ce.reshape(lab.shape)
    loss = (ce * w).sum() / (w.sum() * lab.shape[0] * lab.shape[1])
    hits = (lg.detach().argmax(-1) == lab).float()
    return loss, hits


def _sample_anchors(rng, rows_plen, T: int, m: int, mismatch, mismatch_frac: float):
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


def _miss_anchors(dmodel, target, dcfg, seqs, plens, tap, anchors, miss_frac: float, rng,
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
    torch = _torch()
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


def _dflash_rows(rng, batch: int, T: int, episodes, corpus: np.ndarray, episode_frac: float):
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
    torch = _torch()
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
                    seqs, plens = _dflash_rows(rng, nb, T, ([], []), corpus, 0.0)
                st = torch.from_numpy(seqs)
                with torch.no_grad():
                    lg, _ = target(st)
                mismatch = np.zeros(seqs.shape, dtype=bool)
                mismatch[:, 1:] = (lg[:, :-1].argmax(-1) != st[:, 1:]).numpy()
                anchors = torch.from_numpy(_sample_anchors(
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


def train_dflash(args) -> None:
    """Train the DFlash drafter on the target's own greedy continuations (see ``main``)."""
    torch = _torch()

    from .corpus import load_tokens

    _set_threads(args.threads)
    torch.manual_seed(args.seed)
    target, tcfg = _frozen_target(args.target)
    dcfg = dflash_config(tcfg, n_layers=args.layers, block_size=args.block_size,
                         tap_layers=args.tap_layers or None)
    dmodel = build_dflash(dcfg, tcfg, seed=args.seed)
    if args.init:
        init, icfg = load_dflash_npz(args.init, tcfg)
        if icfg != dcfg:
            raise ValueError(f"--init {args.init} has config {icfg}, expected {dcfg}")
        dmodel.load_state_dict(init.state_dict())
    else:
        with torch.no_grad():  # start on the target's output scale (the head is the target's)
            dmodel.norm.weight.copy_(target.model.norm.weight)
    prog = Progress(args.name, Budget(args.steps, args.minutes), every=args.log_every)
    prog.log(f"config {json.dumps(dcfg)}")
    prog.log(f"params {n_params(dmodel):,}")
    rng = np.random.default_rng(args.seed)
    train_tok = load_tokens("train")
    val_tok = load_tokens("validation")
    T = args.seq
    cache = Path(args.episodes_cache) if args.episodes_cache else None
    if cache is not None and cache.exists():
        with np.load(cache) as z:
            tr = (z["tr_seq"].astype(np.int64), z["tr_plen"])
            va = (z["va_seq"].astype(np.int64), z["va_plen"])
        prog.log(f"loaded {len(tr[0])} + {len(va[0])} greedy episodes from {cache}")
    else:
        t0 = time.time()
        va = make_greedy_episodes(target, val_tok, args.val_episodes, rng, T, args.prompt_min,
                                  args.prompt_max, args.gen_batch, args.target_bf16)
        tr = make_greedy_episodes(target, train_tok, args.episodes, rng, T, args.prompt_min,
                                  args.prompt_max, args.gen_batch, args.target_bf16, prog)
        prog.log(f"generated {len(tr[0])} + {len(va[0])} greedy episodes "
                 f"in {time.time() - t0:.0f} s")
        if cache is not None:
            np.savez(cache, tr_seq=tr[0].astype(np.int16), tr_plen=tr[1],
                     va_seq=va[0].astype(np.int16), va_plen=va[1])
    params = list(dmodel.parameters())
    opt = _adamw(params, args.lr, args.wd)
    m = args.anchors

    def step_fn():
        seqs, plens = _dflash_rows(rng, args.batch, T, tr, train_tok, args.episode_frac)
        st = torch.from_numpy(seqs)
        with torch.no_grad(), _autocast(args.target_bf16):
            cache_: list = []
            logits, hid = target(st, cache=cache_, hidden_layers=set(dcfg["tap_layers"]))
            tap = torch.cat([hid[t].float() for t in dcfg["tap_layers"]], dim=-1)
        mismatch = np.zeros(seqs.shape, dtype=bool)
        mismatch[:, 1:] = (logits[:, :-1].float().argmax(-1) != st[:, 1:]).numpy()
        anchors = torch.from_numpy(_sample_anchors(rng, plens, T, m, mismatch,
                                                   args.mismatch_frac))
        if args.miss_frac > 0:
            anchors = _miss_anchors(dmodel, target, dcfg, st, plens, tap, anchors,
                                    args.miss_frac, rng, args.bf16)
        labels = branch_greedy_labels(target, st, anchors, logits, cache_,
                                      dcfg["block_size"], args.target_bf16)
        lg = dflash_packed_logits(dmodel, target, dcfg, st, anchors, args.bf16, tap=tap)
        loss, hits = dflash_loss(lg, labels, args.gamma_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        return loss.item(), float(hits[:, :, 0].mean()), float(hits.mean())

    budget = prog.budget
    budget.start()
    prog.start()
    last_export = time.time()
    step = 0
    while not budget.done():
        lr = budget.lr(args.lr, args.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, acc1, acc = step_fn()
        step = budget.step = budget.step + 1
        prog.update(step, args.batch * m * dcfg["block_size"], loss=loss, acc1=acc1, acc=acc,
                    lr=lr)
        if step % args.eval_every == 0:
            ev = evaluate_dflash(dmodel, target, dcfg, va, val_tok, n_rows=args.eval_rows)
            prog.log(f"step {step} eval {json.dumps(ev)}")
        if time.time() - last_export > args.export_every * 60:
            export_npz(dmodel, dcfg, args.out)
            last_export = time.time()
            prog.log(f"exported {args.out} at step {step}")
    total = step
    export_npz(dmodel, dcfg, args.out)
    prog.log(f"exported {args.out} at step {step} (final)")
    if args.fp32_copy:
        export_npz(dmodel, dcfg, args.fp32_copy, dtype="float32")
    ev = evaluate_dflash(dmodel, target, dcfg, va, val_tok, n_rows=args.final_eval_rows)
    prog.log(f"final eval (fp32, held-out) {json.dumps(ev)}")
    prog.log(f"done: {total} steps, {(time.time() - prog.t0) / 60:.1f} min")



# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


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
    data = Path(__file__).resolve().parent / "data"
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
    if args.cmd == "target":
        train_target(args)
    elif args.cmd == "draft":
        train_draft(args)
    else:
        train_dflash(args)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
