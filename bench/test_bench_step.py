"""Per-step overhead of the public fast entry ``Transformer.step`` against the runner call.

Before the restructure, the draft model's steps and the DFlash block went straight to the
model's private fused runner (``runner.forward`` + ``cache.advance``) to skip the Python
dispatch of ``Transformer.forward``. They now call ``Transformer.step`` (one cache claim, the
runner's own checks) and ``DFlashModel.forward_block``. ``test_step_overhead`` times, interleaved
in one run (medians of 5 rounds), on the embedded models at context 300 (Cython backend):

- ``draft_step_ratio``: draft-model decode step via ``step`` / via the bare runner;
- ``target_step_ratio``: target decode step via ``step`` / via the bare runner;
- ``forward_ratio``: target decode step via ``forward`` / via ``step``;
- ``dflash_block_ratio``: a full DFlash block via ``forward_block`` / via the bare runner.

Goal: every ratio <= 1.05 (the public entry costs no more than the reach-around did).

Run: ``pytest bench/test_bench_step.py --benchmark-only -s``.
"""

import numpy as np
import pytest

import fastspec as fs
from _timing import median_time

CONTEXT = 300

pytestmark = pytest.mark.skipif(
    not fs.pretrained.available() or "cython" not in fs.available_backends(),
    reason="needs the embedded models and the compiled backend")


def _decode_pair(model):
    """(via step, via the bare runner): one decode step at CONTEXT, cropped back after."""
    cache = model.new_cache(CONTEXT + 16)
    model.step(np.arange(CONTEXT) % 256, cache)
    tok = np.array([7], dtype=np.int64)
    out = np.empty((1, model.config.vocab_size), dtype=np.float32)

    def public():
        model.step(tok, cache, out=out)
        cache.crop(CONTEXT)

    def forward():
        model.forward(tok, cache, out=out)
        cache.crop(CONTEXT)

    def bare():
        runner = model._fused()
        runner.forward(tok, cache.k, cache.v, cache.length, True, (), out)
        cache.advance(1)
        cache.crop(CONTEXT)

    return public, bare, forward


def _block_pair(bundle):
    dflash = bundle.dflash
    cache = dflash.new_cache()
    taps = {t: np.zeros((CONTEXT, bundle.target.config.dim), np.float32)
            for t in dflash.config.tap_layers}
    dflash.append_hidden(cache, taps)
    block = dflash.mask_block(7)
    out = np.empty((block.shape[0], bundle.target.config.vocab_size), np.float32)

    def public():
        dflash.forward_block(cache, block)

    def bare():
        runner = dflash._stack._fused()
        runner.forward(block, cache.k, cache.v, cache.length, False, (), out)

    return public, bare


@pytest.fixture
def cython_backend():
    with fs.using_backend("cython"):
        yield


def test_step_overhead(benchmark, cython_backend):
    bundle = fs.pretrained.load()
    d_pub, d_bare, _ = _decode_pair(bundle.draft)
    t_pub, t_bare, t_fwd = _decode_pair(bundle.target)
    b_pub, b_bare = _block_pair(bundle)
    steps = {"draft_step": d_pub, "draft_bare": d_bare, "target_step": t_pub,
             "target_bare": t_bare, "target_forward": t_fwd, "block_public": b_pub,
             "block_bare": b_bare}
    for s in steps.values():
        s()
    rounds = {k: [] for k in steps}
    for _ in range(5):
        for k, s in steps.items():
            rounds[k].append(median_time(s, repeat=30))
    t = {k: float(np.median(v)) for k, v in rounds.items()}
    info = {f"{k}_us": v * 1e6 for k, v in t.items()}
    info.update(draft_step_ratio=t["draft_step"] / t["draft_bare"],
                target_step_ratio=t["target_step"] / t["target_bare"],
                forward_ratio=t["target_forward"] / t["target_step"],
                dflash_block_ratio=t["block_public"] / t["block_bare"],
                goals="every ratio <= 1.05")
    benchmark.extra_info.update(info)
    print("\n" + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in info.items()))
    benchmark.pedantic(d_pub, rounds=5, iterations=10)
