"""The rows ``fastspec bench`` reports (fast cases; the timings themselves live in bench/)."""
from __future__ import annotations

from fastspec.model import ModelConfig, Transformer
from fastspec.tools.benchmark import context_scaling


def test_context_rows_carry_tau():
    # tau separates a drafter that stops predicting from slow kernels: a draft model equal to
    # the target is always accepted (tau = gamma + 1), a different one less often
    target = Transformer.random(ModelConfig.tiny_llama(), 0)
    other = Transformer.random(ModelConfig.tiny_llama(n_layers=1), 1)
    same = context_scaling(target, target, [8, 24], new_tokens=10, gamma=4)
    assert [r["context"] for r in same] == [8, 24] * (len(same) // 2)
    assert all(r["tau"] == 5.0 for r in same)
    differ = context_scaling(target, other, [8], new_tokens=10, gamma=4)
    assert all(1.0 <= r["tau"] < 5.0 for r in differ)
    assert all(r["speculative_ms_per_token"] > 0 and r["speedup"] > 0 for r in same + differ)
