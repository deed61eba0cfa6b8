"""JSON in and out: checked reads of JSON objects, and strict JSON writes of reports.

Every JSON text fastspec writes goes through :func:`dumps` or :func:`dump`: NumPy values
become Python ones and non-finite floats become ``null``, so the output is strict JSON
(RFC 8259 has no ``NaN`` or ``Infinity``; Python's ``json`` writes them by default and other
readers refuse the file).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["jsonable", "dumps", "dump", "read_json_object"]


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


def jsonable(x: Any, drop_private: bool = False) -> Any:
    """Return ``x`` with NumPy scalars/arrays as Python values and non-finite floats as None.

    Parameters
    ----------
    x : object
        Dicts, lists and tuples are copied recursively; other values are returned as they
        are (:func:`dumps` then raises ``TypeError`` for what JSON cannot hold).
    drop_private : bool
        Leave out dict keys that start with ``_`` (working data of a report).
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
        return x if math.isfinite(x) else None
    return x


def dumps(obj: Any, **kwargs: Any) -> str:
    """Return ``obj`` as strict JSON text (``json.dumps`` keywords pass through).

    Raises
    ------
    TypeError
        For a value JSON cannot hold (after :func:`jsonable`).
    """
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)


def dump(obj: Any, fp: IO[str], **kwargs: Any) -> None:
    """Write ``obj`` as strict JSON text to the text file ``fp`` (as :func:`dumps`)."""
    json.dump(jsonable(obj), fp, allow_nan=False, **kwargs)
