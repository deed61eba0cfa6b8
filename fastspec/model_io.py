"""A Transformer's weights in and out: the Hugging Face state dict, ``.npz`` files, folders.

:class:`~fastspec.Transformer` inherits :class:`ModelIO`. Names and layout come from
:mod:`fastspec.schema`; Hugging Face folders are read and written by :mod:`fastspec.checkpoints`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fastspec._bf16 import BF16
from fastspec.checkpoints import read_hf, save_hf
from fastspec.config import ModelConfig
from fastspec.schema import layer_attrs, layer_from_state, layer_shapes, layer_state

if TYPE_CHECKING:
    from fastspec.model import Transformer

__all__ = ["ModelIO", "layer_schema"]


def layer_schema(c: ModelConfig) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """Shapes and present fields of a layer of ``c`` (see :mod:`fastspec.schema`)."""
    return (layer_shapes(c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim),
            layer_attrs(swiglu=c.activation == "swiglu", rmsnorm=c.norm == "rmsnorm",
                        qk_norm=c.qk_norm, qkv_bias=c.qkv_bias))


class ModelIO:
    """Persistence of a :class:`~fastspec.Transformer` (``config`` plus its weight arrays)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return the weights under Hugging Face names and layout (see docs/FORMATS.md)."""
        c = self.config
        sd = {"model.embed_tokens.weight": self.embed}
        if self.pos_embed is not None:
            sd["model.embed_positions.weight"] = self.pos_embed
        for i, lw in enumerate(self.layers):
            sd.update(layer_state(lw, f"model.layers.{i}."))
        if self.final_norm is not None:
            sd["model.norm.weight"] = self.final_norm
        if not c.tie_embeddings:
            sd["lm_head.weight"] = self.head.T
        return {k: np.ascontiguousarray(v) for k, v in sd.items()}

    @classmethod
    def from_state_dict(cls, config: ModelConfig, sd: dict[str, np.ndarray]) -> "Transformer":
        """Build a model from Hugging Face names and layout; missing tensors raise KeyError."""
        def get(key):
            if key not in sd:
                raise KeyError(f"missing tensor {key!r}")
            return np.asarray(sd[key])

        c = config
        attrs = layer_schema(c)[1]
        layers = [layer_from_state(get, f"model.layers.{i}.", attrs) for i in range(c.n_layers)]
        embed = get("model.embed_tokens.weight")
        head = embed.T if c.tie_embeddings else get("lm_head.weight").T
        final = get("model.norm.weight") if c.norm == "rmsnorm" else None
        pos = get("model.embed_positions.weight") if c.positional == "learned" else None
        return cls(c, embed, layers, head, final, pos)

    def save(self, path: str | Path) -> None:
        """Write the model to ``path``: an ``.npz`` file, or a Hugging Face folder otherwise."""
        path = Path(path)
        if path.suffix == ".npz":
            np.savez(path, config=np.array(json.dumps(self.config.to_dict())), **self.state_dict())
        else:
            save_hf(self, path)

    @classmethod
    def load(cls, path: str | Path, dtype: str | None = None,
             weight_dtype: str | None = None) -> "Transformer":
        """Load an ``.npz`` written by :meth:`save` or a Hugging Face checkpoint folder.

        Parameters
        ----------
        path : path-like
        dtype : {"float32", "float64"}, optional
            Compute dtype; default: the file's (float32 for a Hugging Face folder).
        weight_dtype : {"float16", "bfloat16", "float32", "float64"}, optional
            Storage dtype of the matrices (see :class:`ModelConfig`); default: the file's
            ``weight_dtype`` when it fits ``dtype`` (float16 and bfloat16 need float32), else
            ``dtype``. A bf16 Hugging Face checkpoint loaded with ``"bfloat16"`` keeps its bit
            patterns (no widening, no rounding).
        """
        path = Path(path)
        if path.is_dir():
            return cls.from_state_dict(*read_hf(path, dtype=dtype, weight_dtype=weight_dtype))
        from fastspec._npz import read_npz  # bounded: validates every header before reading
        cfg, sd = read_npz(path, "model")
        bits = sorted(k for k, a in sd.items() if a.dtype == np.uint16)
        if bits and cfg.get("weight_dtype") != BF16:
            raise ValueError(f"{path}: tensors {bits[:3]} hold uint16 (bf16 bit patterns) but the "
                             "config's weight_dtype is not 'bfloat16'")
        if dtype is not None:
            cfg["dtype"] = dtype
            if cfg.get("weight_dtype") in ("float16", BF16) and dtype != "float32":
                cfg["weight_dtype"] = None
        if weight_dtype is not None:
            cfg["weight_dtype"] = weight_dtype
        return cls.from_state_dict(ModelConfig.from_dict(cfg), sd)
