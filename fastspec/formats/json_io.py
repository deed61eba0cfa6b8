"""JSON in and out: checked reads of JSON objects, and JSON-ready copies of reports."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["jsonable", "read_json_object"]


def read_json_object(path: Path) -> dict | None:
    """Return the JSON object in ``path``, None when the file does not exist.

    Raises ValueError naming the file when it is not UTF-8 JSON or does not hold an object.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    return data


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
