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

:func:`run_audit` runs every registered check and returns a JSON-serialisable report.
"""
from fastspec.audit.registry import (ALPHA, CHECKS, DRAFTERS, GAMMAS, NEW_TOKENS, PREFIX, SEEDS,
                                     AuditContext, Check, register_check, register_drafter,
                                     toy_pair)
from fastspec.audit.stats import (chi_square_expected, chi_square_sf, chi_square_test,
                                  total_variation)
from fastspec.audit.oracle import (ExactOracle, Law, exact_continuation_probs,
                                   exact_speculative_law, exact_target_law)
from fastspec.audit.distribution import (DIST_GAMMA, DIST_NEW_TOKENS, DIST_PREFIX, DIST_SEED,
                                         DIST_SETTINGS, ArgmaxDraftModelDrafter, MemoModel,
                                         WrongQDrafter, broken_verify_rejection, dist_drafters,
                                         distribution_audit)
from fastspec.audit import core  # noqa: F401 - importing it registers the core checks
from fastspec.audit.report import OPTIONAL_CHECK_MODULES, format_report, run_audit, write_report

__all__ = ["AuditContext", "Check", "CHECKS", "register_check", "run_audit", "format_report",
           "write_report", "chi_square_sf", "chi_square_test", "total_variation",
           "chi_square_expected", "ExactOracle", "Law", "exact_continuation_probs",
           "exact_target_law", "exact_speculative_law", "PREFIX", "SEEDS", "GAMMAS",
           "NEW_TOKENS", "ALPHA", "toy_pair", "DRAFTERS", "register_drafter", "DIST_SETTINGS",
           "DIST_PREFIX", "DIST_NEW_TOKENS", "DIST_GAMMA", "DIST_SEED", "distribution_audit",
           "dist_drafters", "MemoModel", "ArgmaxDraftModelDrafter", "WrongQDrafter",
           "broken_verify_rejection", "OPTIONAL_CHECK_MODULES"]
