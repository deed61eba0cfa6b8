"""Fused projections of a Hugging Face checkpoint (Phi-3's ``qkv_proj`` and ``gate_up_proj``)
read as the separate tensors fastspec's models hold.

``model.layers.N.self_attn.qkv_proj.weight`` holds the rows of q (``num_attention_heads *
head_dim``), then k and v (``num_key_value_heads * head_dim`` each);
``model.layers.N.mlp.gate_up_proj.weight`` the gate's ``intermediate_size`` rows, then the up
projection's (transformers' Phi-3 MLP: ``gate, up = gate_up.chunk(2)``). A part is a range of
rows of the same bytes in the file: :func:`part_entry` gives its safetensors header entry.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from fastspec.model.config import ModelConfig

__all__ = ["fused_name", "source_of", "part_entry", "fused_rows"]

#: A separate tensor's leaf -> (the fused tensor's leaf, the part's index in it).
_PARTS = {"self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0),
          "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", 1),
          "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", 2),
          "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0),
          "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", 1)}


def fused_rows(c: ModelConfig) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """The rows of the parts of a fused q/k/v (q, k, v) and of a fused gate/up (gate, up) of a
    model of ``c``: Hugging Face's and llama.cpp's phi3 layout alike."""
    hd, ffn = int(c.head_dim or 0), int(c.ffn_dim or 0)  # set by ModelConfig
    kv = int(c.n_kv_heads or 0) * hd
    return (c.n_heads * hd, kv, kv), (ffn, ffn)


def _split(name: str) -> tuple[str, str] | None:
    """``(layer prefix, leaf)`` of a layer tensor's name, or None."""
    parts = name.split(".", 3)  # model.layers.N.<leaf>
    if len(parts) != 4 or parts[:2] != ["model", "layers"]:
        return None
    return ".".join(parts[:3]) + ".", parts[3]


def fused_name(name: str) -> str | None:
    """The fused tensor that may hold tensor ``name`` (a q/k/v or gate/up projection), or
    None."""
    split = _split(name)
    if split is None or split[1] not in _PARTS:
        return None
    return split[0] + _PARTS[split[1]][0]


def source_of(name: str, files: dict, where: str) -> str:
    """The tensor of a checkpoint (names ``files``) that holds tensor ``name``: itself, else
    its fused tensor (:func:`fused_name`), else ``name`` (missing).

    Raises
    ------
    ValueError
        Both present (a fused tensor beside one of its parts), named with ``where``.
    """
    fused = fused_name(name)
    if fused is None or fused not in files:
        return name
    if name in files:
        raise ValueError(f"{where}: tensor {fused!r} is fused, yet the checkpoint also has "
                         f"{name!r}")
    return fused


def part_entry(name: str, fused: tuple, itemsize: int, c: ModelConfig, where: str) -> tuple:
    """The safetensors header entry ``(dtype code, shape, offset)`` of tensor ``name`` as its
    rows of the fused tensor's entry ``fused`` (:func:`fused_name`; ``itemsize`` bytes an
    element), for a model of ``c``.

    Raises
    ------
    ValueError
        A fused tensor that is not a matrix of as many rows as its parts (named, with
        ``where``: the file).
    """
    prefix, leaf = _split(name)  # type: ignore[misc]
    fused_leaf, index = _PARTS[leaf]
    qkv, gate_up = fused_rows(c)
    rows: tuple[int, ...] = qkv if fused_leaf.startswith("self_attn") else gate_up
    code, shape, offset = fused
    if len(shape) != 2 or shape[0] != sum(rows):
        raise ValueError(f"{where}: tensor {prefix + fused_leaf!r} has shape {tuple(shape)}; a "
                         f"fused one of this model has {sum(rows)} rows "
                         f"({' + '.join(map(str, rows))})")
    row_bytes = shape[1] * itemsize
    return code, (rows[index], shape[1]), offset + sum(rows[:index]) * row_bytes
