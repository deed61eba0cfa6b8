"""The package's shape: imports point down the layers, no cycles, short chains, small modules,
no private names used across modules.

Walks the source of the installed (or checked-out) package: every ``import``/``from ... import``
of a ``.py`` file, wherever it stands (inside functions and ``if TYPE_CHECKING`` blocks too),
and every ``import``/``cimport`` line of a ``.pyx``/``.pxd`` file. Importing ``fastspec.a.b``
also runs ``fastspec/a/__init__.py``, so an import edge reaches every package on the way
(except the importer's own packages, which are always initialised first). The C headers of the
compiled core are checked by ``tests/test_csrc_graph.py`` where the sources are present.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

import fastspec

ROOT = Path(fastspec.__file__).resolve().parent

#: Layer of each top-level package: an import may only reach the same or a lower layer.
LAYERS = {
    "fastspec.version": 0,
    "fastspec.lazy": 0,
    "fastspec.kernels": 0,
    "fastspec.model": 1,
    "fastspec.formats": 2,
    "fastspec.text": 3,
    "fastspec.drafters": 4,
    "fastspec.decoding": 5,
    "fastspec.models": 6,
    "fastspec.tools": 7,
    "fastspec.audit": 8,
    "fastspec.training": 8,
    "fastspec.seeds": 9,
    "fastspec.cli": 10,
    "fastspec": 11,
}
MAX_CHAIN = 10
MAX_LINES = 500


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def _sources() -> dict[str, Path]:
    """Module name -> source file (``.py``, else ``.pyx``; ``.pxd`` under its own name)."""
    out: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*")):
        if path.suffix in (".py", ".pyx", ".pxd") and "__pycache__" not in path.parts:
            name = _module_name(path)
            key = name + ".pxd" if path.suffix == ".pxd" else name
            out.setdefault(key, path)
    return out


@lru_cache(maxsize=None)
def _compiled() -> frozenset[str]:
    """Names of the compiled extension modules (an installed wheel ships no .pyx beside them)."""
    from importlib.machinery import EXTENSION_SUFFIXES

    out = set()
    for path in ROOT.rglob("*"):
        for suffix in EXTENSION_SUFFIXES:
            if path.name.endswith(suffix):
                rel = path.relative_to(ROOT.parent).as_posix()[:-len(suffix)]
                out.add(rel.replace("/", "."))
    return frozenset(out)


def _is_module(name: str) -> bool:
    return name in _sources() or f"{name}.pxd" in _sources() or name in _compiled()


def _is_package(name: str) -> bool:
    return (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()


_CYTHON_IMPORT = re.compile(
    r"^\s*(?:from\s+([\w.]+)\s+c?import\s+(.+?)|c?import\s+([\w.]+)(?:\s+as\s+\w+)?)\s*$")


def _deferred_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes that do not run when the module is imported: under ``if
    TYPE_CHECKING:`` (annotations only) or inside a function (at call time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.update(id(n) for n in ast.walk(node) if n is not node)
    return out


def _raw_imports(path: Path, name: str) -> list[tuple[str, list[str] | None, bool]]:
    """``(module, [imported names], runs)`` for every import statement of the file: names
    None for a plain ``import module``; ``runs`` False where it does not run at import time
    (under ``if TYPE_CHECKING``, inside a function)."""
    text = path.read_text()
    out: list[tuple[str, list[str] | None, bool]] = []
    if path.suffix == ".py":
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(text)
        deferred = _deferred_nodes(tree)
        for node in ast.walk(tree):
            runs = id(node) not in deferred
            if isinstance(node, ast.Import):
                out.extend((a.name, None, runs) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[:len(parts) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                out.append((base, [a.name for a in node.names], runs))
        return out
    for line in text.splitlines():
        m = _CYTHON_IMPORT.match(line.split("#")[0])
        runs = not line[:1].isspace()  # an indented import runs inside a function
        if m and m.group(1):
            names = [n.strip().split(" as ")[0] for n in m.group(2).strip("() \\").split(",")]
            out.append((m.group(1), [n for n in names if n], runs))
        elif m and m.group(3):
            out.append((m.group(3), None, runs))
    return out


@lru_cache(maxsize=None)
def _lazy_exports(package: str) -> dict[str, str]:
    """Name -> submodule of a package whose ``__init__`` uses :func:`fastspec.lazy.exports`."""
    path = _sources().get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "exports"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Dict)):
            return {k.value: v.value for k, v in zip(node.args[1].keys, node.args[1].values)}
    return {}


def _targets(module: str, names: list[str] | None) -> set[str]:
    """The fastspec modules (and packages on the way) that an import statement runs; the root
    package only when its own names are asked for (``import fastspec``, ``from fastspec import
    Transformer``), not for ``from fastspec import kernels``."""
    if module != "fastspec" and not module.startswith("fastspec."):
        return set()
    hits = {module}
    lazy = _lazy_exports(module)
    for n in names or ():
        sub = f"{module}.{n}"
        if sub in _sources() or f"{sub}.pxd" in _sources():
            hits.add(sub)
        elif n in lazy:  # a lazy export (fastspec.lazy): the module that defines it
            hits.add(f"{module}.{lazy[n]}")
    out = set()
    for hit in hits:
        parts = hit.split(".")
        out.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    if module == "fastspec" and (names is None
                                  or any(f"fastspec.{n}" not in hits for n in names)):
        out.add("fastspec")
    return out


@lru_cache(maxsize=None)
def _graph(runtime: bool = False) -> dict[str, set[str]]:
    """Module -> the fastspec modules it imports; with ``runtime``, only the imports that run
    when it is imported (the chain of imports that ``import`` walks)."""
    graph: dict[str, set[str]] = {}
    for key, path in _sources().items():
        name = key.removesuffix(".pxd")
        # its own packages are initialised before it; the root only counts when asked for
        own = {".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)}
        edges = graph.setdefault(name, set())
        for module, names, runs in _raw_imports(path, name):
            if runs or not runtime:
                edges.update(t for t in _targets(module, names) if t != name and t not in own)
    for edges in graph.values():
        edges.intersection_update(graph)
    return graph


def _layer(name: str) -> int:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in LAYERS:
            return LAYERS[".".join(parts[:i])]
    raise AssertionError(f"{name} belongs to no layer: add its package to LAYERS")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    memo: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in memo:
            best: list[str] = []
            for nxt in graph[node]:
                c = chain(nxt)
                if len(c) > len(best):
                    best = c
            memo[node] = [node] + best
        return memo[node]

    return max((chain(n) for n in graph if n != "fastspec"), key=len)


def test_the_walk_sees_the_package():
    graph = _graph()
    assert {"fastspec.kernels", "fastspec.model.transformer", "fastspec.decoding.speculative",
            "fastspec.drafters.dflash", "fastspec.cli"} <= set(graph)
    # known edges: a module-level import, a relative one, one inside a function and a
    # Cython cimport; the one inside a function does not run at import time
    assert "fastspec.model.config" in graph["fastspec.model.transformer"]
    assert "fastspec.text.tokenizer" in graph["fastspec.text.corpus"]
    assert "fastspec.models" in graph["fastspec.cli.generate"]
    assert "fastspec.models" not in _graph(runtime=True)["fastspec.cli.generate"]
    # a lazy export reaches the module that defines it
    assert "fastspec.model.transformer" in _targets("fastspec.model", ["Transformer"])
    if "fastspec.model._model" in graph:  # the sources of the compiled modules (a checkout)
        assert any(t.startswith("fastspec.kernels.") for t in graph["fastspec.model._model"])


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():  # the negative control of the test above
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_imports_point_down_the_layers():
    wrong = sorted(f"{src} -> {dst}" for src, edges in _graph().items() for dst in edges
                   if _layer(dst) > _layer(src))
    assert not wrong, "imports that go up a layer:\n" + "\n".join(wrong)


def test_no_module_imports_the_root_package():
    wrong = sorted(src for src, edges in _graph().items() if "fastspec" in edges)
    assert not wrong, f"modules importing fastspec/__init__: {wrong}"


def test_import_chains_are_short():
    graph = _graph(runtime=True)
    if _cycle(graph):
        pytest.skip("the graph has a cycle (test_no_import_cycles reports it)")
    chain = _longest_chain(graph)
    assert len(chain) <= MAX_CHAIN, f"{len(chain)} modules: " + " -> ".join(chain)


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources().values()
            if p.suffix in (".py", ".pyx") and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def _private_uses(path: Path, name: str) -> list[str]:
    """Private names (one leading underscore) that ``path`` takes from another module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules: dict[str, str] = {}  # local alias -> fastspec module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastspec"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = _is_module(sub)
                private = a.name.startswith("_") and not a.name.startswith("__")
                # a private module may be imported by its own package only
                if private and not (is_module and node.module == package):
                    out.append(f"from {node.module} import {a.name}")
                if is_module:
                    modules[a.asname or a.name] = sub
            if any(p.startswith("_") and not p.startswith("__")
                   for p in node.module.split(".")) and node.module.rpartition(".")[0] != package:
                out.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fastspec"):
                    modules[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            out.append(f"{node.value.id}.{node.attr}")
    return out


def test_no_private_names_across_modules():
    wrong = {}
    for key, path in _sources().items():
        if path.suffix == ".py":
            uses = _private_uses(path, key)
            if uses:
                wrong[key] = sorted(set(uses))
    assert not wrong, wrong


@pytest.mark.parametrize("package", sorted(k for k in LAYERS if _is_package(k)))
def test_every_package_says_what_it_holds(package):
    doc = ast.get_docstring(ast.parse((ROOT.parent / package.replace(".", "/")
                                       / "__init__.py").read_text()))
    assert doc and len(doc) > 40, f"{package}/__init__.py needs a docstring"
