"""fastspec vs Hugging Face transformers on the same weights (needs the [hf] extra).

Each pair (greedy, assisted generation / draft model, prompt lookup / n-gram) is one
benchmark group with a transformers case beside the fastspec case; ``extra_info`` records
tokens/s, target forward calls and whether the outputs are identical. The tiny Llama of the
model benchmarks is exported with ``Transformer.save(folder)`` and loaded by transformers.

    pytest bench/test_vs_transformers.py --benchmark-only --benchmark-json peers.json

FASTSPEC_BENCH_TOKENS sets the number of new tokens (default 256).
"""
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

import fastspec as fs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = int(os.environ.get("FASTSPEC_BENCH_TOKENS", "256"))
PROMPT = np.random.default_rng(0).integers(0, 256, 64)


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(2)
    target = fs.Transformer.random(fs.ModelConfig.tiny_llama(), seed=0)
    draft = fs.Transformer.random(fs.ModelConfig.tiny_llama(n_layers=1), seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        target.save(Path(tmp) / "target")
        draft.save(Path(tmp) / "draft")
        load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
            Path(tmp) / d, dtype=torch.float32).eval()
        hf_target, hf_draft = load("target"), load("draft")
    for m in (hf_target, hf_draft):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = m.config.vocab_size - 1
    hf_draft.generation_config.num_assistant_tokens = 4
    hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
    calls = {"n": 0}
    hf_target.register_forward_pre_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    return target, draft, hf_target, hf_draft, calls


def _hf_generate(hf_target, calls, **kw):
    inp = torch.tensor(PROMPT[None, :], dtype=torch.long)
    calls["n"] = 0
    with torch.inference_mode():
        out = hf_target.generate(inp, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False,
                                 attention_mask=torch.ones_like(inp), **kw)
    return out[0, len(PROMPT):].tolist(), calls["n"]


PAIRS = ["greedy", "assisted-draft", "lookup-ngram"]


def _fastspec_call(pair, target, draft):
    if pair == "greedy":
        return lambda: fs.generate(target, PROMPT, NEW_TOKENS)
    drafter = (lambda: fs.DraftModelDrafter(draft)) if pair == "assisted-draft" else (
        lambda: fs.NgramDrafter(max_ngram=3))
    return lambda: fs.speculative_generate(target, drafter(), PROMPT, NEW_TOKENS, gamma=4)


def _hf_kwargs(pair, hf_draft):
    return {"greedy": {}, "assisted-draft": {"assistant_model": hf_draft},
            "lookup-ngram": {"prompt_lookup_num_tokens": 4}}[pair]


@pytest.mark.parametrize("pair", PAIRS)
def test_transformers(benchmark, models, pair):
    target, draft, hf_target, hf_draft, calls = models
    benchmark.group = f"peers {pair} {NEW_TOKENS} tokens"
    tokens, n_calls = benchmark.pedantic(_hf_generate, args=(hf_target, calls),
                                         kwargs=_hf_kwargs(pair, hf_draft), rounds=1,
                                         warmup_rounds=1)
    benchmark.extra_info.update(target_calls=n_calls, new_tokens=len(tokens))
    assert len(tokens) == NEW_TOKENS


@pytest.mark.parametrize("pair", PAIRS)
def test_fastspec(benchmark, models, pair):
    target, draft, hf_target, hf_draft, calls = models
    benchmark.group = f"peers {pair} {NEW_TOKENS} tokens"
    res = benchmark.pedantic(_fastspec_call(pair, target, draft), rounds=3, warmup_rounds=1)
    hf_tokens, _ = _hf_generate(hf_target, calls, **_hf_kwargs(pair, hf_draft))
    benchmark.extra_info.update(target_calls=res.stats.target_calls, new_tokens=len(res.tokens),
                                identical_to_transformers=list(res.tokens) == hf_tokens)
    # Same weights, same greedy rule: both libraries must emit the same tokens.
    assert list(res.tokens) == hf_tokens
