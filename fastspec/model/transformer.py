"""Transformer: causal decoders (toy and Llama/Qwen-style) over a KV cache."""
from __future__ import annotations

import dataclasses
import math
import threading
from typing import Iterable, Sequence

import numpy as np

from fastspec import kernels
from fastspec.kernels.bf16 import BF16, RoundingMatrix, as_storage, from_bits, storage_dtype
from fastspec.kernels.checks import check_index, int_range
from fastspec.kernels.quant import gather as _gather_quant
from fastspec.kernels.cache import KVCache, cache_dtype
from fastspec.model.config import ModelConfig
from fastspec.model.context import ContextForward
from fastspec.model.output import ForwardOutput
from fastspec.model.numpy_forward import NumpyForward
from fastspec.model.functional import rope_tables
from fastspec.model import quantized as _q
from fastspec.model.schema import (FORWARD_MATRICES, MATRICES, LayerWeights, check_layer,
                                   random_layer)
from fastspec.model.state import StateDict, layer_schema
from fastspec.kernels.tree_shape import MAX_TREE_NODES, ancestor_mask, check_parents

try:  # the fused forward; without it every model runs on the NumPy path
    from fastspec.model import _model as _model_ext
    from fastspec.model import _model_weights
except ImportError:  # pragma: no cover - exercised by source checkouts without a build
    _model_ext = _model_weights = None

__all__ = ["ModelConfig", "Transformer", "ForwardOutput", "LayerWeights"]

#: LayerWeights fields stored in ``ModelConfig.weight_dtype`` (with ``embed`` and ``head``).
_MATRICES = MATRICES

def _is_transpose_of(a, b) -> bool:
    """Whether ndarray ``a`` is a view of ndarray ``b``'s transpose (same memory, same dtype)."""
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == b.ndim == 2
            and a.dtype == b.dtype and a.shape == b.shape[::-1]
            and a.strides == b.strides[::-1]
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _as_matrix(a, name: str) -> np.ndarray:
    """``a`` in storage dtype ``name``: C-contiguous, or kept as it is when it already is the
    transpose of a C-contiguous array of that dtype (a mapped file tensor's ``(in, out)``
    view; the compiled runner packs from either)."""
    if (isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype == storage_dtype(name)
            and a.T.flags.c_contiguous):
        return a
    return as_storage(a, name)


class Transformer(ContextForward, NumpyForward, StateDict):
    """A causal decoder over a preallocated KV cache.

    Parameters
    ----------
    config : ModelConfig
    embed : ndarray of shape (vocab_size, dim)
    layers : list of LayerWeights
    head : ndarray of shape (dim, vocab_size)
        Output projection in ``(in, out)`` layout. ``embed.T`` (a tied head) stays a view of
        the stored embedding: one copy of the matrix, which the compiled runner packs from
        there, and an in-place update of either is an update of both.
        ``embed``, ``head`` and the layers' projections are converted to
        ``config.matrix_dtype``, everything else to ``config.dtype`` (C-contiguous; a matrix
        that already is the transpose of a C-contiguous array in its storage dtype, as a
        mapped file tensor is, stays a view). A uint16 array is read as bf16 bit patterns
        (kept for bfloat16 matrices, else widened).
    final_norm : ndarray of shape (dim,), optional
        RMSNorm weight (Llama family).
    pos_embed : ndarray of shape (max_seq_len, dim), optional
        Learned absolute positions (toy family).
    """

    def __init__(self, config: ModelConfig, embed: np.ndarray, layers: Sequence[LayerWeights],
                 head: np.ndarray, final_norm: np.ndarray | None = None,
                 pos_embed: np.ndarray | None = None) -> None:
        self.config = config
        dt, wdt = config.dtype, config.matrix_dtype
        cast = lambda a, t=dt: None if a is None else as_storage(a, t)  # noqa: E731
        if config.quantized:  # QuantMatrix (out, in); a tied head is the embedding itself
            mat = lambda a: _q.as_quant(a, wdt)  # noqa: E731
            self.embed = _q.as_quant(embed, wdt, rows_are_outputs=True)
            tied = head is embed or _is_transpose_of(head, embed)
            self.head = self.embed if tied else mat(head)
        else:
            mat = lambda a: _as_matrix(a, wdt)  # noqa: E731
            self.embed = cast(embed, wdt)
            # a tied head stays a view; the very object when the embedding needed no cast (as
            # a DFlash stack's over its target's: runners share packed copies by identity)
            recast = _is_transpose_of(head, embed) and self.embed is not embed
            self.head = self.embed.T if recast else _as_matrix(head, wdt)
        self.layers = [LayerWeights(**{k: mat(v) if k in _MATRICES else cast(v)
                                       for k, v in lw.arrays().items()}) for lw in layers]
        self.final_norm = cast(final_norm)
        self.pos_embed = cast(pos_embed)
        self._check_shapes()
        if config.quantized:
            self._gather()
        self.rope_cos = self.rope_sin = self.rope_cos_local = self.rope_sin_local = None
        if config.positional == "rope":
            self.rope_cos, self.rope_sin = rope_tables(config.max_seq_len, config.head_dim,
                                                       config.rope_theta, dt,
                                                       config.rope_freq_factors,
                                                       config.rope_attention_factor,
                                                       config.rope_dims)
        if config.local_layers:  # Gemma 3's sliding-window layers: their base, no divisors
            self.rope_cos_local, self.rope_sin_local = rope_tables(
                config.max_seq_len, int(config.head_dim or 0),
                config.local_rope_theta or config.rope_theta, dt, None,
                config.rope_attention_factor, config.rope_dims)
        self._runners = threading.local()
        self._packed_fc = None  # (fc, packed fc) of write_context_taps' compiled path
        self._wide = None  # 16-bit matrices widened for the NumPy path (see _numpy_weights)

    # --- construction -------------------------------------------------------------------

    @classmethod
    def random(cls, config: ModelConfig, seed: int = 0) -> "Transformer":
        """Return a model with random weights drawn from ``numpy.random.default_rng(seed)``."""
        rng = np.random.default_rng(seed)
        c = config
        d = c.dim
        toy = c.norm == "layernorm"
        embed = rng.normal(0.0, 0.3 if toy else 1.0, (c.vocab_size, d))
        pos = rng.normal(0.0, 0.1, (c.max_seq_len, d)) if c.positional == "learned" else None
        shapes, attrs = layer_schema(c)
        layers = [random_layer(rng, shapes, attrs) for _ in range(c.n_layers)]
        final = 1.0 + 0.1 * rng.normal(size=d) if c.norm == "rmsnorm" else None
        if c.tie_embeddings:
            embed = embed / math.sqrt(d)  # keeps the tied head's logits O(1)
            head = embed.T
        else:
            head = rng.normal(0.0, 0.25 if toy else 1.0 / math.sqrt(d), (d, c.vocab_size))
        return cls(c, embed, layers, head, final, pos)

    def _gather(self) -> None:
        """Move the quantized matrices' bytes into one huge-page arena, in the order a step
        reads them (:func:`fastspec.kernels.quant.gather`): same bytes, a faster stream."""
        names = [[n for n in FORWARD_MATRICES if getattr(lw, n, None) is not None]
                 for lw in self.layers]
        moved = iter(_gather_quant([getattr(lw, n) for lw, ns in zip(self.layers, names)
                                    for n in ns] + [self.head, self.embed]))
        self.layers = [dataclasses.replace(lw, **{n: next(moved) for n in ns})
                       for lw, ns in zip(self.layers, names)]
        self.head, self.embed = next(moved), next(moved)

    def _check_shapes(self) -> None:
        c = self.config
        d = c.dim
        expect = {"embed": (c.vocab_size, d), "head": (d, c.vocab_size)}
        for name, shape in expect.items():
            got = _q.layout_shape(getattr(self, name))
            if name == "embed" and c.quantized:  # rows = outputs: (vocab, dim) as stored
                got = got[::-1]
            if got != shape:
                raise ValueError(f"{name} must have shape {shape}, got {got}")
        if len(self.layers) != c.n_layers:
            raise ValueError(f"expected {c.n_layers} layers, got {len(self.layers)}")
        shapes, attrs = layer_schema(c)
        for i, lw in enumerate(self.layers):
            check_layer(lw, f"layer {i}", shapes, attrs)
        if c.norm == "rmsnorm" and (self.final_norm is None or self.final_norm.shape != (d,)):
            raise ValueError(f"final_norm must have shape ({d},)")
        if c.positional == "learned" and (self.pos_embed is None
                                          or self.pos_embed.shape != (c.max_seq_len, d)):
            raise ValueError(f"pos_embed must have shape ({c.max_seq_len}, {d})")

    # --- inference ----------------------------------------------------------------------

    #: dtype of the caches :meth:`new_cache` makes (None: ``config.dtype``); "float16" for a
    #: float32 model halves the bytes a decode step reads from its cache
    #: (:func:`fastspec.kernels.cache.cache_dtype`). Decoding functions given no cache use it.
    kv_dtype: str | None = None

    def new_cache(self, capacity: int | None = None, kv_dtype: str | None = None) -> KVCache:
        """Return an empty :class:`KVCache` for this model (default capacity: max_seq_len;
        dtype: ``kv_dtype``, else the model's :attr:`kv_dtype`, else ``config.dtype``)."""
        c = self.config
        capacity = c.max_seq_len if capacity is None else check_index(capacity, "capacity", 1, c.max_seq_len)
        dt = cache_dtype(kv_dtype or self.kv_dtype or c.dtype, c.dtype)
        return KVCache(c.n_layers, c.n_kv_heads, capacity, c.head_dim, dt)

    def check_ids(self, ids, name: str = "ids") -> np.ndarray:
        """Return ``ids`` as a 1-D int64 array, checking ``0 <= id < vocab_size``."""
        arr = np.asarray(ids)
        if arr.dtype == object or (arr.size and arr.dtype.kind not in "iu"):
            raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64, copy=False).reshape(-1) if arr.ndim <= 1 else None
        if arr is None:
            raise ValueError(f"{name} must be 1-D")
        if arr.size == 0:
            raise ValueError(f"{name} must not be empty")
        low, high = int_range(arr)
        if low < 0 or high >= self.config.vocab_size:
            bad = arr[(arr < 0) | (arr >= self.config.vocab_size)][0]
            raise ValueError(f"{name} must be in [0, {self.config.vocab_size}), got {int(bad)}")
        return np.ascontiguousarray(arr)

    def step(self, ids, cache: KVCache, *, hidden_layers: Iterable[int] = (),
             causal: bool = True, out: np.ndarray | None = None,
             advance: bool = True, tree_parents: np.ndarray | None = None,
             logit_rows: int | None = None) -> ForwardOutput:
        """Run new positions through the model on ``cache``: the fast entry of every loop.

        The one place that checks a forward's arguments: the compiled runner checks them
        without the GIL-free part ever seeing a bad value, the NumPy path in
        :meth:`_check_step`. Drafters, audits and decoding loops call this method; nothing
        outside the model touches its runner.

        Parameters
        ----------
        ids : sequence of int, length n
            Token ids of the new positions ``cache.length .. cache.length + n - 1``.
        cache : KVCache
            Holds the committed positions; claimed for the calling thread during the call
            (:meth:`KVCache.claim`).
        hidden_layers : iterable of int
            Layers whose outputs to return (``-1`` is the last layer).
        causal : bool, default True
            False lets every new position attend to all new positions (and the cache); not
            with a ``sliding_window``.
        out : ndarray of shape (n, vocab_size), optional
            Caller-owned, C-contiguous logits buffer of the model dtype, reused across steps
            (shape (logit_rows, vocab_size) with ``logit_rows``).
        advance : bool, default True
            False writes the new positions' keys/values past the committed length as scratch
            and leaves ``cache.length`` unchanged (the DFlash block forward).
        tree_parents : ndarray of shape (n,), int, optional
            The new positions form a tree (:mod:`fastspec.decoding.tree`): ``tree_parents[i]`` in
            ``[-1, i)``, -1 hanging under the last cached position. Position ``i`` sees the
            cache and its own ancestors only, at sequence position ``cache.length + depth_i - 1``
            (rows are still written at ``cache.length + i``). The fused runner takes the
            positions and the ancestor mask (float32 with a head size of the tiled attention
            kernel: a node's logits are bit-identical to decoding its path); the NumPy
            backend runs the layer-by-layer path (:func:`fastspec.kernels.tree_attention`).
            A chain runs as a plain causal step.
        logit_rows : int, optional
            Compute only the logits of the last ``logit_rows`` positions (0 to n), each the
            same bits as in a full step; the others skip the final norm and the head (a
            prompt's prefill needs its last row's, a speculative prefill none).

        Returns
        -------
        ForwardOutput
            ``logits`` of shape (n, vocab_size), or (logit_rows, vocab_size) (``out`` when
            given); ``hidden[l]`` of shape (n, dim).
        """
        if type(cache) is not KVCache:
            self.check_cache(cache)
        positions = tree_mask = None
        if tree_parents is not None:
            positions, tree_mask = self._tree_layout(ids, cache, tree_parents, causal)
        claimed = cache.acquire()
        try:
            runner = self._fused()
            start = cache.length
            if runner is not None:
                logits, hidden = runner.forward(ids, cache.k, cache.v, start, causal,
                                                hidden_layers, out, positions=positions,
                                                tree_mask=tree_mask, logit_rows=logit_rows)
                # the positions run (n); only a prefill's logit_rows makes logits shorter
                n = logits.shape[0] if logit_rows is None else np.size(ids)
                if logits is None:  # logit_rows=0
                    logits = np.empty((0, self.config.vocab_size), np.dtype(self.config.dtype))
            else:
                ids = self.check_ids(ids)
                n = ids.shape[0]
                if logit_rows is not None:
                    logit_rows = check_index(logit_rows, "logit_rows", 0, n)
                layers = self._check_step(cache, start, n, hidden_layers)
                out = self._check_out(out, n if logit_rows is None else logit_rows)
                x = self._numpy_weights()[0][ids]
                if self.config.embedding_scale is not None:  # one rounding, as the C loop's
                    x = x * np.asarray(self.config.embedding_scale, x.dtype)
                if positions is None:
                    positions = slice(start, start + ids.shape[0])
                if self.config.positional == "learned":
                    x = x + self.pos_embed[positions]
                logits, hidden = self._layers_numpy(x, cache, start, causal, layers, out,
                                                    positions, tree_mask, logit_rows)
            if advance:
                cache.advance(n)
        finally:
            cache.release(claimed)
        return ForwardOutput(logits, hidden)

    def forward(self, ids, cache: KVCache | None = None, hidden_layers: Iterable[int] = (),
                causal: bool = True, out: np.ndarray | None = None) -> ForwardOutput:
        """Run new positions through the model, appending them to ``cache``.

        :meth:`step` with an optional cache: without one, ``ids`` are a whole sequence
        starting at position 0 and a temporary cache is used.

        Parameters
        ----------
        ids : sequence of int, length n
            Token ids of the new positions ``cache.length .. cache.length + n - 1``.
        cache : KVCache, optional
            Extended in place by ``n`` positions.
        hidden_layers : iterable of int
            Layers whose outputs to return (``-1`` is the last layer).
        causal : bool, default True
            False lets every new position attend to all new positions (and the cache).
        out : ndarray of shape (n, vocab_size), optional
            Caller-owned, C-contiguous logits buffer of the model dtype. A decoding loop can
            reuse one buffer per step instead of receiving a fresh array each call.

        Returns
        -------
        ForwardOutput
            ``logits`` of shape (n, vocab_size) in the model dtype (``out`` when given);
            ``hidden[l]`` of shape (n, dim).

        Notes
        -----
        With the Cython backend active (``fastspec.backend() == "cython"``) and the
        extension ``fastspec.model._model`` built, the whole step runs in one fused ``nogil`` call;
        otherwise the NumPy twin runs. Both give the same result within rounding. A model may
        run on several threads at once, each on its own cache (one runner per thread).
        """
        if cache is None:
            cache = self._temp_cache(ids)
        return self.step(ids, cache, hidden_layers=hidden_layers, causal=causal, out=out)

    def check_hidden_layers(self, hidden_layers: Iterable[int]) -> tuple[int, ...]:
        """Return sorted, de-duplicated layer indices (negative ones count from the end)."""
        L = self.config.n_layers
        out = set()
        for layer in hidden_layers:
            layer = check_index(layer, "hidden_layers", -L, L - 1)
            out.add(layer % L)
        return tuple(sorted(out))

    # --- dispatch and checks --------------------------------------------------------------

    def _fused(self):
        """Return the fused Cython runner when the Cython backend is active, else None."""
        if kernels.backend() != "cython" or _model_ext is None:
            return None
        # One runner per thread: its scratch buffers are not shared, so threads may run the
        # same model concurrently (each on its own cache).
        runner = getattr(self._runners, "runner", None)
        if runner is None or runner.stale:  # stale: bf16 packed for another path (set_isa)
            runner = self._runners.runner = _model_ext.TransformerRunner(self)
        return runner

    def invalidate(self) -> None:
        """Forget the fused runners (and widened weights); call after replacing or updating a
        weight array. In-place updates of the matrices are not seen before this call by float32
        runners (they keep packed copies) nor by the NumPy path of float16 matrices (it keeps
        widened copies)."""
        self._runners = threading.local()
        self._packed_fc = None
        self._wide = None
        if _model_weights is not None:  # runners share packed copies: these may be stale now
            _model_weights.forget_packed([self.head] + [a for lw in self.layers
                                                        for a in lw.arrays().values()])

    def _numpy_weights(self) -> tuple[np.ndarray, np.ndarray, list[LayerWeights]]:
        """Return ``embed, head, layers`` with every matrix in the compute dtype.

        The model's own arrays when ``weight_dtype`` is unset; otherwise float32 copies of the
        16-bit matrices, made once (exact) and kept: the NumPy path then does the float32
        model's arithmetic on them. For bfloat16 the products' matrices (``head`` and the
        projections) come as :class:`fastspec.kernels.bf16.RoundingMatrix`, whose ``x @ m`` rounds
        ``x`` to bf16 first (the bf16 compute rule); ``embed`` (a lookup) is a plain array.
        """
        if self.config.weight_dtype is None:
            return self.embed, self.head, self.layers
        wide = self._wide
        if wide is None and self.config.quantized:  # products through linear_q
            q = lambda a: _q.QLinear(a) if _q.is_quant(a) else a  # noqa: E731
            layers = [LayerWeights(**{k: q(v) for k, v in lw.arrays().items()})
                      for lw in self.layers]
            wide = self._wide = (_q.QRows(self.embed), _q.QLinear(self.head), layers)
        if wide is None:
            dt = np.dtype(self.config.dtype)
            if self.config.weight_dtype == BF16:
                widen = lambda a: RoundingMatrix(from_bits(a))  # noqa: E731
                embed = from_bits(self.embed)
            else:
                widen = lambda a: a.astype(dt)  # noqa: E731
                embed = self.embed.astype(dt)
            layers = [LayerWeights(**{k: widen(v) if k in _MATRICES else v
                                      for k, v in lw.arrays().items()}) for lw in self.layers]
            if _is_transpose_of(self.head, self.embed):  # tied: one widened copy
                head = RoundingMatrix(embed.T) if self.config.weight_dtype == BF16 else embed.T
            else:
                head = widen(self.head)
            wide = self._wide = (embed, head, layers)
        return wide

    def with_weight_dtype(self, weight_dtype: str | None) -> "Transformer":
        """Return this model with its matrices stored in ``weight_dtype``.

        Parameters
        ----------
        weight_dtype : {None, "float16", "bfloat16", "float32", "float64", "q8_0", "q4_0", "q4_1"}
            See :class:`ModelConfig`; None or the compute dtype stores the matrices in it.
            A quantized kind is :meth:`quantize`; a quantized model asked for a float dtype
            dequantizes its matrices.
            float16/bfloat16 -> float32 is exact; float32 -> float16 or bfloat16 rounds to
            nearest even (values beyond the range become infinite; bfloat16 from float16 or
            float64 goes through float32).

        Returns
        -------
        Transformer
            A new model; arrays that need no conversion (norms, biases, ``pos_embed``, and
            matrices already in ``weight_dtype``) are shared with this one.
        """
        if weight_dtype in _q.QUANT_WEIGHT_DTYPES:
            return self.quantize(weight_dtype)
        if self.config.quantized:  # dequantized: float32 values, then stored as asked
            config = self.config.replace(weight_dtype=None)
            deq = lambda a, out=False: (  # noqa: E731
                a.dequantize() if out else a.dequantize().T) if _q.is_quant(a) else a
            embed = deq(self.embed, True)
            head = embed.T if self.head is self.embed else deq(self.head)
            layers = [LayerWeights(**{k: deq(v) for k, v in lw.arrays().items()})
                      for lw in self.layers]
            model = Transformer(config, embed, layers, head, self.final_norm, self.pos_embed)
            return model if weight_dtype is None else model.with_weight_dtype(weight_dtype)
        config = self.config.replace(weight_dtype=weight_dtype)
        return Transformer(config, self.embed, self.layers, self.head, self.final_norm,
                           self.pos_embed)

    def quantize(self, kind: str) -> "Transformer":
        """Return a copy of this model with its matrices quantized to ``kind``.

        Parameters
        ----------
        kind : {"q8_0", "q4_0", "q4_1"}
            GGUF's blocks of 32 inputs (docs/FORMATS.md); every in-width of the model
            (``dim``, ``n_heads * head_dim``, ``ffn_dim``) must be a multiple of 32.

        Returns
        -------
        Transformer
            float32 compute; the embedding, head and projections quantized from their float32
            values (a quantized model's matrices of another kind are dequantized first, those
            of ``kind`` kept); norms, biases and positions as float32.
        """
        return _q.quantize_model(self, kind)

    def _temp_cache(self, ids) -> KVCache:
        n = len(ids) if hasattr(ids, "__len__") else np.asarray(ids).size
        if n > self.config.max_seq_len:
            raise ValueError(f"ids has {n} positions, more than max_seq_len {self.config.max_seq_len}")
        return self.new_cache(max(int(n), 1))

    def check_cache(self, cache: KVCache) -> None:
        """Raise TypeError/ValueError unless ``cache`` is a KVCache of this model's shape."""
        c = self.config
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        want = (c.n_layers, c.n_kv_heads, c.head_dim)
        got = (cache.k.shape[0], cache.k.shape[1], cache.k.shape[-1])
        if want != got or cache.k.ndim != 4 or cache.v.shape != cache.k.shape:
            raise ValueError(f"cache (layers, kv heads, head_dim) = {got} does not match "
                             f"the model's {want}")
        cache_dtype(cache.dtype, c.dtype)

    def _tree_layout(self, ids, cache: KVCache, tree_parents, causal: bool):
        """Check a tree step; return ``(positions, ancestor mask)``, or ``(None, None)`` for a
        chain (the plain causal step computes it)."""
        if not causal:
            raise ValueError("tree_parents needs causal=True")
        n = len(ids) if hasattr(ids, "__len__") else np.asarray(ids).size
        room = self.config.max_seq_len - cache.length
        depths = check_parents(tree_parents, n, MAX_TREE_NODES + 1, room, "tree_parents")
        if np.array_equal(depths, np.arange(1, n + 1)):
            return None, None
        window = self.config.sliding_window
        if window and int(depths.max()) > window:  # a node's ancestors inside its window
            raise ValueError(f"a tree node sees {int(depths.max())} nodes, more than the "
                             f"sliding window {window}")
        return cache.length + depths - 1, ancestor_mask(tree_parents)

    @property
    def n_params(self) -> int:
        """Number of parameters (a tied head counted once)."""
        total = sum(a.in_features * a.out_features if _q.is_quant(a) else a.size
                    for a in self.state_dict().values())
        return int(total)

    def __repr__(self) -> str:
        c = self.config
        return (f"Transformer(dim={c.dim}, n_layers={c.n_layers}, n_heads={c.n_heads}, "
                f"n_kv_heads={c.n_kv_heads}, vocab_size={c.vocab_size}, {c.norm}/{c.positional}/"
                f"{c.activation}, dtype={c.dtype}"
                + (f", weight_dtype={c.weight_dtype}" if c.weight_dtype else "")
                + f", params={self.n_params})")
