"""The measuring helpers behind ``fastspec bench``: what they time and how they report it.

They time real work, so they live here rather than in tests/ (CI runs bench/ once with
``--benchmark-disable``; ``--benchmark-only`` skips them).
"""
import numpy as np
import pytest

import fastspec as fs
from fastspec.tools import benchmark, machine, markdown, rounds


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
    rows = machine.attention_rates(lengths=(64,), n_heads=2, head_dim=16)
    assert {r["backend"] for r in rows} == set(fs.available_backends())
    for r in rows:
        assert r["bytes"] == 2 * 2 * 64 * 16 * 4
        assert r["fraction_of_stream"] == pytest.approx(r["GBps"] / r["stream_GBps"])


@pytest.fixture(params=fs.available_backends())
def backend(request):
    """Run the test on each available backend, restoring the active one afterwards."""
    with fs.using_backend(request.param):
        yield request.param


def test_round_costs_report_every_piece_in_decode_steps(backend):
    target = fs.Transformer.random(fs.ModelConfig.tiny_llama(dim=32, n_layers=2, n_heads=4,
                                                             n_kv_heads=2, ffn_dim=48), seed=0)
    draft = fs.Transformer.random(target.config.replace(n_layers=1), seed=1)
    dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=4), target, seed=2)
    rc = rounds.round_costs(target, draft, dflash, context=20, verify_sizes=(1, 3),
                               block_sizes=(2, 4))
    names = [r["piece"] for r in rc["pieces"]]
    assert names == ["verify_1", "verify_3", "dflash_block_2", "dflash_block_4",
                     "dflash_commit_4", "draft_step"]
    assert rc["pieces"][0]["over_decode"] == 1.0 and rc["decode_s"] > 0
    for r in rc["pieces"]:
        assert r["seconds"] > 0 and r["over_decode"] == pytest.approx(r["seconds"] / rc["decode_s"])
    report = {"environment": {"python": "3", "numpy": "2", "cpus": 2, "processor": "x",
                              "machine": "x", "time_utc": "now"},
              "mode": "quick", "models": {"source": "random", "target_params": 1, "draft_params": 1},
              "machine": {"stream_cache_GBps": 1.0, "stream_dram_GBps": 1.0, "gemm_size": 8,
                          "gemm_f32_GFLOPs": 1.0},
              "attention": [], "attention_fraction_of_cache_bandwidth": 0.5,
              "attention_fraction_of_stream": 0.5, "kernels": [], "decode_bound": [],
              "round_costs": {"backend": fs.backend(), **rc}, "context_scaling": [],
              "gamma_scaling": [],
              "tree_costs": [{"backend": fs.backend(), **r}
                             for r in rounds.tree_costs(target, (4, 8), context=20,
                                                        min_time=0.001, repeats=1)]}
    md = markdown.performance_markdown(report)
    assert "| 8 | 4 |" in md and "tree verify" in markdown.summary_text(report)
    for r in report["tree_costs"]:
        assert r["tree_steps"] > 0 and r["chain_steps"] > 0
        assert r["tree_over_chain"] == pytest.approx(r["tree_steps"] / r["chain_steps"])
    assert "What a speculative round costs (context 20" in md
    assert "| dflash_commit_4 |" in md
