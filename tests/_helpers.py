"""Helpers shared by the test modules (fixtures live in conftest.py).

Test modules import from here, never from each other.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fastspec as fs

BACKENDS = fs.available_backends()
#: The backends the ``backend`` fixture runs a test on: the one a run asks for with
#: FASTSPEC_BACKEND (CI runs the suite once per backend, so each is tested once), else every
#: available one. Tests that compare the two backends use BACKENDS directly.
_REQUESTED = os.environ.get("FASTSPEC_BACKEND", "").strip().lower()
FIXTURE_BACKENDS = (_REQUESTED,) if _REQUESTED in BACKENDS else BACKENDS
DTYPES = (np.float32, np.float64)
#: relative tolerance per dtype when comparing the two backends / a float64 oracle.
RTOL = {np.float32: 1e-5, np.float64: 1e-10}
#: The seed experiment's prompt (the audits use the same one).
PREFIX = [0, 1, 3, 2, 4, 1, 5, 6]

def isa_params(skipped=("avx2",),
               names=("amx", "avx512bf16", "avx512", "avx2", "portable")) -> list:
    """The matrix-product paths ``names`` (by default every one, best first) as pytest params,
    skipped with a reason where this CPU or build lacks it; ``skipped``: the names to list
    when nothing is built."""
    if "cython" not in BACKENDS:
        return [pytest.param(n, marks=pytest.mark.skip(reason="Cython extension not built"))
                for n in skipped]
    info = fs.kernels.isa_info()
    out = []
    for name in names:
        if name not in info["available"]:
            out.append(pytest.param(name, marks=pytest.mark.skip(
                reason=f"this CPU lacks {name}")))
        elif name not in info["kernels"]:
            out.append(pytest.param(name, marks=pytest.mark.skip(
                reason=f"no {name} kernel in this build")))
        else:
            out.append(name)
    return out


def unbuilt_message() -> str | None:
    """Why this test run must stop, or None: the compiled modules are not importable while the
    run did not ask for the NumPy twin (``FASTSPEC_BACKEND=numpy``). A checkout without a build
    would otherwise test the NumPy backend only, silently."""
    if _REQUESTED == "numpy":
        return None
    missing = []
    for name in ("fastspec.kernels._kernels", "fastspec.model._model"):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if not missing:
        return None
    return ("fastspec's compiled modules are not built here: " + "; ".join(missing)
            + f". fastspec was imported from {os.path.dirname(fs.__file__)}. Build them with "
            "`pip install -e .` (or `python setup.py build_ext --inplace`), or install the "
            "package and run the tests from outside the checkout; to test the NumPy twin on "
            "purpose, set FASTSPEC_BACKEND=numpy.")


needs_cython = pytest.mark.skipif("cython" not in BACKENDS, reason="Cython extension not built")


def toy(seed, layers, dtype="float64", **kw):
    """The toy model (layer norm, learned positions) of ``seed`` with ``layers`` layers."""
    return fs.Transformer.random(fs.ModelConfig.toy(n_layers=layers, dtype=dtype, **kw), seed)


# ---- hypothesis ----------------------------------------------------------------------------

FAST_EXAMPLES = 12
SLOW_EXAMPLES = 500


def fast_and_slow(fast=FAST_EXAMPLES, slow=SLOW_EXAMPLES, *, backends=None,
                  suppress=tuple(HealthCheck), deadline=None, **strategies):
    """Turn a property into a quick test and a `slow` one with ``slow`` examples.

    With ``backends``, both are parametrised over ``backend`` in it; ``deadline`` (ms) fails
    an example that runs longer (hypothesis' setting; None: no limit).
    """
    def wrap(body):
        def make(examples):
            test = settings(max_examples=examples, deadline=deadline, derandomize=examples < 100,
                            suppress_health_check=list(suppress))(given(**strategies)(body))
            if backends is not None:
                test = pytest.mark.parametrize("backend", backends)(test)
            return test
        return make(fast), pytest.mark.slow(make(slow))
    return wrap


# ---- independent float64 formulas ----------------------------------------------------------

def naive_attention(q, k, v, length, causal):
    """Loop-per-(query, head) attention in float64, written without the twin's einsums."""
    n, n_heads, head_dim = q.shape
    group = n_heads // k.shape[0]
    out = np.zeros((n, n_heads, head_dim))
    for i in range(n):
        visible = length - n + i + 1 if causal else length
        for h in range(n_heads):
            keys = k[h // group, :visible].astype(np.float64)
            vals = v[h // group, :visible].astype(np.float64)
            s = keys @ q[i, h].astype(np.float64) / np.sqrt(head_dim)
            w = np.exp(s - s.max())
            out[i, h] = w @ vals / w.sum()
    return out


def naive_probs_row(z, temperature, top_k, top_p):
    """Temperature -> top-k -> top-p by explicit sorting with Python's stable sort."""
    vocab = len(z)
    if temperature == 0:
        p = np.zeros(vocab)
        p[int(np.argmax(z))] = 1
        return p
    z = np.asarray(z, dtype=np.float64) / temperature
    keep = np.ones(vocab, dtype=bool)
    if 0 < top_k < vocab:
        kth = sorted(z, reverse=True)[top_k - 1]
        keep = z >= kth
    e = np.where(keep, np.exp(z - z.max()), 0.0)
    p = e / e.sum()
    if top_p < 1:
        order = sorted(range(vocab), key=lambda j: (-p[j], j))
        before, nucleus = 0.0, np.zeros(vocab, dtype=bool)
        for j in order:
            nucleus[j] = before < top_p
            before += p[j]
        p = np.where(nucleus, p, 0.0)
        p = p / p.sum()
    return p


def assert_close_rel(actual, expected, rtol):
    """|actual - expected| <= rtol * max|expected| elementwise (relative to the scale)."""
    scale = max(float(np.abs(expected).max()), 1e-300)
    err = float(np.abs(actual.astype(np.float64) - expected).max())
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol:g} * {scale:.3g}"


def random_rows(rng, rows, vocab, dtype, zeros=0.3):
    p = rng.random((rows, vocab)) ** 3
    p[rng.random((rows, vocab)) < zeros] = 0
    p[:, 0] += 1e-3
    return (p / p.sum(axis=1, keepdims=True)).astype(dtype)


# Widths that are not multiples of 16 exercise the zero-padded column remainders of the kernels.
#: Small model configs shared by the float16 and bfloat16 weight tests.
#: Gemma 3's forward: GeGLU, sandwich norms, its sliding-window layers' own RoPE base (here
#: 100 against the model's 1e4, so that the two differ within a few positions), an embedding
#: scale.
GEMMA = dict(activation="geglu", post_norms=True, local_layers=(0,), local_rope_theta=100.0,
             embedding_scale=2.5)
#: transformers' Gemma3ForCausalLM config of the Gemma 3 tests: six layers, five local (RoPE base
#: 100) and a global one (base 1e4, linear scaling 2), a query_pre_attn_scalar that is not
#: head_dim's, a window of 128.
GEMMA3_HF = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=256, rope_theta=10000.0, rope_local_base_freq=100.0,
                 rms_norm_eps=1e-6, query_pre_attn_scalar=24, sliding_window=128,
                 rope_scaling={"rope_type": "linear", "factor": 2.0}, pad_token_id=0)


def path_logits(model: fs.Transformer, context, ids, parents) -> np.ndarray:
    """Each tree node's logits (n, vocab) as decoding its path after ``context`` token by token
    gives them (a fresh cache per node): what a tree step's rows must equal."""
    from fastspec.kernels.tree_shape import ancestor_mask

    mask = ancestor_mask(parents)
    rows = []
    for i in range(len(parents)):
        dec = model.new_cache()
        model.step(context, dec)
        for node in np.flatnonzero(mask[i]):
            last = model.step(ids[node:node + 1], dec).logits[0]
        rows.append(last)
    return np.array(rows)


def undone(model: fs.Transformer, **changes) -> fs.Transformer:
    """The same weights with config fields changed (a feature undone; ``post_norms=False``
    drops the sandwich norms' weights too)."""
    layers = model.layers
    if changes.get("post_norms") is False:
        layers = [dataclasses.replace(lw, attn_post_norm=None, mlp_post_norm=None)
                  for lw in layers]
    return fs.Transformer(model.config.replace(**changes), model.embed, layers, model.head,
                          model.final_norm)
MODEL_CONFIGS = {
    "llama-gqa": dict(vocab_size=77, dim=48, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=100,
                      max_seq_len=96),
    "qwen3-untied": dict(vocab_size=37, dim=40, n_layers=3, n_heads=4, n_kv_heads=1, head_dim=12,
                         ffn_dim=72, qk_norm=True, tie_embeddings=False, max_seq_len=96),
    "qwen2-bias": dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=176,
                       qkv_bias=True, max_seq_len=96),
    "toy": dict(vocab_size=11, dim=16, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=32,
                norm="layernorm", positional="learned", activation="tanh", tie_embeddings=False,
                max_seq_len=96),
    "gemma3": dict(vocab_size=70, dim=48, n_layers=3, n_heads=4, n_kv_heads=1, head_dim=16,
                   ffn_dim=80, qk_norm=True, max_seq_len=96, **GEMMA),
}


# --- C harnesses (tests/c/*.c) -----------------------------------------------------------------

#: The source tree whose csrc/ the C harnesses compile: FASTSPEC_SOURCE_ROOT (CI runs the
#: installed package's tests from a copy outside the checkout), else this file's checkout.
SOURCE_ROOT = Path(os.environ.get("FASTSPEC_SOURCE_ROOT") or Path(__file__).resolve().parent.parent)
C_COMPILER = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
def compiled_run_only(reason: str):
    """A mark that skips a test in a run of the NumPy twin on purpose (``FASTSPEC_BACKEND=numpy``,
    one of CI's two runs): for what the compiled backend's run of the same suite covers, where
    the twin adds nothing to check but time; ``reason`` says why."""
    return pytest.mark.skipif(_REQUESTED == "numpy", reason=reason)


def needs_c_harness(test):
    """Skip ``test`` unless the source tree's csrc/ and a C compiler are at hand, and in a run
    of the NumPy twin on purpose: a C harness tests the compiled core alone, which the compiled
    backend's run already covered."""
    test = compiled_run_only("the C core is tested in the compiled backend's run")(test)
    test = pytest.mark.skipif(not (SOURCE_ROOT / "csrc" / "fs_linear.h").is_file(),
                              reason="no source tree")(test)
    return pytest.mark.skipif(shutil.which(C_COMPILER) is None,
                              reason=f"no C compiler {C_COMPILER!r}")(test)


#: Core objects already compiled for a set of flags (the harnesses share them: the core is
#: most of the compile time). Kept in a temporary folder removed at exit.
_CORE_OBJECTS: dict[tuple[str, ...], list[Path]] = {}


def _core_objects(flags: list[str], base: list[str], csrc: Path) -> list[Path]:
    """Compile csrc/*.c but the model (each file in parallel) once per ``flags``."""
    import atexit
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    key = tuple(flags)
    if key not in _CORE_OBJECTS:
        out = Path(tempfile.mkdtemp(prefix="fastspec-core-"))
        atexit.register(shutil.rmtree, out, True)

        def compile_one(src: Path) -> Path:
            obj = out / f"{src.stem}.o"
            extra = (["-fno-gcse", "-fno-gcse-after-reload"] if src.name.startswith("fs_linear")
                     else [])
            build = subprocess.run([*base, *extra, "-c", str(src), "-o", str(obj)],
                                   capture_output=True, text=True, timeout=900)
            assert build.returncode == 0, build.stderr
            return obj

        sources = sorted(p for p in csrc.glob("*.c") if p.name != "fs_model.c")
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            _CORE_OBJECTS[key] = list(pool.map(compile_one, sources))
    return _CORE_OBJECTS[key]


def run_c_harness(name: str, flags: list[str], tmp_path: Path) -> None:
    """Compile ``tests/c/<name>.c`` and link it with the C core (csrc/*.c but the model,
    compiled once per ``flags`` for the whole run) built with setup.py's flags (CORE_FILE_ARGS
    included; no -march: the variants carry their own targets) plus ``flags``; run it and
    assert it reports ``0 failures``."""
    csrc = SOURCE_ROOT / "csrc"
    base = [C_COMPILER, "-O3", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi", "-pthread",
            *flags, f"-I{csrc}"]
    objects = _core_objects(flags, base, csrc)
    harness = tmp_path / f"{name}.o"
    build = subprocess.run([*base, "-c", str(SOURCE_ROOT / "tests" / "c" / f"{name}.c"), "-o",
                            str(harness)], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr
    exe = tmp_path / name
    link = subprocess.run([C_COMPILER, str(harness), *map(str, objects), "-o", str(exe), "-lm",
                           "-pthread"],
                          capture_output=True, text=True, timeout=900)
    assert link.returncode == 0, link.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failures" in run.stdout


def gguf_metadata(path) -> dict:
    """Every key/value of a GGUF file as plain Python values
    (:func:`fastspec.formats.gguf.read_metadata`); skips the test without the ``gguf`` package."""
    pytest.importorskip("gguf")
    from fastspec.formats.gguf import read_metadata

    return read_metadata(path)


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF (:func:`fastspec.models.find`), or None if not installed."""
    try:
        return fs.models.find("smollm2-135m-instruct")
    except FileNotFoundError:
        return None


def llama_cpp_logits(path, ids, n_ctx: int = 256) -> np.ndarray:
    """llama.cpp's logits (float64, (len(ids), vocab)) of GGUF file ``path`` over ``ids``: one
    thread, a float32 KV cache (its default is float16); skips the test without
    llama-cpp-python. llama.cpp rounds ``n_ctx`` up to 256."""
    llama_cpp = pytest.importorskip("llama_cpp")
    m = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, logits_all=True, n_threads=1,
                        type_k=0, type_v=0, verbose=False)
    m.eval([int(i) for i in ids])
    return np.asarray(m.scores[:len(ids)], dtype=np.float64)


def hf_reference(cls_name: str, config: dict, ids, folder: Path | None = None, seed: int = 0,
                 weights: dict | None = None) -> np.ndarray:
    """Build transformers' ``cls_name`` from ``config`` (its config class's keyword arguments)
    and return its float64 logits over ``ids``. Its weights: ``weights`` (Hugging Face names; a
    tied ``lm_head`` may be left out), else seeded random ones widened by 0.05 normal noise (the
    default init is tiny: every weight then matters); saved to ``folder`` when given. Skips
    the test without torch and transformers, or without the class."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        pytest.skip(f"this transformers has no {cls_name}")
    torch.manual_seed(seed)
    model = cls(cls.config_class(**config)).eval()
    with torch.no_grad():
        if weights is None:
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        else:
            model.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in weights.items()},
                                  strict=False)
        ref = model(torch.tensor(np.asarray(ids)[None])).logits[0].double().numpy()
    if folder is not None:
        model.save_pretrained(folder)
    return ref


def transformers_logits(folder: Path, ids) -> np.ndarray:
    """transformers' float64 logits over ``ids`` of the folder it loads (float32 weights);
    skips the test without torch and transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids)[None])).logits[0].double().numpy()
