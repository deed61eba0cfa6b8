"""Hugging Face tokenizers: ``tokenizer.json`` through the ``tokenizers`` package ([hf] extra).

:class:`HFTokenizer` implements :class:`fastspec.text.tokenizer.Tokenizer`. Its BOS, EOS and stop
ids come from the folder's ``generation_config.json`` (what ``transformers``' ``generate``
stops on), then ``config.json``, then the special tokens named in ``tokenizer_config.json``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from fastspec.formats.json_io import read_json_object

__all__ = ["HFTokenizer", "special_token_ids"]


def _ids_field(data: dict, path: Path, name: str, vocab: int) -> list[int]:
    """Return ``data[name]`` (an int, a list of ints or null) as a list of ids in [0, vocab)."""
    value = data.get(name)
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(type(v) is int for v in values):
        raise ValueError(f"{path}: {name} must be an int or a list of ints, got {value!r}")
    bad = [v for v in values if not 0 <= v < vocab]
    if bad:
        raise ValueError(f"{path}: {name} {bad} outside the vocabulary [0, {vocab})")
    return values


def special_token_ids(folder: str | os.PathLike, vocab_size: int,
                      token_to_id=None) -> tuple[int | None, tuple[int, ...]]:
    """Return ``(bos_id, stop_ids)`` of a Hugging Face folder (EOS first in ``stop_ids``).

    Parameters
    ----------
    folder : path-like
    vocab_size : int
        Ids must lie in ``[0, vocab_size)``.
    token_to_id : callable, optional
        Maps a token string to its id (or None); used for ``tokenizer_config.json``'s
        ``bos_token``/``eos_token`` when neither JSON config gives an id.

    Raises
    ------
    ValueError
        A malformed file or field (named), or an id outside the vocabulary.
    """
    folder = Path(folder)
    bos: list[int] = []
    stops: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        data = read_json_object(path)
        if data is None:
            continue
        bos = bos or _ids_field(data, path, "bos_token_id", vocab_size)
        stops += [i for i in _ids_field(data, path, "eos_token_id", vocab_size) if i not in stops]
    path = folder / "tokenizer_config.json"
    data = read_json_object(path) if token_to_id is not None else None
    if data is not None:
        for field, target in (("bos_token", bos), ("eos_token", stops)):
            token = data.get(field)
            token = token.get("content") if isinstance(token, dict) else token
            if not target and isinstance(token, str) and token_to_id(token) is not None:
                target.append(int(token_to_id(token)))
    return (bos[0] if bos else None), tuple(stops)


class HFTokenizer:
    """A ``tokenizer.json`` tokenizer (``tokenizers`` package) with the folder's special ids.

    Build it with :meth:`from_folder` (or :func:`fastspec.load_pretrained`).

    Attributes
    ----------
    vocab_size : int
        Ids the tokenizer can produce, added tokens included.
    bos_id, eos_id : int or None
    stop_ids : tuple of int
        EOS first, then the other ``eos_token_id`` entries of ``generation_config.json``.
    adds_bos : bool
        Whether ``tokenizer.json``'s post-processor prepends BOS (Llama does, Qwen does not);
        :meth:`encode_prompt` follows it.
    """

    def __init__(self, tokenizer, bos_id: int | None = None,
                 stop_ids: Iterable[int] = (), source: str = "tokenizer.json") -> None:
        self._tok = tokenizer
        self.source = source
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self.bos_id = bos_id
        self._stop_ids = tuple(int(i) for i in stop_ids)
        self.eos_id = self._stop_ids[0] if self._stop_ids else None
        plain = tokenizer.encode("a", add_special_tokens=False).ids
        full = tokenizer.encode("a", add_special_tokens=True).ids
        self.adds_bos = len(full) > len(plain) and full[-len(plain):] == plain

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> "HFTokenizer":
        """Load ``folder/tokenizer.json`` and the special ids of the folder's JSON configs.

        Raises
        ------
        FileNotFoundError
            No ``tokenizer.json`` in the folder.
        ValueError
            A malformed ``tokenizer.json`` or config field (file and field named).
        ImportError
            The ``tokenizers`` package ([hf] extra) is missing.
        """
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder}: no tokenizer.json, so text cannot be encoded; pass token ids "
                "instead (prompt_ids=..., or --prompt-ids on the command line), or copy the "
                "model's tokenizer.json into the folder")
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError as exc:
            raise ImportError("reading tokenizer.json needs the 'tokenizers' package: "
                              "pip install 'fastspec[hf]'") from exc
        try:
            tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception with the serde message
            raise ValueError(f"{path}: malformed tokenizer ({exc})") from None
        vocab = int(tok.get_vocab_size(with_added_tokens=True))
        bos, stops = special_token_ids(folder, vocab, tok.token_to_id)
        return cls(tok, bos, stops, source=str(path))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self._stop_ids

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Return the ids of ``text`` without special tokens (BOS first when ``add_bos``)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos:
            if self.bos_id is None:
                raise ValueError(f"{self.source}: add_bos=True but the folder defines no "
                                 "bos_token_id")
            ids.insert(0, self.bos_id)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """Return the ids of a prompt as ``tokenizer.json``'s post-processor builds them."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Return the text of ``ids``, special tokens skipped.

        Ids past the tokenizer's vocabulary (the padding rows of a model's embedding, e.g.
        Qwen's 151936 rows for 151669 tokens) have no text and are skipped too.
        """
        ids = [int(i) for i in ids]
        if any(i < 0 for i in ids):
            raise ValueError(f"token id must be >= 0, got {min(ids)}")
        return self._tok.decode([i for i in ids if i < self.vocab_size],
                                skip_special_tokens=True)

    def __repr__(self) -> str:
        return (f"HFTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"stop_ids={list(self.stop_ids)}, source={self.source!r})")
