"""``fastspec seeds 000|002``: the founding experiments, run in-process through the CLI.

The reports are produced once per module with smaller settings than the commands' defaults
(fewer Monte Carlo draws, timing samples and simulated runs; the checks are the same) and
their keys and figures are asserted: seed 002's negative control against its analytic wrong
law, seed 000's rule lossy and the corrected rules exact. Bad input must exit with status 2
and write nothing. The seed documents themselves are used when present beside the repository
(``../shared/seeds`` or ``FASTSPEC_SEEDS_DIR``), never shipped.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import fastspec as fs
from fastspec import cli, kernels, seeds
from fastspec.seeds import report as seed_report
from fastspec.seeds import seed000, seed000_audit, seed002

SMALL = {"002": dict(draws=50_000, kernel_draws=1_000, repeats=2),
         "000": dict(runs=2, mc_runs=500)}
SEEDS_DIR = Path(os.environ.get("FASTSPEC_SEEDS_DIR",
                                Path(__file__).resolve().parents[2] / "shared" / "seeds"))
SEED_DOCS = {name: next(iter(sorted(SEEDS_DIR.glob(f"{name}_*.txt"))), None)
             if SEEDS_DIR.is_dir() else None for name in ("000", "002")}


_RUN_SEED = seeds.run_seed


def _run_cli(monkeypatch, argv):
    """Run ``fastspec <argv>`` in-process with SMALL settings; return the exit status."""
    monkeypatch.setattr(seeds, "run_seed",
                        lambda name, seed_file=None: _RUN_SEED(name, seed_file, **SMALL[name]))
    return cli.main(argv)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Both commands, run once (with the seed documents when present): name -> (status, report)."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for name in ("002", "000"):
            folder = tmp_path_factory.mktemp(f"seed{name}")
            doc = [] if SEED_DOCS[name] is None else ["--seed-file", str(SEED_DOCS[name])]
            rc = _run_cli(mp, ["seeds", name, "--out", str(folder), *doc])
            out[name] = rc, json.loads((folder / "results.json").read_text())
            assert sorted(p.name for p in folder.iterdir()) == ["results.json"]
    return out


# --- seed 002 ---------------------------------------------------------------------------------

def test_seed002_report_has_the_seed_keys_and_passes(reports):
    """Every check of the seed (and of the comparison with its code, when run) holds."""
    rc, r = reports["002"]
    failed = [c["name"] for c in r["checks"] if not c["passed"]]
    assert rc == 0 and r["passed"] and not failed, failed
    for key in ("environment", "config", "kv", "greedy_checks", "sampling_cache_traces",
                "identity_draft", "distribution_check", "timing", "workload"):
        assert key in r, key
    assert r["environment"]["backend"] == fs.backend()
    assert set(r["kv"]) >= {"max_logit_error", "shape", "bytes", "cached_length",
                            "causal_invariance"}
    assert set(r["timing"]) == {"full_prefix", "kv_cache", "speculative_g4"}
    for t in r["timing"].values():
        assert len(t["ms"]) == SMALL["002"]["repeats"] and t["median_ms"] > 0
        assert "ratio_seed_over_fastspec" in t
    for w in r["workload"].values():
        assert set(w) == {"target_calls", "draft_calls", "target_layer_tokens",
                          "target_score_cells"}


def test_seed002_kv_bytes_are_the_seed_figures(reports):
    kv = reports["002"][1]["kv"]
    # 2 layers x (K, V) x 2 heads x 29 positions x 8 dims x 8 bytes, read off the buffers.
    assert kv["bytes"] == 2 * 2 * 2 * 29 * 8 * 8 and kv["shape"] == [2, 29, 8]
    assert kv["cached_length"] == 29 and kv["causal_invariance"] is True
    assert kv["max_logit_error"] <= 1e-10
    assert kv["allocated_bytes"] > kv["bytes"]  # the preallocated capacity, reported apart


def test_seed002_decoding_checks(reports):
    r = reports["002"][1]
    assert len(r["greedy_checks"]) == 9 and all(c["greedy_equal"] for c in r["greedy_checks"])
    assert {(c["seed"], c["gamma"]) for c in r["greedy_checks"]} == {
        (s, g) for s in (69, 70, 71) for g in (1, 4, 8)}
    for trace in r["sampling_cache_traces"]:
        assert trace["stats"]["rounds"] == len(trace["rounds"])
        for rnd in trace["rounds"]:
            # Between rounds the target cache holds the committed sequence but its last token.
            assert rnd["target_cache_length"] == rnd["prefix_length"] + rnd["accepted"]
            committed = rnd["prefix_length"] + rnd["accepted"] + 1
            assert committed - 1 - rnd["draft_cache_length"] in (0, 1)
        assert trace["audit"]["block_logit_checks"] > trace["stats"]["rounds"]
    identity = r["identity_draft"]
    assert identity["rejected_rounds"] == 0 and identity["accepted"] == identity["proposed"]
    # Workload of the same jobs as the seed's: 48 target calls each, one per new token for
    # the vanilla jobs; the full-prefix job pushes the whole prefix through every call.
    w = r["workload"]
    assert w["full_prefix"]["target_calls"] == w["kv_cache"]["target_calls"] == 48
    assert w["full_prefix"]["target_layer_tokens"] == 2 * sum(range(8, 8 + 48))
    assert w["kv_cache"]["target_layer_tokens"] == 2 * (8 + 47)


def test_seed002_negative_control_matches_its_analytic_law(reports):
    d = reports["002"][1]["distribution_check"]
    p, q = np.array([.1, .6, .3]), np.array([.7, .2, .1])
    # Resampling from p after a rejection: accepted min(p, q), then 1 - sum min(p, q) of p.
    wrong_law = np.minimum(p, q) + (1 - np.minimum(p, q).sum()) * p
    analytic_tv = 0.5 * np.abs(wrong_law - p).sum()
    assert analytic_tv == pytest.approx(0.06, abs=1e-12)
    assert d["wrong_theoretical_tv"] == pytest.approx(analytic_tv, abs=1e-12)
    assert abs(d["wrong_fallback_tv"] - analytic_tv) < 0.01
    np.testing.assert_allclose(d["wrong_fallback_frequency"], wrong_law, atol=0.01)
    assert d["tv"] < 0.01
    np.testing.assert_allclose(d["frequency"], p, atol=0.01)
    assert d["analytic_max_error"] <= 1e-15 and d["analytic_cases"] == 4
    assert d["kernel_support_violations"] == 0
    assert d["kernel_agreement"]["mismatches"] == 0 and d["kernel_agreement"]["draws"] == 1_000
    assert d["draws"] == SMALL["002"]["draws"] and d["seed"] == 6900


def test_seed002_check_fails_with_a_broken_rule(monkeypatch):
    """The distribution check is not vacuous: a vectorised rule that resamples from p fails it."""
    real = seed002._inverse_cdf
    monkeypatch.setattr(seed002, "_inverse_cdf",
                        lambda w, u: real(np.array([.1, .6, .3]) if w[0] == 0 else w, u))
    d = seed002.distribution_check(draws=20_000, kernel_draws=200)
    assert d["tv"] > 0.04 and d["kernel_agreement"]["mismatches"] > 0


# --- seed 000 ---------------------------------------------------------------------------------

def test_seed000_report_keys_and_verdicts(reports):
    rc, r = reports["000"]
    failed = [c["name"] for c in r["checks"] if not c["passed"]]
    assert rc == 0 and r["passed"] and not failed, failed
    assert set(r) >= {"environment", "config", "audit", "timing"}
    a = r["audit"]
    assert a["seed_rule_tv"] > 0.01                      # the seed's rule is lossy
    assert a["corrected_rule_tv"] < 1e-12                # one-hot: exact to rounding
    assert a["independent_draft_tv"] < 1e-12             # per-position q of a 1-step draft
    for key in ("seed_rule_mass", "corrected_rule_mass", "independent_draft_mass", "target_mass"):
        assert a[key] == pytest.approx(1.0, abs=1e-12)
    assert a["continuations"] == 8 ** 3 and a["config"]["vocab_size"] == 8
    sharp = a["sharpened"]
    assert sharp["seed_rule_tv"] > 0.1 and sharp["corrected_rule_tv"] < 1e-12
    mc = sharp["monte_carlo"]
    assert mc["seed"]["p_value_vs_enumerated"] >= 1e-3 and mc["seed"]["p_value_vs_target"] < 1e-3
    assert mc["one_hot"]["p_value_vs_enumerated"] >= 1e-3


def test_seed000_timing_table(reports):
    t = reports["000"][1]["timing"]
    assert t["runs"] == 2 and t["new_tokens"] == 20
    for name in ("vanilla", "dflash", "dflash_corrected", "dflash_independent"):
        assert len(t[name]["runs_s"]) == 2 and t[name]["mean_s"] > 0
    for name in ("dflash", "dflash_corrected", "dflash_independent"):
        row = t[name]
        assert row["theoretical_speedup"] == pytest.approx(20 / row["mean_target_calls"], rel=0.5)
        assert row["measured_speedup"] > 0 and 0 <= row["acceptance_rate"] <= 1
    assert "theoretical" in t["reason"]
    assert (t["seed_code"] is None) == (SEED_DOCS["000"] is None)


def test_seed000_enumeration_uses_the_kernel_softmax():
    cfg = seed000_audit.AUDIT_CONFIG
    target = seed000.MLPTarget(cfg)
    drafter = seed000.WMixDrafter(cfg, target)
    fused = drafter.fuse(target.run([5])[1][-1], 3)
    logits = drafter.logits(fused, np.array([[0, 4, 1, 0]]))[0]
    for temperature in (1.0, cfg.early_temperature):
        np.testing.assert_allclose(seed000_audit.softmax(logits, temperature),
                                   kernels.probs(np.ascontiguousarray(logits), temperature),
                                   rtol=1e-12, atol=1e-15)
    weights, blocks, q = seed000_audit.draft_law(drafter, fused, "seed")
    assert blocks.shape == (8 ** 4, 4) and q.shape == (8 ** 4, 4, 8)
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert len({tuple(b) for b in blocks}) == len(blocks)  # every fill once


def test_seed000_schedule_is_the_seeds():
    assert seed000.seed_schedule(8, 2) == [4, 4]
    assert seed000.seed_schedule(7, 3) == [2, 2, 3]
    assert seed000.seed_schedule(4, 1) == [4]
    with pytest.raises(ValueError, match="rule"):
        seed000.speculative_decode(None, None, [1], 3, np.random.default_rng(0), rule="bad")
    with pytest.raises(ValueError, match="block_size"):
        seed000.Seed000Config(block_size=0)


# --- bad input: exit status 2, nothing written ------------------------------------------------

def test_unknown_seed_name(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["seeds", "001", "--out", str(out)]) == 2
    assert "unknown seed '001'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_unwritable_out(tmp_path, capsys, kind):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    out = blocker if kind == "file" else blocker / "sub"
    assert cli.main(["seeds", "002", "--out", str(out)]) == 2
    assert "--out" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder" and not (tmp_path / "results.json").exists()


def _bad_seed_files(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text('"""not a seed"""\nprint("hello")\n')
    broken = tmp_path / "broken.txt"
    broken.write_text("title\n\n\"\"\"x\"\"\"\nclass Decoder:\n  def sampling_audit(\n"
                      "def speculative 6900\n")
    hollow = tmp_path / "hollow.txt"
    hollow.write_text('"""def sampling_audit class Decoder def speculative 6900"""\n')
    return {"missing": tmp_path / "absent.txt", "plain": plain, "syntax": broken,
            "no_names": hollow}


@pytest.mark.parametrize("case", ["missing", "plain", "syntax", "no_names", "other_seed"])
def test_bad_seed_file(tmp_path, capsys, case):
    files = _bad_seed_files(tmp_path)
    if case == "other_seed":
        if SEED_DOCS["000"] is None:
            pytest.skip(f"seed documents not found in {SEEDS_DIR}")
        files[case] = SEED_DOCS["000"]
    out = tmp_path / "out"
    assert cli.main(["seeds", "002", "--out", str(out), "--seed-file", str(files[case])]) == 2
    err = capsys.readouterr().err
    assert "--seed-file" in err
    assert not out.exists()  # refused before the output folder is even created


def test_report_is_written_atomically(tmp_path):
    seed_report.write_report({"a": np.float64(1.5), "b": [np.int64(2)], "c": float("nan")},
                             tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    assert json.loads((tmp_path / "results.json").read_text()) == {"a": 1.5, "b": [2], "c": None}
    with pytest.raises(TypeError):
        seed_report.write_report({"x": object()}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp file left


# --- with the seed documents (when present) ---------------------------------------------------

@pytest.mark.parametrize("name", ["002", "000"])
def test_with_the_seed_file(reports, name):
    if SEED_DOCS[name] is None:
        pytest.skip(f"seed documents not found in {SEEDS_DIR}")
    rc, r = reports[name]
    assert rc == 0 and r["passed"] and r["config"]["seed_file"] == str(SEED_DOCS[name])
    if name == "002":
        comparison = r["seed_comparison"]
        assert comparison["max_logit_difference"] <= 1e-12
        assert all(v for k, v in comparison.items() if k.endswith("_equal"))
        assert r["workload_seed"] == r["workload"]  # the same work, counted by the seed's code
        for t in r["timing"].values():
            assert len(t["seed_ms"]) == SMALL["002"]["repeats"]
            assert t["ratio_seed_over_fastspec"] == pytest.approx(
                t["seed_median_ms"] / t["median_ms"])
    else:
        s = r["timing"]["seed_code"]
        assert s["max_logit_difference"] <= 1e-12
        assert s["theoretical_speedup"] > 1 and s["measured_speedup"] > 0
