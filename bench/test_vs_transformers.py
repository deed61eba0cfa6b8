"""fastspec vs Hugging Face transformers on the same weights (needs the [hf] extra).

Each pair (greedy, assisted generation / draft model, prompt lookup / n-gram) is one
benchmark group with a transformers case beside the fastspec case; ``extra_info`` records
target forward calls and whether the outputs are identical. The tiny Llama of the model
benchmarks is exported with ``Transformer.save(folder)`` and loaded by transformers
(:class:`fastspec.tools.peers.HFPair`).

    pytest bench/test_vs_transformers.py --benchmark-only --benchmark-json peers.json

FASTSPEC_BENCH_TOKENS sets the number of new tokens (default 256).
"""
import os

import numpy as np
import pytest

import fastspec as fs

pytest.importorskip("torch")
pytest.importorskip("transformers")
from fastspec.tools.peers import HFPair  # noqa: E402

NEW_TOKENS = int(os.environ.get("FASTSPEC_BENCH_TOKENS", "256"))
PROMPT = np.random.default_rng(0).integers(0, 256, 64)
PAIRS = ["greedy", "assisted", "lookup"]


@pytest.fixture(scope="module")
def models():
    target = fs.Transformer.random(fs.ModelConfig.tiny_llama(), seed=0)
    draft = fs.Transformer.random(fs.ModelConfig.tiny_llama(n_layers=1), seed=1)
    return target, draft, HFPair(target, draft, threads=2)


def _fastspec_call(pair, target, draft):
    if pair == "greedy":
        return lambda: fs.generate(target, PROMPT, NEW_TOKENS)
    drafter = (lambda: fs.DraftModelDrafter(draft)) if pair == "assisted" else (
        lambda: fs.NgramDrafter(max_ngram=3))
    return lambda: fs.speculative_generate(target, drafter(), PROMPT, NEW_TOKENS, gamma=4)


@pytest.mark.parametrize("pair", PAIRS)
def test_transformers(benchmark, models, pair):
    _, _, hf = models
    benchmark.group = f"peers {pair} {NEW_TOKENS} tokens"
    tokens, _, calls = benchmark.pedantic(hf.generate, args=(PROMPT, NEW_TOKENS, pair),
                                          rounds=1, warmup_rounds=1)
    benchmark.extra_info.update(target_calls=calls, new_tokens=len(tokens))
    assert len(tokens) == NEW_TOKENS


@pytest.mark.parametrize("pair", PAIRS)
def test_fastspec(benchmark, models, pair):
    target, draft, hf = models
    benchmark.group = f"peers {pair} {NEW_TOKENS} tokens"
    res = benchmark.pedantic(_fastspec_call(pair, target, draft), rounds=3, warmup_rounds=1)
    hf_tokens, _, _ = hf.generate(PROMPT, NEW_TOKENS, pair)
    same = list(res.tokens) == hf_tokens
    benchmark.extra_info.update(target_calls=res.stats.target_calls, new_tokens=len(res.tokens),
                                identical_to_transformers=same)
    # Same weights, same greedy rule: both libraries must emit the same tokens.
    assert same
