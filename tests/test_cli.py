"""The ``fastspec`` command line: one module per command, aligned tables, strict JSON out.

Every JSON text a command writes is parsed here with ``NaN``/``Infinity`` refused (strict
RFC 8259, as other languages' readers are): a non-finite figure (vanilla's acceptance rate,
an audit figure that is not a number) must come out as ``null``.
"""
import json
import re

import numpy as np
import pytest

import fastspec as fs
from fastspec import audit
from fastspec.cli import COMMANDS, main
from fastspec.formats import json_io
from fastspec.seeds import report as seed_report
from fastspec.tools.demo import METHODS, MethodResult, format_table

COMMAND_NAMES = [m.__name__.rsplit(".", 1)[1] for m in COMMANDS]
needs_bundle = pytest.mark.skipif(not fs.pretrained.available(),
                                  reason="embedded weights not installed")


def strict_loads(text: str):
    """``json.loads`` that raises on ``NaN``, ``Infinity`` and ``-Infinity``."""
    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_strict_loads_refuses_what_python_writes_by_default():
    with pytest.raises(ValueError, match="NaN"):
        strict_loads(json.dumps({"a": float("nan")}))


# --- one module per command ---------------------------------------------------------------

def test_every_command_is_a_module_with_add_parser_and_run():
    assert COMMAND_NAMES == ["info", "audit", "demo", "generate", "chat", "eval", "bench",
                             "quantize", "train", "seeds"]
    for module in COMMANDS:
        assert callable(module.add_parser) and callable(module.run), module.__name__


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_every_command_has_help(command, capsys):
    if command == "train":  # its --help is the trainer's own, which needs torch
        pytest.importorskip("torch")
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: fastspec {command}" in capsys.readouterr().out


def test_train_passes_every_argument_on(monkeypatch):
    seen = []
    training = pytest.importorskip("fastspec.training")
    monkeypatch.setattr(training, "main", lambda argv: seen.append(argv) or 0)
    assert main(["train", "--model", "x", "target", "--steps", "5"]) == 0
    assert seen == [["--model", "x", "target", "--steps", "5"]]


# --- the demo's table ---------------------------------------------------------------------

def _column_ends(line: str) -> list[int]:
    """End offsets of the right-aligned columns (every field after the method name)."""
    return [m.end() for m in re.finditer(r"\S+", line)][1:]


def _check_aligned(table: str, methods) -> None:
    head, rule, *rows = table.splitlines()
    assert len(rows) == len(methods)
    # "target calls" is one column of two words: its end is the end of "calls"
    ends = [e for e in _column_ends(head) if head[e - len("target"):e] != "target"]
    assert len(ends) == 7 and rule == "-" * len(head)
    for method, row in zip(methods, rows):
        assert row.startswith(method + " ")
        assert _column_ends(row) == ends, row


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_demo_table_columns_line_up_for_every_method(temperature):
    rows = [MethodResult(method=m, tokens=[1, 2], elapsed_s=0.5, tokens_per_s=1234.5,
                         tau=3.25, acceptance_rate=0.875, target_calls=12, identical=True,
                         speedup=2.5, gamma=None if m == "vanilla" else g)
            for m, g in zip(METHODS, [None, 3, 7, "adaptive", 5, 7])]
    _check_aligned(format_table(rows, temperature), METHODS)


@needs_bundle
def test_demo_prints_an_aligned_table_and_strict_json(capsys):
    assert main(["demo", "--max-new-tokens", "6", "--drafter", "dflash_tree"]) == 0
    out = capsys.readouterr().out
    table = out[out.rindex("=" * 72) + 73:]
    _check_aligned(table, ["vanilla", "dflash_tree"])

    assert main(["demo", "--max-new-tokens", "6", "--drafter", "ngram_tree", "--json"]) == 0
    report = strict_loads(capsys.readouterr().out)
    vanilla = report["results"][0]
    assert vanilla["method"] == "vanilla" and vanilla["acceptance_rate"] is None


# --- strict JSON from every writer --------------------------------------------------------

def test_json_io_writes_non_finite_figures_as_null(tmp_path):
    data = {"nan": float("nan"), "inf": np.float32(np.inf), "ninf": -np.inf,
            "array": np.array([1.0, np.nan]), "int": np.int64(3), "ok": 0.5, "flag": np.bool_(1)}
    want = {"nan": None, "inf": None, "ninf": None, "array": [1.0, None], "int": 3, "ok": 0.5,
            "flag": True}
    assert strict_loads(json_io.dumps(data)) == want
    path = tmp_path / "x.json"
    with open(path, "w") as f:
        json_io.dump(data, f, indent=1)
    assert strict_loads(path.read_text()) == want
    with pytest.raises(TypeError):
        json_io.dumps({"x": object()})


@needs_bundle
def test_generate_json_is_strict(capsys):
    assert main(["generate", "--prompt", "def f(x):\n", "--max-new-tokens", "4",
                 "--drafter", "none", "--json"]) == 0
    report = strict_loads(capsys.readouterr().out)
    assert report["new_tokens"] == 4 and len(report["tokens"]) == 4


@needs_bundle
def test_eval_results_file_is_strict(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--prompts", "1", "--max-new-tokens", "6", "--temperatures", "0",
                 "--methods", "ngram", "--out", str(out)]) == 0
    report = strict_loads(out.read_text())
    assert [r["acceptance_rate"] for r in report["runs"] if r["method"] == "vanilla"] == [None]


def test_audit_report_is_strict(tmp_path, capsys):
    @audit.register_check("non_finite_figures_for_test", group="jsontest")
    def _figures(ctx):
        return {"passed": True, "ratio": float("nan"), "max_error": np.float64(np.inf)}

    out = tmp_path / "audit.json"
    try:
        assert main(["audit", "--check", "jsontest", "--check", "causal_invariance",
                     "--out", str(out)]) == 0
    finally:
        audit.CHECKS[:] = [c for c in audit.CHECKS if c.name != "non_finite_figures_for_test"]
    report = strict_loads(out.read_text())
    figures = report["checks"]["non_finite_figures_for_test"]
    assert figures["ratio"] is None and figures["max_error"] is None
    assert report["checks"]["causal_invariance"]["passed"]


def test_seed_results_file_is_strict(tmp_path):
    path = seed_report.write_report({"tv": np.float64(np.nan), "z": [np.inf, 1.0]}, tmp_path)
    assert strict_loads(path.read_text()) == {"tv": None, "z": [None, 1.0]}
