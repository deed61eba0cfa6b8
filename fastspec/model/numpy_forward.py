"""The NumPy twin of the fused runner: a Transformer's layers in plain NumPy.

:class:`~fastspec.Transformer` inherits :class:`NumpyForward`; its :meth:`step` runs this path
when the NumPy backend is active (or the extension is not built), and the tests compare the
two paths. The math itself is :mod:`fastspec.model.functional`.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from fastspec import kernels
from fastspec.kernels.cache import KVCache
from fastspec.model.config import ModelConfig
from fastspec.model.functional import (apply_rope, gelu_tanh, layer_norm, layer_rope,
                                       layer_window, linear, rms_norm, silu)
from fastspec.model.schema import LayerWeights

__all__ = ["NumpyForward"]


class NumpyForward:
    """The layer stack in NumPy, for a class with ``config``, ``rope_cos``/``rope_sin`` (and
    ``rope_cos_local``/``rope_sin_local``),
    ``final_norm``, ``check_cache`` and ``_numpy_weights()`` (see :class:`~fastspec.Transformer`).

    The argument checks here are the NumPy path's; the compiled runner makes the same ones
    before its ``nogil`` section."""

    config: ModelConfig
    rope_cos: np.ndarray | None
    rope_sin: np.ndarray | None
    rope_cos_local: np.ndarray | None
    rope_sin_local: np.ndarray | None

    def _check_step(self, cache: KVCache, start: int, n: int,
                    hidden_layers: Iterable[int]) -> tuple[int, ...]:
        """The NumPy path's checks of a step (the compiled runner makes the same ones)."""
        layers = self.check_hidden_layers(hidden_layers)
        self.check_cache(cache)
        self._check_room(cache, start, n)
        return layers

    def _check_room(self, cache: KVCache, start: int, n: int) -> None:
        if start + n > cache.capacity:
            raise ValueError(f"cache holds {start} positions; {n} more exceed its capacity {cache.capacity}")
        if start + n > self.config.max_seq_len:
            raise ValueError(f"positions up to {start + n} exceed max_seq_len {self.config.max_seq_len}")

    def _check_rows(self, x, name: str) -> np.ndarray:
        dt, d = np.dtype(self.config.dtype), self.config.dim
        if not isinstance(x, np.ndarray) or x.dtype != dt or x.ndim != 2 or x.shape[1] != d or x.shape[0] < 1:
            raise ValueError(f"{name} must be a {dt} array of shape (n >= 1, {d})")
        return x

    def _check_out(self, out, n: int):
        if out is None:
            return None
        dt, V = np.dtype(self.config.dtype), self.config.vocab_size
        if (not isinstance(out, np.ndarray) or out.dtype != dt or out.shape != (n, V)
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous {dt} array of shape ({n}, {V})")
        return out

    def _rope_rows(self, rows) -> tuple:
        """``(cos, sin, local_cos, local_sin)``: the rows ``rows`` (a slice or positions) of
        the RoPE tables and of the local ones (:func:`~fastspec.model.functional.layer_rope`
        picks a layer's), None where the model has none."""
        tables = (self.rope_cos, self.rope_sin, self.rope_cos_local, self.rope_sin_local)
        return tuple(None if t is None else t[rows] for t in tables)

    def _layers_numpy(self, x, cache, start, causal, hidden_layers, out, positions=None,
                      tree_mask=None, logit_rows=None):
        n = x.shape[0]
        tables = self._rope_rows(slice(start, start + n) if tree_mask is None else positions)
        _, head, layers = self._numpy_weights()
        hidden = {}
        for i, lw in enumerate(layers):
            x = self.layer_forward(x, lw, cache.k[i], cache.v[i], start,
                                   *layer_rope(self.config, i, *tables), causal, tree_mask,
                                   layer_window(self.config, i))
            if i in hidden_layers:
                hidden[i] = x.copy()
        logits = self.norm(x, self.final_norm) @ head
        if logit_rows is not None:  # the last rows, computed in the full product: BLAS may
            logits = logits[logits.shape[0] - logit_rows:]  # round one row alone otherwise
        if out is not None:
            out[...] = logits
            logits = out
        return logits, hidden

    def norm(self, x: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
        """Apply the family's normalisation (RMSNorm with ``weight``, or plain LayerNorm)."""
        if self.config.norm == "rmsnorm":
            return rms_norm(x, weight, self.config.norm_eps)
        return layer_norm(x, self.config.norm_eps)

    def _store_kv(self, h, lw: LayerWeights, k_cache, v_cache, start, cos, sin) -> None:
        """Project ``h`` (n, dim) to keys/values (k-norm, RoPE) and write them at ``start ..``."""
        c = self.config
        n = h.shape[0]
        k = linear(h, lw.wk, lw.k_bias).reshape(n, c.n_kv_heads, c.head_dim)
        v = linear(h, lw.wv, lw.v_bias).reshape(n, c.n_kv_heads, c.head_dim)
        if c.qk_norm:
            k = rms_norm(k, lw.k_norm, c.norm_eps)
        if cos is not None:
            k = apply_rope(k, cos, sin)
        kernels.cache_write(k_cache, np.ascontiguousarray(k), start)
        kernels.cache_write(v_cache, np.ascontiguousarray(v), start)

    def layer_forward(self, x, lw: LayerWeights, k_cache, v_cache, start, cos, sin, causal=True,
                      tree_mask=None, window=None):
        """One decoder layer on ``x`` (n, dim) at positions ``start ..``; returns the new x.

        Writes the new keys/values into ``k_cache``/``v_cache`` (n_kv_heads, C, head_dim) at
        ``start ..`` and attends over positions ``[0, start + n)`` (those of a sliding ``window``
        when given: :func:`fastspec.kernels.attention`). ``lw`` holds matrices in the
        compute dtype (for float16 weights: an entry of ``_numpy_weights()[2]``).
        """
        c = self.config
        n = x.shape[0]
        h = self.norm(x, lw.attn_norm)
        q = linear(h, lw.wq, lw.q_bias).reshape(n, c.n_heads, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, lw.q_norm, c.norm_eps)
        if cos is not None:
            q = apply_rope(q, cos, sin)
        self._store_kv(h, lw, k_cache, v_cache, start, cos, sin)
        if tree_mask is None:
            a = kernels.attention(np.ascontiguousarray(q), k_cache, v_cache, start + n, causal,
                                  window=window)
        else:  # each tree node sees the cache and its ancestors (tree_mask, n x n)
            a = kernels.tree_attention(np.ascontiguousarray(q), k_cache, v_cache, start + n,
                                       tree_mask, window=window)
        a = a.reshape(n, -1) @ lw.wo
        x = x + (a if lw.attn_post_norm is None else self.norm(a, lw.attn_post_norm))
        h = self.norm(x, lw.mlp_norm)
        if c.activation == "swiglu":
            f = silu(h @ lw.w_gate) * (h @ lw.w_up)
        elif c.activation == "geglu":
            f = gelu_tanh(h @ lw.w_gate) * (h @ lw.w_up)
        elif c.activation == "tanh":
            f = np.tanh(h @ lw.w_up)
        else:
            f = gelu_tanh(h @ lw.w_up)
        f = f @ lw.w_down
        return x + (f if lw.mlp_post_norm is None else self.norm(f, lw.mlp_post_norm))
