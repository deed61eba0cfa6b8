"""Backend dispatch for the compute kernels.

``fastspec.kernels.attention(...)`` and friends call the active backend: the compiled
:mod:`fastspec.kernels._kernels` ("cython") when it was built, else the NumPy twin
:mod:`fastspec.kernels._reference` ("numpy"). ``FASTSPEC_BACKEND=numpy|cython`` chooses at import;
:func:`set_backend` switches at run time, :func:`using_backend` for one ``with`` block.
Both backends expose the same names and signatures.

The compiled core's state lives here too: :func:`isa_info`, :func:`set_isa` (the
matrix-product path, ``FASTSPEC_ISA`` at import) and :func:`set_threads` (the thread pool:
by default the CPUs this process may run on, ``FASTSPEC_THREADS`` at import), from
:mod:`fastspec.kernels._isa`, whose dispatch table every compiled kernel and runner reads.
This package imports nothing from the layers above it.
"""
from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from fastspec.kernels import _reference
from fastspec.kernels._reference import inverse_cdf
from fastspec.kernels.checks import check_index

__all__ = ["KERNEL_NAMES", "backend", "set_backend", "using_backend", "available_backends",
           "module", "isa_info", "set_isa", "set_threads", "get_threads", "threads_info",
           "keep_threads_awake", "MAX_THREADS", "attention",
           "cache_write", "probs", "sample", "verify_greedy", "verify_rejection",
           "tree_attention", "compact_kv", "inverse_cdf"]

#: The kernels every backend provides, with identical signatures.
KERNEL_NAMES = ("attention", "cache_write", "probs", "sample", "verify_greedy", "verify_rejection",
                "tree_attention", "compact_kv")

_BACKENDS: dict[str, ModuleType] = {"numpy": _reference}
try:
    # _isa first: it owns the dispatch table the kernels share (and applies FASTSPEC_ISA,
    # whose RuntimeError for a bad value fails the import on purpose)
    _isa: ModuleType | None = importlib.import_module("fastspec.kernels._isa")
    _BACKENDS["cython"] = importlib.import_module("fastspec.kernels._kernels")
except ImportError as exc:  # the package still works on the NumPy twin
    _IMPORT_ERROR: ImportError | None = exc
    _isa = None
else:
    _IMPORT_ERROR = None

_active = "numpy"
#: The most threads :func:`set_threads` accepts (the C pool's FS_POOL_MAX).
MAX_THREADS = 1024


def available_backends() -> tuple[str, ...]:
    """Return the names of the backends that can be selected here."""
    return tuple(sorted(_BACKENDS))


def backend() -> str:
    """Return the active backend, ``"cython"`` or ``"numpy"``."""
    return _active


def module(name: str | None = None) -> ModuleType:
    """Return the kernel module of backend ``name`` (default: the active one)."""
    return _BACKENDS[_active if name is None else name]


def set_backend(name: str) -> None:
    """Select the kernel backend for all later calls.

    Parameters
    ----------
    name : {"cython", "numpy"}

    Raises
    ------
    ValueError
        For an unknown name.
    RuntimeError
        If ``"cython"`` is asked for but the compiled extension is not available.
    """
    global _active
    if name not in ("cython", "numpy"):
        raise ValueError(f"backend must be 'cython' or 'numpy', got {name!r}")
    if name not in _BACKENDS:
        raise RuntimeError(
            "the Cython backend is not available (the compiled extension fastspec.kernels._kernels "
            f"could not be imported: {_IMPORT_ERROR}); reinstall fastspec with a C compiler"
        )
    _active = name
    for kernel in KERNEL_NAMES:
        globals()[kernel] = getattr(_BACKENDS[name], kernel)


@contextlib.contextmanager
def using_backend(name: str) -> Iterator[None]:
    """Select backend ``name`` for the body of a ``with`` block, then restore the previous one.

    The previous backend comes back however the block ends (an exception included).

    Parameters
    ----------
    name : {"cython", "numpy"}

    Raises
    ------
    ValueError, RuntimeError
        As :func:`set_backend`, before the block runs.

    Examples
    --------
    >>> import fastspec as fs
    >>> with fs.using_backend("numpy"):
    ...     fs.backend()
    'numpy'
    """
    previous = _active
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def isa_info() -> dict[str, Any]:
    """Return the CPU features and the matrix-product path of the compiled kernels and runners.

    See :func:`fastspec.kernels._isa.isa_info` (``FASTSPEC_ISA`` forces a path). Without the
    compiled extensions: ``{"selected": None, "available": [], ...}``.
    """
    if _isa is None:
        return {"features": {}, "available": [], "kernels": [], "selected": None, "forced": None,
                "quant_kernels": {}}
    return _isa.isa_info()


def _compiled() -> ModuleType:
    if _isa is None:
        raise RuntimeError(f"the compiled extensions are not available ({_IMPORT_ERROR}); "
                           "reinstall fastspec with a C compiler")
    return _isa


def set_isa(name: str | None) -> None:
    """Force every compiled matrix product onto path ``name`` (None: the automatic choice).

    See :func:`fastspec.kernels._isa.set_isa` for the names and errors; RuntimeError without
    the compiled extensions.
    """
    _compiled().set_isa(name)


def _default_threads() -> tuple[int, str]:
    """Return the thread count at import and how it was chosen (``FASTSPEC_THREADS``, else
    the CPUs this process may run on)."""
    text = os.environ.get("FASTSPEC_THREADS", "").strip()
    if text:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_THREADS:
            raise ValueError(f"FASTSPEC_THREADS must be an integer in [1, {MAX_THREADS}], "
                             f"got {text!r}")
        return n, f"FASTSPEC_THREADS={n}"
    try:
        n, how = len(os.sched_getaffinity(0)), "os.sched_getaffinity"
    except (AttributeError, OSError):  # not Linux
        n, how = os.cpu_count() or 1, "os.cpu_count"
    n = max(1, min(n, MAX_THREADS))
    return n, f"the {n} CPU{'s' if n > 1 else ''} this process may run on ({how})"


_DEFAULT_THREADS, _DEFAULT_HOW = _default_threads()
_threads = {"n": _DEFAULT_THREADS, "set": False}


def set_threads(n: int) -> None:
    """Set the threads of the compiled kernels and runners (the caller plus ``n - 1`` pool
    workers).

    Large matrix products split their output columns between the threads; the results are
    the same bits at every thread count. Process-wide, from the next product on. The default
    is the number of CPUs this process may run on (``os.sched_getaffinity``), or
    ``FASTSPEC_THREADS`` when set at import. The NumPy backend ignores it (the value is still
    kept, for the compiled one).

    Parameters
    ----------
    n : int
        From 1 to :data:`MAX_THREADS`; more than the CPUs is allowed (idle workers spin for
        ``FASTSPEC_SPIN_US`` microseconds, default 30, then sleep).

    Raises
    ------
    TypeError
        When ``n`` is not an integer (a bool or a float included).
    ValueError
        When ``n`` is outside [1, MAX_THREADS].
    """
    n = check_index(n, "n", 1, MAX_THREADS)
    if _isa is not None:
        _isa.set_threads(n)
    _threads.update(n=n, set=True)


def get_threads() -> int:
    """Return the thread count of the compiled kernels and runners (:func:`set_threads`)."""
    return _threads["n"] if _isa is None else _isa.get_threads()


@contextlib.contextmanager
def keep_threads_awake() -> Iterator[None]:
    """Keep the compiled pool's workers spinning between products while the block runs.

    For loops of model calls with Python work between them (a speculative round: the drafter,
    the verification, the bookkeeping): between two products a worker spins for
    ``FASTSPEC_SPIN_US`` (default 30 us) and then sleeps, and waking it again costs the next
    product a system call and, in a virtual machine, an interrupt to its CPU. After the
    products this thread hands out inside the block, the workers (and this thread, waiting for
    their last chunk) spin up to 1 ms instead; not with ``FASTSPEC_SPIN_US=0``, and not for a
    second, pool-wide, after a keeping thread was found losing its CPU to another thread (less
    than 3/4 of a 1 ms window on its CPU, with an involuntary switch). Only where threads wait
    changes: the results are the same bits. Per calling thread; blocks may nest. With one
    thread, or without the compiled core, it does nothing.

    Examples
    --------
    >>> import fastspec as fs
    >>> with fs.kernels.keep_threads_awake():
    ...     pass  # model calls
    """
    if _isa is None:
        yield
        return
    _isa.keep_awake(True)
    try:
        yield
    finally:
        _isa.keep_awake(False)


def threads_info() -> dict[str, Any]:
    """Return the thread count and where it came from.

    Returns
    -------
    dict
        ``threads``: the count now; ``default``: the count at import; ``default_from``: how
        the default was chosen (``FASTSPEC_THREADS`` or the CPUs of this process);
        ``set``: whether :func:`set_threads` changed it since (``--threads`` included).
    """
    return {"threads": get_threads(), "default": _DEFAULT_THREADS,
            "default_from": _DEFAULT_HOW, "set": _threads["set"]}


def _initial_backend() -> str:
    requested = os.environ.get("FASTSPEC_BACKEND", "").strip().lower()
    if requested:
        return requested
    return "cython" if "cython" in _BACKENDS else "numpy"


# Bound at import so that ``fastspec.kernels.attention`` is a plain attribute lookup.
attention: Any
cache_write: Any
probs: Any
sample: Any
verify_greedy: Any
verify_rejection: Any
tree_attention: Any
compact_kv: Any
set_backend(_initial_backend())
if _isa is not None:
    _isa.set_threads(_DEFAULT_THREADS)
