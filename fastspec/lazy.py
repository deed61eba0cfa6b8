"""Lazy package exports: a package's public names, imported from their module on first use.

A package ``__init__`` that imported all its modules would make importing any one of them
import the whole package, and each layer's import chain as long as its longest module chain
plus one. With :func:`exports`, ``from fastspec.model import Transformer`` imports
``fastspec.model.transformer`` (and what it needs) only, when the name is first asked for.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["exports"]


def exports(package: str, names: dict[str, str]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's ``__getattr__`` and ``__dir__`` for its lazily imported names.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    names : dict
        Public name -> the package's submodule that defines it (``"transformer"``).

    Returns
    -------
    getattr, dir : callables
        Module-level ``__getattr__`` (PEP 562): imports the submodule, returns the name;
        ``AttributeError`` for any other name. ``__dir__``: the public names.
    """
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
