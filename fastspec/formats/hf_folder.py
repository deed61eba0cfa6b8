"""Hugging Face checkpoints: Llama-family folders (config.json + safetensors) in and out.

:func:`read_hf` reads ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
``Phi3ForCausalLM``, ``GraniteForCausalLM`` (:mod:`~fastspec.formats.granite`) and
``SmolLM3ForCausalLM`` folders (one ``model.safetensors`` or shards listed in
``model.safetensors.index.json``), converting bf16/f16/f32 weights to the model dtype (a
bf16 checkpoint loaded with ``weight_dtype="bfloat16"`` keeps its bit patterns).
:func:`save_hf` writes the same layout so that ``transformers`` loads a fastspec model
(bfloat16 matrices as BF16 tensors).

The safetensors files are parsed by :mod:`fastspec.formats.safetensors_io` (NumPy only; its
reader and writer are re-exported here).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from fastspec.formats import gemma3, granite, json_io
from fastspec.formats.hf_fused import fused_name, part_entry, source_of
from fastspec.formats.hf_rope import (SCALINGS, linear_factor, nope_layers,
                                      partial_rotary_factor, rope_attention_factor, rope_context,
                                      rope_freq_factors, rope_theta)
from fastspec.formats.json_io import read_json_object
from fastspec.formats.safetensors_io import (DTYPES, FLOAT_CODES, FileTensor, read_header,
                                             read_safetensors, to_float, write_safetensors)
from fastspec.model.config import ModelConfig
from fastspec.model.schema import hf_layer_keys, layer_attrs

if TYPE_CHECKING:  # the model builds itself from read_hf; no import cycle at run time
    from fastspec.model.transformer import Transformer

__all__ = ["read_hf", "read_hf_config", "own_weight_dtype", "iter_hf", "FileTensor", "save_hf",
           "read_safetensors", "write_safetensors", "hf_config", "hf_export_config",
           "hf_tensor_names", "weight_files"]

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3",
                  "GraniteForCausalLM": "granite", "SmolLM3ForCausalLM": "smollm3",
                  gemma3.ARCHITECTURE: "gemma3"}


# --- config mapping ----------------------------------------------------------------------

#: The sizes every architecture's ``config.json`` must give.
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads")


def hf_config(cfg: dict, dtype: str = "float32") -> ModelConfig:
    """Map a Hugging Face ``config.json`` dict to a :class:`ModelConfig`.

    Raises
    ------
    ValueError
        For an unknown architecture, a feature fastspec does not implement or a missing size
        (named).
    """
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in _ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                         f"supported: {sorted(_ARCHITECTURES)}")
    missing = [k for k in _SIZES if k not in cfg]
    if missing:
        raise ValueError(f"{arch}: config.json has no {', '.join(missing)}")
    family = _ARCHITECTURES[arch]
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish") and family != "gemma3":  # Gemma's: gemma3.settings
        raise ValueError(f"{arch}: unsupported hidden_act {act!r} (only silu/SwiGLU)")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{arch}: mlp_bias=True is not supported")
    if family != "qwen2" and cfg.get("attention_bias"):
        raise ValueError(f"{arch}: attention_bias=True (o_proj bias) is not supported")
    if family in ("qwen2", "smollm3") and cfg.get("use_sliding_window"):
        raise ValueError(f"{arch}: use_sliding_window=True is not supported")
    if family not in ("phi3", "gemma3") and "sliding_attention" in (cfg.get("layer_types") or ()):
        raise ValueError(f"{arch}: sliding_attention layers (layer_types) are not supported")
    raw = cfg
    if family == "gemma3":
        cfg = gemma3.global_rope(cfg)  # the global layers' RoPE (the local ones: settings)
    dim, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or dim // heads
    rotated = round(int(head_dim) * partial_rotary_factor(cfg))  # a GGUF count's exactly
    if rotated != int(head_dim) and (family != "phi3" or rotated % 2 or not 0 < rotated):
        raise ValueError(f"{arch}: partial_rotary_factor={partial_rotary_factor(cfg)!r} is not "
                         "supported")
    context = rope_context(cfg, int(cfg.get("max_position_embeddings", 2048)))
    window = cfg.get("sliding_window") if family == "phi3" else None  # Phi-3's: transformers'
    if window is not None and (type(window) is not int or window <= 0):  # changes nothing below
        raise ValueError(f"{arch}: sliding_window must be a positive int, got {window!r}")
    context = min(context, window or context)  # that many positions
    scale, eps = granite.fold(cfg, float(cfg.get("rms_norm_eps", 1e-6)))
    factor = granite.with_attention(rope_attention_factor(cfg), cfg, int(head_dim))
    fields: dict[str, Any] = dict(activation="swiglu", qk_norm=family == "qwen3",
                                  embedding_scale=scale, max_seq_len=context)
    if family == "gemma3":
        fields = gemma3.settings(raw, int(head_dim), context)
        factor = fields.pop("rope_attention_factor")  # query_pre_attn_scalar's
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]), dim=dim, n_layers=int(cfg["num_hidden_layers"]),
        n_heads=heads, n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim), ffn_dim=int(cfg["intermediate_size"]),
        norm="rmsnorm", positional="rope",
        # transformers' own default: SmolLM3Config and Gemma3TextConfig tie, the others do not
        tie_embeddings=bool(cfg.get("tie_word_embeddings", family in ("smollm3", "gemma3"))),
        rope_theta=rope_theta(cfg, SCALINGS),
        rope_freq_factors=rope_freq_factors(cfg, rotated), rope_dims=rotated,
        rope_attention_factor=factor, norm_eps=eps,
        nope_layers=nope_layers(cfg, int(cfg["num_hidden_layers"])),
        dtype=dtype, qkv_bias=family == "qwen2", **fields)


def hf_export_config(c: ModelConfig) -> dict:
    """Return the Hugging Face ``config.json`` dict of a Llama-family :class:`ModelConfig`
    (``GraniteForCausalLM`` for one with an ``embedding_scale`` or a RoPE attention factor,
    without partial rotary, QK-norm or biases; its multipliers from
    :func:`~fastspec.formats.granite.export_multipliers`; ``SmolLM3ForCausalLM`` with its
    ``no_rope_layers`` for one with ``nope_layers``; ``Gemma3ForCausalLM`` for one with
    sandwich norms, :func:`~fastspec.formats.gemma3.export_config`)."""
    if c.post_norms:
        return _config_dict(c, gemma3.ARCHITECTURE, "gemma3_text", linear_factor(
            c.rope_freq_factors)) | gemma3.export_config(c)
    if c.local_layers:
        raise ValueError("local RoPE layers (local_layers) are written to a config.json only "
                         "as Gemma 3's, with its sandwich norms; save to .npz instead")
    if (c.norm, c.positional, c.activation) != ("rmsnorm", "rope", "swiglu"):
        raise ValueError("only Llama-family models (rmsnorm, rope, swiglu) can be exported to a "
                         f"Hugging Face folder, got {c.norm}/{c.positional}/{c.activation}; "
                         "save to .npz instead")
    if c.qk_norm and c.qkv_bias:
        raise ValueError("qk_norm together with qkv_bias has no Hugging Face architecture")
    factor = linear_factor(c.rope_freq_factors)
    if c.rope_freq_factors is not None and factor is None:
        raise ValueError("per-frequency RoPE factors (rope_freq_factors, Llama 3.1+) have no "
                         "config.json form without their llama3 parameters; save to .npz or "
                         ".gguf instead")
    # a Granite holds an embedding scale and an attention factor (attention_multiplier)
    as_granite = (c.embedding_scale is not None or c.rope_attention_factor is not None) and not (
        c.rope_dims or c.qk_norm or c.qkv_bias)
    if c.embedding_scale is not None and (c.qk_norm or c.qkv_bias):
        raise ValueError("embedding_scale (Granite's) with qk_norm or qkv_bias has no Hugging "
                         "Face architecture")
    if (c.rope_attention_factor is not None or c.rope_dims) and not as_granite:
        raise ValueError("a RoPE attention factor or partial rotary (rope_attention_factor, "
                         "rope_dims: Phi-3/Phi-4's LongRoPE) is not written to a config.json; "
                         "save to .npz (or .gguf, without rope_dims) instead")
    if c.nope_layers and (as_granite or c.qk_norm or c.qkv_bias):
        raise ValueError("NoPE layers (nope_layers, SmolLM3's) with a Granite's multipliers, "
                         "qk_norm or qkv_bias have no Hugging Face architecture; save to .npz")
    arch, mtype = (("SmolLM3ForCausalLM", "smollm3") if c.nope_layers else
                   ("Qwen3ForCausalLM", "qwen3") if c.qk_norm else
                   ("Qwen2ForCausalLM", "qwen2") if c.qkv_bias else
                   ("GraniteForCausalLM", "granite") if as_granite else
                   ("LlamaForCausalLM", "llama"))
    out = _config_dict(c, arch, mtype, factor)
    if mtype == "qwen2":
        out.update(use_sliding_window=False, sliding_window=None)
    if as_granite:
        out.update(granite.export_multipliers(c.embedding_scale, c.rope_attention_factor,
                                              int(c.head_dim or 0)))
    if c.nope_layers:  # 1: RoPE turns the layer
        out.update(no_rope_layers=[int(i not in c.nope_layers) for i in range(c.n_layers)],
                   use_sliding_window=False, sliding_window=None,
                   pad_token_id=None)  # not SmolLM3Config's default id, beyond a small vocab
    return out


def _config_dict(c: ModelConfig, arch: str, mtype: str, factor: float | None) -> dict:
    """The ``config.json`` entries every architecture written has (``factor``: linear RoPE
    scaling's, or None)."""
    return {
        "architectures": [arch], "model_type": mtype, "vocab_size": c.vocab_size,
        "hidden_size": c.dim, "intermediate_size": c.ffn_dim, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta,
        "rope_scaling": None if factor is None else {"rope_type": "linear", "factor": factor},
        "tie_word_embeddings": c.tie_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "torch_dtype": c.dtype, "use_cache": True,
    }


# --- folders -----------------------------------------------------------------------------

def weight_files(folder: Path) -> dict[str, Path]:
    """Return tensor name -> shard path (every tensor of a single-file checkpoint -> it)."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{index}: malformed index ({exc})") from None
        files = {}
        for name, shard in weight_map.items():
            p = (folder / shard).resolve()
            if p.parent != folder.resolve():
                raise ValueError(f"{index}: shard {shard!r} is outside the folder")
            files[name] = p
        return files
    if single.is_file():
        entries, _, _ = read_header(single)
        return {name: single for name in entries}
    raise ValueError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def hf_tensor_names(c: ModelConfig) -> list[str]:
    """Return the Hugging Face tensor names a checkpoint of config ``c`` must hold."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not c.tie_embeddings:
        names.append("lm_head.weight")
    attrs = layer_attrs(swiglu=True, rmsnorm=True, qk_norm=c.qk_norm, qkv_bias=c.qkv_bias,
                        post_norms=c.post_norms)
    for i in range(c.n_layers):
        names += hf_layer_keys(f"model.layers.{i}.", attrs)
    return names


def _folder_names(c: ModelConfig) -> list[str]:
    """:func:`hf_tensor_names` as a folder of ``c``'s architecture names them (a Gemma's
    layer norms: :func:`~fastspec.formats.gemma3.folder_name`)."""
    names = hf_tensor_names(c)
    return [gemma3.folder_name(n) for n in names] if c.post_norms else names


def own_weight_dtype(config: dict, dtype: str | None = None) -> str | None:
    """Return the ``weight_dtype`` that keeps a folder's own storage (``"auto"``).

    ``"bfloat16"`` or ``"float16"`` when ``config.json`` says the checkpoint is stored so
    (``torch_dtype``, or ``dtype`` in newer transformers) and the compute dtype is float32
    (the default); otherwise None (the compute dtype).

    Parameters
    ----------
    config : dict
        The folder's ``config.json``.
    dtype : {"float32", "float64"}, optional
        The compute dtype the model will have (default float32).
    """
    stored = config.get("torch_dtype") or config.get("dtype")
    if dtype not in (None, "float32") or stored not in ("bfloat16", "float16"):
        return None
    return stored


def read_hf_config(folder: str | os.PathLike, dtype: str | None = None,
                   weight_dtype: str | None = None) -> ModelConfig:
    """Return the :class:`ModelConfig` of a Hugging Face folder, its weights checked present.

    Reads ``config.json`` and the safetensors headers only (no tensor data). Parameters and
    errors as in :func:`read_hf`.
    """
    folder = Path(folder)
    cfg_path = folder / "config.json"
    cfg = read_json_object(cfg_path)
    if cfg is None:
        raise ValueError(f"{folder}: no config.json (not a Hugging Face checkpoint folder)")
    if weight_dtype == "auto":
        weight_dtype = own_weight_dtype(cfg, dtype)
    config = hf_config(cfg, dtype or "float32").replace(weight_dtype=weight_dtype)
    if config.rope_dims:  # the rows of q and k would need reordering (GGUF files do it)
        raise ValueError(f"{folder}: partial rotary (partial_rotary_factor) is not read from "
                         "folders")
    files = weight_files(folder)
    missing = [n for n in _folder_names(config) if source_of(n, files, str(folder)) not in files]
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ValueError(f"{folder}: missing tensors {missing[:10]}{more}")
    return config


def iter_hf(folder: str | os.PathLike,
            config: ModelConfig) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, tensor)`` for every tensor ``config`` needs, read one at a time.

    The loader's streaming path: nothing is read until asked, so a caller that converts
    each tensor block by block into its final form (:meth:`fastspec.Transformer.from_tensors`)
    never holds more than one block of raw data beside the model. Tensors come in file order
    as :class:`FileTensor`: the file's dtype, BF16 as uint16 bit patterns, unconverted
    (``config`` from :func:`read_hf_config`), under fastspec's names; a Granite's final norm
    weight divided by its ``logits_scaling`` and a Gemma's norm weights plus one as a
    :class:`~fastspec.formats.folded_tensor.FoldedTensor` (float64).

    Raises
    ------
    ValueError
        Missing tensors (before any is read), a malformed file or a non-float weight (named).
    """
    folder = Path(folder)
    files = weight_files(folder)
    divisor = granite.logits_divisor(read_json_object(folder / "config.json") or {})
    by_file: dict[Path, list[str]] = {}
    for name in _folder_names(config):
        source = source_of(name, files, str(folder))  # Phi-3's fused projections
        if source not in files:
            raise ValueError(f"{folder}: missing tensor {name!r}")
        by_file.setdefault(files[source], []).append(name)
    for path, names in by_file.items():
        entries, data_start, _ = read_header(path)
        for n in names:  # a part of a fused tensor: its rows of the same bytes
            f: Any = entries.get(fused_name(n) or "") if n not in entries else None
            if f is not None:
                size = DTYPES[f[0]].itemsize
                entries[n] = part_entry(n, f, size, config, str(path))
        absent = [n for n in names if n not in entries]
        if absent:
            raise ValueError(f"{path}: missing tensors {absent[:10]} (listed in the index)")
        bad = [n for n in names if entries[n][0] not in FLOAT_CODES]
        if bad:
            raise ValueError(f"{path}: tensor {bad[0]!r} has dtype {entries[bad[0]][0]}; "
                             "weights must be F16, BF16, F32 or F64")
        names.sort(key=lambda n: entries[n][2])  # file order: sequential reads
        for name in names:
            tensor: Any = FileTensor(path, name, entries[name], data_start)
            if config.post_norms:  # a Gemma's: its layer norms' names, weights plus one
                yield gemma3.fastspec_name(name), gemma3.folder_norm(tensor, name)
                continue
            yield name, (granite.final_norm(tensor, divisor)  # Granite's logits_scaling
                         if divisor and name == "model.norm.weight" else tensor)


def read_hf(folder: str | os.PathLike, dtype: str | None = None,
            weight_dtype: str | None = None) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Read a Llama-family Hugging Face checkpoint folder: its config and weights.

    Holds every tensor at once; :meth:`fastspec.Transformer.load` streams them instead
    (:func:`read_hf_config` and :func:`iter_hf`), so that loading never holds two copies.

    Parameters
    ----------
    folder : path-like
        Holds ``config.json`` and ``model.safetensors`` (or shards with
        ``model.safetensors.index.json``).
    dtype : {"float32", "float64"}, optional
        Model dtype (default float32); bf16/f16 weights are converted.
    weight_dtype : {"float16", "bfloat16", "float32", "float64", "auto"}, optional
        Storage dtype of the matrices (:class:`~fastspec.ModelConfig`); default ``dtype``;
        ``"auto"``: the folder's own (:func:`own_weight_dtype`).
        With ``"bfloat16"`` BF16 tensors are read as bit patterns, never widened (other
        tensors are rounded to bf16 once); norms and biases are widened to ``dtype``.

    Returns
    -------
    config : ModelConfig
    state_dict : dict[str, ndarray]
        The needed tensors under their Hugging Face names.

    Raises
    ------
    ValueError
        Unknown architecture, unsupported feature, malformed file or missing tensors (named).
    """
    config = read_hf_config(folder, dtype, weight_dtype)
    bits = config.weight_dtype == "bfloat16"
    sd = {}
    for name, t in iter_hf(folder, config):  # float16 targets: widened here, rounded once later
        a = t.read()
        keep = a.dtype == np.uint16 and bits
        sd[name] = a if keep else to_float(a, "BF16" if a.dtype == np.uint16 else "",
                                            np.dtype(config.dtype))
    return config, sd


def save_hf(model: Transformer, folder: str | os.PathLike) -> None:
    """Write ``model`` as a Hugging Face folder (``config.json`` + ``model.safetensors``).

    Llama family only: ``LlamaForCausalLM``, ``Qwen3ForCausalLM`` when ``qk_norm``,
    ``Qwen2ForCausalLM`` when ``qkv_bias``, ``GraniteForCausalLM`` with an ``embedding_scale``
    or a RoPE attention factor, ``Gemma3ForCausalLM`` with sandwich norms (its norm weights
    minus one, :func:`~fastspec.formats.gemma3.folder_state`) (:func:`hf_export_config`).
    ``transformers`` loads the result.
    """
    folder = Path(folder)
    config = hf_export_config(model.config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json_io.dumps(config, indent=2) + "\n")
    state = model.state_dict()
    if model.config.post_norms:
        state = gemma3.folder_state(state)
    write_safetensors(folder / "model.safetensors", state)


# --- model + tokenizer -------------------------------------------------------------------
