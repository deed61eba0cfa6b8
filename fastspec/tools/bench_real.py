"""Real-size rows of ``fastspec bench --full``: random SmolLM-135M and Qwen3-0.6B shapes.

Each shape is written as a Hugging Face folder with float16 weights (the size of the bf16
checkpoints they ship as; random values, drawn matrix by matrix so that building it never
holds a float64 copy), then loaded in a fresh process that reports the load time, the peak
resident memory while loading (``VmHWM`` minus the RSS before the load, against the file
size) and the greedy decode rate with the matrices kept in float16.
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

from fastspec.checkpoints import _export_config, _needed, write_safetensors
from fastspec.config import ModelConfig

__all__ = ["REAL_SHAPES", "write_random_folder", "measure_folder", "real_size_rows"]

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


def write_random_folder(config: ModelConfig, folder: str | os.PathLike, seed: int = 0) -> int:
    """Write a random ``config`` model as a float16 Hugging Face folder; return its bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name in _needed(config):
        if name.endswith("norm.weight"):
            size = config.head_dim if "_norm." in name else config.dim
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float16)
            continue
        c = config
        shape = {"q_proj": (c.n_heads * c.head_dim, c.dim),
                 "k_proj": (c.n_kv_heads * c.head_dim, c.dim),
                 "v_proj": (c.n_kv_heads * c.head_dim, c.dim),
                 "o_proj": (c.dim, c.n_heads * c.head_dim), "gate_proj": (c.ffn_dim, c.dim),
                 "up_proj": (c.ffn_dim, c.dim), "down_proj": (c.dim, c.ffn_dim),
                 "embed_tokens": (c.vocab_size, c.dim), "lm_head": (c.vocab_size, c.dim)}
        kind = name.split(".")[-2]
        out_in = shape[kind]
        scale = 1.0 if kind == "embed_tokens" else 1.0 / math.sqrt(out_in[1])
        a = rng.standard_normal(out_in, dtype=np.float32)
        a *= scale
        tensors[name] = a.astype(np.float16)
    cfg = _export_config(config)
    cfg["torch_dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", tensors)
    return (folder / "model.safetensors").stat().st_size


_CHILD = r"""
import json, sys, time
import numpy as np
import fastspec as fs

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0

base = rss("VmRSS:")
t0 = time.perf_counter()
model = fs.Transformer.load(sys.argv[1], weight_dtype="float16")
load_s = time.perf_counter() - t0
peak = rss("VmHWM:") - base
prompt = np.arange(1, 33) % model.config.vocab_size
fs.generate(model, prompt, 2)  # warm-up
res = fs.generate(model, prompt, int(sys.argv[2]))
print(json.dumps({"load_s": load_s, "peak_rss_load_bytes": peak, "decode_s":
                  res.stats.decode_s, "new_tokens": res.stats.new_tokens,
                  "weight_bytes": sum(a.nbytes for a in model.state_dict().values())}))
"""


def measure_folder(folder: str | os.PathLike, new_tokens: int = 16) -> dict:
    """Load ``folder`` in a fresh process (float16 matrices); return the load and decode row."""
    import fastspec

    env = dict(os.environ, PYTHONPATH=str(Path(fastspec.__file__).parent.parent))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(new_tokens)],
                         capture_output=True, text=True, env=env, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    steps = row["new_tokens"] - 1  # the first token comes from the prefill
    row["decode_step_s"] = row["decode_s"] / steps if steps > 0 else math.nan
    return row


def real_size_rows(shapes: dict | None = None, dram_GBps: float | None = None,
                   new_tokens: int = 16) -> list[dict]:
    """Build, save, load and decode every shape; one row each (JSON-ready)."""
    rows = []
    for name, config in (shapes or REAL_SHAPES).items():
        with tempfile.TemporaryDirectory(prefix="fastspec-real-") as tmp:
            file_bytes = write_random_folder(config, tmp)
            row = {"shape": name, "file_bytes": file_bytes, **measure_folder(tmp, new_tokens)}
        row["peak_rss_over_file"] = row["peak_rss_load_bytes"] / file_bytes
        row["tokens_per_s"] = 1.0 / row["decode_step_s"]
        if dram_GBps:
            bound = row["weight_bytes"] / (dram_GBps * 1e9)
            row.update(dram_bound_s=bound, fraction_of_dram_bound=bound / row["decode_step_s"])
        rows.append(row)
    return rows
