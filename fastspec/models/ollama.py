"""Models that Ollama pulled: find the GGUF file behind a name such as ``llama3.2:1b``.

Ollama keeps a model as a manifest and content-addressed blobs under its models folder
(``$OLLAMA_MODELS``, else ``~/.ollama/models``, or ``/usr/share/ollama/.ollama/models`` where
it runs as the Linux service)::

    manifests/<host>/<namespace>/<model>/<tag>    JSON: {"layers": [{"mediaType", "digest"}]}
    blobs/sha256-<64 hex digits>                  the layers' bytes

The layer of media type ``application/vnd.ollama.image.model`` is the model's GGUF file. A
name is ``[[host/]namespace/]model[:tag]``, with Ollama's defaults ``registry.ollama.ai``,
``library`` and ``latest``. :func:`find` reads only the manifest (its size bounded) and
checks the blob's name and magic bytes; the file's own tokenizer and chat template are what
:func:`fastspec.load_pretrained` uses (Ollama's template and parameter layers are not read).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = ["PREFIX", "MODEL_MEDIA_TYPE", "models_dir", "parse_name", "find", "names", "pulled",
           "listing"]

#: The prefix that marks a name as Ollama's in :func:`fastspec.models.resolve`.
PREFIX = "ollama:"
#: The media type of the manifest layer that holds the GGUF file.
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
_ADAPTER_MEDIA_TYPE = "application/vnd.ollama.image.adapter"
_HOST, _NAMESPACE, _TAG = "registry.ollama.ai", "library", "latest"
#: Where the Linux install script puts the service's models (its user's home).
_SERVICE_DIR = Path("/usr/share/ollama/.ollama/models")
#: A manifest is a few hundred bytes; anything larger than this is not one.
_MAX_MANIFEST = 1 << 20
#: One path component of a name: Ollama's letters, digits, ``_``, ``-`` and ``.``, not only
#: dots (no ``..``); a host may carry a port.
_PART = re.compile(r"(?!\.+$)[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST_PART = re.compile(r"(?!\.+$)[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(:[0-9]{1,5})?")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def models_dir() -> Path:
    """Return Ollama's models folder: ``$OLLAMA_MODELS`` when set, else ``~/.ollama/models``
    when it exists, else the Linux service's ``/usr/share/ollama/.ollama/models`` when that
    exists, else ``~/.ollama/models`` (which then does not exist)."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return Path(env).expanduser()
    home = Path("~/.ollama/models").expanduser()
    if not _is_dir(home) and _is_dir(_SERVICE_DIR):
        return _SERVICE_DIR
    return home


def _is_dir(path: Path) -> bool:
    """``path.is_dir()``, False where it cannot be looked at (the service's home is often
    closed to other users: Python 3.11 raises PermissionError there)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _root(root: str | os.PathLike | None) -> Path:
    return Path(root).expanduser() if root is not None else models_dir()


def parse_name(name: str) -> tuple[str, str, str, str]:
    """Split an Ollama model name into ``(host, namespace, model, tag)``.

    Parameters
    ----------
    name : str
        ``[[host/]namespace/]model[:tag]``, optionally after ``ollama:``: ``"llama3.2"``,
        ``"qwen2.5:0.5b"``, ``"user/model:q4"``, ``"hf.co/org/repo:Q4_K_M"``.

    Returns
    -------
    tuple of str
        The missing parts filled with ``registry.ollama.ai``, ``library`` and ``latest``.

    Raises
    ------
    ValueError
        An empty part, more than three ``/``-separated parts, or a part with other characters
        than letters, digits, ``_``, ``-`` and ``.`` (so no name reaches outside the
        manifests folder).
    """
    text = str(name)
    if text.startswith(PREFIX):
        text = text[len(PREFIX):]
    path, tag = text, _TAG
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        path, tag = text[:colon], text[colon + 1:]
    parts = path.split("/")
    if len(parts) > 3:
        raise ValueError(f"Ollama model name {name!r}: at most host/namespace/model:tag")
    host, namespace = _HOST, _NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        model = parts[0]
    for what, part, rule in (("host", host, _HOST_PART), ("namespace", namespace, _PART),
                             ("model", model, _PART), ("tag", tag, _PART)):
        if not rule.fullmatch(part):
            raise ValueError(f"Ollama model name {name!r}: the {what} {part!r} is not a name "
                             "(letters, digits, '_', '-' and '.')")
    return host, namespace, model, tag


def _manifests(root: Path) -> list[tuple[tuple[str, ...], Path]]:
    """Return ``(host, namespace, model, tag), path`` of every manifest file under ``root``,
    sorted by path; hidden files skipped, an unreadable folder has none."""
    base = root / "manifests"
    try:
        paths = sorted(p for p in base.glob("*/*/*/*") if p.is_file())
    except OSError:
        return []
    out = [(p.relative_to(base).parts, p) for p in paths]
    return [(parts, p) for parts, p in out if not any(x.startswith(".") for x in parts)]


def _manifest(root: Path, parts: tuple[str, str, str, str]) -> Path | None:
    """Return the manifest file of ``parts`` under ``root``, or None: the name as written,
    else the first (by path) whose parts equal it without regard to case, as Ollama looks
    names up (``hf.co`` repositories keep the case they were pulled with)."""
    path = root / "manifests" / Path(*parts)
    try:
        if path.is_file():
            return path
    except OSError:
        return None
    folded = tuple(p.casefold() for p in parts)
    return next((p for found, p in _manifests(root)
                 if tuple(x.casefold() for x in found) == folded), None)


def pulled(name: str, root: str | os.PathLike | None = None) -> bool:
    """Return whether ``name`` is a valid Ollama model name with a manifest in ``root``
    (default :func:`models_dir`); :func:`find` then returns its file or says what is wrong."""
    try:
        parts = parse_name(name)
    except ValueError:
        return False
    return _manifest(_root(root), parts) is not None


def find(name: str, root: str | os.PathLike | None = None) -> Path:
    """Return the GGUF file of the Ollama model ``name``.

    Parameters
    ----------
    name : str
        An Ollama model name (:func:`parse_name`), e.g. ``"llama3.2:1b"``; ``ollama:`` in front
        is allowed.
    root : path-like, optional
        Ollama's models folder; default :func:`models_dir`.

    Returns
    -------
    pathlib.Path
        The model layer's blob, ``<root>/blobs/sha256-<digest>``: a GGUF file without a
        ``.gguf`` name, which :meth:`fastspec.Transformer.load` and
        :func:`fastspec.load_pretrained` recognise by its bytes.

    Raises
    ------
    FileNotFoundError
        No manifest for the name (the message says where it looked and lists the names
        pulled), or its blob is missing.
    ValueError
        A bad name, or a manifest that is not Ollama's JSON, has no (or more than one) model
        layer, applies a LoRA adapter, names a digest that is not sha256, or points to a blob
        that is not a regular GGUF file.
    OSError
        The manifest or the blob cannot be read (permissions).
    """
    parts = parse_name(name)
    root = _root(root)
    manifest = _manifest(root, parts)
    if manifest is None:
        raise FileNotFoundError(
            f"Ollama model {name!r} ({'/'.join(parts[:3])}:{parts[3]}) not found "
            f"({listing(root)}); pull it with `ollama pull {str(name).removeprefix(PREFIX)}`, "
            "or set OLLAMA_MODELS to the folder Ollama keeps its models in")
    size = manifest.stat().st_size
    if size > _MAX_MANIFEST:
        raise ValueError(f"{manifest}: {size} bytes is too large for an Ollama manifest")
    try:
        data = json.loads(manifest.read_bytes())
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{manifest}: not an Ollama manifest (not JSON: "
                         f"{type(e).__name__})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise ValueError(f"{manifest}: not an Ollama manifest (no list of layers)")
    kinds = [x.get("mediaType") for x in layers if isinstance(x, dict)]
    if _ADAPTER_MEDIA_TYPE in kinds:
        raise ValueError(f"{manifest}: Ollama model {name!r} applies a LoRA adapter "
                         f"({_ADAPTER_MEDIA_TYPE}) to its GGUF file; adapters are not "
                         "supported, and the file alone is another model")
    models = [x for x in layers if isinstance(x, dict) and x.get("mediaType") == MODEL_MEDIA_TYPE]
    if len(models) != 1:
        raise ValueError(f"{manifest}: {len(models)} layers of type {MODEL_MEDIA_TYPE} (one "
                         "GGUF model layer expected; a model imported from safetensors has "
                         "none)")
    digest = models[0].get("digest")
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise ValueError(f"{manifest}: the model layer's digest {digest!r} is not "
                         "'sha256:' and 64 lower-case hex digits")
    blob = root / "blobs" / f"sha256-{match.group(1)}"
    if not blob.exists():
        raise FileNotFoundError(f"{blob}: the blob of Ollama model {name!r} is missing (its "
                                f"manifest is {manifest}); pull the model again")
    if not blob.is_file():
        raise ValueError(f"{blob}: the blob of Ollama model {name!r} is not a regular file")
    with open(blob, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{blob}: the model layer of Ollama model {name!r} is not a GGUF file "
                         f"(magic {magic!r})")
    return blob


def names(root: str | os.PathLike | None = None) -> list[str]:
    """Return the names of the models pulled into ``root`` (default :func:`models_dir`),
    sorted, short as Ollama lists them: ``model:tag`` for the default host and namespace,
    ``namespace/model:tag`` for another namespace, ``host/namespace/model:tag`` otherwise.
    An absent or unreadable folder has none."""
    out = []
    for (host, namespace, model, tag), _ in _manifests(_root(root)):
        prefix = ("" if host == _HOST and namespace == _NAMESPACE
                  else f"{namespace}/" if host == _HOST else f"{host}/{namespace}/")
        out.append(f"{prefix}{model}:{tag}")
    return sorted(out)


def listing(root: str | os.PathLike | None = None, limit: int = 12) -> str:
    """Return what a message says of the models pulled into ``root`` (default
    :func:`models_dir`): ``"pulled into <root>: a:latest, b:1b"``, at most ``limit`` names
    and how many more, or ``"none pulled into <root>"``."""
    root = _root(root)
    found = names(root)
    if not found:
        return f"none pulled into {root}"
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return f"pulled into {root}: {', '.join(found[:limit])}{more}"
