"""Tokenizers: the :class:`Tokenizer` protocol, the byte tokenizer of the embedded models and
:class:`StreamDecoder`, the incremental decoder that streams text as tokens are accepted.

:class:`ByteTokenizer`: ids 0..255 are the UTF-8 bytes of the text; four special ids follow:
256 = BOS, 257 = EOS, 258 = MASK (the DFlash block filler), 259 = PAD. Hugging Face folders
get :class:`fastspec.text.hf_tokenizer.HFTokenizer` (``tokenizer.json``, ``[hf]`` extra) behind the
same protocol.
"""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

__all__ = ["Tokenizer", "ByteTokenizer", "StreamDecoder"]


@runtime_checkable
class Tokenizer(Protocol):
    """What fastspec needs from a tokenizer (ByteTokenizer, HFTokenizer).

    Attributes
    ----------
    vocab_size : int
        Number of ids the tokenizer can produce (at most the model's ``vocab_size``).
    bos_id, eos_id : int or None
        Beginning/end-of-sequence ids (None when the model has none).
    stop_ids : tuple of int
        Ids that end a generation (EOS first, then any other stop ids).
    """

    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    @property
    def stop_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class StreamDecoder:
    """Incremental decoding: feed ids as they are accepted, get the new text of each call.

    Decodes a short window of ids before the new ones and returns only the text past it, so
    that tokenizers whose pieces depend on their neighbours (SentencePiece's leading space,
    byte-fallback tokens, UTF-8 split over several byte ids) stream the same text as one
    :meth:`Tokenizer.decode` of everything. Text ending in an incomplete character (U+FFFD)
    is held back until the next call completes it.

    Parameters
    ----------
    tokenizer : Tokenizer

    Examples
    --------
    >>> dec = StreamDecoder(ByteTokenizer())
    >>> dec.push(list("é".encode())[:1]), dec.push(list("é".encode())[1:])
    ('', 'é')
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] is the already-emitted context window
        self._read = 0

    def push(self, ids: Iterable[int]) -> str:
        """Append ``ids`` and return the text they complete (may be empty)."""
        self.ids.extend(int(i) for i in ids)
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix:self._read])
        text = decode(self.ids[self._prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""  # nothing new, or an incomplete character: wait for more ids
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(before):]

    def flush(self) -> str:
        """Return whatever text is still held back (an incomplete character as U+FFFD)."""
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix:self._read])
        text = decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return text[len(before):]


class ByteTokenizer:
    """UTF-8 byte tokenizer with four special ids (vocabulary of 260).

    Attributes
    ----------
    vocab_size : int
        260: 256 byte ids plus BOS, EOS, MASK and PAD.
    bos_id, eos_id, mask_id, pad_id : int
        256, 257, 258 and 259.

    Examples
    --------
    >>> tok = ByteTokenizer()
    >>> tok.encode("hi", add_bos=True)
    [256, 104, 105]
    >>> tok.decode([256, 104, 105, 257])
    'hi'
    """

    vocab_size: int = 260
    bos_id: int = 256
    eos_id: int = 257
    mask_id: int = 258
    pad_id: int = 259
    n_bytes: int = 256

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Return the token ids of `text` (its UTF-8 bytes).

        Parameters
        ----------
        text : str
            Text to encode.
        add_bos : bool, default False
            Prepend the BOS id (256).
        add_eos : bool, default False
            Append the EOS id (257).

        Returns
        -------
        list of int
            Ids in ``[0, 260)``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Return the text of `ids`, skipping special ids.

        Parameters
        ----------
        ids : iterable of int
            Token ids; ids >= 256 (BOS, EOS, MASK, PAD) are dropped.

        Returns
        -------
        str
            The decoded text; invalid UTF-8 sequences become U+FFFD.
        """
        out = bytearray()
        for i in ids:
            i = int(i)
            if i < 0 or i >= self.vocab_size:
                raise ValueError(f"token id must be in [0, {self.vocab_size}), got {i}")
            if i < self.n_bytes:
                out.append(i)
        return out.decode("utf-8", errors="replace")

    def encode_prompt(self, text: str) -> list[int]:
        """Return the ids of a prompt as the embedded models expect it: BOS, then the bytes."""
        return self.encode(text, add_bos=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """``(eos_id,)``: generation stops after EOS."""
        return (self.eos_id,)

    def is_special(self, token_id: int) -> bool:
        """Return True when `token_id` is BOS, EOS, MASK or PAD."""
        return int(token_id) >= self.n_bytes

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"
