"""Pretrained models: the embedded defaults, and model files with their tokenizer.

``fastspec.models.pretrained.load()`` returns the byte-level target shipped as package data
(``fastspec/data/*.npz``), its 1-layer draft model, the DFlash drafter trained against the
target, and the tokenizer (see ``docs/MODELS.md`` for how they were trained and what they
score). ``fastspec.load_pretrained(path)`` loads a GGUF file's or a Hugging Face folder's
model and tokenizer together.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from fastspec.kernels.cache import cache_dtype
from fastspec.text.hf_tokenizer import HFTokenizer
from fastspec.model.transformer import Transformer
from fastspec.text.tokenizer import ByteTokenizer

__all__ = ["Bundle", "load", "available", "data_dir", "Pretrained", "load_pretrained"]

_FILES = {"target": "target.npz", "draft": "draft.npz", "dflash": "dflash.npz"}


@dataclass
class Bundle:
    """The embedded models.

    Attributes
    ----------
    target : Transformer
        The model whose output distribution every speculative mode reproduces.
    draft : Transformer
        A 1-layer autoregressive draft model of the same tokenizer.
    dflash : DFlashModel
        Block-diffusion drafter conditioned on the target's hidden states.
    tokenizer : ByteTokenizer
    """

    target: Transformer
    draft: Transformer
    dflash: "object"
    tokenizer: ByteTokenizer


def data_dir() -> Path:
    """Return the folder that holds the embedded weight files."""
    return Path(str(resources.files("fastspec") / "data"))


def available() -> bool:
    """Return True when every embedded weight file is installed."""
    folder = data_dir()
    return all((folder / name).is_file() for name in _FILES.values())


def load(dtype: str = "float32", weight_dtype: str | None = None,
         kv_dtype: str | None = None) -> Bundle:
    """Load the embedded target, draft and DFlash models (stored in float16, computed in ``dtype``).

    Parameters
    ----------
    dtype : {"float32", "float64"}, default "float32"
        Compute dtype (activations, KV caches, logits).
    weight_dtype : {"float16", "float32", "float64", "bfloat16", "q8_0", "q4_0", "q4_1", "auto"}, optional
        Storage dtype of the matrices (see :class:`~fastspec.ModelConfig`). Default (and
        ``"auto"``, the files' own storage): float16
        with float32 compute (the files' own values, half the memory traffic of a decode step,
        results bit-identical to ``weight_dtype="float32"``), else ``dtype``. A quantized
        kind derives the quantized target and draft model from the files' float16 values at
        load (every in-width of both is a multiple of 32); the DFlash drafter's layers
        are quantized to the same kind (its embedding and head are the target's).
    kv_dtype : str, optional
        The target's :attr:`~fastspec.Transformer.kv_dtype` (its key/value caches):
        ``dtype``, or ``"float16"`` for a float32 model; default ``dtype``. The draft and
        DFlash models keep theirs.

    Raises
    ------
    FileNotFoundError
        If the package was installed without its data files.
    ValueError
        If ``kv_dtype`` is not a cache dtype of a ``dtype`` model
        (:func:`fastspec.kernels.cache.cache_dtype`).
    """
    from fastspec.drafters.dflash_model import DFlashModel

    folder = data_dir()
    missing = [name for name in _FILES.values() if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"embedded model files missing from {folder}: {missing}")
    if weight_dtype in (None, "auto"):
        weight_dtype = "float16" if dtype == "float32" else dtype
    target = _with_kv_dtype(Transformer.load(folder / _FILES["target"], dtype=dtype,
                                             weight_dtype=weight_dtype), kv_dtype)
    draft = Transformer.load(folder / _FILES["draft"], dtype=dtype, weight_dtype=weight_dtype)
    dflash = DFlashModel.load(folder / _FILES["dflash"], target)
    # Trained on 256-token sequences: keep the drafter's context within what it has seen
    # (block included); see DFlashDrafter's context_window.
    dflash.context_window = 256 - dflash.config.block_size
    return Bundle(target=target, draft=draft, dflash=dflash, tokenizer=ByteTokenizer())


def _with_kv_dtype(model: Transformer, kv_dtype: str | None) -> Transformer:
    """``model`` with its :attr:`~fastspec.Transformer.kv_dtype` set to ``kv_dtype`` (checked
    here, so a bad name fails at load, not at the first cache); None leaves it."""
    if kv_dtype is not None:
        model.kv_dtype = cache_dtype(kv_dtype, model.config.dtype).name
    return model


# --- model files: GGUF, Hugging Face folders -------------------------------------------

class Pretrained(NamedTuple):
    """A model file's model and tokenizer (from :func:`load_pretrained`).

    Attributes
    ----------
    model : Transformer
    tokenizer : HFTokenizer or None
        None when loaded with ``tokenizer=False``.
    """

    model: "Transformer"
    tokenizer: "object"


def load_pretrained(path: str | os.PathLike, dtype: str | None = None,
                    weight_dtype: str | None = None, tokenizer: bool = True,
                    mmap: bool = False, kv_dtype: str | None = None) -> Pretrained:
    """Load a model and its tokenizer in one call: a GGUF file or a Llama-family folder.

    Parameters
    ----------
    path : path-like
        A GGUF file (its tokenizer and chat template come from its metadata; the ``[gguf]``
        extra), or a Hugging Face checkpoint folder (``config.json``, safetensors,
        ``tokenizer.json``, optionally ``generation_config.json`` for the stop ids and a chat
        template); or a name :func:`fastspec.models.resolve` finds: a catalog name
        (``"smollm2"``) or a model Ollama pulled (``"llama3.2:1b"``, ``"ollama:NAME"``).
    dtype, weight_dtype : str, optional
        As in :meth:`fastspec.Transformer.load`.
    tokenizer : bool, default True
        False skips the tokenizer (for callers that pass token ids).
    mmap : bool, default False
        Map the tensors that need no conversion instead of reading them
        (:meth:`fastspec.Transformer.load`).
    kv_dtype : str, optional
        The model's :attr:`~fastspec.Transformer.kv_dtype` (the dtype of the key/value caches
        it makes): its compute dtype, or ``"float16"`` for a float32 model; default: its
        compute dtype.

    Returns
    -------
    Pretrained
        ``model, tokenizer = fastspec.load_pretrained(path)``.

    Raises
    ------
    FileNotFoundError
        Neither a file or folder nor a name :func:`fastspec.models.resolve` finds, or a folder
        without ``tokenizer.json`` (the message says to pass token ids instead).
    ValueError
        Malformed files (a broken Ollama manifest among them), a tokenizer with more ids
        than the model's vocabulary, or a ``kv_dtype`` that is not a cache dtype of the model.
    """
    from fastspec.formats.gguf_header import is_gguf
    from fastspec.models.catalog import resolve

    path = resolve(path)
    if is_gguf(path):  # a .gguf name, or GGUF bytes under any name (an Ollama blob)
        from fastspec.formats.gguf import GGUFFile, load_gguf, read_metadata

        file = GGUFFile(path)  # parsed once, for the tokenizer and the weights
        tok = (HFTokenizer.from_gguf_metadata(read_metadata(file), source=str(path))
               if tokenizer else None)  # before the slow part
        model = load_gguf(Transformer, file, dtype=dtype, weight_dtype=weight_dtype, mmap=mmap)
    else:
        tok = HFTokenizer.from_folder(path) if tokenizer else None  # before the slow part
        model = Transformer.load(path, dtype=dtype, weight_dtype=weight_dtype, mmap=mmap)
    model = _with_kv_dtype(model, kv_dtype)
    if tok is not None:
        V = model.config.vocab_size
        if tok.vocab_size > V:
            raise ValueError(f"{tok.source}: {tok.vocab_size} tokens, more than the model's "
                             f"vocab_size {V} ({path})")
        bad = [i for i in (tok.bos_id, *tok.stop_ids) if i is not None and i >= V]
        if bad:
            raise ValueError(f"{path}: special token ids {bad} are outside the model's "
                             f"vocab_size {V}")
    return Pretrained(model, tok)
