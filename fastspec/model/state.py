"""A Transformer's weights as named tensors: the Hugging Face state dict, in and out.

Names and layout come from :mod:`fastspec.model.schema`. Files are not this module's business:
:meth:`StateDict.save` and :meth:`StateDict.load` hand the work to the reader and writer that
:mod:`fastspec.formats` registers with :func:`register_files` when it is imported (``import
fastspec`` imports it), so the model layer never imports a file format.
"""
from __future__ import annotations

from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence,
                    TypeVar)

import numpy as np

from fastspec.kernels.bf16 import as_storage, storage_dtype
from fastspec.model.schema import (FORWARD_MATRICES, LayerWeights, MATRICES, hf_layer_keys,
                                   layer_attrs, layer_shapes, layer_state)

if TYPE_CHECKING:  # annotations only
    from fastspec.model.config import ModelConfig

#: The model class that inherits :class:`StateDict` (:class:`fastspec.Transformer`).
Model = TypeVar("Model", bound="StateDict")

__all__ = ["StateDict", "TensorFile", "layer_schema", "register_files"]


class TensorFile(Protocol):
    """A tensor still in its file (e.g. :class:`fastspec.formats.hf_folder.FileTensor`): read
    block by block, or mapped."""

    shape: tuple[int, ...]
    dtype: np.dtype
    ndim: int

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray: ...

    def mapped(self) -> np.ndarray: ...


def _is_file_tensor(raw: Any) -> bool:
    return not isinstance(raw, np.ndarray) and hasattr(raw, "read") and hasattr(raw, "mapped")


#: The model file reader and writer, registered by :mod:`fastspec.formats.transformer_io`.
_FILES: dict[str, Callable] = {}


def register_files(load: Callable[..., "StateDict"],
                   save: Callable[["StateDict", Path], None]) -> None:
    """Register the functions behind :meth:`StateDict.load` and :meth:`StateDict.save`.

    ``load(cls, path, dtype=, weight_dtype=, mmap=)`` returns a model of class ``cls``;
    ``save(model, path)`` writes one.
    """
    _FILES["load"], _FILES["save"] = load, save


def _files(what: str) -> Callable:
    try:
        return _FILES[what]
    except KeyError:
        raise RuntimeError("no model file reader is registered: import fastspec (its formats "
                           "package registers one)") from None


def layer_schema(c: ModelConfig) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """Shapes and present fields of a layer of ``c`` (see :mod:`fastspec.model.schema`)."""
    return (layer_shapes(c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim),
            layer_attrs(swiglu=c.activation in ("swiglu", "geglu"), rmsnorm=c.norm == "rmsnorm",
                        qk_norm=c.qk_norm, qkv_bias=c.qkv_bias, post_norms=c.post_norms))


#: Elements converted per block by :func:`_final`: bounds a tensor's temporaries. A block's
#: float32 read plus bf16 rounding holds about 16 bytes an element (4 MB here); 1 << 20 held
#: 18 MB, 0.38x the bf16 weights of a 24M-parameter GGUF file, and was no faster.
_BLOCK = 1 << 18


def _file_keys(c: ModelConfig) -> dict[str, tuple[object, bool, str]]:
    """Map every file key of ``c`` to ``(layer index or "embed"/"head"/"norm"/"pos", is a
    matrix, LayerWeights field or "")``, in file-writing order."""
    keys: dict[str, tuple[object, bool, str]] = {"model.embed_tokens.weight": ("embed", True, "")}
    if c.positional == "learned":
        keys["model.embed_positions.weight"] = ("pos", False, "")
    attrs = layer_schema(c)[1]
    for i in range(c.n_layers):
        prefix = f"model.layers.{i}."
        for attr, key in zip(attrs, hf_layer_keys(prefix, attrs)):
            keys[key] = (i, attr in MATRICES, attr)
    if c.norm == "rmsnorm":
        keys["model.norm.weight"] = ("norm", False, "")
    if not c.tie_embeddings:
        keys["lm_head.weight"] = ("head", True, "")
    return keys


def _final(raw: "np.ndarray | TensorFile", name: str, transpose: bool,
           mapped: bool = False) -> np.ndarray:
    """Return ``raw`` as a C-contiguous array of storage dtype ``name`` (transposed when asked).

    With ``mapped``, a TensorFile already in storage dtype ``name`` comes back as a map of the
    file (:meth:`FileTensor.mapped`), transposed as a view: not read, not copied.

    ``raw`` is an array or a :class:`TensorFile`. It is converted in
    blocks of rows (read from the file block by block when it is a TensorFile) so that the
    temporaries stay small: the peak is the result plus one block. An array that already is
    the result is returned as it is; a TensorFile that needs no conversion is read whole,
    straight into the result.
    """
    if mapped and _is_file_tensor(raw) and raw.dtype == storage_dtype(name):
        a = raw.mapped()
        return a.T if transpose else a
    if raw.ndim != 2 or (not transpose and raw.dtype == storage_dtype(name)):
        return as_storage(np.asarray(raw), name)
    read = raw.read if _is_file_tensor(raw) else (lambda a, b: raw[a:b])
    rows, cols = raw.shape
    out = np.empty((cols, rows) if transpose else (rows, cols), storage_dtype(name))
    step = max(1, _BLOCK // max(cols, 1))
    for r0 in range(0, rows, step):
        block = as_storage(read(r0, r0 + step), name)
        if transpose:
            out[:, r0:r0 + step] = block.T
        else:
            out[r0:r0 + step] = block
    return out


def _quant_final(raw: Any, kind: str, out: np.ndarray | None = None) -> Any:
    """Return file-layout matrix ``raw`` (``(out, in)``) as a QuantMatrix of a model of
    ``kind``: a QuantMatrix as it is, a GGUF tensor through its own :meth:`quant` (native
    blocks kept; packed into ``out``, a slot of :func:`_arena_slots`, when given), anything
    else quantized from its float32 values."""
    if hasattr(raw, "in_features"):
        return raw
    if hasattr(raw, "quant"):
        return raw.quant(kind, out)
    from fastspec.model.quantized import as_quant
    return as_quant(raw.read() if _is_file_tensor(raw) else raw, kind, rows_are_outputs=True)


def _arena_slots(c: ModelConfig, tensors: list[tuple[str, Any]]) -> dict[str, np.ndarray]:
    """Byte slots for the quantized matrices of ``tensors``, by name, in one arena laid out
    in the order a step reads them (:meth:`fastspec.Transformer._gather`'s order: each
    layer's ``FORWARD_MATRICES``, the head, the embedding), or {} unless every matrix is a
    file tensor that says its stored kind (``native_kind``; GGUF's): each is then packed
    straight into its slot, and loading holds no second copy of the weights."""
    from fastspec.kernels.quant import reserve

    keys = _file_keys(c)
    raws = {name: raw for name, raw in tensors if name in keys and keys[name][1]}
    if len(raws) != sum(m for _, m, _ in keys.values()) or not all(
            hasattr(r, "native_kind") and len(r.shape) == 2 for r in raws.values()):
        return {}
    def rank(name: str) -> tuple[int, int]:  # layer by layer, then the head, the embedding
        where, _, attr = keys[name]
        if isinstance(where, int):
            return where, FORWARD_MATRICES.index(attr)
        return c.n_layers + (where == "embed"), 0

    names = sorted(raws, key=rank)
    shapes = [(raws[n].native_kind(c.weight_dtype), raws[n].shape[1], raws[n].shape[0])
              for n in names]
    return dict(zip(names, reserve(shapes)))


class StateDict:
    """Persistence of a :class:`~fastspec.Transformer` (``config`` plus its weight arrays)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return the weights under Hugging Face names and layout (see docs/FORMATS.md).

        A quantized model's matrices come as their
        :class:`~fastspec.kernels.quant.QuantMatrix` (already ``(out, in)``), not arrays."""
        c = self.config
        sd = {"model.embed_tokens.weight": self.embed}
        if self.pos_embed is not None:
            sd["model.embed_positions.weight"] = self.pos_embed
        for i, lw in enumerate(self.layers):
            sd.update(layer_state(lw, f"model.layers.{i}."))
        if self.final_norm is not None:
            sd["model.norm.weight"] = self.final_norm
        if not c.tie_embeddings:
            sd["lm_head.weight"] = self.head if c.quantized else self.head.T
        return {k: v if hasattr(v, "in_features") else np.ascontiguousarray(v)
                for k, v in sd.items()}

    @classmethod
    def from_state_dict(cls: type[Model], config: ModelConfig,
                        sd: Mapping[str, np.ndarray]) -> Model:
        """Build a model from Hugging Face names and layout; missing tensors raise KeyError."""
        return cls.from_tensors(config, ((k, sd[k]) for k in _file_keys(config) if k in sd))

    @classmethod
    def from_tensors(cls, config: ModelConfig,
                     tensors: Iterable[tuple[str, "np.ndarray | TensorFile"]],
                     mmap: bool = False) -> Model:
        """Build a model from ``(name, array)`` pairs in Hugging Face names and layout.

        Each array is converted into its final form (storage dtype, ``(in, out)`` layout) as
        it arrives, in blocks of rows, and is not referenced afterwards. Fed
        :class:`~fastspec.formats.hf_folder.FileTensor` s (:func:`fastspec.formats.hf_folder.iter_hf`),
        loading reads each file tensor block by block into its final array: the peak is the
        finished weights plus one block, never a second copy of the model. Unknown names are
        ignored; missing ones raise KeyError. A uint16 array is read as bf16 bit patterns.
        With ``mmap``, FileTensors already in their storage dtype are mapped, not read
        (:meth:`load`). A quantized model fed a sequence (not an iterator) of GGUF tensors
        packs each matrix straight into the weight arena (:func:`_arena_slots`).
        """
        c = config
        slots = _file_keys(c)
        arena: dict[str, np.ndarray] = {}
        if c.quantized and isinstance(tensors, Sequence):  # handles listed: lay out the arena
            arena = _arena_slots(c, list(tensors))
        got: dict[str, np.ndarray] = {}
        for name, raw in tensors:
            slot = slots.get(name)
            if slot is not None and slot[1] and c.quantized:
                got[name] = _quant_final(raw, c.weight_dtype, arena.pop(name, None))
            elif slot is not None:
                raw = raw if _is_file_tensor(raw) else np.asarray(raw)
                got[name] = _final(raw, c.matrix_dtype if slot[1] else c.dtype,
                                   transpose=slot[1] and raw.ndim == 2 and slot[0] != "embed",
                                   mapped=mmap)
            del raw  # drop ours before the next tensor is read
        missing = [k for k in slots if k not in got]
        if missing:
            raise KeyError(f"missing tensor {missing[0]!r}")
        layers = [LayerWeights(**{attr: got[key] for key, (where, _, attr) in slots.items()
                                  if where == i}) for i in range(c.n_layers)]
        embed = got.pop("model.embed_tokens.weight")
        tied = embed if c.quantized else embed.T  # a QuantMatrix's rows already are outputs
        head = tied if c.tie_embeddings else got.pop("lm_head.weight")
        final = got.get("model.norm.weight")
        pos = got.get("model.embed_positions.weight")
        return cls(c, embed, layers, head, final, pos)

    def save(self, path: str | Path) -> None:
        """Write the model to ``path``: an ``.npz`` file, or a Hugging Face folder otherwise."""
        _files("save")(self, Path(path))

    @classmethod
    def load(cls, path: str | Path, dtype: str | None = None,
             weight_dtype: str | None = None, mmap: bool = False) -> Model:
        """Load an ``.npz`` written by :meth:`save`, a Hugging Face checkpoint folder or a
        GGUF file (a ``.gguf`` name, or GGUF bytes under any name such as Ollama's blobs;
        llama/qwen2/qwen3, any type the ``gguf`` package dequantizes; see docs/FORMATS.md).
        Model names (a catalog's, Ollama's) are :func:`fastspec.load_pretrained`'s.

        Parameters
        ----------
        path : path-like
        dtype : {"float32", "float64"}, optional
            Compute dtype; default: the file's (float32 for a Hugging Face folder or GGUF).
        weight_dtype : {"float16", "bfloat16", "float32", "float64", "q8_0", "q4_0", "q4_1", "auto"}, optional
            Storage dtype of the matrices (see :class:`ModelConfig`); default: the file's
            ``weight_dtype`` when it fits ``dtype`` (float16 and bfloat16 need float32), else
            ``dtype`` (a quantized GGUF file too: float32 unless a quantized kind is asked
            for). A quantized kind keeps a GGUF file's Q8_0/Q4_0/Q4_1 blocks as they are and
            converts other types to the nearest native kind (docs/FORMATS.md). A bf16 Hugging
            Face checkpoint loaded with ``"bfloat16"`` keeps its bit patterns (no widening, no
            rounding). ``"auto"`` keeps the file's own storage where ``dtype`` allows: a GGUF
            file's main quantized kind (Q4_K: q4_1; another quantized type: q8_0; its float
            matrices in a 4-bit model: q8_0) or 16-bit type
            (:meth:`~fastspec.formats.gguf.GGUFFile.own_weight_dtype`), a folder's bfloat16 or
            float16 ``torch_dtype`` (:func:`~fastspec.formats.hf_folder.own_weight_dtype`),
            an ``.npz`` file's ``weight_dtype`` (as None); what the command line loads with.
        mmap : bool, default False
            Hugging Face folders and GGUF files (their F32/F16/BF16 tensors): map every tensor whose file dtype is its storage dtype
            (a bf16 folder loaded with ``weight_dtype="bfloat16"``, a float16 one with
            ``"float16"``) instead of reading it. Loading then reads nothing but the headers
            and the tensors that need converting; the matrices are copy-on-write views of the
            file (the projections as transposed views), which the compiled runner packs on
            its first forward. Their pages are page cache: shared, and reclaimable under
            memory pressure, where read arrays are the process's own. The files must not be
            truncated or rewritten while the model lives.

        Raises
        ------
        ValueError
            ``mmap`` with an ``.npz`` file.
        """
        return _files("load")(cls, Path(path), dtype=dtype, weight_dtype=weight_dtype,
                              mmap=mmap)
