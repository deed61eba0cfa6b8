"""The measuring helpers behind ``fastspec bench``: what they time and how they report it."""
import numpy as np
import pytest

import fastspec as fs
from fastspec import benchmark


@pytest.fixture(scope="module")
def models():
    cfg = fs.ModelConfig.toy(vocab_size=32, dim=16, n_layers=2)
    return fs.Transformer.random(cfg, seed=0), fs.Transformer.random(cfg.replace(n_layers=1), seed=1)


def test_stats_split_prefill_from_decoding(models):
    target, draft = models
    prompt = np.arange(20) % 32
    for result in (fs.generate(target, prompt, 12),
                   fs.speculative_generate(target, fs.DraftModelDrafter(draft), prompt, 12)):
        s = result.stats
        assert 0 < s.prefill_s < s.elapsed_s
        assert s.decode_s == pytest.approx(s.elapsed_s - s.prefill_s)
        assert {"prefill_s", "decode_s"} <= set(s.to_dict())


def test_per_token_excludes_prefill_and_counts_vanilla_first_token(models):
    target, _ = models
    prompt = np.arange(20) % 32
    seen = []

    def run(n):
        result = fs.generate(target, prompt, n)
        seen.append(result.stats)
        return result

    t, stats = benchmark._per_token(run, 9, vanilla=True, repeats=2)
    assert stats in seen
    assert t == pytest.approx(min(s.decode_s / 8 for s in seen))


def test_attention_rates_compare_with_a_stream_of_the_same_bytes():
    rows = benchmark.attention_rates(lengths=(64,), n_heads=2, head_dim=16)
    assert {r["backend"] for r in rows} == set(fs.available_backends())
    for r in rows:
        assert r["bytes"] == 2 * 2 * 64 * 16 * 4
        assert r["fraction_of_stream"] == pytest.approx(r["GBps"] / r["stream_GBps"])
