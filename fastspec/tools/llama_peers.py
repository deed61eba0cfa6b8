"""fastspec against llama.cpp (llama-cpp-python) on one GGUF file, prompt and thread count.

The real SmolLM2-135M-Instruct Q4_1 file (:func:`fastspec.models.find`), loaded natively by
fastspec (``weight_dtype="q4_1"``: the file's own blocks) and by llama.cpp; greedy decoding of
the grounded requests (:func:`fastspec.tools.eval_suites.suite`), each rendered once by the
file's chat template and fed to both as token ids. Four methods, interleaved request by
request so that each sees the same machine: llama.cpp vanilla, llama.cpp prompt lookup
(``LlamaPromptLookupDecoding``), fastspec vanilla and fastspec n-gram. Tokens/s are end to end
(prompt included, for both), medians over the requests. Issue 29's goals: fastspec vanilla /
llama.cpp vanilla >= 2, fastspec n-gram / llama.cpp vanilla >= 4 and / its prompt lookup >= 3.

Needs ``llama_cpp`` (the ``[peers]`` extra, which compiles llama.cpp: minutes) and the
``[gguf]`` extra.
"""
from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["llama_peers", "llama_peers_text", "llama_peers_markdown", "goal_ratios", "METHODS"]

#: The compared methods, in the order each request runs them.
METHODS = ("llama_vanilla", "llama_lookup", "fastspec_vanilla", "fastspec_ngram")


def _llama(path, threads: int, lookup: bool, extra_bufts: bool):
    """A ``llama_cpp.Llama`` on ``path``; ``extra_bufts=False`` turns llama.cpp's extra buffer
    types (its AMX and repacked weight buffers) off."""
    import llama_cpp
    from llama_cpp import llama_cpp as low  # the bindings module that Llama() calls
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None
    defaults = low.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = extra_bufts
        return p

    low.llama_model_default_params = params  # Llama() reads it when it loads the model
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=threads,
                               n_threads_batch=threads, n_batch=512, draft_model=draft,
                               verbose=False, seed=0)
    finally:
        low.llama_model_default_params = defaults


def _default_extra_bufts() -> bool:
    """``FASTSPEC_PEERS_EXTRA_BUFTS`` if set (``0`` off), else off on CPUs with AMX-INT8, where
    llama.cpp's AMX buffer crashed (see :func:`llama_peers`), and on elsewhere."""
    env = os.environ.get("FASTSPEC_PEERS_EXTRA_BUFTS")
    if env is not None:
        return env.strip() != "0"
    from fastspec.kernels import isa_info

    return not isa_info()["features"].get("amx_int8", False)


def _llama_rate(llm, ids: list[int], new_tokens: int) -> float:
    llm.reset()
    t0 = time.perf_counter()
    out = llm.create_completion(ids, max_tokens=new_tokens, temperature=0.0, top_k=1,
                                top_p=1.0, repeat_penalty=1.0)
    return out["usage"]["completion_tokens"] / (time.perf_counter() - t0)


def _fastspec_rate(model, drafter, ids: list[int], new_tokens: int, eos) -> tuple[float, float]:
    from fastspec.decoding import generate, speculative_generate

    t0 = time.perf_counter()
    if drafter is None:
        res = generate(model, ids, new_tokens, eos_token_id=eos)
        tau = 1.0
    else:
        res = speculative_generate(model, drafter, ids, new_tokens, gamma="adaptive",
                                   eos_token_id=eos)
        tau = res.stats.mean_accepted_length
    return len(res.tokens) / (time.perf_counter() - t0), tau


def llama_peers(path=None, threads: int = 1, requests: int = 4, new_tokens: int = 128,
                extra_bufts: bool | None = None) -> dict:
    """Time the four :data:`METHODS` on the grounded requests, interleaved; return a report.

    Parameters
    ----------
    path : path-like, optional
        The GGUF file (default: the SmolLM2-135M-Instruct file, ``fastspec.models.find``).
    threads : int
        Threads of both libraries (fastspec's is restored afterwards).
    requests : int
        How many grounded requests (from the first).
    new_tokens : int
        Longest reply of each method.
    extra_bufts : bool, optional
        llama.cpp's extra buffer types; default from ``FASTSPEC_PEERS_EXTRA_BUFTS`` (``1`` on,
        ``0`` off), else on except on CPUs with AMX-INT8: on the Intel Xeon KVM guest of
        2026-12-02 a llama-cpp-python 0.3.36 build with ``GGML_NATIVE=ON`` segfaulted in its
        first decode with them on (its AMX buffer) and ran its AVX-512 kernels with them off.

    Returns
    -------
    dict
        ``rows`` (method, tokens_per_s median, per request), the three ratios, ``tau_ngram``,
        ``threads``, ``requests``, ``llama_cpp`` (version), ``extra_bufts``, ``load_average``.

    Raises
    ------
    ImportError
        Without ``llama_cpp``.
    """
    import llama_cpp

    from fastspec.drafters import NgramDrafter
    from fastspec.kernels import get_threads, set_threads
    from fastspec.models.catalog import find
    from fastspec.models.pretrained import load_pretrained
    from fastspec.tools.eval_suites import suite

    if extra_bufts is None:
        extra_bufts = _default_extra_bufts()
    path = find("smollm2") if path is None else path
    before = get_threads()
    set_threads(threads)
    try:
        model, tok = load_pretrained(path, weight_dtype="q4_1")
        eos = tok.stop_ids[0] if tok.stop_ids else None
        llm = {"llama_vanilla": _llama(path, threads, False, extra_bufts),
               "llama_lookup": _llama(path, threads, True, extra_bufts)}
        rates: dict[str, list[float]] = {m: [] for m in METHODS}
        taus = []
        load = [os.getloadavg()[0]]
        for request in suite("grounded")[:requests]:
            ids = tok.apply_chat_template([{"role": "user", "content": request.message}],
                                          add_generation_prompt=True, tokenize=True)
            for name, lm in llm.items():  # interleaved: the four methods on one request
                rates[name].append(_llama_rate(lm, ids, new_tokens))
            rates["fastspec_vanilla"].append(_fastspec_rate(model, None, ids, new_tokens,
                                                            eos)[0])
            rate, tau = _fastspec_rate(model, NgramDrafter.tuned(), ids, new_tokens, eos)
            rates["fastspec_ngram"].append(rate)
            taus.append(tau)
            load.append(os.getloadavg()[0])
    finally:
        set_threads(before)
    med = {m: float(np.median(v)) for m, v in rates.items()}
    return {"rows": [{"method": m, "tokens_per_s": med[m], "per_request": rates[m]}
                     for m in METHODS],
            "vanilla_ratio": med["fastspec_vanilla"] / med["llama_vanilla"],
            "ngram_over_llama_vanilla": med["fastspec_ngram"] / med["llama_vanilla"],
            "ngram_over_llama_lookup": med["fastspec_ngram"] / med["llama_lookup"],
            "tau_ngram": float(np.median(taus)), "threads": threads, "requests": len(taus),
            "new_tokens": new_tokens, "llama_cpp": getattr(llama_cpp, "__version__", "?"),
            "extra_bufts": extra_bufts, "load_average": load}


def goal_ratios(report: dict) -> list[tuple[str, float, str]]:
    """``(name, value, goal)`` of each ratio of a :func:`llama_peers` report and its issue-29
    goal (``">= 2"``...): the one place those goals are written."""
    return [("fastspec vanilla / llama.cpp vanilla", report["vanilla_ratio"], ">= 2"),
            ("fastspec n-gram / llama.cpp vanilla", report["ngram_over_llama_vanilla"], ">= 4"),
            ("fastspec n-gram / llama.cpp prompt lookup", report["ngram_over_llama_lookup"],
             ">= 3")]


def llama_peers_text(report: dict) -> list[str]:
    """Lines of a :func:`llama_peers` report."""
    out = [f"llama.cpp peers {r['method']:<17} threads {report['threads']}: "
           f"{r['tokens_per_s']:6.1f} tok/s" for r in report["rows"]]
    out += [f"llama.cpp peers {name}: {value:.2f}x (goal {goal})"
            for name, value, goal in goal_ratios(report)]
    return out


def llama_peers_markdown(report: dict) -> list[str]:
    """The PERFORMANCE.md section of a :func:`llama_peers` report (Markdown lines)."""
    out = ["## The real GGUF file vs llama.cpp", "",
           f"SmolLM2-135M-Instruct Q4_1 (fastspec: the file's own blocks), llama-cpp-python "
           f"{report['llama_cpp']} (extra buffer types {'on' if report['extra_bufts'] else 'off'}"
           f"), {report['threads']} thread(s) each, greedy, {report['requests']} grounded "
           f"requests, at most {report['new_tokens']} new tokens, interleaved request by "
           f"request; medians of end-to-end tokens/s (prompt included); n-gram tau "
           f"{report['tau_ngram']:.2f}; load average {min(report['load_average']):.1f}-"
           f"{max(report['load_average']):.1f}.", "", "| method | tokens/s |", "|---|---|"]
    out += [f"| {r['method']} | {r['tokens_per_s']:.1f} |" for r in report["rows"]]
    out += ["", "| ratio | measured | goal |", "|---|---|---|"]
    out += [f"| {name} | {value:.2f}x | {goal} |" for name, value, goal in goal_ratios(report)]
    return out
