"""z-lab's DFlash drafter folders (``dflash`` 0.1.0, ``DFlashDraftModel``) in and out.

A folder holds a Qwen3-style ``config.json`` with the drafter's shape (``hidden_size``,
``num_hidden_layers`` = draft layers, heads, ``intermediate_size``, ``rms_norm_eps``,
``rope_theta``, and ``"linear"`` or Llama 3.1's ``"llama3"`` RoPE scaling when it has one,
read as :mod:`fastspec.formats.hf_rope` reads a model's), ``block_size``, ``num_target_layers`` and
``dflash_config: {target_layer_ids, mask_token_id}`` (optionally ``input_embedding_scale``,
``output_multiplier``, ``final_logit_softcapping``), and ``model.safetensors`` with
``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and ``layers.N.*`` (Qwen3 layer names,
``(out, in)`` layout). The drafter shares the target's embedding and head.

Conventions of the reference implementation, and how fastspec maps them:

- ``target_layer_ids``: the reference reads ``hidden_states[id + 1]`` of ``transformers``,
  the output of layer ``id``: fastspec's tap ``id``. For the last layer that entry is taken
  after the target's final norm (``DFlashConfig.last_tap_normed``).
- The block ``[last token, MASK ...]`` sits at the positions after the context; every block
  query attends, without a mask, to the K/V of all context features and of the whole block,
  with Qwen3's per-head q/k RMSNorm (on context keys too) and RoPE at absolute positions.

``config.json`` written by :func:`save_dflash_folder` also holds ``fastspec_target``, a
fingerprint of the target (shape and projections of a few embedding rows), so that loading
the drafter against another target of the same shape is refused instead of drafting noise.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from typing import TYPE_CHECKING, Any

import numpy as np

from fastspec.formats import json_io
from fastspec.formats.json_io import read_json_object
from fastspec.formats.hf_folder import weight_files, read_safetensors, write_safetensors
from fastspec.formats.hf_rope import (DRAFTER_SCALINGS, linear_factor, partial_rotary_factor,
                                      rope_freq_factors, rope_theta)
from fastspec.model.schema import hf_layer_keys, layer_attrs

if TYPE_CHECKING:  # annotations only
    from fastspec.model.transformer import Transformer

__all__ = ["read_dflash_folder", "save_dflash_folder", "target_fingerprint", "fingerprint_array",
           "check_fingerprint_array"]

#: Keys of a DFlash 2 config (candidate selector, dynamic convolutions).
_DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_FINGERPRINT_ROWS = 8


def target_fingerprint(target: Transformer) -> dict:
    """Return a JSON-able identity of ``target``: its shape and ``8`` embedding-row projections.

    The projections (rows spread over the vocabulary, dotted with a fixed +-1 vector) survive
    a bf16/float16/float32 conversion within about 1%, while another target's differ by O(1).
    """
    c = target.config
    rows = np.linspace(0, c.vocab_size - 1, _FINGERPRINT_ROWS).round().astype(np.int64)
    signs = np.where(np.random.default_rng(0).random(c.dim) < 0.5, -1.0, 1.0)
    embed = target.embed  # a quantized embedding (QuantMatrix) dequantizes the rows
    picked = embed.rows(rows) if hasattr(embed, "in_features") else embed[rows]
    proj = np.asarray(picked, dtype=np.float64) @ signs / math.sqrt(c.dim)
    return {"vocab_size": c.vocab_size, "hidden_size": c.dim, "num_hidden_layers": c.n_layers,
            "embed_projections": [float(f"{v:.6g}") for v in proj]}


def fingerprint_array(target: Transformer) -> np.ndarray:
    """:func:`target_fingerprint` as a float64 array (the ``.npz`` member
    ``target_fingerprint``): ``[vocab_size, hidden_size, num_hidden_layers, projections...]``."""
    fp = target_fingerprint(target)
    return np.array([fp["vocab_size"], fp["hidden_size"], fp["num_hidden_layers"],
                     *fp["embed_projections"]], dtype=np.float64)


def check_fingerprint_array(saved: np.ndarray, target: Transformer, where: str) -> None:
    """Check a :func:`fingerprint_array` read from ``where`` against ``target``."""
    a = np.asarray(saved, dtype=np.float64).reshape(-1)
    if a.shape[0] != 3 + _FINGERPRINT_ROWS:
        raise ValueError(f"{where}: target_fingerprint must hold {3 + _FINGERPRINT_ROWS} values, "
                         f"got {a.shape[0]}")
    _check_fingerprint({"vocab_size": int(a[0]), "hidden_size": int(a[1]),
                        "num_hidden_layers": int(a[2]), "embed_projections": a[3:].tolist()},
                       target, where)


def _check_fingerprint(saved, target: Transformer, where: str) -> None:
    mine = target_fingerprint(target)
    if not isinstance(saved, dict) or not isinstance(saved.get("embed_projections"), list):
        raise ValueError(f"{where}: fastspec_target must be an object with embed_projections")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers"):
        if saved.get(key) != mine[key]:
            raise ValueError(f"{where}: fastspec_target.{key} = {saved.get(key)}, but the target "
                             f"has {mine[key]}: this drafter was built for another target model")
    a = np.asarray(saved["embed_projections"], dtype=np.float64)
    b = np.asarray(mine["embed_projections"])
    scale = max(float(np.abs(a).max(initial=0.0)), 1e-30)
    if a.shape != b.shape or not np.allclose(a, b, rtol=2e-2, atol=2e-2 * scale):
        raise ValueError(f"{where}: fastspec_target.embed_projections do not match the target's "
                         "embedding: this drafter was built for another target model (same "
                         "shape, other weights); its drafts would mostly be rejected")


def _field(cfg: dict, name: str, where: str, kind=int, default=None):
    value = cfg.get(name, default)
    if value is None:
        raise ValueError(f"{where}: missing field {name}")
    if kind is int and type(value) is not int:
        raise ValueError(f"{where}: {name} must be an int, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{where}: {name} must be a number, got {value!r}")
    return value


def read_dflash_config(folder: Path, target: Transformer, max_block: int) -> dict[str, Any]:
    """Map z-lab's ``config.json`` to the fields of a :class:`fastspec.DFlashConfig`, checked
    against ``target`` (and ``block_size`` against ``max_block``)."""
    path = folder / "config.json"
    cfg = read_json_object(path)
    if cfg is None:
        raise ValueError(f"{folder}: no config.json (not a DFlash drafter folder)")
    archs = cfg.get("architectures") or []
    dc = cfg.get("dflash_config")
    if any("DFlash2" in str(a) for a in archs) or (
            isinstance(dc, dict) and any(k in dc for k in _DFLASH2_KEYS)):
        raise ValueError(f"{path}: a DFlash 2 drafter (DFlash2DraftModel: candidate selector and "
                         "dynamic convolutions) is not supported yet; use a DFlash 1 drafter "
                         "(DFlashDraftModel)")
    if not isinstance(dc, dict):
        raise ValueError(f"{path}: missing field dflash_config (an object with target_layer_ids "
                         "and mask_token_id); is this a DFlash drafter?")
    t = target.config
    L, V, d = t.n_layers, t.vocab_size, t.dim
    for name, want in (("hidden_size", d), ("vocab_size", V)):
        got = _field(cfg, name, str(path))
        if got != want:
            raise ValueError(f"{path}: {name} = {got}, but the target has {want}: the drafter "
                             "does not fit this target")
    n_target = cfg.get("num_target_layers", dc.get("num_target_layers"))
    if n_target is not None and n_target != L:
        raise ValueError(f"{path}: num_target_layers = {n_target}, but the target has {L} "
                         "layers: the drafter was built for another target model")
    taps = dc.get("target_layer_ids")
    if taps is None:
        raise ValueError(f"{path}: missing field dflash_config.target_layer_ids")
    if (not isinstance(taps, list) or not taps or not all(type(i) is int for i in taps)
            or not all(0 <= i < L for i in taps) or len(set(taps)) != len(taps)):
        raise ValueError(f"{path}: dflash_config.target_layer_ids = {taps!r} must be distinct "
                         f"layer indices in [0, {L}) of the target ({L} layers)")
    mask = _field(dc, "mask_token_id", f"{path}: dflash_config")
    if not 0 <= mask < V:
        raise ValueError(f"{path}: dflash_config.mask_token_id = {mask} is outside the target "
                         f"vocabulary [0, {V})")
    block = dc.get("block_size", cfg.get("block_size", 16))  # the reference's default
    if type(block) is not int or not 2 <= block <= max_block:
        raise ValueError(f"{path}: block_size = {block!r} must be an int in [2, {max_block}]")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"{path}: hidden_act = {cfg['hidden_act']!r} (only silu)")
    if cfg.get("attention_bias"):
        raise ValueError(f"{path}: attention_bias = true is not supported")
    if partial_rotary_factor(cfg) != 1:
        raise ValueError(f"{path}: partial_rotary_factor = {partial_rotary_factor(cfg)!r} is not "
                         "supported (draft layers turn the whole head)")
    types = cfg.get("layer_types") or []
    if cfg.get("is_causal") or "sliding_attention" in types:
        raise ValueError(f"{path}: causal or sliding-window draft layers (is_causal, "
                         "layer_types) are not supported")
    heads = _field(cfg, "num_attention_heads", str(path))
    head_dim = int(cfg.get("head_dim") or d // heads)
    scale = lambda name, default: float(_field(  # noqa: E731
        dc, name, f"{path}: dflash_config", float, cfg.get(name, default)) or 0.0)
    return dict(
        block_size=block, n_layers=_field(cfg, "num_hidden_layers", str(path)),
        tap_layers=tuple(taps), n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        ffn_dim=_field(cfg, "intermediate_size", str(path)), qk_norm=True,
        rope_theta=rope_theta(cfg, DRAFTER_SCALINGS),  # checked before the factors are read
        rope_freq_factors=rope_freq_factors(cfg, head_dim),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        mask_token_id=mask, last_tap_normed=True,
        input_embedding_scale=scale("input_embedding_scale", 1.0),
        output_multiplier=scale("output_multiplier", 1.0),
        final_logit_softcapping=scale("final_logit_softcapping", 0.0))


def read_dflash_folder(folder: str | os.PathLike, target: Transformer, max_block: int
                       ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a z-lab DFlash drafter folder for ``target``: the fields of its
    :class:`fastspec.DFlashConfig` and its tensors (see the module notes);
    :meth:`fastspec.DFlashModel.load` builds the drafter from them.

    Raises
    ------
    ValueError
        A missing or malformed field, a drafter that does not fit ``target`` (vocabulary,
        hidden size, target_layer_ids, num_target_layers, fingerprint), a DFlash 2 drafter,
        missing or extra tensors; file and field named.
    NotImplementedError
        ``input_embedding_scale``, ``output_multiplier`` or ``final_logit_softcapping`` set to
        other values than 1, 1, 0 (see :class:`~fastspec.DFlashConfig`).
    """
    folder = Path(folder)
    config = read_dflash_config(folder, target, max_block)
    cfg = read_json_object(folder / "config.json") or {}
    if "fastspec_target" in cfg:
        _check_fingerprint(cfg["fastspec_target"], target, str(folder / "config.json"))
    files = weight_files(folder)
    attrs = layer_attrs(swiglu=True, rmsnorm=True, qk_norm=True, qkv_bias=False)
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        key for i in range(config["n_layers"]) for key in hf_layer_keys(f"layers.{i}.", attrs)}
    extra = sorted(set(files) - expected)
    if extra:
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise ValueError(f"{folder}: unexpected tensors {extra[:5]}{more} (not a DFlash 1 "
                         "drafter?)")
    missing = sorted(expected - set(files))
    if missing:
        raise ValueError(f"{folder}: missing tensors {missing[:5]}")
    by_file: dict[Path, list[str]] = {}
    for name in sorted(expected):
        by_file.setdefault(files[name], []).append(name)
    sd: dict[str, np.ndarray] = {}
    for path, names in by_file.items():
        sd.update(read_safetensors(path, names, dtype=target.config.dtype))
    return config, sd


def save_dflash_folder(model: Any, folder: str | os.PathLike) -> None:
    """Write ``model`` (a :class:`fastspec.DFlashModel`) as a z-lab folder (``config.json`` +
    ``model.safetensors``).

    Raises
    ------
    ValueError
        A drafter the format cannot express: without ``qk_norm`` (z-lab's layers always have
        it), tapping the target's last layer before the final norm (z-lab taps it after), or
        with per-frequency ``rope_freq_factors`` (the folder states the scaling's parameters,
        which llama3's divisors do not give back; equal divisors are linear scaling).
    """
    c, t = model.config, model.target.config
    if not c.qk_norm:
        raise ValueError("z-lab's format needs qk_norm=True drafters (Qwen3 layers); save this "
                         "one to an .npz instead")
    factor = linear_factor(c.rope_freq_factors)
    if c.rope_freq_factors is not None and factor is None:
        raise ValueError("z-lab's config.json states RoPE scaling by its parameters, not the "
                         "per-frequency divisors this drafter holds; save it to an .npz instead")
    if t.n_layers - 1 in c.tap_layers and not c.last_tap_normed:
        raise ValueError(f"the drafter taps the target's last layer ({t.n_layers - 1}) before its "
                         "final norm, z-lab's format after it; save this one to an .npz instead")
    folder = Path(folder)
    config: dict = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": t.dim, "intermediate_size": c.ffn_dim, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, "vocab_size": t.vocab_size, "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None if factor is None else {"rope_type": "linear", "factor": factor},
        "max_position_embeddings": t.max_seq_len, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "block_size": c.block_size, "num_target_layers": t.n_layers,
        "dflash_config": {"target_layer_ids": list(c.tap_layers),
                          "mask_token_id": c.mask_token_id},
        "torch_dtype": str(model.dtype), "fastspec_target": target_fingerprint(model.target),
    }
    for name in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
        value = getattr(c, name)
        if value != {"final_logit_softcapping": 0.0}.get(name, 1.0):
            config["dflash_config"][name] = value
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json_io.dumps(config, indent=2) + "\n")
    sd = {k: np.asarray(v, dtype=model.dtype) for k, v in model.state_dict().items()}
    write_safetensors(folder / "model.safetensors", sd)
