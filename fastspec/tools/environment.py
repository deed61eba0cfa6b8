"""Where a measurement or an audit ran: versions, backend, machine and time."""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from fastspec.kernels import available_backends, backend, isa_info, threads_info
from fastspec.version import __version__

__all__ = ["environment", "cpu_name"]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Return the versions, backends, machine and UTC time of this run (JSON-ready)."""
    return {"python": platform.python_version(), "numpy": np.__version__,
            "fastspec": __version__, "backend": backend(),
            "available_backends": list(available_backends()),
            "platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu": cpu_name(),
            "isa": isa_info()["selected"], "cpus": os.cpu_count(),
            "threads": threads_info()["threads"],
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
