"""Hugging Face tokenizers: ``tokenizer.json`` or a GGUF file's vocabulary through the
``tokenizers`` package ([hf] or [gguf] extra).

:class:`HFTokenizer` implements :class:`fastspec.text.tokenizer.Tokenizer`. For a folder, its
BOS, EOS and stop ids come from ``generation_config.json`` (what ``transformers``' ``generate``
stops on), then ``config.json``, then the special tokens named in ``tokenizer_config.json``;
its chat template from ``chat_template.jinja`` or ``tokenizer_config.json``. For a GGUF file
(:meth:`HFTokenizer.from_gguf_metadata`) they come from the ``tokenizer.*`` keys.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from fastspec.formats.json_io import read_json_object
from fastspec.text.chat_template import ChatTemplate
from fastspec.text.gguf_tokenizer import build_gguf_tokenizer

__all__ = ["HFTokenizer", "special_token_ids", "folder_chat_template"]


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


def _token_text(value: Any) -> str | None:
    """A ``tokenizer_config.json`` special token: a string or ``{"content": ...}``."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


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
            token = _token_text(data.get(field))
            if not target and token is not None and token_to_id(token) is not None:
                target.append(int(token_to_id(token)))
    return (bos[0] if bos else None), tuple(stops)


def folder_chat_template(folder: str | os.PathLike) -> tuple[str | None, dict[str, str]]:
    """Return a folder's chat template source and the special-token strings it renders with.

    The template is ``chat_template.jinja`` if present, else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of ``{"name", "template"}`` of which ``default``
    is taken); the strings are that file's ``bos_token``, ``eos_token``, ``unk_token`` and
    ``pad_token``.

    Raises
    ------
    ValueError
        A malformed ``tokenizer_config.json`` or ``chat_template`` field (named).
    """
    folder = Path(folder)
    path = folder / "tokenizer_config.json"
    config = read_json_object(path) or {}
    tokens = {name: text for name in ("bos_token", "eos_token", "unk_token", "pad_token")
              if (text := _token_text(config.get(name))) is not None}
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), tokens
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one is the chat template
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{path}: chat_template must be a string or a list of "
                         f"{{'name', 'template'}} with a 'default', got {template!r:.80}")
    return template, tokens


class HFTokenizer:
    """A ``tokenizers`` tokenizer with its special ids and chat template.

    Build it with :meth:`from_folder`, :meth:`from_gguf_metadata` (or
    :func:`fastspec.load_pretrained`).

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
    chat_template_source : str or None
        The model's jinja2 chat template (:meth:`apply_chat_template` renders it).
    """

    def __init__(self, tokenizer, bos_id: int | None = None,
                 stop_ids: Iterable[int] = (), source: str = "tokenizer.json",
                 chat_template: str | None = None,
                 template_tokens: Mapping[str, str] | None = None) -> None:
        self._tok = tokenizer
        self.source = source
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self.bos_id = bos_id
        self._stop_ids = tuple(int(i) for i in stop_ids)
        self.eos_id = self._stop_ids[0] if self._stop_ids else None
        plain = tokenizer.encode("a", add_special_tokens=False).ids
        full = tokenizer.encode("a", add_special_tokens=True).ids
        self.adds_bos = len(full) > len(plain) and full[-len(plain):] == plain
        self.chat_template_source = chat_template
        self._template_tokens = dict(template_tokens or {})
        self._chat_template: ChatTemplate | None = None  # compiled on first use (jinja2)

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
        template, template_tokens = folder_chat_template(folder)
        return cls(tok, bos, stops, source=str(path), chat_template=template,
                   template_tokens=template_tokens)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any],
                           source: str = "GGUF metadata") -> "HFTokenizer":
        """Build the tokenizer a GGUF file describes (its ``tokenizer.*`` keys).

        Parameters
        ----------
        meta : mapping
            Every key/value of the file as plain Python values
            (:func:`fastspec.formats.gguf.read_metadata`).
        source : str, default "GGUF metadata"
            Names the file in errors and ``repr``.

        Raises
        ------
        ValueError
            An unsupported ``tokenizer.ggml.model``/``pre`` or a malformed tokenizer key.
        ImportError
            The ``tokenizers`` package ([gguf] extra) is missing.

        Notes
        -----
        ``stop_ids`` are EOS, EOT, EOM and llama.cpp's end-of-turn texts (``<|im_end|>``,
        ``<|eot_id|>``, ``<end_of_turn>``, ...); see :mod:`fastspec.text.gguf_tokenizer`.
        """
        parts = build_gguf_tokenizer(dict(meta))
        return cls(parts.tokenizer, parts.bos_id, parts.stop_ids, source=source,
                   chat_template=parts.chat_template, template_tokens=parts.token_strings)

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

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Return the text of ``ids``, special tokens skipped unless ``skip_special_tokens``
        is False (then ``decode(encode(s), skip_special_tokens=False) == s`` also holds for
        text that spells a control token, such as ``<|im_start|>``).

        Ids past the tokenizer's vocabulary (the padding rows of a model's embedding, e.g.
        Qwen's 151936 rows for 151669 tokens) have no text and are skipped too.
        """
        ids = [int(i) for i in ids]
        if any(i < 0 for i in ids):
            raise ValueError(f"token id must be >= 0, got {min(ids)}")
        return self._tok.decode([i for i in ids if i < self.vocab_size],
                                skip_special_tokens=skip_special_tokens)

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The model's chat template (None when the file or folder has none)."""
        if self._chat_template is None and self.chat_template_source is not None:
            self._chat_template = ChatTemplate(self.chat_template_source, self._template_tokens,
                                               origin=f"{self.source}: chat template")
        return self._chat_template

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = False, tokenize: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """Return a conversation rendered by the model's chat template (or its ids).

        Parameters
        ----------
        messages : sequence of mapping
            The turns, e.g. ``{"role": "user", "content": "..."}``.
        add_generation_prompt : bool, default False
            End with the header of the assistant's turn (what a prompt for a reply needs).
        tokenize : bool, default False
            Return ids instead of text: the text encoded without adding BOS, since the
            template writes any BOS itself (as ``transformers`` does).
        **kwargs
            Further template variables (``tools``, ``enable_thinking``, ...).

        Raises
        ------
        ValueError
            No chat template, or the template failed (``ChatTemplateError``: its own
            ``raise_exception`` message, or an operation the sandbox forbids).
        """
        template = self.chat_template
        if template is None:
            raise ValueError(f"{self.source}: the model has no chat template; encode the "
                             "prompt text directly")
        text = template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        return self.encode(text) if tokenize else text

    def __repr__(self) -> str:
        return (f"HFTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"stop_ids={list(self.stop_ids)}, source={self.source!r})")
