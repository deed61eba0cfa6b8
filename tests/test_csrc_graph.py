"""The C core's include graph (csrc/README.md): no cycles, headers that only declare.

Parses every ``#include "..."`` of csrc/ (headers, sources and .inc template bodies); a cycle
means a header needs another that needs it back, the tangle the core was cut out of. Needs the
source tree (FASTSPEC_SOURCE_ROOT, or this checkout); skipped without one.
"""
import re
from pathlib import Path

import pytest

from _helpers import SOURCE_ROOT

CSRC = SOURCE_ROOT / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)

pytestmark = pytest.mark.skipif(not CSRC.is_dir(), reason="no source tree")


def _graph():
    files = {p.name: p for p in CSRC.iterdir() if p.suffix in (".h", ".c", ".inc")}
    return {name: INCLUDE.findall(p.read_text()) for name, p in files.items()}


def _cycle(graph):
    """Return one include cycle as a list of file names, or None."""
    state = {}  # name -> 1 on the current path, 2 done

    def visit(name, path):
        state[name] = 1
        for dep in graph.get(name, ()):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return None


def test_includes_name_files_of_csrc():
    graph = _graph()
    missing = {f"{src} -> {dep}" for src, deps in graph.items() for dep in deps if dep not in graph}
    assert not missing


def test_include_graph_has_no_cycle():
    assert _cycle(_graph()) is None


def test_cycle_detector_finds_one():
    # the negative control: the old fs_attention.h <-> fs_attention_f32.h tangle
    assert _cycle({"a.h": ["b.h"], "b.h": ["c.h", "a.h"], "c.h": []}) == ["a.h", "b.h", "a.h"]


def test_template_bodies_are_included_by_sources_only():
    graph = _graph()
    wrong = {f"{src} -> {dep}" for src, deps in graph.items() for dep in deps
             if dep.endswith(".inc") and not src.endswith(".c")}
    assert not wrong


def test_headers_only_declare():
    # a function body in a header is "static inline" (fs_common.h's tiny helpers) or nothing
    body = re.compile(r"^(?!static inline|FS_ALWAYS_INLINE|#|\s|/\*|\*|typedef|\}).*\)\s*\n?\{",
                      re.MULTILINE)
    offenders = {p.name for p in CSRC.glob("*.h") if body.search(p.read_text())}
    assert not offenders
    inline = {p.name for p in CSRC.glob("*.h") if p.name != "fs_common.h"
              and re.search(r"^(static inline|FS_ALWAYS_INLINE)", p.read_text(), re.MULTILINE)}
    assert not inline
