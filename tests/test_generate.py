"""``fastspec generate``: streamed text equals the decoded tokens, greedy output equals vanilla,
bad input is refused before any work."""
import io
import json
import sys

import numpy as np
import pytest

import fastspec as fs
from fastspec.cli import main
from fastspec.cli.generate import GenerateError, parse_drafter

PROMPT = "def add(a, b):\n"


def _run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(["generate", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def bundle():
    return fs.pretrained.load()


@pytest.mark.parametrize("drafter", ["dflash", "draft", "ngram", "none"])
def test_embedded_greedy_equals_vanilla_and_streams_the_text(capsys, bundle, drafter):
    rc, out, err = _run(capsys, "--prompt", PROMPT, "--max-new-tokens", "40",
                        "--drafter", drafter)
    assert rc == 0
    ids = bundle.tokenizer.encode_prompt(PROMPT)
    want = fs.generate(bundle.target, ids, 40, eos_token_id=bundle.tokenizer.eos_id).tokens
    assert out == bundle.tokenizer.decode(want) + "\n"
    assert "tokens/s" in err and "tau" in err and "target calls" in err
    rc, out, _ = _run(capsys, "--prompt", PROMPT, "--max-new-tokens", "40", "--drafter",
                      drafter, "--json")
    report = json.loads(out)
    assert rc == 0 and report["tokens"] == want and report["new_tokens"] == len(want)
    assert report["target_calls"] >= 1 and report["tau"] >= 1.0


def test_threads_give_the_same_tokens(capsys):
    model = pytest.importorskip("fastspec.kernels._isa")
    args = ("--prompt", PROMPT, "--max-new-tokens", "30", "--drafter", "draft", "--json")
    threads = model.get_threads()
    try:
        one = json.loads(_run(capsys, *args, "--threads", "1")[1])
        assert model.get_threads() == 1
        rc, out, _ = _run(capsys, *args, "--threads", "2")
        assert model.get_threads() == 2
    finally:
        model.set_threads(threads)
    assert rc == 0 and json.loads(out)["tokens"] == one["tokens"]
    with pytest.raises(SystemExit):
        main(["generate", "--threads", "0"])
    assert "must be >= 1" in capsys.readouterr().err


def test_sampled_run_is_reproducible_from_stdin(capsys, monkeypatch):
    args = ("--max-new-tokens", "30", "--temperature", "0.8", "--top-k", "20", "--top-p",
            "0.9", "--seed", "3", "--gamma", "3", "--json")
    a = json.loads(_run(capsys, *args, stdin=PROMPT, monkeypatch=monkeypatch)[1])
    b = json.loads(_run(capsys, *args, "--prompt", PROMPT)[1])
    assert a["tokens"] == b["tokens"] and a["prompt_tokens"] == b["prompt_tokens"]
    assert a["gamma"] == 3


def test_prompt_too_long_is_refused_before_loading(capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the bundle was loaded")

    monkeypatch.setattr(fs.pretrained, "load", boom)
    rc, _, err = _run(capsys, "--prompt", "x" * 3000, "--max-new-tokens", "1")
    assert rc == 2 and "max_seq_len 2048" in err and "3001 tokens" in err


def test_prompt_plus_new_tokens_too_long(capsys):
    rc, _, err = _run(capsys, "--prompt", "x" * 2000, "--max-new-tokens", "100")
    assert rc == 2 and "use --max-new-tokens 47 or less" in err


@pytest.mark.parametrize("spec, match", [
    ("medusa", "must be none, ngram, draft:DIR or dflash:DIR"),
    ("ngram:/tmp", "takes no path"),
    ("dflash:/nonexistent/dir", "does not exist"),
])
def test_bad_drafter_spec(spec, match):
    with pytest.raises(GenerateError, match=match):
        parse_drafter(spec, embedded=True)


def test_bare_drafter_needs_path_with_model():
    with pytest.raises(GenerateError, match="needs a path with --model"):
        parse_drafter("draft", embedded=False)


# --- Hugging Face folders --------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("qwen")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([PROMPT * 20 + "héllo ✓"], trainer)
    tok.save(str(folder / "tokenizer.json"))
    V = tok.get_vocab_size(with_added_tokens=True)
    cfg = fs.ModelConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                         max_seq_len=96, qk_norm=True)
    fs.Transformer.random(cfg, seed=2).save(folder)
    return folder


def test_hf_folder_streams_decoded_text(capsys, hf_folder):
    from fastspec.text.hf_tokenizer import HFTokenizer

    rc, out, err = _run(capsys, "--model", str(hf_folder), "--prompt", PROMPT,
                        "--max-new-tokens", "30")
    assert rc == 0, err
    model, tok = fs.load_pretrained(hf_folder)
    want = fs.generate(model, tok.encode_prompt(PROMPT), 30).tokens
    assert out == tok.decode(want) + "\n"
    assert isinstance(tok, HFTokenizer) and "drafter ngram" in err


def test_hf_second_stop_id_truncates(capsys, hf_folder, tmp_path):
    """A generation_config stop id other than eos ends the text (and the reported tokens)."""
    model, tok = fs.load_pretrained(hf_folder)
    ids = tok.encode_prompt(PROMPT)
    full = fs.generate(model, ids, 30).tokens
    stop = full[5]
    first = full.index(stop)
    other = next(i for i in range(tok.vocab_size) if i not in full)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((hf_folder / name).read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [other, stop]}))
    rc, out, err = _run(capsys, "--model", str(tmp_path), "--prompt", PROMPT,
                        "--max-new-tokens", "30", "--json")
    report = json.loads(out)
    assert rc == 0 and report["tokens"] == full[:first + 1]
    assert report["text"] == tok.decode(full[:first])


def test_prompt_ids_need_no_tokenizer(capsys, tmp_path):
    cfg = fs.ModelConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=32)
    model = fs.Transformer.random(cfg, seed=4)
    model.save(tmp_path)
    rc, out, err = _run(capsys, "--model", str(tmp_path), "--prompt-ids", "1,2,3",
                        "--max-new-tokens", "5", "--drafter", "none")
    assert rc == 0, err
    assert out.split() == [str(t) for t in fs.generate(model, [1, 2, 3], 5).tokens]
    rc, _, err = _run(capsys, "--model", str(tmp_path), "--prompt", "hi")
    assert rc == 2 and "no tokenizer.json" in err and "pass token ids" in err


def test_hf_prompt_too_long_is_refused_before_reading_weights(capsys, hf_folder, tmp_path):
    for name in ("config.json", "tokenizer.json"):  # no weights at all
        (tmp_path / name).write_bytes((hf_folder / name).read_bytes())
    rc, _, err = _run(capsys, "--model", str(tmp_path), "--prompt", PROMPT * 20)
    assert rc == 2 and "longer than the model's max_seq_len 96" in err
    assert "config.json" in err


def test_draft_model_with_another_vocabulary(capsys, hf_folder, tmp_path):
    cfg = fs.ModelConfig(vocab_size=300, dim=16, n_layers=1, n_heads=2, ffn_dim=32,
                         max_seq_len=96)
    fs.Transformer.random(cfg).save(tmp_path / "draft.npz")
    rc, _, err = _run(capsys, "--model", str(hf_folder), "--prompt", PROMPT, "--drafter",
                      f"draft:{tmp_path / 'draft.npz'}", "--max-new-tokens", "8")
    assert rc == 2 and "vocabulary (300 ids) differs from the target's" in err
    model, _ = fs.load_pretrained(hf_folder)
    drafter = fs.DraftModelDrafter(fs.Transformer.load(tmp_path / "draft.npz"))
    with pytest.raises(ValueError, match="must share the target's tokenizer"):
        fs.speculative_generate(model, drafter, [1, 2], 4)


def test_hf_folder_with_dflash_folder(capsys, hf_folder, tmp_path):
    model, tok = fs.load_pretrained(hf_folder)
    drafter = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, tap_layers=(0,),
                                                    mask_token_id=tok.vocab_size - 1), model)
    drafter.save(tmp_path / "dflash")
    rc, out, err = _run(capsys, "--model", str(hf_folder), "--prompt", PROMPT, "--drafter",
                        f"dflash:{tmp_path / 'dflash'}", "--max-new-tokens", "20", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["tokens"] == fs.generate(model, tok.encode_prompt(PROMPT), 20).tokens
    other = fs.Transformer.random(model.config, seed=9)
    other.save(tmp_path / "other")
    (tmp_path / "other" / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    rc, _, err = _run(capsys, "--model", str(tmp_path / "other"), "--prompt", PROMPT,
                      "--drafter", f"dflash:{tmp_path / 'dflash'}", "--max-new-tokens", "5")
    assert rc == 2 and "built for another target" in err


@pytest.mark.parametrize("choice, weight_dtype", [("auto", "bfloat16"), ("float32", None)])
def test_16_bit_folder_keeps_its_dtype_unless_told(capsys, tmp_path, choice, weight_dtype):
    from fastspec.tools.bench_real import write_random_folder

    cfg = fs.ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=96, max_seq_len=128, qk_norm=True)
    write_random_folder(cfg, tmp_path)  # a BF16 folder, torch_dtype "bfloat16"
    rc, out, err = _run(capsys, "--model", str(tmp_path), "--prompt-ids", "1,5,7,9",
                        "--max-new-tokens", "12", "--drafter", "none", "--json",
                        "--weight-dtype", choice)
    assert rc == 0, err
    report = json.loads(out)
    assert report["weight_dtype"] == (weight_dtype or "float32")
    model = fs.Transformer.load(tmp_path, weight_dtype=weight_dtype)
    assert report["tokens"] == fs.generate(model, [1, 5, 7, 9], 12).tokens


def test_16_bit_folder_auto_in_the_library(tmp_path):
    from fastspec.tools.bench_real import write_random_folder

    cfg = fs.ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=96, max_seq_len=128)
    write_random_folder(cfg, tmp_path)  # torch_dtype "bfloat16"
    assert fs.Transformer.load(tmp_path, weight_dtype="auto").config.weight_dtype == "bfloat16"
    wide = fs.Transformer.load(tmp_path, dtype="float64", weight_dtype="auto")
    assert wide.config.weight_dtype is None and wide.config.dtype == "float64"


def test_auto_is_every_model_command_default_and_keeps_npz_and_embedded_storage(tmp_path):
    """``auto`` is the default of each command that loads a model; an ``.npz`` file and the
    embedded models keep their own storage with it (float16 for the embedded files)."""
    from fastspec.cli import build_parser

    parser = build_parser()
    for argv in (["generate"], ["chat", "--model", "x"], ["demo"], ["eval"]):
        assert parser.parse_args(argv).weight_dtype == "auto", argv
    cfg = fs.ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                         ffn_dim=64, max_seq_len=32)
    fs.Transformer.random(cfg.replace(weight_dtype="float16"), seed=0).save(tmp_path / "m.npz")
    assert fs.Transformer.load(tmp_path / "m.npz", weight_dtype="auto").config.weight_dtype \
        == "float16"
    fs.Transformer.random(cfg, seed=0).save(tmp_path / "f.npz")
    loaded = fs.Transformer.load(tmp_path / "f.npz", weight_dtype="auto")
    assert loaded.config.weight_dtype is None and loaded.layers[0].wq.dtype == np.float32
    bundle = fs.pretrained.load(weight_dtype="auto")
    assert bundle.target.config.weight_dtype == "float16"


@pytest.mark.parametrize("choice, weight_dtype", [("auto", "q4_1"), ("float32", None)])
def test_gguf_file_keeps_its_blocks_unless_told(capsys, tmp_path, choice, weight_dtype):
    """The default ``--weight-dtype auto`` runs a Q4_1 file as q4_1 (its own blocks), not as
    dequantized float32 (7x slower decode on the real SmolLM2 file)."""
    pytest.importorskip("gguf")
    from _gguf_writer import write_model

    path = tmp_path / "m.gguf"
    write_model(path, types=(__import__("gguf").GGMLQuantizationType.Q4_1,), dim=64,
                n_layers=2, n_heads=4, n_kv=2, ffn=128)
    argv = ["--model", str(path), "--prompt-ids", "1,5,7,9", "--max-new-tokens", "12",
            "--drafter", "none", "--json"] + ([] if choice == "auto" else
                                               ["--weight-dtype", choice])
    rc, out, err = _run(capsys, *argv)
    assert rc == 0, err
    report = json.loads(out)
    assert report["weight_dtype"] == (weight_dtype or "float32")
    model = fs.Transformer.load(path, weight_dtype=weight_dtype)
    assert report["tokens"] == fs.generate(model, [1, 5, 7, 9], 12).tokens


def test_weight_dtype_is_for_folders(capsys):
    rc, _, err = _run(capsys, "--prompt-ids", "1,2", "--weight-dtype", "float32")
    assert rc == 2 and "--weight-dtype applies to --model folders" in err
    rc, _, err = _run(capsys, "--prompt-ids", "1,2", "--mmap")
    assert rc == 2 and "--mmap applies to --model folders" in err


def test_mmap_folder_generates_the_same_tokens(capsys, tmp_path):
    from fastspec.tools.bench_real import write_random_folder

    cfg = fs.ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=96, max_seq_len=128, qk_norm=True)
    write_random_folder(cfg, tmp_path)  # a BF16 folder: auto keeps bf16, which maps
    argv = ("--model", str(tmp_path), "--prompt-ids", "1,5,7,9", "--max-new-tokens", "12",
            "--drafter", "ngram", "--json")
    runs = []
    for extra in ((), ("--mmap",)):
        rc, out, err = _run(capsys, *argv, *extra)
        assert rc == 0, err
        runs.append(json.loads(out)["tokens"])
    assert runs[0] == runs[1]
