"""fastspec against llama.cpp (llama-cpp-python) on the same GGUF file, prompt and threads.

The real SmolLM2-135M-Instruct Q4_1 file, loaded natively by fastspec (``weight_dtype="q4_1"``:
the file's own blocks) and by llama.cpp; greedy decoding of the grounded requests
(:func:`fastspec.tools.eval_suites.suite`), rendered once by the file's chat template and fed
to both as token ids. Four methods, interleaved request by request so that each sees the same
machine: llama.cpp vanilla, llama.cpp prompt lookup (``LlamaPromptLookupDecoding``), fastspec
vanilla and fastspec n-gram. Tokens/s are end to end (prompt included, for both); ratios:
fastspec vanilla / llama.cpp vanilla (issue 29's goal >= 2), fastspec n-gram / llama.cpp vanilla
(>= 4) and / llama.cpp prompt lookup (>= 3).

Skipped unless ``llama_cpp`` is importable (``pip install "fastspec[peers]"``, which compiles
llama.cpp: minutes). Run: ``taskset -c 1 pytest bench/test_bench_quant_peers.py
--benchmark-only -s``; FASTSPEC_BENCH_THREADS sets the thread counts (default 1).
"""
import os
import time

import numpy as np
import pytest

import fastspec as fs

llama_cpp = pytest.importorskip("llama_cpp")

THREADS = tuple(int(t) for t in os.environ.get("FASTSPEC_BENCH_THREADS", "1").split(","))
NEW_TOKENS = int(os.environ.get("FASTSPEC_BENCH_NEW_TOKENS", "128"))
REQUESTS = int(os.environ.get("FASTSPEC_BENCH_REQUESTS", "4"))
#: FASTSPEC_PEERS_EXTRA_BUFTS=0 turns llama.cpp's extra buffer types off (its AMX and repacked
#: weight buffers): on the Intel Xeon KVM guest of 2026-12-02 a llama-cpp-python 0.3.36 build
#: with GGML_NATIVE=ON segfaulted in its first decode with them on (its AMX buffer), and ran
#: its AVX-512 CPU kernels with them off.
EXTRA_BUFTS = os.environ.get("FASTSPEC_PEERS_EXTRA_BUFTS", "1") != "0"


def _llama(path, threads: int, lookup: bool):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from llama_cpp import llama_cpp as low  # the bindings module that Llama() calls

    draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None
    defaults = low.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = EXTRA_BUFTS
        return p

    low.llama_model_default_params = params  # Llama() reads it when it loads the model
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=threads,
                               n_threads_batch=threads, n_batch=512, draft_model=draft,
                               verbose=False, seed=0)
    finally:
        low.llama_model_default_params = defaults


def _llama_run(llm, ids, eos):
    llm.reset()
    t0 = time.perf_counter()
    out = llm.create_completion(ids, max_tokens=NEW_TOKENS, temperature=0.0, top_k=1,
                                top_p=1.0, repeat_penalty=1.0)
    dt = time.perf_counter() - t0
    n = out["usage"]["completion_tokens"]
    return n / dt, n


def _fastspec_run(model, drafter, ids, eos):
    t0 = time.perf_counter()
    if drafter is None:
        res = fs.generate(model, ids, NEW_TOKENS, eos_token_id=eos)
    else:
        res = fs.speculative_generate(model, drafter, ids, NEW_TOKENS, gamma="adaptive",
                                      eos_token_id=eos)
    dt = time.perf_counter() - t0
    return len(res.tokens) / dt, len(res.tokens), res


@pytest.mark.parametrize("threads", THREADS)
def test_vs_llama_cpp(benchmark, threads):
    from fastspec.tools.eval_suites import suite

    try:
        path = fs.models.find("smollm2")
    except (KeyError, FileNotFoundError) as exc:
        pytest.skip(str(exc))
    fs.kernels.set_threads(threads)
    model, tok = fs.load_pretrained(path, weight_dtype="q4_1")
    eos = tok.stop_ids[0] if tok.stop_ids else None
    llm = {"llama_vanilla": _llama(path, threads, False),
           "llama_lookup": _llama(path, threads, True)}
    rates = {m: [] for m in ("llama_vanilla", "llama_lookup", "fastspec_vanilla",
                             "fastspec_ngram")}
    taus = []
    for request in suite("grounded")[:REQUESTS]:
        ids = tok.apply_chat_template([{"role": "user", "content": request.message}],
                                      add_generation_prompt=True, tokenize=True)
        for name, l in llm.items():  # interleaved: the four methods on one request in a row
            rates[name].append(_llama_run(l, ids, eos)[0])
        rates["fastspec_vanilla"].append(_fastspec_run(model, None, ids, eos)[0])
        rate, _, res = _fastspec_run(model, fs.NgramDrafter(), ids, eos)
        rates["fastspec_ngram"].append(rate)
        taus.append(res.stats.mean_accepted_length)
    med = {m: float(np.median(v)) for m, v in rates.items()}
    row = {f"{m}_tok_per_s": v for m, v in med.items()}
    row.update(threads=threads, requests=len(taus), tau_ngram=float(np.median(taus)),
               vanilla_ratio=med["fastspec_vanilla"] / med["llama_vanilla"],
               ngram_over_llama_vanilla=med["fastspec_ngram"] / med["llama_vanilla"],
               ngram_over_llama_lookup=med["fastspec_ngram"] / med["llama_lookup"],
               load_average=os.getloadavg()[0], llama_extra_bufts=EXTRA_BUFTS)
    benchmark.extra_info.update(row)
    print(f"\nthreads {threads}: " + ", ".join(f"{k}={v:.3g}" for k, v in row.items()))
    benchmark.pedantic(lambda: row, rounds=1)
