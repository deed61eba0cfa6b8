"""CPU features, the matrix-product path (``FASTSPEC_ISA``) and the thread pool of the C core.

What the CPU (and the OS) let this process run, from ``csrc/fs_isa.c`` (CPUID, XGETBV and, for
AMX, the Linux tile-data grant), the checks of a requested path, and the path state itself:
this module owns the core's one dispatch table (fs_isa.h). Every other extension links its own
copy of the core and reads this table (``share_table`` in ``_isa.pxd``), so :func:`set_isa`
and :func:`set_threads` apply to every kernel and runner of the process, and every copy runs
the one pool of this module's copy (csrc/fs_pool.h). The public names are
:func:`fastspec.kernels.set_isa`, :func:`fastspec.kernels.isa_info` and
:func:`fastspec.kernels.set_threads` (which also sets the default thread count at import).
"""
from fastspec.kernels._csrc cimport (
    fs_clock_hz,
    fs_dispatch,
    fs_isa_detect,
    fs_isa_features,
    fs_isa_init,
    fs_isa_quant_kernel,
    fs_isa_quant_max_in,
    fs_isa_supported,
    fs_isa_table,
    fs_linear_amx_built,
    fs_linear_bf16dp_built,
    fs_linear_bf16_amx,
    fs_linear_get_path,
    fs_linear_set_path,
    fs_pool_keep_awake,
    fs_pool_awake,
    fs_pool_spin_limit_ns,
    fs_pool_set_threads,
    fs_pool_threads,
    FS_POOL_MAX,
)

from fastspec.kernels.checks import check_index
from fastspec.kernels.cpuinfo import cpuinfo

__all__ = ["NAMES", "KERNELS", "MAX_THREADS", "features", "quant_kernels", "available", "resolve",
           "describe", "from_env", "set_isa", "isa_info", "cpu_model", "fma_units", "fma_peak",
           "bf16_tiles", "set_threads", "get_threads"]

#: Path names in fs_isa.h's order (FS_ISA_PORTABLE .. FS_ISA_AMX).
NAMES = ("portable", "avx2", "avx512", "avx512bf16", "amx")
#: Paths with kernels in this build (the others are detected and reported only). ``amx`` runs
#: the bf16 products on AMX tiles, ``avx512bf16`` with VDPBF16PS, and both the others as
#: ``avx512``.
KERNELS = (("portable", "avx2", "avx512")
           + (("avx512bf16",) if fs_linear_bf16dp_built() else ())
           + (("amx",) if fs_linear_amx_built() else ()))
#: The most threads :func:`set_threads` accepts (FS_POOL_MAX).
MAX_THREADS = FS_POOL_MAX


def features():
    """Return {name: bool} for avx2, fma, f16c, avx512f, avx512bf16, avx512vnni, avx_vnni,
    amx_tile, amx_bf16, amx_int8 and amx_cpu (AMX in CPUID, whether or not Linux granted the
    tile data)."""
    cdef fs_isa_features f
    fs_isa_detect(&f)
    return {"avx2": bool(f.avx2), "fma": bool(f.fma), "f16c": bool(f.f16c),
            "avx512f": bool(f.avx512f), "avx512bf16": bool(f.avx512bf16),
            "avx512vnni": bool(f.avx512vnni), "avx_vnni": bool(f.avx_vnni),
            "amx_tile": bool(f.amx_tile), "amx_bf16": bool(f.amx_bf16),
            "amx_int8": bool(f.amx_int8), "amx_cpu": bool(f.amx_cpu)}


def quant_kernels():
    """Return {path: description} of the quantized products' kernel on each path this build
    has and this CPU runs (e.g. ``"avx512_vnni; amx_int8 from 2 rows (q8_0), 2 rows
    (q4_0, q4_1), rows of at most 16384 inputs (longer rows: avx512_vnni_x16 from 6 rows of
    q8_0); one row of 1024 inputs or more: avx512_vnni_x16"``, the last part where a one-row
    product of wide rows runs the zmm tiles: an Intel CPU, FS_Q_USE_ONE_WIDE)."""
    out = {}
    have = available()
    for name in KERNELS:
        if name not in have:
            continue
        i = NAMES.index(name)
        one = fs_isa_quant_kernel(i, 0, 1, 0).decode()
        many = fs_isa_quant_kernel(i, 0, 1 << 20, 0).decode()
        if one == many:
            out[name] = one
            continue
        rows = [next(n for n in range(1, 65) if fs_isa_quant_kernel(i, k, n, 0).decode() == many)
                for k in range(3)]
        out[name] = (f"{one}; {many} from {rows[0]} rows (q8_0), {rows[1]} rows (q4_0, q4_1)"
                     if rows[1] == rows[2] else f"{one}; {many} from {rows} rows")
        widest = fs_isa_quant_max_in(i)
        if widest:
            out[name] += f", rows of at most {widest} inputs"
            longer = fs_isa_quant_kernel(i, 0, 1 << 20, widest + 32).decode()
            if longer != one:
                at = next(n for n in range(2, 65)
                          if fs_isa_quant_kernel(i, 0, n, widest + 32).decode() == longer)
                out[name] += f" (longer rows: {longer} from {at} rows of q8_0)"
        wide = fs_isa_quant_kernel(i, 0, 1, 16384).decode()
        if wide != one:
            at = next(w for w in range(32, 16385, 32)
                      if fs_isa_quant_kernel(i, 0, 1, w).decode() == wide)
            out[name] += f"; one row of {at} inputs or more: {wide}"
    return out


def available():
    """Return the names of the paths this CPU runs, in fs_isa.h's order (portable first)."""
    cdef fs_isa_features f
    fs_isa_detect(&f)
    return [n for i, n in enumerate(NAMES) if fs_isa_supported(&f, i)]


def resolve(name):
    """Return the fs_isa.h index of path ``name``, or -1 for None / ``"auto"``; raise as
    :func:`set_isa` documents (ValueError, RuntimeError naming the ISA)."""
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
    """Return the :func:`isa_info` dict for path index ``selected``."""
    return {"features": features(), "available": available()[::-1], "kernels": list(KERNELS),
            "selected": NAMES[selected], "forced": forced, "quant_kernels": quant_kernels()}


_peak = None


def cpu_model():
    """Return ``(vendor, family, model)`` of this CPU from ``/proc/cpuinfo`` (``vendor_id``,
    ``cpu family``, ``model``: :func:`fastspec.kernels.cpuinfo.cpuinfo`), or ``("", 0, 0)``
    where it cannot be read (not Linux)."""
    info = cpuinfo()
    return info["vendor"], info["family"], info["model"]


def fma_units(str vendor, int family, paths):
    """Return ``{path: FMA instructions of that width per cycle}`` for ``paths`` (avx2, avx512).

    Two for every path, except AVX-512 on AMD family 25 (Zen 4; Zen 3 has no AVX-512): its
    two FMA pipes are 256 bits wide and run a 512-bit operation as two halves, so one zmm FMA
    a cycle, the same 16 float32 multiply-adds as avx2 (measured on a Zen 4 EPYC: 15.8 lanes
    a cycle with ymm, 15.5 with zmm, 12 independent chains). Zen 5 (family 26) and Intel's
    server cores are counted with two 512-bit units.
    """
    halves = vendor == "AuthenticAMD" and family == 25
    return {p: (1 if p == "avx512" and halves else 2) for p in paths}


def fma_peak():
    """Return the float FMA peak of this core: lanes x FMA units x clock, per vector path.

    The clock is measured (``fs_clock_hz``: a loop of dependent integer adds, one per cycle;
    best of 8 bursts, cached) and read from ``/proc/cpuinfo`` (``cpu MHz``, the highest) only
    where the loop is not built. The FMA units are :func:`fma_units` of the CPU's vendor and
    family (two, except AVX-512 on Zen 4: one); two is an assumption for CPUs not named there
    (Zen 3: two 256-bit FMA pipes; Intel server cores: two FMA ports, the 512-bit ones fused on
    some parts).

    Returns
    -------
    dict
        ``clock_ghz`` (float), ``clock_source`` ("calibration" or "cpuinfo"), ``cpu`` (vendor,
        family and model), and for each vector path the CPU runs (avx2, avx512): ``fma_units``
        {path: units}, ``macs_per_cycle`` {path: lanes x units} and ``gmacs`` {path:
        multiply-adds per second / 1e9}. ``dot_bf16``: where the CPU runs avx512bf16, its bf16
        products' peak, ``{"avx512bf16": {"macs_per_cycle": 32, "gmacs": ...}}``: one
        ``VDPBF16PS`` a cycle, 16 float32 lanes x a pair of bf16 inputs (measured on a Zen 4:
        0.99 a cycle; assumed on every other CPU), 16 on an Intel CPU (one every two cycles:
        0.46 a cycle measured on an Intel Xeon, family 6 model 207, where the automatic path
        is therefore avx512); else ``{}``.
    """
    global _peak
    if _peak is None:
        hz = fs_clock_hz(8)
        source = "calibration"
        if hz <= 0:
            source = "cpuinfo"
            hz = cpuinfo()["mhz"] * 1e6
        have = available()
        lanes = {p: n for p, n in (("avx2", 8), ("avx512", 16)) if p in have}
        vendor, family, model = cpu_model()
        units = fma_units(vendor, family, lanes)
        dot = 16 if vendor == "GenuineIntel" else 32  # VDPBF16PS: 2 cycles each on Intel
        _peak = {"clock_ghz": hz / 1e9, "clock_source": source,
                 "cpu": {"vendor": vendor, "family": family, "model": model},
                 "fma_units": units,
                 "macs_per_cycle": {p: units[p] * n for p, n in lanes.items()},
                 "gmacs": {p: units[p] * n * hz / 1e9 for p, n in lanes.items()},
                 "dot_bf16": ({"avx512bf16": {"macs_per_cycle": dot, "gmacs": dot * hz / 1e9}}
                              if "avx512bf16" in have else {})}
    return {k: dict(v) if isinstance(v, dict) else v for k, v in _peak.items()}


def from_env():
    """Return ``FASTSPEC_ISA`` (lower case, stripped), or None when it is unset or empty."""
    import os
    name = os.environ.get("FASTSPEC_ISA", "").strip().lower()
    return name or None


# --- the state: this module's copy of the core owns the table ---------------------------------

cdef fs_dispatch *table() noexcept nogil:
    return fs_isa_table()


fs_isa_init()
_forced = None


def isa_info():
    """Return the CPU features and the matrix-product path of the compiled kernels and runners.

    Returns
    -------
    dict
        ``features``: {name: bool} for avx2, fma, f16c, avx512f, avx512bf16, amx_tile,
        amx_bf16 (CPUID, enabled by the OS; AMX also needs the Linux tile-data grant, asked
        for only when the CPU has AMX) and ``amx_cpu`` (AMX in CPUID, granted or not);
        ``available``: the paths this CPU could run, widest first (the automatic choice skips
        ``avx512bf16`` on an Intel CPU); ``kernels``: the paths this
        build has kernels for; ``selected``: the path every product runs now; ``forced``: the
        name forced by ``FASTSPEC_ISA`` or :func:`set_isa`, else None; ``quant_kernels``:
        {path: the quantized products' kernel}; ``peak``: :func:`fma_peak`.
    """
    info = describe(fs_linear_get_path(), _forced)
    info["peak"] = fma_peak()
    return info


def set_isa(name):
    """Force every matrix product onto path ``name``, or back to the automatic choice (None).

    Parameters
    ----------
    name : {"amx", "avx512bf16", "avx512", "avx2", "portable"} or None
        ``portable`` is the baseline build (no AVX); ``amx`` runs the bf16 products on AMX
        tiles and ``avx512bf16`` with AVX512-BF16 dot products (both: the others as
        ``avx512``); None (or ``"auto"``) picks the widest path the CPU runs (``avx512``
        rather than ``avx512bf16`` on an Intel CPU: :func:`fma_peak`). Process-wide; do
        not call while another thread runs a forward. bf16 weights are packed for the path
        (``amx`` and ``avx512bf16`` share the tile layout): runners built before a change
        between a tile path and another path are
        :attr:`fastspec.model._model.TransformerRunner.stale` (a :class:`fastspec.Transformer`
        rebuilds its own).

    Raises
    ------
    ValueError
        For an unknown name.
    RuntimeError
        When the CPU (or the OS) lacks the instructions of ``name``, or when this build has no
        kernel for it (``amx`` and ``avx512bf16`` without GCC >= 11); the message names the
        ISA.
    """
    global _forced
    cdef int path = resolve(name)
    if fs_linear_set_path(path) != 0:  # the build's own check (__builtin_cpu_supports)
        raise RuntimeError(f"ISA {name!r} is not available in this build")
    _forced = name if path >= 0 else None


def bf16_tiles():
    """Whether the bf16 products run in the tile layout now (the ``amx`` or ``avx512bf16``
    path), so that bf16 weights are packed in it."""
    return bool(fs_linear_bf16_amx())


def set_threads(n):
    """Set the threads of the core's pool: the caller plus ``n - 1`` workers (1: none).

    Large products cut their output columns into chunks that the threads claim as they go;
    the results are the same bits at every thread count. Idle workers spin for
    ``FASTSPEC_SPIN_US`` microseconds (default 30), then sleep. Applies to every kernel and
    runner in the process, from the next product on. :func:`fastspec.kernels.set_threads`
    is the public name (the default there: the CPUs this process may run on).

    Raises
    ------
    TypeError
        When ``n`` is not an integer (a bool or a float included).
    ValueError
        When ``n`` is outside [1, MAX_THREADS].
    """
    fs_pool_set_threads(check_index(n, "n", 1, MAX_THREADS))


def get_threads():
    """Return the thread count of the core's pool."""
    return fs_pool_threads()


def keep_awake(bint on):
    """Enter (``on`` true) or leave a stretch of this thread's products during which the core's
    pool workers spin between jobs instead of sleeping (``fs_pool_keep_awake``, fs_pool.h).
    Calls pair per thread and may nest; an unpaired leave does nothing."""
    fs_pool_keep_awake(1 if on else 0)


def _spin_limit_ns():
    """How long a thread of the pool that waits now spins before it sleeps, in ns (the spin,
    or 1 ms while the pool keeps its workers awake); for the tests."""
    return fs_pool_spin_limit_ns()


def _pool_awake():
    """Whether the pool's workers are awake now, so that a job of row-wise work (the layers'
    phases, a prompt's activations) would run on them (``fs_pool_awake``); for the tests."""
    return bool(fs_pool_awake())


def _isa_from_env():
    """Apply ``FASTSPEC_ISA`` at import: an unknown or unavailable ISA fails the import."""
    name = from_env()
    if name:
        try:
            set_isa(name)
        except (ValueError, RuntimeError) as exc:
            raise RuntimeError(f"FASTSPEC_ISA={name}: {exc}") from None


_isa_from_env()
