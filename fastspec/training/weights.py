"""Configs and weight files of the trainer: the fastspec ``.npz`` format (docs/FORMATS.md).

Configs are plain dicts with exactly the JSON keys of that format. Weight files hold a
``"config"`` key (JSON) and the weights under their Hugging Face names; they are read with
fastspec's bounded reader (:func:`fastspec.formats.npz.read_npz`), never with ``np.load``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from fastspec.formats import json_io
from fastspec.formats.npz import read_npz
from fastspec.drafters.dflash_config import CONTEXT_WINDOW_KEY
from fastspec.model import ModelConfig, Transformer as NumpyTransformer
from fastspec.text.tokenizer import ByteTokenizer
from fastspec.training.modules import DFlash, Transformer

__all__ = ["model_config", "dflash_config", "export_npz", "load_transformer_npz",
           "load_dflash_npz", "check_schema"]

TOK = ByteTokenizer()


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


# --- THE WEIGHT SCHEMA SPOT -------------------------------------------------------------------
# The torch modules name their parameters after the Hugging Face keys. This function is the one
# place where the trainer's weights meet fastspec's schema, on every export and load: a
# target/draft state dict must have exactly the keys and shapes of fastspec.model's
# Transformer.from_state_dict(...).state_dict(). DFlash files are not checked here yet
# (DFlashModel.from_state_dict needs a target model); point this at the shared schema when
# there is one.

def check_schema(state: dict[str, np.ndarray], cfg: dict[str, Any]) -> None:
    """Raise ValueError unless `state` has the keys and shapes fastspec reads for `cfg`.

    Only target/draft configs (those with ``"vocab_size"``) are checked; see the note above.
    """
    if "vocab_size" not in cfg:
        return
    try:
        ref = NumpyTransformer.from_state_dict(ModelConfig.from_dict(cfg), state).state_dict()
    except KeyError as exc:
        raise ValueError(f"weights do not follow fastspec's schema: {exc}") from None
    extra = sorted(set(state) - set(ref))
    if extra:
        raise ValueError(f"weights do not follow fastspec's schema: unknown tensors {extra}")
    for key, a in ref.items():
        if a.shape != state[key].shape:
            raise ValueError(f"weights do not follow fastspec's schema: {key} has shape "
                             f"{state[key].shape}, expected {a.shape}")


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
    state = {k: v.detach().float().cpu().numpy().astype(dtype)
             for k, v in module.state_dict().items()}
    check_schema(state, cfg)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, config=np.array(json_io.dumps(cfg, sort_keys=True)), **state)
    os.replace(tmp, path)
    return path


def _read(path: str | Path, kind: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    cfg, state = read_npz(path, kind)  # bounded: validates every header before reading
    check_schema(state, cfg)
    return cfg, {k: torch.from_numpy(v.astype(np.float32)) for k, v in state.items()}


def load_transformer_npz(path: str | Path) -> tuple[Transformer, dict[str, Any]]:
    """Return (torch Transformer in float32, config) from a fastspec ``.npz``."""
    cfg, state = _read(path, "model")
    m = Transformer(cfg)
    m.load_state_dict(state)
    return m, cfg


def load_dflash_npz(path: str | Path, target_cfg: dict[str, Any]) -> tuple[DFlash, dict[str, Any]]:
    """Return (torch DFlash in float32, config) from a fastspec ``.npz``."""
    cfg, state = _read(path, "DFlash")
    cfg.pop(CONTEXT_WINDOW_KEY, None)  # not the module's: the trainer sets it on export
    m = DFlash(cfg, target_cfg)
    m.load_state_dict(state)
    return m, cfg
