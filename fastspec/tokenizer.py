"""Byte-level tokenizer shared by every embedded fastspec model.

Ids 0..255 are the UTF-8 bytes of the text; four special ids follow:
256 = BOS, 257 = EOS, 258 = MASK (the DFlash block filler), 259 = PAD.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["ByteTokenizer"]


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

    def is_special(self, token_id: int) -> bool:
        """Return True when `token_id` is BOS, EOS, MASK or PAD."""
        return int(token_id) >= self.n_bytes

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"
