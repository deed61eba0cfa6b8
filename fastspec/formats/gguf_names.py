"""GGUF tensor names and layouts: how llama.cpp names and orders a model's tensors.

GGUF names (``blk.3.ffn_up.weight``) against the Hugging Face names fastspec's models use
(``model.layers.3.mlp.up_proj.weight``), the tensors a model of a config needs, and llama.cpp's
row permutation of a ``llama`` file's ``attn_q``/``attn_k`` (both directions). Read by
:mod:`fastspec.formats.gguf` and written by :mod:`fastspec.formats.gguf_write`.
"""
from __future__ import annotations

import numpy as np

from fastspec.model.config import ModelConfig
from fastspec.model.schema import MATRICES, hf_layer_keys
from fastspec.model.state import layer_schema

__all__ = ["TOP", "LEAF", "ROPE_FREQS", "gguf_tensor_name", "hf_shapes", "permute",
           "unpermute", "rotary_order"]

#: GGUF tensor names -> Hugging Face names (whole-model tensors, then per-layer leaves).
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}
LEAF = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # Gemma's sandwich norms (fastspec's keys, fastspec.model.schema)
    "post_attention_norm.weight": "post_attn_norm.weight",
    "post_ffw_norm.weight": "post_mlp_norm.weight",
}
_HF_TOP = {hf: g for g, hf in TOP.items()}
_HF_LEAF = {hf: g for g, hf in LEAF.items()}
#: Llama 3.1+'s per-frequency RoPE divisors, F32 of shape (head_dim // 2,)
#: (``ModelConfig.rope_freq_factors``; llama.cpp's converter writes them for ``"llama3"``).
ROPE_FREQS = "rope_freqs.weight"


def gguf_tensor_name(hf: str) -> str:
    """Return the GGUF name of a model's Hugging Face tensor name (``model.norm.weight`` ->
    ``output_norm.weight``, ``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``)."""
    if hf in _HF_TOP:
        return _HF_TOP[hf]
    _, _, layer, leaf = hf.split(".", 3)  # model.layers.N.<leaf>
    return f"blk.{layer}.{_HF_LEAF[leaf]}"


def hf_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Return every tensor a model of ``c`` needs: Hugging Face name -> shape in file layout
    (matrices ``(out, in)``, as ``nn.Linear`` and GGUF's row order keep them)."""
    shapes, attrs = layer_schema(c)
    out = {"model.embed_tokens.weight": (c.vocab_size, c.dim), "model.norm.weight": (c.dim,)}
    if not c.tie_embeddings:
        out["lm_head.weight"] = (c.vocab_size, c.dim)
    for i in range(c.n_layers):
        for attr, key in zip(attrs, hf_layer_keys(f"model.layers.{i}.", attrs)):
            out[key] = shapes[attr][::-1] if attr in MATRICES else shapes[attr]
    return out


def unpermute(rows: np.ndarray, head_rows: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation within each head of ``head_rows`` rows.

    ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders each head's rows from
    rotate-half pairs (HF) to adjacent pairs (ggml's normal RoPE); this is its inverse.
    ``rows`` : ndarray of shape (k * head_rows,) or (k * head_rows, in), whole heads.
    """
    n = rows.shape[0] // head_rows
    return (rows.reshape(n, head_rows // 2, 2, *rows.shape[1:]).swapaxes(1, 2)
            .reshape(rows.shape))


def permute(rows: np.ndarray, head_rows: int) -> np.ndarray:
    """Return ``rows`` in llama.cpp's q/k row order within each head of ``head_rows`` rows
    (the inverse of :func:`unpermute`): an array of the same shape."""
    n = rows.shape[0] // head_rows
    return (rows.reshape(n, 2, head_rows // 2, *rows.shape[1:]).swapaxes(1, 2)
            .reshape(rows.shape))


def rotary_order(rope_dims: int, head_dim: int) -> np.ndarray:
    """Return the order of a head's q/k rows for a partial rotary (``ModelConfig.rope_dims``).

    It makes the pairs ``(i, i + rope_dims / 2)``, ``i < rope_dims / 2`` (NeoX style over
    the first ``rope_dims`` rows) the rotate-half pairs ``(j, j + head_dim / 2)`` of the whole
    head, and the rows past ``rope_dims`` pairs of their own: ``[0, r) + [2r, 2r + p) + [r,
    2r) + [2r + p, head_dim)`` with ``r = rope_dims / 2``, ``p = (head_dim - rope_dims) / 2``.

    Parameters
    ----------
    rope_dims : int
        The rows RoPE turns (even, at most ``head_dim``).
    head_dim : int
        The head size (even).

    Returns
    -------
    ndarray of int64, shape (head_dim,)
        New row ``j`` is row ``order[j]`` of the file's head.
    """
    r, p = rope_dims // 2, (head_dim - rope_dims) // 2
    return np.concatenate([np.arange(0, r), np.arange(2 * r, 2 * r + p), np.arange(r, 2 * r),
                           np.arange(2 * r + p, head_dim)])
