"""The audits: statistics helpers, the quick audit, negative controls, the CLI."""
import json
import math
import os

import numpy as np
import pytest

import fastspec as fs
from fastspec import audit
from fastspec.cli import main

#: Runs per distribution case in the default (fast) tests; the full audit uses 100 000.
SAMPLES = 8_000 if fs.backend() == "cython" else 3_000


def test_chi_square_sf_known_values():
    # 95th percentiles of chi-square(df): the tail beyond them is 0.05
    for df, x in [(1, 3.841), (2, 5.991), (10, 18.307), (50, 67.505), (100, 124.342),
                  (500, 553.127)]:
        assert audit.chi_square_sf(x, df) == pytest.approx(0.05, abs=2e-3)
    assert audit.chi_square_sf(0.0, 10) == 1.0
    assert audit.chi_square_sf(1e4, 10) < 1e-100


def test_chi_square_test_power_and_size():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(60))
    p[:5] = 0
    p /= p.sum()
    good = np.bincount(rng.choice(60, 20_000, p=p), minlength=60)
    r = audit.chi_square_test(good, p)
    assert r["p_value"] > 1e-3 and r["impossible_count"] == 0 and r["tv"] < 0.05
    q = 0.9 * p + 0.1 * np.r_[np.zeros(5), np.ones(55) / 55]
    bad = np.bincount(rng.choice(60, 20_000, p=q), minlength=60)
    assert audit.chi_square_test(bad, p)["p_value"] < 1e-3
    impossible = good.copy()
    impossible[0] = 1
    assert audit.chi_square_test(impossible, p)["impossible_count"] == 1


def test_exact_continuation_probs():
    model = fs.Transformer.random(fs.ModelConfig.toy(dtype="float64"), 69)
    law = audit.exact_continuation_probs(model, audit.PREFIX, 2,
                                         fs.SamplingParams(1.0, 3, 1.0))
    assert law.shape == (64,)
    assert law.sum() == pytest.approx(1.0)
    assert ((law > 0).reshape(8, 8).sum(axis=1) <= 3).all()


def test_quick_audit_non_statistical_checks_pass(backend):
    report = audit.run_audit(quick=True, names=["model", "decoding"])
    failed = {k: v.get("error", v) for k, v in report["checks"].items() if not v["passed"]}
    assert not failed
    assert {"cache_block_equivalence", "causal_invariance", "greedy_equality", "identity_draft",
            "rollback", "stopping_rules"} <= set(report["checks"])
    assert report["environment"]["backend"] == backend
    json.dumps(report)


@pytest.mark.parametrize("setting", ["temperature_1", "top_k_6_top_p_0.8"])
def test_distribution_audit_passes_for_every_drafter(setting):
    sampling = audit.DIST_SETTINGS[setting]
    for name, drafter in audit.dist_drafters().items():
        r = audit.distribution_audit(drafter, sampling, SAMPLES)
        assert r["passed"], (name, r)
        assert r["impossible_count"] == 0


def test_negative_controls_are_detected():
    draft = audit.MemoModel(fs.Transformer.random(fs.ModelConfig.toy(n_layers=1,
                                                                      dtype="float64"), 69))
    sampling = audit.DIST_SETTINGS["temperature_1"]
    broken = audit.distribution_audit(fs.DraftModelDrafter(draft), sampling, SAMPLES // 2,
                                      verifier=audit.broken_verify_rejection)
    wrong_q = audit.distribution_audit(audit.WrongQDrafter(draft), sampling, SAMPLES // 2)
    assert not broken["passed"] and broken["p_value"] < 1e-6
    assert not wrong_q["passed"] and wrong_q["p_value"] < 1e-6


def test_memo_model_matches_the_model():
    model = fs.Transformer.random(fs.ModelConfig.toy(dtype="float64"), 70)
    memo = audit.MemoModel(model)
    cache, mcache = model.new_cache(), memo.new_cache()
    for chunk in ([0, 1, 3], [2], [4, 1, 5, 6]):
        a = model.forward(np.array(chunk), cache, hidden_layers=[0, 1])
        b = memo.forward(np.array(chunk), mcache, hidden_layers=[0, 1])
        np.testing.assert_allclose(a.logits, b.logits, atol=1e-12)
        for layer in (0, 1):
            np.testing.assert_allclose(a.hidden[layer], b.hidden[layer], atol=1e-12)
    mcache.crop(2)
    assert mcache.length == 2


def test_registry_and_exit_status(tmp_path, capsys):
    calls = []

    @audit.register_check("always_fails_for_test", group="testgroup")
    def _fail(ctx):
        calls.append(ctx.quick)
        return {"passed": False, "why": "on purpose"}

    try:
        out = tmp_path / "r.json"
        assert main(["audit", "--check", "testgroup", "--out", str(out)]) == 1
        data = json.loads(out.read_text())
        assert data["passed"] is False
        assert data["checks"]["always_fails_for_test"]["why"] == "on purpose"

        @audit.register_check("always_fails_for_test", group="testgroup")
        def _crash(ctx):
            raise RuntimeError("boom")

        assert main(["audit", "--check", "testgroup"]) == 1
        assert "boom" in capsys.readouterr().out
    finally:
        audit.CHECKS[:] = [c for c in audit.CHECKS if c.name != "always_fails_for_test"]


def test_cli_audit_passes_and_writes_json(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert main(["audit", "--check", "model", "--check", "greedy_equality",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["passed"] is True
    assert {"python", "numpy", "platform", "backend"} <= set(data["environment"])
    assert data["checks"]["greedy_equality"]["passed"]
    text = capsys.readouterr().out
    assert "greedy_equality" in text and "PASS" in text
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    with pytest.raises(ValueError, match="unknown checks"):
        audit.run_audit(names=["no_such_check"])


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FASTSPEC_SLOW"),
                    reason="the full 100k-run audit; set FASTSPEC_SLOW=1 (or run `fastspec audit`)")
def test_full_audit_passes():
    report = audit.run_audit(quick=False)
    failed = {k: v.get("error", v.get("cases")) for k, v in report["checks"].items()
              if not v["passed"]}
    assert not failed
    for case in report["checks"]["exact_distribution"]["cases"]:
        assert case["samples"] >= 100_000
    assert math.isfinite(report["seconds"])
