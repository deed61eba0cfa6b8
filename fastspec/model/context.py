"""The entries a DFlash drafter's layer stack runs: embeddings in, context K/V injected.

:class:`~fastspec.Transformer` inherits :class:`ContextForward`. Each entry runs the compiled
runner when the Cython backend is active (``self._fused()``), else the NumPy twin
(:class:`~fastspec.model.numpy_forward.NumpyForward`), like :meth:`Transformer.step`.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from fastspec.kernels.cache import KVCache
from fastspec.kernels.checks import check_index
from fastspec.model.config import ModelConfig
from fastspec.model.functional import layer_rope, rms_norm
from fastspec.model.output import ForwardOutput

try:  # packs the fusion matrix of write_context_taps' compiled path
    from fastspec.model._model_weights import linear_weights
except ImportError:  # pragma: no cover - source checkouts without a build
    linear_weights = None

__all__ = ["ContextForward"]


class ContextForward:
    """Context entries for a class with ``config``, ``_fused()``, ``check_cache`` and the
    :class:`~fastspec.model.numpy_forward.NumpyForward` helpers (see :class:`~fastspec.Transformer`)."""

    config: ModelConfig

    def forward_embeddings(self, x: np.ndarray, cache: KVCache, hidden_layers: Iterable[int] = (),
                           causal: bool = True, out: np.ndarray | None = None) -> ForwardOutput:
        """Run input embeddings through the layer stack WITHOUT advancing the cache.

        ``x`` sits at positions ``cache.length .. cache.length + n - 1``; its keys/values are
        written there (past the committed length, so the next write or
        :meth:`write_context_kv` overwrites them) and every position attends to the committed
        cache plus the new rows (all of them when ``causal=False``).

        Parameters
        ----------
        x : ndarray of shape (n, dim)
            Input embeddings in the model dtype, used as given (no position embedding is
            added; RoPE models rotate q/k at the new positions).
        cache : KVCache
            Its length is left unchanged.
        hidden_layers : iterable of int
        causal : bool, default True
        out : ndarray of shape (n, vocab_size), optional

        Returns
        -------
        ForwardOutput
            ``final_norm(x_out) @ head`` logits of shape (n, vocab_size) and the requested
            hidden states.
        """
        if type(cache) is not KVCache:
            self.check_cache(cache)
        with cache.claim():
            runner = self._fused()
            start = cache.length
            if runner is not None:
                logits, hidden = runner.forward_embeddings(x, cache.k, cache.v, start, causal,
                                                           hidden_layers, out)
                return ForwardOutput(logits, hidden)
            x = self._check_rows(x, "x")
            layers = self._check_step(cache, start, x.shape[0], hidden_layers)
            out = self._check_out(out, x.shape[0])
            logits, hidden = self._layers_numpy(x, cache, start, causal, layers, out)
        return ForwardOutput(logits, hidden)

    def _check_context_cache(self, cache: KVCache) -> None:
        """``check_cache``, and a cache of the model's own dtype: a DFlash drafter's context
        keys and values are written in it (a float16 cache serves the steps only)."""
        self.check_cache(cache)
        if cache.dtype != np.dtype(self.config.dtype):
            raise TypeError(f"context writes need a {self.config.dtype} cache, got "
                            f"{cache.dtype}")

    def write_context_kv(self, features: np.ndarray, cache: KVCache, layer: int | None = None,
                         advance: bool = True) -> None:
        """Project context features straight into the K/V cache (DFlash KV injection).

        For each layer ``l`` (or only ``layer``): ``k = features @ Wk_l`` (+ bias), per-head
        k-norm when ``qk_norm``, RoPE at positions ``cache.length ..``; ``v = features @
        Wv_l``. No input norm is applied to ``features``.

        Parameters
        ----------
        features : ndarray of shape (n, dim)
            Context features of positions ``cache.length .. cache.length + n - 1``.
        cache : KVCache
        layer : int, optional
            Write only this layer (negative counts from the end); default every layer.
        advance : bool, default True
            Mark the ``n`` positions as committed. Pass False while writing layer by layer.
        """
        features = self._check_rows(features, "features")
        n = features.shape[0]
        L = self.config.n_layers
        if layer is None:
            lo, hi = 0, L
        else:
            lo = check_index(layer, "layer", -L, L - 1) % L
            hi = lo + 1
        self._check_context_cache(cache)
        with cache.claim():
            start = cache.length
            self._check_room(cache, start, n)
            runner = self._fused()
            if runner is not None:
                runner.context_kv(features, cache.k, cache.v, start, lo, hi)
            else:
                tables = self._rope_rows(slice(start, start + n))
                layers = self._numpy_weights()[2]
                for i in range(lo, hi):  # a NoPE layer's keys unturned
                    self._store_kv(features, layers[i], cache.k[i], cache.v[i], start,
                                   *layer_rope(self.config, i, *tables))
            if advance:
                cache.advance(n)

    def write_context_taps(self, taps: np.ndarray, fc: np.ndarray, fc_norm: np.ndarray,
                           cache: KVCache) -> None:
        """Fuse tapped hidden states into context features and inject them into every layer.

        ``features = rms_norm(taps @ fc) * fc_norm`` (the model's eps), then
        :meth:`write_context_kv` of every layer at ``cache.length ..``, advancing the cache.
        The compiled path does both in one call and packs ``fc`` once (see
        :meth:`invalidate`); the NumPy path is the composition of the two steps.

        Parameters
        ----------
        taps : ndarray of shape (n, n_in)
            Concatenated target hidden states, model dtype, C-contiguous.
        fc : ndarray of shape (n_in, dim)
            Fusion matrix in ``(in, out)`` layout, model dtype.
        fc_norm : ndarray of shape (dim,)
            RMSNorm weight of the fused features.
        cache : KVCache
        """
        runner = self._fused()
        if runner is None:
            features = rms_norm(np.asarray(taps) @ fc, fc_norm, self.config.norm_eps)
            self.write_context_kv(np.ascontiguousarray(features, dtype=self.config.dtype), cache)
            return
        self._check_context_cache(cache)
        packed = self._packed_fc
        if packed is None or packed[0] is not fc:
            packed = self._packed_fc = (fc, linear_weights(fc))
        with cache.claim():
            runner.context_kv_taps(taps, packed[1], fc_norm, cache.k, cache.v, cache.length)
            cache.advance(taps.shape[0])
