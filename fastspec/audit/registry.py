"""The audit registry: checks, the drafters every decoding audit runs, and shared settings.

A *check* is a function that takes an :class:`AuditContext` and returns a dict of figures
with a boolean ``"passed"`` entry (an exception counts as a failure)::

    from fastspec.audit import register_check

    @register_check("dflash_greedy_equality", group="dflash")
    def _dflash_greedy(ctx):
        ...
        return {"passed": ok, "mismatches": 0}
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.drafters.ngram import NgramDrafter
from fastspec.model import ModelConfig, Transformer

__all__ = ["AuditContext", "Check", "CHECKS", "register_check", "DRAFTERS", "register_drafter",
           "toy_pair", "PREFIX", "SEEDS", "GAMMAS", "NEW_TOKENS", "ALPHA"]

#: The seed experiment's prompt, seeds and block sizes.
PREFIX = [0, 1, 3, 2, 4, 1, 5, 6]
SEEDS = (69, 70, 71)
GAMMAS = (1, 4, 8)
NEW_TOKENS = 48
#: Chi-square p-value below which a distribution audit fails (fixed seeds: deterministic).
ALPHA = 1e-3


@dataclass
class Check:
    """A registered audit: ``fn(ctx) -> dict`` with a boolean ``"passed"``."""

    name: str
    fn: Callable[["AuditContext"], dict]
    group: str = "core"
    description: str = ""


#: Registered checks, in run order.
CHECKS: list[Check] = []


def register_check(name: str, group: str = "core", description: str = ""):
    """Decorator that adds ``fn(ctx) -> dict`` to :data:`CHECKS` under ``name``.

    Registering an existing name replaces it (so re-importing a module is harmless).
    """
    def decorate(fn):
        check = Check(name, fn, group, description or (fn.__doc__ or "").strip().split("\n")[0])
        for i, existing in enumerate(CHECKS):
            if existing.name == name:
                CHECKS[i] = check
                break
        else:
            CHECKS.append(check)
        return fn
    return decorate


#: Drafters every decoding audit runs: name -> factory(target, draft_model) -> Drafter.
DRAFTERS: dict[str, Callable[[Transformer, Transformer], Any]] = {
    "draft_model": lambda target, draft: DraftModelDrafter(draft),
    "ngram": lambda target, draft: NgramDrafter(max_ngram=3),
}


def register_drafter(name: str, factory: Callable[[Transformer, Transformer], Any]) -> None:
    """Add a drafter to the greedy-equality, rollback and distribution audits.

    ``factory(target, draft_model)`` returns a fresh drafter for the given toy target (2
    layers) and toy draft model (1 layer) of the same seed, float64.
    """
    DRAFTERS[name] = factory


@dataclass
class AuditContext:
    """Settings shared by the checks.

    Attributes
    ----------
    quick : bool
        Fewer samples in the distribution audit (for tests and CI).
    samples : int
        Speculative runs per distribution audit.
    """

    quick: bool = False
    samples: int = 100_000
    figures: dict = field(default_factory=dict)

    def model(self, seed: int, n_layers: int, vocab_size: int = 8) -> Transformer:
        """Return the toy float64 model of ``seed`` with ``n_layers`` (cached)."""
        key = ("toy", seed, n_layers, vocab_size)
        cache = self.figures.setdefault("_models", {})
        if key not in cache:
            cfg = ModelConfig.toy(vocab_size=vocab_size, n_layers=n_layers, dtype="float64")
            cache[key] = Transformer.random(cfg, seed)
        return cache[key]


def toy_pair(seed: int) -> tuple[Transformer, Transformer]:
    """Return the toy float64 target (2 layers) and draft (1 layer) of ``seed``."""
    return (Transformer.random(ModelConfig.toy(n_layers=2, dtype="float64"), seed),
            Transformer.random(ModelConfig.toy(n_layers=1, dtype="float64"), seed))
