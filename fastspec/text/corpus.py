"""The training corpus of the embedded models: the Python standard library's own source.

The corpus is every ``.py`` file under the running interpreter's standard library directory
(``sysconfig.get_paths()["stdlib"]``), excluding ``site-packages`` and ``dist-packages``, in
sorted order of their relative paths. The split is by file and deterministic: a file belongs to
the validation split iff ``zlib.crc32(relpath.encode()) % 10 == 0`` (about 10% of the files),
otherwise to the training split. Relative paths use ``/`` on every platform.

Different interpreters ship slightly different standard libraries; the embedded models were
trained on CPython 3.11 (see ``docs/MODELS.md``).
"""

from __future__ import annotations

import functools
import sysconfig
import zlib
from pathlib import Path

import numpy as np

from .tokenizer import ByteTokenizer

__all__ = [
    "stdlib_root",
    "is_validation",
    "stdlib_files",
    "load_bytes",
    "load_tokens",
    "heldout_prompts",
]

_SPLITS = ("train", "validation", "all")
_EXCLUDED_DIRS = ("site-packages", "dist-packages")


def stdlib_root() -> Path:
    """Return the standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_validation(relpath: str) -> bool:
    """Return True when the file at `relpath` (relative, ``/``-separated) is held out.

    Parameters
    ----------
    relpath : str
        Path relative to :func:`stdlib_root`, e.g. ``"json/decoder.py"``.
    """
    return zlib.crc32(relpath.encode("utf-8")) % 10 == 0


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")


@functools.lru_cache(maxsize=None)
def _all_relpaths(root: str) -> tuple[str, ...]:
    base = Path(root)
    rels = []
    for f in base.rglob("*.py"):
        rel = f.relative_to(base)
        if any(part in _EXCLUDED_DIRS for part in rel.parts):
            continue
        if not f.is_file():
            continue
        rels.append(rel.as_posix())
    return tuple(sorted(rels))


def stdlib_files(split: str = "train", root: str | Path | None = None) -> list[Path]:
    """Return the corpus files of one split, sorted by relative path.

    Parameters
    ----------
    split : {"train", "validation", "all"}, default "train"
        Which files to return.
    root : str or Path, optional
        Directory to scan instead of the interpreter's standard library.

    Returns
    -------
    list of Path
        Absolute paths.
    """
    _check_split(split)
    base = Path(root) if root is not None else stdlib_root()
    rels = _all_relpaths(str(base))
    if split == "train":
        rels = tuple(r for r in rels if not is_validation(r))
    elif split == "validation":
        rels = tuple(r for r in rels if is_validation(r))
    return [base / r for r in rels]


def load_bytes(split: str = "train", root: str | Path | None = None) -> np.ndarray:
    """Return the raw bytes of one split: its files joined, each followed by a newline.

    Parameters
    ----------
    split : {"train", "validation", "all"}, default "train"
    root : str or Path, optional
        Directory to scan instead of the interpreter's standard library.

    Returns
    -------
    ndarray of shape (n_bytes,), dtype uint8
    """
    parts = [data if data.endswith(b"\n") else data + b"\n" for data in _file_bytes(split, root)]
    return np.frombuffer(b"".join(parts), dtype=np.uint8).copy()


def load_tokens(split: str = "train", root: str | Path | None = None) -> np.ndarray:
    """Return the token ids of one split: each file's bytes preceded by BOS (256).

    Parameters
    ----------
    split : {"train", "validation", "all"}, default "train"
    root : str or Path, optional
        Directory to scan instead of the interpreter's standard library.

    Returns
    -------
    ndarray of shape (n_tokens,), dtype uint16
        The training stream of the embedded models.
    """
    bos = np.array([ByteTokenizer.bos_id], dtype=np.uint16)
    parts = [part for data in _file_bytes(split, root)
             for part in (bos, np.frombuffer(data, dtype=np.uint8).astype(np.uint16))]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _file_bytes(split: str, root: str | Path | None):
    """Yield the contents of each file of ``split``, in :func:`stdlib_files` order."""
    for f in stdlib_files(split, root):
        yield f.read_bytes()


def _prompt_from_file(text: str, length: int, seed: int) -> str | None:
    lines = text.splitlines(keepends=True)
    if len(lines) < 8:
        return None
    # Start at a top-level statement (def/class/decorator) past the first fifth of the file
    # (skips license headers and imports), chosen deterministically from the seed.
    starts = [
        i
        for i, ln in enumerate(lines)
        if i >= len(lines) // 5 and ln.startswith(("def ", "class ", "@", "async def "))
    ]
    if not starts:
        starts = [i for i, ln in enumerate(lines) if ln.strip() and not ln[0].isspace()]
    if not starts:
        return None
    i = starts[seed % len(starts)]
    out = ""
    while i < len(lines) and len(out) + len(lines[i]) <= length:
        out += lines[i]
        i += 1
    if len(out) < length // 4:
        return None
    return out


def heldout_prompts(
    n: int = 20, length: int = 256, seed: int = 0, root: str | Path | None = None
) -> list[str]:
    """Return `n` deterministic prompts cut from validation files at line boundaries.

    Each prompt is a run of whole lines starting at a top-level ``def``/``class``/decorator
    line of a different validation file, as long as possible without exceeding `length`
    characters. Files are visited in a seeded pseudo-random order; files too short or without
    a usable start are skipped.

    Parameters
    ----------
    n : int, default 20
        Number of prompts.
    length : int, default 256
        Upper bound on each prompt's length in characters.
    seed : int, default 0
        Seed of the file order and of the start line choice.
    root : str or Path, optional
        Directory to scan instead of the interpreter's standard library.

    Returns
    -------
    list of str
        Up to `n` prompts (fewer only if the validation split is tiny).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if length < 16:
        raise ValueError(f"length must be >= 16, got {length}")
    files = stdlib_files("validation", root)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(files))
    prompts: list[str] = []
    for j in order:
        if len(prompts) >= n:
            break
        f = files[int(j)]
        text = f.read_bytes().decode("utf-8", errors="replace")
        if "\ufffd" in text:
            continue
        p = _prompt_from_file(text, length, int(rng.integers(1 << 30)))
        if p is not None:
            prompts.append(p)
    return prompts
