"""What ``/proc/cpuinfo`` says about this CPU: one reader for the ISA report and the run lines.

:func:`fastspec.kernels._isa.cpu_model` (the FMA units of :func:`~fastspec.kernels.isa_info`),
the clock fallback of its FMA peak, and :func:`fastspec.tools.environment.cpu_name` (the CPU
that generated a report) all read it here.
"""
from __future__ import annotations

import functools
from typing import TypedDict

__all__ = ["CpuInfo", "cpuinfo", "parse_cpuinfo"]


class CpuInfo(TypedDict):
    """The fields of :func:`cpuinfo` (zero or empty where not known)."""

    vendor: str
    family: int
    model: int
    name: str
    mhz: float


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of ``/proc/cpuinfo``.

    Parameters
    ----------
    text : str
        The file's contents.

    Returns
    -------
    CpuInfo
        ``vendor`` (``vendor_id``), ``family`` (``cpu family``), ``model`` and ``name``
        (``model name``) of the first processor block; ``mhz``: the highest ``cpu MHz`` of any
        processor. A field the text lacks, or holds in a form that does not parse, is 0 or "".
    """
    info: CpuInfo = {"vendor": "", "family": 0, "model": 0, "name": "", "mhz": 0.0}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model",
            "model name": "name"}
    first = True
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            first = first and not info["vendor"]  # a blank line ends the first block
            continue
        if key == "cpu MHz":
            try:
                info["mhz"] = max(info["mhz"], float(value))
            except ValueError:
                pass
        elif first and key in keys:
            field = keys[key]
            if field in ("family", "model"):
                try:
                    info[field] = int(value)  # type: ignore[literal-required]
                except ValueError:
                    pass
            else:
                info[field] = value  # type: ignore[literal-required]
    return info


@functools.cache
def cpuinfo() -> CpuInfo:
    """Return :func:`parse_cpuinfo` of this machine's ``/proc/cpuinfo`` (read once), with every
    field zero or empty where the file cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return parse_cpuinfo("")
