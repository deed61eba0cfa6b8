"""GGUF model files (llama.cpp's format): metadata, model config and tensors, memory-mapped.

:class:`GGUFFile` opens a file once (its header read by
:func:`~fastspec.formats.gguf_header.read_header`, checked against the file's size; the ``gguf``
package of the optional ``[gguf]`` extra, imported here only, gives the type tables and the
dequantization) and serves everything a load needs from that one parse: the metadata as
plain Python values (:func:`read_metadata`, which the GGUF tokenizer builds from), the
:class:`~fastspec.ModelConfig` of a ``llama`` (Mistral-style included), ``qwen2``, ``qwen3``,
``phi3``, ``granite`` (:mod:`~fastspec.formats.granite`), ``smollm3`` (NoPE layers),
``exaone``, ``ernie4_5`` or ``internlm2`` file (the last three a Llama), and its tensors as
:class:`GGUFTensor` s under their Hugging Face names, which
:meth:`fastspec.Transformer.from_tensors` dequantizes block of rows by block of rows into
their storage dtype. :func:`load_gguf` is what
``Transformer.load("x.gguf")`` runs.

Decoding a real vocabulary's strings takes tens of milliseconds: still, keep one
:class:`GGUFFile` per load and hand it to every reader (model and tokenizer).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from fastspec.formats import gemma3, granite
from fastspec.formats.file_map import FileMap
from fastspec.formats.gguf_fused import split_fused
from fastspec.formats.gguf_header import read_header
from fastspec.formats.gguf_names import (LEAF, ROPE_FREQS, TOP, gguf_tensor_name, hf_shapes,
                                         rotary_order)
from fastspec.formats.gguf_quant import AUTO_FLOAT_KIND, NEAREST_NATIVE, own_weight_dtype
from fastspec.formats.gguf_rope import (LONGROPE, attention_factor, freq_factors,
                                        rope_context, rope_scaling)
from fastspec.formats.gguf_tensor import GGUFTensor, file_tensor, gguf_package
from fastspec.formats.hf_folder import hf_config
from fastspec.model.config import ModelConfig

if TYPE_CHECKING:  # annotations only
    from fastspec.model.transformer import Transformer

__all__ = ["GGUFFile", "GGUFTensor", "read_metadata", "load_gguf", "ARCHITECTURES",
           "NATIVE_QUANT_TYPES", "NEAREST_NATIVE", "gguf_package", "gguf_tensor_name"]

#: GGUF ``general.architecture`` -> the Hugging Face class it maps onto.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM",
                 "granite": "GraniteForCausalLM", "exaone": "LlamaForCausalLM",
                 "ernie4_5": "LlamaForCausalLM", "internlm2": "LlamaForCausalLM",
                 "smollm3": "SmolLM3ForCausalLM", "gemma3": gemma3.ARCHITECTURE}
#: Tensors beside a model's that an architecture may have (RoPE divisors, as llama.cpp).
_ROPE_TENSORS = {"llama": (ROPE_FREQS,), "granite": (ROPE_FREQS,), "exaone": (ROPE_FREQS,),
                 "phi3": LONGROPE}
#: Architectures llama.cpp turns with its normal RoPE (adjacent pairs): their q/k rows are
#: reordered into rotate-half pairs as they are read (``gguf_names.unpermute``).
_NORM_ROPE = ("llama", "granite", "ernie4_5", "internlm2", "smollm3")
#: ``weight_dtype`` names of the native quantized storage (GGUF's own Q8_0, Q4_0, Q4_1).
NATIVE_QUANT_TYPES = ("q8_0", "q4_0", "q4_1")

#: Architecture keys (after ``"{arch}."``) the config reads; any other ``{arch}.*`` key is
#: refused unless :func:`_check_arch_key` knows it changes nothing fastspec computes.
_CONFIG_KEYS = frozenset({
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.dimension_count", "rope.freq_base",
    "vocab_size"})
class GGUFFile:
    """A GGUF file, parsed once and memory-mapped (copy-on-write).

    Parameters
    ----------
    path : path-like

    Attributes
    ----------
    path : Path
    metadata : dict of str to value
        Every key/value pair of the file, see :func:`read_metadata`.
    architecture : str or None
        ``general.architecture``.

    Raises
    ------
    ValueError
        A header that the file cannot hold or that is corrupt, or metadata strings that are
        not UTF-8 (:func:`~fastspec.formats.gguf_header.read_header`; named).
    ImportError
        Without the ``gguf`` package.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        gguf = gguf_package()
        types = {int(t): t for t in gguf.GGMLQuantizationType}
        # one checked walk of the header reads every value (gguf.GGUFReader's parse builds a
        # NumPy view of every vocabulary string: seconds for a real vocabulary)
        header = read_header(self.path, gguf.GGML_QUANT_SIZES,
                             {n: t.name for n, t in types.items()})
        self.metadata: dict[str, Any] = header.metadata
        try:
            self._map = FileMap(self.path)
        except (ValueError, OSError) as exc:  # emptied or removed since the header was read
            raise ValueError(f"{self.path}: cannot map the file: {exc}") from None
        data = self._map.data
        start, order = header.layout.data_offset, header.layout.byte_order
        self._tensors = {t.name: file_tensor(self.path, t, types[t.type], data, start, order)
                         for t in header.tensors}
        self.architecture = self.metadata.get("general.architecture")
        self._parts = self._tensors  # split_fused's, once config() has the head counts

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, architecture={self.architecture!r}, "
                f"{len(self._tensors)} tensors)")

    def release(self, part: np.ndarray) -> bool:
        """Drop the whole pages of ``part`` (a view of the file's bytes, converted and no
        longer needed) from this process's memory: :meth:`FileMap.release
        <fastspec.formats.file_map.FileMap.release>`."""
        return self._map.release(part)

    # --- config ----------------------------------------------------------------------------

    def _error(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what}")

    def _key(self, key: str, kind: type, default: Any = None) -> Any:
        """Return metadata ``key`` checked to be a positive ``kind`` (int or float)."""
        value = self.metadata.get(key, default)
        if value is None:
            raise self._error(f"missing metadata key {key!r}")
        ok = (type(value) is int if kind is int
              else isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok or not np.isfinite(value) or value <= 0:
            raise self._error(f"metadata key {key!r} must be a positive {kind.__name__}, "
                              f"got {value!r}")
        return value

    def _check_arch_key(self, key: str, value: Any, context: int) -> None:
        """Refuse architecture key ``key`` unless it changes nothing fastspec computes."""
        leaf = key.split(".", 1)[1]
        if leaf in _CONFIG_KEYS:
            return
        if leaf in granite.GGUF_KEYS and key.startswith("granite."):
            return  # hf_config reads them with granite.gguf_multipliers
        if key.startswith("gemma3.") and (leaf in gemma3.GGUF_KEYS
                                          or leaf.startswith(gemma3.VISION_KEYS)):
            return  # hf_config reads them with gemma3.gguf_entries; the vision tower unread
        if leaf.startswith("rope.scal"):
            return  # hf_config reads them with gguf_rope.rope_scaling, which refuses the rest
        if leaf in ("expert_count", "expert_used_count") and value == 0:
            return
        elif leaf == "attention.sliding_window" and type(value) is int and (
                value >= context or key.startswith("phi3.")):
            return  # a window as long as the context is none; llama.cpp runs Phi-3's without
        elif leaf == "attention.causal" and value is True:
            return
        raise self._error(f"metadata key {key!r} = {value!r} is not supported (fastspec runs "
                          "dense causal attention without sliding windows)")

    def hf_config(self) -> dict[str, Any]:
        """Return the Hugging Face ``config.json`` dict of the file's model.

        Raises
        ------
        ValueError
            An unsupported architecture, RoPE scaling, sliding window or other feature, or a
            missing or invalid key (named with the file). (``rope_freqs.weight`` is read by
            :meth:`config`, not here.)
        """
        arch = self.architecture
        if not isinstance(arch, str) or arch not in ARCHITECTURES:
            raise self._error(f"general.architecture {arch!r} is not supported; supported: "
                              f"{sorted(ARCHITECTURES)}")
        context = self._key(f"{arch}.context_length", int)
        for key, value in self.metadata.items():
            if key.startswith(arch + "."):
                self._check_arch_key(key, value, context)
        dim = self._key(f"{arch}.embedding_length", int)
        layers = self._key(f"{arch}.block_count", int)
        heads = self._key(f"{arch}.attention.head_count", int)
        kv_heads = self._key(f"{arch}.attention.head_count_kv", int, heads)
        # llama.cpp: the head size is key_length, else dim / heads; RoPE turns
        # rope.dimension_count of it (all of it but in a phi3 file: NeoX's partial rotary)
        head_dim = self._key(f"{arch}.attention.key_length", int, dim // heads)
        rotated = self.metadata.get(f"{arch}.rope.dimension_count", head_dim)
        for key in ("attention.value_length", "rope.dimension_count"):
            value = self.metadata.get(f"{arch}.{key}", head_dim)
            partial = (key[0] == "r" and arch == "phi3" and type(value) is int
                       and 0 < value <= head_dim and value % 2 == 0)
            if value != head_dim and not partial:
                raise self._error(f"metadata key '{arch}.{key}' = {value!r} differs from the "
                                  f"head size {head_dim} (not supported; a phi3 file may turn "
                                  "an even part of it)")
        embed = self._tensors.get("token_embd.weight")
        if embed is None:
            raise self._error("missing tensor 'token_embd.weight'")
        vocab = int(embed.shape[-1])  # ggml order: (dim, vocab)
        try:
            scaling = rope_scaling(self.metadata, arch)
        except ValueError as exc:
            raise self._error(str(exc)) from None
        if self.metadata.get(f"{arch}.vocab_size", vocab) != vocab:
            raise self._error(f"metadata key '{arch}.vocab_size' = "
                              f"{self.metadata[f'{arch}.vocab_size']!r} differs from the "
                              f"{vocab} rows of 'token_embd.weight'")
        return {
            "architectures": [ARCHITECTURES[arch]], "model_type": arch, "vocab_size": vocab,
            "hidden_size": dim, "intermediate_size": self._key(f"{arch}.feed_forward_length", int),
            "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "partial_rotary_factor": rotated / head_dim,
            "max_position_embeddings": context,
            # float32 in the file (1e-5 -> 9.9999997e-06): kept as read, as transformers does
            # (Ollama's gemma3 files of the 4B and larger have none: Ollama's 1e-6)
            "rms_norm_eps": float(self._key(f"{arch}.attention.layer_norm_rms_epsilon", float,
                                            1e-6 if arch == "gemma3" else None)),
            "rope_theta": float(self._key(f"{arch}.rope.freq_base", float, 10000.0)),
            "rope_scaling": scaling,
            "tie_word_embeddings": "output.weight" not in self._tensors, "hidden_act": "silu",
            **self._granite(arch, head_dim),
            # llama.cpp turns no RoPE in every fourth layer of a smollm3 file (no key says so)
            **({"no_rope_layer_interval": 4} if arch == "smollm3" else {}),
            # (after rope_theta: a gemma3 file's default base is Gemma's 1e6)
            **(self._gemma3(layers, dim, heads, head_dim) if arch == "gemma3" else {}),
        }

    def _gemma3(self, layers: int, dim: int, heads: int, head_dim: int) -> dict[str, Any]:
        try:
            return gemma3.gguf_entries(self.metadata, layers, dim, heads, head_dim)
        except ValueError as exc:
            raise self._error(str(exc)) from None

    def _granite(self, arch: str, head_dim: int) -> dict[str, float]:
        try:
            return granite.gguf_multipliers(self.metadata, arch, head_dim)
        except ValueError as exc:
            raise self._error(str(exc)) from None

    def config(self, dtype: str | None = None, weight_dtype: str | None = None) -> ModelConfig:
        """Return the file's :class:`ModelConfig`, its tensors checked (names, shapes, types).

        Reads the metadata and tensor headers, and one row of each tensor (that its type
        dequantizes); no other tensor data.

        Parameters
        ----------
        dtype : {"float32", "float64"}, optional
            Compute dtype; default float32.
        weight_dtype : {"float32", "float16", "bfloat16", "float64", "q8_0", "q4_0", "q4_1", "auto"}, optional
            Storage dtype of the matrices; default ``dtype`` (the file's quantization is not
            kept unless a quantized kind is asked for: see :meth:`GGUFTensor.quant`);
            ``"auto"``: :meth:`own_weight_dtype`.

        Raises
        ------
        ValueError
            See :meth:`hf_config`; a missing, unexpected or misshapen tensor, or one whose type
            the ``gguf`` package cannot dequantize (named with the file).
        """
        if weight_dtype == "auto":
            weight_dtype = self.own_weight_dtype(dtype)
        if isinstance(weight_dtype, str) and weight_dtype.lower() in NATIVE_QUANT_TYPES:
            weight_dtype = weight_dtype.lower()
        try:
            hf = self.hf_config()
            arch = hf["model_type"]
            config = hf_config(hf, dtype or "float32")  # linear scaling's divisors
            self._model_tensors(config)
            rotated = config.rope_dims or hf["head_dim"]  # the RoPE factors' dims
            freq_factors(self._tensors.get(LONGROPE[1]), rotated, None)  # checked only
            rope = self._tensors.get(ROPE_FREQS, self._tensors.get(LONGROPE[0]))
            config = config.replace(
                weight_dtype=weight_dtype,
                rope_freq_factors=freq_factors(rope, rotated, config.rope_freq_factors),
                rope_attention_factor=self._attention_factor(config, hf),
                max_seq_len=rope_context(self.metadata, arch, self._tensors, config.max_seq_len))
        except ValueError as exc:
            if str(exc).startswith(str(self.path)):
                raise
            raise self._error(str(exc)) from None
        self._check_tensors(config)
        return config

    def _attention_factor(self, config: ModelConfig, hf: dict[str, Any]) -> float | None:
        """The file's RoPE attention factor (``rope.scaling.attn_factor``, Granite's attention
        scale), times a gemma3 file's (``config``'s: its 27B attention rule)."""
        factor = granite.with_attention(attention_factor(self.metadata, str(self.architecture)),
                                        hf, hf["head_dim"])
        if self.architecture != "gemma3" or config.rope_attention_factor is None:
            return factor
        return config.rope_attention_factor * (factor or 1.0)

    def _model_tensors(self, config: ModelConfig) -> dict[str, Any]:
        """The file's tensors with a phi3 file's fused ones split (:func:`split_fused`)."""
        if self.architecture == "phi3" and self._parts is self._tensors:
            self._parts = split_fused(self._tensors, config)
        return self._parts

    def _vision(self, name: str) -> bool:
        """Whether tensor ``name`` is a ``gemma3`` file's vision tower's (left unread)."""
        return self.architecture == "gemma3" and name.startswith(gemma3.VISION_TENSORS)

    def own_weight_dtype(self, dtype: str | None = None) -> str | None:
        """The ``weight_dtype`` keeping the file's own storage (``"auto"``; headers only):
        :func:`~fastspec.formats.gguf_quant.own_weight_dtype`."""
        return own_weight_dtype([t for n, t in self._tensors.items() if not self._vision(n)],
                                dtype)

    def _check_tensors(self, c: ModelConfig) -> None:
        wanted = {gguf_tensor_name(hf): shape for hf, shape in hf_shapes(c).items()}
        missing = [g for g in wanted if g not in self._parts]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise self._error(f"missing tensors {missing[:5]}{more} (a {self.architecture} "
                              f"model of {c.n_layers} layers needs them)")
        allowed = _ROPE_TENSORS.get(str(self.architecture), ())  # as llama.cpp
        unexpected = [g for g in self._parts if g not in wanted and g not in allowed
                      and not self._vision(g)]
        if unexpected:
            raise self._error(f"unexpected tensor {unexpected[0]!r}: not part of a "
                              f"{self.architecture} model fastspec runs")
        quant_sizes = gguf_package().GGML_QUANT_SIZES
        for name, shape in wanted.items():
            t = GGUFTensor(self, self._parts[name])
            if t.shape != shape:
                raise self._error(f"tensor {name!r} has shape {t.shape}, the config needs "
                                  f"{shape}")
            block = quant_sizes.get(self._parts[name].tensor_type, (1, 0))[0]
            if shape[-1] % block:
                raise self._error(f"tensor {name!r} of type {t.type_name} has rows of "
                                  f"{shape[-1]}, not a multiple of its block of {block}")
            try:
                t.read(0, 1)
            except NotImplementedError:
                raise self._error(f"tensor {name!r} has type {t.type_name}, which the gguf "
                                  "package cannot dequantize") from None

    # --- tensors ---------------------------------------------------------------------------

    def tensors(self, config: ModelConfig,
                float_kind: str | None = None) -> Iterator[tuple[str, GGUFTensor]]:
        """Yield ``(Hugging Face name, tensor)`` for every tensor of ``config``, in file order.
        ``float_kind``: the kind a quantized model stores F32/F16/BF16 matrices in instead.

        ``config`` comes from :meth:`config` (which checked the tensors). Nothing is read until
        asked: :meth:`fastspec.Transformer.from_tensors` reads each block by block.
        """
        if config.rope_dims and config.qk_norm:  # the norms' values would need the order too
            raise self._error("partial rotary with QK-norm is not supported")
        permuted = (("attn_q", "attn_k") if self.architecture in _NORM_ROPE
                    or config.rope_dims else ())
        divisor = granite.logits_divisor(self.hf_config())  # folded into the final norm
        order = (None if not config.rope_dims
                 else rotary_order(config.rope_dims, int(config.head_dim or 0)))
        for name, t in self._model_tensors(config).items():
            if name in _ROPE_TENSORS.get(str(self.architecture), ()) or self._vision(name):
                continue  # the config's factors; a vision tower fastspec does not run
            hf = TOP.get(name)
            head_rows = None
            if hf is None:
                _, layer, leaf = name.split(".", 2)
                hf = f"model.layers.{layer}.{LEAF[leaf]}"
                if leaf.split(".")[0] in permuted:  # q/k rows of ggml's normal RoPE (llama),
                    head_rows = config.head_dim  # or of a partial rotary (rotary_order)
            tensor: Any = GGUFTensor(self, t, head_rows, float_kind, order)
            if divisor and name == "output_norm.weight":
                tensor = granite.final_norm(tensor, divisor)
            yield hf, tensor


def read_metadata(source: str | os.PathLike | GGUFFile) -> dict[str, Any]:
    """Return every key/value pair of a GGUF file as plain Python values.

    The contract the GGUF tokenizer builds on: keys are the file's own
    (``general.architecture``, ``llama.block_count``, ``tokenizer.ggml.tokens``, ...), in file
    order; the header's version and counts are not key/value pairs and are left out. Values
    are ``str``, ``int``, ``float`` or ``bool`` (the file's integer and float widths become
    Python ``int``/``float``); arrays are Python lists of those: ``tokenizer.ggml.tokens`` and
    ``tokenizer.ggml.merges`` are ``list[str]``, ``tokenizer.ggml.token_type`` a
    ``list[int]``, ``tokenizer.ggml.scores`` a ``list[float]``. Absent keys are absent (no
    defaults filled in).

    Parameters
    ----------
    source : path-like or GGUFFile
        Decoding a real vocabulary takes tens of milliseconds: pass the :class:`GGUFFile`
        the model is loaded from to share its parse (the dict is then that file's own).

    Raises
    ------
    ValueError
        A truncated or corrupt file, or a string that is not UTF-8 (named).
    """
    file = source if isinstance(source, GGUFFile) else GGUFFile(source)
    return file.metadata


def load_gguf(cls: type[Transformer], source: str | os.PathLike | GGUFFile,
              dtype: str | None = None, weight_dtype: str | None = None,
              mmap: bool = False) -> Transformer:
    """Load a GGUF file as a ``cls`` (see :meth:`fastspec.Transformer.load`).

    Every tensor is dequantized block of rows by block of rows into its final array, so the
    peak is the finished weights plus one block. ``mmap`` maps the F32/F16/BF16 tensors whose
    type is their storage dtype (and not permuted) instead of reading them; the others are read.
    """
    file = source if isinstance(source, GGUFFile) else GGUFFile(source)
    config = file.config(dtype, weight_dtype)
    floats = AUTO_FLOAT_KIND.get(config.weight_dtype) if weight_dtype == "auto" else None
    # a list of handles: a quantized model is packed straight into its arena (from_tensors)
    return cls.from_tensors(config, list(file.tensors(config, floats)), mmap=mmap)
