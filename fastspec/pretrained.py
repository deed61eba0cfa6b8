"""The embedded default models, shipped as package data (``fastspec/data/*.npz``).

``fastspec.pretrained.load()`` returns the byte-level target, its 1-layer draft model, the
DFlash drafter trained against the target, and the tokenizer. See ``docs/MODELS.md`` for how
they were trained and what they score.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fastspec.model import Transformer
from fastspec.tokenizer import ByteTokenizer

__all__ = ["Bundle", "load", "available", "data_dir"]

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


def load(dtype: str = "float32", weight_dtype: str | None = None) -> Bundle:
    """Load the embedded target, draft and DFlash models (stored in float16, computed in ``dtype``).

    Parameters
    ----------
    dtype : {"float32", "float64"}, default "float32"
        Compute dtype (activations, KV caches, logits).
    weight_dtype : {"float16", "float32", "float64"}, optional
        Storage dtype of the matrices (see :class:`~fastspec.ModelConfig`). Default: float16
        with float32 compute (the files' own values, half the memory traffic of a decode step,
        results bit-identical to ``weight_dtype="float32"``), else ``dtype``.

    Raises
    ------
    FileNotFoundError
        If the package was installed without its data files.
    """
    from fastspec.dflash import DFlashModel

    folder = data_dir()
    missing = [name for name in _FILES.values() if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"embedded model files missing from {folder}: {missing}")
    if weight_dtype is None:
        weight_dtype = "float16" if dtype == "float32" else dtype
    target = Transformer.load(folder / _FILES["target"], dtype=dtype, weight_dtype=weight_dtype)
    draft = Transformer.load(folder / _FILES["draft"], dtype=dtype, weight_dtype=weight_dtype)
    dflash = DFlashModel.load(folder / _FILES["dflash"], target)
    # Trained on 256-token sequences: keep the drafter's context within what it has seen
    # (block included); see DFlashDrafter's context_window.
    dflash.context_window = 256 - dflash.config.block_size
    return Bundle(target=target, draft=draft, dflash=dflash, tokenizer=ByteTokenizer())
