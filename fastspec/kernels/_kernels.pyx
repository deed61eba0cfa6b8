"""Typed Cython kernels: the compiled backend of :mod:`fastspec.kernels`.

Same names, signatures, results and error messages as the NumPy twin
:mod:`fastspec.kernels._reference` (read its docstrings for the exact semantics). Each kernel
validates everything while holding the GIL -- well-formed arguments are accepted by typed
fast paths, anything else goes through :mod:`fastspec.kernels.checks`, which raises the documented
message; O(V) data (finite, non-negative, rows summing to 1, uniforms in [0, 1)) is scanned in
typed code -- and then runs C inner loops from ``csrc/`` with the GIL released; those loops
cannot fail. Scratch memory is per thread and reused between calls.

The kernels live in one extension module per concept; this module gathers them:

- :mod:`fastspec.kernels._kernels_attention`: ``attention``, ``cache_write``, ``tree_attention``,
  ``compact_kv``;
- :mod:`fastspec.kernels._kernels_sampling`: ``probs``, ``sample``;
- :mod:`fastspec.kernels._kernels_verify`: ``verify_greedy``, ``verify_rejection``;
- :mod:`fastspec.kernels._kernels_base`: what they share (scratch, fast argument checks, data scans).

Agreement with the twin: attention, probs and cache_write agree to rounding (float64
accumulation in both); sample, verify_greedy and verify_rejection return the same tokens bit
for bit (their inverse-CDF sums are sequential in float64, exactly like numpy.cumsum).
"""
from fastspec.kernels._kernels_attention import attention, cache_write, compact_kv, tree_attention
from fastspec.kernels._kernels_sampling import probs, sample
from fastspec.kernels._kernels_verify import verify_greedy, verify_rejection

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
