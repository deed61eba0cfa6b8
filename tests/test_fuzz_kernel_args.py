"""Hypothesis fuzzing of the kernels with garbage arguments: random dtypes (object, complex,
bool, int, float16...), ranks, shapes (empty too), layouts (Fortran, strided, read-only,
lists, scalars) and values (NaN, inf, negatives) mixed with valid arguments.

Both backends must do the same thing: both return equal results, or both raise the same
exception class (TypeError/ValueError only), leaving caller-owned outputs untouched. A crash
of the compiled kernels would take the test process down. A few examples by default; the
`slow` copies run 500 per kernel.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import strategies as st

import fastspec as fs

from _helpers import fast_and_slow

pytestmark = pytest.mark.skipif(len(fs.available_backends()) < 2, reason="needs both backends")

DTYPES = ["f4", "f4", "f8", "f8", "f2", "i4", "i8", "u1", "?", "c8", "O"]
VALUES = [0.0, 1.0, -1.0, 0.25, 0.5, 2.0, 1e-30, math.nan, math.inf, -math.inf]


@st.composite
def garbage(draw, ndim=None, good=None):
    """A random argument; ``good`` (an ndarray) is returned unchanged half of the time."""
    if good is not None and draw(st.booleans()):
        return good.copy()
    choice = draw(st.sampled_from(["array"] * 6 + ["list", "scalar", "none", "string"]))
    if choice == "none":
        return None
    if choice == "string":
        return "x"
    if choice == "scalar":
        return draw(st.sampled_from(VALUES + [0, 3, -2, True]))
    rank = draw(st.integers(0, 4)) if ndim is None or draw(st.booleans()) else ndim
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank)))
    if good is not None and draw(st.booleans()):
        shape = good.shape
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    pool = np.array(draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=4)))
    flat = rng.choice(pool, size) if size else np.zeros(0)
    if dtype.kind in "iub":
        flat = np.nan_to_num(flat, nan=0, posinf=3, neginf=-3)
    a = flat.astype(dtype).reshape(shape) if dtype.kind != "O" else flat.astype(object).reshape(shape)
    layout = draw(st.sampled_from(["c", "c", "f", "strided", "readonly", "list"]))
    if layout == "f":
        a = np.asfortranarray(a)
    elif layout == "strided" and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]
    elif layout == "readonly":
        a.flags.writeable = False
    elif layout == "list":
        return a.tolist()
    return a


def _outcome(backend, name, args, mutable):
    before = {k: args[k].copy() for k in mutable if isinstance(args.get(k), np.ndarray)}
    try:
        result = getattr(fs.kernels.module(backend), name)(**args)
    except (TypeError, ValueError) as exc:
        for k, old in before.items():
            # Bytes, not values: NaN != NaN, and object arrays compare their pointers.
            assert args[k].tobytes() == old.tobytes(), f"{name}: {k} modified on error"
        return "error", type(exc)
    return "ok", (result, {k: args[k] for k in before})


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        tol = 1e-4 if a.dtype == np.float32 else 1e-9
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


def _compare(name, args, mutable=(), values=True):
    outcomes = {}
    for backend in ("numpy", "cython"):
        # Each backend gets its own copies of writable arrays (the call may write into them).
        fresh = {k: (v.copy() if isinstance(v, np.ndarray) and v.flags.writeable
                     and v.flags.c_contiguous else v) for k, v in args.items()}
        outcomes[backend] = _outcome(backend, name, fresh, mutable)
    (kind_n, val_n), (kind_c, val_c) = outcomes["numpy"], outcomes["cython"]
    assert kind_n == kind_c, f"{name}: numpy {outcomes['numpy']} vs cython {outcomes['cython']}"
    if kind_n == "error":
        assert val_n is val_c, f"{name}: numpy raised {val_n.__name__}, cython {val_c.__name__}"
    elif values:
        _same(val_n, val_c)


Q = np.full((2, 2, 4), 0.5, np.float32)
K = np.full((1, 6, 4), 0.25, np.float32)


def _finite(*arrays) -> bool:
    return all(not isinstance(a, np.ndarray) or a.dtype.kind != "f" or np.isfinite(a).all()
               for a in arrays)


def _attention(q, k, v, length, causal, out):
    # The caches are not scanned for NaN/inf (a per-call O(cache) pass): with non-finite cache
    # contents only the outcome (result or error class) must agree, not the values.
    _compare("attention", dict(q=q, k_cache=k, v_cache=v, length=length, causal=causal, out=out),
             mutable=("out",), values=_finite(q, k, v))


test_attention_args_fuzz, test_attention_args_fuzz_slow = fast_and_slow(
    fast=40, q=garbage(3, Q), k=garbage(3, K), v=garbage(3, K),
    length=st.sampled_from([2, 3, 6, 0, 1, 7, -1, 2.0, None, True, np.int64(4)]),
    causal=st.sampled_from([True, False, 1, None]),
    out=st.one_of(st.none(), garbage(3, np.zeros((2, 2, 4), np.float32))),
)(_attention)


def _cache_write(cache, new, start):
    _compare("cache_write", dict(cache=cache, new=new, start=start), mutable=("cache",))


test_cache_write_args_fuzz, test_cache_write_args_fuzz_slow = fast_and_slow(
    fast=40, cache=garbage(3, np.zeros((1, 6, 4), np.float32)), new=garbage(3, K[:, :2].reshape(2, 1, 4)),
    start=st.sampled_from([0, 3, 4, 5, 6, -1, 2.0, None, np.uint8(1)]),
)(_cache_write)


def _probs(logits, temperature, top_k, top_p):
    _compare("probs", dict(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p))


test_probs_args_fuzz, test_probs_args_fuzz_slow = fast_and_slow(
    fast=40, logits=garbage(2, np.array([[0.0, 1.0, -1.0]], np.float32)),
    temperature=st.sampled_from([0.0, 0.7, 1.0, -1.0, math.nan, math.inf, 1e-300, "1", None]),
    top_k=st.sampled_from([0, 1, 2, 5, -1, 1.5, None, 2**70]),
    top_p=st.sampled_from([1.0, 0.5, 1e-9, 0.0, -0.1, 1.5, math.nan, None]),
)(_probs)


def _sample(p, u):
    _compare("sample", dict(p=p, u=u))


test_sample_args_fuzz, test_sample_args_fuzz_slow = fast_and_slow(
    fast=40, p=garbage(1, np.array([0.2, 0.3, 0.5])),
    u=st.sampled_from([0.0, 0.5, 0.999999, 1.0, -0.0, -1e-9, math.nan, math.inf, None, "0.5", 1]),
)(_sample)


P = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]], np.float32)


def _verify(draft, p, q, uniforms, logits):
    _compare("verify_rejection", dict(draft_tokens=draft, p=p, q=q, uniforms=uniforms))
    _compare("verify_greedy", dict(draft_tokens=draft, target_logits=logits))


test_verify_args_fuzz, test_verify_args_fuzz_slow = fast_and_slow(
    fast=40, draft=st.one_of(garbage(1, np.array([0, 2])),
                             st.sampled_from([np.array([0, 3]), np.array([-1, 0]),
                                              np.array([1], np.uint8), np.zeros(0, np.int64)])),
    p=garbage(2, P), q=st.one_of(st.none(), garbage(2, P[:2])),
    uniforms=garbage(1, np.array([0.1, 0.6, 0.3])),
    logits=garbage(2, np.log(P + 1e-9)),
)(_verify)
