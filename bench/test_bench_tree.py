"""Cost of verifying a tree in one target step, in target decode steps (embedded target).

For trees of 8, 16, 32 and 64 nodes (a best-first-shaped tree: a trunk with side branches) at
context 300, times interleaved in one run (medians of 5 rounds of 10 calls):

- ``tree_N_steps``: tree step (``Transformer.step(tree_parents=...)``) / one decode step;
- ``chain_N_steps``: a causal chain step of the same ``N + 1`` positions / one decode step.

On the Cython backend trees run in the fused runner with positions and a tree mask, so
``tree_N_steps / chain_N_steps`` is the price of the tree attention (each node reads its own
keys, no sharing of key loads between nodes); the NumPy backend runs the layer-by-layer
path. Run it with ``OPENBLAS_NUM_THREADS=1``: in one process with the (then OpenMP)
model runner, a multi-threaded OpenBLAS made the layer path's matrix products 10-30x slower
on the 2-core development machine (tree_8 518 decode steps instead of 13).

``fastspec bench`` reports the same figures (:func:`fastspec.tools.rounds.tree_costs`).

Run: ``pytest bench/test_bench_tree.py --benchmark-only -s``.
"""

import numpy as np
import pytest

import fastspec as fs
from _timing import median_time
from fastspec.tools.rounds import side_branch_tree
from fastspec.kernels.tree_shape import block_parents

CONTEXT = 300
NODES = (8, 16, 32, 64)

pytestmark = pytest.mark.skipif(not fs.pretrained.available(), reason="needs the embedded models")


@pytest.mark.parametrize("backend_name", fs.available_backends())
def test_tree_step_cost(benchmark, backend_name):
    with fs.using_backend(backend_name):
        target = fs.pretrained.load().target
        cache = target.new_cache(CONTEXT + 80)
        target.step(np.arange(CONTEXT) % 256, cache)

        def call(ids, parents=None):
            def run():
                target.step(ids, cache, tree_parents=parents)
                cache.crop(CONTEXT)
            return run

        calls = {"decode": call(np.array([7], dtype=np.int64))}
        for n in NODES:
            ids = (np.arange(n + 1) * 7 % 256).astype(np.int64)
            calls[f"tree_{n}"] = call(ids, block_parents(side_branch_tree(n)))
            calls[f"chain_{n}"] = call(ids)
        for c in calls.values():
            c()
        rounds = {k: [] for k in calls}
        for _ in range(5):
            for k, c in calls.items():
                rounds[k].append(median_time(c, repeat=10))
        t = {k: float(np.median(v)) for k, v in rounds.items()}
        info = {"decode_us": t["decode"] * 1e6}
        for n in NODES:
            info[f"tree_{n}_steps"] = t[f"tree_{n}"] / t["decode"]
            info[f"chain_{n}_steps"] = t[f"chain_{n}"] / t["decode"]
        benchmark.extra_info.update(info)
        print(f"\n{backend_name}: " + ", ".join(f"{k}={v:.3g}" for k, v in info.items()))
        benchmark.pedantic(calls["tree_16"], rounds=3, iterations=3)




@pytest.mark.parametrize("budget", [16, 64])
def test_tree_drafting_at_qwen_vocab(benchmark, budget):
    """A DFlash tree's host-side work at V = 151936 (Qwen3) for a block of 15 positions, over
    the cost of ``probs`` of the 15 rows (top-k 50), which a sampled round computes anyway:

    - ``greedy``: the shape from the block's logits (the drafter's ``_logits_tree``);
    - ``sampled``: the shape from ``probs`` (``_probs_tree``) and its draw without
      replacement (``sample_tree_without_replacement``), ``probs`` excluded."""
    from fastspec.drafters.dflash import _logits_tree, _probs_tree
    from fastspec.drafters.tree_sampling import sample_tree_without_replacement

    vocab, g, rng = 151936, 15, np.random.default_rng(budget)
    logits = (3.0 * rng.standard_normal((g, vocab))).astype(np.float32)
    q = fs.kernels.probs(logits, 1.0, 50)
    u = rng.random(budget)

    def sampled():
        _, shape = _probs_tree(q, budget)
        return sample_tree_without_replacement(shape, q, u[:shape.shape[0]])

    t = {"probs": median_time(lambda: fs.kernels.probs(logits, 1.0, 50), repeat=7),
         "greedy": median_time(lambda: _logits_tree(logits, budget), repeat=7),
         "sampled": median_time(sampled, repeat=7)}
    info = {f"{k}_ms": 1e3 * v for k, v in t.items()}
    info.update(greedy_over_probs=t["greedy"] / t["probs"],
                sampled_over_probs=t["sampled"] / t["probs"])
    benchmark.extra_info.update(info)
    print(f"\nbudget {budget}: " + ", ".join(f"{k}={v:.3g}" for k, v in info.items()))
    benchmark.pedantic(sampled, rounds=3, iterations=1)
