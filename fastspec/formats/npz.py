"""Bounded reader of fastspec ``.npz`` weight files (models and DFlash drafters).

The files come from anywhere, so nothing is unpickled and nothing is allocated before the
sizes it implies were checked against the bytes actually present: every member must be a
``.npy`` array whose header (dtype, shape) is validated, whose declared byte count matches the
member's size in the zip directory, and whose size is plausible for its compressed size.
Every failure is a ValueError naming the file and the member.
"""
from __future__ import annotations

import json
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

__all__ = ["read_npz"]

#: Largest ``config`` entry accepted (a JSON string), in bytes.
MAX_CONFIG_BYTES = 1 << 20
#: Deflate cannot expand data by more than ~1032x; anything claiming more is forged.
MAX_DEFLATE_RATIO = 1100


def read_npz(path, kind: str, required: tuple[str, ...] = ()) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a fastspec ``.npz``: its JSON ``config`` entry and its floating-point tensors.

    Parameters
    ----------
    path : path-like
    kind : str
        What the file should be ("model", "DFlash"), for the messages.
    required : tuple of str
        Tensor names that must be present besides ``config``.

    Returns
    -------
    config : dict
        The decoded JSON object.
    tensors : dict of str to ndarray
        Every other member, a float16/32/64 array, or uint16 (bfloat16 bit patterns).

    Raises
    ------
    ValueError
        Not a zip/npz file, truncated, no ``config``, config not a JSON object, a member that
        is not a float or uint16 array (object, int, string, complex...), or whose header declares more
        bytes than the member holds.
    OSError
        The file cannot be opened.
    """
    path = Path(path)
    size = path.stat().st_size
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid .npz file ({exc})") from None
    with zf:
        members = {}
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"{path}: unexpected member {info.filename!r} (not a .npy array)")
            members[info.filename[:-4]] = info
        missing = [k for k in ("config", *required) if k not in members]
        if missing:
            raise ValueError(f"{path}: not a fastspec {kind} file (no {missing} entry)")
        arrays = {}
        for name, info in members.items():
            try:
                arrays[name] = _read_member(zf, info, size, name == "config")
            except ValueError as exc:
                raise ValueError(f"{path}: member {name!r}: {exc}") from None
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as exc:
                raise ValueError(f"{path}: member {name!r} is corrupt ({exc})") from None
    raw = arrays.pop("config")
    try:
        config = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: config is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: config must be a JSON object, got {type(config).__name__}")
    return config, arrays


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, file_size: int,
                 is_config: bool) -> np.ndarray:
    if info.compress_size > file_size:
        raise ValueError(f"compressed size {info.compress_size} exceeds the file size {file_size}")
    limit = (info.compress_size if info.compress_type == zipfile.ZIP_STORED
             else MAX_DEFLATE_RATIO * info.compress_size + 1024)
    if info.file_size > limit:
        raise ValueError(f"declared size {info.file_size} is impossible for "
                         f"{info.compress_size} stored bytes")
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        if dtype.hasobject:
            raise ValueError("object arrays are refused (they would need unpickling)")
        if is_config:
            if dtype.kind != "U" or shape != ():
                raise ValueError(f"config must be a 0-d unicode string, got {dtype} {shape}")
        elif dtype.kind != "f" and dtype != np.dtype("<u2"):
            raise ValueError(f"tensors must be floating point or uint16 (bf16 bits), got dtype "
                             f"{dtype}")
        nbytes = math.prod(shape) * dtype.itemsize
        header = f.tell()
        if nbytes != info.file_size - header:
            raise ValueError(f"header declares shape {shape} of {dtype} ({nbytes} bytes) but "
                             f"the member holds {info.file_size - header} data bytes")
        if is_config and nbytes > MAX_CONFIG_BYTES:
            raise ValueError(f"config of {nbytes} bytes exceeds {MAX_CONFIG_BYTES}")
        out = np.empty(shape[::-1] if fortran else shape, dtype=dtype)
        view = memoryview(out.reshape(-1).view(np.uint8)) if nbytes else None
        done = 0
        while done < nbytes:
            got = f.readinto(view[done:])
            if not got:
                raise ValueError(f"truncated: {done} of {nbytes} data bytes")
            done += got
    return out.T if fortran else out
