"""PyTorch twins of fastspec's forward passes, for training (the ``[train]`` extra).

The Llama-style target/draft transformer and the DFlash block-diffusion drafter of
``docs/FORMATS.md``. Attribute names follow the Hugging Face keys of that format, so
``state_dict()`` is the weight file (:mod:`fastspec.training.weights` checks it against
fastspec's own schema).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["RMSNorm", "rope_cos_sin", "apply_rope", "Attention", "MLP", "DecoderLayer",
           "Transformer", "DFlash", "build_transformer", "build_dflash", "n_params", "autocast"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_cos_sin(positions, head_dim: int, theta: float, freq_factors=None,
                 attention_factor=None, rope_dims=None):
    """cos, sin of shape positions.shape + (head_dim,) (HF rotate-half layout); frequency ``i``
    divided by ``freq_factors[i]`` when given (``rope_freq_factors``, Llama 3.1+), both
    multiplied by ``attention_factor`` when given (``rope_attention_factor``, LongRoPE); with
    ``rope_dims`` (partial rotary) the pairs past ``rope_dims // 2`` get cos 1, sin 0, as
    :func:`fastspec.model.functional.rope_tables` gives them."""
    r = rope_dims or head_dim
    inv_freq = theta ** (-torch.arange(0, r // 2, dtype=torch.float64) * 2.0 / r)
    if freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(freq_factors, dtype=torch.float64)
    ang = positions.to(torch.float64)[..., None] * inv_freq
    m = 1.0 if attention_factor is None else float(attention_factor)
    cos, sin = torch.cos(ang) * m, torch.sin(ang) * m
    rest = ang.shape[:-1] + (head_dim // 2 - r // 2,)
    cos = torch.cat([cos, cos.new_ones(rest)], dim=-1)
    sin = torch.cat([sin, sin.new_zeros(rest)], dim=-1)
    return torch.cat([cos, cos], dim=-1).float(), torch.cat([sin, sin], dim=-1).float()


def apply_rope(x, cos, sin):
    """Rotate x (..., T, D) by cos/sin broadcastable to it."""
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
    """A gated MLP: SwiGLU, or GeGLU (``geglu``: GELU's tanh form, Gemma's)."""

    def __init__(self, dim, ffn_dim, geglu: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)
        self.geglu = geglu

    def forward(self, x):
        g = self.gate_proj(x)
        g = F.gelu(g, approximate="tanh") if self.geglu else F.silu(g)
        return self.down_proj(g * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm layer; the target's and the DFlash drafter's have the same weights.
    ``post_norms``: Gemma's sandwich norms on the attention's and the MLP's outputs."""

    def __init__(self, dim, n_heads, n_kv_heads, head_dim, ffn_dim, qk_norm, eps,
                 geglu: bool = False, post_norms: bool = False):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Attention(dim, n_heads, n_kv_heads, head_dim, qk_norm, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, ffn_dim, geglu)
        if post_norms:  # fastspec's keys (fastspec.model.schema)
            self.post_attn_norm = RMSNorm(dim, eps)
            self.post_mlp_norm = RMSNorm(dim, eps)
        self.post_norms = post_norms

    def add_attention(self, x, a):
        """The residual stream ``x`` plus the attention's output ``a`` (normed by
        ``post_attn_norm`` with sandwich norms)."""
        return x + (self.post_attn_norm(a) if self.post_norms else a)

    def add_mlp(self, x):
        """The residual stream ``x`` plus the MLP's output on it."""
        f = self.mlp(self.post_attention_layernorm(x))
        return x + (self.post_mlp_norm(f) if self.post_norms else f)


class _LlamaBody(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["dim"])
        self.layers = nn.ModuleList(
            DecoderLayer(cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"],
                         cfg["ffn_dim"], cfg["qk_norm"], cfg["norm_eps"],
                         cfg.get("activation") == "geglu", bool(cfg.get("post_norms")))
            for _ in range(cfg["n_layers"])
        )
        self.norm = RMSNorm(cfg["dim"], cfg["norm_eps"])


class Transformer(nn.Module):
    """Llama-style causal LM; ``state_dict()`` keys are the HF keys of FORMATS.md."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        self.model = _LlamaBody(cfg)
        if not cfg["tie_embeddings"]:
            self.lm_head = nn.Linear(cfg["dim"], cfg["vocab_size"], bias=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg["tie_embeddings"] else self.lm_head.weight

    def rope_tables(self, pos):
        """The RoPE tables of positions ``pos``: ``(cos, sin)`` of the model's base and of
        ``local_rope_theta`` (None without ``local_layers``), for :meth:`layer_rope`."""
        c = self.cfg
        extra = (c.get("rope_attention_factor"), c.get("rope_dims"))
        main = rope_cos_sin(pos, c["head_dim"], c["rope_theta"], c.get("rope_freq_factors"),
                            *extra)
        local = (rope_cos_sin(pos, c["head_dim"], c["local_rope_theta"], None, *extra)
                 if c.get("local_layers") else None)
        return main, local

    def layer_rope(self, layer: int, tables):
        """``(cos, sin)`` that turn layer ``layer``'s queries and keys (of
        :meth:`rope_tables`), or None for a ``nope_layers`` one."""
        if layer in (self.cfg.get("nope_layers") or ()):
            return None
        return tables[1] if layer in (self.cfg.get("local_layers") or ()) else tables[0]

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Return the embedding rows of ``ids`` (B, T) -> (B, T, dim), times the config's
        ``embedding_scale`` when set (Granite's multiplier)."""
        x = self.model.embed_tokens(ids)
        scale = self.cfg.get("embedding_scale")
        return x if scale is None else x * scale

    def forward(self, ids, start: int = 0, cache=None, hidden_layers=(), return_logits=True):
        """Run `ids` (B, T) at positions start..start+T-1.

        cache : None (no cache; start must be 0) or a list of [k, v] per layer holding
            positions < start, extended in place. Returns (logits (B, T, V) or None,
            {layer: hidden (B, T, dim)}).
        """
        B, T = ids.shape
        x = self.embed_ids(ids)
        tables = self.rope_tables(torch.arange(start, start + T, device=ids.device))
        hidden = {}
        for li, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            q, k, v = layer.self_attn.qkv(h)
            turn = self.layer_rope(li, tables)
            if turn is not None:
                q, k = apply_rope(q, *turn), apply_rope(k, *turn)
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
            x = layer.add_mlp(layer.add_attention(x, a))
            if li in hidden_layers:
                hidden[li] = x
        logits = None
        if return_logits:
            logits = F.linear(self.model.norm(x), self.head_weight())
        return logits, hidden


class DFlash(nn.Module):
    """DFlash drafter with KV injection; ``state_dict()`` keys are those of FORMATS.md."""

    def __init__(self, dcfg, target_cfg):
        super().__init__()
        self.cfg = dict(dcfg)
        dim = target_cfg["dim"]
        self.fc = nn.Linear(len(dcfg["tap_layers"]) * dim, dim, bias=False)
        self.hidden_norm = RMSNorm(dim, dcfg["norm_eps"])
        self.layers = nn.ModuleList(
            DecoderLayer(dim, dcfg["n_heads"], dcfg["n_kv_heads"], dcfg["head_dim"],
                         dcfg["ffn_dim"], dcfg["qk_norm"], dcfg["norm_eps"])
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
        f = self.cfg.get("rope_freq_factors")  # the drafter's own (None: plain RoPE)
        cq, sq = rope_cos_sin(block_pos, D, th, f)
        ck, sk = rope_cos_sin(ctx_pos, D, th, f)
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
            x = layer.add_mlp(x + att.attend(q, k, v, mask=mask))
        return F.linear(self.norm(x), head_weight)


def _init_weights(module, n_layers: int, seed: int) -> None:
    """Norms 1; matrices N(0, 0.02), residual outputs scaled by 1/sqrt(2 n_layers); seeded."""
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


def build_transformer(cfg: dict[str, Any], seed: int = 0) -> Transformer:
    """Return a freshly initialised torch ``Transformer`` for `cfg` (seeded)."""
    m = Transformer(cfg)
    _init_weights(m, cfg["n_layers"], seed)
    return m


def build_dflash(dcfg: dict[str, Any], target_cfg: dict[str, Any], seed: int = 0) -> DFlash:
    """Return a freshly initialised torch ``DFlash`` drafter (seeded)."""
    m = DFlash(dcfg, target_cfg)
    _init_weights(m, dcfg["n_layers"], seed)
    return m


def n_params(module) -> int:
    """Return the number of parameters of a torch module."""
    return int(sum(p.numel() for p in module.parameters()))


def autocast(enabled: bool):
    """bfloat16 autocast on the CPU when `enabled`, else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)
