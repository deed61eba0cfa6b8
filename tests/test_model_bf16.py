"""weight_dtype="bfloat16": bf16 bit patterns in uint16, inputs of every product rounded to bf16.

The compute rule (docs/FORMATS.md): each matrix product rounds its input rows to bf16 (nearest
even) and accumulates in float32; norms, attention, softmax and residuals stay float32. The
compiled path gives a position the same bits alone or inside a block of up to 16; the NumPy
twin (fastspec.kernels.bf16.RoundingMatrix) applies the same rounding and agrees within BF16_TOL.
Every matrix-product path this CPU runs (FASTSPEC_ISA) is checked; the others are skipped.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels import bf16 as _bf16
from fastspec.formats.hf_folder import read_safetensors, save_hf, write_safetensors
from fastspec.model import ModelConfig, Transformer

from _helpers import BACKENDS, MODEL_CONFIGS, isa_params, needs_c_harness, run_c_harness

ROOT = Path(__file__).resolve().parent.parent
needs_cython = pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")
MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
#: Documented agreement of the two backends on bf16 models (docs/FORMATS.md), relative to the
#: largest magnitude: float32 sums in another order are ~1e-7, but an input that lands within
#: a float32 ulp of a bf16 rounding boundary can round to neighbouring bf16 values in the two
#: backends, and that one-ulp flip reaches every later position (measured up to 3.5e-3).
BF16_TOL = 1e-2


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=0, atol=BF16_TOL * max(np.abs(b).max(), 1e-30))

CONFIGS = MODEL_CONFIGS


def bf16_model(name="llama-gqa", seed=0):
    return Transformer.random(ModelConfig(weight_dtype="bfloat16", **CONFIGS[name]), seed=seed)


@pytest.fixture(params=isa_params(("avx2", "portable")))
def isa(request):
    """Force the compiled products onto one path and the Cython backend, then restore both."""
    from fastspec.kernels import _isa
    prev_isa = fs.kernels.isa_info()["forced"]
    with fs.using_backend("cython"):
        _isa.set_isa(request.param)
        assert fs.kernels.isa_info()["selected"] == request.param
        yield request.param
        _isa.set_isa(prev_isa)


def on(backend, fn):
    with fs.using_backend(backend):
        return fn()


# --- conversions and config -----------------------------------------------------------------

def test_round_to_nearest_even_known_values():
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7F800000,
                     0xFF800000, 0x7F800001, 0xFFC12345, 0x80000000, 0x00008000], np.uint32)
    want = np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1,
                     0x8000, 0x0000], np.uint16)
    np.testing.assert_array_equal(_bf16.to_bits(bits.view(np.float32)), want)
    x = bits.view(np.float32)
    r = _bf16.round_values(x)
    assert np.isnan(r[7]) and np.isnan(r[8])  # NaN stays NaN
    np.testing.assert_array_equal(r.view(np.uint32) >> 16, want)
    # exact both ways on bf16 values; rounding is idempotent
    w = _bf16.from_bits(want)
    np.testing.assert_array_equal(_bf16.to_bits(w), want)
    np.testing.assert_array_equal(_bf16.round_values(r[~np.isnan(r)]), r[~np.isnan(r)])
    with pytest.raises(TypeError, match="uint16"):
        _bf16.from_bits(np.zeros(3, np.int16))


def test_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    u = np.arange(0, 2**32, 65537 * 3 + 1, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32)
    ref = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    ok = ~np.isnan(x)  # torch canonicalises NaN payloads; ours keeps the sign and top bits
    np.testing.assert_array_equal(_bf16.to_bits(x)[ok], ref[ok])
    assert np.isnan(_bf16.from_bits(_bf16.to_bits(x[~ok]))).all()


def test_config():
    c = ModelConfig.tiny_llama(weight_dtype="bfloat16")
    assert c.matrix_dtype == "bfloat16" and c.matrix_itemsize == 2
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="'bfloat16' needs dtype 'float32'"):
        ModelConfig.tiny_llama("float64", weight_dtype="bfloat16")
    with pytest.raises(ValueError, match="weight_dtype must be"):
        ModelConfig.tiny_llama(weight_dtype="bf16")


def test_arrays_and_conversions():
    m = bf16_model("qwen2-bias")
    assert m.embed.dtype == np.uint16 and m.head.dtype == np.uint16
    for lw in m.layers:
        for k, a in lw.arrays().items():
            assert a.dtype == (np.uint16 if k in MATRICES else np.float32), k
            assert a.flags.c_contiguous
    wide = m.with_weight_dtype("float32")  # exact widening
    np.testing.assert_array_equal(wide.layers[1].w_up, _bf16.from_bits(m.layers[1].w_up))
    back = wide.with_weight_dtype("bfloat16")
    np.testing.assert_array_equal(back.head, m.head)
    # float32 -> bf16 is round to nearest even, from a float16 model too
    f32 = Transformer.random(ModelConfig(**CONFIGS["llama-gqa"]), seed=1)
    b = f32.with_weight_dtype("bfloat16")
    np.testing.assert_array_equal(b.layers[0].wq, _bf16.to_bits(f32.layers[0].wq))
    h = f32.with_weight_dtype("float16").with_weight_dtype("bfloat16")
    np.testing.assert_array_equal(h.embed, _bf16.to_bits(f32.embed.astype(np.float16)))


# --- the NumPy twin of the compute rule -----------------------------------------------------

def test_rounding_matrix_rounds_the_input():
    rng = np.random.default_rng(0)
    w = _bf16.from_bits(_bf16.to_bits(rng.normal(size=(24, 7))))
    x = rng.normal(size=(5, 24)).astype(np.float32)
    m = _bf16.RoundingMatrix(w)
    got = x @ m
    np.testing.assert_array_equal(got, _bf16.round_values(x) @ w)
    assert not np.array_equal(got, x @ w)  # the rounding happened


def test_numpy_forward_applies_the_rule():
    # The twin's logits differ from the float32 model on the same (widened) weights by the
    # input rounding alone: a forward that skipped it would be much closer than this.
    m = bf16_model()
    wide = m.with_weight_dtype("float32")
    ids = np.arange(20) % m.config.vocab_size
    a = on("numpy", lambda: m.forward(ids).logits)
    b = on("numpy", lambda: wide.forward(ids).logits)
    assert 1e-4 < np.abs(a - b).max() < 0.2


# --- compiled paths against the twin, and the block guarantee -------------------------------

def test_compiled_forward_applies_the_rule(isa):
    # Rounding flips make the backends agree only to BF16_TOL, about the size of the rounding
    # itself; this control shows that the compiled path does round (the C test shows how).
    m = bf16_model()
    wide = m.with_weight_dtype("float32")
    ids = np.arange(20) % m.config.vocab_size
    d = np.abs(m.forward(ids).logits - wide.forward(ids).logits)
    assert np.median(d) > 1e-5 and d.max() < 0.2


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_paths_agree_with_numpy_twin(isa, name):
    m = bf16_model(name)
    rng = np.random.default_rng(2)
    V = m.config.vocab_size
    ids, block = rng.integers(0, V, 30), rng.integers(0, V, 9)

    def run():
        cache = m.new_cache()
        a = m.forward(ids, cache, hidden_layers=(0,))
        b = m.forward(block, cache)
        c = m.forward(block[:4], cache, causal=False)
        return a.logits, a.hidden[0], b.logits, c.logits, cache.k[:, :, :43].copy()

    compiled = run()
    twin = on("numpy", run)
    for x, y in zip(compiled, twin):
        close(x, y)


def test_context_kv_and_embeddings_agree(isa):
    m = bf16_model("qwen3-untied")
    rng = np.random.default_rng(6)
    feats = rng.normal(size=(7, m.config.dim)).astype(np.float32)
    x = rng.normal(size=(9, m.config.dim)).astype(np.float32)

    def run():
        cache = m.new_cache()
        m.write_context_kv(feats, cache)
        out = m.forward_embeddings(x, cache, causal=False)
        return out.logits, cache.k[:, :, :7].copy(), cache.v[:, :, :7].copy()

    for a, b in zip(run(), on("numpy", run)):
        close(a, b)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_blocks_of_1_to_16_rows_are_bit_identical_to_decode_steps(isa, head_dim):
    cfg = ModelConfig(vocab_size=53, dim=4 * head_dim, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=3 * head_dim + 8, max_seq_len=300, weight_dtype="bfloat16")
    model = Transformer.random(cfg, seed=3)
    ids = np.random.default_rng(1).integers(0, 53, 141 + 16)
    step_cache = model.new_cache()
    model.forward(ids[:141], step_cache)
    steps = [model.forward(ids[i:i + 1], step_cache, hidden_layers=(0,))
             for i in range(141, 157)]
    step_logits = np.concatenate([s.logits for s in steps])
    step_hidden = np.concatenate([s.hidden[0] for s in steps])
    for n in range(1, 17):
        cache = model.new_cache()
        model.forward(ids[:141], cache)
        block = model.forward(ids[141:141 + n], cache, hidden_layers=(0,))
        np.testing.assert_array_equal(block.logits, step_logits[:n], err_msg=f"block of {n}")
        np.testing.assert_array_equal(block.hidden[0], step_hidden[:n])
        np.testing.assert_array_equal(cache.k[:, :, :141 + n], step_cache.k[:, :, :141 + n])


def test_greedy_speculative_equals_vanilla(isa):
    target = bf16_model("qwen2-bias", seed=4)
    draft = Transformer.random(ModelConfig(**{**CONFIGS["qwen2-bias"], "n_layers": 1},
                                           weight_dtype="bfloat16"), seed=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    want = fs.generate(target, prompt, 40).tokens
    for drafter in (fs.DraftModelDrafter(draft), fs.NgramDrafter(max_ngram=2)):
        got = fs.speculative_generate(target, drafter, prompt, 40, gamma=6)
        assert got.tokens == want


def test_dflash_on_a_bf16_target(backend):
    target = Transformer.random(ModelConfig(vocab_size=40, dim=32, n_layers=3, n_heads=4,
                                            n_kv_heads=2, ffn_dim=48, max_seq_len=96,
                                            weight_dtype="bfloat16"), seed=3)
    dcfg = fs.DFlashConfig(n_layers=2, block_size=4, tap_layers=(0, 2), mask_token_id=39)
    d = fs.DFlashModel.random(dcfg, target, seed=1)
    assert all(lw.wq.dtype == np.uint16 for lw in d.layers)
    rng = np.random.default_rng(0)
    hidden = {i: rng.normal(size=(6, 32)).astype(np.float32) for i in (0, 2)}
    block = [7, 39, 39, 39]
    ref = d.draft_block_reference(hidden, block)  # the NumPy twin's weights: rounding inputs
    cache = d.new_cache()
    d.append_hidden(cache, hidden)
    out = d.forward_block(cache, block)
    close(out, ref)


# --- ISA selection ---------------------------------------------------------------------------

@needs_cython
def test_set_isa_errors_name_the_isa():
    from fastspec.kernels import _isa
    info = _isa.isa_info()
    assert info["selected"] in info["available"]
    with pytest.raises(ValueError, match="'sse9'"):
        _isa.set_isa("sse9")
    for name in ("amx", "avx512bf16", "avx512"):
        if name not in info["available"]:
            with pytest.raises(RuntimeError, match=f"'{name}'.*lacks"):
                _isa.set_isa(name)
        elif name not in info["kernels"]:
            with pytest.raises(RuntimeError, match=f"'{name}'.*no {name} kernel"):
                _isa.set_isa(name)
    assert _isa.isa_info()["forced"] is None  # failed calls change nothing


def _selected_in_new_process(isa: str | None) -> subprocess.CompletedProcess:
    """A new interpreter with ``FASTSPEC_ISA=isa`` (None: unset) printing the path it runs."""
    code = "import fastspec as fs; print(fs.kernels.isa_info()['selected'])"
    env = {k: v for k, v in os.environ.items() if k != "FASTSPEC_ISA"}
    if isa is not None:
        env["FASTSPEC_ISA"] = isa
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@needs_cython
def test_automatic_path_order():
    """Without FASTSPEC_ISA the widest path the CPU and the build run, in the order amx,
    avx512bf16 (not on an Intel CPU: its VDPBF16PS runs at half the FMA's rate), avx512, avx2,
    portable."""
    run = _selected_in_new_process(None)
    assert run.returncode == 0, run.stderr
    info = fs.kernels.isa_info()
    intel = info["peak"]["cpu"]["vendor"] == "GenuineIntel"
    order = [n for n in ("amx", "avx512bf16", "avx512", "avx2", "portable")
             if n in info["available"] and n in info["kernels"]
             and not (n == "avx512bf16" and intel)]
    assert run.stdout.strip() == order[0]


@needs_cython
@pytest.mark.parametrize("value", ["portable", "avx512bf16", "amx", "nonsense"])
def test_fastspec_isa_environment_variable(value):
    info = fs.kernels.isa_info()
    run = _selected_in_new_process(value)
    if value in info["kernels"] and value in info["available"]:
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == value
    else:
        assert run.returncode != 0
        assert f"FASTSPEC_ISA={value}" in run.stderr and value in run.stderr.splitlines()[-1]


def test_info_prints_storage_and_path(capsys):
    from fastspec import cli
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and "float16" in out
    from fastspec.tools.environment import cpu_name
    assert f"CPU: {cpu_name()}\n" in out
    if "cython" in BACKENDS:
        assert f"matrix products: {fs.kernels.isa_info()['selected']}" in out


@pytest.mark.parametrize("flags", [[], ["-DFS_TEST_PORTABLE"]], ids=["gnu-variants", "portable"])
@needs_c_harness
def test_c_kernels_bf16_equal_f32_on_widened_weights(tmp_path, flags):
    # tests/c/linear_bf16.c: in every variant the CPU runs, f32b == f32 bit for bit on the
    # widened weights and the rounded inputs; rounding checked against a reference.
    run_c_harness("linear_bf16", flags, tmp_path)


@needs_c_harness
def test_c_kernels_amx_tiles(tmp_path):
    # tests/c/linear_amx.c: the tile-layout products (AMX tiles and AVX512-BF16) against a
    # double product of the rounded inputs, each row alone == the same row inside a block,
    # passes and groups of rows, remainders of 16 columns and 32 inputs; on a CPU without a
    # path it checks that the path is refused.
    run_c_harness("linear_amx", [], tmp_path)


@needs_cython
@pytest.mark.parametrize("tile_path", ["amx", "avx512bf16"])
def test_runners_repack_bf16_weights_when_the_path_changes(tile_path):
    # The tile layout of the AMX and AVX512-BF16 paths and the panels of the others differ: a
    # runner packed for one must not run on the other. Transformer rebuilds its runner; a bare
    # runner refuses.
    from fastspec.kernels import _isa
    info = _isa.isa_info()
    if tile_path not in info["available"] or tile_path not in info["kernels"]:
        pytest.skip(f"needs the {tile_path} path")
    m = bf16_model()
    ids = np.arange(12) % m.config.vocab_size
    prev = info["forced"]
    try:
        with fs.using_backend("cython"):
            _isa.set_isa(tile_path)
            assert _isa.bf16_tiles()
            tiles = m.forward(ids).logits
            runner = m._fused()
            _isa.set_isa("avx512")
            assert runner.stale and not _isa.bf16_tiles()
            with pytest.raises(RuntimeError, match="set_isa"):
                cache = m.new_cache()
                runner.forward(ids, cache.k, cache.v, 0)
            panels = m.forward(ids).logits  # a new runner, packed in panels
            assert not m._fused().stale and m._fused() is not runner
            _isa.set_isa(tile_path)
            again = m.forward(ids).logits
    finally:
        _isa.set_isa(prev)
    np.testing.assert_array_equal(again, tiles)
    close(panels, tiles)
    assert not np.array_equal(panels, tiles)  # two paths, two summation orders


# --- files -----------------------------------------------------------------------------------

def test_npz_round_trip_keeps_bits(tmp_path):
    m = bf16_model("qwen3-untied")
    m.save(tmp_path / "m.npz")
    back = Transformer.load(tmp_path / "m.npz")
    assert back.config == m.config
    np.testing.assert_array_equal(back.layers[2].w_down, m.layers[2].w_down)
    np.testing.assert_array_equal(back.head, m.head)
    wide = Transformer.load(tmp_path / "m.npz", weight_dtype="float32")
    np.testing.assert_array_equal(wide.embed, _bf16.from_bits(m.embed))
    f64 = Transformer.load(tmp_path / "m.npz", dtype="float64")
    assert f64.config.weight_dtype is None and f64.embed.dtype == np.float64


def test_hf_folder_round_trip_writes_bf16(tmp_path):
    m = bf16_model("qwen2-bias")
    save_hf(m, tmp_path / "hf")
    header = json.loads((tmp_path / "hf" / "model.safetensors").read_bytes()[8:][
        :int.from_bytes((tmp_path / "hf" / "model.safetensors").read_bytes()[:8], "little")])
    assert header["model.layers.0.self_attn.q_proj.weight"]["dtype"] == "BF16"
    assert header["model.layers.0.input_layernorm.weight"]["dtype"] == "F32"
    back = Transformer.load(tmp_path / "hf", weight_dtype="bfloat16")
    np.testing.assert_array_equal(back.layers[1].wv, m.layers[1].wv)
    np.testing.assert_array_equal(back.embed, m.embed)
    np.testing.assert_array_equal(back.layers[0].q_bias, m.layers[0].q_bias)
    wide = Transformer.load(tmp_path / "hf")  # default: widened to float32
    np.testing.assert_array_equal(wide.layers[1].wv, _bf16.from_bits(m.layers[1].wv))


@pytest.mark.hf
def test_torch_bf16_checkpoint_loads_without_widening(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    m = Transformer.load(tmp_path, weight_dtype="bfloat16")
    want = hf.model.layers[1].mlp.down_proj.weight.detach().T.contiguous()
    np.testing.assert_array_equal(m.layers[1].w_down,
                                  want.view(torch.int16).numpy().view(np.uint16))
    raw = read_safetensors(tmp_path / "model.safetensors", ["model.norm.weight"], bf16_bits=True)
    assert raw["model.norm.weight"].dtype == np.uint16
    assert m.final_norm.dtype == np.float32  # norms widened to the compute dtype
    # and transformers reads what save_hf writes, BF16 tensors included
    save_hf(m, tmp_path / "out")
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out",
                                                           torch_dtype=torch.bfloat16)
    assert torch.equal(again.model.layers[1].mlp.down_proj.weight,
                       hf.model.layers[1].mlp.down_proj.weight)


def test_bad_bf16_files_give_clear_errors(tmp_path):
    m = bf16_model()
    sd = m.state_dict()
    cfg = json.dumps(m.config.to_dict())
    # uint16 tensors without the bfloat16 marker
    plain = json.dumps(m.config.replace(weight_dtype=None).to_dict())
    np.savez(tmp_path / "nomark.npz", config=np.array(plain), **sd)
    with pytest.raises(ValueError, match="uint16.*not 'bfloat16'"):
        Transformer.load(tmp_path / "nomark.npz")
    # a bf16 matrix of the wrong shape
    bad = dict(sd)
    bad["model.layers.0.self_attn.q_proj.weight"] = bad["model.layers.0.self_attn.q_proj.weight"][:, :5]
    np.savez(tmp_path / "shape.npz", config=np.array(cfg), **bad)
    with pytest.raises(ValueError, match="wq must have shape"):
        Transformer.load(tmp_path / "shape.npz")
    # an integer tensor is not bf16 bits
    bad = dict(sd)
    bad["model.norm.weight"] = np.ones(m.config.dim, np.int32)
    np.savez(tmp_path / "int.npz", config=np.array(cfg), **bad)
    with pytest.raises(ValueError, match="floating point or uint16"):
        Transformer.load(tmp_path / "int.npz")
    # safetensors: a BF16 tensor of the wrong shape, and an integer weight
    save_hf(m, tmp_path / "hf")
    st = read_safetensors(tmp_path / "hf" / "model.safetensors", bf16_bits=True)
    st["model.layers.1.mlp.up_proj.weight"] = st["model.layers.1.mlp.up_proj.weight"][:-1]
    write_safetensors(tmp_path / "hf" / "model.safetensors", st)
    with pytest.raises(ValueError, match="w_up must have shape"):
        Transformer.load(tmp_path / "hf", weight_dtype="bfloat16")
    st = read_safetensors(tmp_path / "hf" / "model.safetensors", bf16_bits=True)
    st["model.layers.1.mlp.up_proj.weight"] = np.zeros((100, 48), np.int32)
    write_safetensors(tmp_path / "hf" / "model.safetensors", st)
    with pytest.raises(ValueError, match="up_proj.*I32"):
        Transformer.load(tmp_path / "hf", weight_dtype="bfloat16")
    # a header whose BF16 byte count does not match the shape
    raw = (tmp_path / "hf" / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["dtype"] = "BF16"  # F32 bytes declared as BF16
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "hf" / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text
                                                        + raw[8 + n:])
    with pytest.raises(ValueError, match="BF16.*needs"):
        Transformer.load(tmp_path / "hf", weight_dtype="bfloat16")


@needs_cython
def test_runner_refuses_wrong_weight_arrays():
    m = bf16_model()
    m.layers[0].wq = _bf16.from_bits(m.layers[0].wq)  # a float32 matrix in a bf16 model
    m.invalidate()
    with pytest.raises(TypeError, match="uint16"):
        on("cython", lambda: m.forward([1, 2]))
