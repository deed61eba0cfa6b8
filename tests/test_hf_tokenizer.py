"""HFTokenizer (tokenizer.json), StreamDecoder, special ids from the JSON configs,
load_pretrained."""
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec.text.tokenizer import StreamDecoder, Tokenizer

tokenizers = pytest.importorskip("tokenizers")
from fastspec.text.hf_tokenizer import HFTokenizer  # noqa: E402

TEXT = ("def add(a, b):\n    return a + b  # héllo wörld ✓\n"
        "class Point:\n    x: int = 0\n    y: int = 0\n") * 4


def _write_tokenizer(folder, bos=True):
    """A small byte-level BPE tokenizer.json with <s>/</s>; <s> prepended when ``bos``."""
    from tokenizers import Tokenizer as T, decoders, models, pre_tokenizers, processors, trainers

    tok = T(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Llama folder: random tiny model, tokenizer.json, config/generation_config ids."""
    folder = tmp_path_factory.mktemp("llama")
    tok = _write_tokenizer(folder)
    V = tok.get_vocab_size(with_added_tokens=True) + 4  # padded embedding, as Qwen's
    cfg = fs.ModelConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                         max_seq_len=128)
    fs.Transformer.random(cfg, seed=1).save(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(bos_token_id=0, eos_token_id=1)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    return folder


def test_encode_decode_round_trip(folder):
    tok = HFTokenizer.from_folder(folder)
    assert isinstance(tok, Tokenizer)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.encode_prompt("def") == [0] + tok.encode("def")  # post-processor adds <s>
    assert tok.encode("def", add_bos=True) == tok.encode_prompt("def")
    assert tok.adds_bos and tok.bos_id == 0 and tok.eos_id == 1 and tok.stop_ids == (1, 7)
    assert tok.decode([0, *tok.encode("x: int"), 1]) == "x: int"  # specials skipped
    assert tok.decode([tok.vocab_size + 2]) == ""  # embedding padding rows have no text
    with pytest.raises(ValueError, match="must be >= 0"):
        tok.decode([-1])


def test_stream_decoder_matches_one_decode(folder):
    """Streaming in chunks of any size gives the text of one decode (UTF-8 split included)."""
    for tok in (HFTokenizer.from_folder(folder), fs.ByteTokenizer()):
        ids = tok.encode(TEXT)
        for chunk in (1, 2, 3, 7):
            dec = StreamDecoder(tok)
            parts = [dec.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
            assert "".join(parts) + dec.flush() == tok.decode(ids) == TEXT
            assert "\ufffd" not in "".join(parts)


def test_stream_decoder_holds_back_incomplete_character():
    dec = StreamDecoder(fs.ByteTokenizer())
    e = list("é".encode())
    assert dec.push(e[:1]) == "" and dec.push(e[1:]) == "é"
    assert dec.push([0xE2]) == "" and dec.flush() == "\ufffd"


def test_stop_ids_from_config_and_tokenizer_config(tmp_path):
    _write_tokenizer(tmp_path, bos=False)
    tok = HFTokenizer.from_folder(tmp_path)
    assert (tok.bos_id, tok.stop_ids, tok.adds_bos) == (None, (), False)
    assert tok.encode_prompt("def") == tok.encode("def")
    with pytest.raises(ValueError, match="bos_token_id"):
        tok.encode("def", add_bos=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert HFTokenizer.from_folder(tmp_path).stop_ids == (1,)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert HFTokenizer.from_folder(tmp_path).stop_ids == (0,)  # config.json wins


@pytest.mark.parametrize("content, match", [
    ({"eos_token_id": "two"}, r"generation_config.json: eos_token_id must be an int"),
    ({"eos_token_id": [1, 10**6]}, r"generation_config.json: eos_token_id \[1000000\] outside"),
    ({"bos_token_id": 1.5}, r"generation_config.json: bos_token_id must be an int"),
    ([1, 2], r"generation_config.json: must hold a JSON object"),
])
def test_bad_special_ids_name_file_and_field(tmp_path, content, match):
    _write_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(content))
    with pytest.raises(ValueError, match=match):
        HFTokenizer.from_folder(tmp_path)


def test_missing_tokenizer_says_pass_token_ids(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no tokenizer.json.*pass token ids"):
        HFTokenizer.from_folder(tmp_path)
    cfg = fs.ModelConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=16)
    fs.Transformer.random(cfg).save(tmp_path)
    with pytest.raises(FileNotFoundError, match="pass token ids"):
        fs.load_pretrained(tmp_path)
    model, tok = fs.load_pretrained(tmp_path, tokenizer=False)
    assert tok is None and model.config.vocab_size == 50


@pytest.mark.parametrize("text", ["{not json", json.dumps({"model": {"type": "Nope"}}), ""])
def test_malformed_tokenizer_names_the_file(tmp_path, text):
    (tmp_path / "tokenizer.json").write_text(text)
    with pytest.raises(ValueError, match=r"tokenizer.json: malformed tokenizer"):
        HFTokenizer.from_folder(tmp_path)


def test_load_pretrained_model_and_tokenizer(folder):
    model, tok = fs.load_pretrained(folder)
    assert isinstance(model, fs.Transformer) and isinstance(tok, HFTokenizer)
    ids = tok.encode_prompt("def add(a, b):")
    out = fs.generate(model, ids, 8, eos_token_id=tok.eos_id)
    assert isinstance(tok.decode(out.tokens), str)
    np.testing.assert_array_equal(model.embed, fs.Transformer.load(folder).embed)


def test_load_pretrained_refuses_tokenizer_larger_than_model(tmp_path):
    tok = _write_tokenizer(tmp_path)
    V = tok.get_vocab_size(with_added_tokens=True) - 10
    cfg = fs.ModelConfig(vocab_size=V, dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=16)
    fs.Transformer.random(cfg).save(tmp_path)
    with pytest.raises(ValueError, match=rf"tokenizer.json: .* more than the model's "
                                         rf"vocab_size {V}"):
        fs.load_pretrained(tmp_path)
