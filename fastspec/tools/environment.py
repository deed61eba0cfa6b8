"""Where a measurement or an audit ran: versions, backend, machine and time."""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from fastspec.kernels import available_backends, backend, isa_info, threads_info
from fastspec.kernels.cpuinfo import cpuinfo
from fastspec.version import __version__

__all__ = ["environment", "cpu_name"]


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers (``/proc/cpuinfo`` on Linux:
    "AMD EPYC (family 25, model 17)"), else what :mod:`platform` knows.

    The numbers tell apart CPUs that share a name: the AMD EPYC guests of a Zen 3, a Zen 4 and
    a Zen 5 all read "AMD EPYC", and a report from one must not pass for another's
    (:func:`fastspec.tools.markdown.keep_dated`).
    """
    info = cpuinfo()
    name = info["name"] or platform.processor() or platform.machine()
    if info["family"] or info["model"]:
        name += f" (family {info['family']}, model {info['model']})"
    return name


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
