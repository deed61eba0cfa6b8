"""What both seed reproductions share: output folder checks, the atomic report, the seed file.

The two commands refuse bad input before doing any work (an unwritable ``--out``, a
``--seed-file`` that is not the seed it claims to be) and write ``results.json`` in one atomic
step at the end, so a failed or interrupted run never leaves a partial report.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fastspec.formats import json_io
from fastspec.kernels import backend
from fastspec.version import __version__

__all__ = ["SeedInputError", "check_out_dir", "write_report", "load_seed_file", "seed_path",
           "environment", "time_samples"]


class SeedInputError(ValueError):
    """Bad input to ``fastspec seeds``: the message says which argument and why."""


def check_out_dir(out) -> Path:
    """Create ``out`` if needed and prove it writable; return it as a Path.

    Raises
    ------
    SeedInputError
        If ``out`` exists and is not a folder, cannot be created, or refuses a test file.
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise SeedInputError(f"--out must be a folder, got the file {str(path)!r}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        # os.access is not enough (read-only mounts, ACLs): create and remove a real file.
        fd, probe = tempfile.mkstemp(prefix=".fastspec-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SeedInputError(f"--out {str(path)!r} is not writable: {exc.strerror or exc}") \
            from None
    return path


def write_report(report: dict, out: Path, name: str = "results.json") -> Path:
    """Write ``report`` as indented, strict JSON to ``out/name`` atomically (temp file + rename).

    Non-finite figures are written as ``null`` (:func:`fastspec.formats.json_io.dump`).
    """
    target = out / name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json_io.dump(report, f, indent=2)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def load_seed_file(path, markers: Sequence[str], names: Sequence[str],
                   label: str) -> types.ModuleType:
    """Load a seed document's Python code as a module, after checking it is that seed.

    The seed documents start with a line of prose (the experiment's title) before the code;
    everything from the first line that starts with a docstring, ``import`` or ``from`` is
    compiled. The file is refused unless every string of ``markers`` occurs in it and, once
    run (its ``__main__`` block does not run), it defines every callable of ``names``.

    ``path`` may also be a module loaded before (returned as is, after the names check).

    Raises
    ------
    SeedInputError
        Unreadable file, missing markers, code that fails to run, or missing names.
    """
    if isinstance(path, types.ModuleType):
        return _check_names(path, names, label)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SeedInputError(f"--seed-file {str(path)!r} cannot be read: {exc}") from None
    missing = [m for m in markers if m not in text]
    if missing:
        raise SeedInputError(f"--seed-file {str(path)!r} is not seed {label}: it lacks "
                             f"{', '.join(repr(m) for m in missing)}")
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if line.startswith(('"""', "import ", "from "))), 0)
    module = types.ModuleType(f"fastspec_seed_{label}")
    module.__file__ = str(path)
    # dataclasses look their module up in sys.modules while the class body runs.
    previous = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        exec(compile("".join(lines[start:]), str(path), "exec"), module.__dict__)
    except Exception as exc:  # any failure means this is not a usable seed file
        raise SeedInputError(f"--seed-file {str(path)!r} (seed {label}) does not run: "
                             f"{type(exc).__name__}: {exc}") from None
    finally:
        if previous is None:
            del sys.modules[module.__name__]
        else:
            sys.modules[module.__name__] = previous
    return _check_names(module, names, label)


def _check_names(module: types.ModuleType, names: Sequence[str], label: str) -> types.ModuleType:
    absent = [n for n in names if not callable(getattr(module, n, None))]
    if absent:
        raise SeedInputError(f"--seed-file {module.__file__!r} is not seed {label}: it does not "
                             f"define {', '.join(absent)}")
    return module


def seed_path(seed_file) -> str | None:
    """The path of a seed document given as a path or as the module loaded from it."""
    if seed_file is None:
        return None
    return str(getattr(seed_file, "__file__", seed_file))


def environment() -> dict:
    """Versions, platform and the kernel backend of this run."""
    # Small NumPy matrix products go through a threaded BLAS: on a busy machine its threads
    # contend, and timings swing by 10x unless OPENBLAS_NUM_THREADS=1. Record the setting.
    threads = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return dict(python=platform.python_version(), numpy=np.__version__,
                platform=platform.platform(), dtype="float64", device="CPU",
                fastspec=__version__, backend=backend(), cpu_count=os.cpu_count(),
                load_average_1min=load, blas_thread_env=threads)


def time_samples(fn: Callable[[], object], repeats: int, warmup: int = 1) -> dict:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` timed; milliseconds and median."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1000.0)
    return dict(ms=samples, median_ms=float(statistics.median(samples)))
