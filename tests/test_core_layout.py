"""The C core's layout as docs/design.md describes it: the files include
one another in one direction only (no include cycle, between headers or
between a file and the headers of the files that include it back), every
C file is built, and cffi sees one header."""
from __future__ import annotations

import os
import re

from _builder import ROOT, load_builder

CORE = os.path.join(ROOT, "socknotify_loop", "_core")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def local_includes(folder: str = CORE) -> dict[str, set[str]]:
    """File name -> the core files it #includes with quotes."""
    graph = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith((".c", ".h")):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                graph[name] = set(_INCLUDE.findall(f.read()))
    return graph


def module_graph(includes: dict[str, set[str]]) -> dict[str, set[str]]:
    """Include edges between modules (sn_x.c with its sn_x.h is one
    module): a .c file that includes a header of a module which includes
    the .c file's own header back is a cycle too, the kind a header-only
    check misses (two files touching each other's structs)."""
    def module(name: str) -> str:
        return os.path.splitext(name)[0]

    graph: dict[str, set[str]] = {}
    for name, targets in includes.items():
        edges = graph.setdefault(module(name), set())
        edges.update(module(t) for t in targets if module(t) != module(name))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    # The port owns its sockets (p -> s); a socket file that includes the
    # port's header back (s -> p) closes a cycle no header-only check
    # sees: the shape the AFD port and socket files once had.
    includes = {"s.h": set(), "s.c": {"s.h"}, "p.h": {"s.h"}, "p.c": {"p.h"}}
    assert find_cycle(module_graph(includes)) is None
    includes["s.c"] = {"s.h", "p.h"}
    assert find_cycle(module_graph(includes)) == ["p", "s", "p"]


def test_no_include_cycle_in_the_core():
    includes = local_includes()
    assert includes, CORE
    missing = {(name, t) for name, targets in includes.items() for t in targets
               if t not in includes}
    assert not missing, f"includes of files that are not in the core: {sorted(missing)}"
    cycle = find_cycle(module_graph(includes))
    assert cycle is None, "include cycle: " + " -> ".join(cycle or ())


def test_every_core_file_is_built():
    sources = load_builder().SOURCES
    on_disk = sorted(n for n in os.listdir(CORE) if n.endswith(".c"))
    assert sorted(sources) == on_disk
    assert len(set(sources)) == len(sources)


def test_cffi_sees_one_header_and_it_includes_no_internal_one():
    builder = load_builder()
    assert os.path.basename(builder.HEADER) == "socknotify.h"
    assert local_includes()["socknotify.h"] == set()
