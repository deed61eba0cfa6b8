"""The tokenizer a GGUF file describes, rebuilt with the ``tokenizers`` package.

:func:`build_gguf_tokenizer` turns the ``tokenizer.*`` keys of a GGUF file's metadata (the dict
:func:`fastspec.formats.gguf.read_metadata` returns) into a ``tokenizers.Tokenizer`` plus the
special ids; :meth:`fastspec.text.hf_tokenizer.HFTokenizer.from_gguf_metadata` wraps it.

Two tokenizer models are supported, as llama.cpp (the program GGUF files are written for)
runs them:

* ``gpt2``: byte-level BPE from ``tokens`` + ``merges``. The text is first split by the regexes
  llama.cpp's ``llm_tokenizer_bpe`` applies for ``tokenizer.ggml.pre`` (each regex re-splits the
  pieces of the previous one), then mapped to the byte alphabet.
* ``llama``: SentencePiece-style BPE with byte fallback (``<0xXX>`` tokens) and the ``▁``
  space marker; merges from ``tokenizer.ggml.merges`` or, as in most such files, rebuilt from
  ``scores`` the way ``transformers`` does.

Control tokens (type 3) are special tokens, user-defined ones (type 4) added tokens; both are
matched in the raw text before any splitting.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GGUFTokenizerParts", "build_gguf_tokenizer", "merges_from_scores",
           "PRE_TOKENIZERS", "END_OF_TURN_TEXTS"]

# llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe's constructor: the regexes of each pre type.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_HEAD = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                r"|[^\r\n\p{L}\p{N}]?\p{L}+")
_LLAMA3_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _LLAMA3_HEAD + r"|\p{N}{1,3}" + _LLAMA3_TAIL
_QWEN2 = _LLAMA3_HEAD + r"|\p{N}" + _LLAMA3_TAIL   # single digits instead of runs of 1-3
# DeepSeek's (LLM and Coder): newlines apart, then words and punctuation with one leading
# space, CJK runs, digits
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943")
_DEEPSEEK_LLM = ("[\r\n]", f"\\s?[{_DEEPSEEK_LETTERS}]+",
                 "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                 r"\s+$", _CJK, r"\p{N}+")
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
# Mistral's tekken (llama.cpp's form: "upper" and "lower" letters by lookahead)
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
           r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o's o200k (Phi-4-mini, Llama 4): tekken's case split, each letter run with an optional
# contraction, and digit runs of 1-3. llama.cpp sets neither ignore_merges nor add_bos for it
# (only clean_spaces = false, a decoding flag), so "llama4" is not in _LLAMA3_FAMILY
_CONTRACTION = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTION
          + r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTION
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SEED_CODER = (_LLAMA3_HEAD + r"|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)"
               r"|\s+")

#: ``tokenizer.ggml.pre`` -> the regexes applied in order (llama.cpp's lists).
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt-2": (_GPT2,),
    **{name: (r"\p{N}", _GPT2) for name in
       ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")},
    **{name: (_LLAMA3,) for name in ("llama-bpe", "llama3", "llama-v3", "falcon3", "midm-2.0",
                                     "smaug-bpe")},
    **{name: (_QWEN2,) for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-coder": _DEEPSEEK_CODER,
    "tekken": (_TEKKEN,),
    **{name: (_GPT4O,) for name in ("gpt-4o", "llama4")},
    "seed-coder": (_SEED_CODER,),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
}
# llama.cpp sets ignore_merges (a word already in the vocabulary is one token) and add_bos
# for the Llama-3 family (not smaug-bpe, which shares its regex) and tekken only.
_LLAMA3_FAMILY = frozenset({"llama-bpe", "llama3", "llama-v3", "falcon3", "midm-2.0", "tekken"})

#: Token texts llama.cpp treats as end of generation wherever they sit in the vocabulary
#: (llama-vocab.cpp, "auto-detect special tokens by text").
END_OF_TURN_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>"})

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_MODELS = ("gpt2", "llama")
_KEY = "tokenizer.ggml."


@dataclass
class GGUFTokenizerParts:
    """What :func:`build_gguf_tokenizer` reads from the metadata.

    Attributes
    ----------
    tokenizer : tokenizers.Tokenizer
        Encodes like llama.cpp; its post-processor adds BOS/EOS when the file says so.
    bos_id, eos_id, unk_id, pad_id : int or None
    stop_ids : tuple of int
        EOS first, then EOT, EOM and every token whose text is in :data:`END_OF_TURN_TEXTS`.
    chat_template : str or None
        ``tokenizer.chat_template``.
    model, pre : str
        ``tokenizer.ggml.model`` and ``tokenizer.ggml.pre`` (``""`` for ``llama``).
    token_strings : dict of str to str
        ``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``: the text of each special
        id the file sets (the names chat templates use).
    """

    tokenizer: Any
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    stop_ids: tuple[int, ...]
    chat_template: str | None
    model: str
    pre: str = ""
    token_strings: dict[str, str] = field(default_factory=dict)


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError("a GGUF file's tokenizer needs the 'tokenizers' package: "
                          'pip install "fastspec[gguf]"') from exc
    return tokenizers


def _string_list(meta: dict[str, Any], key: str, required: bool = True) -> list[str] | None:
    value = meta.get(key)
    if value is None:
        if required:
            raise ValueError(f"GGUF metadata has no {key}, so it holds no tokenizer")
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"GGUF {key} must be a list of strings, got {type(value).__name__}")
    return value


def _number_list(meta: dict[str, Any], key: str, n: int, kind: type) -> list | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n or not all(
            isinstance(v, (int, float) if kind is float else int) and not isinstance(v, bool)
            for v in value):
        raise ValueError(f"GGUF {key} must be a list of {n} {kind.__name__}s (one per token)")
    return value


def _token_id(meta: dict[str, Any], name: str, n: int) -> int | None:
    key = f"{_KEY}{name}_token_id"
    value = meta.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < n:
        raise ValueError(f"GGUF {key} must be a token id in [0, {n}), got {value!r}")
    return value


def _flag(meta: dict[str, Any], name: str, default: bool) -> bool:
    value = meta.get(f"{_KEY}{name}")
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"GGUF {_KEY}{name} must be a bool, got {value!r}")
    return value


def _pairs(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Split each merge into its two tokens; both, and the token they merge into, must be in
    ``vocab`` (what ``tokenizers``' BPE requires; checked here so that a bad file is named)."""
    out = []
    for i, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right or " " in right:
            raise ValueError(f"GGUF {_KEY}merges[{i}] must be two tokens separated by one "
                             f"space, got {merge!r}")
        for piece in (left, right, left + right):
            if piece not in vocab:
                raise ValueError(f"GGUF {_KEY}merges[{i}] {merge!r}: {piece!r} is not in "
                                 f"{_KEY}tokens")
        out.append((left, right))
    return out


def _bpe(tk, **kwargs):
    """``tokenizers.models.BPE(**kwargs)``; its errors (plain ``Exception``) as ValueError."""
    try:
        return tk.models.BPE(**kwargs)
    except Exception as e:  # tokenizers raises Exception itself, not a subclass
        raise ValueError(f"GGUF tokenizer: the BPE model cannot be built: {e}") from e


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Return SentencePiece BPE merges rebuilt from token scores (``transformers`` recipe).

    Every split of a token into two in-vocabulary pieces is a merge, ranked by the merged
    token's score, then the lengths of the two pieces, all descending (transformers'
    ``generate_merges(vocab, scores)``, which its GGUF tokenizers use).

    Parameters
    ----------
    vocab : dict of str to int
    scores : dict of str to float
        The score of each token.

    Returns
    -------
    list of (str, str)
    """
    found = []
    for merged, score in scores.items():
        splits = [(merged[:i], merged[i:]) for i in range(1, len(merged))
                  if merged[:i] in vocab and merged[i:] in vocab]
        splits.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        found.extend((left, right, score) for left, right in splits)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _gpt2_model(tk, meta: dict[str, Any], vocab: dict[str, int], pre: str):
    """Byte-level BPE with llama.cpp's pre-tokenizer regexes for ``pre``."""
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF {_KEY}pre {pre!r} is not supported (its split rules are "
                         f"unknown here); supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    merges = _pairs(_string_list(meta, _KEY + "merges"), vocab)
    tok = tk.Tokenizer(_bpe(tk, vocab=vocab, merges=merges, fuse_unk=False,
                            byte_fallback=False, ignore_merges=pre in _LLAMA3_FAMILY))
    split = [tk.pre_tokenizers.Split(tk.Regex(rx), behavior="isolated")
             for rx in PRE_TOKENIZERS[pre]]
    # the regexes did the splitting; ByteLevel only maps bytes to its printable alphabet
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        split + [tk.pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                             use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    return tok


def _spm_model(tk, meta: dict[str, Any], tokens: list[str], vocab: dict[str, int],
               unk_id: int | None):
    """SentencePiece-style BPE with byte fallback, as ``transformers`` builds it for GGUF."""
    merges = _string_list(meta, _KEY + "merges", required=False)
    if merges is not None:
        pairs = _pairs(merges, vocab)
    else:
        scores = _number_list(meta, _KEY + "scores", len(tokens), float)
        if scores is None:
            raise ValueError(f"GGUF tokenizer 'llama' needs {_KEY}merges or {_KEY}scores")
        pairs = merges_from_scores(vocab, dict(zip(tokens, scores)))
    tok = tk.Tokenizer(_bpe(
        tk, vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True,
        unk_token=tokens[unk_id] if unk_id is not None else None))
    # llama.cpp's default, but Gemma's tokenizer prepends no space (llama.cpp's converter
    # writes the key false; Ollama's gemma3 files lack it and Ollama prepends none)
    add_space = _flag(meta, "add_space_prefix", meta.get("general.architecture") != "gemma3")
    tok.pre_tokenizer = tk.pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_space else "never", split=False)
    steps = [tk.decoders.Replace("\u2581", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    if add_space:  # the space the pre-tokenizer prepended is not part of the text
        steps.append(tk.decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = tk.decoders.Sequence(steps)
    return tok


def _post_processor(tk, tokens: list[str], bos: int | None, eos: int | None):
    """BOS/EOS insertion (None when neither is added)."""
    single, special = "$A", []
    if bos is not None:
        single = f"{tokens[bos]} {single}"
        special.append((tokens[bos], bos))
    if eos is not None:
        single = f"{single} {tokens[eos]}"
        special.append((tokens[eos], eos))
    if not special:
        return None
    return tk.processors.TemplateProcessing(single=single, special_tokens=special)


def build_gguf_tokenizer(meta: dict[str, Any]) -> GGUFTokenizerParts:
    """Return the tokenizer and special ids a GGUF file's metadata describes.

    Parameters
    ----------
    meta : dict
        Every key/value of the file as plain Python values (``read_metadata``'s contract):
        ``tokenizer.ggml.tokens``/``merges`` lists of str, ``token_type`` list of int,
        ``scores`` list of float, the ``*_token_id`` ints and ``add_*`` bools.

    Returns
    -------
    GGUFTokenizerParts

    Raises
    ------
    ValueError
        An unsupported ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre`` (named, with the
        supported ones), or a malformed tokenizer key (named).
    ImportError
        The ``tokenizers`` package is missing.
    """
    model = meta.get(_KEY + "model")
    if model not in _MODELS:
        raise ValueError(f"GGUF {_KEY}model {model!r} is not supported; supported: "
                         f"{', '.join(_MODELS)}")
    tk = _import_tokenizers()
    tokens = _string_list(meta, _KEY + "tokens")
    n = len(tokens)
    types = _number_list(meta, _KEY + "token_type", n, int) or [_NORMAL] * n
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != n:
        raise ValueError(f"GGUF {_KEY}tokens holds {n - len(vocab)} duplicate token strings")
    ids = {name: _token_id(meta, name, n)
           for name in ("bos", "eos", "eot", "eom", "unknown", "padding")}
    if model == "gpt2":
        pre = meta.get(_KEY + "pre") or "default"
        tok = _gpt2_model(tk, meta, vocab, pre)
        bos_default = pre in _LLAMA3_FAMILY
    else:
        pre = ""
        tok = _spm_model(tk, meta, tokens, vocab, ids["unknown"])
        bos_default = True   # llama.cpp and transformers both prepend BOS for SentencePiece
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == _CONTROL])
    user = [tk.AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types) if kind == _USER_DEFINED]
    if user:
        tok.add_tokens(user)
    add_bos = _flag(meta, "add_bos_token", bos_default)
    add_eos = _flag(meta, "add_eos_token", False)
    post = _post_processor(tk, tokens, ids["bos"] if add_bos else None,
                           ids["eos"] if add_eos else None)
    if post is not None:
        tok.post_processor = post
    stops = [i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None]
    stops += sorted(vocab[t] for t in END_OF_TURN_TEXTS if t in vocab)
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"GGUF tokenizer.chat_template must be a string, got "
                         f"{type(template).__name__}")
    strings = {f"{name}_token": tokens[i] for name, i in
               (("bos", ids["bos"]), ("eos", ids["eos"]), ("unk", ids["unknown"]),
                ("pad", ids["padding"])) if i is not None}
    return GGUFTokenizerParts(
        tokenizer=tok, bos_id=ids["bos"], eos_id=ids["eos"], unk_id=ids["unknown"],
        pad_id=ids["padding"], stop_ids=tuple(dict.fromkeys(stops)), chat_template=template,
        model=model, pre=pre, token_strings=strings)
