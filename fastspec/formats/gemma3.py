"""Google Gemma 3 (``Gemma3ForCausalLM`` folders, GGUF ``gemma3`` files): the text models.

Gemma 3 is a decoder with QK-norm and four things a Llama has not, each a
:class:`~fastspec.ModelConfig` field: GeGLU (``activation="geglu"``: GELU's tanh form gates the
MLP), sandwich norms (``post_norms``: the attention's and the MLP's outputs pass through an
RMSNorm of their own before they join the residual stream), token embeddings scaled by
``sqrt(hidden_size)`` (``embedding_scale``, rounded to float32 as llama.cpp and a float32
transformers model compute it) and sliding-window layers whose RoPE turns with a base of their own
(``local_layers``, ``local_rope_theta``; five of every six layers, 10000 against the global
layers' 1e6; a linear RoPE scaling applies to the global layers only). The sliding-window
layers attend over the last ``sliding_window`` positions (``ModelConfig.sliding_window``): a
key at distance ``sliding_window`` or more is the first one the window hides (transformers'
and llama.cpp's rule); the context (``max_seq_len``) is the model's.

Gemma's RMSNorm multiplies by ``1 + w``: a folder's norm weights (every ``*norm.weight``) are
read plus one (float64, one rounding; llama.cpp's converter writes them so into GGUF files)
and written back minus one. The attention scale ``query_pre_attn_scalar ** -0.5`` runs as
the RoPE attention factor ``(head_dim / query_pre_attn_scalar) ** 0.25`` when it is not
``head_dim``'s (a GGUF file has no key: llama.cpp derives it, ``hidden_size / heads`` for the
62-layer 27B, else ``head_dim``). A folder's layer norms have Gemma's names
(``pre_feedforward_layernorm`` is the pre-MLP norm, ``post_attention_layernorm`` and
``post_feedforward_layernorm`` the sandwich norms): :func:`folder_name` maps fastspec's keys
onto them.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastspec.formats.folded_tensor import FoldedTensor
from fastspec.formats.hf_rope import linear_factor, rope_theta
from fastspec.model.functional import positive_number

__all__ = ["ARCHITECTURE", "GGUF_KEYS", "VISION_KEYS", "VISION_TENSORS", "LLAMA_CPP_PATTERN",
           "global_rope", "settings", "gguf_entries", "folder_name", "fastspec_name",
           "folder_norm", "folder_state", "export_config", "gguf_keys"]

#: The Hugging Face class of the text models (``model_type`` ``gemma3_text``).
ARCHITECTURE = "Gemma3ForCausalLM"
#: Every ``LLAMA_CPP_PATTERN``-th layer (5, 11, ...) is a global one: transformers' default
#: ``sliding_window_pattern`` and llama.cpp's for a file without the pattern key.
LLAMA_CPP_PATTERN = 6
#: The ``gemma3.*`` GGUF keys beyond the common ones that the reader reads (Ollama's
#: converter names the bases ``rope.local.freq_base`` and ``rope.global.freq_base``).
GGUF_KEYS = ("attention.sliding_window", "rope.freq_base_swa", "rope.local.freq_base",
             "rope.global.freq_base", "attention.sliding_window_pattern",
             "final_logit_softcapping")
#: Prefixes of a ``gemma3`` file's keys (after ``gemma3.``) and tensors that belong to the
#: vision tower and its projector (Ollama's files of the 4B and larger models hold them):
#: fastspec runs the text model and leaves them unread.
VISION_KEYS = ("vision.", "mm.")
VISION_TENSORS = ("v.", "mm.")
#: The RoPE types of the global layers that run (:func:`global_rope`).
_GLOBAL_ROPE = ("default", "linear", "llama3")
#: fastspec's layer keys -> a Gemma folder's (the rest are the same).
_FOLDER_NAMES = {"post_attention_layernorm.weight": "pre_feedforward_layernorm.weight",
                 "post_attn_norm.weight": "post_attention_layernorm.weight",
                 "post_mlp_norm.weight": "post_feedforward_layernorm.weight"}
_FROM_FOLDER = {v: k for k, v in _FOLDER_NAMES.items()}


def global_rope(cfg: dict) -> dict:
    """``cfg`` with the global layers' RoPE parameters where :mod:`~fastspec.formats.hf_rope`
    reads them (transformers 5 keeps one object per layer type in ``rope_parameters``), and
    ``Gemma3TextConfig``'s global base, 1e6, where it gives none.

    Raises
    ------
    ValueError
        A RoPE type of the global layers other than default, linear and llama3 (YaRN,
        LongRoPE: their attention factors are not run here).
    """
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        cfg = {**cfg, "rope_parameters": params["full_attention"]}
    rope_theta(cfg, _GLOBAL_ROPE)  # the type checked
    return cfg if _has_theta(cfg) else {**cfg, "rope_theta": 1e6}


def _has_theta(cfg: dict) -> bool:
    """Whether a ``config.json`` names its (global) RoPE base."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return cfg.get("rope_theta") is not None or params.get("rope_theta") is not None


def _local_theta(cfg: dict) -> float:
    """The sliding-window layers' RoPE base (transformers 5's ``rope_parameters``, else 4's
    ``rope_local_base_freq``, else 10000)."""
    params = cfg.get("rope_parameters")
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    if isinstance(local, dict):
        kind = local.get("rope_type", local.get("type", "default"))
        if kind != "default":
            raise ValueError(f"{ARCHITECTURE}: RoPE scaling {kind!r} of the sliding-window "
                             "layers is not supported")
        theta = local.get("rope_theta")
    else:
        theta = cfg.get("rope_local_base_freq")
    return positive_number(10000.0 if theta is None else theta, "rope_local_base_freq")


def _local_layers(cfg: dict, n_layers: int) -> tuple[int, ...]:
    """The sliding-window layers (``layer_types``, else every ``sliding_window_pattern``-th
    layer global)."""
    types = cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern",
                                                            LLAMA_CPP_PATTERN))
        if type(pattern) is not int or pattern < 1:
            raise ValueError(f"{ARCHITECTURE}: sliding_window_pattern must be a positive int, "
                             f"got {pattern!r}")
        return tuple(i for i in range(n_layers) if (i + 1) % pattern)
    if (not isinstance(types, list) or len(types) != n_layers
            or any(t not in ("sliding_attention", "full_attention") for t in types)):
        raise ValueError(f"{ARCHITECTURE}: layer_types must list 'sliding_attention' or "
                         f"'full_attention' for each of the {n_layers} layers, got {types!r}")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def settings(cfg: dict, head_dim: int, context: int) -> dict[str, Any]:
    """Return the :class:`~fastspec.ModelConfig` fields that run a Gemma 3 ``config.json``
    (besides a Llama's): the activation, sandwich norms, embedding scale, local layers, their
    base and window, the attention factor (None for ``head_dim``'s scale;
    ``query_pre_attn_scalar`` defaults to 256, as ``Gemma3TextConfig``) and ``max_seq_len``
    (``context``).

    Raises
    ------
    ValueError
        A feature fastspec does not run (another activation, soft-capping, biases,
        bidirectional attention, another RoPE for the local layers) or a bad value (named).
    """
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"{ARCHITECTURE}: unsupported hidden_activation {act!r} (only "
                         "gelu_pytorch_tanh, GeGLU)")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(key):
            raise ValueError(f"{ARCHITECTURE}: {key}={cfg[key]!r} is not supported")
    for key in ("attention_bias", "use_bidirectional_attention"):
        if cfg.get(key):
            raise ValueError(f"{ARCHITECTURE}: {key}=True is not supported")
    n_layers, dim = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    local = _local_layers(cfg, n_layers)
    window = None
    if local:
        window = cfg.get("sliding_window")
        if type(window) is not int or window <= 0:
            raise ValueError(f"{ARCHITECTURE}: sliding_window must be a positive int, got "
                             f"{window!r}")
    scalar = positive_number(cfg.get("query_pre_attn_scalar", 256), "query_pre_attn_scalar")
    return dict(activation="geglu", post_norms=True, qk_norm=True,
                embedding_scale=float(np.float32(math.sqrt(dim))),
                local_layers=local or None, local_rope_theta=_local_theta(cfg) if local else None,
                sliding_window=window,
                rope_attention_factor=None if scalar == head_dim else (head_dim / scalar) ** 0.25,
                max_seq_len=context)


#: Layer counts of the 1B and of the 4B, 12B and 27B, for Ollama's corrections of its files.
_OLLAMA_1B, _OLLAMA_SCALED = 26, (34, 48, 62)


def gguf_entries(metadata: dict[str, Any], n_layers: int, dim: int, heads: int,
                 head_dim: int) -> dict[str, Any]:
    """Return the ``config.json`` entries of a ``gemma3`` GGUF file that a Llama's have not,
    as llama.cpp reads the file: the sliding window and its layers (``sliding_window_pattern``,
    a bool per layer or a period, else every sixth layer global), the bases (global:
    ``rope.freq_base``, else Ollama's ``rope.global.freq_base``, else Gemma's 1e6; local:
    ``rope.freq_base_swa``, else Ollama's ``rope.local.freq_base``, else 10000) and
    ``query_pre_attn_scalar`` (``dim / heads`` for 62 layers, else ``head_dim``).

    Ollama's converter made files that Ollama corrects as it loads them, and so does this
    reader (for a file whose window is shorter than its context, by its layer count): the 1B's
    ``final_logit_softcapping`` of 30 is none (Gemma 3 has none), and the 4B, 12B and 27B
    without RoPE scaling keys get the linear scaling 8 of their global layers.

    Raises
    ------
    ValueError
        A final logit soft-cap (but the 1B's), or a pattern or window of the wrong type
        (named).
    """
    key = "gemma3."
    window = metadata.get(key + "attention.sliding_window", 0)
    if type(window) is not int or window < 0:
        raise ValueError(f"metadata key '{key}attention.sliding_window' must be a "
                         f"non-negative int, got {window!r}")
    corrected = 0 < window < metadata.get(key + "context_length", 0)  # Ollama's test
    softcap = metadata.get(key + "final_logit_softcapping")
    if softcap and not (corrected and n_layers == _OLLAMA_1B):
        raise ValueError(f"metadata key '{key}final_logit_softcapping' = {softcap!r} is not "
                         "supported")
    scaling: dict[str, Any] = {}
    if corrected and n_layers in _OLLAMA_SCALED and not any(
            k.startswith(key + "rope.scal") for k in metadata):
        scaling["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    pattern = metadata.get(key + "attention.sliding_window_pattern", LLAMA_CPP_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or any(type(p) is not bool for p in pattern):
            raise ValueError(f"metadata key '{key}attention.sliding_window_pattern' must hold "
                             f"a bool for each of the {n_layers} layers")
        sliding = list(pattern)
    elif type(pattern) is int and pattern >= 0:  # llama.cpp: 0 makes every layer slide
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers)]
    else:
        raise ValueError(f"metadata key '{key}attention.sliding_window_pattern' must be a "
                         f"bool array or a non-negative int, got {pattern!r}")
    if not window:  # llama.cpp: no window, no sliding layers
        sliding = [False] * n_layers
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    bases = {}
    for name, keys, default in (
            ("rope_theta", ("rope.freq_base", "rope.global.freq_base"), 1e6),
            ("rope_local_base_freq", ("rope.freq_base_swa", "rope.local.freq_base"), 1e4)):
        found = [k for k in keys if key + k in metadata]
        bases[name] = positive_number(metadata[key + found[0]] if found else default,
                                      f"metadata key '{key}{(found or keys)[0]}'")
    return {"architectures": [ARCHITECTURE], "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": window or None, "layer_types": types, **bases, **scaling,
            "query_pre_attn_scalar": dim // heads if n_layers == 62 else head_dim}


def folder_name(name: str) -> str:
    """A Gemma folder's name of fastspec's tensor ``name`` (the same but for three layer
    norms: see the module)."""
    if name.startswith("model.layers."):
        prefix, leaf = name.rsplit(".", 2)[0], ".".join(name.rsplit(".", 2)[1:])
        return f"{prefix}.{_FOLDER_NAMES.get(leaf, leaf)}"
    return name


def fastspec_name(name: str) -> str:
    """fastspec's name of a Gemma folder's tensor ``name`` (:func:`folder_name` inverted)."""
    if name.startswith("model.layers."):
        prefix, leaf = name.rsplit(".", 2)[0], ".".join(name.rsplit(".", 2)[1:])
        return f"{prefix}.{_FROM_FOLDER.get(leaf, leaf)}"
    return name


def folder_norm(tensor: Any, name: str) -> Any:
    """A Gemma folder's tensor ``name`` as fastspec runs it: a norm weight plus one
    (:class:`~fastspec.formats.folded_tensor.FoldedTensor`), any other as it is."""
    if not name.endswith("norm.weight"):
        return tensor
    return FoldedTensor(tensor, shift=1.0, what=f"{name} plus one")


def folder_state(state: dict[str, Any]) -> dict[str, Any]:
    """A Gemma model's ``state_dict()`` as its folder holds it: :func:`folder_name` s, norm
    weights minus one (float64, rounded once to the array's dtype: exact for weights in
    [0.5, 2], within an ulp of 1 read back otherwise)."""
    out = {}
    for name, a in state.items():
        if name.endswith("norm.weight"):
            a = (np.asarray(a, np.float64) - 1.0).astype(a.dtype)
        out[folder_name(name)] = a
    return out


def export_config(c: Any) -> dict[str, Any]:
    """The ``Gemma3ForCausalLM`` ``config.json`` entries of Gemma 3 config ``c`` (a
    :class:`~fastspec.ModelConfig` with ``post_norms``) beyond a Llama's.

    Raises
    ------
    ValueError
        A model that is not Gemma 3's shape (GeGLU, QK-norm, sandwich norms, the embedding
        scale of its width, no biases).
    """
    _check_shape(c)
    if c.rope_freq_factors is not None and linear_factor(c.rope_freq_factors) is None:
        raise ValueError("per-frequency RoPE factors (rope_freq_factors) have no Gemma 3 "
                         "config.json form here; save to .npz instead")
    local = set(c.local_layers or ())
    factor = c.rope_attention_factor
    scalar = c.head_dim / factor ** 4 if factor else c.head_dim
    if not math.isclose(scalar, round(scalar), rel_tol=1e-9):  # transformers takes an int
        raise ValueError(f"the RoPE attention factor {factor!r} is no integer "
                         "query_pre_attn_scalar of a Gemma 3 config.json; save to .npz")
    return {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": round(scalar),
            "sliding_window": c.sliding_window or c.max_seq_len,
            "layer_types": ["sliding_attention" if i in local else "full_attention"
                            for i in range(c.n_layers)],
            "rope_local_base_freq": c.local_rope_theta or 10000.0,
            "final_logit_softcapping": None, "attn_logit_softcapping": None}


def _check_shape(c: Any) -> None:
    """Raise ValueError unless ``c`` is Gemma 3's shape (see :func:`export_config`)."""
    scale = float(np.float32(math.sqrt(c.dim)))
    if not (c.activation == "geglu" and c.qk_norm and c.post_norms and not c.qkv_bias
            and c.embedding_scale == scale and not c.nope_layers and not c.rope_dims):
        raise ValueError("only Gemma 3's shape (GeGLU, QK-norm, sandwich norms, an embedding "
                         "scale of float32(sqrt(dim)), no biases) is written as Gemma 3; save "
                         "to .npz instead")


def gguf_keys(c: Any) -> dict[str, Any]:
    """The ``gemma3.*`` keys (after the prefix) that write Gemma 3 config ``c`` for llama.cpp.

    Raises
    ------
    ValueError
        Local layers other than llama.cpp's every-sixth pattern, or an attention factor that
        llama.cpp does not derive (see the module).
    """
    _check_shape(c)
    if c.rope_freq_factors is not None and linear_factor(c.rope_freq_factors) is None:
        raise ValueError("per-frequency RoPE factors (rope_freq_factors) are not written to a "
                         "gemma3 file (llama.cpp reads none); save to .npz instead")
    local = tuple(c.local_layers or ())
    if local and local != tuple(i for i in range(c.n_layers) if (i + 1) % LLAMA_CPP_PATTERN):
        raise ValueError(f"Gemma 3 local layers {local} are written to GGUF only as "
                         "llama.cpp's pattern (every sixth layer global: 5, 11, ...)")
    scalar = c.dim // c.n_heads if c.n_layers == 62 else c.head_dim
    factor = None if scalar == c.head_dim else (c.head_dim / scalar) ** 0.25
    if not _close(c.rope_attention_factor, factor):
        raise ValueError("a Gemma 3 attention scale other than llama.cpp's (1 / sqrt(head_dim),"
                         " or sqrt(heads / dim) at 62 layers) has no GGUF key")
    keys: dict[str, Any] = {}
    if local:
        keys["attention.sliding_window"] = c.sliding_window or c.max_seq_len
        keys["rope.freq_base_swa"] = c.local_rope_theta
    return keys


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12)
