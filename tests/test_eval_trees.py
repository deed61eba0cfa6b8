"""``fastspec eval`` reports chain and tree per drafter (issue 16 item 5)."""
import json

import pytest

import fastspec as fs
from fastspec.cli import main

pytestmark = pytest.mark.skipif(not fs.pretrained.available(),
                                reason="embedded weights not installed")


def test_eval_reports_chain_and_tree_rows(tmp_path):
    out, md = tmp_path / "e.json", tmp_path / "e.md"
    assert main(["eval", "--prompts", "1", "--max-new-tokens", "12", "--temperatures", "0", "1",
                 "--methods", "ngram", "ngram_tree", "dflash", "dflash_tree",
                 "--out", str(out), "--markdown", str(md)]) == 0
    report = json.loads(out.read_text())
    assert report["methods"] == ["vanilla", "ngram", "ngram_tree", "dflash", "dflash_tree"]
    for t in (0.0, 1.0):
        for m in report["methods"][1:]:
            assert report["summary"][f"T={t}/all/{m}"]["tau"]["n"] == 1
    greedy = [r for r in report["runs"] if r["temperature"] == 0.0]
    assert all(r["identical"] for r in greedy)  # trees are lossless: greedy == vanilla
    text = md.read_text()
    assert "| ngram_tree | 7 |" in text and "| dflash_tree | 7 |" in text


def test_eval_refuses_an_unknown_method(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--methods", "medusa"])
    assert exc.value.code == 2 and "medusa" in capsys.readouterr().err
