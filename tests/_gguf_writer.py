"""Random llama/qwen2/qwen3 GGUF files for the tests, written with ``gguf.GGUFWriter``.

:func:`write_model` returns the exact float32 values the file holds, in Hugging Face names
and layout, so a reader can be compared with them bit for bit. Matrices cycle over
:data:`TYPES`: every type the ``gguf`` package dequantizes that a file can hold. Types it can
quantize are quantized; the others (K-quants, IQ types, NVFP4) are random blocks (any bytes
are a valid block) whose scales are overwritten with small finite values.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

gguf = __import__("pytest").importorskip("gguf")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

#: Matrix types, cycled over a file's matrices in order.
TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
         Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.IQ4_NL,
         Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4, Q.F16, Q.BF16, Q.F32)
#: Byte offsets of the float16 scales (d, dmin) in a block of the types gguf cannot quantize.
_F16_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2),
               Q.Q6_K: (208,), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,),
               Q.IQ3_S: (0,), Q.IQ1_S: (0,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,)}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


def _set_scales(raw: np.ndarray, qt: Q, scale: np.ndarray) -> None:
    """Write per-block ``scale`` values into the scale fields of blocks ``raw`` (n, bytes)."""
    if qt == Q.NVFP4:  # four UE4M3 sub-block scales: one fixed exponent
        raw[:, :4] = 0x20
        return
    bits = scale.astype(np.float16).view(np.uint16)
    if qt == Q.IQ1_M:  # the f16 scale is the top nibbles of the block's last four uint16
        tail = raw[:, -8:].copy().view(np.uint16)
        for j in range(4):
            tail[:, j] = (tail[:, j] & 0x0FFF) | (((bits >> (4 * j)) & 0xF) << 12)
        raw[:, -8:] = tail.view(np.uint8)
        return
    for off in _F16_SCALES[qt]:
        raw[:, off:off + 2] = bits.view(np.uint8).reshape(-1, 2)


def encode(w: np.ndarray, qt: Q, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(array for GGUFWriter.add_tensor, the float32 value it holds)`` for ``w``."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qt == Q.F32:
        return w, w
    if qt == Q.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    if qt in _F16_SCALES or qt in (Q.IQ1_M, Q.NVFP4):
        block, size = GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=(w.size // block, size), dtype=np.uint8)
        _set_scales(raw, qt, np.full(len(raw), 1e-3))
        spread = dequantize(raw.reshape(w.shape[0], -1), qt).std()
        # the weights' own spread, so that activations stay of order one
        _set_scales(raw, qt, 1e-3 * w.std() / spread * rng.uniform(0.5, 1.5, len(raw)))
        raw = raw.reshape(w.shape[0], -1)
        return raw, dequantize(raw, qt)
    q = quantize(w, qt)
    return q, dequantize(q, qt)


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``convert_hf_to_gguf.py`` ``LlamaModel.permute`` (rows of each head)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def vocabulary(size: int = 300) -> tuple[list[str], list[str]]:
    """Byte-level BPE ``(tokens, merges)``: the special tokens, the 256 byte symbols, then
    pairs of them, each pair with its merge."""
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pairs = [(a, b) for a in alphabet[:20] for b in alphabet[:20]][:size - 259]
    return SPECIAL + alphabet + [a + b for a, b in pairs], [f"{a} {b}" for a, b in pairs]


def spm_vocabulary(size: int = 300) -> tuple[list[str], list[int], list[float]]:
    """SentencePiece ``(tokens, types, scores)`` (llama.cpp's ``llama`` model, as a Phi-3 file
    has it): ``<unk> <s> </s>``, the 256 byte tokens, then pieces of two and three letters."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["\u2581" + a for a in letters] + [a + b for a in letters for b in letters]
    pieces = pieces[:max(0, size - 259)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    return tokens, [2, 3, 3] + [6] * 256 + [1] * len(pieces), [0.0] * 259 + [
        -float(i) for i in range(len(pieces))]


def add_hparams(w, dim: int, n_layers: int, ffn: int, n_heads: int, n_kv: int,
                vocab: int) -> None:
    """The architecture keys every test file carries (context 512, eps 1e-6, rope base 1e4)."""
    w.add_context_length(512)
    w.add_block_count(n_layers)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)


def write_model(path: str | Path, arch: str = "qwen2", seed: int = 0, dim: int = 256,
                n_layers: int = 2, n_heads: int = 4, n_kv: int = 2, head_dim: int | None = None,
                ffn: int = 512, vocab: int = 300, types=TYPES, tied: bool | None = None,
                metadata: dict | None = None, skip: tuple[str, ...] = (),
                reshape: dict | None = None,
                extra: dict | None = None, drop: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Write a random ``arch`` model to ``path``; return its weights (HF names, float32).

    ``metadata`` adds keys (``{key: (value, GGUFValueType)}``; one the writer sets too must be
    in ``drop``, the keys left out), ``skip`` leaves tensors out, ``reshape`` gives tensors
    other shapes (both by GGUF name), ``extra`` adds arrays as they are (their dtype is their
    GGUF type): bad files.
    Row lengths must be multiples of 256 for the K-quant and most IQ types.
    """
    rng = np.random.default_rng(seed)
    head_dim = head_dim or dim // n_heads
    tied = arch not in ("llama", "phi3") if tied is None else tied
    if arch == "phi3":  # llama.cpp reads a phi3 file's vocabulary as SentencePiece only
        tokens, types_, scores = spm_vocabulary(vocab)
    else:
        tokens, merges = vocabulary(vocab)
    w = gguf.GGUFWriter(str(path), arch)
    add_key_value = w.add_key_value  # every add_* method goes through it: drop the writer's
    w.add_key_value = lambda key, *a, **k: None if key in drop else add_key_value(key, *a, **k)
    # llama.cpp looks a "<|end|>" token up in a file whose name says phi3: not in these tokens
    w.add_name("test-model" if arch == "phi3" else f"test-{arch}")
    add_hparams(w, dim, n_layers, ffn, n_heads, n_kv, len(tokens))
    if arch in ("llama", "phi3", "granite", "smollm3"):
        w.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "gemma3":  # layers 5, 11, ... global (llama.cpp's pattern), the others local
        w.add_sliding_window(512)  # with their own RoPE base (Gemma's is 1e4 against 1e6)
        w.add_key_value("gemma3.rope.freq_base_swa", 100.0, gguf.GGUFValueType.FLOAT32)
    if arch == "phi3":
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types_)
        w.add_token_scores(scores)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
        w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHATML)
    for key, (value, vtype) in (metadata or {}).items():
        add_key_value(key, value, vtype)

    weights: dict[str, np.ndarray] = {}
    count = 0

    def add(name: str, hf: str, value: np.ndarray, heads: int | None = None) -> None:
        nonlocal count
        if name in skip:
            return
        if reshape and name in reshape:
            value = value.reshape(reshape[name])
        if value.ndim == 1:
            w.add_tensor(name, value)
            weights[hf] = value
            return
        if heads:  # the converter permutes the HF rows, then quantizes
            value = llama_permute(value, heads)
        qt = types[count % len(types)]
        count += 1
        raw, held = encode(value, qt, rng)
        w.add_tensor(name, raw, raw_dtype=None if qt in (Q.F32, Q.F16) else qt)
        weights[hf] = held if not heads else (
            held.reshape(heads, -1, 2, held.shape[1]).swapaxes(1, 2).reshape(held.shape))

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0, 1 / np.sqrt(cols), (rows, cols)).astype(np.float32)

    def vector(n: int, base: float) -> np.ndarray:
        return (base + 0.1 * rng.normal(size=n)).astype(np.float32)

    def fused(name: str, hf: str, parts: dict[str, np.ndarray]) -> None:
        """Phi-3's fused tensors: one GGUF tensor, its held rows split under the HF names."""
        add(name, hf, np.concatenate(list(parts.values())))
        if hf in weights:
            rows = np.cumsum([a.shape[0] for a in parts.values()])[:-1]
            weights.update(zip(parts, np.split(weights.pop(hf), rows)))

    add("token_embd.weight", "model.embed_tokens.weight", matrix(len(tokens), dim))
    perm = arch in ("llama", "granite", "internlm2", "smollm3")  # as llama.cpp's converters
    for i in range(n_layers):
        g, p = f"blk.{i}.", f"model.layers.{i}."
        add(g + "attn_norm.weight", p + "input_layernorm.weight", vector(dim, 1.0))
        if arch == "phi3":
            fused(g + "attn_qkv.weight", p + "self_attn.qkv_proj.weight",
                  {p + "self_attn.q_proj.weight": matrix(n_heads * head_dim, dim),
                   p + "self_attn.k_proj.weight": matrix(n_kv * head_dim, dim),
                   p + "self_attn.v_proj.weight": matrix(n_kv * head_dim, dim)})
        else:
            add(g + "attn_q.weight", p + "self_attn.q_proj.weight",
                matrix(n_heads * head_dim, dim), n_heads if perm else None)
            add(g + "attn_k.weight", p + "self_attn.k_proj.weight",
                matrix(n_kv * head_dim, dim), n_kv if perm else None)
            add(g + "attn_v.weight", p + "self_attn.v_proj.weight", matrix(n_kv * head_dim, dim))
        if arch == "qwen2":
            for x, n in (("q", n_heads), ("k", n_kv), ("v", n_kv)):
                add(f"{g}attn_{x}.bias", f"{p}self_attn.{x}_proj.bias", vector(n * head_dim, 0.0))
        if arch in ("qwen3", "gemma3"):
            add(g + "attn_q_norm.weight", p + "self_attn.q_norm.weight", vector(head_dim, 1.0))
            add(g + "attn_k_norm.weight", p + "self_attn.k_norm.weight", vector(head_dim, 1.0))
        add(g + "attn_output.weight", p + "self_attn.o_proj.weight", matrix(dim, n_heads * head_dim))
        if arch == "gemma3":  # the sandwich norm (fastspec's key)
            add(g + "post_attention_norm.weight", p + "post_attn_norm.weight", vector(dim, 1.0))
        add(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", vector(dim, 1.0))
        if arch == "phi3":
            fused(g + "ffn_up.weight", p + "mlp.gate_up_proj.weight",
                  {p + "mlp.gate_proj.weight": matrix(ffn, dim),
                   p + "mlp.up_proj.weight": matrix(ffn, dim)})
        else:
            add(g + "ffn_gate.weight", p + "mlp.gate_proj.weight", matrix(ffn, dim))
            add(g + "ffn_up.weight", p + "mlp.up_proj.weight", matrix(ffn, dim))
        add(g + "ffn_down.weight", p + "mlp.down_proj.weight", matrix(dim, ffn))
        if arch == "gemma3":
            add(g + "post_ffw_norm.weight", p + "post_mlp_norm.weight", vector(dim, 1.0))
    add("output_norm.weight", "model.norm.weight", vector(dim, 1.0))
    if not tied:
        add("output.weight", "lm_head.weight", matrix(len(tokens), dim))
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
