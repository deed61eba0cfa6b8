"""Ready-made models: the embedded bundle and ``load_pretrained`` (a model with its tokenizer).

May import everything below the command line: kernels, model, formats, text, drafters.
"""
from fastspec.models.catalog import find, names, resolve

__all__ = ["find", "names", "resolve"]
