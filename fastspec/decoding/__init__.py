"""The decoding layer: generate, the speculative loop, verification, trees, sampling, stats.

Lives here: ``vanilla`` (generate: vanilla decoding, and the checks both loops share),
``speculative`` (the speculative loop), ``verify`` (the accept/reject rules of a
round), ``tree`` (tree verification and sampling), ``sampling`` (next_token), ``stats``
(DecodeStats, GenerationResult).

May import: :mod:`fastspec.kernels`, :mod:`fastspec.model`, :mod:`fastspec.drafters` (the
vocabulary the loop and the drafters share). Nothing above it.
"""
from fastspec.lazy import exports

__all__ = ["DecodeStats", "GenerationResult", "generate", "speculative_generate",
           "plan_speculative", "run_plan", "SpeculativePlan", "ADAPTIVE_GAMMA_START",
           "ADAPTIVE_GAMMA_MAX"]

__getattr__, __dir__ = exports(__name__, {
    "DecodeStats": "stats",
    "GenerationResult": "stats",
    "generate": "vanilla",
    "speculative_generate": "speculative",
    "plan_speculative": "speculative",
    "run_plan": "speculative",
    "SpeculativePlan": "speculative",
    "ADAPTIVE_GAMMA_START": "speculative",
    "ADAPTIVE_GAMMA_MAX": "speculative",
})
