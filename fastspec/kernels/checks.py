"""Argument validation shared by the kernels of both backends.

Every public kernel validates here (or in equivalent compiled code with the same messages)
before any work starts, so the compute loops cannot fail and bad input never reaches them.
Messages name the argument and the offending value.
"""
from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: A KV cache's dtypes: the float ones and float16 (IEEE binary16; read with float32 queries).
F16 = np.dtype(np.float16)
CACHE_DTYPES = FLOAT_DTYPES + (F16,)
#: Tolerance on ``|row.sum() - 1|`` for probability rows, per dtype.
ROW_SUM_TOL = {np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-6}

# Messages of the data checks, shared with the typed scans of fastspec.kernels._kernels.
NOT_FINITE = "{name} must be finite (found NaN or inf)"
NOT_PROBABILITIES = "{name} must be finite and non-negative"
ROW_SUM = "{name} rows must sum to 1, row {row} sums to {total:.6g}"
NO_MASS = "{name} must have a positive sum"
Q_ZERO = "q[{i}, draft_tokens[{i}]] must be > 0: the draft token cannot have been sampled from q"


def check_float_array(a, name, ndim, dtype=None, writable=False, dtypes=FLOAT_DTYPES):
    """Check ``a`` is a C-contiguous float32/float64 ndarray of rank ``ndim`` (``dtypes``: the
    dtypes accepted, :data:`CACHE_DTYPES` for a KV cache)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype not in dtypes:
        names = [d.name for d in dtypes]
        raise TypeError(f"{name} must be {', '.join(names[:-1])} or {names[-1]}, got {a.dtype}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} must be writable")


def check_index(value, name, low, high):
    """Return ``value`` as an int, checking ``low <= value <= high``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def int_range(a: np.ndarray) -> tuple[int, int]:
    """Return ``(min, max)`` of a non-empty integer array as Python ints.

    Up to 64 values (a drafter's proposal or block, every round) through a list: right after a
    forward, whose weights have left the caches, two NumPy reductions cost several microseconds
    more (docs/PERFORMANCE.md, 2026-12-06).
    """
    if a.size <= 64:
        values = a.tolist()
        return min(values), max(values)
    return int(a.min()), int(a.max())


def check_cache_dtype(q, k_cache):
    """The dtype ``k_cache`` must have with queries ``q`` (a float ndarray): q's, or float16
    with float32 queries; a float16 cache with other queries is a TypeError."""
    if isinstance(k_cache, np.ndarray) and k_cache.dtype == F16:
        if q.dtype != np.float32:
            raise TypeError(f"a float16 k_cache needs float32 q, got q {q.dtype}")
        return F16
    return q.dtype


def check_attention_args(q, k_cache, v_cache, length, out):
    """Validate :func:`attention` arguments; return ``(n, n_heads, head_dim, n_kv_heads)``.

    The caches have q's dtype, or are both float16 with float32 q (out: q's dtype)."""
    check_float_array(q, "q", 3)
    check_float_array(k_cache, "k_cache", 3, check_cache_dtype(q, k_cache), dtypes=CACHE_DTYPES)
    check_float_array(v_cache, "v_cache", 3, k_cache.dtype, dtypes=CACHE_DTYPES)
    n, n_heads, head_dim = q.shape
    n_kv_heads, capacity, _ = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have the shape of k_cache {k_cache.shape}, got {v_cache.shape}")
    if k_cache.shape[2] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[2]} does not match q head_dim {head_dim}")
    if n < 1 or head_dim < 1 or n_kv_heads < 1:
        raise ValueError(f"q and k_cache must be non-empty, got q {q.shape}, k_cache {k_cache.shape}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} (q) must be a multiple of n_kv_heads {n_kv_heads} (k_cache)")
    check_index(length, "length", n, capacity)
    if out is not None:
        check_float_array(out, "out", 3, q.dtype, writable=True)
        if out.shape != q.shape:
            raise ValueError(f"out must have shape {q.shape}, got {out.shape}")
    return n, n_heads, head_dim, n_kv_heads


def check_window(window, causal=True, tree_mask=None):
    """Validate a sliding ``window`` of :func:`attention` (causal only) or
    :func:`tree_attention` (every node's ancestors inside it); return it as an int, 0 for
    None (no window)."""
    if window is None:
        return 0
    window = check_index(window, "window", 1, 2**31 - 1)
    if not causal:
        raise ValueError("a sliding window needs causal attention")
    if tree_mask is not None:
        deepest = int(np.count_nonzero(tree_mask, axis=1).max())
        if deepest > window:
            raise ValueError(f"a tree node sees {deepest} nodes, more than the window {window}")
    return window


def check_probs_out(out, logits):
    """Check ``out`` can receive ``probs(logits)``: C-contiguous, writable, of ``logits``' shape
    and dtype, and not overlapping it (rows are read while earlier rows are written)."""
    check_float_array(out, "out", logits.ndim, logits.dtype, writable=True)
    if out.shape != logits.shape:
        raise ValueError(f"out must have shape {logits.shape}, got {out.shape}")
    if np.may_share_memory(out, logits):
        raise ValueError("out must not overlap logits")


def check_tree_mask(tree_mask, n, *, uint8=False, lower_triangular=False):
    """Validate a tree attention mask: (n, n) bool (or uint8 with ``uint8``) with a true
    diagonal, and nothing above it with ``lower_triangular`` (the runner's node order)."""
    kinds = (np.bool_, np.uint8) if uint8 else (np.bool_,)
    if not isinstance(tree_mask, np.ndarray) or tree_mask.dtype not in kinds:
        names = " or ".join(np.dtype(k).name for k in kinds)
        raise TypeError(f"tree_mask must be a {names} ndarray, got "
                        f"{getattr(tree_mask, 'dtype', type(tree_mask).__name__)}")
    if tree_mask.shape != (n, n):
        raise ValueError(f"tree_mask must have shape ({n}, {n}), got {tree_mask.shape}")
    bad = np.flatnonzero(np.diagonal(tree_mask) == 0)
    if bad.size:
        raise ValueError(f"tree_mask must have a true diagonal (every node sees itself), got "
                         f"tree_mask[{bad[0]}, {bad[0]}] = 0")
    if lower_triangular:
        above = np.argwhere(np.triu(tree_mask, 1))
        if above.size:
            raise ValueError(f"tree_mask must be lower-triangular (a node sees earlier nodes "
                             f"only), got tree_mask[{above[0, 0]}, {above[0, 1]}] set")


def check_compact_kv_args(k, v, start, rows):
    """Validate :func:`compact_kv` arguments (float16 caches too); return the number of rows
    moved."""
    check_float_array(k, "k", 4, writable=True, dtypes=CACHE_DTYPES)
    check_float_array(v, "v", 4, k.dtype, writable=True, dtypes=CACHE_DTYPES)
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {k.shape}, got {v.shape}")
    capacity = k.shape[2]
    check_index(start, "start", 0, capacity)
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype != np.int64:
        raise ValueError("rows must be a 1-D int64 ndarray")
    m = rows.shape[0]
    if m and (rows[-1] >= capacity
              or (rows < start + np.arange(m)).any() or (np.diff(rows) <= 0).any()):
        raise ValueError(f"rows must increase strictly, with rows[j] >= start + j ({start} + j) "
                         f"and below the capacity {capacity}, got {rows.tolist()}")
    return m


def check_cache_write_args(cache, new, start):
    """Validate :func:`cache_write` arguments; return the number of new positions.

    ``new`` has the cache's dtype, or is float32 for a float16 cache (rounded when written)."""
    check_float_array(cache, "cache", 3, writable=True, dtypes=CACHE_DTYPES)
    if cache.dtype == F16:
        check_float_array(new, "new", 3, dtypes=(np.dtype(np.float32), F16))
    else:
        check_float_array(new, "new", 3, cache.dtype)
    n_kv_heads, capacity, head_dim = cache.shape
    n = new.shape[0]
    if new.shape[1:] != (n_kv_heads, head_dim):
        raise ValueError(f"new must have shape (n, {n_kv_heads}, {head_dim}), got {new.shape}")
    check_index(start, "start", 0, capacity)
    if start + n > capacity:
        raise ValueError(f"start + n = {start + n} exceeds the cache capacity {capacity}")
    return n


def check_sampling_params(temperature, top_k, top_p):
    """Validate and normalise ``(temperature, top_k, top_p)``."""
    try:
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise TypeError(f"temperature must be a real number, got {temperature!r}") from None
    if not (math.isfinite(temperature) and temperature >= 0.0):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    top_k = check_index(top_k, "top_k", 0, 2**62)
    try:
        top_p = float(top_p)
    except (TypeError, ValueError):
        raise TypeError(f"top_p must be a real number, got {top_p!r}") from None
    if not 0.0 < top_p <= 1.0:  # also rejects NaN
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return temperature, top_k, top_p


def check_logits(logits, name="logits", ndim=None, data=True):
    """Check logits are a finite float array of rank 1 or 2 (or ``ndim``) with V >= 1.

    ``data=False`` checks only type and shape; the compiled kernels then scan the values in
    typed code and raise the same message (see :data:`NOT_FINITE`).
    """
    if not isinstance(logits, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(logits).__name__}")
    if logits.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {logits.dtype}")
    allowed = (1, 2) if ndim is None else (ndim,)
    if logits.ndim not in allowed:
        raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, got shape {logits.shape}")
    if logits.shape[-1] < 1 or logits.size == 0:
        raise ValueError(f"{name} must be non-empty, got shape {logits.shape}")
    if not logits.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if data and not np.isfinite(logits).all():
        raise ValueError(NOT_FINITE.format(name=name))


def check_probability_rows(p, name, normalised=True, data=True):
    """Check ``p`` is a C-contiguous 2-D float array of non-negative rows summing to 1.

    ``data=False`` checks only type and shape (the compiled kernels scan the values in typed
    code and raise the same messages, :data:`NOT_PROBABILITIES` and friends).
    """
    check_float_array(p, name, 2)
    if p.shape[1] < 1:
        raise ValueError(f"{name} must have at least one column, got shape {p.shape}")
    if not data:
        return
    if not (np.isfinite(p).all() and (p >= 0).all()):
        raise ValueError(NOT_PROBABILITIES.format(name=name))
    sums = p.sum(axis=1, dtype=np.float64)
    if normalised:
        bad = np.abs(sums - 1.0) > ROW_SUM_TOL[p.dtype]
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ValueError(ROW_SUM.format(name=name, row=r, total=sums[r]))
    elif not (sums > 0).all():
        raise ValueError(NO_MASS.format(name=name))


def check_draft_rows(q, p, g, data=True):
    """Check the draft probabilities ``q`` of verify_rejection against ``p``: an ndarray of
    p's dtype and shape ``(g, V)`` whose rows are probabilities (``data=False``: type and
    shape only, as :func:`check_probability_rows`)."""
    if not isinstance(q, np.ndarray):
        raise TypeError(f"q must be a numpy.ndarray or None, got {type(q).__name__}")
    if q.dtype != p.dtype:
        raise TypeError(f"q must have the dtype of p ({p.dtype}), got {q.dtype}")
    if q.ndim != 2 or q.shape != (g, p.shape[1]):
        raise ValueError(f"q must have shape {(g, p.shape[1])}, got {q.shape}")
    check_probability_rows(q, "q", data=data)


def check_tokens(draft_tokens, rows, rows_name):
    """Check draft tokens against a ``(g + 1, V)`` array; return ``g``."""
    if not isinstance(draft_tokens, np.ndarray):
        raise TypeError(f"draft_tokens must be a numpy.ndarray, got {type(draft_tokens).__name__}")
    if draft_tokens.dtype.kind not in "iu":
        raise TypeError(f"draft_tokens must be an integer array, got {draft_tokens.dtype}")
    if draft_tokens.ndim != 1:
        raise ValueError(f"draft_tokens must be 1-D, got shape {draft_tokens.shape}")
    if not isinstance(rows, np.ndarray) or rows.ndim != 2:
        raise ValueError(f"{rows_name} must be a 2-D numpy.ndarray")
    g = draft_tokens.shape[0]
    if rows.shape[0] != g + 1:
        raise ValueError(f"{rows_name} must have g + 1 = {g + 1} rows, got {rows.shape[0]}")
    vocab = rows.shape[1]
    if g and (draft_tokens.min() < 0 or draft_tokens.max() >= vocab):
        raise ValueError(f"draft_tokens must be in [0, {vocab}), got {draft_tokens.tolist()}")
    return g


def check_uniforms(uniforms, count, name="uniforms"):
    """Check ``count`` float64 uniforms in ``[0, 1)``."""
    if not isinstance(uniforms, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(uniforms).__name__}")
    if uniforms.dtype != np.float64:
        raise TypeError(f"{name} must be float64, got {uniforms.dtype}")
    if uniforms.shape != (count,):
        raise ValueError(f"{name} must have shape ({count},), got {uniforms.shape}")
    if not ((uniforms >= 0.0) & (uniforms < 1.0)).all():
        raise ValueError(f"{name} must lie in [0, 1)")


def check_known_fields(cls, d, name: str) -> None:
    """Raise ValueError naming the keys of ``d`` that are not fields of dataclass ``cls``."""
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {name} keys: {unknown}")
