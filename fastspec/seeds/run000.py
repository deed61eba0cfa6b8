"""Seed 000's experiment on fastspec: the exact audit of its rules and its timing table.

The command's entry for ``fastspec seeds 000``; the system itself (MLP target, W_mix drafter,
schedule, loop) is :mod:`fastspec.seeds.seed000`, its audit :mod:`~fastspec.seeds.seed000_audit`
and its timing :mod:`~fastspec.seeds.seed000_timing`.
"""
from __future__ import annotations

from fastspec.seeds import seed000_audit
from fastspec.seeds.report import environment, load_seed_file, seed_path
from fastspec.seeds.seed000 import (EXACT_TOL, LOSSY, NEW_TOKENS, PROMPT, RUNS, SEED_MARKERS,
                                    SEED_NAMES, Seed000Config)
from fastspec.seeds.seed000_timing import seed_code_timing, timing_table

__all__ = ["run", "summary", "SEED_MARKERS", "SEED_NAMES"]


def run(seed_file=None, *, runs: int = RUNS, mc_runs: int = 1000,
        audit_config: Seed000Config | None = None) -> dict:
    """Run seed 000 on fastspec: the exact audit of its rules and its timing table.

    Parameters
    ----------
    seed_file : path, optional
        The seed 000 document; its own code is timed on the same table (and must compute the
        same logits).
    runs : int
        Timed runs per method (the seed's 10).
    mc_runs : int
        Simulated runs of the real loop per rule (sharpened models), checked against the
        enumerated law (0: none).
    audit_config : Seed000Config, optional
        Configuration of the exact audit (default: ``seed000_audit.AUDIT_CONFIG``).

    Raises
    ------
    fastspec.seeds.report.SeedInputError
        If ``seed_file`` is not the seed 000 document (checked before any work).
    """
    module = None if seed_file is None else load_seed_file(seed_file, SEED_MARKERS,
                                                          SEED_NAMES, "000")
    config = Seed000Config()
    audit = seed000_audit.run_audit(audit_config or seed000_audit.AUDIT_CONFIG,
                                    mc_runs=mc_runs)
    timing = timing_table(config, runs)
    timing["seed_code"] = (None if module is None
                           else seed_code_timing(module, config, runs, NEW_TOKENS))
    checks = [("seed rule is lossy (exact TV > 1e-3)", audit["seed_rule_tv"] > LOSSY),
              ("corrected one-hot rule is exact (TV < 1e-12)",
               audit["corrected_rule_tv"] < EXACT_TOL),
              ("independent one-step draft is exact (TV < 1e-12)",
               audit["independent_draft_tv"] < EXACT_TOL)]
    for rule, m in audit["sharpened"]["monte_carlo"].items():
        checks.append((f"the loop's law == the enumerated law ({rule} rule, sharpened models)",
                       m["p_value_vs_enumerated"] >= 1e-3 and m["impossible"] == 0))
    if "seed" in audit["sharpened"]["monte_carlo"]:
        checks.append(("the seed rule's runs fail the target's law (sharpened models)",
                       audit["sharpened"]["monte_carlo"]["seed"]["p_value_vs_target"] < 1e-3))
    if module is not None:
        checks.append(("seed code computes the same logits (within 1e-12)",
                       timing["seed_code"]["max_logit_difference"] <= 1e-12))
    report = dict(environment=environment(),
                  config=dict(vars(config), prompt=list(PROMPT), new_tokens=NEW_TOKENS,
                              runs=runs, seed_file=seed_path(seed_file)),
                  audit=audit, timing=timing,
                  checks=[dict(name=n, passed=bool(ok)) for n, ok in checks],
                  passed=all(ok for _, ok in checks))
    return report


def summary(report: dict) -> str:
    """A few lines for the terminal: checks that failed, the TVs, the timing table."""
    a, t = report["audit"], report["timing"]
    lines = [f"seed 000 on fastspec (backend {report['environment']['backend']}): "
             f"{'PASS' if report['passed'] else 'FAIL'}, {len(report['checks'])} checks"]
    lines += [f"  FAILED: {c['name']}" for c in report["checks"] if not c["passed"]]
    lines.append(f"  exact TV of 3 tokens (vocab {a['config']['vocab_size']}, block "
                 f"{a['config']['block_size']}): seed rule {a['seed_rule_tv']:.4g}, corrected "
                 f"{a['corrected_rule_tv']:.2g}, independent draft {a['independent_draft_tv']:.2g}")
    sh = a["sharpened"]
    lines.append(f"  same, LM heads x{sh['config']['logit_scale']:g} (peaked laws): seed rule "
                 f"{sh['seed_rule_tv']:.4g}, corrected {sh['corrected_rule_tv']:.2g}")
    lines.append(f"  {t['runs']} runs x {t['new_tokens']} tokens: vanilla "
                 f"{t['vanilla']['mean_s'] * 1e3:.2f} ms")
    for name in ("dflash", "dflash_corrected", "dflash_independent"):
        r = t[name]
        lines.append(f"  {name:<18} {r['mean_s'] * 1e3:.2f} ms, measured "
                     f"{r['measured_speedup']:.2f}x, theoretical {r['theoretical_speedup']:.2f}x, "
                     f"acceptance {r['acceptance_rate']:.2f}")
    s = t.get("seed_code")
    if s:
        lines.append(f"  seed's own code: vanilla {s['vanilla']['mean_s'] * 1e3:.2f} ms, DFlash "
                     f"{s['dflash']['mean_s'] * 1e3:.2f} ms, measured "
                     f"{s['measured_speedup']:.2f}x, theoretical {s['theoretical_speedup']:.2f}x")
    return "\n".join(lines)
