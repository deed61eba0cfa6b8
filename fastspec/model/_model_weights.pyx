"""The weights of a :class:`fastspec.Transformer` in the C layout of the fused forward.

:class:`ModelWeights` checks a model's arrays (dtype, shape, contiguity, presence), packs the
float32 and 16-bit matrices for the float kernels (``fs_pack_f32``, panels of 48 columns) and
fills the C structs of ``csrc/fs_model.h`` with raw pointers to them, keeping every array it
points into alive. :class:`fastspec.model._model.TransformerRunner` runs the forward over them.
"""
import weakref
from functools import partial

import numpy as np

cimport numpy as cnp
from libc.stdint cimport uint8_t, uint16_t
from libc.stdlib cimport calloc, free

from fastspec.kernels._csrc cimport (
    FS_MV_F32,
    FS_MV_F32B,
    FS_MV_F32H,
    FS_MV_F32Q,
    fs_layer_set_f32q,
    fs_model_set_f32q,
    fs_quant_packed_bytes,
    fs_quant_scratch_bytes,
    fs_layer_f32,
    fs_layer_f32h,
    fs_layer_f64,
    fs_layer_set_f32,
    fs_layer_set_f32h,
    fs_layer_set_f64,
    fs_model_set_f32,
    fs_model_set_f32h,
    fs_model_set_f64,
    fs_amx_packed_len,
    fs_pack_bf16_amx_strided,
    fs_pack_strided,
    fs_packed_len,
)
from fastspec.kernels._isa cimport share_table

from fastspec.kernels._isa import bf16_tiles
from fastspec.kernels.arena import WeightArena
from fastspec.model.functional import layer_window
from fastspec.model.schema import FORWARD_MATRICES

cnp.import_array()
share_table()  # pack bf16 matrices for the path of fastspec.kernels.set_isa

__all__ = ["ModelWeights", "linear_weights", "packed_of", "forget_packed", "bf16_tiles"]

_ACTS = {"swiglu": 0, "tanh": 1, "gelu": 2, "geglu": 3}
_LAYER_FIELDS = FORWARD_MATRICES + ("attn_norm", "mlp_norm", "q_norm", "k_norm", "q_bias",
                                    "k_bias", "v_bias", "attn_post_norm", "mlp_post_norm")
_N_MATRICES = len(FORWARD_MATRICES)  # _LAYER_FIELDS[:_N_MATRICES]: in the weight dtype
cdef enum:
    _N_FIELDS = 16  # len(_LAYER_FIELDS): fs_layer_set's pointers
assert len(_LAYER_FIELDS) == _N_FIELDS


def _rope_kinds(cfg):
    """Each layer's RoPE tables (csrc/fs_model.h's FS_ROPE_*): 1 for a NoPE layer
    (``nope_layers``), 2 for a local one (``local_layers``, their own base), else 0."""
    nope, local = frozenset(cfg.nope_layers or ()), frozenset(cfg.local_layers or ())
    return [1 if i in nope else 2 if i in local else 0 for i in range(cfg.n_layers)]


def _windows(cfg):
    """Each layer's sliding window (functional.layer_window), 0: none."""
    return [layer_window(cfg, i) or 0 for i in range(cfg.n_layers)]


def _needed(cfg):
    """The indices into _LAYER_FIELDS a layer of config ``cfg`` must hold."""
    return ([0, 1, 2, 3, 5, 6] + ([4] if cfg.activation in ("swiglu", "geglu") else [])
            + ([7, 8] if cfg.norm == "rmsnorm" else []) + ([9, 10] if cfg.qk_norm else [])
            + ([14, 15] if cfg.post_norms else []))


cdef inline void *_ptr(object a) except? NULL:
    """Raw data pointer of a C-contiguous ndarray, or NULL for None."""
    if a is None:
        return NULL
    return cnp.PyArray_DATA(<cnp.ndarray>a)


def linear_weights(object a):
    """Return matrix ``a`` (in, out) in the layout the runners' linear kernel reads.

    float32: a packed copy (panels of 48 columns, ``fs_pack_f32``); float64: ``a`` itself. For
    :meth:`TransformerRunner.context_kv_taps`, which checks the length of the result, not the
    shape it came from.
    """
    if not isinstance(a, np.ndarray) or a.ndim != 2 or not a.flags.c_contiguous:
        raise ValueError("expected a C-contiguous 2-D ndarray")
    if a.dtype == np.float64:
        return a
    if a.dtype != np.float32:
        raise TypeError(f"weights must be float32 or float64, got {a.dtype}")
    return _packed(a)


cdef inline bint _tile_layout(object a, bint tiles):
    """Whether matrix ``a`` is packed in the tile layout (the amx and avx512bf16 paths): bf16
    bits (uint16) and ``tiles``."""
    return tiles and a.dtype == np.uint16


cdef inline size_t _packed_len(object a, bint tiles):
    """Elements of the packed copy of matrix ``a`` in its layout."""
    cdef int rows = <int>a.shape[0], cols = <int>a.shape[1]
    return fs_amx_packed_len(rows, cols) if _tile_layout(a, tiles) else fs_packed_len(rows, cols)


def _packed(object a, object arena=None, bint tiles=False):
    """Return the float kernels' packed copy of matrix ``a`` (rows, cols) (``fs_pack_f32``'s
    layout; bf16 with ``tiles``: ``fs_pack_bf16_amx``'s), carved from ``arena`` (a
    :class:`~fastspec.kernels.arena.WeightArena`) when one is given. ``a`` is C-contiguous,
    or the transpose of a C-contiguous array (a tied head, ``embed.T``), packed from there
    without a copy."""
    if a.ndim != 2:
        raise ValueError(f"weight matrices must be 2-D, got shape {a.shape}")
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError("weight matrices must be C-contiguous or the transpose of such")
    cdef int rows = <int>a.shape[0], cols = <int>a.shape[1]
    cdef size_t n = _packed_len(a, tiles)
    cdef cnp.ndarray p = arena.take(n, a.dtype) if arena is not None else np.empty(n, a.dtype)
    # element strides; a 1-row or 1-column matrix is both layouts: read it as C-contiguous
    cdef size_t rs = cols, cs = 1
    if not a.flags.c_contiguous:
        rs, cs = 1, rows
    if _tile_layout(a, tiles):
        fs_pack_bf16_amx_strided(<const uint16_t *>_ptr(a), rows, cols, rs, cs,
                                 <uint16_t *>cnp.PyArray_DATA(p))
    else:
        fs_pack_strided(_ptr(a), a.dtype.itemsize, rows, cols, rs, cs, cnp.PyArray_DATA(p))
    return p


# The packed copy of each source matrix, by the source's id and layout: runners built over the
# same array share one copy (a DFlash drafter's stack multiplies by its target's head, 311 MB
# packed at the Qwen3 shape; each thread builds its own runner). Values: weak references to
# the source and to its packed copy; an entry whose copy died is replaced on the next build.
_packed_by_source: dict = {}


def packed_of(a, tiles=None):
    """The live packed copy of matrix ``a`` that runners share, or None; in the AMX tile
    layout or not (``tiles``; None: the layout the products read now, :func:`bf16_tiles`)."""
    if tiles is None:
        tiles = bf16_tiles()
    hit = _packed_by_source.get((id(a), _tile_layout(a, tiles)))
    if hit is None or hit[0]() is not a:
        return None
    return hit[1]()


def forget_packed(arrays):
    """Stop sharing the packed copies of ``arrays`` (``Transformer.invalidate``: they may have
    changed in place); runners built later pack them afresh."""
    for a in arrays:
        for layout in (False, True):
            _packed_by_source.pop((id(a), layout), None)


def _shared_packed(object a, object arena, bint tiles):
    """:func:`_packed` of ``a``, or the copy another runner already made of the same array."""
    p = packed_of(a, tiles)
    if p is None:
        key = (id(a), _tile_layout(a, tiles))
        p = _packed(a, arena, tiles)
        _packed_by_source[key] = (weakref.ref(a, partial(_drop_entry, key)), weakref.ref(p))
    return p


def _drop_entry(key, source_ref):
    """Remove the entry of a source array that died (unless its id already names another)."""
    hit = _packed_by_source.get(key)
    if hit is not None and hit[0] is source_ref:
        del _packed_by_source[key]


#: The C kind of each quantized weight_dtype (fs_quant.h's FS_Q8_0, FS_Q4_0, FS_Q4_1).
_QKIND = {"q8_0": 0, "q4_0": 1, "q4_1": 2}


def _f32(a, keep):
    """``a`` checked to be None or a C-contiguous float32 array (kept alive in ``keep``)."""
    if a is None:
        return None
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise TypeError("runner weights must be C-contiguous float32 arrays")
    keep.append(a)
    return a


def _qpacked(a, int kind):
    """The packed bytes (``fs_quant_pack``'s layout) of QuantMatrix ``a``: its own, read in
    place (a tied head is the embedding: one copy), checked to be of the right length."""
    P = getattr(a, "packed", None)
    if (not isinstance(P, np.ndarray) or P.dtype != np.uint8 or P.ndim != 1
            or not P.flags.c_contiguous
            or P.shape[0] != fs_quant_packed_bytes(kind, a.in_features, a.out_features)):
        raise ValueError(f"a {a.kind} matrix's packed bytes do not match its shape")
    return P


def _packed_bytes(model, itemsize: int, bint tiles) -> int:
    """The arena bytes of the packed layer matrices and head of ``model`` (the ones present
    and 2-D; :class:`ModelWeights` rejects the rest)."""
    mats = [getattr(lw, name, None) for lw in model.layers for name in _LAYER_FIELDS[:_N_MATRICES]]
    total = 0
    for a in mats + [model.head]:
        if isinstance(a, np.ndarray) and a.ndim == 2:
            total += WeightArena.padded(_packed_len(a, tiles) * itemsize)
    return total


cdef class ModelWeights:
    """The C structs of one model's weights (see the module docstring).

    Parameters
    ----------
    model : fastspec.Transformer
        Its weight arrays must stay alive and keep their shapes; this object holds references.
        float64 models are read in place; float32 and 16-bit matrices are copied once into the
        packed layout, so updates of those arrays are seen only by new weights. bf16 matrices
        are packed for the path the products run when the weights are built (the tile layout
        of the amx and avx512bf16 paths, or panels): see :attr:`tiles`.
    """

    def __cinit__(self):
        self.layers32 = NULL
        self.layers64 = NULL
        self.layers16 = NULL
        self.layersq = NULL
        self.qmats = NULL
        self.mptr = NULL

    def __init__(self, model):
        cfg = model.config
        dt = np.dtype(cfg.dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"model dtype must be float32 or float64, got {dt}")
        wname = getattr(cfg, "weight_dtype", None) or str(dt)
        if wname in _QKIND:
            wname = str(dt)  # quantized: the float32 arrays (norms, biases) checked below
        self.bf16 = wname == "bfloat16"
        self.tiles = self.bf16 and bf16_tiles()
        wdt = np.dtype(np.uint16) if self.bf16 else np.dtype(wname)  # bf16: raw bit patterns
        if wdt != dt and (dt != np.dtype(np.float32) or wdt not in (np.dtype(np.float16),
                                                                  np.dtype(np.uint16))):
            raise TypeError(f"weight dtype {wname} is not supported with model dtype {dt}")
        self.dtype = dt
        self.is64 = dt == np.dtype(np.float64)
        self.half = wdt != dt
        d = &self.dims
        d.vocab, d.dim, d.n_layers = cfg.vocab_size, cfg.dim, cfg.n_layers
        d.n_heads, d.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        d.head_dim, d.ffn_dim = cfg.head_dim, cfg.ffn_dim
        d.max_pos = cfg.max_seq_len
        d.rmsnorm = cfg.norm == "rmsnorm"
        d.rope = cfg.positional == "rope"
        d.act = _ACTS[cfg.activation]
        d.qk_norm = bool(cfg.qk_norm)
        d.eps = cfg.norm_eps
        self.quant = bool(getattr(cfg, "quantized", False))
        if self.quant:
            self._init_quant(model)
            return
        keep = []
        arena = (None if self.is64
                 else WeightArena(_packed_bytes(model, wdt.itemsize, self.tiles)))

        def arr(a, shape=None, want=dt):
            if a is None:
                return None
            if not isinstance(a, np.ndarray) or a.dtype != want or not a.flags.c_contiguous:
                raise TypeError(f"runner weights must be C-contiguous {want} arrays")
            if shape is not None and a.shape != shape:
                raise ValueError(f"weight has shape {a.shape}, expected {shape}")
            keep.append(a)
            return a

        def matrix(a, shape=None):
            # the transpose of a C-contiguous matrix (a tied head, embed.T) is packed from there
            t = (isinstance(a, np.ndarray) and a.ndim == 2 and a.flags.f_contiguous
                 and not a.flags.c_contiguous)
            if t and self.is64:  # the float64 kernels read matrices in place
                a, t = np.ascontiguousarray(a), False
            if t:
                arr(a.T, None if shape is None else shape[::-1], wdt)
            elif arr(a, shape, wdt) is None or self.is64:
                return a
            a = _shared_packed(a, arena, self.tiles)
            keep.append(a)
            return a

        embed = arr(model.embed, (cfg.vocab_size, cfg.dim), wdt)
        pos = arr(model.pos_embed, (cfg.max_seq_len, cfg.dim))
        fnorm = arr(model.final_norm)
        cos = arr(model.rope_cos)
        sin = arr(model.rope_sin)
        if d.rope and (cos is None or cos.shape[0] < cfg.max_seq_len):
            raise ValueError("model.rope_cos must cover max_seq_len positions")
        if not d.rope and pos is None:
            raise ValueError("learned positions need model.pos_embed")
        if d.rmsnorm and fnorm is None:
            raise ValueError("RMSNorm models need model.final_norm")
        L = cfg.n_layers
        if len(model.layers) != L:
            raise ValueError(f"expected {L} layers, got {len(model.layers)}")
        ropes = _rope_kinds(cfg)  # none (SmolLM3's NoPE), the model's or the local tables
        windows = _windows(cfg)
        local_cos, local_sin = arr(model.rope_cos_local), arr(model.rope_sin_local)
        if cfg.local_layers and (local_cos is None or local_cos.shape[0] < cfg.max_seq_len):
            raise ValueError("model.rope_cos_local must cover max_seq_len positions")
        if self.is64:
            self.layers64 = <fs_layer_f64 *>calloc(L, sizeof(fs_layer_f64))
        elif self.half:
            self.layers16 = <fs_layer_f32h *>calloc(L, sizeof(fs_layer_f32h))
        else:
            self.layers32 = <fs_layer_f32 *>calloc(L, sizeof(fs_layer_f32))
        if self.layers64 == NULL and self.layers32 == NULL and self.layers16 == NULL:
            raise MemoryError()
        cdef void *p[_N_FIELDS]
        cdef int i, j
        for i in range(L):
            lw = model.layers[i]
            for j, name in enumerate(_LAYER_FIELDS):
                w = getattr(lw, name, None)
                p[j] = _ptr(matrix(w) if j < _N_MATRICES else arr(w))
            for j in _needed(cfg):
                if p[j] == NULL:
                    raise ValueError(f"layer {i}: missing weight {_LAYER_FIELDS[j]}")
            if self.is64:
                fs_layer_set_f64(&self.layers64[i], p, ropes[i], windows[i])
            elif self.half:
                fs_layer_set_f32h(&self.layers16[i], p, ropes[i], windows[i])
            else:
                fs_layer_set_f32(&self.layers32[i], p, ropes[i], windows[i])
        head = matrix(model.head, (cfg.dim, cfg.vocab_size))  # read last, so packed last
        for j, a in enumerate((embed, pos, head, fnorm, cos, sin, local_cos, local_sin)):
            p[j] = _ptr(a)
        if self.is64:
            fs_model_set_f64(&self.m64, &self.dims, p, self.layers64)
        elif self.half:
            fs_model_set_f32h(&self.m16, &self.dims, p, self.layers16)
            self.variant, self.mptr = (FS_MV_F32B if self.bf16 else FS_MV_F32H), &self.m16
        else:
            fs_model_set_f32(&self.m32, &self.dims, p, self.layers32)
            self.variant, self.mptr = FS_MV_F32, &self.m32
        self._keep = keep

    cdef int _init_quant(self, model) except -1:
        """The f32q structs: every matrix a QuantMatrix, its packed bytes read in place
        (``QuantMatrix.packed``), norms and biases float32."""
        cfg = model.config
        d = &self.dims
        L = cfg.n_layers
        if len(model.layers) != L:
            raise ValueError(f"expected {L} layers, got {len(model.layers)}")
        ropes, windows = _rope_kinds(cfg), _windows(cfg)
        for a, name in ((model.rope_cos, "rope_cos"), (model.rope_cos_local, "rope_cos_local")):
            if (d.rope if name == "rope_cos" else cfg.local_layers) and (
                    a is None or a.shape[0] < cfg.max_seq_len):
                raise ValueError(f"model.{name} must cover max_seq_len positions")
        if d.rmsnorm and model.final_norm is None:
            raise ValueError("RMSNorm models need model.final_norm")
        if not d.rope and model.pos_embed is None:
            raise ValueError("learned positions need model.pos_embed")
        self.layersq = <fs_layer_f32q *>calloc(L, sizeof(fs_layer_f32q))
        self.qmats = <fs_qmat *>calloc(L * _N_MATRICES + 2, sizeof(fs_qmat))
        if self.layersq == NULL or self.qmats == NULL:
            raise MemoryError()
        keep, kinds = [], set()
        HD, KD = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        F = cfg.ffn_dim
        shapes = {"wq": (d.dim, HD), "wk": (d.dim, KD), "wv": (d.dim, KD), "wo": (HD, d.dim),
                  "w_gate": (d.dim, F), "w_up": (d.dim, F), "w_down": (F, d.dim)}
        self._qin = max(d.dim, HD, F)
        cdef void *p[_N_FIELDS]
        cdef int i, j, q = 0
        for i in range(L + 1):
            lw = model.layers[i] if i < L else None
            for j, name in enumerate(_LAYER_FIELDS):
                if lw is None:  # the model's embedding and head: (vocab, dim) rows
                    if j >= 2:
                        break
                    a, shape = (model.embed, model.head)[j], (d.dim, d.vocab)
                else:
                    a, shape = getattr(lw, name, None), shapes.get(name)
                if a is None or j >= _N_MATRICES and lw is not None:
                    p[j] = _ptr(_f32(a, keep))
                    continue
                kind = _QKIND.get(getattr(a, "kind", None))
                if kind is None:
                    raise TypeError(f"a quantized model's {name} must be a QuantMatrix, got "
                                    f"{type(a).__name__}")
                if (a.in_features, a.out_features) != shape:
                    raise ValueError(f"{name} has (in, out) {(a.in_features, a.out_features)}"
                                     f", expected {shape}")
                P = _qpacked(a, kind)
                keep.append(P)
                kinds.add(kind)
                self.qmats[q].p = <const uint8_t *>cnp.PyArray_DATA(P)
                self.qmats[q].kind = kind
                p[j] = &self.qmats[q]
                q += 1
            if lw is not None:
                for j in _needed(cfg):
                    if p[j] == NULL:
                        raise ValueError(f"layer {i}: missing weight {_LAYER_FIELDS[j]}")
                fs_layer_set_f32q(&self.layersq[i], p, ropes[i], windows[i])
        p[2] = p[1]  # embed, pos_embed, head, final_norm, rope_cos, rope_sin and local ones
        p[1] = _ptr(_f32(model.pos_embed, keep))
        p[3] = _ptr(_f32(model.final_norm, keep))
        for j, a in enumerate((model.rope_cos, model.rope_sin, model.rope_cos_local,
                               model.rope_sin_local)):
            p[4 + j] = _ptr(_f32(a, keep))
        fs_model_set_f32q(&self.mq, &self.dims, p, self.layersq)
        self.variant, self.mptr = FS_MV_F32Q, &self.mq
        self._keep, self._qkinds, self._qscratch = keep, sorted(kinds), None
        return 0

    cdef void *quant_scratch(self, size_t rows) except NULL:
        """The quantized products' scratch for ``rows`` rows (grown, never shrunk)."""
        cdef size_t need = 64
        for kind in self._qkinds:
            need = max(need, fs_quant_scratch_bytes(kind, <int>rows, self._qin))
        if self._qscratch is None or self._qscratch.shape[0] < need:
            self._qscratch = np.empty(need + 64, np.uint8)
        return cnp.PyArray_DATA(<cnp.ndarray>self._qscratch)

    def __dealloc__(self):
        free(self.layers32)
        free(self.layers64)
        free(self.layers16)
        free(self.layersq)
        free(self.qmats)
