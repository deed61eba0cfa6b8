"""What one speculative round costs on the embedded models, in target decode steps.

Every piece of a round (``fastspec.tools.rounds.round_costs``) on the embedded target and
drafters (float16 weights, Cython backend) at a context of 300 committed positions::

    OPENBLAS_NUM_THREADS=1 pytest bench/test_bench_rounds.py --benchmark-only -s

A round drafting gamma tokens costs ``draft + verify_(gamma+1) + commit`` decode steps and emits
tau tokens, so its speedup over vanilla decoding is at most ``tau * decode / round``. The test
records every piece's ratio to a decode step and, for the DFlash goal of the issue "Embedded
default" (tau >= 4.5 and >= 2.5x at block size 8, gamma 7), the speedup that tau 4.5 allows at
these costs.
"""
import os

import pytest

import fastspec as fs
from fastspec.tools.rounds import round_costs, smollm_config, storage_costs, storage_costs_text

needs_models = pytest.mark.skipif(
    "cython" not in fs.available_backends() or not fs.pretrained.available(),
    reason="needs the Cython extension and the embedded models")


@needs_models
def test_round_costs(benchmark):
    benchmark.group = "round-costs"
    with fs.using_backend("cython"):
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


# --- verify_n per weight storage (float32 / float16 / bfloat16) ---------------------------------

needs_cython = pytest.mark.skipif("cython" not in fs.available_backends(),
                                  reason="needs the Cython extension")


def _storage_model(name):
    if name == "embedded":
        if not fs.pretrained.available():
            pytest.skip("embedded models missing")
        return fs.pretrained.load().target, 300
    if not os.environ.get("FASTSPEC_BENCH_FULL"):
        pytest.skip("the SmolLM-135M shape (~1 GB while built) runs with FASTSPEC_BENCH_FULL=1")
    return fs.Transformer.random(smollm_config(weight_dtype="bfloat16"), seed=0), 512


@needs_cython
@pytest.mark.parametrize("name", ["embedded", "smollm135m_shape"])
def test_storage_round_costs(benchmark, name):
    """verify_n (n = 1, 2, 4, 8, 12, 16) in decode steps per storage dtype, and the decode step
    against the stream bound at the weights' footprint (Cython backend, one run)::

        FASTSPEC_BENCH_FULL=1 OPENBLAS_NUM_THREADS=1 \\
            pytest bench/test_bench_rounds.py -k storage --benchmark-only -s

    With --benchmark-disable every piece runs once (a smoke test of the table)."""
    benchmark.group = f"storage-{name}"
    with fs.using_backend("cython"):
        model, context = _storage_model(name)
        quick = dict(min_time=0.0, repeats=1) if benchmark.disabled else {}
        rows = storage_costs(model, context, **quick)
        print("\n" + "\n".join(storage_costs_text(rows, name)))
        for r in rows:
            w = r["weight_dtype"]
            benchmark.extra_info[f"{w}_decode_ms"] = 1e3 * r["decode_s"]
            benchmark.extra_info[f"{w}_fraction_of_stream_bound"] = r["fraction_of_bound"]
            for n, v in r["verify"].items():
                benchmark.extra_info[f"{w}_verify_{n}_over_decode"] = v
        assert [r["weight_dtype"] for r in rows] == ["float32", "float16", "bfloat16"]
        m = model.with_weight_dtype("bfloat16")
        cache = m.new_cache(context + 2)
        m.forward([i % 200 for i in range(context)], cache)

        def decode_step():
            m.forward([1], cache)
            cache.crop(context)
        benchmark.pedantic(decode_step, rounds=5, iterations=5)
