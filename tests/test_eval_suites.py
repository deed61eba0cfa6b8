"""The real-model evaluation suites: grounded requests quote their text, built at run time."""
import json

import pytest

from fastspec.tools.eval_suites import grounded_requests, open_requests, suite

KINDS = {"type_hints", "rename", "remove_comments", "json", "tense", "fix_bug"}


def test_grounded_suite_has_twelve_requests_of_six_kinds():
    reqs = suite("grounded")
    assert len(reqs) >= 12
    assert {r.kind for r in reqs} == KINDS
    assert reqs == grounded_requests()  # the same requests every time


def test_grounded_requests_contain_what_the_answer_restates():
    for r in suite("grounded"):
        if r.kind == "json":
            items = json.loads(r.source)
            assert all(f"- {w}" in r.message for w in items)
        elif r.kind == "tense":
            assert len(r.message.split("\n\n", 1)[1]) > 80
        else:
            assert "```python\ndef " in r.message, r
        if r.kind == "fix_bug":  # the quoted function differs from the library's
            import inspect, importlib
            module, name = r.source.rsplit(".", 1)
            original = inspect.getsource(getattr(importlib.import_module(module), name))
            quoted = r.message.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
            assert quoted not in original


def test_open_suite_and_unknown_suite():
    assert len(open_requests()) >= 4 and all(r.kind == "open" for r in suite("open"))
    with pytest.raises(ValueError, match="grounded"):
        suite("closed")
