"""ModelConfig: the shape and family of a causal transformer."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastspec.kernels.bf16 import BF16
from fastspec.kernels.checks import check_index, check_known_fields
from fastspec.model.functional import positive_number

__all__ = ["ModelConfig", "QUANT_WEIGHT_DTYPES", "freq_factors"]

_NORMS = ("rmsnorm", "layernorm")
_POSITIONALS = ("rope", "learned")
_ACTIVATIONS = ("swiglu", "tanh", "gelu", "geglu")
#: ``weight_dtype`` names of the quantized storage (GGUF's blocks of 32; docs/FORMATS.md).
QUANT_WEIGHT_DTYPES = ("q8_0", "q4_0", "q4_1")
#: Bytes per weight of each quantized storage (block bytes / 32).
_QUANT_ITEMSIZE = {"q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32}


def freq_factors(raw: Any, count: int | None = None, what: str = "") -> tuple[float, ...]:
    """Return RoPE divisors ``raw`` (:attr:`ModelConfig.rope_freq_factors`) as a tuple of floats.

    Raises
    ------
    ValueError
        ``raw`` is not a sequence (a string, a scalar), an entry is not a positive finite
        number (named by its index), or there are not ``count`` entries (``what`` says
        whose count it is).
    """
    try:
        if isinstance(raw, (str, bytes)):
            raise TypeError
        n = len(raw)
    except TypeError:
        raise ValueError(f"rope_freq_factors must be a sequence of numbers, got {raw!r}"
                         ) from None
    if count is not None and n != count:
        raise ValueError(f"rope_freq_factors has {n} values, {what} needs {count}")
    return tuple(positive_number(f, f"rope_freq_factors[{i}]") for i, f in enumerate(raw))


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
    float32 (docs/FORMATS.md). ``"q8_0"``, ``"q4_0"`` and ``"q4_1"`` (only with
    ``dtype="float32"``) store them as GGUF's quantized blocks of 32 along the input axis
    (:class:`fastspec.kernels.quant.QuantMatrix`; every in-width a multiple of 32): every
    product quantizes its input rows per block to int8 and sums integer block products
    (docs/FORMATS.md); the embedding lookup dequantizes rows. A matrix loaded from a file in
    another native kind keeps its blocks (a q4_1 model with a q8_0 embedding, as llama.cpp
    writes them). Norms, biases, rope tables and ``pos_embed`` stay in ``dtype``. A
    ``weight_dtype`` equal to ``dtype`` is stored as None.

    ``rope_freq_factors`` (rotary positions only; length ``head_dim // 2``, each positive)
    divides RoPE frequency ``i`` by its value: Llama 3.1+'s ``"llama3"`` scaling
    (:func:`fastspec.model.functional.llama3_freq_factors`), GGUF's ``rope_freqs.weight``,
    LongRoPE's short factors (Phi-3). None (default) is plain RoPE.

    ``rope_dims`` (rotary positions only; even, at most ``head_dim``) rotates only the first
    ``rope_dims`` of each head's ``head_dim`` values, in pairs ``(i, i + rope_dims / 2)``
    (partial rotary, NeoX style: Phi-4-mini's 96 of 128); the others pass unchanged, and
    ``rope_freq_factors`` then has ``rope_dims // 2`` values. Loaders reorder each head's q/k
    rows so that these pairs are the rotate-half pairs of the whole head (q.k is unchanged by
    the same reordering of both), and the tables give the other pairs cos 1, sin 0: such a
    model's q/k rows (``state_dict``, ``.npz``) are in that order
    (:func:`fastspec.formats.gguf_names.rotary_order`), not Hugging Face's. None (default,
    and what ``head_dim`` becomes) rotates the whole head.

    ``rope_attention_factor`` (rotary positions only; positive) multiplies the RoPE tables'
    cos and sin, so every query and key by it (their scores by its square): LongRoPE's
    ``attention_factor``, GGUF's ``rope.scaling.attn_factor``. None (default, and what 1
    becomes) leaves them as they are.

    ``embedding_scale`` (rotary positions only; positive) multiplies the embedding rows of
    the ids a step runs (not the ``x`` given to ``forward_embeddings``, nor the ``embed``
    array, which a DFlash drafter reads as it is): Granite's ``embedding_multiplier``. Loaders
    fold Granite's other multipliers into the config and weights (docs/FORMATS.md). None
    (default, and what 1 becomes) leaves the rows as they are.

    ``nope_layers`` (rotary positions only): the layers, counted from 0, whose queries and
    keys RoPE does not turn (SmolLM3's NoPE layers, every fourth). Stored sorted and without
    repeats; None (default, and what an empty one becomes) turns every layer's. Not with a
    ``rope_attention_factor``, which RoPE's tables carry (those layers would lose it).

    ``activation="geglu"`` gates like SwiGLU with GELU's tanh form instead of SiLU:
    ``gelu_tanh(x @ w_gate) * (x @ w_up)`` (Gemma's). ``post_norms`` (RMSNorm only) adds
    Gemma's sandwich norms: the attention's and the MLP's outputs pass through an RMSNorm of
    their own (``attn_post_norm``, ``mlp_post_norm``) before they join the residual stream.

    ``local_layers`` (rotary positions only; with ``local_rope_theta``): the layers, counted
    from 0, whose RoPE turns with base ``local_rope_theta`` and without ``rope_freq_factors``
    (the rest as the model's; a ``rope_attention_factor`` and ``rope_dims`` apply to both):
    Gemma 3's sliding-window layers. Stored sorted and without repeats; None (default, and
    what an empty one becomes) has none, and then ``local_rope_theta`` must be None. Not with
    ``nope_layers``. ``sliding_window`` (with ``local_layers``; None: none) is their window:
    a key that many positions back or more is hidden from them (``max_seq_len`` may exceed
    it: their attention reads the window's keys only).
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
    rope_freq_factors: tuple[float, ...] | None = None
    rope_attention_factor: float | None = None
    rope_dims: int | None = None
    embedding_scale: float | None = None
    nope_layers: tuple[int, ...] | None = None
    post_norms: bool = False
    local_layers: tuple[int, ...] | None = None
    local_rope_theta: float | None = None
    sliding_window: int | None = None

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
        if self.weight_dtype not in (None, "float16", BF16, "float32", "float64",
                                     *QUANT_WEIGHT_DTYPES):
            raise ValueError("weight_dtype must be None, 'float16', 'bfloat16', 'float32', "
                             "'float64', 'q8_0', 'q4_0' or 'q4_1', got "
                             f"{self.weight_dtype!r}")
        if self.weight_dtype == self.dtype:
            object.__setattr__(self, "weight_dtype", None)
        elif self.weight_dtype in QUANT_WEIGHT_DTYPES:
            self._check_quantized()
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
        if self.rope_dims is not None:
            if self.positional != "rope":
                raise ValueError("rope_dims needs positional='rope'")
            check_index(self.rope_dims, "rope_dims", 2, self.head_dim)
            if self.rope_dims % 2:
                raise ValueError(f"rope_dims must be even, got {self.rope_dims}")
            if self.rope_dims == self.head_dim:
                object.__setattr__(self, "rope_dims", None)
        if self.rope_freq_factors is not None:
            self._check_freq_factors()
        if self.rope_attention_factor is not None:
            if self.positional != "rope":
                raise ValueError("rope_attention_factor needs positional='rope'")
            factor = positive_number(self.rope_attention_factor, "rope_attention_factor")
            object.__setattr__(self, "rope_attention_factor", None if factor == 1 else factor)
        if self.embedding_scale is not None:
            if self.positional != "rope":
                raise ValueError("embedding_scale needs positional='rope'")
            scale = positive_number(self.embedding_scale, "embedding_scale")
            object.__setattr__(self, "embedding_scale", None if scale == 1 else scale)
        if self.nope_layers is not None:
            object.__setattr__(self, "nope_layers", self._layer_set("nope_layers"))
        self._check_gemma()
        if self.nope_layers and self.rope_attention_factor is not None:
            raise ValueError("nope_layers with a rope_attention_factor: the factor is carried by "
                             "RoPE's tables, which NoPE layers do not use")

    def _layer_set(self, name: str) -> tuple[int, ...] | None:
        """Field ``name`` (layer indices) sorted and without repeats; None for none."""
        if self.positional != "rope":
            raise ValueError(f"{name} needs positional='rope'")
        raw: Any = getattr(self, name)  # any iterable of ints, checked here
        if isinstance(raw, (str, bytes)) or not hasattr(raw, "__iter__"):
            raise ValueError(f"{name} must be a sequence of layer indices, got {raw!r}")
        layers = sorted({check_index(i, name, 0, self.n_layers - 1) for i in raw})
        return tuple(layers) or None

    def _check_gemma(self) -> None:
        """Gemma's fields: the sandwich norms' family, the local layers and their base."""
        if not isinstance(self.post_norms, bool):
            raise ValueError(f"post_norms must be a bool, got {self.post_norms!r}")
        if self.post_norms and self.norm != "rmsnorm":
            raise ValueError("post_norms needs norm='rmsnorm'")
        if self.local_layers is not None:
            object.__setattr__(self, "local_layers", self._layer_set("local_layers"))
        if (self.local_layers is None) != (self.local_rope_theta is None):
            raise ValueError("local_layers and local_rope_theta go together (both or neither)")
        if self.local_rope_theta is not None:
            object.__setattr__(self, "local_rope_theta",
                               positive_number(self.local_rope_theta, "local_rope_theta"))
        if self.local_layers and self.nope_layers:
            raise ValueError("local_layers with nope_layers is not supported")
        if self.sliding_window is not None:
            if not self.local_layers:
                raise ValueError("sliding_window needs local_layers (the layers it applies to)")
            check_index(self.sliding_window, "sliding_window", 1, 2**31 - 1)

    def _check_freq_factors(self) -> None:
        if self.positional != "rope":
            raise ValueError("rope_freq_factors needs positional='rope'")
        rotated = self.rope_dims or int(self.head_dim or 0)
        factors = freq_factors(self.rope_freq_factors, rotated // 2,
                               f"RoPE of {rotated} dims")
        object.__setattr__(self, "rope_freq_factors", factors)

    def _check_quantized(self) -> None:
        if self.dtype != "float32":
            raise ValueError(f"weight_dtype {self.weight_dtype!r} needs dtype 'float32', got "
                             f"{self.dtype!r}")
        widths = {"dim": self.dim, "n_heads * head_dim": self.n_heads * self.head_dim,
                  "ffn_dim": self.ffn_dim}
        for name, width in widths.items():
            if width % 32:
                raise ValueError(f"weight_dtype {self.weight_dtype!r} stores blocks of 32 "
                                 f"inputs: {name} must be a multiple of 32, got {width}")

    @property
    def quantized(self) -> bool:
        """Whether the matrices are stored quantized (``weight_dtype`` q8_0, q4_0 or q4_1)."""
        return self.weight_dtype in QUANT_WEIGHT_DTYPES

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
        fields: dict[str, Any] = dict(vocab_size=260, dim=256, n_layers=4, n_heads=8,
                                      n_kv_heads=8, ffn_dim=704, max_seq_len=4096 + 64,
                                      dtype=dtype)
        fields.update(overrides)
        return cls(**fields)

    @property
    def matrix_dtype(self) -> str:
        """Storage dtype of the large matrices: ``weight_dtype``, or ``dtype`` when None."""
        return self.weight_dtype or self.dtype

    @property
    def matrix_itemsize(self) -> float:
        """Bytes per stored matrix element (2 for float16 and bfloat16; 34/32, 18/32 and
        20/32 for q8_0, q4_0 and q4_1: a float, not an int, for those)."""
        if self.quantized:
            return _QUANT_ITEMSIZE[self.weight_dtype]
        return 2 if self.matrix_dtype == BF16 else np.dtype(self.matrix_dtype).itemsize

    def to_dict(self) -> dict:
        """Return the config as a JSON-serialisable dict (``weight_dtype``,
        ``rope_freq_factors``, ``rope_attention_factor``, ``rope_dims``, ``embedding_scale``,
        ``nope_layers``, ``post_norms``, ``local_layers``, ``local_rope_theta`` and
        ``sliding_window`` only when set)."""
        d = dataclasses.asdict(self)
        for key in ("weight_dtype", "rope_freq_factors", "rope_attention_factor", "rope_dims",
                    "embedding_scale", "nope_layers", "post_norms", "local_layers",
                    "local_rope_theta", "sliding_window"):
            if d[key] is None or d[key] is False:  # files of default models stay readable
                del d[key]  # by older versions
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build a config from :meth:`to_dict` output; unknown keys raise ValueError."""
        check_known_fields(cls, d, "ModelConfig")
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)
