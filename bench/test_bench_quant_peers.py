"""fastspec against llama.cpp (llama-cpp-python) on the same GGUF file, prompt and threads.

:func:`fastspec.tools.llama_peers.llama_peers` (its docstring says what is compared and the
goals): the real SmolLM2-135M-Instruct Q4_1 file, greedy decoding of the grounded requests,
llama.cpp vanilla and prompt lookup against fastspec vanilla and n-gram, interleaved request
by request.

Skipped unless ``llama_cpp`` is importable (``pip install "fastspec[peers]"``, which compiles
llama.cpp: minutes). Run: ``taskset -c 1 pytest bench/test_bench_quant_peers.py
--benchmark-only -s``; FASTSPEC_BENCH_THREADS sets the thread counts (default 1),
FASTSPEC_BENCH_REQUESTS / FASTSPEC_BENCH_NEW_TOKENS the work, FASTSPEC_PEERS_EXTRA_BUFTS=0|1
turns llama.cpp's extra buffer types off or on (default: off on CPUs with AMX-INT8, where
its AMX buffer crashed).
"""
import os

import pytest

import fastspec as fs

pytest.importorskip("llama_cpp")

THREADS = tuple(int(t) for t in os.environ.get("FASTSPEC_BENCH_THREADS", "1").split(","))
NEW_TOKENS = int(os.environ.get("FASTSPEC_BENCH_NEW_TOKENS", "128"))
REQUESTS = int(os.environ.get("FASTSPEC_BENCH_REQUESTS", "4"))


@pytest.mark.parametrize("threads", THREADS)
def test_vs_llama_cpp(benchmark, threads):
    from fastspec.tools.llama_peers import llama_peers, llama_peers_text

    try:
        path = fs.models.find("smollm2")
    except (KeyError, FileNotFoundError) as exc:
        pytest.skip(str(exc))
    report = llama_peers(path, threads=threads, requests=REQUESTS, new_tokens=NEW_TOKENS)
    benchmark.extra_info.update({k: v for k, v in report.items() if k != "rows"})
    benchmark.extra_info.update({f"{r['method']}_tok_per_s": r["tokens_per_s"]
                                 for r in report["rows"]})
    print("\n" + "\n".join(llama_peers_text(report)))
    assert all(r["tokens_per_s"] > 0 for r in report["rows"])
    benchmark.pedantic(lambda: report, rounds=1)
