"""bench/goals.py: its verdicts and table, and a quick run of its demo part (outputs checked
identical to vanilla there; no speed is asserted)."""
import math

import pytest

import fastspec as fs
from goals import Row, main, table


def test_verdicts():
    assert Row(30, "v8", "avx2", 1, 1.8, "<=", 1.8).verdict == "met"
    assert Row(30, "v8", "avx2", 1, 2.7, "<=", 1.8).verdict == "missed by 50%"
    assert Row(29, "x", "avx2", 1, 1.2, ">=", 1.5).verdict == "missed by 20%"
    assert Row(30, "idle", "avx2", 2, 0.7712, "<=", 0.77).verdict == "missed by 0.2%"
    assert Row(29, "x", "avx2", 1, 1.6, ">=", 1.5).verdict == "met"
    assert Row(29, "x", "avx2", 1, math.nan, ">=", 1.5).verdict == "not measured"


def test_table():
    lines = table([Row(29, "real q8_0 verify_8 (steps)", "avx512", 2, 1.234, "<=", 1.3)])
    assert lines[0].startswith("| issue | goal |")
    assert lines[2] == "| 29 | real q8_0 verify_8 (steps) | avx512 | 2 | 1.23 | <= 1.3 | met |"


@pytest.mark.skipif("cython" not in fs.available_backends() or not fs.pretrained.available(),
                    reason="needs the compiled backend and the embedded models")
def test_demo_part(capsys, tmp_path):
    out = tmp_path / "goals.json"
    assert main(["--only", "demo", "--quick", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "demo float16 ngram speedup" in text and "demo q8_0 dflash speedup" in text
    import json
    rows = json.loads(out.read_text())["rows"]
    assert {r["issue"] for r in rows} == {29, 30}
    assert all(r["verdict"] == "met" or r["verdict"].startswith("missed") for r in rows)
