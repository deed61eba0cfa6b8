"""ModelConfig and Transformer: causal decoders (toy and Llama/Qwen-style) over a KV cache."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from fastspec import kernels
from fastspec._bf16 import BF16, RoundingMatrix, as_storage, from_bits
from fastspec._checks import check_index
from fastspec.cache import KVCache

try:  # the fused forward; without it every model runs on the NumPy path
    from fastspec import _model as _model_ext
except ImportError:  # pragma: no cover - exercised by source checkouts without a build
    _model_ext = None

__all__ = ["ModelConfig", "Transformer", "ForwardOutput", "LayerWeights"]

_NORMS = ("rmsnorm", "layernorm")
_POSITIONALS = ("rope", "learned")
_ACTIVATIONS = ("swiglu", "tanh", "gelu")
#: LayerWeights fields stored in ``ModelConfig.weight_dtype`` (with ``embed`` and ``head``).
_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and family of a causal transformer.

    The toy family (:meth:`toy`) is pre-norm LayerNorm without affine parameters, learned
    absolute positions, a tanh FFN and an untied head. The Llama family (defaults) is RMSNorm,
    rotary positions, SwiGLU, grouped-query attention, optional QK-norm (``qk_norm``, Qwen3)
    and optional q/k/v projection biases (``qkv_bias``, Qwen2; stored as
    ``model.layers.L.self_attn.{q,k,v}_proj.bias``).

    ``dtype`` is the compute dtype (activations, KV cache, logits). ``weight_dtype`` is the
    storage dtype of the large matrices (``embed``, ``head`` and the seven projections of each
    layer): None (default) means ``dtype``; ``"float16"`` (only with ``dtype="float32"``) keeps
    them in float16, which halves the bytes a decode step streams. Float16 weights are widened
    to float32 exactly, in registers, and the result is bit-identical to a float32 model whose
    weights are those float16 values. ``"bfloat16"`` (only with ``dtype="float32"``) stores
    them as bf16 bit patterns in uint16 arrays (NumPy has no bf16; a uint16 weight array
    passed to :class:`Transformer` is always read as bf16 bits) and changes the arithmetic:
    every matrix product rounds its input rows to bf16 (nearest even) and accumulates in
    float32 (docs/FORMATS.md). Norms, biases, rope tables and ``pos_embed`` stay in
    ``dtype``. A ``weight_dtype`` equal to ``dtype`` is stored as None.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    ffn_dim: int | None = None
    max_seq_len: int = 2048
    norm: str = "rmsnorm"
    positional: str = "rope"
    activation: str = "swiglu"
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"
    head_dim: int | None = None
    qk_norm: bool = False
    qkv_bias: bool = False
    weight_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            check_index(getattr(self, name), name, 1, 2**31 - 1)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(f"dim {self.dim} must be divisible by n_heads {self.n_heads} "
                                 "(or give head_dim)")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", 4 * self.dim)
        check_index(self.n_kv_heads, "n_kv_heads", 1, self.n_heads)
        check_index(self.head_dim, "head_dim", 1, 2**20)
        check_index(self.ffn_dim, "ffn_dim", 1, 2**31 - 1)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {self.norm!r}")
        if self.positional not in _POSITIONALS:
            raise ValueError(f"positional must be one of {_POSITIONALS}, got {self.positional!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        if self.weight_dtype not in (None, "float16", BF16, "float32", "float64"):
            raise ValueError("weight_dtype must be None, 'float16', 'bfloat16', 'float32' or "
                             f"'float64', got {self.weight_dtype!r}")
        if self.weight_dtype == self.dtype:
            object.__setattr__(self, "weight_dtype", None)
        elif self.weight_dtype in ("float16", BF16) and self.dtype != "float32":
            raise ValueError(f"weight_dtype {self.weight_dtype!r} needs dtype 'float32', got "
                             f"{self.dtype!r}")
        elif self.weight_dtype not in (None, "float16", BF16):
            raise ValueError(f"weight_dtype {self.weight_dtype!r} does not match dtype "
                             f"{self.dtype!r} (only float16/bfloat16 weights with float32 "
                             "compute)")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")

    @classmethod
    def toy(cls, vocab_size: int = 8, dim: int = 16, n_heads: int = 2, n_layers: int = 2,
            max_seq_len: int = 256, dtype: str = "float32") -> "ModelConfig":
        """Return the seed experiment's decoder: LayerNorm, learned positions, tanh FFN (dim -> 2 dim)."""
        return cls(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                   n_kv_heads=n_heads, ffn_dim=2 * dim, max_seq_len=max_seq_len,
                   norm="layernorm", positional="learned", activation="tanh",
                   tie_embeddings=False, dtype=dtype)

    @classmethod
    def tiny_llama(cls, dtype: str = "float32", **overrides) -> "ModelConfig":
        """Return the benchmark model's config: vocab 260, dim 256, 4 layers, 8 heads, ffn 704."""
        fields = dict(vocab_size=260, dim=256, n_layers=4, n_heads=8, n_kv_heads=8,
                      ffn_dim=704, max_seq_len=4096 + 64, dtype=dtype)
        fields.update(overrides)
        return cls(**fields)

    @property
    def matrix_dtype(self) -> str:
        """Storage dtype of the large matrices: ``weight_dtype``, or ``dtype`` when None."""
        return self.weight_dtype or self.dtype

    @property
    def matrix_itemsize(self) -> int:
        """Bytes per stored matrix element (2 for float16 and bfloat16)."""
        return 2 if self.matrix_dtype == BF16 else np.dtype(self.matrix_dtype).itemsize

    def to_dict(self) -> dict:
        """Return the config as a JSON-serialisable dict (``weight_dtype`` only when set)."""
        d = dataclasses.asdict(self)
        if d["weight_dtype"] is None:  # files of default models stay readable by older versions
            del d["weight_dtype"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build a config from :meth:`to_dict` output; unknown keys raise ValueError."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig keys: {unknown}")
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass
class LayerWeights:
    """Weights of one decoder layer, linear maps in ``(in, out)`` layout (``x @ W``).

    Shapes: ``wq (dim, H*D)``, ``wk, wv (dim, Hkv*D)``, ``wo (H*D, dim)``, ``w_up (dim, F)``,
    ``w_gate (dim, F)`` (SwiGLU only), ``w_down (F, dim)``, norms ``(dim,)`` (RMSNorm only),
    ``q_norm, k_norm (D,)`` (QK-norm only), ``q_bias (H*D,)``, ``k_bias, v_bias (Hkv*D,)``
    (``qkv_bias`` only: Qwen2). Absent weights are None.
    """

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    w_gate: np.ndarray | None = None
    attn_norm: np.ndarray | None = None
    mlp_norm: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    q_bias: np.ndarray | None = None
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclass
class ForwardOutput:
    """Result of :meth:`Transformer.forward`.

    Attributes
    ----------
    logits : ndarray of shape (n, vocab_size)
    hidden : dict[int, ndarray of shape (n, dim)]
        Output of each requested layer.
    """

    logits: np.ndarray
    hidden: dict[int, np.ndarray] = field(default_factory=dict)


# --- NumPy building blocks (the reference math, shared with the DFlash drafter) -------------

def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """Return ``x / sqrt(mean(x**2, -1) + eps) * weight`` (float64 statistics)."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    y = (x / np.sqrt(ms + eps)).astype(x.dtype, copy=False)
    return y if weight is None else y * weight


def layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """Return ``(x - mean) / sqrt(var + eps)`` over the last axis, no affine parameters."""
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(x64 - mu), axis=-1, keepdims=True)
    return ((x64 - mu) / np.sqrt(var + eps)).astype(x.dtype, copy=False)


def rope_tables(max_positions: int, head_dim: int, theta: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Return ``cos, sin`` of shape (max_positions, head_dim // 2) for rotate-half RoPE."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x`` of shape (n, heads, D) by per-position ``cos, sin`` of shape (n, D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    y = x @ w
    return y if bias is None else y + bias


def _claims_cache(method):
    """Hold the ``cache`` argument for the calling thread during the call (KVCache.claim):
    another thread writing the same cache at the same time gets a RuntimeError."""
    @functools.wraps(method)
    def wrapper(self, first, cache=None, *args, **kwargs):
        if type(cache) is not KVCache:  # None (temporary cache) or refused by the method
            return method(self, first, cache, *args, **kwargs)
        claimed = cache._claim()
        try:
            return method(self, first, cache, *args, **kwargs)
        finally:
            cache._unclaim(claimed)
    return wrapper


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class Transformer:
    """A causal decoder over a preallocated KV cache.

    Parameters
    ----------
    config : ModelConfig
    embed : ndarray of shape (vocab_size, dim)
    layers : list of LayerWeights
    head : ndarray of shape (dim, vocab_size)
        Output projection in ``(in, out)`` layout (for tied embeddings, ``embed.T`` copied).
        ``embed``, ``head`` and the layers' projections are converted to
        ``config.matrix_dtype``, everything else to ``config.dtype`` (C-contiguous). A uint16
        array is read as bf16 bit patterns (kept for bfloat16 matrices, else widened).
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
        self.embed = cast(embed, wdt)
        self.layers = [LayerWeights(**{k: cast(v, wdt if k in _MATRICES else dt)
                                       for k, v in lw.arrays().items()}) for lw in layers]
        self.head = cast(head, wdt)
        self.final_norm = cast(final_norm)
        self.pos_embed = cast(pos_embed)
        self._check_shapes()
        if config.positional == "rope":
            self.rope_cos, self.rope_sin = rope_tables(config.max_seq_len, config.head_dim,
                                                       config.rope_theta, dt)
        else:
            self.rope_cos = self.rope_sin = None
        self._runners = threading.local()
        self._wide = None  # 16-bit matrices widened for the NumPy path (see _numpy_weights)

    # --- construction -------------------------------------------------------------------

    @classmethod
    def random(cls, config: ModelConfig, seed: int = 0) -> "Transformer":
        """Return a model with random weights drawn from ``numpy.random.default_rng(seed)``."""
        rng = np.random.default_rng(seed)
        c = config
        H, Hkv, D, F, d = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.dim
        toy = c.norm == "layernorm"
        w = lambda a, b: rng.normal(0.0, 1.0 / math.sqrt(a), (a, b))  # noqa: E731
        embed = rng.normal(0.0, 0.3 if toy else 1.0, (c.vocab_size, d))
        pos = rng.normal(0.0, 0.1, (c.max_seq_len, d)) if c.positional == "learned" else None
        layers = []
        for _ in range(c.n_layers):
            lw = LayerWeights(wq=w(d, H * D), wk=w(d, Hkv * D), wv=w(d, Hkv * D), wo=w(H * D, d),
                              w_up=w(d, F), w_down=w(F, d))
            if c.activation == "swiglu":
                lw.w_gate = w(d, F)
            if c.norm == "rmsnorm":
                lw.attn_norm = 1.0 + 0.1 * rng.normal(size=d)
                lw.mlp_norm = 1.0 + 0.1 * rng.normal(size=d)
            if c.qk_norm:
                lw.q_norm = 1.0 + 0.1 * rng.normal(size=D)
                lw.k_norm = 1.0 + 0.1 * rng.normal(size=D)
            if c.qkv_bias:
                lw.q_bias = 0.1 * rng.normal(size=H * D)
                lw.k_bias = 0.1 * rng.normal(size=Hkv * D)
                lw.v_bias = 0.1 * rng.normal(size=Hkv * D)
            layers.append(lw)
        final = 1.0 + 0.1 * rng.normal(size=d) if c.norm == "rmsnorm" else None
        if c.tie_embeddings:
            embed = embed / math.sqrt(d)  # keeps the tied head's logits O(1)
            head = embed.T
        else:
            head = rng.normal(0.0, 0.25 if toy else 1.0 / math.sqrt(d), (d, c.vocab_size))
        return cls(c, embed, layers, head, final, pos)

    def _check_shapes(self) -> None:
        c = self.config
        H, Hkv, D, F, d = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.dim
        expect = {"embed": (c.vocab_size, d), "head": (d, c.vocab_size)}
        for name, shape in expect.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {getattr(self, name).shape}")
        if len(self.layers) != c.n_layers:
            raise ValueError(f"expected {c.n_layers} layers, got {len(self.layers)}")
        layer_shapes = {"wq": (d, H * D), "wk": (d, Hkv * D), "wv": (d, Hkv * D), "wo": (H * D, d),
                        "w_up": (d, F), "w_down": (F, d), "w_gate": (d, F), "attn_norm": (d,),
                        "mlp_norm": (d,), "q_norm": (D,), "k_norm": (D,), "q_bias": (H * D,),
                        "k_bias": (Hkv * D,), "v_bias": (Hkv * D,)}
        needed = {"w_gate": c.activation == "swiglu", "attn_norm": c.norm == "rmsnorm",
                  "mlp_norm": c.norm == "rmsnorm", "q_norm": c.qk_norm, "k_norm": c.qk_norm,
                  "q_bias": c.qkv_bias, "k_bias": c.qkv_bias, "v_bias": c.qkv_bias}
        for i, lw in enumerate(self.layers):
            for name, shape in layer_shapes.items():
                a = getattr(lw, name)
                if a is None:
                    if needed.get(name, True):
                        raise ValueError(f"layer {i}: missing weight {name}")
                elif a.shape != shape:
                    raise ValueError(f"layer {i}: {name} must have shape {shape}, got {a.shape}")
        if c.norm == "rmsnorm" and (self.final_norm is None or self.final_norm.shape != (d,)):
            raise ValueError(f"final_norm must have shape ({d},)")
        if c.positional == "learned" and (self.pos_embed is None
                                          or self.pos_embed.shape != (c.max_seq_len, d)):
            raise ValueError(f"pos_embed must have shape ({c.max_seq_len}, {d})")

    # --- inference ----------------------------------------------------------------------

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """Return an empty :class:`KVCache` for this model (default capacity: max_seq_len)."""
        c = self.config
        capacity = c.max_seq_len if capacity is None else check_index(capacity, "capacity", 1, c.max_seq_len)
        return KVCache(c.n_layers, c.n_kv_heads, capacity, c.head_dim, c.dtype)

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
        if arr.min() < 0 or arr.max() >= self.config.vocab_size:
            bad = arr[(arr < 0) | (arr >= self.config.vocab_size)][0]
            raise ValueError(f"{name} must be in [0, {self.config.vocab_size}), got {int(bad)}")
        return np.ascontiguousarray(arr)

    @_claims_cache
    def forward(self, ids, cache: KVCache | None = None, hidden_layers: Iterable[int] = (),
                causal: bool = True, out: np.ndarray | None = None) -> ForwardOutput:
        """Run new positions through the model, appending them to ``cache``.

        Parameters
        ----------
        ids : sequence of int, length n
            Token ids of the new positions ``cache.length .. cache.length + n - 1``.
        cache : KVCache, optional
            Extended in place by ``n`` positions. Without it the ids are a whole sequence
            starting at position 0 and a temporary cache is used.
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
        extension ``fastspec._model`` built, the whole step runs in one fused ``nogil`` call;
        otherwise the NumPy twin below runs. Both give the same result within rounding. The
        fused runner reuses scratch buffers: do not run one model from several threads at once.
        """
        runner = self._fused()
        if cache is None:
            cache = self._temp_cache(ids)
        elif type(cache) is not KVCache:
            self._check_cache(cache)
        start = cache.length
        if runner is not None:
            logits, hidden = runner.forward(ids, cache.k, cache.v, start, causal, hidden_layers,
                                            out)
            cache.advance(logits.shape[0])
            return ForwardOutput(logits, hidden)
        ids = self.check_ids(ids)
        layers = self.check_hidden_layers(hidden_layers)
        self._check_cache(cache)
        self._check_room(cache, start, ids.shape[0])
        out = self._check_out(out, ids.shape[0])
        x = self._numpy_weights()[0][ids]
        if self.config.positional == "learned":
            x = x + self.pos_embed[start:start + ids.shape[0]]
        logits, hidden = self._layers_numpy(x, cache, start, causal, layers, out)
        cache.advance(ids.shape[0])
        return ForwardOutput(logits, hidden)

    @_claims_cache
    def forward_embeddings(self, x: np.ndarray, cache: KVCache, hidden_layers: Iterable[int] = (),
                           causal: bool = True, out: np.ndarray | None = None) -> ForwardOutput:
        """Run input embeddings through the layer stack WITHOUT advancing the cache.

        The DFlash drafter's block step: ``x`` sits at positions ``cache.length ..
        cache.length + n - 1``; its keys/values are written there (past the committed length,
        so the next write or :meth:`write_context_kv` overwrites them) and every position
        attends to the committed cache plus the block (all of it when ``causal=False``).

        Parameters
        ----------
        x : ndarray of shape (n, dim)
            Input embeddings in the model dtype, used as given (no position embedding is
            added; RoPE models rotate q/k at the block positions).
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
        runner = self._fused()
        if type(cache) is not KVCache:
            self._check_cache(cache)
        start = cache.length
        if runner is not None:
            logits, hidden = runner.forward_embeddings(x, cache.k, cache.v, start, causal,
                                                       hidden_layers, out)
            return ForwardOutput(logits, hidden)
        x = self._check_rows(x, "x")
        layers = self.check_hidden_layers(hidden_layers)
        self._check_cache(cache)
        self._check_room(cache, start, x.shape[0])
        out = self._check_out(out, x.shape[0])
        logits, hidden = self._layers_numpy(x, cache, start, causal, layers, out)
        return ForwardOutput(logits, hidden)

    @_claims_cache
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
        self._check_cache(cache)
        start = cache.length
        self._check_room(cache, start, n)
        L = self.config.n_layers
        if layer is None:
            lo, hi = 0, L
        else:
            lo = check_index(layer, "layer", -L, L - 1) % L
            hi = lo + 1
        runner = self._fused()
        if runner is not None:
            runner.context_kv(features, cache.k, cache.v, start, lo, hi)
        else:
            cos, sin = self._rope_rows(start, n)
            layers = self._numpy_weights()[2]
            for i in range(lo, hi):
                self._store_kv(features, layers[i], cache.k[i], cache.v[i], start, cos, sin)
        if advance:
            cache.advance(n)

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
        if runner is None:
            runner = self._runners.runner = _model_ext.TransformerRunner(self)
        return runner

    def invalidate(self) -> None:
        """Forget the fused runners (and widened weights); call after replacing or updating a
        weight array. In-place updates of the matrices are not seen before this call by float32
        runners (they keep packed copies) nor by the NumPy path of float16 matrices (it keeps
        widened copies)."""
        self._runners = threading.local()
        self._wide = None

    def _numpy_weights(self) -> tuple[np.ndarray, np.ndarray, list[LayerWeights]]:
        """Return ``embed, head, layers`` with every matrix in the compute dtype.

        The model's own arrays when ``weight_dtype`` is unset; otherwise float32 copies of the
        16-bit matrices, made once (exact) and kept: the NumPy path then does the float32
        model's arithmetic on them. For bfloat16 the products' matrices (``head`` and the
        projections) come as :class:`fastspec._bf16.RoundingMatrix`, whose ``x @ m`` rounds
        ``x`` to bf16 first (the bf16 compute rule); ``embed`` (a lookup) is a plain array.
        """
        if self.config.weight_dtype is None:
            return self.embed, self.head, self.layers
        wide = self._wide
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
            wide = self._wide = (embed, widen(self.head), layers)
        return wide

    def with_weight_dtype(self, weight_dtype: str | None) -> "Transformer":
        """Return this model with its matrices stored in ``weight_dtype``.

        Parameters
        ----------
        weight_dtype : {None, "float16", "bfloat16", "float32", "float64"}
            See :class:`ModelConfig`; None or the compute dtype stores the matrices in it.
            float16/bfloat16 -> float32 is exact; float32 -> float16 or bfloat16 rounds to
            nearest even (values beyond the range become infinite; bfloat16 from float16 or
            float64 goes through float32).

        Returns
        -------
        Transformer
            A new model; arrays that need no conversion (norms, biases, ``pos_embed``, and
            matrices already in ``weight_dtype``) are shared with this one.
        """
        config = self.config.replace(weight_dtype=weight_dtype)
        return Transformer(config, self.embed, self.layers, self.head, self.final_norm,
                           self.pos_embed)

    def _temp_cache(self, ids) -> KVCache:
        n = len(ids) if hasattr(ids, "__len__") else np.asarray(ids).size
        if n > self.config.max_seq_len:
            raise ValueError(f"ids has {n} positions, more than max_seq_len {self.config.max_seq_len}")
        return self.new_cache(max(int(n), 1))

    def _check_cache(self, cache: KVCache) -> None:
        c = self.config
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        want = (c.n_layers, c.n_kv_heads, c.head_dim, np.dtype(c.dtype))
        got = (cache.k.shape[0], cache.k.shape[1], cache.k.shape[3], cache.k.dtype)
        if want != got:
            raise ValueError(f"cache (layers, kv heads, head_dim, dtype) = {got} does not match "
                             f"the model's {want}")

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

    def _rope_rows(self, start: int, n: int):
        if self.rope_cos is None:
            return None, None
        return self.rope_cos[start:start + n], self.rope_sin[start:start + n]

    # --- the NumPy twin of the fused runner ----------------------------------------------

    def _layers_numpy(self, x, cache, start, causal, hidden_layers, out):
        n = x.shape[0]
        cos, sin = self._rope_rows(start, n)
        _, head, layers = self._numpy_weights()
        hidden = {}
        for i, lw in enumerate(layers):
            x = self.layer_forward(x, lw, cache.k[i], cache.v[i], start, cos, sin, causal)
            if i in hidden_layers:
                hidden[i] = x.copy()
        logits = self.norm(x, self.final_norm) @ head
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
        k = _linear(h, lw.wk, lw.k_bias).reshape(n, c.n_kv_heads, c.head_dim)
        v = _linear(h, lw.wv, lw.v_bias).reshape(n, c.n_kv_heads, c.head_dim)
        if c.qk_norm:
            k = rms_norm(k, lw.k_norm, c.norm_eps)
        if cos is not None:
            k = apply_rope(k, cos, sin)
        kernels.cache_write(k_cache, np.ascontiguousarray(k), start)
        kernels.cache_write(v_cache, np.ascontiguousarray(v), start)

    def layer_forward(self, x, lw: LayerWeights, k_cache, v_cache, start, cos, sin, causal=True):
        """One decoder layer on ``x`` (n, dim) at positions ``start ..``; returns the new x.

        Writes the new keys/values into ``k_cache``/``v_cache`` (n_kv_heads, C, head_dim) at
        ``start ..`` and attends over positions ``[0, start + n)``. ``lw`` holds matrices in the
        compute dtype (for float16 weights: an entry of ``_numpy_weights()[2]``).
        """
        c = self.config
        n = x.shape[0]
        h = self.norm(x, lw.attn_norm)
        q = _linear(h, lw.wq, lw.q_bias).reshape(n, c.n_heads, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, lw.q_norm, c.norm_eps)
        if cos is not None:
            q = apply_rope(q, cos, sin)
        self._store_kv(h, lw, k_cache, v_cache, start, cos, sin)
        a = kernels.attention(np.ascontiguousarray(q), k_cache, v_cache, start + n, causal)
        x = x + a.reshape(n, -1) @ lw.wo
        h = self.norm(x, lw.mlp_norm)
        if c.activation == "swiglu":
            f = silu(h @ lw.w_gate) * (h @ lw.w_up)
        elif c.activation == "tanh":
            f = np.tanh(h @ lw.w_up)
        else:
            f = gelu_tanh(h @ lw.w_up)
        return x + f @ lw.w_down

    # --- persistence (npz; Hugging Face folders live in fastspec.checkpoints) -------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return the weights under Hugging Face names and layout (see docs/FORMATS.md)."""
        c = self.config
        sd = {"model.embed_tokens.weight": self.embed}
        if self.pos_embed is not None:
            sd["model.embed_positions.weight"] = self.pos_embed
        names = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                 "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
                 "w_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                 "mlp_norm": "post_attention_layernorm", "q_norm": "self_attn.q_norm",
                 "k_norm": "self_attn.k_norm", "q_bias": "self_attn.q_proj",
                 "k_bias": "self_attn.k_proj", "v_bias": "self_attn.v_proj"}
        for i, lw in enumerate(self.layers):
            for attr, a in lw.arrays().items():
                kind = "bias" if attr.endswith("_bias") else "weight"
                sd[f"model.layers.{i}.{names[attr]}.{kind}"] = a.T if a.ndim == 2 else a
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
        names = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                 "wo": "self_attn.o_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
        layers = []
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            lw = LayerWeights(**{a: get(p + n + ".weight").T for a, n in names.items()})
            if c.activation == "swiglu":
                lw.w_gate = get(p + "mlp.gate_proj.weight").T
            if c.norm == "rmsnorm":
                lw.attn_norm = get(p + "input_layernorm.weight")
                lw.mlp_norm = get(p + "post_attention_layernorm.weight")
            if c.qk_norm:
                lw.q_norm = get(p + "self_attn.q_norm.weight")
                lw.k_norm = get(p + "self_attn.k_norm.weight")
            if c.qkv_bias:
                lw.q_bias = get(p + "self_attn.q_proj.bias")
                lw.k_bias = get(p + "self_attn.k_proj.bias")
                lw.v_bias = get(p + "self_attn.v_proj.bias")
            layers.append(lw)
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
            from fastspec.checkpoints import save_hf
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
            from fastspec.checkpoints import load_hf
            return load_hf(path, dtype=dtype, weight_dtype=weight_dtype)
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

    @property
    def n_params(self) -> int:
        """Number of parameters (a tied head counted once)."""
        total = sum(a.size for a in self.state_dict().values())
        return int(total)

    def __repr__(self) -> str:
        c = self.config
        return (f"Transformer(dim={c.dim}, n_layers={c.n_layers}, n_heads={c.n_heads}, "
                f"n_kv_heads={c.n_kv_heads}, vocab_size={c.vocab_size}, {c.norm}/{c.positional}/"
                f"{c.activation}, dtype={c.dtype}"
                + (f", weight_dtype={c.weight_dtype}" if c.weight_dtype else "")
                + f", params={self.n_params})")
