"""NumPy twin of the quantized products (:mod:`fastspec.kernels._kernels_quant`).

Same names, signatures and results as the compiled module: the packed layout byte for byte
(``csrc/fs_quant.h``), the activation rule, and the products' bits. The float steps of
docs/FORMATS.md ("Quantized products") are float32 operations; the fused multiply-adds are
emulated exactly: the product of two float32 values is exact in float64, the float64 sum is
rounded to odd (its error from a TwoSum decides the last bit; only where that can matter, see
``_fma32``) and then to float32 once, which is the correctly rounded fused result. So the twin
equals the C kernels bit for bit (the tolerance the tests allow is zero). Arguments are
checked by :mod:`fastspec.kernels.quant`.
"""
from __future__ import annotations

import numpy as np

__all__ = ["KINDS", "BLOCK", "BLOCK_BYTES", "TRANSCODED", "packed_bytes", "pack", "unpack",
           "rows", "transcode", "transcode_pack", "quantize_activations", "linear",
           "kernel_name"]

#: Kinds in csrc/fs_quant.h's order (FS_Q8_0, FS_Q4_0, FS_Q4_1).
KINDS = ("q8_0", "q4_0", "q4_1")
#: Inputs per block.
BLOCK = 32
#: Bytes of one GGUF block of each kind.
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
#: (GGUF type, the native kind it is transcoded into) -> (its block bytes, weights a block).
TRANSCODED = {("Q4_K", "q4_1"): (144, 256), ("Q4_K", "q8_0"): (144, 256),
              ("Q6_K", "q8_0"): (210, 256), ("Q5_0", "q8_0"): (22, 32)}
_COLS = 8  # output columns per packed panel
_FMAX = np.float32(np.finfo(np.float32).max)
_TINY = np.float32(2.0 ** -96)
# float64 bit fields of _fma32: the 29 bits below a float32's last, a float32 midpoint's
# pattern there, the sign cleared, and 2^-126 (below it: float32's subnormal range)
_LOW29, _HALF29 = np.uint64((1 << 29) - 1), np.uint64(1 << 28)
_ABS64, _ONE64, _SUB32 = np.uint64((1 << 63) - 1), np.uint64(1), np.uint64(897 << 52)
# rows x columns of one pass of linear's float steps (their float64 arrays stay in cache)
_CHUNK = 1 << 15


def _up64(n: int) -> int:
    return (n + 63) // 64 * 64


def _panel(kind: str, nb: int) -> tuple[int, int, int]:
    """(offset of the mins, offset of qs, bytes of qs per block) inside a panel."""
    qoff = _up64(nb * 16) * (2 if kind == "q4_1" else 1)
    return _up64(nb * 16), qoff, 256 if kind == "q8_0" else 128


def packed_bytes(kind: str, in_features: int, out_features: int) -> int:
    """Return the bytes of W (out_features, in_features) in the packed layout."""
    nb = in_features // BLOCK
    _, qoff, qb = _panel(kind, nb)
    return (qoff + nb * qb) * ((out_features + _COLS - 1) // _COLS)


def pack(kind: str, blocks: np.ndarray, in_features: int,
         out: np.ndarray | None = None) -> np.ndarray:
    """Return the packed layout (uint8, packed_bytes) of GGUF rows ``blocks`` (out, nb * bytes),
    written into ``out`` when given (uint8, packed_bytes, writable).

    Raises ValueError when a scale (or a q4_1 min) is NaN or infinite."""
    out_f, nb, bb = blocks.shape[0], in_features // BLOCK, BLOCK_BYTES[kind]
    ng = (out_f + _COLS - 1) // _COLS
    b3 = np.zeros((ng * _COLS, nb, bb), np.uint8)
    b3[:out_f] = blocks.reshape(out_f, nb, bb)
    moff, qoff, qb = _panel(kind, nb)
    panels = np.zeros((ng, qoff + nb * qb), np.uint8)
    halves = [b3[:, :, 0:2]] + ([b3[:, :, 2:4]] if kind == "q4_1" else [])
    for h, (start, half) in enumerate(zip((0, moff), halves)):
        if not np.isfinite(half.copy().view(np.float16)).all():
            raise ValueError(f"{kind} blocks hold a NaN or infinite "
                             f"{'scale' if h == 0 else 'min'}")
        # (ng, 8, nb, 2) -> (ng, nb, 8, 2)
        panels[:, start:start + nb * 16] = (half.reshape(ng, _COLS, nb, 2)
                                            .transpose(0, 2, 1, 3).reshape(ng, nb * 16))
    q = b3[:, :, (4 if kind == "q4_1" else 2):]
    groups = q.shape[2] // 4  # 8 groups of 4 inputs (q8_0), 4 groups of 4 bytes (q4)
    panels[:, qoff:] = (q.reshape(ng, _COLS, nb, groups, 4).transpose(0, 2, 3, 1, 4)
                        .reshape(ng, nb * qb))
    if out is None:
        return panels.reshape(-1)
    if out.shape != (panels.size,):
        raise ValueError(f"out must have {panels.size} bytes, got {out.shape}")
    out[:] = panels.reshape(-1)
    return out


def transcode(type_name: str, raw: np.ndarray, kind: str) -> np.ndarray:
    """Return Q4_K / Q6_K super-blocks or Q5_0 blocks ``raw`` (uint8 (rows, n * 144 | 210 |
    22)) as GGUF blocks of ``kind`` (uint8 (rows, n * (8 | 1) * (20 | 34))),
    csrc/fs_transcode.h's rules.

    Raises ValueError when a scale is NaN or infinite (not for Q4_K -> q4_1)."""
    sb, weights = TRANSCODED[type_name, kind]
    rows, n = raw.shape[0], raw.shape[1] // sb
    if raw.shape[1] != n * sb:
        raise ValueError(f"{type_name} rows must be whole blocks of {sb} bytes")
    b = np.ascontiguousarray(raw, np.uint8).reshape(rows * n, sb)
    width = weights // BLOCK * BLOCK_BYTES[kind]
    out = np.empty((rows * n, width), np.uint8)
    convert = {("Q4_K", "q4_1"): _q4_k_to_q4_1, ("Q4_K", "q8_0"): _q4_k_to_q8_0,
               ("Q6_K", "q8_0"): _q6_k_to_q8_0, ("Q5_0", "q8_0"): _q5_0_to_q8_0}[type_name, kind]
    step = 2 ** 20 // weights  # 1M weights at a time: bounded temporaries
    for i in range(0, rows * n, step):
        out[i:i + step] = convert(b[i:i + step]).reshape(-1, width)
    return out.reshape(rows, n * width)


def transcode_pack(type_name: str, raw: np.ndarray, kind: str, in_features: int,
                   out: np.ndarray | None = None) -> np.ndarray:
    """Return :func:`pack` of :func:`transcode` (the compiled module converts and packs each
    panel's rows in one pass, csrc/fs_transcode.h's fs_transcode_pack: the same bytes).

    Raises ValueError when a scale or min is NaN or infinite."""
    return pack(kind, transcode(type_name, raw, kind), in_features, out)


def _f16(a: np.ndarray) -> np.ndarray:
    """float32 values -> their float16 bytes (nearest even; the overflow is an infinity)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(np.float16).view(np.uint8)


def _q4_k_parts(b: np.ndarray):
    """Q4_K super-blocks (n, 144) -> (d * sc, dmin * m) float32 (n, 8), exact, and the
    4-bit values uint8 (n, 8, 32) of each sub-block."""
    n = b.shape[0]
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    q = b[:, 4:16]  # ggml's get_scale_min_k4
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0x0F) | (q[:, 0:4] >> 6) << 4], axis=1)
    m = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | (q[:, 4:8] >> 6) << 4], axis=1)
    qs = b[:, 16:].reshape(n, 4, 32)  # bytes 32i..: sub-block 2i low, 2i + 1 high nibbles
    with np.errstate(over="ignore", invalid="ignore"):
        return d * sc, dmin * m, np.stack((qs & 0x0F, qs >> 4), axis=2).reshape(n, 8, 32)


def _q4_k_to_q4_1(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ds, dm, nib = _q4_k_parts(b)
    out = np.empty((n, 8, 20), np.uint8)
    out[:, :, 0:2] = _f16(ds).reshape(n, 8, 2)  # a NaN or inf: refused later by the pack
    out[:, :, 2:4] = _f16(-dm).reshape(n, 8, 2)
    out[:, :, 4:] = nib[:, :, :16] | (nib[:, :, 16:] << 4)
    return out


def _q4_k_to_q8_0(b: np.ndarray) -> np.ndarray:
    if not np.isfinite(b[:, 0:4].copy().view(np.float16)).all():
        raise ValueError("Q4_K blocks hold a NaN or infinite scale or min")
    ds, dm, nib = _q4_k_parts(b)
    w = ds[:, :, None] * nib.astype(np.float32) - dm[:, :, None]  # as gguf: exact products
    return q8_0_blocks(w.reshape(-1, 32))


def q8_0_blocks(w: np.ndarray) -> np.ndarray:
    """GGUF's Q8_0 rule (ggml's reference) on float32 blocks w (n, 32) -> uint8 (n, 34):
    d = amax / 127, q = round-half-away(w / d), d stored as float16."""
    dq = np.abs(w).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(dq == 0, np.float32(0), np.float32(1) / dq)
    v = w * inv
    a = np.abs(v)
    whole = np.floor(a)
    r = whole + np.floor(np.float32(2) * (a - whole))  # half away from zero
    out = np.empty((w.shape[0], 34), np.uint8)
    out[:, 0:2] = _f16(dq)
    out[:, 2:] = np.where(v < 0, -r, r).astype(np.int8).view(np.uint8)
    return out


_E = np.arange(256)
#: Q6_K element e: low nibble (byte, shift) in ql, two high bits (byte, shift) in qh.
_Q6_LO = (_E // 128 * 64 + _E % 64, (4 * (_E % 128 // 64)).astype(np.uint8))
_Q6_HI = (_E // 128 * 32 + _E % 32, (2 * (_E % 128 // 32)).astype(np.uint8))


def _q6_k_to_q8_0(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = b[:, 208:210].copy().view(np.float16).astype(np.float32)  # (n, 1)
    if not np.isfinite(d).all():
        raise ValueError("Q6_K blocks hold a NaN or infinite scale")
    lo = (b[:, :128][:, _Q6_LO[0]] >> _Q6_LO[1]) & 0x0F
    hi = (b[:, 128:192][:, _Q6_HI[0]] >> _Q6_HI[1]) & 0x03
    q = ((lo | hi << 4).astype(np.int16) - 32).astype(np.float32)
    ds = d * b[:, 192:208].view(np.int8).astype(np.float32)  # exact
    return q8_0_blocks((np.repeat(ds, 16, axis=1) * q).reshape(n * 8, 32))


_J = np.arange(16)


def _q5_0_to_q8_0(b: np.ndarray) -> np.ndarray:
    d = b[:, 0:2].copy().view(np.float16)  # (n, 1)
    if not np.isfinite(d).all():
        raise ValueError("Q5_0 blocks hold a NaN or infinite scale")
    qh = b[:, 2:6].copy().view("<u4")  # (n, 1)
    qs = b[:, 6:22]
    x0 = (qs & 0x0F) | (((qh >> _J) << 4) & 0x10).astype(np.uint8)
    x1 = (qs >> 4) | ((qh >> (_J + 12)) & 0x10).astype(np.uint8)
    q = np.concatenate([x0, x1], axis=1).astype(np.int16) - 16
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, 0:2] = b[:, 0:2]
    out[:, 2:] = np.where(d != 0, q, 0).astype(np.int8).view(np.uint8)
    return out


def _panel_views(kind: str, packed: np.ndarray, in_features: int, out_features: int):
    """Views of packed W's ``ng`` panels (the layout of :func:`pack`): scale bytes (ng, nb, 8
    columns, 2), q4_1's min bytes (the same) or None, weight bytes (ng, nb, groups, 8, 4)."""
    nb = in_features // BLOCK
    ng = (out_features + _COLS - 1) // _COLS
    moff, qoff, qb = _panel(kind, nb)
    panels = np.asarray(packed, np.uint8).reshape(ng, -1)
    d = panels[:, :nb * 16].reshape(ng, nb, _COLS, 2)
    m = panels[:, moff:moff + nb * 16].reshape(ng, nb, _COLS, 2) if kind == "q4_1" else None
    return d, m, panels[:, qoff:qoff + nb * qb].reshape(ng, nb, qb // (4 * _COLS), _COLS, 4)


def unpack(kind: str, packed: np.ndarray, in_features: int, out_features: int) -> np.ndarray:
    """Return the GGUF rows (out_features, nb * bytes) of a packed W (the inverse of pack)."""
    d, m, q = _panel_views(kind, packed, in_features, out_features)
    ng, nb = q.shape[:2]
    parts = [h.transpose(0, 2, 1, 3) for h in (d, m) if h is not None]
    parts.append(q.transpose(0, 3, 1, 2, 4).reshape(ng, _COLS, nb, -1))
    b3 = np.concatenate(parts, axis=3).reshape(ng * _COLS, nb * BLOCK_BYTES[kind])
    return np.ascontiguousarray(b3[:out_features])


def _panel_parts(kind: str, packed: np.ndarray, in_features: int, out_features: int):
    """Scales (nb, out) float32, q4_1 mins (nb, out) float32 or None, and the weight bytes
    (ng, nb, groups, 8 columns, 4) of packed W (:func:`_panel_views`)."""
    d, m, q = _panel_views(kind, packed, in_features, out_features)

    def floats(h: np.ndarray) -> np.ndarray:  # (ng, nb, 8, 2) f16 bytes -> (nb, out) float32
        f = np.ascontiguousarray(h).view(np.float16)[..., 0].transpose(1, 0, 2)
        return f.reshape(f.shape[0], -1)[:, :out_features].astype(np.float32)

    return floats(d), (None if m is None else floats(m)), q


def _ints(kind: str, t: np.ndarray) -> np.ndarray:
    """Integer weights (..., 32) float32 of the weight bytes ``t`` (..., groups, 4) of a block
    (a strided view of :func:`_panel_parts`' bytes, read in one pass per part): q8_0 int8; q4
    the low nibbles (inputs 0-15), then the high ones (16-31), q4_0's minus 8."""
    lead, groups = t.shape[:-2], t.shape[-2]
    w = np.empty((*lead, 32), np.float32)
    if kind == "q8_0":
        w.reshape(*lead, groups, 4)[...] = t.view(np.int8)
    else:
        w4 = w.reshape(*lead, 2, groups, 4)
        w4[..., 0, :, :] = t & 15
        w4[..., 1, :, :] = t >> 4
        if kind == "q4_0":
            w -= np.float32(8)
    return w


def rows(kind: str, packed: np.ndarray, in_features: int, out_features: int,
         ids: np.ndarray) -> np.ndarray:
    """Return the dequantized rows ``ids`` of W: float32 (len(ids), in_features); only their
    panels are read, each once."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size == 0:
        return np.zeros((0, in_features), np.float32)
    nb = in_features // BLOCK
    panels = np.asarray(packed, np.uint8).reshape((out_features + _COLS - 1) // _COLS, -1)
    used, at = np.unique(ids // _COLS, return_inverse=True)  # each panel read once
    d, m, q = _panel_parts(kind, panels[used], in_features, used.size * _COLS)
    cols = at.reshape(-1) * _COLS + ids % _COLS
    w = _ints(kind, q.transpose(0, 3, 1, 2, 4)).reshape(used.size * _COLS, nb, 32)
    w = w[:ids.size] if np.array_equal(cols, np.arange(ids.size)) else w[cols]
    v = d.T[cols, :, None] * w  # (len(ids), nb, 32)
    if m is not None:
        v = v + m.T[cols, :, None]
    return v.reshape(ids.size, in_features)


def quantize_activations(x: np.ndarray, kind: str = "q8_0"):
    """Return (q int8 (n, in), d float32 (n, nb), s int32 (n, nb)): each row of x quantized per
    block of 32 (docs/FORMATS.md); ``kind`` does not change the rule."""
    x = np.asarray(x, np.float32)
    n, in_f = x.shape
    xb = x.reshape(n, in_f // BLOCK, BLOCK)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(xb)
        ok = a <= _FMAX
        bad = ~ok.all(axis=2)
        amax = np.where(ok, a, np.float32(0)).max(axis=2)
        zero = bad | (amax < _TINY)
        ident = np.float32(127) / np.where(zero, np.float32(1), amax)
        v = np.rint(xb * ident[:, :, None])
    v = np.clip(np.where(zero[:, :, None], np.float32(0), v), -127, 127)
    q = v.astype(np.int8)
    d = np.where(bad, np.float32(np.nan), np.where(zero, np.float32(0), amax / np.float32(127)))
    return (q.reshape(n, in_f), d.astype(np.float32),
            q.sum(axis=2, dtype=np.int32))


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf(a, b, c) elementwise on float32 arrays, correctly rounded (see the module doc).

    The float64 sum ``s`` of the exact product and ``c`` rounds to the fused result directly
    unless ``s`` is a float32 midpoint: rounding ``s`` to odd moves it by one float64 unit,
    which crosses no midpoint (adjacent float64 values) and lands on none (midpoints are even
    in float64). So only midpoints (and, to keep the test simple, float32's subnormal range)
    take the TwoSum; every result is the bits of the rounding to odd of all elements. The
    caller silences NumPy's overflow and invalid warnings."""
    p = np.multiply(a, b, dtype=np.float64)  # exact
    s = np.add(p, c, dtype=np.float64)
    u = s.view(np.uint64)
    odd = ((u & _LOW29) == _HALF29) | ((u & _ABS64) - _ONE64 < _SUB32 - _ONE64)
    if odd.any():
        i = np.nonzero(odd)
        ps, ss = np.broadcast_to(p, s.shape)[i], s[i]
        cs = np.broadcast_to(c, s.shape)[i].astype(np.float64)
        bv = ss - ps
        err = (ps - (ss - bv)) + (cs - bv)  # TwoSum: ss + err == ps + cs exactly
        even = (ss.view(np.uint64) & np.uint64(1)) == 0
        fix = (err != 0) & even & np.isfinite(ss)
        s[i] = np.where(fix, np.nextafter(ss, np.where(err > 0, np.inf, -np.inf)), ss)
    return s.astype(np.float32)


def linear(kind: str, x: np.ndarray, packed: np.ndarray, in_features: int, out_features: int,
           bias: np.ndarray | None, out: np.ndarray, accumulate: bool) -> np.ndarray:
    """y = out (n, out_features) [+]= x (n, in) @ W^T [+ bias] in the numerics of
    docs/FORMATS.md; returns ``out``."""
    nb = in_features // BLOCK
    q, da, sa = quantize_activations(x, kind)
    dw, mw, wq = _panel_parts(kind, packed, in_features, out_features)
    # integer sums in float32 products: each term and partial sum is an integer below 2^24
    # (|sum| <= 32 * 127 * 128), so the float32 products of the blocks are exact
    n = len(q)
    qb = q.reshape(n, nb, BLOCK).astype(np.float32)
    res = out.astype(np.float32) if accumulate else np.zeros(out.shape, np.float32)
    # columns in chunks of whole panels, n x cols <= _CHUNK (one panel at the least): the
    # float64 steps stay in cache
    cols = max(_COLS, _CHUNK // max(n, 1) // _COLS * _COLS)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = da * sa.astype(np.float32)
        for c0 in range(0, out_features, cols):
            c1 = min(c0 + cols, out_features)
            g = slice(c0 // _COLS, (c1 + _COLS - 1) // _COLS)
            acc = res[:, c0:c1]
            for b in range(nb):
                # exact integers (q4_0: the weights carry the -8, i.e. isum - 8 * s)
                w = _ints(kind, wq[g, b].swapaxes(1, 2)).reshape(-1, 32)[:c1 - c0]
                isum = qb[:, b, :] @ w.T
                acc = _fma32(dw[None, b, c0:c1] * da[:, b, None], isum, acc)
                if mw is not None:
                    acc = _fma32(mw[None, b, c0:c1], ds[:, b, None], acc)
            res[:, c0:c1] = acc
        if bias is not None:
            res += np.asarray(bias, np.float32)
    out[...] = res
    return out


def kernel_name(kind: str, n: int, in_features: int = 0) -> str:
    """Return the name of the kernel a product of n rows runs: "numpy" (this twin)."""
    return "numpy"
