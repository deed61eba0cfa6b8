"""A Transformer's files: ``.npz`` files, Hugging Face folders and GGUF files, read and written.

:func:`load_transformer` and :func:`save_transformer` are what :meth:`fastspec.Transformer.load`
and :meth:`~fastspec.Transformer.save` run: this module registers them with
:func:`fastspec.model.state.register_files` when it is imported. The tensors' names and layout
are :mod:`fastspec.model.state`'s; Hugging Face folders are :mod:`fastspec.formats.hf_folder`'s,
GGUF files :mod:`fastspec.formats.gguf`'s (read) and :mod:`fastspec.formats.gguf_write`'s.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fastspec.kernels.bf16 import BF16
from fastspec.formats import json_io
from fastspec.formats.gguf import load_gguf
from fastspec.formats.gguf_header import is_gguf
from fastspec.formats.hf_folder import iter_hf, read_hf_config, save_hf
from fastspec.formats.npz import read_npz
from fastspec.model.config import ModelConfig
from fastspec.model.state import register_files
from fastspec.model.transformer import Transformer

__all__ = ["load_transformer", "save_transformer"]


def save_transformer(model: Transformer, path: Path) -> None:
    """Write ``model`` to ``path``: a ``.gguf`` file (:func:`~fastspec.formats.gguf_write.save_gguf`),
    an ``.npz`` file, or a Hugging Face folder otherwise. A quantized model is written as
    GGUF only (its blocks have no npz or safetensors form here)."""
    if path.suffix.lower() == ".gguf":
        from fastspec.formats.gguf_write import save_gguf
        save_gguf(model, path)
        return
    if model.config.quantized:
        raise ValueError(f"{path}: a {model.config.weight_dtype} model is saved as GGUF (a "
                         "path ending in .gguf), not as .npz or a Hugging Face folder; or "
                         "dequantize it first: model.with_weight_dtype(None)")
    if path.suffix == ".npz":
        np.savez(path, config=np.array(json_io.dumps(model.config.to_dict())), **model.state_dict())
    else:
        save_hf(model, path)


def load_transformer(cls: type[Transformer], path: Path, dtype: str | None = None,
                     weight_dtype: str | None = None, mmap: bool = False) -> Transformer:
    """Load an ``.npz``, a ``.gguf`` or a Hugging Face folder as a ``cls`` (see
    :meth:`Transformer.load`)."""
    if is_gguf(path):  # a .gguf name, or GGUF bytes under any name (an Ollama blob)
        return load_gguf(cls, path, dtype=dtype, weight_dtype=weight_dtype, mmap=mmap)
    if path.is_dir():
        config = read_hf_config(path, dtype=dtype, weight_dtype=weight_dtype)
        # one file tensor at a time
        return cls.from_tensors(config, iter_hf(path, config), mmap=mmap)
    if mmap:
        raise ValueError(f"{path}: mmap=True maps Hugging Face folders (safetensors) and GGUF "
                         "files, not .npz files")
    cfg, sd = read_npz(path, "model")  # bounded: validates every header before reading
    bits = sorted(k for k, a in sd.items() if a.dtype == np.uint16)
    if bits and cfg.get("weight_dtype") != BF16:
        raise ValueError(f"{path}: tensors {bits[:3]} hold uint16 (bf16 bit patterns) but the "
                         "config's weight_dtype is not 'bfloat16'")
    if dtype is not None:
        cfg["dtype"] = dtype
        if cfg.get("weight_dtype") in ("float16", BF16) and dtype != "float32":
            cfg["weight_dtype"] = None
    if weight_dtype not in (None, "auto"):  # "auto": the file's own, as None
        cfg["weight_dtype"] = weight_dtype
    return cls.from_state_dict(ModelConfig.from_dict(cfg), sd)


register_files(load_transformer, save_transformer)
