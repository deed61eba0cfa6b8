"""DFlash block-diffusion drafter: KV injection of the target's hidden states, one-forward blocks.

The drafter ("DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036) is a
small stack of non-causal Llama-style layers that shares the target's token embedding and LM
head. It taps the outputs of a few target layers, fuses them into *context features*
(``rmsnorm(concat(taps) @ Wfc) * hidden_norm``), and injects them as extra keys/values in every
draft layer. A block ``[bonus, MASK, ..., MASK]`` of size B at positions ``P .. P+B-1`` is drafted
in one forward with bidirectional attention over ``[context K/V ; block K/V]``.

The context K/V depend only on the committed context, so they live in a :class:`KVCache` over
the draft layers: positions ``[0, P)`` are valid, new committed positions are appended after each
verification, and the block's own K/V are written *past* the valid length (scratch space that the
next append overwrites) and never kept. The exact math and the ``.npz`` layout are in
``docs/FORMATS.md`` (section "DFlash drafter").
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from fastspec.kernels.bf16 import as_storage
from fastspec.kernels.checks import check_index
from fastspec.formats import json_io
from fastspec.formats.npz import read_npz
from fastspec.kernels.cache import KVCache
from fastspec.model.config import ModelConfig
from fastspec.drafters.dflash_config import (CONTEXT_WINDOW_KEY, MAX_BLOCK_SIZE, DFlashConfig,
                                     default_tap_layers)
from fastspec.formats.dflash_folder import (check_fingerprint_array, fingerprint_array, read_dflash_folder,
                                save_dflash_folder)
from fastspec.model.functional import apply_rope, rms_norm, rope_tables, silu
from fastspec.model.transformer import Transformer
from fastspec.model.schema import (MATRICES, LayerWeights, check_layer, layer_attrs, layer_from_state,
                             layer_shapes, layer_state, random_layer)

__all__ = ["DFlashConfig", "DFlashModel", "MAX_BLOCK_SIZE", "default_tap_layers"]

def _draft_layer_schema(c: DFlashConfig, dim: int) -> tuple[dict, tuple[str, ...]]:
    """Shapes and fields of a draft layer (SwiGLU, RMSNorm, optional QK-norm, no biases)."""
    return (layer_shapes(dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim),
            layer_attrs(swiglu=True, rmsnorm=True, qk_norm=c.qk_norm, qkv_bias=False))


class DFlashModel:
    """A DFlash drafter bound to its target (whose embedding and head it uses, uncopied).

    Parameters
    ----------
    config : DFlashConfig
        Resolved against ``target`` here (None fields filled from the target).
    target : Transformer
        The model being drafted for; its ``embed`` (V, dim) and ``head`` (dim, V) are read, not
        copied, and its tapped hidden states are the drafter's input.
    fc : ndarray of shape (len(tap_layers) * dim, dim)
        Fusion of the concatenated taps, ``(in, out)`` layout.
    hidden_norm : ndarray of shape (dim,)
    layers : list of LayerWeights
        SwiGLU + RMSNorm layers (``w_gate``, ``attn_norm``, ``mlp_norm`` required; ``q_norm``,
        ``k_norm`` when ``qk_norm``), ``(in, out)`` layout.
    norm : ndarray of shape (dim,)
        Final RMSNorm before the target's head.

    Notes
    -----
    Cache protocol (``cache`` from :meth:`new_cache`): positions ``[0, cache.length)`` hold the
    context K/V of committed positions; :meth:`append_context` extends them; the block methods
    write the block's K/V at ``cache.length ..`` without advancing the length.
    """

    def __init__(self, config: DFlashConfig, target: Transformer, fc: np.ndarray,
                 hidden_norm: np.ndarray, layers: Sequence[LayerWeights], norm: np.ndarray) -> None:
        if not isinstance(target, Transformer):
            raise TypeError(f"target must be a Transformer, got {type(target).__name__}")
        if not isinstance(config, DFlashConfig):
            raise TypeError(f"config must be a DFlashConfig, got {type(config).__name__}")
        self.target = target
        self.config = c = config.resolve(target.config)
        for name, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                              ("final_logit_softcapping", 0.0)):
            if float(getattr(c, name)) != default:
                raise NotImplementedError(
                    f"{name} = {getattr(c, name)} is not supported by fastspec's DFlash block "
                    f"forward yet (only {default}); DFlashModel.block_logits shows the math")
        dt = np.dtype(target.config.dtype)
        self.dtype = dt
        # The layers' projections follow the target's weight_dtype (float16/bfloat16: half the
        # bytes per block forward); fc and the norms stay in the compute dtype.
        # A quantized target's stack quantizes the float layers itself (self.layers keep
        # the float values the files hold).
        wdt = dt.name if target.config.quantized else target.config.matrix_dtype
        cast = lambda a, t=dt.name: None if a is None else as_storage(a, t)  # noqa: E731
        self.fc = cast(fc)
        self.hidden_norm = cast(hidden_norm)
        self.layers = [LayerWeights(**{k: cast(v, wdt if k in MATRICES else dt)
                                       for k, v in lw.arrays().items()}) for lw in layers]
        self.norm = cast(norm)
        self._check_shapes()
        self.max_positions = target.config.max_seq_len + c.block_size
        #: Context positions the drafter was trained to read (None: unbounded); the default
        #: sliding window of :class:`~fastspec.DFlashDrafter`. Kept in fastspec's ``.npz``
        #: (the trainer writes its sequence length minus the block), not in z-lab folders.
        self.context_window: int | None = None
        # The draft layers as a Transformer that shares the target's embedding and head (no
        # copies: same dtype, contiguous) and the drafter's own layer/norm arrays. Its fused
        # Cython runner (or NumPy twin) does the block forward and the K/V injection.
        self._stack = Transformer(self._stack_config(), target.embed, self.layers, target.head,
                                  self.norm)
        self.rope_cos, self.rope_sin = self._stack.rope_cos, self._stack.rope_sin
        self._out = np.empty((c.block_size, target.config.vocab_size), dtype=dt)

    def _stack_config(self) -> ModelConfig:
        c, t = self.config, self.target.config
        return ModelConfig(vocab_size=t.vocab_size, dim=t.dim, n_layers=c.n_layers,
                           n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
                           ffn_dim=c.ffn_dim, max_seq_len=self.max_positions, norm="rmsnorm",
                           positional="rope", activation="swiglu", tie_embeddings=False,
                           rope_theta=c.rope_theta, norm_eps=c.norm_eps, dtype=t.dtype,
                           qk_norm=c.qk_norm, weight_dtype=t.weight_dtype,
                           rope_freq_factors=c.rope_freq_factors)

    # --- construction -------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self.target.config.dim

    def _check_shapes(self) -> None:
        c, d = self.config, self.target.config.dim
        n_in = len(c.tap_layers) * d
        for name, a, shape in (("fc", self.fc, (n_in, d)), ("hidden_norm", self.hidden_norm, (d,)),
                               ("norm", self.norm, (d,))):
            if a is None or a.shape != shape:
                got = None if a is None else a.shape
                raise ValueError(f"{name} must have shape {shape} (target dim {d}, "
                                 f"{len(c.tap_layers)} taps), got {got}")
        if len(self.layers) != c.n_layers:
            raise ValueError(f"expected {c.n_layers} draft layers, got {len(self.layers)}")
        shapes, attrs = _draft_layer_schema(c, d)
        for i, lw in enumerate(self.layers):
            check_layer(lw, f"draft layer {i}", shapes, attrs)

    @classmethod
    def random(cls, config: DFlashConfig, target: Transformer, seed: int = 0) -> "DFlashModel":
        """Return a drafter with random weights from ``numpy.random.default_rng(seed)``."""
        if not isinstance(target, Transformer):
            raise TypeError(f"target must be a Transformer, got {type(target).__name__}")
        c = config.resolve(target.config)
        rng = np.random.default_rng(seed)
        d = target.config.dim
        fc = rng.normal(0.0, 1.0 / math.sqrt(len(c.tap_layers) * d), (len(c.tap_layers) * d, d))
        hidden_norm = 1.0 + 0.1 * rng.normal(size=d)
        shapes, attrs = _draft_layer_schema(c, d)
        layers = [random_layer(rng, shapes, attrs) for _ in range(c.n_layers)]
        norm = 1.0 + 0.1 * rng.normal(size=d)
        return cls(c, target, fc, hidden_norm, layers, norm)

    # --- persistence ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return the drafter's own weights under the names and layout of docs/FORMATS.md."""
        sd = {"fc.weight": self.fc.T, "hidden_norm.weight": self.hidden_norm}
        for i, lw in enumerate(self.layers):
            sd.update(layer_state(lw, f"layers.{i}."))
        sd["norm.weight"] = self.norm
        return {k: np.ascontiguousarray(v) for k, v in sd.items()}

    @classmethod
    def from_state_dict(cls, config: DFlashConfig, target: Transformer,
                        sd: Mapping[str, np.ndarray]) -> "DFlashModel":
        """Build a drafter from FORMATS.md names/layout; a missing tensor raises KeyError."""
        def get(key):
            if key not in sd:
                raise KeyError(f"missing tensor {key!r}")
            return np.asarray(sd[key])

        c = config.resolve(target.config)
        fc_t = get("fc.weight")
        n_in = len(c.tap_layers) * target.config.dim
        if fc_t.shape != (target.config.dim, n_in):
            raise ValueError(f"fc.weight has shape {fc_t.shape}, but the target (dim "
                             f"{target.config.dim}) with {len(c.tap_layers)} taps needs "
                             f"{(target.config.dim, n_in)}: the drafter was made for another target")
        attrs = _draft_layer_schema(c, target.config.dim)[1]
        layers = [layer_from_state(get, f"layers.{i}.", attrs) for i in range(c.n_layers)]
        return cls(c, target, fc_t.T, get("hidden_norm.weight"), layers, get("norm.weight"))

    def save(self, path: str | Path) -> None:
        """Write the drafter (resolved config + own weights, no embedding/head).

        A path ending in ``.npz`` gets fastspec's file; any other path becomes a folder in
        z-lab's format (``config.json`` + ``model.safetensors``, see
        :mod:`fastspec.formats.dflash_folder`) that ``dflash.DFlashDraftModel.from_pretrained`` loads.
        """
        path = Path(path)
        if path.suffix != ".npz":
            save_dflash_folder(self, path)
            return
        cfg = self.config.to_dict()
        if self.context_window is not None:
            cfg[CONTEXT_WINDOW_KEY] = int(self.context_window)
        np.savez(path, config=np.array(json_io.dumps(cfg)),
                 target_fingerprint=fingerprint_array(self.target), **self.state_dict())

    @classmethod
    def load(cls, path: str | Path, target: Transformer) -> "DFlashModel":
        """Load a drafter for ``target``: an ``.npz`` written by :meth:`save` (or the torch
        trainer), or a folder in z-lab's format (their published DFlash drafters).

        Raises
        ------
        ValueError
            If the file is not a DFlash file, or its width, vocabulary, taps or MASK id do not
            fit ``target``, or it was saved for another target (file and field named).
        """
        if not isinstance(target, Transformer):
            raise TypeError(f"target must be a Transformer, got {type(target).__name__}")
        path = Path(path)
        if path.is_dir():
            fields, sd = read_dflash_folder(path, target, MAX_BLOCK_SIZE)
            return cls.from_state_dict(DFlashConfig(**fields), target, sd)
        cfg, sd = read_npz(path, "DFlash", required=("fc.weight",))  # bounded, no pickle
        fingerprint = sd.pop("target_fingerprint", None)
        window = cfg.pop(CONTEXT_WINDOW_KEY, None)
        model = cls.from_state_dict(DFlashConfig.from_dict(cfg), target, sd)  # shapes first
        if fingerprint is not None:  # files saved before it have none (the embedded one)
            check_fingerprint_array(fingerprint, target, str(path))
        if window is not None:
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise ValueError(f"{path}: config field {CONTEXT_WINDOW_KEY!r} must be a "
                                 f"positive integer, got {window!r}")
            model.context_window = window
        return model

    @property
    def n_params(self) -> int:
        """Number of the drafter's own parameters (the shared embedding/head not counted)."""
        return int(sum(a.size for a in self.state_dict().values()))

    def invalidate(self) -> None:
        """Forget the drafter's fused runners; call after updating its weights or the target's
        embedding or head in place (float32 runners hold packed copies of the matrices)."""
        self._stack.invalidate()

    def __repr__(self) -> str:
        c = self.config
        return (f"DFlashModel(block_size={c.block_size}, n_layers={c.n_layers}, "
                f"tap_layers={list(c.tap_layers)}, n_heads={c.n_heads}, n_kv_heads={c.n_kv_heads}, "
                f"mask_token_id={c.mask_token_id}, dtype={self.dtype}, params={self.n_params})")

    # --- context ------------------------------------------------------------------------

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """Return an empty context cache (default capacity: target max_seq_len + block_size)."""
        c = self.config
        capacity = (self.max_positions if capacity is None
                    else check_index(capacity, "capacity", c.block_size, self.max_positions))
        return KVCache(c.n_layers, c.n_kv_heads, capacity, c.head_dim, self.dtype)

    def check_cache(self, cache: KVCache) -> None:
        """Raise if ``cache`` was not made by :meth:`new_cache` of a drafter of this shape."""
        c = self.config
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        want = (c.n_layers, c.n_kv_heads, c.head_dim, self.dtype)
        got = (cache.k.shape[0], cache.k.shape[1], cache.k.shape[3], cache.k.dtype)
        if want != got:
            raise ValueError(f"cache (layers, kv heads, head_dim, dtype) = {got} does not match "
                             f"the drafter's {want}")

    def tap(self, hidden: Mapping[int, np.ndarray], n: int | None = None) -> np.ndarray:
        """Return the concatenated tapped hidden states, shape (n, len(tap_layers) * dim).

        ``hidden`` maps target layer index -> (n, dim) (extra layers are ignored).
        """
        if hidden is None:
            raise ValueError(f"hidden must hold the target layers {list(self.config.tap_layers)}, "
                             "got None")
        parts = []
        for t in self.config.tap_layers:
            if t not in hidden:
                raise ValueError(f"hidden has no entry for tapped target layer {t} "
                                 f"(needs {list(self.config.tap_layers)})")
            a = np.asarray(hidden[t])
            if a.ndim != 2 or a.shape[1] != self.dim:
                raise ValueError(f"hidden[{t}] must have shape (n, {self.dim}), got {a.shape}")
            if n is not None and a.shape[0] != n:
                raise ValueError(f"hidden[{t}] must have {n} rows, got {a.shape[0]}")
            n = a.shape[0]
            if self.config.last_tap_normed and t == self.target.config.n_layers - 1:
                a = self.target.norm(a.astype(self.dtype, copy=False), self.target.final_norm)
            parts.append(a.astype(self.dtype, copy=False))
        return np.concatenate(parts, axis=1)

    def context_features(self, hidden: Mapping[int, np.ndarray]) -> np.ndarray:
        """Return the context features ``rmsnorm(concat(taps) @ Wfc) * hidden_norm``.

        Parameters
        ----------
        hidden : dict[int, ndarray of shape (n, dim)]
            Target hidden states (layer outputs) of ``n`` positions, for every tapped layer.

        Returns
        -------
        ndarray of shape (n, dim)
        """
        return rms_norm(self.tap(hidden) @ self.fc, self.hidden_norm, self.config.norm_eps)

    def append_context(self, cache: KVCache, features: np.ndarray, start: int | None = None) -> None:
        """Project context features into every draft layer's K/V and commit them to ``cache``.

        Parameters
        ----------
        cache : KVCache
            Context cache from :meth:`new_cache`; on return its length is ``start + n``.
        features : ndarray of shape (n, dim)
            From :meth:`context_features`, for positions ``start .. start + n - 1``.
        start : int, optional
            First position (default ``cache.length``). A smaller value rolls the cache back to
            ``start`` first (crop); a larger one is an error (a gap in the context).
        """
        features = np.asarray(features)
        if features.ndim != 2 or features.shape[1] != self.dim:
            raise ValueError(f"features must have shape (n, {self.dim}), got {features.shape}")
        n = features.shape[0]
        self._rewind_for(cache, n, start)
        if n:
            self._stack.write_context_kv(np.ascontiguousarray(features, dtype=self.dtype), cache)

    def _rewind_for(self, cache: KVCache, n: int, start: int | None) -> None:
        """Check that ``n`` context positions fit at ``start`` (default ``cache.length``) with
        room for a block, then crop ``cache`` to ``start``."""
        self.check_cache(cache)
        start = cache.length if start is None else check_index(start, "start", 0, cache.length)
        block = self.config.block_size
        if start + n + block > cache.capacity:
            raise ValueError(f"context of {start + n} positions plus a block of {block} "
                             f"exceeds the cache capacity {cache.capacity}")
        cache.crop(start)

    def append_hidden(self, cache: KVCache, hidden: Mapping[int, np.ndarray],
                      start: int | None = None) -> None:
        """:meth:`append_context` of :meth:`context_features` ``(hidden)``: the drafter's step
        after each verification.

        With the Cython backend the features are computed and injected in one fused call (the
        NumPy twin is the composition of the two methods; results agree within rounding).

        Parameters
        ----------
        cache : KVCache
        hidden : dict[int, ndarray of shape (n, dim)]
            Target hidden states of the ``n`` new positions for every tapped layer.
        start : int, optional
            As in :meth:`append_context`.
        """
        taps = self.tap(hidden)  # (n, taps * dim), the model dtype
        self.check_cache(cache)
        with cache.claim():
            self._rewind_for(cache, taps.shape[0], start)
            if taps.shape[0]:
                self._stack.write_context_taps(np.ascontiguousarray(taps), self.fc,
                                               self.hidden_norm, cache)

    # --- block forward --------------------------------------------------------------------

    def check_block(self, block_tokens) -> np.ndarray:
        """Return ``block_tokens`` as int64, checking ``2 <= len <= block_size`` and the ids."""
        ids = self.target.check_ids(block_tokens, "block_tokens")
        check_index(ids.shape[0], "len(block_tokens)", 2, self.config.block_size)
        return ids

    def mask_block(self, bonus_token: int) -> np.ndarray:
        """Return the initial block ``[bonus_token, MASK * (block_size - 1)]`` (int64)."""
        bonus = check_index(bonus_token, "bonus_token", 0, self.target.config.vocab_size - 1)
        block = np.full(self.config.block_size, self.config.mask_token_id, dtype=np.int64)
        block[0] = bonus
        return block

    def forward_block(self, cache: KVCache, block_tokens) -> np.ndarray:
        """Return the logits of a block's positions 1.. after one non-causal forward.

        Parameters
        ----------
        cache : KVCache
            Context cache holding positions ``[0, P)``, ``P = cache.length``. The block's K/V
            are written at ``P .. P+n-1`` as scratch; the length does not change.
        block_tokens : sequence of int, length n (2 <= n <= block_size)
            ``[last committed token, then MASK or already-filled tokens]`` at positions
            ``P .. P+n-1``.

        Returns
        -------
        logits : ndarray of shape (n - 1, vocab_size)
            Row ``j`` scores the token at position ``P + 1 + j``. For a full block this is a
            view of a buffer that the next block forward overwrites (no per-round allocation).
        """
        ids = self.check_block(block_tokens)
        P, n = cache.length, ids.shape[0]
        if P + n > cache.capacity:
            raise ValueError(f"context of {P} positions plus a block of {n} exceeds the cache "
                             f"capacity {cache.capacity}")
        # Non-causal forward of the block at P ..; the block's K/V stay in the buffer past
        # the committed length as scratch, never as context.
        out = self._out if n == self.config.block_size else None
        return self._stack.step(ids, cache, causal=False, out=out, advance=False).logits[1:]

    def draft_block(self, cache: KVCache, bonus_token: int) -> np.ndarray:
        """Return the logits (block_size - 1, vocab_size) of ``[bonus, MASK, ...]`` at ``cache.length``.

        One non-causal forward (see :meth:`forward_block`); the result is a view of a buffer
        that the next block forward overwrites, copy it to keep it.
        """
        return self.forward_block(cache, self.mask_block(bonus_token))

    def draft_block_reference(self, hidden: Mapping[int, np.ndarray], block_tokens) -> np.ndarray:
        """Same as :meth:`block_logits` (its former name)."""
        return self.block_logits(hidden, block_tokens)

    def block_logits(self, hidden: Mapping[int, np.ndarray], block_tokens) -> np.ndarray:
        """Return a block's logits from raw target hidden states: slow, explicit, no cache.

        Builds the context features of all ``P`` context positions, each layer's full key/value
        matrices ``[context ; block]`` and the non-causal softmax attention head by head, as
        written in docs/FORMATS.md (and as z-lab's ``DFlashDraftModel`` does). The test oracle
        of :meth:`forward_block`.

        Parameters
        ----------
        hidden : dict[int, ndarray of shape (P, dim)]
            Target hidden states (layer outputs, before the final norm) of the context
            positions ``0 .. P-1`` (P may be 0), for every tapped layer.
        block_tokens : sequence of int, length n
            The block at positions ``P .. P+n-1``.

        Returns
        -------
        logits : ndarray of shape (n - 1, vocab_size)
            Row ``j`` scores the token at position ``P + 1 + j``.
        """
        c = self.config
        ids = self.check_block(block_tokens)
        n = ids.shape[0]
        ctx = rms_norm(self.tap(hidden) @ self.fc, self.hidden_norm, c.norm_eps)
        P = ctx.shape[0]
        H, Hkv, D, eps = c.n_heads, c.n_kv_heads, c.head_dim, c.norm_eps
        cos, sin = rope_tables(P + n, D, c.rope_theta, self.dtype, c.rope_freq_factors)
        embed, head, layers = self._stack._numpy_weights()  # matrices in the compute dtype
        x = embed[ids] * np.asarray(c.input_embedding_scale, dtype=self.dtype)
        for lw in layers:
            h = rms_norm(x, lw.attn_norm, eps)
            q = (h @ lw.wq).reshape(n, H, D)
            k = np.concatenate([ctx @ lw.wk, h @ lw.wk]).reshape(P + n, Hkv, D)
            v = np.concatenate([ctx @ lw.wv, h @ lw.wv]).reshape(P + n, Hkv, D)
            if c.qk_norm:
                q = rms_norm(q, lw.q_norm, eps)
                k = rms_norm(k, lw.k_norm, eps)
            q = apply_rope(q, cos[P:], sin[P:])
            k = apply_rope(k, cos, sin)
            a = np.empty((n, H, D), dtype=np.float64)
            for hh in range(H):
                g = hh // (H // Hkv)
                s = (q[:, hh, :].astype(np.float64) @ k[:, g, :].T.astype(np.float64)) / math.sqrt(D)
                s = np.exp(s - s.max(axis=1, keepdims=True))  # every query sees all P + n keys
                a[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g, :].astype(np.float64)
            x = x + a.astype(self.dtype).reshape(n, H * D) @ lw.wo
            h = rms_norm(x, lw.mlp_norm, eps)
            x = x + (silu(h @ lw.w_gate) * (h @ lw.w_up)) @ lw.w_down
        logits = (rms_norm(x[1:], self.norm, eps) @ head) * np.asarray(c.output_multiplier,
                                                                         dtype=self.dtype)
        cap = c.final_logit_softcapping
        return np.tanh(logits / cap) * cap if cap > 0 else logits
