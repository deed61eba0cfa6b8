"""Running the registered checks and reporting them (``fastspec audit``)."""
from __future__ import annotations

import importlib
import time
import traceback
from typing import Callable

from fastspec.formats import json_io
from fastspec.audit import core  # noqa: F401 - importing it registers the core checks
from fastspec.audit.registry import (ALPHA, CHECKS, DRAFTERS, GAMMAS, NEW_TOKENS, PREFIX, SEEDS,
                                     AuditContext)
from fastspec.tools.environment import environment

__all__ = ["run_audit", "format_report", "write_report", "OPTIONAL_CHECK_MODULES"]

#: Modules imported by :func:`run_audit` if present; they register their own checks.
OPTIONAL_CHECK_MODULES = ("fastspec.audit.dflash", "fastspec.audit.tree")


def _load_optional_checks() -> tuple[list[str], dict[str, str]]:
    """Import the modules that register more checks; return (loaded, import errors)."""
    loaded, errors = [], {}
    for name in OPTIONAL_CHECK_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                errors[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # reported as a failed check, never hidden
            errors[name] = f"{type(exc).__name__}: {exc}"
        else:
            loaded.append(name)
    return loaded, errors


def run_audit(quick: bool = False, samples: int | None = None, names=None,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run the registered checks and return the report.

    Parameters
    ----------
    quick : bool
        20 000 instead of 100 000 runs per distribution audit, fewer rollback seeds.
    samples : int, optional
        Override the number of runs per distribution audit.
    names : iterable of str, optional
        Run only these checks (or groups).
    progress : callable, optional
        Called with a line of text after each check.

    Returns
    -------
    dict
        ``passed``, ``environment``, ``config``, ``checks`` (name -> figures with
        ``passed``, ``seconds`` and, on an exception, ``error``).
    """
    loaded, import_errors = _load_optional_checks()
    ctx = AuditContext(quick=quick, samples=samples or (20_000 if quick else 100_000))
    wanted = None if names is None else set(names)
    unknown = set() if wanted is None else wanted - {c.name for c in CHECKS} - {c.group for c in CHECKS}
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {[c.name for c in CHECKS]}")
    results = {}
    if wanted is None:
        for module, error in import_errors.items():
            results[f"import {module}"] = dict(group="import", description="optional checks",
                                               passed=False, error=error, seconds=0.0)
    t_all = time.perf_counter()
    for check in CHECKS:
        if wanted is not None and check.name not in wanted and check.group not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            figures = check.fn(ctx)
            if not isinstance(figures, dict) or "passed" not in figures:
                raise TypeError(f"check {check.name} must return a dict with 'passed'")
            figures["passed"] = bool(figures["passed"])
        except Exception as exc:  # a crashing check is a failed check, reported in full
            figures = dict(passed=False, error=f"{type(exc).__name__}: {exc}",
                           traceback=traceback.format_exc())
        figures["seconds"] = time.perf_counter() - t0
        figures = {"group": check.group, "description": check.description, **figures}
        results[check.name] = figures
        if progress is not None:
            progress(f"{'PASS' if figures['passed'] else 'FAIL'}  {check.name}  "
                     f"({figures['seconds']:.1f} s)")
    report = dict(passed=bool(results) and all(r["passed"] for r in results.values()),
                  environment=environment(),
                  config=dict(quick=quick, distribution_samples=ctx.samples, prefix=PREFIX,
                              seeds=list(SEEDS), gammas=list(GAMMAS), new_tokens=NEW_TOKENS,
                              dtype="float64", toy_target_layers=2, toy_draft_layers=1,
                              drafters=list(DRAFTERS), alpha=ALPHA, extra_modules=loaded),
                  checks=results, seconds=time.perf_counter() - t_all)
    return json_io.jsonable(report, drop_private=True)


def format_report(report: dict) -> str:
    """Return a readable summary table of :func:`run_audit`'s report."""
    lines = [f"fastspec {report['environment']['fastspec']} audit — backend "
             f"{report['environment']['backend']}, numpy {report['environment']['numpy']}, "
             f"python {report['environment']['python']}"]
    width = max([len(n) for n in report["checks"]] + [5])
    lines.append(f"{'check':<{width}}  result  seconds  figures")
    for name, r in report["checks"].items():
        lines.append(f"{name:<{width}}  {'PASS' if r['passed'] else 'FAIL':<6}  "
                     f"{r['seconds']:7.2f}  {_headline(name, r)}")
    lines.append(f"overall: {'PASS' if report['passed'] else 'FAIL'} "
                 f"({report['seconds']:.1f} s)")
    return "\n".join(lines)


def _headline(name: str, r: dict) -> str:
    if "error" in r:
        return r["error"]
    if name == "cache_block_equivalence":
        return f"max logit err {r['max_logit_error']:.1e}, cache err {r['max_cache_error']:.1e}"
    if name == "causal_invariance":
        return f"max earlier-logit change {r['max_earlier_logit_change']:.1e}"
    if name in ("exact_distribution", "negative_controls"):
        parts = []
        for c in r["cases"]:
            label = c.get("control") or f"{c['drafter']}/{c['setting']}"
            parts.append(f"{label}: p={c['p_value']:.3g} tv={c['tv']:.4f}")
        return f"{r['cases'][0]['samples']} runs each; " + "; ".join(parts)
    if name == "rollback":
        return (f"max target err {max(c['max_target_error'] for c in r['cases']):.1e}, "
                f"draft err {max(c['max_draft_error'] for c in r['cases']):.1e}, "
                f"{len(r['cases'])} runs")
    cases = r.get("cases")
    if isinstance(cases, list):
        return f"{len(cases)} cases"
    return ""


def write_report(report: dict, path) -> None:
    """Write the report as indented, strict JSON (non-finite figures as ``null``)."""
    with open(path, "w", encoding="utf-8") as f:
        json_io.dump(report, f, indent=2)
        f.write("\n")
