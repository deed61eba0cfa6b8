"""Fused forward pass of :class:`fastspec.Transformer` (the Cython backend of the model).

A :class:`TransformerRunner` is built once per model. It keeps references to the weight
arrays, stores raw pointers to them, and runs embed -> every layer -> final norm -> head for
``n`` new positions in one ``nogil`` call of the C code in ``csrc/fs_model.h``, with scratch
that is allocated once and only grown when ``n`` (or the cache capacity) exceeds it.

All arguments are validated here, with the GIL held, before any pointer is dereferenced; the
C code cannot fail. The NumPy twin of every method lives in :mod:`fastspec.model`.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t, uint16_t
from libc.stdlib cimport calloc, free

cnp.import_array()

__all__ = ["TransformerRunner", "set_threads", "get_threads", "isa_info", "set_isa"]

cdef extern from "fs_isa.h" nogil:
    ctypedef struct fs_isa_features:
        int avx2, fma, f16c, avx512f, avx512bf16, amx_cpu, amx_tile, amx_bf16
    void fs_isa_detect(fs_isa_features *f)
    int fs_isa_supported(const fs_isa_features *f, int p)

cdef extern from "fs_model.h" nogil:
    ctypedef struct fs_dims:
        int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, max_pos
        int rmsnorm, rope, act, qk_norm
        double eps

    size_t fs_scratch_row(const fs_dims *d)

    ctypedef struct fs_layer_f32:
        const float *wq
        const float *wk
        const float *wv
        const float *wo
        const float *w_gate
        const float *w_up
        const float *w_down
        const float *attn_norm
        const float *mlp_norm
        const float *q_norm
        const float *k_norm
        const float *bq
        const float *bk
        const float *bv

    ctypedef struct fs_layer_f64:
        const double *wq
        const double *wk
        const double *wv
        const double *wo
        const double *w_gate
        const double *w_up
        const double *w_down
        const double *attn_norm
        const double *mlp_norm
        const double *q_norm
        const double *k_norm
        const double *bq
        const double *bk
        const double *bv

    ctypedef struct fs_layer_f32h:
        const uint16_t *wq
        const uint16_t *wk
        const uint16_t *wv
        const uint16_t *wo
        const uint16_t *w_gate
        const uint16_t *w_up
        const uint16_t *w_down
        const float *attn_norm
        const float *mlp_norm
        const float *q_norm
        const float *k_norm
        const float *bq
        const float *bk
        const float *bv

    ctypedef struct fs_model_f32:
        fs_dims d
        const float *embed
        const float *pos_embed
        const float *head
        const float *final_norm
        const float *rope_cos
        const float *rope_sin
        const fs_layer_f32 *layers

    ctypedef struct fs_model_f64:
        fs_dims d
        const double *embed
        const double *pos_embed
        const double *head
        const double *final_norm
        const double *rope_cos
        const double *rope_sin
        const fs_layer_f64 *layers

    ctypedef struct fs_model_f32h:
        fs_dims d
        const uint16_t *embed
        const float *pos_embed
        const uint16_t *head
        const float *final_norm
        const float *rope_cos
        const float *rope_sin
        const fs_layer_f32h *layers

    ctypedef struct fs_scratch_f32:
        float *x
        float *h
    ctypedef struct fs_scratch_f64:
        double *x
        double *h

    void fs_scratch_init_f32(fs_scratch_f32 *s, const fs_dims *d, float *buf, size_t rows,
                             double *dbuf, size_t capacity)
    void fs_scratch_init_f64(fs_scratch_f64 *s, const fs_dims *d, double *buf, size_t rows,
                             double *dbuf, size_t capacity)
    void fs_embed_f32(const fs_model_f32 *m, const int64_t *ids, int n, int pos0, float *x)
    void fs_embed_f64(const fs_model_f64 *m, const int64_t *ids, int n, int pos0, double *x)
    void fs_embed_f32h(const fs_model_f32h *m, const int64_t *ids, int n, int pos0, float *x)
    # bfloat16 storage: the same structs as f32h (uint16_t matrices), another instantiation
    ctypedef fs_model_f32h fs_model_f32b
    void fs_embed_f32b(const fs_model_f32b *m, const int64_t *ids, int n, int pos0, float *x)
    void fs_layers_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, int n, int pos0, int causal,
                        float *k_cache, float *v_cache, size_t layer_stride, int capacity,
                        float **hidden)
    void fs_head_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, int n, float *logits)
    void fs_context_kv_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, const float *feat,
                            int n, int pos0, float *k_cache, float *v_cache,
                            size_t layer_stride, int capacity, int l0, int l1)
    void fs_context_kv_taps_f32b(const fs_model_f32b *m, fs_scratch_f32 *s, const float *taps,
                                 int n, int n_in, const float *fc, const float *hidden_norm,
                                 int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                                 int capacity)
    void fs_layers_f32(const fs_model_f32 *m, fs_scratch_f32 *s, int n, int pos0, int causal,
                       float *k_cache, float *v_cache, size_t layer_stride, int capacity,
                       float **hidden)
    void fs_layers_f64(const fs_model_f64 *m, fs_scratch_f64 *s, int n, int pos0, int causal,
                       double *k_cache, double *v_cache, size_t layer_stride, int capacity,
                       double **hidden)
    void fs_layers_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, int n, int pos0, int causal,
                        float *k_cache, float *v_cache, size_t layer_stride, int capacity,
                        float **hidden)
    void fs_head_f32(const fs_model_f32 *m, fs_scratch_f32 *s, int n, float *logits)
    void fs_head_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, int n, float *logits)
    void fs_head_f64(const fs_model_f64 *m, fs_scratch_f64 *s, int n, double *logits)
    void fs_context_kv_f32(const fs_model_f32 *m, fs_scratch_f32 *s, const float *feat, int n,
                           int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                           int capacity, int l0, int l1)
    void fs_context_kv_f64(const fs_model_f64 *m, fs_scratch_f64 *s, const double *feat, int n,
                           int pos0, double *k_cache, double *v_cache, size_t layer_stride,
                           int capacity, int l0, int l1)
    void fs_context_kv_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, const float *feat,
                            int n, int pos0, float *k_cache, float *v_cache,
                            size_t layer_stride, int capacity, int l0, int l1)
    void fs_context_kv_taps_f32(const fs_model_f32 *m, fs_scratch_f32 *s, const float *taps,
                                int n, int n_in, const float *fc, const float *hidden_norm,
                                int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                                int capacity)
    void fs_context_kv_taps_f32h(const fs_model_f32h *m, fs_scratch_f32 *s, const float *taps,
                                 int n, int n_in, const float *fc, const float *hidden_norm,
                                 int pos0, float *k_cache, float *v_cache, size_t layer_stride,
                                 int capacity)
    void fs_context_kv_taps_f64(const fs_model_f64 *m, fs_scratch_f64 *s, const double *taps,
                                int n, int n_in, const double *fc, const double *hidden_norm,
                                int pos0, double *k_cache, double *v_cache, size_t layer_stride,
                                int capacity)
    void *memcpy(void *dst, const void *src, size_t n)
    size_t fs_packed_len(int rows, int cols)
    void fs_pack_f32(const float *W, int rows, int cols, float *P)
    void fs_pack_f32h(const uint16_t *W, int rows, int cols, uint16_t *P)
    void fs_linear_set_threads(int n)
    int fs_linear_get_threads()
    int fs_linear_set_path(int p)
    int fs_linear_get_path()

def set_threads(int n):
    """Set the OpenMP threads of the runner's large matrix products (default 1).

    More threads help only on an otherwise idle machine; it is a no-op when the extension was
    built without OpenMP. Applies to every runner in the process.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    fs_linear_set_threads(n)


def get_threads():
    """Return the thread count set by :func:`set_threads`."""
    return fs_linear_get_threads()


# --- matrix-product paths (FASTSPEC_ISA) ----------------------------------------------------

#: Path names in fs_isa.h's order (FS_ISA_PORTABLE .. FS_ISA_AMX).
_ISA_NAMES = ("portable", "avx2", "avx512", "avx512bf16", "amx")
#: Paths with kernels in this build (the others are detected and reported only).
_ISA_KERNELS = ("portable", "avx2", "avx512")


def isa_info():
    """Return the CPU features and the matrix-product path of the runners.

    Returns
    -------
    dict
        ``features``: {name: bool} for avx2, fma, f16c, avx512f, avx512bf16, amx_tile,
        amx_bf16 (CPUID, enabled by the OS; AMX also needs the Linux tile-data grant, asked
        for only when the CPU has AMX) and ``amx_cpu`` (AMX in CPUID, granted or not);
        ``available``: the paths this CPU could run, best first; ``kernels``: the paths this
        build has kernels for; ``selected``: the path every product runs now; ``forced``: the
        name given to :func:`set_isa` or ``FASTSPEC_ISA``, or None.
    """
    cdef fs_isa_features f
    fs_isa_detect(&f)
    feats = {"avx2": f.avx2, "fma": f.fma, "f16c": f.f16c, "avx512f": f.avx512f,
             "avx512bf16": f.avx512bf16, "amx_tile": f.amx_tile, "amx_bf16": f.amx_bf16,
             "amx_cpu": f.amx_cpu}
    available = [n for i, n in enumerate(_ISA_NAMES) if fs_isa_supported(&f, i)][::-1]
    return {"features": {k: bool(v) for k, v in feats.items()}, "available": available,
            "kernels": list(_ISA_KERNELS), "selected": _ISA_NAMES[fs_linear_get_path()],
            "forced": _forced}


_forced = None


def set_isa(name):
    """Force every matrix product onto path ``name``, or back to the automatic choice (None).

    Parameters
    ----------
    name : {"amx", "avx512bf16", "avx512", "avx2", "portable"} or None
        ``portable`` is the baseline build (no AVX); None (or ``"auto"``) picks the widest path
        the CPU runs. Process-wide; do not call while another thread runs a forward.

    Raises
    ------
    ValueError
        For an unknown name.
    RuntimeError
        When the CPU (or the OS) lacks the instructions of ``name``, or when this build has no
        kernel for it yet (``amx``, ``avx512bf16``); the message names the ISA.
    """
    global _forced
    if name is None or name == "auto":
        fs_linear_set_path(-1)
        _forced = None
        return
    if name not in _ISA_NAMES:
        raise ValueError(f"ISA must be one of {', '.join(_ISA_NAMES)} or 'auto', got {name!r}")
    cdef fs_isa_features f
    fs_isa_detect(&f)
    cdef int path = _ISA_NAMES.index(name)
    if not fs_isa_supported(&f, path):
        have = [n for i, n in enumerate(_ISA_NAMES) if fs_isa_supported(&f, i)]
        why = (" (the CPU has AMX but Linux refused the tile-data permission)"
               if name == "amx" and f.amx_cpu else "")
        raise RuntimeError(f"ISA {name!r} was requested but this CPU lacks it{why}; "
                           f"available here: {', '.join(have)}")
    if name not in _ISA_KERNELS:
        raise RuntimeError(f"ISA {name!r} is available on this CPU but fastspec has no {name} "
                           "kernel yet; use 'avx512', 'avx2' or 'portable'")
    if fs_linear_set_path(path) != 0:  # the build's own check (__builtin_cpu_supports)
        raise RuntimeError(f"ISA {name!r} is not available in this build")
    _forced = name


def _isa_from_env():
    """Apply ``FASTSPEC_ISA`` at import: an unknown or unavailable ISA fails the import."""
    import os
    name = os.environ.get("FASTSPEC_ISA", "").strip().lower()
    if name:
        try:
            set_isa(name)
        except (ValueError, RuntimeError) as exc:
            raise RuntimeError(f"FASTSPEC_ISA={name}: {exc}") from None


_isa_from_env()


cdef enum:
    MODE_IDS = 0
    MODE_EMBED = 1

_ACTS = {"swiglu": 0, "tanh": 1, "gelu": 2}
_LAYER_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm", "mlp_norm",
                 "q_norm", "k_norm", "q_bias", "k_bias", "v_bias")
_N_MATRICES = 7  # _LAYER_FIELDS[:7] are stored in the weight dtype


cdef inline void *_ptr(object a) except? NULL:
    """Raw data pointer of a C-contiguous ndarray, or NULL for None."""
    if a is None:
        return NULL
    return cnp.PyArray_DATA(<cnp.ndarray>a)


def linear_weights(object a):
    """Return matrix ``a`` (in, out) in the layout the runners' linear kernel reads.

    float32: a packed copy (panels of 32 columns, ``fs_pack_f32``); float64: ``a`` itself. For
    :meth:`TransformerRunner.context_kv_taps`, which checks the length of the result, not the
    shape it came from.
    """
    if not isinstance(a, np.ndarray) or a.ndim != 2 or not a.flags.c_contiguous:
        raise ValueError("expected a C-contiguous 2-D ndarray")
    if a.dtype == np.float64:
        return a
    if a.dtype != np.float32:
        raise TypeError(f"weights must be float32 or float64, got {a.dtype}")
    return _packed(a, False)


def _packed(object a, bint half):
    """Return the float kernels' packed copy of matrix ``a`` (rows, cols) (``fs_pack_f32``)."""
    if a.ndim != 2:
        raise ValueError(f"weight matrices must be 2-D, got shape {a.shape}")
    cdef int rows = <int>a.shape[0], cols = <int>a.shape[1]
    cdef cnp.ndarray p = np.empty(fs_packed_len(rows, cols), dtype=a.dtype)
    if half:
        fs_pack_f32h(<const uint16_t *>_ptr(a), rows, cols, <uint16_t *>cnp.PyArray_DATA(p))
    else:
        fs_pack_f32(<const float *>_ptr(a), rows, cols, <float *>cnp.PyArray_DATA(p))
    return p


cdef class TransformerRunner:
    """Fused forward of one :class:`fastspec.Transformer`.

    Parameters
    ----------
    model : fastspec.Transformer
        Its weight arrays must stay alive and keep their shapes; the runner holds references.
        float64 models are read in place. float32 models have their matrices (head, wq ..
        w_down) copied once into the packed layout of the float kernels (panels of 32 columns
        that a verification block streams once); updates of those arrays are seen only by a
        new runner: call ``model.invalidate()`` after changing weights. With
        ``config.weight_dtype == "float16"`` the matrices are float16, widened to float32 in
        registers; the result is bit-identical to the float32 model on the widened weights.
        With ``"bfloat16"`` they are bf16 bit patterns (uint16), widened by a 16-bit shift,
        and every product first rounds its input rows to bf16 (docs/FORMATS.md).
    """

    cdef fs_dims dims
    cdef bint is64
    cdef bint half  # 16-bit matrices (float16 or bfloat16), in m16 / layers16
    cdef bint bf16  # ... bfloat16 (m16 read as the identical fs_model_f32b)
    cdef fs_model_f32 m32
    cdef fs_model_f64 m64
    cdef fs_model_f32h m16
    cdef fs_layer_f32 *layers32
    cdef fs_layer_f64 *layers64
    cdef fs_layer_f32h *layers16
    cdef void **hidden_ptrs
    cdef object _keep
    cdef cnp.ndarray _scratch
    cdef cnp.ndarray _dscratch
    cdef size_t _rows
    cdef size_t _dcap
    cdef int _typenum
    cdef readonly object dtype

    def __cinit__(self):
        self.layers32 = NULL
        self.layers64 = NULL
        self.layers16 = NULL
        self.hidden_ptrs = NULL

    def __init__(self, model):
        c = model.config
        dt = np.dtype(c.dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"model dtype must be float32 or float64, got {dt}")
        wname = getattr(c, "weight_dtype", None) or str(dt)
        self.bf16 = wname == "bfloat16"
        wdt = np.dtype(np.uint16) if self.bf16 else np.dtype(wname)  # bf16: raw bit patterns
        if wdt != dt and (dt != np.dtype(np.float32) or wdt not in (np.dtype(np.float16),
                                                                  np.dtype(np.uint16))):
            raise TypeError(f"weight dtype {wname} is not supported with model dtype {dt}")
        self.dtype = dt
        self.is64 = dt == np.dtype(np.float64)
        self.half = wdt != dt
        self._typenum = cnp.NPY_FLOAT64 if self.is64 else cnp.NPY_FLOAT32
        d = &self.dims
        d.vocab, d.dim, d.n_layers = c.vocab_size, c.dim, c.n_layers
        d.n_heads, d.n_kv_heads, d.head_dim, d.ffn_dim = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim
        d.max_pos = c.max_seq_len
        d.rmsnorm = c.norm == "rmsnorm"
        d.rope = c.positional == "rope"
        d.act = _ACTS[c.activation]
        d.qk_norm = bool(c.qk_norm)
        d.eps = c.norm_eps
        keep = []

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
            a = arr(a, shape, wdt)
            if a is None or self.is64:
                return a
            a = _packed(a, self.half)
            keep.append(a)
            return a

        embed = arr(model.embed, (c.vocab_size, c.dim), wdt)
        pos = arr(model.pos_embed, (c.max_seq_len, c.dim))
        head = matrix(model.head, (c.dim, c.vocab_size))
        fnorm = arr(model.final_norm)
        cos = arr(model.rope_cos)
        sin = arr(model.rope_sin)
        if d.rope and (cos is None or cos.shape[0] < c.max_seq_len):
            raise ValueError("model.rope_cos must cover max_seq_len positions")
        if not d.rope and pos is None:
            raise ValueError("learned positions need model.pos_embed")
        if d.rmsnorm and fnorm is None:
            raise ValueError("RMSNorm models need model.final_norm")
        L = c.n_layers
        if len(model.layers) != L:
            raise ValueError(f"expected {L} layers, got {len(model.layers)}")
        self.hidden_ptrs = <void **>calloc(L, sizeof(void *))
        if self.is64:
            self.layers64 = <fs_layer_f64 *>calloc(L, sizeof(fs_layer_f64))
        elif self.half:
            self.layers16 = <fs_layer_f32h *>calloc(L, sizeof(fs_layer_f32h))
        else:
            self.layers32 = <fs_layer_f32 *>calloc(L, sizeof(fs_layer_f32))
        if self.hidden_ptrs == NULL or (self.layers64 == NULL and self.layers32 == NULL
                                        and self.layers16 == NULL):
            raise MemoryError()
        cdef void *p[14]
        cdef int i, j
        for i in range(L):
            lw = model.layers[i]
            for j, name in enumerate(_LAYER_FIELDS):
                w = getattr(lw, name, None)
                p[j] = _ptr(matrix(w) if j < _N_MATRICES else arr(w))
            needed = [0, 1, 2, 3, 5, 6] + ([4] if d.act == 0 else []) \
                + ([7, 8] if d.rmsnorm else []) + ([9, 10] if d.qk_norm else [])
            for j in needed:
                if p[j] == NULL:
                    raise ValueError(f"layer {i}: missing weight {_LAYER_FIELDS[j]}")
            if self.is64:
                self.layers64[i] = fs_layer_f64(
                    <const double *>p[0], <const double *>p[1], <const double *>p[2],
                    <const double *>p[3], <const double *>p[4], <const double *>p[5],
                    <const double *>p[6], <const double *>p[7], <const double *>p[8],
                    <const double *>p[9], <const double *>p[10], <const double *>p[11],
                    <const double *>p[12], <const double *>p[13])
            elif self.half:
                self.layers16[i] = fs_layer_f32h(
                    <const uint16_t *>p[0], <const uint16_t *>p[1], <const uint16_t *>p[2],
                    <const uint16_t *>p[3], <const uint16_t *>p[4], <const uint16_t *>p[5],
                    <const uint16_t *>p[6], <const float *>p[7], <const float *>p[8],
                    <const float *>p[9], <const float *>p[10], <const float *>p[11],
                    <const float *>p[12], <const float *>p[13])
            else:
                self.layers32[i] = fs_layer_f32(
                    <const float *>p[0], <const float *>p[1], <const float *>p[2],
                    <const float *>p[3], <const float *>p[4], <const float *>p[5],
                    <const float *>p[6], <const float *>p[7], <const float *>p[8],
                    <const float *>p[9], <const float *>p[10], <const float *>p[11],
                    <const float *>p[12], <const float *>p[13])
        if self.is64:
            self.m64 = fs_model_f64(self.dims, <const double *>_ptr(embed),
                                    <const double *>_ptr(pos), <const double *>_ptr(head),
                                    <const double *>_ptr(fnorm), <const double *>_ptr(cos),
                                    <const double *>_ptr(sin), self.layers64)
        elif self.half:
            self.m16 = fs_model_f32h(self.dims, <const uint16_t *>_ptr(embed),
                                     <const float *>_ptr(pos), <const uint16_t *>_ptr(head),
                                     <const float *>_ptr(fnorm), <const float *>_ptr(cos),
                                     <const float *>_ptr(sin), self.layers16)
        else:
            self.m32 = fs_model_f32(self.dims, <const float *>_ptr(embed),
                                    <const float *>_ptr(pos), <const float *>_ptr(head),
                                    <const float *>_ptr(fnorm), <const float *>_ptr(cos),
                                    <const float *>_ptr(sin), self.layers32)
        self._keep = keep
        self._rows = 0
        self._dcap = 0
        self._reserve(16, 256)

    def __dealloc__(self):
        free(self.layers32)
        free(self.layers64)
        free(self.layers16)
        free(self.hidden_ptrs)

    cdef int _reserve(self, size_t rows, size_t capacity) except -1:
        """Grow the scratch buffers (GIL held) to ``rows`` positions and ``capacity`` keys."""
        if rows > self._rows:
            rows = max(rows, 2 * self._rows)
            self._scratch = np.empty(rows * fs_scratch_row(&self.dims), dtype=self.dtype)
            self._rows = rows
        if capacity > self._dcap:
            capacity = max(capacity, 2 * self._dcap)
            self._dscratch = np.empty(capacity + <size_t>self.dims.head_dim, dtype=np.float64)
            self._dcap = capacity
        return 0

    cdef int _check_cache(self, object k_cache, object v_cache, int start, int n) except -1:
        d = &self.dims
        for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
            if cnp.PyArray_TYPE(<cnp.ndarray>a) != self._typenum:
                raise TypeError(f"{name} must have dtype {self.dtype}, got {a.dtype}")
            if (cnp.PyArray_NDIM(<cnp.ndarray>a) != 4
                    or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
                    or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a)):
                raise ValueError(f"{name} must be a writable C-contiguous 4-D array")
        shape = k_cache.shape
        if (shape[0] != d.n_layers or shape[1] != d.n_kv_heads or shape[3] != d.head_dim
                or v_cache.shape != shape):
            raise ValueError(f"cache shape {shape} / {v_cache.shape} does not match the model "
                             f"({d.n_layers}, {d.n_kv_heads}, capacity, {d.head_dim})")
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if start + n > shape[2]:
            raise ValueError(f"cache holds {start} positions; {n} more exceed its capacity "
                             f"{shape[2]}")
        if start + n > d.max_pos:
            raise ValueError(f"positions up to {start + n} exceed max_seq_len {d.max_pos}")
        return 0

    cdef int _prepare(self, object k_cache, object v_cache, int start, int n,
                      fs_scratch_f32 *s32, fs_scratch_f64 *s64, size_t *stride) except -1:
        """Check the cache for ``n`` positions at ``start``, grow the scratch buffers and
        point the scratch views of the model dtype at them; ``stride[0]`` = elements per
        layer of the cache."""
        self._check_cache(k_cache, v_cache, start, n)
        cdef int capacity = <int>k_cache.shape[2]
        stride[0] = <size_t>k_cache.shape[1] * capacity * self.dims.head_dim
        self._reserve(n, capacity)
        cdef double *dbuf = <double *>cnp.PyArray_DATA(self._dscratch)
        if self.is64:
            fs_scratch_init_f64(s64, &self.dims, <double *>cnp.PyArray_DATA(self._scratch),
                                self._rows, dbuf, capacity)
        else:
            fs_scratch_init_f32(s32, &self.dims, <float *>cnp.PyArray_DATA(self._scratch),
                                self._rows, dbuf, capacity)
        return 0

    cdef cnp.ndarray _out(self, object out, int n, int width, str name):
        cdef cnp.npy_intp dims[2]
        if out is None:
            dims[0] = n
            dims[1] = width
            return cnp.PyArray_EMPTY(2, dims, self._typenum, 0)
        if (not isinstance(out, np.ndarray) or cnp.PyArray_TYPE(<cnp.ndarray>out) != self._typenum
                or out.shape != (n, width) or not out.flags.c_contiguous
                or not out.flags.writeable):
            raise ValueError(f"{name} must be a writable C-contiguous {self.dtype} array of shape "
                             f"({n}, {width})")
        return <cnp.ndarray>out

    cdef tuple _run(self, int mode, cnp.ndarray src, object k_cache, object v_cache, int start,
                    bint causal, tuple hidden_layers, object out, bint logits):
        cdef int n = <int>src.shape[0]
        cdef int L = self.dims.n_layers
        cdef int i
        cdef size_t stride
        cdef fs_scratch_f32 s32
        cdef fs_scratch_f64 s64
        self._prepare(k_cache, v_cache, start, n, &s32, &s64, &stride)
        cdef int capacity = <int>k_cache.shape[2]
        cdef cnp.ndarray res = self._out(out, n, self.dims.vocab, "out") if logits else None
        hidden = {}
        for i in range(L):
            self.hidden_ptrs[i] = NULL
        for layer in hidden_layers:
            h = self._out(None, n, self.dims.dim, "hidden")
            hidden[layer] = h
            self.hidden_ptrs[<int>layer] = cnp.PyArray_DATA(h)
        cdef void *kp = cnp.PyArray_DATA(<cnp.ndarray>k_cache)
        cdef void *vp = cnp.PyArray_DATA(<cnp.ndarray>v_cache)
        cdef void *sp = cnp.PyArray_DATA(src)
        cdef void *rp = cnp.PyArray_DATA(res) if logits else NULL
        if self.is64:
            with nogil:
                if mode == MODE_IDS:
                    fs_embed_f64(&self.m64, <const int64_t *>sp, n, start, s64.x)
                else:
                    memcpy(s64.x, sp, <size_t>n * self.dims.dim * sizeof(double))
                fs_layers_f64(&self.m64, &s64, n, start, causal, <double *>kp, <double *>vp,
                              stride, capacity, <double **>self.hidden_ptrs)
                if logits:
                    fs_head_f64(&self.m64, &s64, n, <double *>rp)
        else:
            with nogil:
                if mode == MODE_IDS:
                    if self.bf16:
                        fs_embed_f32b(<const fs_model_f32b *>&self.m16, <const int64_t *>sp, n,
                                      start, s32.x)
                    elif self.half:
                        fs_embed_f32h(&self.m16, <const int64_t *>sp, n, start, s32.x)
                    else:
                        fs_embed_f32(&self.m32, <const int64_t *>sp, n, start, s32.x)
                else:
                    memcpy(s32.x, sp, <size_t>n * self.dims.dim * sizeof(float))
                if self.bf16:
                    fs_layers_f32b(<const fs_model_f32b *>&self.m16, &s32, n, start, causal,
                                   <float *>kp, <float *>vp, stride, capacity,
                                   <float **>self.hidden_ptrs)
                    if logits:
                        fs_head_f32b(<const fs_model_f32b *>&self.m16, &s32, n, <float *>rp)
                elif self.half:
                    fs_layers_f32h(&self.m16, &s32, n, start, causal, <float *>kp, <float *>vp,
                                   stride, capacity, <float **>self.hidden_ptrs)
                    if logits:
                        fs_head_f32h(&self.m16, &s32, n, <float *>rp)
                else:
                    fs_layers_f32(&self.m32, &s32, n, start, causal, <float *>kp, <float *>vp,
                                  stride, capacity, <float **>self.hidden_ptrs)
                    if logits:
                        fs_head_f32(&self.m32, &s32, n, <float *>rp)
        return res, hidden

    cdef tuple _hidden(self, object hidden_layers):
        if not hidden_layers:
            return ()
        L = self.dims.n_layers
        out = set()
        for layer in hidden_layers:
            if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)):
                raise TypeError(f"hidden_layers must hold integers, got {layer!r}")
            if not -L <= layer < L:
                raise ValueError(f"hidden_layers must be in [{-L}, {L - 1}], got {layer}")
            out.add(int(layer) % L)
        return tuple(sorted(out))

    def forward(self, ids, k_cache, v_cache, int start, bint causal=True, hidden_layers=(),
                out=None, bint logits=True):
        """Run token ids at positions ``start ..`` through the model; the cache length is the caller's.

        Parameters
        ----------
        ids : array_like of int, shape (n,)
            Token ids in ``[0, vocab_size)``.
        k_cache, v_cache : ndarray of shape (n_layers, n_kv_heads, capacity, head_dim)
            The buffers of a :class:`fastspec.KVCache`; positions ``start .. start+n-1`` are
            overwritten, keys ``[0, start + n)`` are attended.
        start : int
            Position of the first id.
        causal : bool, default True
        hidden_layers : iterable of int
            Layers whose outputs to return (negative indices count from the end).
        out : ndarray of shape (n, vocab_size), optional
            Caller-owned logits buffer (model dtype, C-contiguous).
        logits : bool, default True
            False skips the final norm and head (returns None for the logits).

        Returns
        -------
        logits : ndarray of shape (n, vocab_size) or None
        hidden : dict[int, ndarray of shape (n, dim)]
        """
        cdef cnp.ndarray arr = np.asarray(ids)
        cdef Py_ssize_t n, i
        if cnp.PyArray_TYPE(arr) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
            if arr.dtype == object or (arr.size and arr.dtype.kind not in "iu"):
                raise TypeError(f"ids must be integers, got dtype {arr.dtype}")
            if arr.dtype == np.uint64 and arr.size and arr.max() > 2**62:
                raise ValueError(f"ids must be in [0, {self.dims.vocab}), got {arr.max()}")
            arr = np.ascontiguousarray(arr, dtype=np.int64)
        if cnp.PyArray_NDIM(arr) > 1:
            raise ValueError("ids must be 1-D")
        n = arr.size
        if n == 0:
            raise ValueError("ids must not be empty")
        if cnp.PyArray_NDIM(arr) == 0:
            arr = arr.reshape(1)
        cdef const int64_t *p = <const int64_t *>cnp.PyArray_DATA(arr)
        cdef int64_t V = self.dims.vocab
        for i in range(n):
            if p[i] < 0 or p[i] >= V:
                raise ValueError(f"ids must be in [0, {V}), got {p[i]}")
        return self._run(MODE_IDS, arr, k_cache, v_cache, start, causal,
                         self._hidden(hidden_layers), out, logits)

    def forward_embeddings(self, x, k_cache, v_cache, int start, bint causal=True,
                           hidden_layers=(), out=None, bint logits=True):
        """Like :meth:`forward`, but from input embeddings ``x`` of shape (n, dim).

        No position embedding is added to ``x``; RoPE models rotate at ``start ..``.
        """
        if (not isinstance(x, np.ndarray) or cnp.PyArray_TYPE(<cnp.ndarray>x) != self._typenum
                or x.ndim != 2 or x.shape[1] != self.dims.dim or x.shape[0] < 1):
            raise ValueError(f"x must be a {self.dtype} array of shape (n >= 1, {self.dims.dim})")
        x = np.ascontiguousarray(x)
        return self._run(MODE_EMBED, <cnp.ndarray>x, k_cache, v_cache, start, causal,
                         self._hidden(hidden_layers), out, logits)

    def context_kv_taps(self, taps, fc, hidden_norm, k_cache, v_cache, int start):
        """DFlash context injection from the tapped target states, in one call.

        ``features = rmsnorm(taps @ fc) * hidden_norm`` (the model's eps), then
        :meth:`context_kv` over every layer. ``taps`` (n, n_in) in the model dtype; ``fc`` from
        :func:`linear_weights` of the (n_in, dim) matrix in the model dtype; ``hidden_norm``
        (dim,).
        """
        cdef cnp.ndarray t = self._rows_arg(taps, "taps", -1)
        cdef int n = <int>t.shape[0], n_in = <int>t.shape[1]
        cdef cnp.ndarray w = self._rows_arg(hidden_norm, "hidden_norm", self.dims.dim, 1)
        if (not isinstance(fc, np.ndarray) or cnp.PyArray_TYPE(<cnp.ndarray>fc) != self._typenum
                or not fc.flags.c_contiguous
                or (fc.shape != (n_in, self.dims.dim) if self.is64
                    else fc.shape != (fs_packed_len(n_in, self.dims.dim),))):
            raise ValueError(f"fc must be linear_weights() of a {self.dtype} ({n_in}, "
                             f"{self.dims.dim}) matrix")
        cdef size_t stride
        cdef fs_scratch_f32 s32
        cdef fs_scratch_f64 s64
        self._prepare(k_cache, v_cache, start, n, &s32, &s64, &stride)
        cdef int capacity = <int>k_cache.shape[2]
        cdef void *kp = cnp.PyArray_DATA(<cnp.ndarray>k_cache)
        cdef void *vp = cnp.PyArray_DATA(<cnp.ndarray>v_cache)
        cdef void *tp = cnp.PyArray_DATA(t)
        cdef void *fp = cnp.PyArray_DATA(<cnp.ndarray>fc)
        cdef void *wp = cnp.PyArray_DATA(w)
        if self.is64:
            with nogil:
                fs_context_kv_taps_f64(&self.m64, &s64, <const double *>tp, n, n_in,
                                       <const double *>fp, <const double *>wp, start,
                                       <double *>kp, <double *>vp, stride, capacity)
        else:
            with nogil:
                if self.bf16:
                    fs_context_kv_taps_f32b(<const fs_model_f32b *>&self.m16, &s32,
                                            <const float *>tp, n, n_in, <const float *>fp,
                                            <const float *>wp, start, <float *>kp,
                                            <float *>vp, stride, capacity)
                elif self.half:
                    fs_context_kv_taps_f32h(&self.m16, &s32, <const float *>tp, n, n_in,
                                            <const float *>fp, <const float *>wp, start,
                                            <float *>kp, <float *>vp, stride, capacity)
                else:
                    fs_context_kv_taps_f32(&self.m32, &s32, <const float *>tp, n, n_in,
                                           <const float *>fp, <const float *>wp, start,
                                           <float *>kp, <float *>vp, stride, capacity)

    cdef cnp.ndarray _rows_arg(self, object a, str name, int width, int ndim=2):
        """``a`` as a C-contiguous array of the model dtype: (n >= 1, width) rows (width -1:
        any), or a (width,) vector when ndim == 1."""
        if (not isinstance(a, np.ndarray) or cnp.PyArray_TYPE(<cnp.ndarray>a) != self._typenum
                or a.ndim != ndim or not a.flags.c_contiguous
                or (ndim == 2 and (a.shape[0] < 1 or (width >= 0 and a.shape[1] != width)))
                or (ndim == 1 and a.shape[0] != width)):
            shape = f"({width},)" if ndim == 1 else f"(n >= 1, {'n_in' if width < 0 else width})"
            raise ValueError(f"{name} must be a C-contiguous {self.dtype} array of shape {shape}")
        return <cnp.ndarray>a

    def context_kv(self, features, k_cache, v_cache, int start, int layer_lo, int layer_hi):
        """Project ``features`` (n, dim) into the K/V cache of layers ``[layer_lo, layer_hi)``.

        ``k = features @ Wk`` (+ bias) -> k-norm -> RoPE at ``start ..``; ``v = features @ Wv``;
        written at positions ``start .. start+n-1``. No input norm is applied.
        """
        if (not isinstance(features, np.ndarray)
                or cnp.PyArray_TYPE(<cnp.ndarray>features) != self._typenum
                or features.ndim != 2 or features.shape[1] != self.dims.dim
                or features.shape[0] < 1):
            raise ValueError(f"features must be a {self.dtype} array of shape "
                             f"(n >= 1, {self.dims.dim})")
        if not 0 <= layer_lo <= layer_hi <= self.dims.n_layers:
            raise ValueError(f"layer range [{layer_lo}, {layer_hi}) is not within "
                             f"[0, {self.dims.n_layers}]")
        cdef cnp.ndarray f = np.ascontiguousarray(features)
        cdef int n = <int>f.shape[0]
        cdef size_t stride
        cdef fs_scratch_f32 s32
        cdef fs_scratch_f64 s64
        self._prepare(k_cache, v_cache, start, n, &s32, &s64, &stride)
        cdef int capacity = <int>k_cache.shape[2]
        cdef void *kp = cnp.PyArray_DATA(<cnp.ndarray>k_cache)
        cdef void *vp = cnp.PyArray_DATA(<cnp.ndarray>v_cache)
        cdef void *fp = cnp.PyArray_DATA(f)
        if self.is64:
            with nogil:
                fs_context_kv_f64(&self.m64, &s64, <const double *>fp, n, start, <double *>kp,
                                  <double *>vp, stride, capacity, layer_lo, layer_hi)
        else:
            with nogil:
                if self.bf16:
                    fs_context_kv_f32b(<const fs_model_f32b *>&self.m16, &s32,
                                       <const float *>fp, n, start, <float *>kp, <float *>vp,
                                       stride, capacity, layer_lo, layer_hi)
                elif self.half:
                    fs_context_kv_f32h(&self.m16, &s32, <const float *>fp, n, start,
                                       <float *>kp, <float *>vp, stride, capacity, layer_lo,
                                       layer_hi)
                else:
                    fs_context_kv_f32(&self.m32, &s32, <const float *>fp, n, start,
                                      <float *>kp, <float *>vp, stride, capacity, layer_lo,
                                      layer_hi)
