"""Fused GGUF tensors split into the separate ones fastspec's models hold (Phi-3's).

llama.cpp's ``phi3`` files keep Hugging Face's fused projections: ``blk.N.attn_qkv.weight``
holds the rows of q (``head_count * head_dim``), then k and v (``head_count_kv * head_dim``
each), and ``blk.N.ffn_up.weight`` the gate's ``feed_forward_length`` rows, then the up
projection's (llama.cpp's SwiGLU takes the first half through SiLU, as transformers' Phi-3 MLP
does). A row of a matrix is whole blocks of any GGUF type, so each part is a view of the same
bytes under the separate names (``attn_q``, ``attn_k``, ``attn_v``, ``ffn_gate``, ``ffn_up``),
read like any other tensor: nothing is copied. A file with the separate tensors is left as it is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fastspec.formats.hf_fused import fused_rows

if TYPE_CHECKING:  # annotations only
    from fastspec.model.config import ModelConfig

__all__ = ["split_fused", "FUSED"]

#: Fused GGUF leaves -> the leaves of their parts, in row order.
FUSED = {"attn_qkv.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
         "ffn_up.weight": ("ffn_gate.weight", "ffn_up.weight")}


def _rows(t: Any, start: int, stop: int, name: str) -> Any:
    """The tensor of rows ``[start, stop)`` of file tensor ``t`` (a ``_FileTensor``), named
    ``name``: a view of its bytes."""
    shape = [int(n) for n in t.shape.tolist()]  # ggml order: (in, rows)
    return t._replace(name=name, shape=np.array([shape[0], stop - start], dtype=np.uint64),
                      n_elements=shape[0] * (stop - start), data=t.data[start:stop])


def split_fused(tensors: dict[str, Any], c: ModelConfig) -> dict[str, Any]:
    """Return ``tensors`` (GGUF name -> file tensor) with every fused tensor of a layer split
    into its parts, in the file's order.

    Parameters
    ----------
    tensors : dict
        The file's tensors (``_FileTensor`` s: ``name``, ``tensor_type``, ``shape`` in ggml
        order, ``n_elements``, ``data`` with a first axis of rows).
    c : ModelConfig
        The file's model: its head counts and size and its feed-forward width give the parts'
        rows (:func:`~fastspec.formats.hf_fused.fused_rows`).

    Returns
    -------
    dict
        A new dict; ``tensors`` itself when nothing is fused.

    Raises
    ------
    ValueError
        A fused tensor that is not a matrix of as many rows as its parts (named), or a layer
        holding both a fused tensor and one of its parts (``attn_qkv`` beside ``attn_q``).
    """
    if not any(name.split(".", 2)[-1] in FUSED for name in tensors if name.startswith("blk.")):
        return tensors
    qkv, gate_up = fused_rows(c)
    parts: dict[str, tuple[int, ...]] = {"attn_qkv.weight": qkv, "ffn_up.weight": gate_up}
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        leaf = name.split(".", 2)[-1] if name.startswith("blk.") else ""
        rows = parts.get(leaf)
        shape = [int(n) for n in t.shape.tolist()]
        if rows is None or (leaf == "ffn_up.weight" and len(shape) == 2
                            and shape[1] == rows[0]):
            out[name] = t  # not fused (an ffn_up of feed_forward_length rows is the up alone)
            continue
        if len(shape) != 2 or shape[1] != sum(rows) or t.data.shape[0] != sum(rows):
            raise ValueError(f"tensor {name!r} has shape {tuple(reversed(shape))}; a fused "
                             f"{leaf.split('.')[0]} of this model has {sum(rows)} rows "
                             f"({' + '.join(map(str, rows))})")
        prefix = name[:-len(leaf)]
        start = 0
        for part, n in zip(FUSED[leaf], rows):
            if part != leaf and prefix + part in tensors:
                raise ValueError(f"tensor {name!r} is fused, yet the file also has "
                                 f"{prefix + part!r}")
            out[prefix + part] = _rows(t, start, start + n, prefix + part)
            start += n
    return out
