"""Chat requests for real-model evaluation, built at run time from the Python standard library.

Two suites:

- ``grounded``: the answer restates text the request contains (add type hints, rename a
  variable, remove comments, reformat a list as JSON, change tense, fix a bug). Prompt-lookup
  drafting shines here, as in the everyday editing requests people give a chat model.
- ``open``: the answer is new text (explain, write, list). Acceptance is lower; these keep
  the figures honest.

The source texts are functions and docstrings of standard-library modules, picked
deterministically (the same interpreter gives the same requests), so no data file ships.
"""
from __future__ import annotations

import ast
import inspect
import json
import re
from dataclasses import dataclass
from importlib import import_module

__all__ = ["Request", "SUITES", "suite", "grounded_requests", "open_requests"]

#: Standard-library modules the grounded requests quote (small, stable, pure Python).
_SOURCES = ("textwrap", "shlex", "fnmatch", "colorsys", "calendar", "bisect", "heapq",
            "string", "glob", "posixpath", "genericpath", "netrc")
#: Longest quoted function, in lines: the request and its answer fit a small model's context.
_MAX_LINES = 24


@dataclass(frozen=True)
class Request:
    """One chat request.

    Attributes
    ----------
    kind : str
        What it asks (``"type_hints"``, ``"rename"``, ..., ``"open"``).
    message : str
        The user message.
    source : str
        Where its text comes from (``module.function``), or ``""``.
    """

    kind: str
    message: str
    source: str = ""


def _functions() -> list[tuple[str, str, ast.FunctionDef]]:
    """``(qualified name, source text, node)`` of the short top-level functions of
    :data:`_SOURCES`, in a fixed order."""
    out = []
    for name in _SOURCES:
        try:
            module = import_module(name)
            text = inspect.getsource(module)
        except (ImportError, OSError, TypeError):  # a stripped or frozen standard library
            continue
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if (isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
                    and node.end_lineno - node.lineno + 1 <= _MAX_LINES
                    and not node.decorator_list):
                src = "\n".join(lines[node.lineno - 1:node.end_lineno])
                out.append((f"{name}.{node.name}", src, node))
    return out


def _unannotated(node: ast.FunctionDef) -> bool:
    args = node.args.args + node.args.kwonlyargs
    return node.returns is None and all(a.annotation is None for a in args)


def _local_names(node: ast.FunctionDef) -> list[str]:
    """Names assigned in the function body (candidates to rename), in order."""
    seen: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub.id not in seen:
            seen.append(sub.id)
    return [n for n in seen if len(n) > 1]


def _without_docstring(src: str, node: ast.FunctionDef) -> str:
    """``src`` with its docstring removed (the edits below are about code)."""
    doc = ast.get_docstring(node, clean=False)
    if doc is None:
        return src
    body = node.body[0]
    lines = src.splitlines()
    first = body.lineno - node.lineno
    last = body.end_lineno - node.lineno
    return "\n".join(lines[:first] + lines[last + 1:])


def _paragraphs(funcs: list[tuple[str, str, ast.FunctionDef]]) -> list[tuple[str, str]]:
    """``(source, first paragraph)`` of the module and function docstrings that read as prose:
    two sentences or more, ending with a full stop."""
    docs = []
    for name in _SOURCES:
        try:
            docs.append((name, import_module(name).__doc__ or ""))
        except ImportError:
            continue
    docs += [(q, ast.get_docstring(node) or "") for q, _, node in funcs]
    out = []
    for source, doc in docs:
        para = " ".join(doc.strip().split("\n\n")[0].split())
        if para.count(". ") >= 1 and para.endswith(".") and 80 < len(para) < 600:
            out.append((source, para))
    return out


def _buggy(src: str) -> str | None:
    """``src`` with one plausible bug (a flipped comparison), or None when it has none."""
    for good, bad in ((" < ", " <= "), (" > ", " >= "), (" == ", " != "), (" + 1", " - 1")):
        if good in src:
            return src.replace(good, bad, 1)
    return None


def grounded_requests(per_kind: int = 2) -> list[Request]:
    """Return the ``grounded`` suite: ``per_kind`` requests of each of six kinds (12 by default).

    Parameters
    ----------
    per_kind : int, default 2

    Returns
    -------
    list of Request
        In a fixed order: kinds interleaved, so a prefix of the list covers every kind.
    """
    funcs = _functions()
    code = [(q, _without_docstring(s, n), n) for q, s, n in funcs]
    kinds: dict[str, list[Request]] = {k: [] for k in
                                       ("type_hints", "rename", "remove_comments", "json",
                                        "tense", "fix_bug")}
    for q, src, node in code:
        if _unannotated(node) and len(kinds["type_hints"]) < per_kind:
            kinds["type_hints"].append(Request("type_hints", "Add type hints to this Python "
                                               f"function. Reply with the whole function.\n\n"
                                               f"```python\n{src}\n```", q))
        names = _local_names(node)
        if names and len(kinds["rename"]) < per_kind:
            old = names[0]
            kinds["rename"].append(Request("rename", f"Rename the variable `{old}` to "
                                           f"`{old}_value` in this function. Reply with the "
                                           f"whole function.\n\n```python\n{src}\n```", q))
        if "#" in src and len(kinds["remove_comments"]) < per_kind:
            kinds["remove_comments"].append(Request(
                "remove_comments", "Remove every comment from this code and change nothing "
                f"else.\n\n```python\n{src}\n```", q))
        bug = _buggy(src)
        if bug is not None and len(kinds["fix_bug"]) < per_kind:
            kinds["fix_bug"].append(Request("fix_bug", "This function has a bug in one "
                                            "comparison. Fix it and reply with the whole "
                                            f"function.\n\n```python\n{bug}\n```", q))
    words = sorted({w for _, s, _ in code for w in re.findall(r"\b[a-z]{5,12}\b", s)})
    for i in range(per_kind):
        items = words[i * 7::len(words) // 7 + 1][:7] if words else ["alpha", "beta", "gamma"]
        text = "\n".join(f"- {w}" for w in items)
        kinds["json"].append(Request("json", "Reformat this list as a JSON array of strings. "
                                     f"Reply with the JSON only.\n\n{text}",
                                     json.dumps(items)))
    for module, para in _paragraphs(funcs)[:per_kind]:
        kinds["tense"].append(Request("tense", "Rewrite this paragraph in the past tense. "
                                      f"Change nothing else.\n\n{para}", module))
    out = []
    for i in range(per_kind):
        out.extend(reqs[i] for reqs in kinds.values() if i < len(reqs))
    return out


def open_requests() -> list[Request]:
    """Return the ``open`` suite: four requests whose answers the prompt does not contain."""
    return [Request("open", m) for m in (
        "Explain in a short paragraph what a hash table is and why lookups are fast.",
        "Write a short poem about the sea at night.",
        "Give three tips for someone learning to program in Python.",
        "Describe how a bicycle works to a ten-year-old.",
    )]


#: Suite name -> its builder.
SUITES = {"grounded": grounded_requests, "open": open_requests}


def suite(name: str) -> list[Request]:
    """Return the requests of suite ``name`` (``"grounded"`` or ``"open"``).

    Raises
    ------
    ValueError
        An unknown name.
    """
    if name not in SUITES:
        raise ValueError(f"suite must be one of {sorted(SUITES)}, got {name!r}")
    return SUITES[name]()
