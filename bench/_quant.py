"""Measurements of quantized models shared by the quantized benchmarks (one run, interleaved).

:func:`random_quantized` builds a model of any shape straight from random GGUF blocks (no
float weights, no quantization pass: a Qwen3-0.6B shape takes seconds); :func:`decode_vs_stream`
times the decode step paired with a read of as many bytes (the stream bound, measured in the
same run); :func:`verify_costs` times verifying k positions in decode steps.
"""
from __future__ import annotations

import time

import numpy as np

from fastspec.kernels.quant import QuantMatrix, block_bytes
from fastspec.model import ModelConfig, Transformer
from fastspec.model.schema import LayerWeights
from fastspec.model.state import layer_schema

#: Qwen3-0.6B's shape (its config.json), max_seq_len cut: the cache is not measured.
QWEN3_06B = ModelConfig(vocab_size=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8,
                        head_dim=128, ffn_dim=3072, max_seq_len=1024, tie_embeddings=True,
                        rope_theta=1e6, norm_eps=1e-6, qk_norm=True)
VERIFY_K = (1, 2, 4, 8, 16)


def _random_blocks(rng, kind: str, out: int, n_in: int) -> np.ndarray:
    """Random GGUF blocks (out, n_in/32 blocks) whose values have spread ~1/sqrt(n_in)."""
    bb, nb = block_bytes(kind), n_in // 32
    raw = rng.integers(0, 256, size=(out, nb, bb), dtype=np.uint8)
    level = 64.0 if kind == "q8_0" else 4.6  # rms of q (int8), of a nibble - its mean
    scale = np.float16(1.0 / (np.sqrt(n_in) * level))
    raw[:, :, 0:2] = np.frombuffer(scale.tobytes(), np.uint8)
    if kind == "q4_1":
        raw[:, :, 2:4] = np.frombuffer(np.float16(-7.5 * scale).tobytes(), np.uint8)
    return raw.reshape(out, nb * bb)


def random_quantized(config: ModelConfig, kind: str, seed: int = 0) -> Transformer:
    """A model of ``config``'s shape with random ``kind`` blocks in every matrix."""
    rng = np.random.default_rng(seed)
    c = config.replace(weight_dtype=kind)
    shapes, attrs = layer_schema(c)

    def mat(n_in, out):
        return QuantMatrix.from_blocks(kind, _random_blocks(rng, kind, out, n_in), n_in)

    layers = []
    for _ in range(c.n_layers):
        kw = {}
        for attr in attrs:
            shape = shapes[attr]
            if len(shape) == 2:
                kw[attr] = mat(*shape)
            else:
                kw[attr] = (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
        layers.append(LayerWeights(**kw))
    embed = mat(c.dim, c.vocab_size)
    head = embed if c.tie_embeddings else mat(c.dim, c.vocab_size)
    return Transformer(c, embed, layers, head, np.ones(c.dim, np.float32))


def step_bytes(model: Transformer) -> int:
    """Bytes of weights one decode step streams: every layer matrix and the head (the
    embedding lookup reads one row)."""
    mats = [a for lw in model.layers for a in lw.arrays().values()]
    total = sum(a.nbytes for a in mats)
    return int(total + model.head.nbytes)


def decode_vs_stream(model: Transformer, context: int = 64, pairs: int = 12) -> dict:
    """Time the decode step and a read of the same bytes (BLAS ``sdot`` of two float32 arrays,
    ``numpy``'s), alternately: each pair sees the same machine. Returns the row."""
    cache = model.new_cache(context + 40)
    prompt = np.arange(1, context + 1) % model.config.vocab_size
    model.step(prompt, cache)
    tok = np.array([1])
    c = model.config
    kv = 2 * c.n_layers * c.n_kv_heads * (context + 1) * c.head_dim * cache.k.itemsize
    read = step_bytes(model) + kv
    a = np.ones(read // 8, np.float32)
    b = np.ones(read // 8, np.float32)
    steps, streams = [], []
    for i in range(3 + pairs):
        t0 = time.perf_counter()
        model.step(tok, cache)
        cache.crop(context)
        t1 = time.perf_counter()
        a @ b
        t2 = time.perf_counter()
        if i >= 3:
            steps.append(t1 - t0)
            streams.append(t2 - t1)
    steps, streams = np.array(steps), np.array(streams)
    return {"step_bytes": read, "decode_step_s": float(np.median(steps)),
            "decode_step_min_s": float(steps.min()),
            "decode_tok_per_s": float(1.0 / np.median(steps)),
            "stream_GBps": float(read / np.median(streams) / 1e9),
            "step_GBps": float(read / np.median(steps) / 1e9),
            "fraction_of_stream_bound": float(np.median(streams / steps))}


def verify_costs(model: Transformer, ks=VERIFY_K, context: int = 64, rounds: int = 7) -> dict:
    """Time a step of k positions after ``context`` cached ones, for each k, in decode steps
    (a step of k = 1 is the decode step), rounds interleaved over k; medians."""
    cache = model.new_cache(context + max(ks) + 8)
    prompt = np.arange(1, context + 1) % model.config.vocab_size
    model.step(prompt, cache)
    ids = {k: (np.arange(k) * 7 + 3) % model.config.vocab_size for k in ks}
    times = {k: [] for k in ks}
    for r in range(rounds + 1):
        for k in ks:
            t0 = time.perf_counter()
            model.step(ids[k], cache)
            dt = time.perf_counter() - t0
            cache.crop(context)
            if r:
                times[k].append(dt)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {f"verify_{k}_steps": med[k] / med[1] for k in ks} | {"step_1_s": med[1]}
