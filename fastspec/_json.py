"""JSON-ready copies of reports: NumPy values as Python ones, non-finite floats as text."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["jsonable"]


def jsonable(x, drop_private: bool = False):
    """Return ``x`` with NumPy scalars/arrays as Python values and non-finite floats as text.

    ``drop_private`` leaves out dict keys that start with ``_`` (working data of a report).
    """
    if isinstance(x, dict):
        return {str(k): jsonable(v, drop_private) for k, v in x.items()
                if not (drop_private and str(k).startswith("_"))}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, drop_private) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist(), drop_private)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    return x
