"""NumPy twin of every compiled kernel in :mod:`fastspec.kernels._kernels`.

Each function here has the same name, signature, validation and result as its Cython
counterpart; it is the fallback backend and the oracle the tests compare against. It favours
obvious code over speed.
"""
from __future__ import annotations

import numpy as np

from fastspec.kernels.checks import (
    Q_ZERO,
    check_draft_rows,
    check_float_array,
    check_attention_args,
    check_cache_write_args,
    check_compact_kv_args,
    check_logits,
    check_probs_out,
    check_probability_rows,
    check_sampling_params,
    check_tokens,
    check_tree_mask,
    check_uniforms,
    check_window,
)

__all__ = [
    "attention",
    "cache_write",
    "compact_kv",
    "probs",
    "sample",
    "tree_attention",
    "verify_greedy",
    "verify_rejection",
]


def attention(q, k_cache, v_cache, length, causal=True, out=None, window=None):
    """Scaled dot-product attention of ``n`` queries over the first ``length`` cached keys.

    Parameters
    ----------
    q : ndarray of shape (n, n_heads, head_dim)
        Queries of the ``n`` newest positions ``length - n .. length - 1``.
    k_cache, v_cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        Cached keys and values; positions ``[0, length)`` are valid. ``n_heads`` must be a
        multiple of ``n_kv_heads`` (grouped-query attention: head ``h`` reads kv head
        ``h // (n_heads // n_kv_heads)``). q's dtype, or both float16 with float32 ``q``:
        the result is then that of the float32 call on the cache widened to float32 (exact).
    length : int
        Number of valid keys, ``n <= length <= capacity``.
    causal : bool, default True
        If True, query ``i`` sees keys ``< length - n + i + 1``; otherwise every key.
    out : ndarray of shape (n, n_heads, head_dim), optional
        Caller-owned, writable, C-contiguous output of the same dtype.
    window : int, optional
        A sliding window (causal only): query ``i``, at position ``p = length - n + i``, sees
        the keys ``(p - window, p]``. None: every earlier key.

    Returns
    -------
    out : ndarray of shape (n, n_heads, head_dim)
    """
    n, n_heads, head_dim, n_kv_heads = check_attention_args(q, k_cache, v_cache, length, out)
    window = check_window(window, causal)
    visible = None
    if causal:
        positions = length - n + np.arange(n)
        visible = _window(np.arange(length)[None, :] <= positions[:, None], positions, window)
    return _attend(q, k_cache, v_cache, length, visible, out)


def _window(visible, positions, window):
    """``visible`` (n, keys) without the keys at ``window`` positions or more before each
    query's position (``positions``, (n,)); ``window`` 0: as it is."""
    if window:
        visible &= np.arange(visible.shape[1])[None, :] > (positions - window)[:, None]
    return visible


def _attend(q, k_cache, v_cache, length, visible, out):
    """Softmax attention of ``q`` over keys ``[0, length)`` where ``visible`` (n, length) is
    True (None: every key), in float64; the body of both attention twins."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    group = n_heads // k_cache.shape[0]
    scale = 1.0 / np.sqrt(head_dim)
    # float64 accumulation keeps float32 results within ~1e-6 of an exact computation; a
    # float16 cache widens exactly, so it computes what its float32 widening would.
    keys = np.repeat(k_cache[:, :length].astype(np.float64), group, axis=0)  # (H, L, D)
    values = np.repeat(v_cache[:, :length].astype(np.float64), group, axis=0)
    scores = np.einsum("nhd,hld->hnl", q.astype(np.float64), keys) * scale
    if visible is not None:
        scores = np.where(visible[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    result = np.einsum("hnl,hld->nhd", weights, values).astype(q.dtype, copy=False)
    if out is None:
        return np.ascontiguousarray(result)
    out[...] = result
    return out


def tree_attention(q, k_cache, v_cache, length, tree_mask, out=None, window=None):
    """Attention of ``n`` tree nodes: each sees the cached context and its own ancestors.

    Parameters
    ----------
    q : ndarray of shape (n, n_heads, head_dim)
        Queries of the nodes stored at cache positions ``length - n .. length - 1``.
    k_cache, v_cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        As for :func:`attention` (float16 with float32 ``q`` too); keys ``[0, length - n)``
        are the committed context.
    length : int
        Number of valid keys, ``n <= length <= capacity``.
    tree_mask : ndarray of shape (n, n), bool
        ``tree_mask[i, j]``: node ``i`` sees node ``j`` (its ancestors and itself;
        :func:`fastspec.decoding.tree.ancestor_mask`). The diagonal must be True.
    out : ndarray of shape (n, n_heads, head_dim), optional
    window : int, optional
        A sliding window: node ``i``, at position ``length - n + d`` (``d``, its depth: the
        nodes it sees but itself), sees the context keys from ``length - n + d + 1 - window``
        on and its ancestors, every one of which must lie inside it (``d < window``).

    Returns
    -------
    out : ndarray of shape (n, n_heads, head_dim)
    """
    n, n_heads, head_dim, n_kv_heads = check_attention_args(q, k_cache, v_cache, length, out)
    check_tree_mask(tree_mask, n)
    window = check_window(window, True, tree_mask)
    visible = np.ones((n, length), dtype=bool)
    visible[:, length - n:] = tree_mask
    positions = length - n + np.count_nonzero(tree_mask, axis=1) - 1
    return _attend(q, k_cache, v_cache, length, _window(visible, positions, window), out)


def compact_kv(k, v, start, rows):
    """Move the cache rows ``rows`` to positions ``start ..`` (the accepted tree path), in place.

    Parameters
    ----------
    k, v : ndarray of shape (n_layers, n_kv_heads, capacity, head_dim)
        Writable, C-contiguous key and value buffers (a :class:`fastspec.KVCache`'s ``k``, ``v``)
        of one dtype: float32, float64 or float16.
    start : int
        First destination position.
    rows : ndarray of shape (m,), int64
        Strictly increasing source positions with ``rows[j] >= start + j`` and
        ``rows[-1] < capacity``; position ``start + j`` receives row ``rows[j]``.
    """
    m = check_compact_kv_args(k, v, start, rows)
    if m:
        # Fancy indexing copies the sources first, so overlapping moves are safe.
        k[:, :, start:start + m] = k[:, :, rows]
        v[:, :, start:start + m] = v[:, :, rows]


def cache_write(cache, new, start):
    """Write ``n`` new positions into one layer's cache buffer, in place.

    Parameters
    ----------
    cache : ndarray of shape (n_kv_heads, capacity, head_dim)
        Writable, C-contiguous buffer (float32, float64 or float16); positions
        ``start .. start + n - 1`` are overwritten.
    new : ndarray of shape (n, n_kv_heads, head_dim)
        The keys (or values) of the new positions, same dtype as ``cache``; or float32 for a
        float16 cache, rounded to nearest (ties to even) as ``new.astype(np.float16)``.
    start : int
        First position to write, ``0 <= start`` and ``start + n <= capacity``.
    """
    n = check_cache_write_args(cache, new, start)
    with np.errstate(over="ignore", invalid="ignore"):  # float16: inf past its largest
        cache[:, start:start + n, :] = new.transpose(1, 0, 2)


def probs(logits, temperature=1.0, top_k=0, top_p=1.0, out=None):
    """Turn rows of logits into the sampling distribution fastspec verifies against.

    The pipeline is temperature, then top-k, then top-p (nucleus). ``temperature == 0``
    gives the one-hot of the argmax (the first index among ties). Top-k keeps every token
    whose logit is at least the k-th largest (ties at the boundary are kept). Top-p sorts the
    remaining tokens by probability, descending, ties by lower index first, and keeps each
    token whose preceding mass (float64) is below ``top_p``.

    Parameters
    ----------
    logits : ndarray of shape (n, V) or (V,)
        Finite float32 or float64 logits.
    temperature : float, default 1.0
        ``>= 0``; 0 means greedy.
    top_k : int, default 0
        ``>= 0``; 0 disables it.
    top_p : float, default 1.0
        In ``(0, 1]``; 1 disables it.
    out : ndarray, optional
        Caller-owned result buffer (shape and dtype of ``logits``, C-contiguous, not
        overlapping it), overwritten; a decoding loop reuses one instead of a fresh
        ``(n, V)`` array per round.

    Returns
    -------
    p : ndarray, same shape and dtype as ``logits``
        Each row sums to 1 (``out`` when given).
    """
    check_logits(logits)
    temperature, top_k, top_p = check_sampling_params(temperature, top_k, top_p)
    if out is None:
        out = np.empty(logits.shape, dtype=logits.dtype)
    else:
        check_probs_out(out, logits)
    rows = logits.reshape(-1, logits.shape[-1]) if logits.ndim == 2 else logits[None, :]
    dest = out.reshape(rows.shape)
    for r, row in enumerate(rows):
        dest[r] = _probs_row(row, temperature, top_k, top_p)
    return out


def _probs_row(row, temperature, top_k, top_p):
    vocab = row.shape[0]
    if temperature == 0.0:
        p = np.zeros(vocab, dtype=np.float64)
        p[int(np.argmax(row))] = 1.0
        return p
    z = row.astype(np.float64) / temperature
    keep = np.ones(vocab, dtype=bool)
    if 0 < top_k < vocab:
        kth = np.partition(z, vocab - top_k)[vocab - top_k]  # a selection, not a full sort
        keep = z >= kth
    e = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p = e / e.sum()
    if top_p < 1.0:
        # Only the kept tokens can enter the nucleus, and the dropped ones (p = 0) sort after
        # every positive p: ordering the kept ones alone gives the same prefix sums.
        kept = np.flatnonzero(keep)
        order = kept[np.lexsort((kept, -p[kept]))]  # descending p, then ascending index
        mass_before = np.concatenate(([0.0], np.cumsum(p[order])[:-1]))
        nucleus = np.zeros(vocab, dtype=bool)
        nucleus[order] = mass_before < top_p
        p = np.where(nucleus, p, 0.0)
        p /= p.sum()
    return p


def sample(p, u):
    """Draw one index from weights ``p`` by inverse CDF with the uniform ``u``.

    Parameters
    ----------
    p : ndarray of shape (V,)
        Non-negative weights (need not be normalised) with a positive sum.
    u : float
        Uniform draw in ``[0, 1)``.

    Returns
    -------
    index : int
        The first ``j`` whose cumulative weight exceeds ``u * sum(p)`` (float64).
    """
    check_float_array(p, "p", 1)
    check_probability_rows(p.reshape(1, -1), "p", normalised=False)
    if isinstance(u, (str, bytes)):  # np.asarray would parse it; the compiled kernel refuses it
        raise TypeError(f"u must be a real number, got {u!r}")
    check_uniforms(np.asarray([u], dtype=np.float64), 1, "u")
    return inverse_cdf(p.astype(np.float64), float(u))


def inverse_cdf(weights, u):
    """Return the first index whose running sum of ``weights`` passes ``u`` times the total.

    The NumPy rule of every inverse-CDF draw (:func:`sample`, the residual draws of
    :func:`verify_rejection` and of tree verification).

    Parameters
    ----------
    weights : ndarray of shape (V,), float64, non-negative with a positive sum
    u : float in [0, 1)

    Returns
    -------
    int
        An index with a positive weight.
    """
    cumulative = np.cumsum(weights)
    hits = np.flatnonzero(cumulative > u * cumulative[-1])
    if hits.size:
        return int(hits[0])
    return int(np.flatnonzero(weights > 0)[-1])  # rounding left u * total at the very top


def verify_greedy(draft_tokens, target_logits):
    """Accept the longest prefix of the draft that matches the target's argmax.

    Parameters
    ----------
    draft_tokens : ndarray of shape (g,), integer
        Proposed tokens, ``0 <= token < V``.
    target_logits : ndarray of shape (g + 1, V)
        Row ``i`` scores the position of ``draft_tokens[i]``; row ``g`` scores the bonus.

    Returns
    -------
    n_accepted : int
        Number of accepted draft tokens, ``0 <= n_accepted <= g``.
    next_token : int
        The target's argmax at the first mismatch, or the bonus token after a full accept.
    """
    g = check_tokens(draft_tokens, target_logits, "target_logits")
    check_logits(target_logits, "target_logits", ndim=2)
    best = np.argmax(target_logits, axis=1)
    for i in range(g):
        if best[i] != draft_tokens[i]:
            return i, int(best[i])
    return g, int(best[g])


def verify_rejection(draft_tokens, p, q, uniforms):
    """Speculative-sampling accept/reject step; exactly preserves the target distribution.

    Token ``i`` is accepted when ``uniforms[i] * q[i, x] < p[i, x]`` (probability
    ``min(1, p/q)``). On the first rejection the correction is drawn from
    ``normalise(max(p[i] - q[i], 0))``; after a full accept the bonus is drawn from ``p[g]``.
    Both draws use ``uniforms[g]`` by inverse CDF.

    Parameters
    ----------
    draft_tokens : ndarray of shape (g,), integer
    p : ndarray of shape (g + 1, V)
        Target probabilities (rows sum to 1).
    q : ndarray of shape (g, V) or None
        Draft probabilities the tokens were sampled from; None means deterministic (one-hot)
        proposals, for which the correction is drawn from ``p`` with the proposal removed.
    uniforms : ndarray of shape (g + 1,), float64
        Draws in ``[0, 1)``.

    Returns
    -------
    n_accepted : int
    next_token : int
        The correction after a rejection, else the bonus token.
    """
    g = check_tokens(draft_tokens, p, "p")
    check_probability_rows(p, "p")
    if q is not None:
        check_draft_rows(q, p, g)
        for i in range(g):
            if not q[i, draft_tokens[i]] > 0:
                raise ValueError(Q_ZERO.format(i=i))
    check_uniforms(uniforms, g + 1)
    for i in range(g):
        x = int(draft_tokens[i])
        qx = 1.0 if q is None else float(q[i, x])
        if uniforms[i] * qx < p[i, x]:
            continue
        if q is None:
            residual = p[i].astype(np.float64).copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p[i].astype(np.float64) - q[i].astype(np.float64), 0.0)
        if not residual.sum() > 0:  # only reachable through rounding; p itself is exact then
            residual = p[i].astype(np.float64)
        return i, inverse_cdf(residual, float(uniforms[g]))
    return g, inverse_cdf(p[g].astype(np.float64), float(uniforms[g]))
