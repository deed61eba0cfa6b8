"""``fastspec bench``: the machine's limits, scaling, Cython vs NumPy, and peers, in one run.

Every figure is measured in the run that reports it; ratios compare cases timed in the same
process one after the other. Results are written as JSON; with the ``[plot]`` extra, PNG plots
are drawn from that JSON by :mod:`fastspec.tools.plots`.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable, Sequence

from fastspec.decoding import generate, speculative_generate
from fastspec.drafters import DraftModelDrafter
from fastspec.drafters.dflash import DFlashDrafter
from fastspec.formats import json_io
from fastspec.kernels import available_backends, using_backend
from fastspec.model import ModelConfig, Transformer
from fastspec.tools.progress import Progress
from fastspec.tools.machine import attention_rates, decode_bound, kernel_ratios, machine_limits
from fastspec.tools.markdown import keep_dated, performance_markdown, summary_text
from fastspec.tools.peers import peers
from fastspec.tools.rounds import (decode_step_time, prompt_tokens, round_costs, smollm_config,
                                   storage_costs, tree_costs)

__all__ = ["context_scaling", "gamma_scaling", "run", "bench_main"]


# --- models ---------------------------------------------------------------------------------

def _models(prefer_pretrained: bool = True):
    """Return ``(target, draft, dflash_or_None, source)``: the embedded models, else random ones."""
    from fastspec.models import pretrained

    if prefer_pretrained and pretrained.available():
        b = pretrained.load()
        return b.target, b.draft, b.dflash, "embedded"
    cfg = ModelConfig.tiny_llama()
    target = Transformer.random(cfg, seed=0)
    draft = Transformer.random(cfg.replace(n_layers=1), seed=1)
    return target, draft, None, "random tiny Llama"


def _with_context(model, max_seq_len: int):
    """Return ``model`` rebuilt with room for ``max_seq_len`` positions (RoPE models only)."""
    if model.config.max_seq_len >= max_seq_len or model.config.positional != "rope":
        return model
    cfg = model.config.replace(max_seq_len=max_seq_len)
    return Transformer.from_state_dict(cfg, model.state_dict())


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
    figures are the cost of decoding at that context length; ``tau`` (tokens a target call,
    of the fastest speculative run) tells a drafter that stops predicting from slow kernels.
    """
    target = _with_context(target, max(contexts) + new_tokens + 16)
    draft = _with_context(draft, max(contexts) + new_tokens + 16)
    rows = []
    for name in available_backends():
        with using_backend(name):
            for ctx in contexts:
                ids = prompt_tokens(ctx, target.config.vocab_size)
                van, _ = _per_token(lambda n: generate(target, ids, n), new_tokens,
                                    vanilla=True)
                spec, stats = _per_token(lambda n: speculative_generate(
                    target, DraftModelDrafter(draft), ids, n, gamma=gamma), new_tokens)
                rows.append({"backend": name, "context": ctx,
                             "vanilla_ms_per_token": 1e3 * van,
                             "speculative_ms_per_token": 1e3 * spec, "speedup": van / spec,
                             "tau": stats.mean_accepted_length})
                if progress:
                    progress.update(f"{name} context {ctx}")
    return rows


def gamma_scaling(target, draft, dflash, gammas: Sequence[int] = (1, 2, 4, 8, 16),
                  new_tokens: int = 129, progress: Progress | None = None) -> list[dict]:
    """Speedup over vanilla vs gamma (draft model) and block size (DFlash), per backend.

    Decoding cost only (prefill excluded, see :func:`_per_token`); tau from the full run.
    """
    rows = []
    ids = prompt_tokens(256, target.config.vocab_size)
    for name in available_backends():
        with using_backend(name):
            van, _ = _per_token(lambda n: generate(target, ids, n), new_tokens, vanilla=True)
            for g in gammas:
                runs = {"draft": lambda n: speculative_generate(
                    target, DraftModelDrafter(draft), ids, n, gamma=g)}
                if dflash is not None and g < 16:
                    runs["dflash"] = lambda n: speculative_generate(
                        target, DFlashDrafter(dflash), ids, n,
                        gamma=min(g, dflash.config.block_size - 1))
                for drafter, fn in runs.items():
                    t, stats = _per_token(fn, new_tokens)
                    tau = stats.mean_accepted_length
                    eff = g if drafter == "draft" else min(g, dflash.config.block_size - 1)
                    rows.append({"backend": name, "drafter": drafter, "gamma": eff,
                                 "speedup": van / t, "tau": tau, "ms_per_token": 1e3 * t})
                if progress:
                    progress.update(f"{name} gamma {g}")
    return rows


def _real_peers() -> dict:
    """:func:`~fastspec.tools.real_peers.real_peers` on a random SmolLM-135M BF16 folder."""
    import tempfile

    from fastspec.tools.bench_real import REAL_SHAPES, write_random_folder
    from fastspec.tools.real_peers import real_peers

    with tempfile.TemporaryDirectory(prefix="fastspec-peers-") as tmp:
        write_random_folder(REAL_SHAPES["SmolLM-135M"], tmp)
        return {"shape": "SmolLM-135M", **real_peers(tmp)}


# --- driver ---------------------------------------------------------------------------------

def run(full: bool = False, with_peers: bool = False, progress: bool = True) -> dict:
    """Run the suite and return the JSON-ready report."""
    from fastspec.tools.environment import environment

    contexts = (64, 256, 1024, 2048, 4096) if full else (64, 512, 2048)
    gammas = (1, 2, 4, 8, 16) if full else (1, 4, 8)
    backends = available_backends()
    steps = 6 + len(backends) * (len(contexts) + len(gammas)) + (1 if with_peers else 0)
    bar = Progress(steps, "bench") if progress else None
    tick = (lambda what: bar.update(what)) if bar else (lambda what: None)
    report = {"environment": environment(), "mode": "full" if full else "quick"}
    fastest = "cython" if "cython" in backends else "numpy"
    with using_backend(fastest):
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
            with using_backend(name):
                step = decode_step_time(target, 64)
            bounds.append({"backend": name, **decode_bound(target, report["machine"], step)})
        report["decode_bound"] = bounds
        tick("decode bound")
        report["round_costs"] = {"backend": fastest, **round_costs(target, draft, dflash)}
        # verify_n per weight storage; the SmolLM-135M shape (random, built in bf16) with --full
        report["storage_costs"] = {"target": storage_costs(target, 300)}
        if full:
            smol = Transformer.random(smollm_config(weight_dtype="bfloat16"), seed=0)
            report["storage_costs"]["smollm135m_shape"] = storage_costs(smol, 512)
            del smol
        tick("round costs")
        # Tree verification (nodes 8..64) vs a chain of as many positions, in decode steps
        report["tree_costs"] = []
        for name in backends:
            with using_backend(name):
                report["tree_costs"] += [{"backend": name, **r} for r in tree_costs(target)]
        tick("tree costs")
        report["context_scaling"] = context_scaling(target, draft, contexts, progress=bar)
        report["gamma_scaling"] = gamma_scaling(target, draft, dflash, gammas, progress=bar)
        if full:  # random SmolLM-135M / Qwen3-0.6B folders: load, peak RSS, step vs stream
            from fastspec.tools.bench_real import real_size_rows

            report["real_size"] = real_size_rows(threads=(1, 2))
            try:  # the SmolLM-135M shape as a BF16 folder, both libraries loading it
                report["real_peers"] = _real_peers()
            except ImportError as exc:
                report["real_peers_skipped"] = f"needs the [hf] extra: {exc}"
    if with_peers:  # on the caller's backend
        try:
            tiny = Transformer.random(ModelConfig.tiny_llama(), 0)
            tiny_draft = Transformer.random(ModelConfig.tiny_llama(n_layers=1), 1)
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
        try:  # the real GGUF file against llama.cpp ([peers] and [gguf] extras)
            from fastspec.tools.llama_peers import llama_peers

            report["llama_peers"] = llama_peers()
        except (ImportError, FileNotFoundError, KeyError) as exc:
            report["llama_peers_skipped"] = f"needs llama-cpp-python and the SmolLM2 file: {exc}"
        tick("peers")
    return report


def bench_main(args) -> int:
    """Entry point of ``fastspec bench``."""
    report = run(full=args.full, with_peers=args.peers, progress=not args.quiet)
    Path(args.out).write_text(json_io.dumps(report, indent=1, default=float))
    print(f"wrote {args.out}", file=sys.stderr)
    print(summary_text(report))
    if args.markdown:  # the new headline; what the file measured elsewhere stays, dated
        md = Path(args.markdown)
        text = performance_markdown(report, args.plot_dir)
        md.write_text(keep_dated(md.read_text(), text) if md.is_file() else text)
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
