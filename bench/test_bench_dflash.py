"""DFlash drafter cost: one block forward vs a target decode step vs AR draft-model proposals.

Tiny Llama target (``ModelConfig.tiny_llama()``: dim 256, 4 layers, vocab 260), a DFlash drafter
with B = 8 and one draft layer, and a 1-layer draft model of the same width; context of 64
committed positions. Run::

    OPENBLAS_NUM_THREADS=1 pytest bench/test_bench_dflash.py --benchmark-only -s

Target (issue "DFlash block-diffusion drafter"): one block forward costs less than 2 AR steps of
the 1-layer draft model (Cython backend). ``test_dflash_block_vs_ar_ratio`` measures both in
one run, interleaved, and records the ratio in ``extra_info``. Acceptance length with random
weights is meaningless, so the end-to-end case reports mechanics (calls, positions) only.
"""
import time

import numpy as np
import pytest

import fastspec as fs

BACKENDS = fs.available_backends()
CONTEXT = 64
BLOCK = 8


class Setup:
    def __init__(self, backend):
        fs.set_backend(backend)
        cfg = fs.ModelConfig.tiny_llama()
        self.target = fs.Transformer.random(cfg, seed=0)
        self.draft = fs.Transformer.random(cfg.replace(n_layers=1), seed=1)
        self.dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=BLOCK), self.target, seed=2)
        prompt = (np.arange(CONTEXT) * 7) % 256
        self.tcache = self.target.new_cache()
        out = self.target.forward(prompt, self.tcache, hidden_layers=self.dflash.config.tap_layers)
        self.ccache = self.dflash.new_cache()
        self.dflash.append_context(self.ccache, self.dflash.context_features(out.hidden))
        self.dcache = self.draft.new_cache()
        self.draft.forward(prompt, self.dcache)

    def dflash_block(self):
        return self.dflash.draft_block(self.ccache, 3)

    def target_step(self):
        self.target.forward([3], self.tcache)
        self.tcache.crop(CONTEXT)

    def draft_step(self):
        self.draft.forward([3], self.dcache)
        self.dcache.crop(CONTEXT)

    def draft_proposal(self, steps=BLOCK - 1):
        # The AR proposal of the same length: 7 one-token steps, each feeding the argmax back.
        tok = 3
        for _ in range(steps):
            tok = int(np.argmax(self.draft.forward([tok], self.dcache).logits[0]))
        self.dcache.crop(CONTEXT)


@pytest.fixture(params=BACKENDS)
def setup(request):
    previous = fs.backend()
    s = Setup(request.param)
    s.backend = request.param
    yield s
    fs.set_backend(previous)


CASES = {
    "dflash_block_B8": ("dflash_block", dict(calls=1, positions=BLOCK, drafted=BLOCK - 1)),
    "target_decode_step": ("target_step", dict(calls=1, positions=1, drafted=0)),
    "draft_model_step": ("draft_step", dict(calls=1, positions=1, drafted=1)),
    "draft_model_proposal_7": ("draft_proposal", dict(calls=BLOCK - 1, positions=BLOCK - 1,
                                                      drafted=BLOCK - 1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cost(benchmark, setup, case):
    method, mechanics = CASES[case]
    benchmark.group = f"dflash-cost-{setup.backend}"
    benchmark.extra_info.update(mechanics, context=CONTEXT, backend=setup.backend)
    benchmark(getattr(setup, method))


def _median_time(fn, number=20, repeat=15):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return float(np.median(times))


def test_dflash_block_vs_ar_ratio(benchmark, setup):
    """One DFlash block forward in units of 1-layer draft-model AR steps (same run, interleaved)."""
    benchmark.group = f"dflash-ratio-{setup.backend}"
    block, step, target, prop = [], [], [], []
    for _ in range(3):  # interleave so that machine load affects both alike
        block.append(_median_time(setup.dflash_block))
        step.append(_median_time(setup.draft_step))
        target.append(_median_time(setup.target_step))
        prop.append(_median_time(setup.draft_proposal, number=5))
    b, s, t, p = (float(np.median(v)) for v in (block, step, target, prop))
    info = dict(block_us=b * 1e6, draft_step_us=s * 1e6, target_step_us=t * 1e6,
                draft_proposal_7_us=p * 1e6, block_over_draft_step=b / s,
                block_over_target_step=b / t, proposal_over_block=p / b,
                goal="block_over_draft_step < 2 (cython)")
    benchmark.extra_info.update(info)
    print(f"\n[{setup.backend}] " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in info.items()))
    benchmark.pedantic(setup.dflash_block, rounds=5, iterations=10)


@pytest.mark.parametrize("denoise_steps", [1, 3])
def test_end_to_end_mechanics(benchmark, setup, denoise_steps):
    """64 greedy tokens with a random-weight DFlash drafter: calls and positions per token."""
    benchmark.group = f"dflash-e2e-{setup.backend}"
    drafter = fs.DFlashDrafter(setup.dflash, denoise_steps=denoise_steps)
    prompt = list(range(32))
    res = benchmark.pedantic(fs.speculative_generate,
                             args=(setup.target, drafter, prompt, 64),
                             kwargs=dict(gamma=BLOCK - 1), rounds=2, iterations=1)
    s = res.stats
    benchmark.extra_info.update(
        rounds=s.rounds, drafted=s.drafted, accepted=s.accepted, tau=s.mean_accepted_length,
        target_calls=s.target_calls, target_positions=s.target_positions,
        draft_calls=s.draft_calls, draft_positions=getattr(s, "draft_positions", None),
        note="random weights: tau is meaningless, mechanics only")
    assert s.draft_calls == s.rounds * denoise_steps or s.draft_calls <= s.rounds * denoise_steps
