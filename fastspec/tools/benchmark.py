"""``fastspec bench``: the machine's limits, scaling, Cython vs NumPy, and peers, in one run.

Every figure is measured in the run that reports it; ratios compare cases timed in the same
process one after the other. Results are written as JSON; with the ``[plot]`` extra, PNG plots
are drawn from that JSON by :mod:`fastspec.tools.plots`.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

import fastspec as fs
from fastspec._progress import Progress

__all__ = ["timeit", "machine_limits", "attention_rates", "kernel_ratios", "decode_bound",
           "stream_rate", "context_scaling", "gamma_scaling", "peers", "run", "bench_main",
           "storage_costs", "smollm_config"]


# --- timing ---------------------------------------------------------------------------------

def timeit(fn: Callable[[], object], min_time: float = 0.05, repeats: int = 5) -> float:
    """Return the best, over ``repeats``, of the mean seconds per call of ``fn``.

    Each repeat calls ``fn`` as many times as fit in ``min_time`` (at least once) after one
    warm-up call. The minimum is the figure least disturbed by other processes.
    """
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    loops = max(1, int(min_time / once))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best


# --- the machine ----------------------------------------------------------------------------

def machine_limits(quick: bool = True) -> dict:
    """Measure streaming read bandwidth (cache-resident and DRAM-sized) and float32 GEMM.

    Streaming reads use BLAS ``sdot`` over two float32 arrays (it reads both once and does
    two flops per 8 bytes, so it is bandwidth-bound); the cache-resident case uses 2 x 512 KiB,
    the DRAM case 2 x 128 MiB (2 x 512 MiB with ``quick=False``).
    """
    out = {}
    small = np.ones(128 * 1024, np.float32)
    small_b = np.ones_like(small)
    t = timeit(lambda: small @ small_b, min_time=0.05)
    out["stream_cache_GBps"] = 2 * small.nbytes / t / 1e9
    n_big = (128 if quick else 512) * 1024 * 1024 // 4
    big, big_b = np.ones(n_big, np.float32), np.ones(n_big, np.float32)
    t = timeit(lambda: big @ big_b, min_time=0.2, repeats=3)
    out["stream_dram_GBps"] = 2 * big.nbytes / t / 1e9
    del big, big_b
    n = 512 if quick else 1024
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    t = timeit(lambda: a @ a, min_time=0.1, repeats=3)
    out["gemm_f32_GFLOPs"] = 2 * n ** 3 / t / 1e9
    out["gemm_size"] = n
    return out


def attention_rates(lengths: Sequence[int] = (1024, 4096), n_heads: int = 8, head_dim: int = 64) -> list[dict]:
    """Time single-query float32 attention per backend; report effective GB/s of K and V read.

    Each length also times a BLAS ``sdot`` of the same two K and V arrays (``stream_GBps``):
    the streaming rate at attention's own footprint (16.8 MB at L = 4096, beyond a 2 MB L2),
    which is the memory bound that applies to it.
    """
    rng = np.random.default_rng(0)
    rows = []
    for length in lengths:
        q = rng.standard_normal((1, n_heads, head_dim)).astype(np.float32)
        k = rng.standard_normal((n_heads, length, head_dim)).astype(np.float32)
        v = rng.standard_normal((n_heads, length, head_dim)).astype(np.float32)
        kf, vf = k.reshape(-1), v.reshape(-1)
        t_stream = timeit(lambda: kf @ vf)
        stream = (k.nbytes + v.nbytes) / t_stream / 1e9
        for name in fs.available_backends():
            mod = fs.kernels.module(name)
            t = timeit(lambda: mod.attention(q, k, v, length))
            gbps = (k.nbytes + v.nbytes) / t / 1e9
            rows.append({"backend": name, "length": length, "seconds": t, "GBps": gbps,
                         "bytes": k.nbytes + v.nbytes, "stream_GBps": stream,
                         "fraction_of_stream": gbps / stream})
    return rows


def kernel_ratios() -> list[dict]:
    """Cython vs NumPy time of each kernel on the issue's benchmark shapes (float32)."""
    rng = np.random.default_rng(0)
    V, g = 32000, 8
    logits = rng.standard_normal((1, V)).astype(np.float32)
    p = rng.random((g + 1, V)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    q = rng.random((g, V)).astype(np.float32)
    q /= q.sum(1, keepdims=True)
    draft = rng.integers(0, V, g)
    u = rng.random(g + 1)
    qa = rng.standard_normal((1, 8, 64)).astype(np.float32)
    q9 = rng.standard_normal((9, 8, 64)).astype(np.float32)
    kc = rng.standard_normal((8, 1024, 64)).astype(np.float32)
    cache = np.zeros((8, 4096, 64), np.float32)
    new = rng.standard_normal((1, 8, 64)).astype(np.float32)
    cases = {
        "attention n=1 L=1024": lambda m: m.attention(qa, kc, kc, 1024),
        "attention n=9 L=1024": lambda m: m.attention(q9, kc, kc, 1024),
        "cache_write 1 pos": lambda m: m.cache_write(cache, new, 4000),
        "probs V=32000 top_p=0.9": lambda m: m.probs(logits, 1.0, 0, 0.9),
        "verify_rejection g=8 V=32000": lambda m: m.verify_rejection(draft, p, q, u),
        "verify_greedy g=8 V=32000": lambda m: m.verify_greedy(draft, p),
    }
    rows = []
    for case, fn in cases.items():
        times = {name: timeit(lambda: fn(fs.kernels.module(name))) for name in fs.available_backends()}
        row = {"case": case, **{f"{k}_s": v for k, v in times.items()}}
        if "cython" in times:
            row["speedup"] = times["numpy"] / times["cython"]
        rows.append(row)
    return rows


# --- models ---------------------------------------------------------------------------------

def _models(prefer_pretrained: bool = True):
    """Return ``(target, draft, dflash_or_None, source)``: the embedded models, else random ones."""
    from fastspec import pretrained

    if prefer_pretrained and pretrained.available():
        b = pretrained.load()
        return b.target, b.draft, b.dflash, "embedded"
    cfg = fs.ModelConfig.tiny_llama()
    target = fs.Transformer.random(cfg, seed=0)
    draft = fs.Transformer.random(cfg.replace(n_layers=1), seed=1)
    return target, draft, None, "random tiny Llama"


def _with_context(model, max_seq_len: int):
    """Return ``model`` rebuilt with room for ``max_seq_len`` positions (RoPE models only)."""
    if model.config.max_seq_len >= max_seq_len or model.config.positional != "rope":
        return model
    cfg = model.config.replace(max_seq_len=max_seq_len)
    return fs.Transformer.from_state_dict(cfg, model.state_dict())


def _prompt_tokens(length: int, vocab: int) -> np.ndarray:
    """Real text when the corpus is there, cut to ``length`` byte tokens."""
    try:
        from fastspec.corpus import load_bytes

        data = load_bytes("validation")
        if len(data) >= length:
            return np.asarray(data[:length], dtype=np.int64) % vocab
    except Exception:  # the corpus is a nicety here; random tokens time the same
        pass
    return np.random.default_rng(0).integers(0, min(vocab, 256), length)


def stream_rate(n_bytes: int) -> float:
    """Streaming read rate (GB/s) over ``n_bytes`` in all: BLAS ``sdot`` of two float32 arrays."""
    n = max(n_bytes // 8, 1024)
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    return (a.nbytes + b.nbytes) / timeit(lambda: a @ b) / 1e9


def decode_bound(model, limits: dict, step_s: float) -> dict:
    """Compare a measured decode step with the memory and compute bounds of its weights.

    The memory bound that applies is the weight bytes over the streaming rate measured at the
    weights' own footprint (``stream_footprint_GBps``: a 6 MB model does not fit in a 2 MB
    L2); the cache-resident and DRAM rates are reported beside it.
    """
    n_params = model.n_params
    weight_bytes = n_params * model.config.matrix_itemsize  # norms: negligible
    flops = 2 * n_params
    footprint = stream_rate(weight_bytes)
    t_mem = weight_bytes / (footprint * 1e9)
    t_mem_cache = weight_bytes / (limits["stream_cache_GBps"] * 1e9)
    t_mem_dram = weight_bytes / (limits["stream_dram_GBps"] * 1e9)
    t_compute = flops / (limits["gemm_f32_GFLOPs"] * 1e9)
    bound = max(t_mem, t_compute)
    return {"params": n_params, "weight_bytes": weight_bytes, "step_s": step_s,
            "stream_footprint_GBps": footprint, "bound_memory_s": t_mem,
            "bound_memory_cache_s": t_mem_cache, "bound_memory_dram_s": t_mem_dram,
            "bound_compute_s": t_compute,
            "binding": "memory" if t_mem >= t_compute else "compute",
            "achieved_fraction": bound / step_s}


def _decode_step_time(model, context: int) -> float:
    cache = model.new_cache()
    ids = _prompt_tokens(context, model.config.vocab_size)
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
    ids = _prompt_tokens(context, target.config.vocab_size)
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
    seconds["draft_step"] = _decode_step_time(draft, context)
    decode = seconds[f"verify_{verify_sizes[0]}"]
    return {"context": context, "decode_s": decode,
            "pieces": [{"piece": k, "seconds": v, "over_decode": v / decode}
                       for k, v in seconds.items()]}


def smollm_config(max_seq_len: int = 512 + 32, **overrides) -> "fs.ModelConfig":
    """Return a config shaped like SmolLM-135M (vocab 49152, dim 576, 30 layers, 9/3 heads of
    64, ffn 1536, tied, RMSNorm/RoPE/SwiGLU, rope_theta 10000) for random-weight benchmarks."""
    fields = dict(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                  ffn_dim=1536, tie_embeddings=True, rope_theta=10000.0, norm_eps=1e-5,
                  max_seq_len=max_seq_len)
    fields.update(overrides)
    return fs.ModelConfig(**fields)


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
        m.forward(_prompt_tokens(context, m.config.vocab_size), cache)
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


def _per_token(run: Callable[[int], object], new_tokens: int, vanilla: bool = False,
               repeats: int = 3) -> tuple[float, object]:
    """Seconds of decoding per generated token, prefill excluded (best of ``repeats``).

    Uses ``stats.decode_s`` (wall time after the prompt's forward). Vanilla decoding emits
    its first token from the prefill, so its decode time covers ``new_tokens - 1`` tokens; a
    speculative run decodes all ``new_tokens`` in its rounds. Returns the time and the stats
    of the fastest run.
    """
    best, best_stats = math.inf, None
    for _ in range(repeats):
        stats = run(new_tokens).stats
        t = stats.decode_s / max(stats.new_tokens - (1 if vanilla else 0), 1)
        if t < best:
            best, best_stats = t, stats
    return best, best_stats


def context_scaling(target, draft, contexts: Sequence[int], new_tokens: int = 33,
                    gamma: int = 4, progress: Progress | None = None) -> list[dict]:
    """Decode cost per token vs context length, vanilla and speculative, per backend.

    The prompt's prefill is excluded (``stats.decode_s``, see :func:`_per_token`), so the
    figures are the cost of decoding at that context length.
    """
    target = _with_context(target, max(contexts) + new_tokens + 16)
    draft = _with_context(draft, max(contexts) + new_tokens + 16)
    rows = []
    for name in fs.available_backends():
        fs.set_backend(name)
        for ctx in contexts:
            ids = _prompt_tokens(ctx, target.config.vocab_size)
            van, _ = _per_token(lambda n: fs.generate(target, ids, n), new_tokens, vanilla=True)
            spec, _ = _per_token(lambda n: fs.speculative_generate(
                target, fs.DraftModelDrafter(draft), ids, n, gamma=gamma), new_tokens)
            rows.append({"backend": name, "context": ctx, "vanilla_ms_per_token": 1e3 * van,
                         "speculative_ms_per_token": 1e3 * spec, "speedup": van / spec})
            if progress:
                progress.update(f"{name} context {ctx}")
    return rows


def gamma_scaling(target, draft, dflash, gammas: Sequence[int] = (1, 2, 4, 8, 16),
                  new_tokens: int = 129, progress: Progress | None = None) -> list[dict]:
    """Speedup over vanilla vs gamma (draft model) and block size (DFlash), per backend.

    Decoding cost only (prefill excluded, see :func:`_per_token`); tau from the full run.
    """
    rows = []
    ids = _prompt_tokens(256, target.config.vocab_size)
    for name in fs.available_backends():
        fs.set_backend(name)
        van, _ = _per_token(lambda n: fs.generate(target, ids, n), new_tokens, vanilla=True)
        for g in gammas:
            runs = {"draft": lambda n: fs.speculative_generate(target, fs.DraftModelDrafter(draft), ids,
                                                               n, gamma=g)}
            if dflash is not None and g < 16:
                runs["dflash"] = lambda n: fs.speculative_generate(
                    target, fs.DFlashDrafter(dflash), ids, n,
                    gamma=min(g, dflash.config.block_size - 1))
            for drafter, fn in runs.items():
                t, stats = _per_token(fn, new_tokens)
                tau = stats.mean_accepted_length
                eff = g if drafter == "draft" else min(g, dflash.config.block_size - 1)
                rows.append({"backend": name, "drafter": drafter, "gamma": eff, "speedup": van / t,
                             "tau": tau, "ms_per_token": 1e3 * t})
            if progress:
                progress.update(f"{name} gamma {g}")
    return rows


# --- peers ----------------------------------------------------------------------------------

class HFPair:
    """A fastspec target and draft exported to Hugging Face and loaded by ``transformers``.

    Generation is greedy, with no EOS, an explicit all-ones attention mask (the prompt may
    contain any id) and assisted generation fixed at 4 draft tokens per round, to match
    ``speculative_generate(gamma=4)``. ``target_calls`` counts the target's forward calls.
    """

    def __init__(self, target, draft, threads: int = 2) -> None:
        import tempfile

        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        with tempfile.TemporaryDirectory() as tmp:
            target.save(Path(tmp) / "target")
            draft.save(Path(tmp) / "draft")
            load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
                Path(tmp) / d, dtype=torch.float32).eval()
            self.target, self.draft = load("target"), load("draft")
        for m in (self.target, self.draft):
            m.generation_config.eos_token_id = None
            m.generation_config.pad_token_id = m.config.vocab_size - 1
        self.draft.generation_config.num_assistant_tokens = 4
        self.draft.generation_config.num_assistant_tokens_schedule = "constant"
        self.target_calls = 0
        self.target.register_forward_pre_hook(lambda *a: self._count())

    def _count(self) -> None:
        self.target_calls += 1

    def kwargs(self, pair: str) -> dict:
        """Extra ``generate`` arguments of ``pair``: greedy, assisted or lookup."""
        return {"greedy": {}, "assisted": {"assistant_model": self.draft},
                "lookup": {"prompt_lookup_num_tokens": 4}}[pair]

    def generate(self, ids, new_tokens: int, pair: str = "greedy") -> tuple[list[int], float, int]:
        """Return ``(new tokens, seconds, target forward calls)``."""
        torch = self.torch
        inp = torch.tensor(np.asarray(ids)[None, :], dtype=torch.long)
        self.target_calls = 0
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.target.generate(inp, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                       do_sample=False, attention_mask=torch.ones_like(inp),
                                       **self.kwargs(pair))
            dt = time.perf_counter() - t0
        return out[0, inp.shape[1]:].tolist(), dt, self.target_calls


def peers(target, draft, new_tokens: int = 256, prompt_len: int = 64, threads: int = 2) -> dict:
    """fastspec vs Hugging Face transformers on the same weights (needs the ``[hf]`` extra).

    Greedy ``generate``, assisted generation with the same draft, and prompt lookup, each
    compared on tokens/s, output equality and target forward calls.
    """
    import torch
    import transformers

    hf = HFPair(target, draft, threads)
    ids = _prompt_tokens(prompt_len, target.config.vocab_size)

    def fs_run(fn):
        fn()  # warm-up
        t0 = time.perf_counter()
        res = fn()
        dt = time.perf_counter() - t0
        calls_ = res.stats.target_calls if hasattr(res, "stats") and res.stats.target_calls else len(res.tokens)
        return list(res.tokens), dt, calls_

    pairs = {
        "greedy": (lambda: hf.generate(ids, new_tokens, "greedy"),
                   lambda: fs.generate(target, ids, new_tokens)),
        "assisted / draft model": (lambda: hf.generate(ids, new_tokens, "assisted"),
                                   lambda: fs.speculative_generate(target, fs.DraftModelDrafter(draft),
                                                                   ids, new_tokens, gamma=4)),
        "prompt lookup / n-gram": (lambda: hf.generate(ids, new_tokens, "lookup"),
                                   lambda: fs.speculative_generate(target, fs.NgramDrafter(max_ngram=3),
                                                                   ids, new_tokens, gamma=4)),
    }
    rows = []
    for name, (hf_fn, fs_fn) in pairs.items():
        hf_fn()  # warm-up
        hf_tokens, hf_dt, hf_calls = hf_fn()
        fs_tokens, fs_dt, fs_calls = fs_run(fs_fn)
        same = hf_tokens == fs_tokens
        first_diff = next((i for i, (a, b) in enumerate(zip(hf_tokens, fs_tokens)) if a != b), None)
        rows.append({"pair": name, "hf_tokens_per_s": new_tokens / hf_dt,
                     "fs_tokens_per_s": len(fs_tokens) / fs_dt, "ratio": (len(fs_tokens) / fs_dt) / (new_tokens / hf_dt),
                     "hf_target_calls": hf_calls, "fs_target_calls": fs_calls,
                     "identical": same, "first_difference": first_diff})
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "threads": threads, "new_tokens": new_tokens, "rows": rows}


# --- driver ---------------------------------------------------------------------------------

def run(full: bool = False, with_peers: bool = False, progress: bool = True) -> dict:
    """Run the suite and return the JSON-ready report."""
    from fastspec.tools.environment import environment

    contexts = (64, 256, 1024, 2048, 4096) if full else (64, 512, 2048)
    gammas = (1, 2, 4, 8, 16) if full else (1, 4, 8)
    backends = fs.available_backends()
    steps = 5 + len(backends) * (len(contexts) + len(gammas)) + (1 if with_peers else 0)
    bar = Progress(steps, "bench") if progress else None
    tick = (lambda what: bar.update(what)) if bar else (lambda what: None)
    previous = fs.backend()
    report = {"environment": environment(), "mode": "full" if full else "quick"}
    try:
        report["machine"] = machine_limits(quick=not full)
        tick("machine limits")
        report["attention"] = attention_rates()
        best = max((r for r in report["attention"] if r["length"] == 4096),
                   key=lambda r: r["GBps"])
        report["attention_fraction_of_cache_bandwidth"] = (best["GBps"]
                                                           / report["machine"]["stream_cache_GBps"])
        report["attention_fraction_of_stream"] = best["fraction_of_stream"]
        tick("attention")
        report["kernels"] = kernel_ratios()
        tick("kernels")
        target, draft, dflash, source = _models()
        report["models"] = {"source": source, "target_params": target.n_params,
                            "draft_params": draft.n_params}
        bounds = []
        for name in backends:
            fs.set_backend(name)
            step = _decode_step_time(target, 64)
            bounds.append({"backend": name, **decode_bound(target, report["machine"], step)})
        report["decode_bound"] = bounds
        tick("decode bound")
        fastest = "cython" if "cython" in backends else "numpy"
        fs.set_backend(fastest)
        report["round_costs"] = {"backend": fastest, **round_costs(target, draft, dflash)}
        # verify_n per weight storage; the SmolLM-135M shape (random, built in bf16) with --full
        report["storage_costs"] = {"target": storage_costs(target, 300)}
        if full:
            smol = fs.Transformer.random(smollm_config(weight_dtype="bfloat16"), seed=0)
            report["storage_costs"]["smollm135m_shape"] = storage_costs(smol, 512)
            del smol
        tick("round costs")
        report["context_scaling"] = context_scaling(target, draft, contexts, progress=bar)
        report["gamma_scaling"] = gamma_scaling(target, draft, dflash, gammas, progress=bar)
        if full:  # random SmolLM-135M / Qwen3-0.6B folders: load time, peak RSS, decode rate
            from fastspec.tools.bench_real import real_size_rows

            report["real_size"] = real_size_rows(dram_GBps=report["machine"]["stream_dram_GBps"])
        fs.set_backend(previous)
        if with_peers:
            try:
                tiny = fs.Transformer.random(fs.ModelConfig.tiny_llama(), 0)
                tiny_draft = fs.Transformer.random(fs.ModelConfig.tiny_llama(n_layers=1), 1)
                report["peers"] = [
                    {"models": "random tiny Llama", **peers(tiny, tiny_draft)},
                    # The same architecture with its matrices held as float16 values (as
                    # checkpoints ship): transformers loads them into float32, fastspec keeps
                    # them in float16 and computes in float32; the outputs are the same.
                    {"models": "random tiny Llama, float16 weights",
                     **peers(tiny.with_weight_dtype("float16"),
                             tiny_draft.with_weight_dtype("float16"))},
                ]
                if source == "embedded":
                    report["peers"].append({"models": "embedded", **peers(target, draft)})
            except ImportError as exc:
                report["peers"] = {"skipped": f"needs the [hf] extra: {exc}"}
            tick("peers")
    finally:
        fs.set_backend(previous)
    return report


def bench_main(args) -> int:
    """Entry point of ``fastspec bench``."""
    report = run(full=args.full, with_peers=args.peers, progress=not args.quiet)
    Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    print(f"wrote {args.out}", file=sys.stderr)
    print(summary_text(report))
    if args.markdown:
        Path(args.markdown).write_text(performance_markdown(report, args.plot_dir))
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot_dir:
        try:
            from fastspec.tools.plots import plot_report
        except ImportError as exc:
            print(f"plots skipped (install fastspec[plot]): {exc}", file=sys.stderr)
        else:
            for path in plot_report(report, args.plot_dir):
                print(f"wrote {path}", file=sys.stderr)
    return 0


def summary_text(report: dict) -> str:
    """A short human-readable summary of a report."""
    m = report["machine"]
    lines = [f"machine: stream {m['stream_cache_GBps']:.1f} GB/s (cache-resident), "
             f"{m['stream_dram_GBps']:.1f} GB/s (DRAM), GEMM {m['gemm_f32_GFLOPs']:.0f} GFLOP/s"]
    for r in report["attention"]:
        lines.append(f"attention L={r['length']:5d} {r['backend']:>6}: {r['GBps']:6.1f} GB/s "
                     f"({r['fraction_of_stream']:.0%} of a {r['stream_GBps']:.1f} GB/s stream "
                     "of the same bytes)")
    for r in report["kernels"]:
        if "speedup" in r:
            lines.append(f"kernel {r['case']:<30} cython/numpy speedup {r['speedup']:6.1f}x")
    for r in report["decode_bound"]:
        lines.append(f"decode step {r['backend']:>6}: {1e6 * r['step_s']:.0f} us, {r['binding']}-bound, "
                     f"{r['achieved_fraction']:.0%} of the bound")
    for name, rows in report.get("storage_costs", {}).items():
        lines += storage_costs_text(rows, f"verify_n/decode [{name}]")
    for r in report.get("peers", []) if isinstance(report.get("peers"), list) else []:
        for row in r["rows"]:
            lines.append(f"peers [{r['models']}] {row['pair']:<24} fastspec/transformers "
                         f"{row['ratio']:5.1f}x identical={row['identical']}")
    return "\n".join(lines)


def performance_markdown(report: dict, plot_dir: str | None = None) -> str:
    """Render a report as ``docs/PERFORMANCE.md`` (generated by ``fastspec bench --markdown``)."""
    env, m = report["environment"], report["machine"]
    out = ["# Performance", "",
           f"Generated by `fastspec bench{' --full' if report['mode'] == 'full' else ''}"
           f"{' --peers' if 'peers' in report else ''} --markdown docs/PERFORMANCE.md`; "
           "do not edit by hand. Every number below was measured in that one run.", "",
           f"Python {env['python']}, NumPy {env['numpy']}, {env['cpus']} CPUs "
           f"({env['processor'] or env['machine']}), run at {env['time_utc']} UTC. Models: "
           f"{report['models']['source']} (target {report['models']['target_params']:,} parameters, "
           f"draft {report['models']['draft_params']:,}).", "",
           "## The machine", "",
           "| measurement | value |", "|---|---|",
           f"| streaming read, cache-resident (2 x 512 KiB, BLAS dot) | {m['stream_cache_GBps']:.1f} GB/s |",
           f"| streaming read, DRAM-sized | {m['stream_dram_GBps']:.1f} GB/s |",
           f"| float32 GEMM ({m['gemm_size']}^3) | {m['gemm_f32_GFLOPs']:.0f} GFLOP/s |", "",
           "## Attention (1 query, 8 heads x 64, float32)", "",
           "| backend | keys | K+V bytes | time | effective K+V read rate | BLAS dot stream of "
           "the same arrays | fraction |", "|---|---|---|---|---|---|---|"]
    for r in report["attention"]:
        out.append(f"| {r['backend']} | {r['length']} | {r['bytes'] / 1e6:.1f} MB | "
                   f"{1e6 * r['seconds']:.0f} us | {r['GBps']:.1f} GB/s | {r['stream_GBps']:.1f} GB/s | "
                   f"{r['fraction_of_stream']:.0%} |")
    out += ["", f"At 4096 keys the best backend reaches "
            f"{report['attention_fraction_of_cache_bandwidth']:.0%} of the cache-resident streaming "
            "rate (2 x 512 KiB) and "
            f"{report['attention_fraction_of_stream']:.0%} of the streaming rate at its own "
            "footprint, the bound that applies (its K and V do not fit in a cache that fast).", "",
            "## Kernels: Cython vs the NumPy twin (float32)", "",
            "| kernel | cython | numpy | speedup |", "|---|---|---|---|"]
    for r in report["kernels"]:
        if "speedup" in r:
            out.append(f"| {r['case']} | {1e6 * r['cython_s']:.1f} us | {1e6 * r['numpy_s']:.1f} us | "
                       f"{r['speedup']:.1f}x |")
    out += ["", "## Decode step vs the bound of the target's weights (context 64)", "",
            "A decode step reads every weight once: the memory bound is weight bytes / the "
            "streaming rate measured at the weights' own footprint (a BLAS dot over arrays of "
            "the same total size); the compute bound is 2 x parameters / GEMM rate; the larger "
            "one binds. The cache-resident and DRAM bounds are shown for reference.", "",
            "| backend | weight bytes | step | memory bound (footprint stream) | (cache-resident) | "
            "(DRAM) | compute bound | binds | achieved |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in report["decode_bound"]:
        out.append(f"| {r['backend']} | {r['weight_bytes'] / 1e6:.1f} MB | {1e6 * r['step_s']:.0f} us | "
                   f"{1e6 * r['bound_memory_s']:.0f} us ({r['stream_footprint_GBps']:.1f} GB/s) | "
                   f"{1e6 * r['bound_memory_cache_s']:.0f} us | {1e6 * r['bound_memory_dram_s']:.0f} us | "
                   f"{1e6 * r['bound_compute_s']:.0f} us | {r['binding']} | {r['achieved_fraction']:.0%} |")
    rc = report.get("round_costs")
    if rc:
        out += ["", f"## What a speculative round costs (context {rc['context']}, "
                f"{rc['backend']} backend)", "",
                "Each piece of a round in target decode steps (a decode step here: "
                f"{1e6 * rc['decode_s']:.0f} us). A round drafting gamma tokens costs the "
                "drafter's pieces plus `verify_(gamma+1)`, and emits tau tokens: its speedup is "
                "at most tau / (round cost in decode steps).", "",
                "| piece | time | decode steps |", "|---|---|---|"]
        for r in rc["pieces"]:
            out.append(f"| {r['piece']} | {1e6 * r['seconds']:.0f} us | {r['over_decode']:.2f} |")
    out += ["", "## Decode cost vs context length (draft model, gamma 4; prefill excluded)", "",
            "| backend | context | vanilla ms/token | speculative ms/token | speedup |", "|---|---|---|---|---|"]
    for r in report["context_scaling"]:
        out.append(f"| {r['backend']} | {r['context']} | {r['vanilla_ms_per_token']:.2f} | "
                   f"{r['speculative_ms_per_token']:.2f} | {r['speedup']:.2f}x |")
    out += ["", "## Speedup vs gamma / block size (DFlash: gamma = tokens drafted per block, "
            "at most block size - 1)", "",
            "| backend | drafter | gamma | tau | ms/token | speedup |", "|---|---|---|---|---|---|"]
    for r in report["gamma_scaling"]:
        out.append(f"| {r['backend']} | {r['drafter']} | {r['gamma']} | {r['tau']:.2f} | "
                   f"{r['ms_per_token']:.2f} | {r['speedup']:.2f}x |")
    peers = report.get("peers")
    if isinstance(peers, list):
        out += ["", "## fastspec vs Hugging Face transformers (same weights, CPU)", ""]
        for p in peers:
            out += [f"{p['models']}: transformers {p['transformers']}, torch {p['torch']} "
                    f"({p['threads']} threads), {p['new_tokens']} new tokens.", "",
                    "| pair | transformers tok/s | fastspec tok/s | ratio | target calls (hf / fs) | identical |",
                    "|---|---|---|---|---|---|"]
            for r in p["rows"]:
                out.append(f"| {r['pair']} | {r['hf_tokens_per_s']:.1f} | {r['fs_tokens_per_s']:.1f} | "
                           f"{r['ratio']:.1f}x | {r['hf_target_calls']} / {r['fs_target_calls']} | "
                           f"{'yes' if r['identical'] else 'no (first at %s)' % r['first_difference']} |")
            out.append("")
    elif isinstance(peers, dict):
        out += ["", f"Peers skipped: {peers.get('skipped')}"]
    if plot_dir:
        out += ["", "## Plots", ""]
        for name in ("speedup_vs_context", "speedup_vs_gamma", "kernels_cython_vs_numpy"):
            out.append(f"![{name}]({Path(plot_dir).name}/{name}.png)")
    return "\n".join(out) + "\n"
