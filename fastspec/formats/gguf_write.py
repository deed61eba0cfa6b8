"""GGUF files written: a :class:`~fastspec.Transformer` as llama.cpp's format (``gguf`` package).

:func:`save_gguf` is what ``model.save("x.gguf")`` and ``fastspec quantize`` run. It writes the
architecture metadata of the model's family (``llama`` without QK-norm and biases, ``qwen2`` with
q/k/v biases, ``qwen3`` with QK-norm, ``granite`` with an ``embedding_scale``, ``smollm3`` with
``nope_layers``, ``gemma3`` with sandwich norms; or the source file's architecture, except that
a ``phi3``, ``exaone``, ``ernie4_5`` or ``internlm2`` file's model is written as the ``llama`` it
computes), copies every
other key of a source GGUF file (the tokenizer's ``tokenizer.*`` keys, ``general.*``), and the
tensors under their GGUF names: quantized matrices as their blocks (Q8_0, Q4_0, Q4_1), float ones
as F32 (F16 for float16 storage, BF16 for bfloat16), norms and biases as F32. The rows of a
``llama``, ``granite`` or ``smollm3`` file's ``attn_q``/``attn_k`` are permuted as llama.cpp's
converter does, so that llama.cpp and fastspec (and transformers' GGUF loader, which reads no
``granite``) read the same model back.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fastspec.formats import gemma3, granite
from fastspec.formats.gguf import gguf_package
from fastspec.formats.gguf_names import ROPE_FREQS, gguf_tensor_name, permute
from fastspec.formats.hf_rope import linear_factor

if TYPE_CHECKING:  # annotations only
    from fastspec.model.transformer import Transformer

__all__ = ["save_gguf", "architecture_of"]

#: The architectures written (a source file's own where it is one of them).
WRITTEN = ("llama", "qwen2", "qwen3", "granite", "smollm3", "gemma3")
#: Architectures whose ``attn_q``/``attn_k`` rows llama.cpp's converter permutes.
_PERMUTED = ("llama", "granite", "smollm3")
#: Those where llama.cpp reads a ``rope_freqs.weight`` tensor.
_ROPE_FREQS_ARCHS = ("llama", "granite")
#: Keys the writer sets itself; never copied from a source file.
_OWN_KEYS = ("general.architecture", "general.file_type", "general.quantization_version",
             "general.alignment")


def architecture_of(model: "Transformer", source_arch: str | None = None) -> str:
    """Return the GGUF architecture ``model`` is written as.

    ``source_arch`` (the file it came from) wins when it is one of :data:`WRITTEN`; otherwise
    ``qwen2`` for q/k/v biases, ``qwen3`` for QK-norm, else ``llama`` (a ``phi3`` file's
    model: its fused tensors split, its LongRoPE short factors as ``rope_freqs.weight``).
    A model with an ``embedding_scale`` is ``granite`` (:mod:`~fastspec.formats.granite`: its
    RoPE attention factor becomes the attention scale), one with ``nope_layers`` ``smollm3``
    (only every fourth layer's, as llama.cpp hard-codes them), one with sandwich norms
    ``gemma3`` (:func:`~fastspec.formats.gemma3.gguf_keys`).

    Raises
    ------
    ValueError
        A model that no supported architecture describes (the toy family: LayerNorm,
        learned positions, tanh/gelu), or per-frequency RoPE factors (not all equal: equal
        ones are linear scaling, written as keys) in a file that is not ``llama`` or ``granite``,
        an ``embedding_scale`` with q/k/v biases or QK-norm, or ``nope_layers`` other than
        every fourth layer's (or with a Granite's multipliers, biases or QK-norm).
    """
    c = model.config
    if c.post_norms:  # Gemma 3's sandwich norms: its shape, llama.cpp's layer pattern
        gemma3.gguf_keys(c)
        return "gemma3"
    if c.local_layers:
        raise ValueError("local RoPE layers (local_layers) are written to GGUF only as Gemma "
                         "3's, with its sandwich norms; save to .npz instead")
    if (c.norm, c.positional, c.activation) != ("rmsnorm", "rope", "swiglu"):
        raise ValueError("only Llama-family models (RMSNorm, RoPE, SwiGLU) and Gemma 3 can be "
                         f"written as GGUF; this one is {c.norm}/{c.positional}/{c.activation}")
    if c.qkv_bias and c.qk_norm and source_arch not in WRITTEN:
        raise ValueError("a model with both q/k/v biases and QK-norm has no GGUF architecture "
                         "fastspec reads")
    arch = source_arch if source_arch in WRITTEN and source_arch != "gemma3" else (
        "qwen2" if c.qkv_bias else "qwen3" if c.qk_norm else "llama")
    if c.embedding_scale is not None:  # Granite's embedding multiplier
        if c.qkv_bias or c.qk_norm:
            raise ValueError("embedding_scale (Granite's) with q/k/v biases or QK-norm has no "
                             "GGUF architecture fastspec reads")
        arch = "granite"
    if c.nope_layers:  # SmolLM3's: llama.cpp turns no RoPE in every fourth layer, no key
        if c.nope_layers != tuple(range(3, c.n_layers, 4)) or arch == "granite" or (
                c.qkv_bias or c.qk_norm):
            raise ValueError(f"NoPE layers {c.nope_layers} are written to GGUF only as "
                             "SmolLM3's (every fourth layer: 3, 7, ..., llama.cpp's rule), "
                             "without a Granite's multipliers, biases or QK-norm")
        arch = "smollm3"
    elif arch == "smollm3":  # a source file's architecture, for a model without them
        arch = "llama"
    if c.rope_dims:
        raise ValueError("partial rotary (rope_dims, Phi-4-mini's) is not written to GGUF: its "
                         "q/k rows are in fastspec's order (.npz keeps the model; fastspec "
                         "quantize cannot write it)")
    per_frequency = c.rope_freq_factors is not None and linear_factor(c.rope_freq_factors) is None
    if per_frequency and arch not in _ROPE_FREQS_ARCHS:
        raise ValueError(f"per-frequency RoPE factors (rope_freq_factors) are a llama or "
                         f"granite tensor in GGUF; llama.cpp refuses them in a {arch} file")
    return arch


def _hparams(w: Any, arch: str, model: "Transformer") -> set[str]:
    """Write the architecture keys of ``model``; return the keys written."""
    gguf = gguf_package()
    c = model.config
    U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    keys: dict[str, tuple[Any, Any]] = {
        "context_length": (c.max_seq_len, U32), "embedding_length": (c.dim, U32),
        "block_count": (c.n_layers, U32), "feed_forward_length": (c.ffn_dim, U32),
        "attention.head_count": (c.n_heads, U32), "attention.head_count_kv": (c.n_kv_heads, U32),
        "attention.layer_norm_rms_epsilon": (c.norm_eps, F32),
        "rope.freq_base": (c.rope_theta, F32), "vocab_size": (c.vocab_size, U32)}
    if arch in _PERMUTED:
        keys["rope.dimension_count"] = (c.head_dim, U32)
    if arch in ("qwen3", "gemma3") or c.head_dim * c.n_heads != c.dim:
        keys["attention.key_length"] = (c.head_dim, U32)
        keys["attention.value_length"] = (c.head_dim, U32)
    factor = linear_factor(c.rope_freq_factors)
    if factor is not None:  # one divisor for every frequency: llama.cpp's linear scaling
        keys["rope.scaling.type"] = ("linear", gguf.GGUFValueType.STRING)
        keys["rope.scaling.factor"] = (factor, F32)
    if arch == "granite":  # the attention factor as its attention scale
        multipliers = granite.gguf_keys(c.embedding_scale, c.rope_attention_factor,
                                        int(c.head_dim or 0))
        keys.update({k: (v, F32) for k, v in multipliers.items()})
    elif arch == "gemma3":  # its attention factor is llama.cpp's own (gemma3.gguf_keys)
        keys.update({k: (v, U32 if type(v) is int else F32)
                     for k, v in gemma3.gguf_keys(c).items()})
    elif c.rope_attention_factor is not None:  # llama.cpp multiplies cos and sin by it
        keys["rope.scaling.attn_factor"] = (c.rope_attention_factor, F32)
    for leaf, (value, vtype) in keys.items():
        w.add_key_value(f"{arch}.{leaf}", value, vtype)
    return {f"{arch}.{leaf}" for leaf in keys}


def _copy_metadata(w: Any, source: Path, skip: set[str], arch: str) -> None:
    """Copy every key of GGUF file ``source`` that is not in ``skip`` nor the writer's own (nor
    a RoPE scaling key: the model's own divisors are written instead; nor a gemma3 file's
    window, layer pattern, bases and soft-cap, which the model's config states, nor its vision
    tower's keys, whose tensors are not written; nor a key of another
    architecture than ``arch``, the one written)."""
    gguf = gguf_package()
    reader = gguf.GGUFReader(source, mode="r")
    ARRAY = gguf.GGUFValueType.ARRAY
    field = reader.fields.get("general.architecture")
    src_arch = str(field.contents()) if field is not None else arch
    for key, field in reader.fields.items():
        leaf = key.split(".", 1)[-1]
        if (key.startswith("GGUF.") or key in skip or key in _OWN_KEYS
                or leaf.startswith("rope.scal")
                or (key.startswith("gemma3.") and (  # the model's own, no vision tower
                    leaf in gemma3.GGUF_KEYS or leaf.startswith(gemma3.VISION_KEYS)))
                or (src_arch != arch and key.startswith(src_arch + "."))):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == ARRAY and len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)


def _file_type(model: "Transformer") -> int:
    gguf = gguf_package()
    names = {"q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1",
             "float16": "MOSTLY_F16", "bfloat16": "MOSTLY_BF16"}
    return int(getattr(gguf.LlamaFileType, names.get(model.config.weight_dtype, "ALL_F32")))


def _tensor(gguf: Any, a: Any) -> tuple[np.ndarray, Any]:
    """``(array, raw_dtype)`` for ``GGUFWriter.add_tensor`` of file-layout tensor ``a``."""
    if hasattr(a, "in_features"):  # QuantMatrix: its GGUF blocks
        qt = getattr(gguf.GGMLQuantizationType, a.kind.upper())
        return np.ascontiguousarray(a.to_blocks()), qt
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:  # bf16 bit patterns
        return a, gguf.GGMLQuantizationType.BF16
    if a.dtype == np.float16:
        return a, None
    return np.ascontiguousarray(a, dtype=np.float32), None


def save_gguf(model: "Transformer", path: str | os.PathLike, *,
              source: str | os.PathLike | None = None, name: str | None = None) -> None:
    """Write ``model`` to GGUF file ``path``.

    Parameters
    ----------
    model : Transformer
        A Llama-family model (see :func:`architecture_of`); float (F32/F16/BF16 tensors) or
        quantized (its blocks, byte for byte).
    path : path-like
        Written through a temporary file beside it, then renamed: a failed write leaves no
        partial file.
    source : path-like, optional
        The GGUF file the model came from: its architecture and every key the writer does
        not set itself (tokenizer, chat template, ``general.*``) are copied.
    name : str, optional
        ``general.name`` when the source has none.

    Raises
    ------
    ValueError
        A model no GGUF architecture describes.
    ImportError
        Without the ``gguf`` package.
    """
    gguf = gguf_package()
    path = Path(path)
    src_arch = None
    if source is not None:
        from fastspec.formats.gguf import GGUFFile
        src_arch = GGUFFile(source).architecture
    arch = architecture_of(model, src_arch)
    c = model.config
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    try:
        written = _hparams(w, arch, model)
        w.add_file_type(_file_type(model))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        if source is not None:
            _copy_metadata(w, Path(source), written, arch)
        elif name:
            w.add_name(name)
        for hf, a in model.state_dict().items():
            g = gguf_tensor_name(hf)
            arr, qt = _tensor(gguf, a)
            if arch in _PERMUTED and g.split(".")[-2] in ("attn_q", "attn_k"):
                arr = permute(arr, c.head_dim)
            w.add_tensor(g, arr, raw_dtype=qt)
        if c.rope_freq_factors is not None and linear_factor(c.rope_freq_factors) is None:
            w.add_tensor(ROPE_FREQS, np.asarray(c.rope_freq_factors, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise

