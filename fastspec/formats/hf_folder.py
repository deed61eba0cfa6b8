"""Hugging Face checkpoints: Llama/Qwen2/Qwen3 folders (config.json + safetensors) in and out.

:func:`read_hf` reads ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM``
folders (one ``model.safetensors`` or shards listed in ``model.safetensors.index.json``),
converting bf16/f16/f32 weights to the model dtype (a bf16 checkpoint loaded with
``weight_dtype="bfloat16"`` keeps its bit patterns). :func:`save_hf` writes the same layout so
that ``transformers`` loads a fastspec model (bfloat16 matrices as BF16 tensors).

The safetensors files are parsed here, with NumPy only (fastspec's one runtime dependency):
the header is length-checked against the file size before it is read, every tensor's dtype,
shape and byte range are validated before any data is read, only the tensors the model needs
are read, and nothing is unpickled. (The ``safetensors`` package's NumPy API cannot return
bf16, the usual dtype of real checkpoints, so it would only ever be a second code path.)
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

from fastspec.formats import json_io
from fastspec.formats.hf_fused import fused_name, part_entry, source_of
from fastspec.formats.hf_rope import (SCALINGS, linear_factor, partial_rotary_factor,
                                      rope_attention_factor, rope_context, rope_freq_factors,
                                      rope_theta)
from fastspec.formats.json_io import read_json_object
from fastspec.model.config import ModelConfig
from fastspec.model.schema import hf_layer_keys, layer_attrs

if TYPE_CHECKING:  # the model builds itself from read_hf; no import cycle at run time
    from fastspec.model.transformer import Transformer

__all__ = ["read_hf", "read_hf_config", "own_weight_dtype", "iter_hf", "FileTensor", "save_hf",
           "read_safetensors", "write_safetensors", "hf_config", "hf_export_config",
           "hf_tensor_names", "weight_files"]

#: Largest safetensors header accepted (the JSON table of contents), in bytes.
MAX_HEADER_BYTES = 100 * 2**20

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; converted to float32 by a 16-bit shift
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_FLOAT_CODES = {"F64", "F32", "F16", "BF16"}
_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3"}


# --- safetensors -------------------------------------------------------------------------

def _read_header(path: Path) -> tuple[dict, int, int]:
    """Return ``(entries, data_start, data_size)`` of a safetensors file, all validated."""
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: not a safetensors file ({size} bytes, no header length)")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8 or n > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: header length {n} exceeds the file size {size} or the "
                             f"limit {MAX_HEADER_BYTES} (truncated or not a safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header must be a JSON object")
    data_start, data_size = 8 + n, size - 8 - n
    entries = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(e, dict) or set(e) - {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{path}: tensor {name!r} has a malformed header entry")
        code, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if code not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {code!r}")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(type(s) is int and 0 <= s < 2**40 for s in shape)):
            raise ValueError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            raise ValueError(f"{path}: tensor {name!r} has data_offsets {offsets!r} outside the "
                             f"{data_size} data bytes (truncated file?)")
        nbytes = math.prod(shape) * _DTYPES[code].itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise ValueError(f"{path}: tensor {name!r} of dtype {code} and shape {shape} needs "
                             f"{nbytes} bytes, its data_offsets span {offsets[1] - offsets[0]}")
        entries[name] = (code, tuple(shape), offsets[0])
    return entries, data_start, data_size


def _to_float(raw: np.ndarray, code: str, dtype: np.dtype) -> np.ndarray:
    if code == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(dtype, copy=False)


def read_safetensors(path: str | os.PathLike, names: Iterable[str] | None = None,
                     dtype: str | np.dtype | None = None,
                     bf16_bits: bool = False) -> dict[str, np.ndarray]:
    """Read tensors from a ``.safetensors`` file.

    Parameters
    ----------
    path : path-like
    names : iterable of str, optional
        Read only these tensors (missing ones raise ValueError); default all.
    dtype : dtype, optional
        Convert floating tensors (F64/F32/F16/BF16) to this dtype. Without it BF16 becomes
        float32 and other dtypes are kept.
    bf16_bits : bool, default False
        Return BF16 tensors as their raw uint16 bit patterns instead (``dtype`` then applies
        to the other floating tensors only).

    Returns
    -------
    dict of str to ndarray

    Raises
    ------
    ValueError
        For a truncated or malformed file (checked before any tensor data is read) or a
        missing tensor.
    """
    path = Path(path)
    entries, data_start, _ = _read_header(path)
    wanted = list(entries) if names is None else list(names)
    missing = [n for n in wanted if n not in entries]
    if missing:
        raise ValueError(f"{path}: missing tensors {missing}")
    with open(path, "rb") as f:
        return {name: _read_entry(f, path, name, entries[name], data_start, dtype, bf16_bits)
                for name in wanted}


def _read_entry(f, path: Path, name: str, entry: tuple, data_start: int,
                dtype: str | np.dtype | None, bf16_bits: bool) -> np.ndarray:
    """Read one validated header entry from the open file ``f`` (see :func:`read_safetensors`)."""
    code, shape, offset = entry
    count = math.prod(shape)
    f.seek(data_start + offset)
    raw = np.fromfile(f, dtype=_DTYPES[code], count=count)
    if raw.size != count:
        raise ValueError(f"{path}: tensor {name!r} is truncated")
    raw = raw.reshape(shape)
    if code in _FLOAT_CODES and not (bf16_bits and code == "BF16"):
        raw = _to_float(raw, code, np.dtype(dtype) if dtype is not None
                        else np.dtype(np.float32) if code == "BF16" else raw.dtype)
    return raw


class FileTensor:
    """One tensor of a safetensors file, read when asked: whole (``numpy.asarray``) or by rows.

    Its header entry is validated (:func:`_read_header`) before it is made; reads return the
    file's dtype, BF16 as uint16 bit patterns. A reader that converts blocks of rows into
    their final array never holds the whole raw tensor (:meth:`Transformer.from_tensors`).
    """

    def __init__(self, path: Path, name: str, entry: tuple, data_start: int) -> None:
        self.path, self.name = path, name
        self._code, self.shape, self._offset = entry
        self._start = data_start
        self.dtype = _DTYPES[self._code]
        self.ndim = len(self.shape)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Return rows ``[start, stop)`` (first axis) of the tensor."""
        rows = self.shape[0] if self.shape else 1
        stop = rows if stop is None else min(stop, rows)
        start = min(max(start, 0), stop)
        row = math.prod(self.shape[1:])
        count = (stop - start) * row
        with open(self.path, "rb") as f:
            f.seek(self._start + self._offset + start * row * self.dtype.itemsize)
            raw = np.fromfile(f, dtype=self.dtype, count=count)
        if raw.size != count:
            raise ValueError(f"{self.path}: tensor {self.name!r} is truncated")
        return raw.reshape(((stop - start),) + tuple(self.shape[1:]) if self.shape else ())

    def mapped(self) -> np.ndarray:
        """Return the tensor as a copy-on-write map of the file: nothing is read until a page
        is touched, the pages read are the kernel's page cache (shared, reclaimable), and
        writes stay private to this process. The file must not be truncated or rewritten
        while the array lives."""
        if math.prod(self.shape) == 0:
            return self.read()
        mm = np.memmap(self.path, dtype=self.dtype, mode="c", offset=self._start + self._offset,
                       shape=tuple(self.shape))
        return mm.view(np.ndarray)  # a plain array (its base keeps the map alive)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"FileTensor({self.name!r}, {self._code}, shape={self.shape})"


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write float32/float64/float16 (and integer) arrays to a ``.safetensors`` file.

    uint16 arrays are bfloat16 bit patterns (fastspec's bf16 storage) and are written as BF16.
    """
    codes = {(v.kind, v.itemsize): k for k, v in _DTYPES.items()}
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        code = codes.get((a.dtype.kind, a.dtype.itemsize))
        if code is None:
            raise TypeError(f"tensor {name!r}: dtype {a.dtype} cannot be written to safetensors")
        a = a.astype(_DTYPES[code], copy=False)
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    raw = json_io.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in arrays:
            f.write(a.tobytes())


# --- config mapping ----------------------------------------------------------------------

def hf_config(cfg: dict, dtype: str = "float32") -> ModelConfig:
    """Map a Hugging Face ``config.json`` dict to a :class:`ModelConfig`.

    Raises
    ------
    ValueError
        For an unknown architecture or a feature fastspec does not implement (named).
    """
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in _ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                         f"supported: {sorted(_ARCHITECTURES)}")
    family = _ARCHITECTURES[arch]
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{arch}: unsupported hidden_act {act!r} (only silu/SwiGLU)")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{arch}: mlp_bias=True is not supported")
    if family != "qwen2" and cfg.get("attention_bias"):
        raise ValueError(f"{arch}: attention_bias=True (o_proj bias) is not supported")
    if family == "qwen2" and cfg.get("use_sliding_window"):
        raise ValueError(f"{arch}: use_sliding_window=True is not supported")
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
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]), dim=dim, n_layers=int(cfg["num_hidden_layers"]),
        n_heads=heads, n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim), ffn_dim=int(cfg["intermediate_size"]),
        max_seq_len=context, norm="rmsnorm", positional="rope", activation="swiglu",
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=rope_theta(cfg, SCALINGS),
        rope_freq_factors=rope_freq_factors(cfg, rotated), rope_dims=rotated,
        rope_attention_factor=rope_attention_factor(cfg),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        dtype=dtype, qk_norm=family == "qwen3", qkv_bias=family == "qwen2")


def hf_export_config(c: ModelConfig) -> dict:
    """Return the Hugging Face ``config.json`` dict of a Llama-family :class:`ModelConfig`."""
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
    if c.rope_attention_factor is not None or c.rope_dims:
        raise ValueError("a RoPE attention factor or partial rotary (rope_attention_factor, "
                         "rope_dims: Phi-3/Phi-4's LongRoPE) is not written to a config.json; "
                         "save to .npz (or .gguf, without rope_dims) instead")
    arch, mtype = (("Qwen3ForCausalLM", "qwen3") if c.qk_norm else
                   ("Qwen2ForCausalLM", "qwen2") if c.qkv_bias else ("LlamaForCausalLM", "llama"))
    out = {
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
    if mtype == "qwen2":
        out.update(use_sliding_window=False, sliding_window=None)
    return out


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
        entries, _, _ = _read_header(single)
        return {name: single for name in entries}
    raise ValueError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def hf_tensor_names(c: ModelConfig) -> list[str]:
    """Return the Hugging Face tensor names a checkpoint of config ``c`` must hold."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not c.tie_embeddings:
        names.append("lm_head.weight")
    attrs = layer_attrs(swiglu=True, rmsnorm=True, qk_norm=c.qk_norm, qkv_bias=c.qkv_bias)
    for i in range(c.n_layers):
        names += hf_layer_keys(f"model.layers.{i}.", attrs)
    return names


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
    missing = [n for n in hf_tensor_names(config) if source_of(n, files, str(folder)) not in files]
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ValueError(f"{folder}: missing tensors {missing[:10]}{more}")
    return config


def iter_hf(folder: str | os.PathLike,
            config: ModelConfig) -> Iterator[tuple[str, "FileTensor"]]:
    """Yield ``(name, tensor)`` for every tensor ``config`` needs, read one at a time.

    The loader's streaming path: nothing is read until asked, so a caller that converts
    each tensor block by block into its final form (:meth:`fastspec.Transformer.from_tensors`)
    never holds more than one block of raw data beside the model. Tensors come in file order
    as :class:`FileTensor`: the file's dtype, BF16 as uint16 bit patterns, unconverted
    (``config`` from :func:`read_hf_config`).

    Raises
    ------
    ValueError
        Missing tensors (before any is read), a malformed file or a non-float weight (named).
    """
    folder = Path(folder)
    files = weight_files(folder)
    by_file: dict[Path, list[str]] = {}
    for name in hf_tensor_names(config):
        source = source_of(name, files, str(folder))  # Phi-3's fused projections
        if source not in files:
            raise ValueError(f"{folder}: missing tensor {name!r}")
        by_file.setdefault(files[source], []).append(name)
    for path, names in by_file.items():
        entries, data_start, _ = _read_header(path)
        for n in names:  # a part of a fused tensor: its rows of the same bytes
            f: Any = entries.get(fused_name(n) or "") if n not in entries else None
            if f is not None:
                size = _DTYPES[f[0]].itemsize
                entries[n] = part_entry(n, f, size, config, str(path))
        absent = [n for n in names if n not in entries]
        if absent:
            raise ValueError(f"{path}: missing tensors {absent[:10]} (listed in the index)")
        bad = [n for n in names if entries[n][0] not in _FLOAT_CODES]
        if bad:
            raise ValueError(f"{path}: tensor {bad[0]!r} has dtype {entries[bad[0]][0]}; "
                             "weights must be F16, BF16, F32 or F64")
        names.sort(key=lambda n: entries[n][2])  # file order: sequential reads
        for name in names:
            yield name, FileTensor(path, name, entries[name], data_start)


def read_hf(folder: str | os.PathLike, dtype: str | None = None,
            weight_dtype: str | None = None) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Read a Llama/Qwen2/Qwen3 Hugging Face checkpoint folder: its config and weights.

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
        sd[name] = a if keep else _to_float(a, "BF16" if a.dtype == np.uint16 else "",
                                            np.dtype(config.dtype))
    return config, sd


def save_hf(model: Transformer, folder: str | os.PathLike) -> None:
    """Write ``model`` as a Hugging Face folder (``config.json`` + ``model.safetensors``).

    Llama family only: ``LlamaForCausalLM``, ``Qwen3ForCausalLM`` when ``qk_norm``,
    ``Qwen2ForCausalLM`` when ``qkv_bias``. ``transformers`` loads the result.
    """
    folder = Path(folder)
    config = hf_export_config(model.config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json_io.dumps(config, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", model.state_dict())


# --- model + tokenizer -------------------------------------------------------------------
