"""The weight schema of a decoder layer: one table of names, shapes, file keys and init.

Every place that names, shapes, checks, saves, loads or initialises a layer's weights reads
this table: :class:`~fastspec.Transformer`, :class:`~fastspec.DFlashModel`, the Hugging Face
checkpoint reader and the trainers. Matrices are held in ``(in, out)`` layout (``x @ W``) and
stored transposed under their Hugging Face key (``out, in``), as ``nn.Linear`` keeps them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np

__all__ = ["LayerWeights", "WeightSpec", "LAYER_WEIGHTS", "MATRICES", "FORWARD_MATRICES",
           "layer_attrs", "layer_shapes", "random_layer", "layer_state", "layer_from_state",
           "check_layer", "hf_layer_keys"]


@dataclass
class LayerWeights:
    """Weights of one decoder layer, linear maps in ``(in, out)`` layout (``x @ W``).

    Shapes: ``wq (dim, H*D)``, ``wk, wv (dim, Hkv*D)``, ``wo (H*D, dim)``, ``w_up (dim, F)``,
    ``w_gate (dim, F)`` (SwiGLU and GeGLU only), ``w_down (F, dim)``, norms ``(dim,)``
    (RMSNorm only), ``q_norm, k_norm (D,)`` (QK-norm only), ``q_bias (H*D,)``, ``k_bias,
    v_bias (Hkv*D,)`` (``qkv_bias`` only: Qwen2), ``attn_post_norm, mlp_post_norm (dim,)``
    (``post_norms`` only: Gemma's sandwich norms). Absent weights are None.
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
    attn_post_norm: np.ndarray | None = None
    mlp_post_norm: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """Return the present weights by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class WeightSpec:
    """One weight of a layer.

    Attributes
    ----------
    attr : str
        :class:`LayerWeights` field.
    key : str
        Hugging Face key inside a layer (``model.layers.{i}.`` + key).
    shape : callable
        ``shape(dim, H, Hkv, D, F)`` in fastspec's layout.
    init : str
        ``"matrix"`` (N(0, 1/in), stored in ``weight_dtype``), ``"norm"`` (1 + 0.1 N) or
        ``"bias"`` (0.1 N).
    """

    attr: str
    key: str
    shape: Callable[[int, int, int, int, int], tuple[int, ...]]
    init: str


#: The layer's weights, in the order :func:`random_layer` draws them.
LAYER_WEIGHTS: tuple[WeightSpec, ...] = (
    WeightSpec("wq", "self_attn.q_proj.weight", lambda d, H, K, D, F: (d, H * D), "matrix"),
    WeightSpec("wk", "self_attn.k_proj.weight", lambda d, H, K, D, F: (d, K * D), "matrix"),
    WeightSpec("wv", "self_attn.v_proj.weight", lambda d, H, K, D, F: (d, K * D), "matrix"),
    WeightSpec("wo", "self_attn.o_proj.weight", lambda d, H, K, D, F: (H * D, d), "matrix"),
    WeightSpec("w_up", "mlp.up_proj.weight", lambda d, H, K, D, F: (d, F), "matrix"),
    WeightSpec("w_down", "mlp.down_proj.weight", lambda d, H, K, D, F: (F, d), "matrix"),
    WeightSpec("w_gate", "mlp.gate_proj.weight", lambda d, H, K, D, F: (d, F), "matrix"),
    WeightSpec("attn_norm", "input_layernorm.weight", lambda d, H, K, D, F: (d,), "norm"),
    WeightSpec("mlp_norm", "post_attention_layernorm.weight", lambda d, H, K, D, F: (d,), "norm"),
    WeightSpec("q_norm", "self_attn.q_norm.weight", lambda d, H, K, D, F: (D,), "norm"),
    WeightSpec("k_norm", "self_attn.k_norm.weight", lambda d, H, K, D, F: (D,), "norm"),
    WeightSpec("q_bias", "self_attn.q_proj.bias", lambda d, H, K, D, F: (H * D,), "bias"),
    WeightSpec("k_bias", "self_attn.k_proj.bias", lambda d, H, K, D, F: (K * D,), "bias"),
    WeightSpec("v_bias", "self_attn.v_proj.bias", lambda d, H, K, D, F: (K * D,), "bias"),
    # Gemma's sandwich norms (fastspec's own keys: Gemma's post_attention_layernorm is not
    # the pre-MLP norm that key names above)
    WeightSpec("attn_post_norm", "post_attn_norm.weight", lambda d, H, K, D, F: (d,), "norm"),
    WeightSpec("mlp_post_norm", "post_mlp_norm.weight", lambda d, H, K, D, F: (d,), "norm"),
)
_SPECS = {s.attr: s for s in LAYER_WEIGHTS}
#: Fields stored in ``ModelConfig.weight_dtype`` (with the embedding and the head).
MATRICES: tuple[str, ...] = tuple(s.attr for s in LAYER_WEIGHTS if s.init == "matrix")
#: The same fields in the order a forward reads them (csrc/fs_model.h's layer struct).
FORWARD_MATRICES: tuple[str, ...] = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def layer_attrs(*, swiglu: bool, rmsnorm: bool, qk_norm: bool, qkv_bias: bool,
                post_norms: bool = False) -> tuple[str, ...]:
    """Return the fields a layer of this family holds, in :data:`LAYER_WEIGHTS` order
    (``swiglu``: a gated MLP, SwiGLU or GeGLU)."""
    optional = {"w_gate": swiglu, "attn_norm": rmsnorm, "mlp_norm": rmsnorm, "q_norm": qk_norm,
                "k_norm": qk_norm, "q_bias": qkv_bias, "k_bias": qkv_bias, "v_bias": qkv_bias,
                "attn_post_norm": post_norms, "mlp_post_norm": post_norms}
    return tuple(s.attr for s in LAYER_WEIGHTS if optional.get(s.attr, True))


def layer_shapes(dim: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 ffn_dim: int) -> dict[str, tuple[int, ...]]:
    """Return every field's shape (fastspec layout) for these sizes."""
    return {s.attr: s.shape(dim, n_heads, n_kv_heads, head_dim, ffn_dim) for s in LAYER_WEIGHTS}


def random_layer(rng: np.random.Generator, shapes: Mapping[str, tuple[int, ...]],
                 attrs: Iterable[str]) -> LayerWeights:
    """Draw a layer's weights from ``rng`` in :data:`LAYER_WEIGHTS` order.

    Matrices ~ N(0, 1/in) (unit-variance outputs), norms 1 + 0.1 N(0, 1), biases 0.1 N(0, 1).
    """
    wanted = set(attrs)
    kw = {}
    for s in LAYER_WEIGHTS:
        if s.attr not in wanted:
            continue
        shape = shapes[s.attr]
        if s.init == "matrix":
            kw[s.attr] = rng.normal(0.0, 1.0 / math.sqrt(shape[0]), shape)
        elif s.init == "norm":
            kw[s.attr] = 1.0 + 0.1 * rng.normal(size=shape[0])
        else:
            kw[s.attr] = 0.1 * rng.normal(size=shape[0])
    return LayerWeights(**kw)


def layer_state(lw: LayerWeights, prefix: str) -> dict[str, np.ndarray]:
    """Return the layer's weights under ``prefix + key`` in file layout (matrices transposed;
    a quantized matrix as it is: its rows are outputs)."""
    # a QuantMatrix (no ndim) already is (out, in)
    return {prefix + _SPECS[attr].key: (a.T if getattr(a, "ndim", 0) == 2 else a)
            for attr, a in lw.arrays().items()}


def layer_from_state(get: Callable[[str], np.ndarray], prefix: str,
                     attrs: Iterable[str]) -> LayerWeights:
    """Build a layer from ``get(prefix + key)`` (file layout) for the fields ``attrs``."""
    kw = {}
    for attr in attrs:
        a = get(prefix + _SPECS[attr].key)
        kw[attr] = a.T if a.ndim == 2 else a
    return LayerWeights(**kw)


def check_layer(lw: LayerWeights, where: str, shapes: Mapping[str, tuple[int, ...]],
                attrs: Iterable[str]) -> None:
    """Raise ValueError unless ``lw`` holds exactly ``attrs``, each of its ``shapes`` entry.

    ``where`` names the layer in the message (``"layer 3"``, ``"draft layer 0"``).
    """
    wanted = tuple(attrs)
    extra = sorted(set(lw.arrays()) - set(wanted))
    if extra:
        raise ValueError(f"{where}: unexpected weights {extra}")
    for attr in wanted:
        a = getattr(lw, attr)
        if a is None:
            raise ValueError(f"{where}: missing weight {attr}")
        shape = ((a.in_features, a.out_features) if hasattr(a, "in_features")  # QuantMatrix
                 else a.shape)
        if shape != shapes[attr]:
            raise ValueError(f"{where}: {attr} must have shape {shapes[attr]}, got {shape}")


def hf_layer_keys(prefix: str, attrs: Iterable[str]) -> list[str]:
    """Return the file keys of a layer's fields ``attrs`` under ``prefix``."""
    return [prefix + _SPECS[attr].key for attr in attrs]
