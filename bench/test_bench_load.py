"""Loading GGUF files: the time to a first forward and the peak memory of a fresh process,
against llama.cpp's on the same file.

A load happens once per process, so each measurement is a fresh process: fastspec
(``Transformer.load(path, weight_dtype="auto")``, then a forward of 3 tokens) and, when
``llama_cpp`` is importable (``pip install "fastspec[peers]"``), llama.cpp (``Llama(path)``,
then an eval of the same 3 tokens), alternated; the rows report medians, the time counted
from after the imports. Files: the real SmolLM2-135M-Instruct Q4_1 file (skipped when it is
not installed) and a Q4_K_M-like file written here (llama, dim 1024, ffn 4096, 6 layers,
vocabulary 32000, random Q4_K and Q6_K blocks: what a user's K-quant file costs fastspec,
which converts those blocks at load, docs/FORMATS.md).

Run: ``pytest bench/test_bench_load.py --benchmark-only -s``; FASTSPEC_BENCH_THREADS sets the
thread counts (default 1), FASTSPEC_BENCH_LOAD_REPEATS the processes of each (default 3).
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastspec as fs

pytest.importorskip("gguf")  # fastspec reads GGUF files with it
if not os.path.exists("/proc/self/status"):
    pytest.skip("the peak RSS is read from /proc (Linux)", allow_module_level=True)

THREADS = tuple(int(t) for t in os.environ.get("FASTSPEC_BENCH_THREADS", "1").split(","))
REPEATS = int(os.environ.get("FASTSPEC_BENCH_LOAD_REPEATS", "3"))
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None

# The peak RSS of this process's memory (VmHWM; ru_maxrss would keep the parent's peak across
# the fork and exec).
_PEAK = """
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
"""
_FASTSPEC = _PEAK + """
import sys, time
import numpy as np
import fastspec as fs
fs.set_threads(int(sys.argv[2]))
t0 = time.perf_counter()
m = fs.Transformer.load(sys.argv[1], weight_dtype="auto")
m.forward(np.array([1, 2, 3]))
print(time.perf_counter() - t0, peak())
"""
_LLAMA = _PEAK + """
import sys, time
from llama_cpp import Llama
t0 = time.perf_counter()
m = Llama(sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=64, verbose=False)
m.eval([1, 2, 3])
print(time.perf_counter() - t0, peak())
"""


def _child(code: str, path: Path, threads: int) -> tuple[float, int]:
    """(seconds to the first forward, peak RSS bytes) of one fresh process."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", code, str(path), str(threads)],
                         capture_output=True, text=True, env=env, check=True)
    seconds, rss = out.stdout.split()[-2:]
    return float(seconds), int(rss)


@pytest.fixture(scope="module")
def k_quant_file(tmp_path_factory) -> Path:
    from gguf import GGMLQuantizationType as Q

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _gguf_writer import write_model

    path = tmp_path_factory.mktemp("load") / "k-quant.gguf"
    write_model(path, "llama", dim=1024, ffn=4096, n_layers=6, n_heads=16, n_kv=4,
                vocab=32000, types=(Q.Q4_K, Q.Q4_K, Q.Q6_K), tied=True)
    return path


def _file(name: str, request) -> Path:
    if name == "k-quant":
        return request.getfixturevalue("k_quant_file")
    try:
        return Path(fs.models.find("smollm2"))
    except (KeyError, FileNotFoundError) as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("name", ["smollm2-q4_1", "k-quant"])
def test_load(benchmark, request, name, threads):
    path = _file(name, request)
    rows: dict[str, list[tuple[float, int]]] = {"fastspec": [], "llama.cpp": []}
    for _ in range(REPEATS):
        rows["fastspec"].append(_child(_FASTSPEC, path, threads))
        if HAVE_LLAMA:
            rows["llama.cpp"].append(_child(_LLAMA, path, threads))
    info = {"file": name, "file_bytes": path.stat().st_size, "threads": threads,
            "repeats": REPEATS}
    for who, got in rows.items():
        if got:
            info[f"{who}_load_s"] = float(np.median([s for s, _ in got]))
            info[f"{who}_peak_rss_bytes"] = int(np.median([r for _, r in got]))
    if HAVE_LLAMA:
        info["load_s_over_llama_cpp"] = info["fastspec_load_s"] / info["llama.cpp_load_s"]
    benchmark.extra_info.update(info)
    print(f"\n{name} ({info['file_bytes'] / 2**20:.0f} MiB), {threads} thread(s), medians of "
          f"{REPEATS} processes: " + "; ".join(
              f"{who} {info[f'{who}_load_s']:.2f} s, peak RSS "
              f"{info[f'{who}_peak_rss_bytes'] / 2**20:.0f} MiB"
              for who in rows if rows[who])
          + (f"; time over llama.cpp's {info['load_s_over_llama_cpp']:.2f}x"
             if HAVE_LLAMA else ""))
    assert all(s > 0 for got in rows.values() for s, _ in got)
    benchmark.pedantic(lambda: info, rounds=1)
