"""The file formats: Hugging Face safetensors folders, ``.npz``, GGUF, the z-lab DFlash folder, JSON.

Lives here: ``hf_folder`` (safetensors and config.json), ``npz`` (a bounded .npz reader),
``gguf`` (llama.cpp's GGUF files, read through the optional ``gguf`` package), ``gguf_write``
(GGUF files written with its ``GGUFWriter``: float and quantized models),
``transformer_io`` (a Transformer's ``.npz`` files, folders and GGUF files; importing it
registers them behind :meth:`fastspec.Transformer.load` and ``save``), ``dflash_folder`` (z-lab DFlash
drafter folders), ``json_io`` (strict JSON reads and writes).

May import: :mod:`fastspec.kernels`, :mod:`fastspec.model`. Nothing above it.
"""
from fastspec.lazy import exports

__all__ = ["load_transformer", "save_transformer"]

__getattr__, __dir__ = exports(__name__, {
    "load_transformer": "transformer_io",
    "save_transformer": "transformer_io",
})
