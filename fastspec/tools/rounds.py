"""Round costs: what each piece of a speculative round costs in decode steps (verify n
positions, a DFlash block, its context update, a draft step), per weight storage dtype."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fastspec.model import ModelConfig
from fastspec.tools.machine import stream_rate
from fastspec.tools.timing import timeit

__all__ = ["prompt_tokens", "decode_step_time", "round_costs", "smollm_config", "storage_costs",
           "storage_costs_text", "TREE_NODES", "side_branch_tree", "tree_costs"]

#: Tree sizes of :func:`tree_costs` (nodes, root excluded).
TREE_NODES = (8, 16, 32, 64)


def prompt_tokens(length: int, vocab: int) -> np.ndarray:
    """Real text when the corpus is there, cut to ``length`` byte tokens."""
    try:
        from fastspec.text.corpus import load_bytes

        data = load_bytes("validation")
        if len(data) >= length:
            return np.asarray(data[:length], dtype=np.int64) % vocab
    except Exception:  # the corpus is a nicety here; random tokens time the same
        pass
    return np.random.default_rng(0).integers(0, min(vocab, 256), length)


def decode_step_time(model, context: int) -> float:
    cache = model.new_cache()
    ids = prompt_tokens(context, model.config.vocab_size)
    model.forward(ids, cache)
    tok = np.array([1])

    def step():
        model.forward(tok, cache)
        cache.crop(context)

    return timeit(step)


def round_costs(target, draft, dflash, context: int = 300,
                verify_sizes: Sequence[int] = (1, 2, 3, 4, 5, 6, 8, 9),
                block_sizes: Sequence[int] = (3, 4, 6, 8)) -> dict:
    """Time every piece of a speculative round at ``context`` committed positions.

    Pieces: ``verify_n``, one target forward of ``n`` positions (with the DFlash taps when
    ``dflash`` is given; ``verify_1`` is a decode step); ``dflash_block_n``, the DFlash block
    forward of ``n`` positions (``gamma + 1`` with ``trim_block``); ``dflash_commit_4``, the
    drafter's context update after a round that committed 4 tokens; ``draft_step``, one
    draft-model token. A round drafting ``gamma`` tokens costs about ``draft +
    verify_(gamma+1) + commit`` and emits ``tau`` tokens, so its speedup over vanilla decoding
    is at most ``tau * decode / round``.

    Returns
    -------
    dict
        ``context``, ``decode_s`` and ``pieces``: a list of ``{"piece", "seconds",
        "over_decode"}``, in the order above.
    """
    taps = tuple(dflash.config.tap_layers) if dflash is not None else ()
    ids = prompt_tokens(context, target.config.vocab_size)
    tcache = target.new_cache()
    out = target.forward(ids, tcache, hidden_layers=taps)
    pieces: dict[str, Callable[[], object]] = {}
    for n in verify_sizes:
        block = np.full(n, 1)

        def verify(block=block):
            target.forward(block, tcache, hidden_layers=taps)
            tcache.crop(context)
        pieces[f"verify_{n}"] = verify
    if dflash is not None:
        ccache = dflash.new_cache()
        dflash.append_hidden(ccache, out.hidden)
        last4 = {t: h[-4:].copy() for t, h in out.hidden.items()}
        mask = dflash.mask_block(1)
        for n in block_sizes:
            block = mask[:n].copy()
            pieces[f"dflash_block_{n}"] = lambda block=block: dflash.forward_block(ccache, block)
        pieces["dflash_commit_4"] = lambda: dflash.append_hidden(ccache, last4, context - 4)
    seconds = {k: timeit(fn) for k, fn in pieces.items()}
    seconds["draft_step"] = decode_step_time(draft, context)
    decode = seconds[f"verify_{verify_sizes[0]}"]
    return {"context": context, "decode_s": decode,
            "pieces": [{"piece": k, "seconds": v, "over_decode": v / decode}
                       for k, v in seconds.items()]}


def side_branch_tree(n: int) -> np.ndarray:
    """Parents (n,) of a best-first-like tree: a trunk, each trunk node with one side child."""
    parents: list[int] = []
    trunk = -1
    while len(parents) < n:
        parents.append(trunk)
        trunk = len(parents) - 1
        if len(parents) < n:
            parents.append(parents[trunk])  # a sibling of the trunk node
    return np.array(parents, dtype=np.int64)


def tree_costs(target, nodes: Sequence[int] = TREE_NODES, context: int = 300,
               min_time: float = 0.05, repeats: int = 5) -> list[dict]:
    """Tree verification cost in decode steps, on the active backend.

    For each ``n`` in ``nodes``: one target step over ``[root, n nodes]`` shaped by
    :func:`side_branch_tree` (``Transformer.step(tree_parents=...)``, each node seeing its
    ancestors) and a causal chain of the same ``n + 1`` positions, both over a decode step at
    ``context`` committed positions, timed one after the other.

    Returns
    -------
    list of dict
        ``nodes``, ``depth``, ``tree_steps``, ``chain_steps``, ``tree_over_chain`` and the
        decode step ``decode_s``.
    """
    from fastspec.kernels.tree_shape import block_parents, tree_depths

    cache = target.new_cache(context + max(nodes) + 1)
    target.step(prompt_tokens(context, target.config.vocab_size), cache)

    def call(ids, parents=None):
        def run():
            target.step(ids, cache, tree_parents=parents)
            cache.crop(context)
        return run

    decode = timeit(call(np.array([1], dtype=np.int64)), min_time=min_time, repeats=repeats)
    rows = []
    for n in nodes:
        ids = np.full(n + 1, 1, dtype=np.int64)
        shape = side_branch_tree(n)
        tree = timeit(call(ids, block_parents(shape)), min_time=min_time, repeats=repeats)
        chain = timeit(call(ids), min_time=min_time, repeats=repeats)
        rows.append({"nodes": n, "depth": int(tree_depths(shape).max()), "decode_s": decode,
                     "tree_steps": tree / decode, "chain_steps": chain / decode,
                     "tree_over_chain": tree / chain})
    return rows


def smollm_config(max_seq_len: int = 512 + 32, **overrides) -> ModelConfig:
    """Return a config shaped like SmolLM-135M (vocab 49152, dim 576, 30 layers, 9/3 heads of
    64, ffn 1536, tied, RMSNorm/RoPE/SwiGLU, rope_theta 10000) for random-weight benchmarks."""
    fields = dict(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                  ffn_dim=1536, tie_embeddings=True, rope_theta=10000.0, norm_eps=1e-5,
                  max_seq_len=max_seq_len)
    fields.update(overrides)
    return ModelConfig(**fields)


def storage_costs(model, context: int = 300, sizes: Sequence[int] = (1, 2, 4, 8, 12, 16),
                  weight_dtypes: Sequence[str] = ("float32", "float16", "bfloat16"),
                  min_time: float = 0.05, repeats: int = 5) -> list[dict]:
    """Verification cost vs weight storage: ``verify_n`` in decode steps per ``weight_dtype``.

    For each storage dtype, ``model`` is converted (:meth:`~fastspec.Transformer.with_weight_dtype`)
    and timed on the active backend at ``context`` committed positions: a decode step (one
    position) and target forwards of ``n`` positions for each ``n`` in ``sizes``, plus the
    decode step against the stream bound at the weights' footprint (weight bytes over the
    streaming rate measured at that many bytes, :func:`stream_rate`).

    Returns
    -------
    list of dict
        One row per dtype: ``weight_dtype``, ``weight_bytes``, ``decode_s``,
        ``stream_footprint_GBps``, ``stream_bound_s``, ``fraction_of_bound`` (bound / decode:
        1 means the step streams its weights at the measured rate) and ``verify`` = {n:
        seconds / decode_s}.
    """
    rows = []
    for wdt in weight_dtypes:
        m = model.with_weight_dtype(wdt)
        cache = m.new_cache(context + max(sizes) + 1)
        m.forward(prompt_tokens(context, m.config.vocab_size), cache)
        times = {}
        for n in sorted(set(sizes) | {1}):
            block = np.full(n, 1)

            def verify(block=block):
                m.forward(block, cache)
                cache.crop(context)
            times[n] = timeit(verify, min_time=min_time, repeats=repeats)
        weight_bytes = m.n_params * m.config.matrix_itemsize
        rate = stream_rate(weight_bytes)
        bound = weight_bytes / (rate * 1e9)
        rows.append({"weight_dtype": wdt, "weight_bytes": weight_bytes, "context": context,
                     "decode_s": times[1], "stream_footprint_GBps": rate,
                     "stream_bound_s": bound, "fraction_of_bound": bound / times[1],
                     "verify": {n: times[n] / times[1] for n in sizes}})
        del m, cache
    return rows


def storage_costs_text(rows: list[dict], label: str) -> list[str]:
    """Lines of a :func:`storage_costs` table (verify_n in decode steps)."""
    sizes = list(rows[0]["verify"]) if rows else []
    lines = [f"{label}: weights  decode_ms  GB/s(footprint)  of-bound  "
             + "  ".join(f"v{n:<3d}" for n in sizes)]
    for r in rows:
        lines.append(f"{label}: {r['weight_dtype']:<8} {1e3 * r['decode_s']:9.2f}  "
                     f"{r['stream_footprint_GBps']:15.1f}  {r['fraction_of_bound']:8.0%}  "
                     + "  ".join(f"{r['verify'][n]:4.2f}" for n in sizes))
    return lines
