"""weight_dtype="q8_0" | "q4_0" | "q4_1": a Transformer on GGUF's quantized blocks.

The matrices (embedding, head, attention and MLP projections) are QuantMatrix; every product
quantizes its input rows per block of 32 and sums integer block products in a fixed order
(docs/FORMATS.md), so on the compiled path a position's logits are the same bits alone or
inside a block of up to 16 rows (chains and trees), on every matrix-product path this CPU runs
(the others are skipped), and greedy speculative decoding equals greedy vanilla decoding for
every drafter. The NumPy twin agrees within QUANT_TOL.
"""
import numpy as np
import pytest

import fastspec as fs
from fastspec.kernels.tree_shape import ancestor_mask, tree_depths
from fastspec.model import ModelConfig, Transformer
from fastspec.model.quantized import QuantMatrix, is_quant
from fastspec.model.schema import FORWARD_MATRICES

from _helpers import GEMMA, isa_params, needs_cython

KINDS = ("q8_0", "q4_0", "q4_1")
MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
#: Agreement of the NumPy twin with the compiled path on quantized models, relative to the
#: largest logit (docs/FORMATS.md): the twin sums the blocks in float32 in another order,
#: and an activation that lands on a rounding boundary of its int8 grid may round to the
#: neighbouring level in the two backends; that one-level flip reaches every later position.
QUANT_TOL = 2e-2
#: Every in-width a multiple of 32 (dim, heads * head_dim, ffn): a qwen3-like untied model
#: with QK-norm, a llama with grouped-query attention, a qwen2 with biases.
CONFIGS = {
    "llama-gqa": dict(vocab_size=77, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                      max_seq_len=128),
    "qwen3-untied": dict(vocab_size=45, dim=32, n_layers=2, n_heads=4, n_kv_heads=1,
                         head_dim=16, ffn_dim=64, qk_norm=True, tie_embeddings=False,
                         max_seq_len=128),
    "qwen2-bias": dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                       ffn_dim=128, qkv_bias=True, max_seq_len=128),
    "smollm3-nope": dict(vocab_size=77, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                         max_seq_len=128, nope_layers=(1,)),
    "gemma3": dict(vocab_size=77, dim=64, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=32,
                   ffn_dim=96, qk_norm=True, max_seq_len=128, **GEMMA),
}


def qmodel(kind, name="llama-gqa", seed=0):
    return Transformer.random(ModelConfig(**CONFIGS[name]), seed=seed).quantize(kind)


@pytest.fixture(params=isa_params())
def isa(request):
    """Force the compiled products onto one path and the Cython backend, then restore both."""
    prev = fs.kernels.isa_info()["forced"]
    with fs.using_backend("cython"):
        fs.kernels.set_isa(request.param)
        try:
            yield request.param
        finally:
            fs.kernels.set_isa(prev)


# --- the model and its config ---------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_quantize_makes_quant_matrices_and_keeps_the_rest_float32(kind):
    base = Transformer.random(ModelConfig(**CONFIGS["qwen2-bias"]), seed=1)
    q = base.quantize(kind)
    assert q.config.weight_dtype == kind and q.config.quantized and q.config.dtype == "float32"
    assert q.head is q.embed  # tied: one matrix, (vocab, dim) rows
    assert (q.embed.out_features, q.embed.in_features) == (300, 64)
    for lw in q.layers:
        for name in MATRICES:
            assert is_quant(getattr(lw, name)) and getattr(lw, name).kind == kind
        assert lw.q_bias.dtype == np.float32 and lw.attn_norm.dtype == np.float32
    assert q.n_params == base.n_params
    # dequantized rows are the blocks' values
    np.testing.assert_allclose(q.embed.rows([3])[0], q.embed.dequantize()[3])
    back = q.with_weight_dtype(None)
    assert back.config.weight_dtype is None
    np.testing.assert_array_equal(back.embed, q.embed.dequantize())


def test_quantize_untied_head_and_from_16_bit_storage():
    base = Transformer.random(ModelConfig(weight_dtype="bfloat16", **CONFIGS["qwen3-untied"]))
    q = base.quantize("q8_0")
    assert q.head is not q.embed and (q.head.in_features, q.head.out_features) == (32, 45)
    wide = base.with_weight_dtype("float32")
    err = np.abs(q.layers[0].wq.dequantize().T - wide.layers[0].wq).max()
    assert err <= np.abs(wide.layers[0].wq).max() / 100
    # quantizing again to the same kind keeps the very blocks; another kind requantizes
    assert q.quantize("q8_0").layers[1].w_up is q.layers[1].w_up
    assert q.quantize("q4_1").layers[1].w_up.kind == "q4_1"


@pytest.mark.parametrize("kw, match", [
    (dict(dim=48, n_heads=4), "dim must be a multiple of 32"),
    (dict(dim=64, n_heads=4, ffn_dim=100), "ffn_dim must be a multiple of 32"),
    (dict(dim=64, n_heads=4, head_dim=12), r"n_heads \* head_dim must be a multiple of 32"),
    (dict(dim=64, n_heads=4, dtype="float64"), "needs dtype 'float32'"),
])
def test_config_refuses_what_blocks_of_32_cannot_store(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=10, n_layers=1, weight_dtype="q4_1", **kw)
    with pytest.raises(ValueError, match="weight_dtype must be"):
        ModelConfig(vocab_size=10, dim=64, n_layers=1, n_heads=4, weight_dtype="q5_0")


def test_quantize_refuses_non_finite_weights_and_bad_kinds():
    base = Transformer.random(ModelConfig(**CONFIGS["llama-gqa"]))
    base.layers[0].wq[3, 5] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        base.quantize("q8_0")
    with pytest.raises(ValueError, match="kind must be one of"):
        base.quantize("q3")


def test_quantized_model_saves_as_gguf_only(tmp_path):
    q = qmodel("q8_0")
    for path in (tmp_path / "m.npz", tmp_path / "folder"):
        with pytest.raises(ValueError, match="saved as GGUF"):
            q.save(path)


def test_bad_blocks_are_a_clear_error():
    w = QuantMatrix.from_float("q8_0", np.ones((4, 64), np.float32)).to_blocks().copy()
    w[1, 0:2] = np.array([np.inf], np.float16).view(np.uint8)  # the scale of a block
    with pytest.raises(ValueError):
        QuantMatrix.from_blocks("q8_0", w, 64)
    with pytest.raises(ValueError):  # the row holds one block and a half
        QuantMatrix.from_blocks("q8_0", np.zeros((4, 51), np.uint8), 64)


# --- numerics -----------------------------------------------------------------------------

@needs_cython
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_row_alone_equals_row_in_a_block(kind, name, isa):
    """Positions decoded one at a time, and the same positions as blocks of 2..16 after the
    same context: the same logits, bit for bit."""
    model = qmodel(kind, name, seed=3)
    rng = np.random.default_rng(7)
    V = model.config.vocab_size
    context, ids = rng.integers(0, V, 21), rng.integers(0, V, 16)
    cache = model.new_cache()
    model.step(context, cache)
    alone = []
    for t in ids:
        alone.append(model.step([t], cache).logits[0].copy())
    alone = np.stack(alone)
    for n in (2, 3, 5, 8, 13, 16):
        cache.crop(21)
        block = model.step(ids[:n], cache).logits
        np.testing.assert_array_equal(block, alone[:n], err_msg=f"{kind} {name} {isa} n={n}")


@needs_cython
@pytest.mark.parametrize("kind", KINDS)
def test_tree_node_equals_decoding_its_path(kind, isa):
    model = qmodel(kind, "llama-gqa", seed=4)
    rng = np.random.default_rng(1)
    context = rng.integers(0, 77, 30)
    parents = np.array([-1, 0, 0, 1, 1, 2, -1, 6, 3, 8, 3, 0, 11, 5, 7], dtype=np.int32)
    ids = rng.integers(0, 77, parents.shape[0])
    cache = model.new_cache()
    model.step(context, cache)
    tree = model.step(ids, cache, tree_parents=parents)
    mask = ancestor_mask(parents)
    for i in range(parents.shape[0]):
        dec = model.new_cache()
        model.step(context, dec)
        for node in np.flatnonzero(mask[i]):
            out = model.step(ids[node:node + 1], dec)
        np.testing.assert_array_equal(tree.logits[i], out.logits[0])
    assert tree_depths(parents).max() == 5  # a real tree: branches and depth


@needs_cython
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_numpy_twin_agrees_with_the_compiled_path(kind, name):
    model = qmodel(kind, name, seed=5)
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, 24)
    out = {}
    for backend in ("cython", "numpy"):
        with fs.using_backend(backend):
            cache = model.new_cache()
            a = model.step(ids[:17], cache, hidden_layers=(0,))
            b = model.step(ids[17:], cache)
            out[backend] = np.concatenate([a.logits, b.logits])
    scale = np.abs(out["cython"]).max()
    np.testing.assert_allclose(out["numpy"], out["cython"], rtol=0, atol=QUANT_TOL * scale)


@pytest.mark.parametrize("kind", KINDS)
def test_quantized_logits_stay_near_the_float_model(kind, backend):
    """Not a tolerance of the format (that is docs/FORMATS.md's): a sanity bound that catches
    a transposed or misassigned matrix (which gives O(1) differences)."""
    base = Transformer.random(ModelConfig(**CONFIGS["llama-gqa"]), seed=6)
    ids = np.arange(1, 20)
    ref = base.forward(ids).logits
    got = base.quantize(kind).forward(ids).logits
    rel = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
    assert rel < (0.05 if kind == "q8_0" else 0.4), rel


# --- lossless speculative decoding --------------------------------------------------------

def _drafters(target, draft, kind):
    from fastspec.drafters.dflash_config import DFlashConfig
    from fastspec.drafters.dflash_model import DFlashModel
    dcfg = DFlashConfig(block_size=4, n_layers=1, tap_layers=(0, 1), mask_token_id=3)
    dflash = DFlashModel.random(dcfg, target, seed=2)
    return {"ngram": fs.NgramDrafter(max_ngram=2), "ngram_tree": fs.NgramDrafter(tree=True),
            "draft": fs.DraftModelDrafter(draft), "dflash": fs.DFlashDrafter(dflash),
            "dflash_tree": fs.DFlashDrafter(dflash, tree_budget=8)}


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_speculative_equals_greedy_vanilla(kind, backend):
    target = qmodel(kind, "llama-gqa", seed=8)
    draft = Transformer.random(ModelConfig(**{**CONFIGS["llama-gqa"], "n_layers": 1}),
                               seed=9).quantize(kind)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7, 1, 2]
    want = fs.generate(target, prompt, 24).tokens
    for name, drafter in _drafters(target, draft, kind).items():
        got = fs.speculative_generate(target, drafter, prompt, 24, gamma=4)
        assert got.tokens == want, (kind, name)


def test_embedded_models_derive_q8_0():
    if not fs.pretrained.available():
        pytest.skip("embedded model files not installed")
    bundle = fs.pretrained.load(weight_dtype="q8_0")
    assert bundle.target.config.weight_dtype == "q8_0" and bundle.draft.config.quantized
    ids = bundle.tokenizer.encode("def f(x):\n    return x", add_bos=True)
    want = fs.generate(bundle.target, ids, 16).tokens
    for drafter in (fs.NgramDrafter(), fs.DFlashDrafter(bundle.dflash)):
        assert fs.speculative_generate(bundle.target, drafter, ids, 16).tokens == want


@needs_cython
@pytest.mark.parametrize("kind", KINDS)
def test_thread_count_does_not_change_the_bits(kind):
    # the FFN (256 x 1088) and the tied head (1030 x 256) hold FS_LIN_PARALLEL_MIN weights or
    # more, so threads split them (smaller products stay on the caller)
    cfg = dict(CONFIGS["qwen2-bias"], vocab_size=1030, dim=256, n_heads=4, n_kv_heads=2,
               ffn_dim=1088, n_layers=1)
    model = Transformer.random(ModelConfig(**cfg), seed=10).quantize(kind)
    ids = np.arange(3, 20)
    out = {}
    prev = fs.kernels.get_threads()
    try:
        with fs.using_backend("cython"):
            for threads in (1, 2):
                fs.kernels.set_threads(threads)
                out[threads] = model.forward(ids).logits
    finally:
        fs.kernels.set_threads(prev)
    np.testing.assert_array_equal(out[1], out[2])


# --- one arena of huge pages, in the forward's order -------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matrices_lie_in_one_arena_in_the_order_a_step_reads_them(name):
    from fastspec.kernels.arena import in_arena
    model = qmodel("q8_0", name, seed=2)
    mats = [getattr(lw, n) for lw in model.layers for n in FORWARD_MATRICES
            if getattr(lw, n, None) is not None] + [model.head]
    if model.embed is not model.head:
        mats.append(model.embed)
    assert all(in_arena(m.packed) for m in mats)
    starts = [m.packed.ctypes.data for m in mats]
    ends = [s + m.nbytes for s, m in zip(starts, mats)]
    assert all(e <= s for e, s in zip(ends, starts[1:])), "not laid out in forward order"
    assert ends[-1] - starts[0] < 2 * sum(m.nbytes for m in mats)  # one buffer, packed tight


@needs_cython
@pytest.mark.parametrize("kind", KINDS)
def test_arena_model_gives_the_bits_of_scattered_matrices(kind):
    """The same model with every matrix in its own allocation: the same logits, bit for bit."""
    import dataclasses
    from fastspec.kernels.arena import in_arena
    model = qmodel(kind, "qwen3-untied", seed=4)
    other = qmodel(kind, "qwen3-untied", seed=4)
    own = lambda m: QuantMatrix(m.kind, m.in_features, m.out_features,  # noqa: E731
                                np.array(m.packed))
    other.layers = [dataclasses.replace(lw, **{n: own(getattr(lw, n)) for n in FORWARD_MATRICES})
                    for lw in other.layers]
    other.head, other.embed = own(other.head), own(other.embed)
    other.invalidate()
    assert not in_arena(other.layers[0].wq.packed)
    ids = np.arange(3, 40) % model.config.vocab_size
    with fs.using_backend("cython"):
        np.testing.assert_array_equal(model.forward(ids).logits, other.forward(ids).logits)
