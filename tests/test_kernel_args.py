"""Bad arguments: every kernel raises TypeError/ValueError naming the argument, on both backends,
with the same message."""
import numpy as np
import pytest

import fastspec as fs

F32, F64 = np.float32, np.float64


def _attn(**change):
    rng = np.random.default_rng(0)
    args = dict(q=rng.standard_normal((2, 4, 8)).astype(F32),
                k_cache=rng.standard_normal((2, 10, 8)).astype(F32),
                v_cache=rng.standard_normal((2, 10, 8)).astype(F32),
                length=6, causal=True, out=None)
    args.update(change)
    return "attention", args


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _cw(**change):
    args = dict(cache=np.zeros((2, 10, 8), F32), new=np.ones((3, 2, 8), F32), start=4)
    args.update(change)
    return "cache_write", args


def _probs(**change):
    args = dict(logits=np.zeros((2, 5), F32), temperature=1.0, top_k=0, top_p=1.0)
    args.update(change)
    return "probs", args


def _sample(**change):
    args = dict(p=np.array([0.2, 0.8], F64), u=0.5)
    args.update(change)
    return "sample", args


def _greedy(**change):
    args = dict(draft_tokens=np.array([1, 2]), target_logits=np.zeros((3, 5), F32))
    args.update(change)
    return "verify_greedy", args


P = np.full((3, 4), 0.25, F32)


def _rej(**change):
    args = dict(draft_tokens=np.array([1, 2]), p=P.copy(), q=P[:2].copy(),
                uniforms=np.array([0.1, 0.2, 0.3]))
    args.update(change)
    return "verify_rejection", args


def _with(a, index, value):
    a = a.copy()
    a[index] = value
    return a


BAD = [
    # attention
    (_attn(q=[[[1.0]]]), TypeError, "q must be a numpy.ndarray"),
    (_attn(q=np.zeros((2, 4, 8), np.int32)), TypeError, "q must be float32 or float64"),
    (_attn(q=np.zeros((2, 4, 8), F64)), TypeError, "k_cache must have dtype float64"),
    (_attn(q=np.zeros((4, 8), F32)), ValueError, "q must have 3 dimensions"),
    (_attn(q=np.zeros((2, 8, 4), F32).transpose(0, 2, 1)), ValueError, "q must be C-contiguous"),
    (_attn(k_cache=np.zeros((2, 10, 16), F32)[:, :, ::2]), ValueError,
     "k_cache must be C-contiguous"),
    (_attn(v_cache=np.zeros((2, 9, 8), F32)), ValueError, "v_cache must have the shape"),
    (_attn(k_cache=np.zeros((2, 10, 7), F32), v_cache=np.zeros((2, 10, 7), F32)), ValueError,
     "head_dim"),
    (_attn(k_cache=np.zeros((3, 10, 8), F32), v_cache=np.zeros((3, 10, 8), F32)), ValueError,
     "multiple of n_kv_heads"),
    (_attn(length=11), ValueError, r"length must be in \[2, 10\], got 11"),
    (_attn(length=1), ValueError, r"length must be in \[2, 10\], got 1"),
    (_attn(length=2.5), TypeError, "length must be an integer"),
    (_attn(out=np.zeros((2, 4, 8), F64)), TypeError, "out must have dtype float32"),
    (_attn(out=np.zeros((1, 4, 8), F32)), ValueError, "out must have shape"),
    (_attn(out=_read_only(np.zeros((2, 4, 8), F32))), ValueError, "out must be writable"),
    # cache_write
    (_cw(cache=_read_only(np.zeros((2, 10, 8), F32))), ValueError, "cache must be writable"),
    (_cw(cache=np.zeros((2, 10, 16), F32)[:, :, ::2]), ValueError,
     "cache must be C-contiguous"),
    (_cw(new=np.ones((3, 2, 8), F64)), TypeError, "new must have dtype float32"),
    (_cw(new=np.ones((3, 8), F32)), ValueError, "new must have 3 dimensions"),
    (_cw(new=np.ones((3, 1, 8), F32)), ValueError, r"new must have shape \(n, 2, 8\)"),
    (_cw(start=8), ValueError, "exceeds the cache capacity 10"),
    (_cw(start=-1), ValueError, r"start must be in \[0, 10\], got -1"),
    (_cw(start=None), TypeError, "start must be an integer"),
    # probs
    (_probs(logits=np.zeros((2, 5), np.int64)), TypeError, "logits must be float32 or float64"),
    (_probs(logits=np.zeros((2, 2, 5), F32)), ValueError, "logits must have 1 or 2 dimensions"),
    (_probs(logits=np.zeros((2, 0), F32)), ValueError, "logits must be non-empty"),
    (_probs(logits=np.zeros((5, 2), F32).T), ValueError, "logits must be C-contiguous"),
    (_probs(logits=_with(np.zeros((2, 5), F32), (1, 3), np.nan)), ValueError,
     "logits must be finite"),
    (_probs(logits=_with(np.zeros(40, F64), 37, -np.inf)), ValueError, "logits must be finite"),
    (_probs(temperature=-0.5), ValueError, "temperature must be finite and >= 0, got -0.5"),
    (_probs(temperature=np.nan), ValueError, "temperature must be finite"),
    (_probs(temperature="hot"), TypeError, "temperature must be a real number"),
    (_probs(top_k=-1), ValueError, "top_k must be in"),
    (_probs(top_k=1.5), TypeError, "top_k must be an integer"),
    (_probs(top_p=1.5), ValueError, r"top_p must be in \(0, 1\], got 1.5"),
    (_probs(top_p=0.0), ValueError, r"top_p must be in \(0, 1\], got 0.0"),
    (_probs(top_p=np.nan), ValueError, "top_p must be in"),
    # sample
    (_sample(p=np.array([[0.5, 0.5]])), ValueError, "p must have 1 dimensions"),
    (_sample(p=np.array([1, 2])), TypeError, "p must be float32 or float64"),
    (_sample(p=np.array([0.5, -0.1, 0.6])), ValueError, "p must be finite and non-negative"),
    (_sample(p=np.array([0.5, np.nan])), ValueError, "p must be finite and non-negative"),
    (_sample(p=np.zeros(3)), ValueError, "p must have a positive sum"),
    (_sample(u=1.0), ValueError, r"u must lie in \[0, 1\)"),
    (_sample(u=-0.1), ValueError, r"u must lie in \[0, 1\)"),
    # verify_greedy
    (_greedy(draft_tokens=[1, 2]), TypeError, "draft_tokens must be a numpy.ndarray"),
    (_greedy(draft_tokens=np.array([1.0, 2.0])), TypeError, "draft_tokens must be an integer"),
    (_greedy(draft_tokens=np.array([[1, 2]])), ValueError, "draft_tokens must be 1-D"),
    (_greedy(draft_tokens=np.array([1, 5])), ValueError, r"draft_tokens must be in \[0, 5\)"),
    (_greedy(draft_tokens=np.array([-1, 2])), ValueError, r"draft_tokens must be in \[0, 5\)"),
    (_greedy(target_logits=np.zeros((2, 5), F32)), ValueError,
     "target_logits must have g \\+ 1 = 3 rows"),
    (_greedy(target_logits=np.zeros(5, F32)), ValueError, "target_logits must be a 2-D"),
    (_greedy(target_logits=_with(np.zeros((3, 5), F64), (2, 4), np.inf)), ValueError,
     "target_logits must be finite"),
    (_greedy(target_logits=np.zeros((3, 5), np.int32)), TypeError,
     "target_logits must be float32 or float64"),
    # verify_rejection
    (_rej(draft_tokens=np.array([1, 4])), ValueError, r"draft_tokens must be in \[0, 4\)"),
    (_rej(p=P[:2].copy()), ValueError, "p must have g \\+ 1 = 3 rows"),
    (_rej(p=_with(P, (1, 1), -0.25)), ValueError, "p must be finite and non-negative"),
    (_rej(p=_with(P, (2, 0), np.nan)), ValueError, "p must be finite and non-negative"),
    (_rej(p=_with(P, (2, 0), 0.5)), ValueError, "p rows must sum to 1, row 2 sums to 1.25"),
    (_rej(p=np.full((3, 8), 0.25, F32)[:, ::2]), ValueError, "p must be C-contiguous"),
    (_rej(q=P[:2].astype(F64)), TypeError, r"q must have the dtype of p \(float32\)"),
    (_rej(q=P.copy()), ValueError, r"q must have shape \(2, 4\)"),
    (_rej(q=_with(P[:2], (0, 3), np.inf)), ValueError, "q must be finite and non-negative"),
    (_rej(q=_with(P[:2], (1, 3), 0.3)), ValueError, "q rows must sum to 1, row 1"),
    (_rej(q=np.array([[0.5, 0, 0.5, 0], [0.25] * 4], F32)), ValueError,
     r"q\[0, draft_tokens\[0\]\] must be > 0"),
    (_rej(uniforms=np.array([0.1, 0.2])), ValueError, r"uniforms must have shape \(3,\)"),
    (_rej(uniforms=np.array([0.1, 0.2, 1.0])), ValueError, r"uniforms must lie in \[0, 1\)"),
    (_rej(uniforms=np.array([0.1, np.nan, 0.5])), ValueError, r"uniforms must lie in \[0, 1\)"),
    (_rej(uniforms=np.array([0.1, 0.2, 0.3], F32)), TypeError, "uniforms must be float64"),
    (_rej(uniforms=[0.1, 0.2, 0.3]), TypeError, "uniforms must be a numpy.ndarray"),
]


@pytest.mark.parametrize("case, error, message", BAD, ids=[f"{c[0][0]}-{i}" for i, c in
                                                           enumerate(BAD)])
def test_bad_arguments_raise_naming_the_argument(backend, case, error, message):
    name, kwargs = case
    kernel = getattr(fs.kernels.module(backend), name)
    with pytest.raises(error, match=message):
        kernel(**kwargs)


@pytest.mark.parametrize("case, error, message", BAD, ids=[f"{c[0][0]}-{i}" for i, c in
                                                           enumerate(BAD)])
def test_both_backends_raise_the_same_message(case, error, message):
    name, kwargs = case
    messages = set()
    for backend in fs.available_backends():
        with pytest.raises((TypeError, ValueError)) as info:
            getattr(fs.kernels.module(backend), name)(**kwargs)
        messages.add((info.type, str(info.value)))
    assert len(messages) == 1, messages


def test_bad_input_never_modifies_outputs(backend):
    kern = fs.kernels.module(backend)
    cache = np.zeros((2, 10, 8), F32)
    with pytest.raises(ValueError):
        kern.cache_write(cache, np.ones((3, 2, 8), F32), 9)
    assert not cache.any()
