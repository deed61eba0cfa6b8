"""Correctness audits of the model core, the decoding engine and the drafters (``fastspec audit``).

- :mod:`~fastspec.audit.registry`: the checks (:func:`register_check`), the drafters every
  decoding audit runs (:func:`register_drafter`) and the shared settings;
- :mod:`~fastspec.audit.oracle`: the one exact-law oracle, on the NumPy reference;
- :mod:`~fastspec.audit.stats`: chi-square and total variation;
- :mod:`~fastspec.audit.distribution`: the seeded distribution audit through the real loop
  and its negative controls;
- :mod:`~fastspec.audit.core`: the checks of the forward pass, the decoding loop and the laws;
- :mod:`~fastspec.audit.dflash`: the DFlash drafter's checks and its exact enumeration;
- :mod:`~fastspec.audit.report`: :func:`run_audit` and the report.

:func:`run_audit` runs every registered check and returns a JSON-serialisable report (it
imports :mod:`~fastspec.audit.core`, whose import registers the core checks). The names below
are exported lazily (:mod:`fastspec.lazy`): importing the package imports none of its modules.
"""
from fastspec.lazy import exports

__all__ = ["AuditContext", "Check", "CHECKS", "register_check", "run_audit", "format_report",
           "write_report", "chi_square_sf", "chi_square_test", "total_variation",
           "chi_square_expected", "ExactOracle", "Law", "exact_continuation_probs",
           "exact_target_law", "exact_speculative_law", "PREFIX", "SEEDS", "GAMMAS",
           "NEW_TOKENS", "ALPHA", "toy_pair", "DRAFTERS", "register_drafter", "DIST_SETTINGS",
           "DIST_PREFIX", "DIST_NEW_TOKENS", "DIST_GAMMA", "DIST_SEED", "distribution_audit",
           "dist_drafters", "MemoModel", "ArgmaxDraftModelDrafter", "WrongQDrafter",
           "broken_verify_rejection", "OPTIONAL_CHECK_MODULES"]

__getattr__, __dir__ = exports(__name__, {
    "ALPHA": "registry",
    "CHECKS": "registry",
    "DRAFTERS": "registry",
    "GAMMAS": "registry",
    "NEW_TOKENS": "registry",
    "PREFIX": "registry",
    "SEEDS": "registry",
    "AuditContext": "registry",
    "Check": "registry",
    "register_check": "registry",
    "register_drafter": "registry",
    "toy_pair": "registry",
    "chi_square_expected": "stats",
    "chi_square_sf": "stats",
    "chi_square_test": "stats",
    "total_variation": "stats",
    "ExactOracle": "oracle",
    "Law": "oracle",
    "exact_continuation_probs": "oracle",
    "exact_speculative_law": "oracle",
    "exact_target_law": "oracle",
    "DIST_GAMMA": "distribution",
    "DIST_NEW_TOKENS": "distribution",
    "DIST_PREFIX": "distribution",
    "DIST_SEED": "distribution",
    "DIST_SETTINGS": "distribution",
    "ArgmaxDraftModelDrafter": "distribution",
    "MemoModel": "distribution",
    "WrongQDrafter": "distribution",
    "broken_verify_rejection": "distribution",
    "dist_drafters": "distribution",
    "distribution_audit": "distribution",
    "OPTIONAL_CHECK_MODULES": "report",
    "format_report": "report",
    "run_audit": "report",
    "write_report": "report",
})
