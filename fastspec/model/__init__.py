"""The model layer: ModelConfig, the weight schema, Transformer, its NumPy twin, the fused runner.

Lives here: ``config`` (ModelConfig), ``schema`` (one table of layer weights), ``functional``
(NumPy layer math), ``transformer`` (Transformer, ForwardOutput), ``numpy_forward`` (the NumPy
twin of the forward pass), ``_model`` / ``_model_weights`` (the compiled fused runner and its
packed weights).

May import: :mod:`fastspec.kernels`. Nothing above it (no file formats, no decoding).
"""
from fastspec.lazy import exports

__all__ = ["ModelConfig", "LayerWeights", "ForwardOutput", "Transformer"]

__getattr__, __dir__ = exports(__name__, {
    "ModelConfig": "config",
    "LayerWeights": "schema",
    "ForwardOutput": "output",
    "Transformer": "transformer",
})
