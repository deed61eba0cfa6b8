"""CPU features and the names of the matrix-product paths (``FASTSPEC_ISA``).

What the CPU (and the OS) let this process run, from ``csrc/fs_isa.h`` (CPUID, XGETBV and, for
AMX, the Linux tile-data grant), and the checks of a requested path. The path itself is state
of the products in :mod:`fastspec.model._model` (it must share their C translation unit), which calls
:func:`resolve` and :func:`describe` from its ``set_isa`` and ``isa_info``.
"""
from fastspec.kernels._csrc cimport fs_isa_detect, fs_isa_features, fs_isa_supported, fs_linear_amx_built

__all__ = ["NAMES", "KERNELS", "features", "available", "resolve", "describe", "from_env"]

#: Path names in fs_isa.h's order (FS_ISA_PORTABLE .. FS_ISA_AMX).
NAMES = ("portable", "avx2", "avx512", "avx512bf16", "amx")
#: Paths with kernels in this build (the others are detected and reported only). ``amx`` runs
#: the bf16 products on AMX tiles and the others as ``avx512``.
KERNELS = ("portable", "avx2", "avx512") + (("amx",) if fs_linear_amx_built() else ())


def features():
    """Return {name: bool} for avx2, fma, f16c, avx512f, avx512bf16, amx_tile, amx_bf16 and
    amx_cpu (AMX in CPUID, whether or not Linux granted the tile data)."""
    cdef fs_isa_features f
    fs_isa_detect(&f)
    return {"avx2": bool(f.avx2), "fma": bool(f.fma), "f16c": bool(f.f16c),
            "avx512f": bool(f.avx512f), "avx512bf16": bool(f.avx512bf16),
            "amx_tile": bool(f.amx_tile), "amx_bf16": bool(f.amx_bf16),
            "amx_cpu": bool(f.amx_cpu)}


def available():
    """Return the names of the paths this CPU runs, in fs_isa.h's order (portable first)."""
    cdef fs_isa_features f
    fs_isa_detect(&f)
    return [n for i, n in enumerate(NAMES) if fs_isa_supported(&f, i)]


def resolve(name):
    """Return the fs_isa.h index of path ``name``, or -1 for None / ``"auto"``; raise as
    :func:`fastspec.model._model.set_isa` documents (ValueError, RuntimeError naming the ISA)."""
    if name is None or name == "auto":
        return -1
    if name not in NAMES:
        raise ValueError(f"ISA must be one of {', '.join(NAMES)} or 'auto', got {name!r}")
    have = available()
    if name not in have:
        why = (" (the CPU has AMX but Linux refused the tile-data permission)"
               if name == "amx" and features()["amx_cpu"] else "")
        raise RuntimeError(f"ISA {name!r} was requested but this CPU lacks it{why}; "
                           f"available here: {', '.join(have)}")
    if name not in KERNELS:
        raise RuntimeError(f"ISA {name!r} is available on this CPU but fastspec has no {name} "
                           f"kernel yet; use one of {', '.join(reversed(KERNELS))}")
    return NAMES.index(name)


def describe(int selected, forced):
    """Return the ``isa_info`` dict of :mod:`fastspec.model._model` for path index ``selected``."""
    return {"features": features(), "available": available()[::-1], "kernels": list(KERNELS),
            "selected": NAMES[selected], "forced": forced}


def from_env():
    """Return ``FASTSPEC_ISA`` (lower case, stripped), or None when it is unset or empty."""
    import os
    name = os.environ.get("FASTSPEC_ISA", "").strip().lower()
    return name or None
