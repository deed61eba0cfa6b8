"""Fused forward pass of :class:`fastspec.Transformer` (the Cython backend of the model).

A :class:`TransformerRunner` is built once per model. It keeps references to the weight
arrays, stores raw pointers to them, and runs embed -> every layer -> final norm -> head for
``n`` new positions in one ``nogil`` call of the C code in ``csrc/fs_model.c``, with scratch
that is allocated once and only grown when ``n`` (or the cache capacity) exceeds it.

All arguments are validated here, with the GIL held, before any pointer is dereferenced; the
C code cannot fail. The NumPy twin of every method lives in :mod:`fastspec.model`.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from fastspec.kernels._csrc cimport (
    fs_context_kv_f64,
    fs_context_kv_taps_f64,
    fs_dims,
    fs_embed_f64,
    fs_head_f64,
    fs_layers_f64,
    fs_linear_bf16_amx,
    fs_model_context_kv,
    fs_model_context_kv_taps,
    fs_model_embed,
    fs_model_head,
    fs_model_layers,
    fs_packed_len,
    fs_scratch_f32,
    fs_scratch_f64,
    fs_scratch_init_f32,
    fs_scratch_init_f64,
    fs_scratch_row,
)
from fastspec.kernels._isa cimport share_table
from fastspec.model._model_weights cimport ModelWeights

from fastspec.kernels.checks import check_tree_mask
from fastspec.model._model_weights import linear_weights

cnp.import_array()
share_table()  # the path and threads of fastspec.kernels (set_isa, set_threads)

__all__ = ["TransformerRunner"]


cdef enum:
    MODE_IDS = 0
    MODE_EMBED = 1


cdef struct _Call:
    # What every C call of a forward takes besides its inputs, set by _prepare.
    fs_scratch_f32 s32  # scratch views (model dtype float32)
    fs_scratch_f64 s64  # ... (float64)
    size_t stride       # elements per layer of the cache
    int capacity
    void *k             # the cache buffers
    void *v
    int kv16            # 1: they hold float16 (a float32 model's cache)


cdef int _last_rows(bint logits, object logit_rows, Py_ssize_t n) except -2:
    """The rows whose logits a forward computes: -1 all, 0 none, else the last k (checked)."""
    if not logits:
        return 0
    if logit_rows is None:
        return -1
    if isinstance(logit_rows, (bool, np.bool_)) or not isinstance(logit_rows, (int, np.integer)):
        raise TypeError(f"logit_rows must be an integer, got {logit_rows!r}")
    if not 0 <= logit_rows <= n:
        raise ValueError(f"logit_rows must be in [0, {n}], got {logit_rows}")
    return <int>logit_rows


ctypedef fused _real:
    float
    double


cdef inline void _scale(_real *x, size_t count, _real scale) noexcept nogil:
    """Multiply ``count`` values by ``scale`` in place (nothing for 1: the embedding scale);
    one rounding a value in the values' type, as NumPy's ``x * dtype(scale)``."""
    cdef size_t i
    if scale != 1.0:
        for i in range(count):
            x[i] = x[i] * scale


cdef class TransformerRunner:
    """Fused forward of one :class:`fastspec.Transformer`.

    Parameters
    ----------
    model : fastspec.Transformer
        Its weight arrays must stay alive and keep their shapes; the runner holds references.
        float64 models are read in place. float32 models have their matrices (head, wq ..
        w_down) copied once into the packed layout of the float kernels (panels of 48 columns
        that a verification block streams once); updates of those arrays are seen only by a
        new runner: call ``model.invalidate()`` after changing weights. With
        ``config.weight_dtype == "float16"`` the matrices are float16, widened to float32 in
        registers; the result is bit-identical to the float32 model on the widened weights.
        With ``"bfloat16"`` they are bf16 bit patterns (uint16), widened by a 16-bit shift,
        and every product first rounds its input rows to bf16 (docs/FORMATS.md).
    """

    cdef fs_dims dims
    cdef bint is64
    cdef bint half  # 16-bit matrices (float16 or bfloat16): w.m16
    cdef bint bf16  # ... bfloat16 (w.m16 read as the identical fs_model_f32b)
    cdef ModelWeights w
    cdef void **hidden_ptrs
    cdef cnp.ndarray _scratch
    cdef cnp.ndarray _dscratch
    cdef size_t _rows
    cdef size_t _dcap
    cdef int _typenum
    cdef double _emb_scale  # config.embedding_scale, 1.0 for none
    cdef bint _windowed  # some layer attends over a sliding window: causal steps only
    cdef readonly object dtype

    def __cinit__(self):
        self.hidden_ptrs = NULL

    def __init__(self, model):
        cdef ModelWeights w = ModelWeights(model)
        self.w = w
        self.dims = w.dims
        self.is64, self.half, self.bf16, self.dtype = w.is64, w.half, w.bf16, w.dtype
        self._typenum = cnp.NPY_FLOAT64 if self.is64 else cnp.NPY_FLOAT32
        scale = model.config.embedding_scale
        self._emb_scale = 1.0 if scale is None else scale
        self._windowed = bool(model.config.sliding_window)
        self.hidden_ptrs = <void **>calloc(self.dims.n_layers, sizeof(void *))
        if self.hidden_ptrs == NULL:
            raise MemoryError()
        self._rows = 0
        self._dcap = 0
        self._reserve(16, 256)

    @property
    def stale(self):
        """True when the bf16 products now run on a path whose packed layout differs from the
        one this runner's weights were packed in (the tile layout of the amx and avx512bf16
        paths against panels, after :func:`set_isa`): the runner refuses to run, and a new one
        must be built."""
        return self._stale()

    cdef inline bint _stale(self):
        return self.bf16 and self.w.tiles != fs_linear_bf16_amx()

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

    cdef int _check_cache(self, object k_cache, object v_cache, int start, int n,
                          bint allow16) except -1:
        # allow16: a float32 model's step also takes a float16 cache (both buffers alike)
        d = &self.dims
        for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
            t = cnp.PyArray_TYPE(<cnp.ndarray>a)
            if t != self._typenum and not (allow16 and not self.is64
                                           and t == cnp.NPY_FLOAT16):
                raise TypeError(f"{name} must have dtype {self.dtype}"
                                + (" or float16" if allow16 and not self.is64 else "")
                                + f", got {a.dtype}")
            if (cnp.PyArray_NDIM(<cnp.ndarray>a) != 4
                    or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
                    or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a)):
                raise ValueError(f"{name} must be a writable C-contiguous 4-D array")
        if k_cache.dtype != v_cache.dtype:
            raise TypeError(f"k_cache and v_cache must have the same dtype, got "
                            f"{k_cache.dtype} and {v_cache.dtype}")
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
                      _Call *c, bint allow16=False) except -1:
        """Check the cache for ``n`` positions at ``start``, grow the scratch buffers and
        fill ``c``: scratch views of the model dtype, the cache's pointers and layout."""
        if self._stale():
            raise RuntimeError("the matrix-product path changed (set_isa) since this runner "
                               "packed its bfloat16 weights; build a new runner "
                               "(Transformer does so itself)")
        self._check_cache(k_cache, v_cache, start, n, allow16)
        c.kv16 = cnp.PyArray_TYPE(<cnp.ndarray>k_cache) == cnp.NPY_FLOAT16
        c.capacity = <int>k_cache.shape[2]
        c.stride = <size_t>k_cache.shape[1] * c.capacity * self.dims.head_dim
        c.k = cnp.PyArray_DATA(<cnp.ndarray>k_cache)
        c.v = cnp.PyArray_DATA(<cnp.ndarray>v_cache)
        self._reserve(n, c.capacity)
        cdef double *dbuf = <double *>cnp.PyArray_DATA(self._dscratch)
        if self.is64:
            fs_scratch_init_f64(&c.s64, &self.dims, <double *>cnp.PyArray_DATA(self._scratch),
                                self._rows, dbuf, c.capacity)
        else:
            fs_scratch_init_f32(&c.s32, &self.dims, <float *>cnp.PyArray_DATA(self._scratch),
                                self._rows, dbuf, c.capacity)
            if self.w.quant:
                c.s32.qs = self.w.quant_scratch(self._rows)
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
                    bint causal, tuple hidden_layers, object out, int last,
                    cnp.ndarray positions=None, cnp.ndarray tree_mask=None):
        # positions: int32 (n,), tree_mask: uint8 (n, n), both checked by _tree_args; logits
        # of the last `last` rows (-1: all, 0: none; the caller checked it is at most n)
        cdef int n = <int>src.shape[0]
        if self._windowed and not causal:
            raise ValueError("a model with a sliding_window runs causal steps only")
        if last < 0:
            last = n
        cdef bint logits = last > 0
        cdef int L = self.dims.n_layers
        cdef int i
        cdef _Call c
        self._prepare(k_cache, v_cache, start, n, &c, True)
        cdef cnp.ndarray res = self._out(out, last, self.dims.vocab, "out") if logits else None
        hidden = {}
        for i in range(L):
            self.hidden_ptrs[i] = NULL
        for layer in hidden_layers:
            h = self._out(None, n, self.dims.dim, "hidden")
            hidden[layer] = h
            self.hidden_ptrs[<int>layer] = cnp.PyArray_DATA(h)
        cdef void *sp = cnp.PyArray_DATA(src)
        # float64: the double products' rows are not bit-independent of the rows beside them,
        # so the head runs on every row and the last ones are copied out
        cdef cnp.ndarray whole = (np.empty((n, self.dims.vocab), np.float64)
                                  if self.is64 and 0 < last < n else res)
        cdef void *rp = cnp.PyArray_DATA(whole) if logits else NULL
        cdef const int32_t *pp = NULL
        cdef const uint8_t *mp = NULL
        if positions is not None:
            pp = <const int32_t *>cnp.PyArray_DATA(positions)
        if tree_mask is not None:
            mp = <const uint8_t *>cnp.PyArray_DATA(tree_mask)
        if self.is64:
            with nogil:
                if mode == MODE_IDS:
                    fs_embed_f64(&self.w.m64, <const int64_t *>sp, n, start, pp, c.s64.x)
                    _scale(c.s64.x, <size_t>n * self.dims.dim, self._emb_scale)
                else:
                    memcpy(c.s64.x, sp, <size_t>n * self.dims.dim * sizeof(double))
                fs_layers_f64(&self.w.m64, &c.s64, n, start, causal, c.k, c.v, 0, c.stride,
                              c.capacity, <double **>self.hidden_ptrs, pp, mp)
                if logits:
                    fs_head_f64(&self.w.m64, &c.s64, 0 if whole is not res else n - last,
                                n, <double *>rp)
        else:
            with nogil:
                if mode == MODE_IDS:
                    fs_model_embed(self.w.variant, self.w.mptr, <const int64_t *>sp, n, start,
                                   pp, c.s32.x)
                    _scale(c.s32.x, <size_t>n * self.dims.dim, <float>self._emb_scale)
                else:
                    memcpy(c.s32.x, sp, <size_t>n * self.dims.dim * sizeof(float))
                fs_model_layers(self.w.variant, self.w.mptr, &c.s32, n, start, causal, c.k,
                                c.v, c.kv16, c.stride, c.capacity, <float **>self.hidden_ptrs,
                                pp, mp)
                if logits:
                    fs_model_head(self.w.variant, self.w.mptr, &c.s32, n - last, n,
                                  <float *>rp)
        if whole is not res:
            res[...] = whole[n - last:]
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

    cdef tuple _tree_args(self, object positions, object tree_mask, Py_ssize_t n, bint causal):
        """Check a tree step's ``positions`` and ``tree_mask`` (GIL held); return them as
        C-contiguous int32 (n,) and uint8 (n, n) arrays (None stays None)."""
        cdef cnp.ndarray pos = None, mask = None
        cdef int max_pos = self.dims.max_pos
        if positions is not None:
            if not isinstance(positions, np.ndarray) or positions.dtype not in (np.int32,
                                                                              np.int64):
                raise TypeError(f"positions must be an int32 or int64 ndarray, got "
                                f"{getattr(positions, 'dtype', type(positions).__name__)}")
            if positions.shape != (n,):
                raise ValueError(f"positions must have shape ({n},), got {positions.shape}")
            bad = np.flatnonzero((positions < 0) | (positions >= max_pos))
            if bad.size:
                raise ValueError(f"positions must be in [0, {max_pos}), got "
                                 f"positions[{bad[0]}] = {positions[bad[0]]}")
            pos = np.ascontiguousarray(positions, dtype=np.int32)
        if tree_mask is not None:
            if not causal:
                raise ValueError("tree_mask needs causal=True (the mask replaces it)")
            check_tree_mask(tree_mask, n, uint8=True, lower_triangular=True)
            mask = np.ascontiguousarray(tree_mask).view(np.uint8)
        return pos, mask

    def forward(self, ids, k_cache, v_cache, int start, bint causal=True, hidden_layers=(),
                out=None, bint logits=True, positions=None, tree_mask=None,
                logit_rows=None):
        """Run token ids at positions ``start ..`` through the model; the cache length is the caller's.

        Parameters
        ----------
        ids : array_like of int, shape (n,)
            Token ids in ``[0, vocab_size)``.
        k_cache, v_cache : ndarray of shape (n_layers, n_kv_heads, capacity, head_dim)
            The buffers of a :class:`fastspec.KVCache`; positions ``start .. start+n-1`` are
            overwritten, keys ``[0, start + n)`` are attended. The model's dtype, or float16
            for a float32 model (both alike: new rows rounded to binary16, read widened).
        start : int
            Position of the first id.
        causal : bool, default True
        hidden_layers : iterable of int
            Layers whose outputs to return (negative indices count from the end).
        out : ndarray of shape (n, vocab_size), optional
            Caller-owned logits buffer (model dtype, C-contiguous); (logit_rows, vocab_size)
            with ``logit_rows``.
        logits : bool, default True
            False skips the final norm and head (returns None for the logits).
        positions : ndarray of shape (n,), int32 or int64, optional
            Sequence positions of the ids (RoPE, learned position embedding), each in
            ``[0, max_seq_len)``; default ``start .. start + n - 1``. The rows are still
            written at cache positions ``start .. start + n - 1``.
        tree_mask : ndarray of shape (n, n), bool or uint8, optional
            Tree step (needs ``causal``): id ``i`` sees the keys ``[0, start)`` and the new
            row ``start + j`` iff ``tree_mask[i, j]`` (nonzero). Lower-triangular with a true
            diagonal (:func:`fastspec.decoding.tree.ancestor_mask`).
        logit_rows : int, optional
            Only the logits of the last ``logit_rows`` ids (0 to n; 0 is ``logits=False``),
            each the same bits as in a full call: a prompt's prefill needs the last row's.

        Returns
        -------
        logits : ndarray of shape (n, vocab_size) (or (logit_rows, vocab_size)) or None
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
        pos, mask = self._tree_args(positions, tree_mask, n, causal)
        return self._run(MODE_IDS, arr, k_cache, v_cache, start, causal,
                         self._hidden(hidden_layers), out,
                         _last_rows(logits, logit_rows, n), pos, mask)

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
                         self._hidden(hidden_layers), out, -1 if logits else 0)

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
        cdef _Call c
        self._prepare(k_cache, v_cache, start, n, &c)
        cdef void *tp = cnp.PyArray_DATA(t)
        cdef void *fp = cnp.PyArray_DATA(<cnp.ndarray>fc)
        cdef void *wp = cnp.PyArray_DATA(w)
        if self.is64:
            with nogil:
                fs_context_kv_taps_f64(&self.w.m64, &c.s64, <const double *>tp, n, n_in,
                                       <const double *>fp, <const double *>wp, start,
                                       <double *>c.k, <double *>c.v, c.stride, c.capacity)
        else:
            with nogil:
                fs_model_context_kv_taps(self.w.variant, self.w.mptr, &c.s32, <const float *>tp,
                                         n, n_in, <const float *>fp, <const float *>wp, start,
                                         <float *>c.k, <float *>c.v, c.stride, c.capacity)

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
        cdef _Call c
        self._prepare(k_cache, v_cache, start, n, &c)
        cdef void *fp = cnp.PyArray_DATA(f)
        if self.is64:
            with nogil:
                fs_context_kv_f64(&self.w.m64, &c.s64, <const double *>fp, n, start, <double *>c.k,
                                  <double *>c.v, c.stride, c.capacity, layer_lo, layer_hi)
        else:
            with nogil:
                fs_model_context_kv(self.w.variant, self.w.mptr, &c.s32, <const float *>fp, n,
                                    start, <float *>c.k, <float *>c.v, c.stride, c.capacity,
                                    layer_lo, layer_hi)
