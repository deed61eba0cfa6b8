"""fastspec vs transformers at a real size: greedy decoding of one BF16 Hugging Face folder.

The folder (a random SmolLM-135M shape by default, :mod:`fastspec.tools.bench_real`) is loaded
by both libraries from the same file: transformers in bfloat16 and in float32, fastspec with
its matrices in bfloat16 (bf16 storage, float32 sums) and in float32. Each system generates
the same greedy continuation of the same prompt; runs are interleaved (every system once per
repeat, at each thread count) and the best wall time of each is kept, prefill included for
all. Outputs are compared token for token: fastspec float32 and transformers float32 compute
the same function of the same weights; the bf16 pair round differently (transformers rounds
every activation to bf16, fastspec only the inputs of its products), so they may part.
"""
from __future__ import annotations

import os
import time

import numpy as np

from fastspec.decoding import generate
from fastspec.model import Transformer
from fastspec.tools.rounds import prompt_tokens

__all__ = ["real_peers", "real_peers_text", "real_peers_markdown"]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def real_peers(folder, new_tokens: int = 64, prompt_len: int = 64, threads=(1, 2),
               repeats: int = 2) -> dict:
    """Greedy tokens/s of fastspec and transformers on ``folder``; ratios and equality.

    Returns
    -------
    dict
        ``rows``: one per system and thread count (``tokens_per_s``, the best of
        ``repeats``; ``all_tokens_per_s``; ``load_average`` before each run), ``ratios``:
        fastspec bf16 over each transformers dtype per thread count, ``identical``: token
        equality of the pairs.
    """
    import torch
    import transformers

    from fastspec.kernels import get_threads, set_threads

    fs_threads = get_threads()
    load = lambda dt: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
        folder, dtype=dt).eval()
    hf = {"transformers bf16": load(torch.bfloat16), "transformers float32": load(torch.float32)}
    for m in hf.values():
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = m.config.vocab_size - 1
    fsm = {"fastspec bf16": Transformer.load(folder, weight_dtype="bfloat16"),
           "fastspec float32": Transformer.load(folder, weight_dtype="float32")}
    ids = prompt_tokens(prompt_len, next(iter(fsm.values())).config.vocab_size)
    inp = torch.tensor(np.asarray(ids)[None, :], dtype=torch.long)

    def run_hf(m):
        with torch.inference_mode():
            out = m.generate(inp, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, attention_mask=torch.ones_like(inp))
        return out[0, inp.shape[1]:].tolist()

    systems = {**{k: (lambda m=m: run_hf(m)) for k, m in hf.items()},
               **{k: (lambda m=m: list(generate(m, ids, new_tokens).tokens))
                  for k, m in fsm.items()}}
    times: dict[tuple[str, int], list[float]] = {}
    loads: dict[tuple[str, int], list[float]] = {}
    tokens: dict[str, list[int]] = {}
    for t in threads:  # warm-up at each thread count
        torch.set_num_threads(t)
        set_threads(t)
        for fn in systems.values():
            fn()
    for _ in range(repeats):
        for t in threads:
            torch.set_num_threads(t)
            set_threads(t)
            for name, fn in systems.items():
                loads.setdefault((name, t), []).append(os.getloadavg()[0])
                t0 = time.perf_counter()
                tokens[name] = fn()
                times.setdefault((name, t), []).append(time.perf_counter() - t0)
    set_threads(fs_threads)
    rows = [{"system": name, "threads": t, "tokens_per_s": new_tokens / min(v),
             "all_tokens_per_s": [new_tokens / x for x in v], "load_average": loads[(name, t)]}
            for (name, t), v in times.items()]
    rate = {key: new_tokens / min(v) for key, v in times.items()}
    ratios: list[dict] = [{"threads": t, "over": other,
                           "ratio": rate[("fastspec bf16", t)] / rate[(other, t)]}
                          for t in threads for other in hf]
    best = lambda name: max(rate[(name, t)] for t in threads)  # noqa: E731
    ratios += [{"threads": "best", "over": other, "ratio": best("fastspec bf16") / best(other)}
               for other in hf]
    pairs = [("fastspec float32", "transformers float32"), ("fastspec bf16", "transformers bf16"),
             ("fastspec bf16", "transformers float32"), ("fastspec bf16", "fastspec float32")]
    identical = [{"a": a, "b": b, "identical": tokens[a] == tokens[b],
                  "first_difference": _first_difference(tokens[a], tokens[b])} for a, b in pairs]
    return {"folder": str(folder), "transformers": transformers.__version__,
            "torch": torch.__version__, "new_tokens": new_tokens, "prompt_len": prompt_len,
            "repeats": repeats, "rows": rows, "ratios": ratios, "identical": identical}


def real_peers_text(report: dict) -> list[str]:
    """Lines of a :func:`real_peers` report."""
    out = [f"real peers {r['system']:<22} threads {r['threads']}: {r['tokens_per_s']:6.1f} tok/s "
           f"(load avg {max(r['load_average']):.2f})" for r in report["rows"]]
    out += [f"real peers fastspec bf16 / {r['over']} (threads {r['threads']}): {r['ratio']:.2f}x"
            for r in report["ratios"]]
    out += [f"real peers identical {r['a']} vs {r['b']}: {r['identical']}"
            + ("" if r["identical"] else f" (first difference at {r['first_difference']})")
            for r in report["identical"]]
    return out


def real_peers_markdown(report: dict) -> list[str]:
    """The PERFORMANCE.md section of a :func:`real_peers` report (Markdown lines)."""
    out = [f"## Greedy decoding at the {report.get('shape', 'real')} shape vs transformers", "",
           f"One random BF16 folder loaded by both; transformers {report['transformers']}, torch "
           f"{report['torch']}; prompt {report['prompt_len']} tokens, {report['new_tokens']} new "
           f"tokens, wall time including the prefill, best of {report['repeats']} interleaved "
           "runs.", "", "| system | threads | tokens/s | load avg |", "|---|---|---|---|"]
    out += [f"| {r['system']} | {r['threads']} | {r['tokens_per_s']:.1f} | "
            f"{max(r['load_average']):.1f} |" for r in report["rows"]]
    out += ["", "| fastspec bf16 over | threads | ratio |", "|---|---|---|"]
    out += [f"| {r['over']} | {r['threads']} | {r['ratio']:.2f}x |" for r in report["ratios"]]
    out += ["", "| outputs | identical |", "|---|---|"]
    out += [f"| {r['a']} vs {r['b']} | "
            + ("yes" if r["identical"] else f"no (first at {r['first_difference']})") + " |"
            for r in report["identical"]]
    return out
