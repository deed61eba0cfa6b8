"""What one speculative round costs on the embedded models, in target decode steps.

Every piece of a round (``fastspec.tools.benchmark.round_costs``) on the embedded target and
drafters (float16 weights, Cython backend) at a context of 300 committed positions::

    OPENBLAS_NUM_THREADS=1 pytest bench/test_bench_rounds.py --benchmark-only -s

A round drafting gamma tokens costs ``draft + verify_(gamma+1) + commit`` decode steps and emits
tau tokens, so its speedup over vanilla decoding is at most ``tau * decode / round``. The test
records every piece's ratio to a decode step and, for the DFlash goal of the issue "Embedded
default" (tau >= 4.5 and >= 2.5x at block size 8, gamma 7), the speedup that tau 4.5 allows at
these costs.
"""
import pytest

import fastspec as fs
from fastspec.tools.benchmark import round_costs

needs_models = pytest.mark.skipif(
    "cython" not in fs.available_backends() or not fs.pretrained.available(),
    reason="needs the Cython extension and the embedded models")


@needs_models
def test_round_costs(benchmark):
    benchmark.group = "round-costs"
    previous = fs.backend()
    fs.set_backend("cython")
    try:
        b = fs.pretrained.load()
        rc = round_costs(b.target, b.draft, b.dflash)
        ratio = {r["piece"]: r["over_decode"] for r in rc["pieces"]}
        info = {f"{r['piece']}_us": 1e6 * r["seconds"] for r in rc["pieces"]}
        info.update({f"{k}_over_decode": v for k, v in ratio.items() if k != "verify_1"})
        dflash_round = ratio["dflash_block_8"] + ratio["verify_8"] + ratio["dflash_commit_4"]
        info["dflash_gamma7_round_over_decode"] = dflash_round
        info["speedup_at_tau_4.5_gamma7"] = 4.5 / dflash_round
        info["goal"] = "DFlash tau >= 4.5 and speedup >= 2.5x"
        benchmark.extra_info.update(info)
        print("\n" + "\n".join(f"{k} = {v:.3g}" if isinstance(v, float) else f"{k} = {v}"
                               for k, v in info.items()))
        tcache = b.target.new_cache()
        b.target.forward([i % 200 for i in range(299)], tcache)

        def decode_step():
            b.target.forward([1], tcache)
            tcache.crop(299)
        benchmark.pedantic(decode_step, rounds=5, iterations=20)
    finally:
        fs.set_backend(previous)
