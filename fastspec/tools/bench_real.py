"""Real-size rows of ``fastspec bench --full``: random SmolLM-135M and Qwen3-0.6B shapes.

Each shape is written once as a Hugging Face folder with BF16 weights (the dtype real
checkpoints ship in; random values, drawn matrix by matrix so that building it never holds a
float64 copy). Each target storage dtype is then loaded in a fresh process that reports:

- the load time and the peak resident memory while loading (``VmHWM`` minus the RSS before
  the load), against the file size and against the loaded weights;
- the decode step (one position at context 64) against the stream bound: the bytes a step
  reads (every layer matrix, the head, and the K/V cache rows it attends over) over the
  streaming rate measured in the same process at that footprint (a read-only BLAS ``sdot``
  of two float32 arrays of that many bytes in all). Steps and streams alternate one call at
  a time, ``10 * repeats`` pairs: the row gives the best of each (``fraction_of_stream_bound``)
  and the median of the pairs' ratios (``fraction_paired_median``), the steadier figure on a
  shared machine;
- with ``threads``, both figures with the compiled kernels and BLAS at that thread count;
- for the Qwen3-0.6B shape, the sampled round (``probs`` of 8 rows with top-k 50 into a
  reused buffer, as the decoding loop does, then ``verify_rejection`` of 7 one-hot proposals)
  against that decode step.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from fastspec.kernels.bf16 import to_bits
from fastspec.formats import json_io
from fastspec.formats.hf_folder import hf_export_config, hf_tensor_names, write_safetensors
from fastspec.model.config import ModelConfig

__all__ = ["REAL_SHAPES", "write_random_folder", "measure_folder", "real_size_rows",
           "real_size_text", "real_size_markdown"]

#: The shapes of the two checkpoints (max_seq_len cut to 2048: the KV cache is not measured).
REAL_SHAPES = {
    "SmolLM-135M": ModelConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                               head_dim=64, ffn_dim=1536, max_seq_len=2048,
                               tie_embeddings=True, rope_theta=10000.0, norm_eps=1e-5),
    "Qwen3-0.6B": ModelConfig(vocab_size=151936, dim=1024, n_layers=28, n_heads=16,
                              n_kv_heads=8, head_dim=128, ffn_dim=3072, max_seq_len=2048,
                              tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6,
                              qk_norm=True),
}


def write_random_folder(config: ModelConfig, folder: str | os.PathLike, seed: int = 0,
                        dtype: str = "bfloat16") -> int:
    """Write a random ``config`` model as a Hugging Face folder of ``dtype`` (``"bfloat16"``
    or ``"float16"``) tensors; return the safetensors file's bytes."""
    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float16', got {dtype!r}")
    store = to_bits if dtype == "bfloat16" else (lambda a: a.astype(np.float16))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    c = config
    shape = {"q_proj": (c.n_heads * c.head_dim, c.dim), "k_proj": (c.n_kv_heads * c.head_dim, c.dim),
             "v_proj": (c.n_kv_heads * c.head_dim, c.dim), "o_proj": (c.dim, c.n_heads * c.head_dim),
             "gate_proj": (c.ffn_dim, c.dim), "up_proj": (c.ffn_dim, c.dim),
             "down_proj": (c.dim, c.ffn_dim), "embed_tokens": (c.vocab_size, c.dim),
             "lm_head": (c.vocab_size, c.dim)}
    tensors = {}
    for name in hf_tensor_names(config):
        if name.endswith("norm.weight"):
            size = c.head_dim if "_norm." in name else c.dim
            tensors[name] = store(1.0 + 0.1 * rng.standard_normal(size, dtype=np.float32))
            continue
        kind = name.split(".")[-2]
        out_in = shape[kind]
        a = rng.standard_normal(out_in, dtype=np.float32)
        a *= 1.0 if kind == "embed_tokens" else 1.0 / math.sqrt(out_in[1])
        tensors[name] = store(a)
        del a
    cfg = hf_export_config(config)
    cfg["torch_dtype"] = dtype
    (folder / "config.json").write_text(json_io.dumps(cfg, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", tensors)
    return (folder / "model.safetensors").stat().st_size


# Runs in a fresh process: argv = folder, weight_dtype, new_tokens, repeats, sampled (0/1),
# threads. The environment sets OPENBLAS_NUM_THREADS to the same thread count.
_CHILD = r"""
import sys, time
import numpy as np
from fastspec import kernels
from fastspec.decoding import generate
from fastspec.formats.json_io import dumps
from fastspec.model import Transformer
from fastspec.tools.timing import timeit

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0

folder, wdt, new_tokens, repeats, sampled, threads = sys.argv[1:7]
new_tokens, repeats, threads = int(new_tokens), int(repeats), int(threads)
from fastspec.kernels import available_backends, set_threads
if "cython" in available_backends():
    set_threads(threads)
base = rss("VmRSS:")
t0 = time.perf_counter()
model = Transformer.load(folder, weight_dtype=wdt)
load_s = time.perf_counter() - t0
row = {"load_s": load_s, "peak_rss_load_bytes": rss("VmHWM:") - base,
       "rss_after_load_bytes": rss("VmRSS:") - base, "threads": threads}
mats = [a for lw in model.layers for k, a in lw.arrays().items() if a.ndim == 2]
tied = np.may_share_memory(model.head, model.embed)  # a tied head is a view: stored once
row["weight_bytes"] = (sum(a.nbytes for a in mats) + model.embed.nbytes
                       + (0 if tied else model.head.nbytes))
row["step_bytes"] = sum(a.nbytes for a in mats) + model.head.nbytes
if new_tokens:
    ctx = 64
    cache = model.new_cache(ctx + new_tokens + 40)
    prompt = np.arange(1, ctx + 1) % model.config.vocab_size
    model.step(prompt, cache)
    tok = np.array([1])
    # the cache rows a step attends over: K and V of ctx + 1 positions in every layer
    c = model.config
    row["kv_read_bytes"] = 2 * c.n_layers * c.n_kv_heads * (ctx + 1) * c.head_dim * cache.k.itemsize
    read = row["step_bytes"] + row["kv_read_bytes"]
    n = read // 8
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    clock = time.perf_counter
    steps, streams = [], []
    # One step, then one stream of as many bytes, alternately: each pair sees the same
    # machine, so the ratio of a pair is steadier than either time on a shared machine.
    for i in range(3 + 10 * repeats):
        t0 = clock()
        model.step(tok, cache)
        cache.crop(ctx)
        t1 = clock()
        a @ b
        t2 = clock()
        if i >= 3:  # warm-up pairs
            steps.append(t1 - t0)
            streams.append(t2 - t1)
    del a, b
    steps, streams = np.array(steps), np.array(streams)
    row["decode_step_s"], row["decode_step_median_s"] = steps.min(), float(np.median(steps))
    row["stream_GBps"] = 8 * n / streams.min() / 1e9
    row["stream_median_GBps"] = 8 * n / float(np.median(streams)) / 1e9
    row["fraction_paired_median"] = float(np.median(streams / steps))
    row["fraction_paired_quartiles"] = [float(q) for q in np.quantile(streams / steps, [0.25, 0.75])]
    row["rss_after_decode_bytes"] = rss("VmRSS:") - base
    res = generate(model, prompt, new_tokens, cache=cache)
    row["generate_tokens_per_s"] = (res.stats.new_tokens - 1) / res.stats.decode_s
if sampled == "1":
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    logits = (3.0 * rng.standard_normal((8, V))).astype(np.float32)
    draft = rng.integers(0, V, 7)
    u = rng.random(8)
    pbuf = np.empty_like(logits)  # the decoding loop's reused buffer (SpeculativePlan)
    def round_():
        p = kernels.probs(logits, 1.0, 50, out=pbuf)
        return kernels.verify_rejection(draft, p, None, u)
    row["sampled_round_s"] = min(timeit(round_, repeats=3) for _ in range(repeats))
    row["probs_8rows_s"] = timeit(lambda: kernels.probs(logits, 1.0, 50))
print(dumps(row))
"""


def measure_folder(folder: str | os.PathLike, weight_dtype: str = "bfloat16",
                   new_tokens: int = 16, repeats: int = 3, sampled: bool = False,
                   threads: int = 1) -> dict:
    """Load ``folder`` in a fresh process with ``weight_dtype`` matrices; return its row.

    ``new_tokens=0`` measures the load only.
    """
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]),  # the folder of fastspec/
               OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(folder), weight_dtype,
                          str(new_tokens), str(repeats), "1" if sampled else "0", str(threads)],
                         capture_output=True, text=True, env=env, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["weight_dtype"] = weight_dtype
    if new_tokens:
        read = row["step_bytes"] + row["kv_read_bytes"]
        row["stream_bound_s"] = read / (row["stream_GBps"] * 1e9)
        row["fraction_of_stream_bound"] = row["stream_bound_s"] / row["decode_step_s"]
        row["tokens_per_s"] = 1.0 / row["decode_step_s"]
    if sampled:
        row["sampled_round_over_step"] = row["sampled_round_s"] / row["decode_step_s"]
    return row


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux
        return math.nan


def real_size_rows(shapes: dict | None = None, weight_dtypes=("bfloat16", "float16", "float32"),
                   new_tokens: int = 16, repeats: int = 3, threads=(1,),
                   decode_float32: bool = False) -> list[dict]:
    """Build, save (BF16), load and decode every shape; one row per storage dtype and thread
    count (JSON-ready). float32 rows measure the load only unless ``decode_float32``."""
    rows = []
    for name, config in (shapes or REAL_SHAPES).items():
        with tempfile.TemporaryDirectory(prefix="fastspec-real-") as tmp:
            file_bytes = write_random_folder(config, tmp)
            for wdt in weight_dtypes:
                decode = wdt != "float32" or decode_float32
                for t in threads if decode else threads[:1]:
                    load = _load_average()
                    row = {"shape": name, "file_bytes": file_bytes, "load_average": load,
                           **measure_folder(tmp, wdt, new_tokens if decode else 0, repeats,
                                            sampled=decode and config.vocab_size > 10**5,
                                            threads=t)}
                    row["peak_rss_over_file"] = row["peak_rss_load_bytes"] / file_bytes
                    row["peak_rss_over_weights"] = row["peak_rss_load_bytes"] / row["weight_bytes"]
                    rows.append(row)
    return rows


def real_size_text(rows: list[dict]) -> list[str]:
    """Lines of the :func:`real_size_rows` table."""
    out = []
    for r in rows:
        line = (f"real [{r['shape']} {r['weight_dtype']} t={r['threads']}] load {r['load_s']:.1f} s, "
                f"peak RSS {r['peak_rss_load_bytes'] / 1e6:.0f} MB = {r['peak_rss_over_file']:.2f}x "
                f"file, {r['peak_rss_over_weights']:.2f}x weights")
        if "decode_step_s" in r:
            line += (f"; step {1e3 * r['decode_step_s']:.1f} ms, {r['fraction_of_stream_bound']:.0%}"
                     f" of the {r['stream_GBps']:.1f} GB/s stream bound (best of each; median of"
                     f" the paired ratios {r['fraction_paired_median']:.0%})")
        if "sampled_round_over_step" in r:
            line += f"; sampled round {r['sampled_round_over_step']:.1%} of a step"
        out.append(line + f" (load avg {r['load_average']:.2f})")
    return out


def real_size_markdown(rows: list[dict]) -> list[str]:
    """The PERFORMANCE.md section of :func:`real_size_rows` (Markdown lines)."""
    out = ["## Real-size shapes: load memory, decode step vs the stream bound", "",
           "Random SmolLM-135M and Qwen3-0.6B shapes saved as BF16 Hugging Face folders and "
           "loaded in a fresh process per row with `Transformer.load(folder, weight_dtype=...)`. "
           "Peak RSS: `VmHWM` minus the RSS before the load, over the file and over the loaded "
           "weights (a tied head is kept twice: the embedding and its transpose). The step "
           "(one position, context 64) reads every layer matrix, the head and the K/V rows it "
           "attends over; its bound is those bytes over a read-only BLAS `sdot` stream of as "
           "many bytes, timed in the same process, one step and one stream alternately: "
           "'of bound' is best over best, 'paired' the median of the pairs' ratios. "
           "Sampled round: `probs` of "
           "8 rows with top-k 50 (into a reused buffer, as the decoding loop does) and "
           "`verify_rejection` of 7 one-hot proposals.", "",
           "| shape | weights | threads | load | peak RSS / file | / weights | step | stream "
           "| of bound | paired | sampled round / step | load avg |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = ("| " + " | ".join([f"{1e3 * r['decode_step_s']:.1f} ms",
                                   f"{r['stream_GBps']:.1f} GB/s",
                                   f"{r['fraction_of_stream_bound']:.0%}",
                                   f"{r['fraction_paired_median']:.0%}"])
                if "decode_step_s" in r else "| - | - | - | -")
        samp = (f"{r['sampled_round_over_step']:.1%} ({1e3 * r['sampled_round_s']:.2f} ms)"
                if "sampled_round_over_step" in r else "-")
        out.append(f"| {r['shape']} | {r['weight_dtype']} | {r['threads']} | {r['load_s']:.1f} s | "
                   f"{r['peak_rss_over_file']:.2f}x ({r['peak_rss_load_bytes'] / 1e6:.0f} MB) | "
                   f"{r['peak_rss_over_weights']:.2f}x {step} | {samp} | {r['load_average']:.1f} |")
    return out
