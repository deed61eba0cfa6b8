"""The founding experiments of fastspec, reproduced on its core (``fastspec seeds``).

- ``000``: :mod:`fastspec.seeds.run000` over :mod:`fastspec.seeds.seed000`, the NumPy DFlash toy (W_mix drafter, MLP target,
  stochastic two-step denoising) with the exact audit of its acceptance rule.
- ``002``: :mod:`fastspec.seeds.seed002`, the KV-cache and speculative-decoding audit.

:func:`run_seed` runs one and returns its report; the command writes it as
``DIR/results.json`` (see :mod:`fastspec.seeds.report`).
"""
from __future__ import annotations

import importlib

from fastspec.seeds.report import SeedInputError, load_seed_file

__all__ = ["SEED_NAMES", "SeedInputError", "load_seed", "run_seed", "summary"]

#: Seed name -> module that reproduces it.
SEED_NAMES = {"000": "fastspec.seeds.run000", "002": "fastspec.seeds.seed002"}


def _module(name: str):
    if name not in SEED_NAMES:
        raise SeedInputError(f"unknown seed {name!r}; known seeds: {', '.join(SEED_NAMES)}")
    return importlib.import_module(SEED_NAMES[name])


def load_seed(name: str, path):
    """Load seed ``name``'s document ``path`` as a module (SeedInputError if it is not it)."""
    module = _module(name)
    return load_seed_file(path, module.SEED_MARKERS, module.SEED_NAMES, name)


def run_seed(name: str, seed_file=None, **settings) -> dict:
    """Run seed ``name`` ("000" or "002") and return its report (a JSON-ready dict).

    ``seed_file`` is the seed document (a path, or the module :func:`load_seed` returned),
    whose own NumPy code is then timed beside fastspec's; ``settings`` go to the seed
    module's ``run`` (smaller runs for tests).
    """
    return _module(name).run(seed_file, **settings)


def summary(name: str, report: dict) -> str:
    """Return a short text summary of ``report`` for the terminal."""
    return _module(name).summary(report)
