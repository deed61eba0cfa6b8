"""bench/goals.py: its verdicts and table, and a quick run of its demo part (outputs checked
identical to vanilla there; no speed is asserted)."""
import math

import pytest

import fastspec as fs
from goals import Row, combine, main, table


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


def test_combine_passes():
    a = [Row(29, "v8", "avx2", 2, 1.6, "<=", 1.3), Row(29, "v16", "avx2", 2, 2.4, "<=", 2.0)]
    b = [Row(29, "v8", "avx2", 2, 1.2, "<=", 1.3), Row(29, "v16", "avx2", 2, 2.1, "<=", 2.0)]
    c = [Row(29, "v8", "avx2", 2, 1.25, "<=", 1.3), Row(29, "v16", "avx2", 2, math.nan, "<=", 2.0),
         Row(30, "new", "avx2", 1, math.nan, ">=", 1.5)]
    rows = combine([a, b, c])
    assert [(r.goal, r.value) for r in rows[:2]] == [("v8", 1.25), ("v16", 2.25)]
    assert rows[0].verdict == "met" and rows[1].verdict == "missed by 12%"
    assert rows[0].values == [1.6, 1.2, 1.25]
    assert rows[2].goal == "new" and math.isnan(rows[2].value)
    assert rows[2].verdict == "not measured"
    lines = table(rows)
    assert lines[0].endswith("| verdict | passes (min-max) |") and lines[1].count("|") == 9
    assert lines[2] == "| 29 | v8 | avx2 | 2 | 1.25 | <= 1.3 | met | 3 (1.20-1.60) |"
    assert lines[3].endswith("| 3 (2.10-2.40) |")
    assert lines[4].endswith("| 1 (not measured) |")
    assert "passes" not in table(a)[0]  # one pass: the table as before


def test_repeat_rejects_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--repeat", "0", "--only", "demo"])
    assert exc.value.code == 2 and "--repeat must be at least 1" in capsys.readouterr().err


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
