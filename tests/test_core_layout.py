"""The package's layout as docs/design.md describes it.

The C core: the files include one another in one direction only (no
include cycle, between headers or between a file and the headers of the
files that include it back), every C file is built, and cffi sees one
header. The Python modules: imports run downward only, through the public
names of the module below, and port.py is the only module that reaches the
compiled core.
"""
from __future__ import annotations

import ast
import os
import re

from _builder import ROOT, load_builder

PACKAGE = os.path.join(ROOT, "socknotify_loop")
CORE = os.path.join(PACKAGE, "_core")

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


def test_test_only_entry_points_are_out_of_the_production_header():
    """The strict model's backend number, its controls and every other
    test-only entry point are declared in socknotify.h under SN_TESTING,
    between the CDEF-TESTING markers, which a production build's cdef
    leaves out; the strict model's file compiles to nothing without it."""
    builder = load_builder()
    production = builder.read_cdef()
    testing = builder.read_cdef(builder.TESTING_MARKERS)
    for name in ("sn_model_control", "SN_MODEL_", "SN_BACKEND_STRICT"):
        assert name not in production and name in testing
    with open(os.path.join(CORE, "socknotify.h"), encoding="utf-8") as f:
        header = f.read()
    guarded = header[header.index("#ifdef SN_TESTING"):]
    assert "/* CDEF-TESTING-BEGIN */" in guarded and "/* CDEF-TESTING-END */" in guarded
    with open(os.path.join(CORE, "sn_model.c"), encoding="utf-8") as f:
        model = f.read()
    code = model[model.index("*/") + 2:]   # after the essay
    assert code.lstrip().startswith("#if defined(_WIN32) && defined(SN_TESTING)")


# -- the Python modules: imports run downward only ---------------------------------

#: docs/design.md's layers, top first: a module imports only modules of a
#: lower layer, so none below the package imports the package itself
#: (``from . import __version__`` in the launcher would), and none imports
#: one beside it. ``_socknotify`` is the compiled core.
LAYERS = (
    ("__main__",),                  # python -m socknotify_loop
    ("__init__", "launcher"),       # the public API; the command line
    ("_factory", "probe"),          # which Loop class; the OS probe
    ("_windows_io",),               # WindowsLoop(Loop)
    ("loop",),
    ("transports",),
    ("selector",),
    ("port",),
    ("_backends", "_core_import", "_version", "_build"),
    ("_socknotify",),
)
#: Modules only one module may import: the compiled core is loaded by
#: _core_import for port.py, "the only module that touches the C module".
ONLY_IMPORTER = {"_socknotify": "_core_import", "_core_import": "port"}
PACKAGE_NAME = "socknotify_loop"


def _defined_names(tree: ast.Module) -> set[str]:
    """What a module offers: the names it defines at module level (also
    under if/try/with) and those its ``__all__`` lists (re-exports)."""
    names: set[str] = set()

    def visit(body: list) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple))
                        and any(isinstance(t, ast.Name) and t.id == "__all__"
                                for t in node.targets)):
                    names.update(e.value for e in node.value.elts
                                 if isinstance(e, ast.Constant) and isinstance(e.value, str))
            for field in ("body", "orelse", "finalbody", "handlers"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(node, field, []))

    visit(tree.body)
    return names


def _imports(tree: ast.Module, modules: set[str]) -> list[tuple[int, str, str | None]]:
    """``(line, imported module, name or None)`` for each import of the
    package or one of its modules, anywhere in the module (lazy imports
    inside functions too). ``from . import x`` imports module x if the
    package has one, else the name x of the package itself."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE_NAME:
                    found.append((node.lineno, parts[1] if len(parts) > 1 else "__init__", None))
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                found.append((node.lineno, "..", None))
                continue
            if node.level == 1:
                parts = node.module.split(".") if node.module else []
            elif node.module and node.module.split(".")[0] == PACKAGE_NAME:
                parts = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                if parts:
                    found.append((node.lineno, parts[0], alias.name))
                elif alias.name in modules:
                    found.append((node.lineno, alias.name, None))
                else:
                    found.append((node.lineno, "__init__", alias.name))
    return found


def layering_violations(sources: dict[str, str]) -> list[str]:
    """What breaks docs/design.md's layering in ``sources`` (module name ->
    its text): an import of a module not below the importer, of a module
    another module owns (ONLY_IMPORTER), of a private name, or of a name
    the module below neither defines nor exports."""
    rank = {name: depth for depth, layer in enumerate(LAYERS) for name in layer}
    trees = {name: ast.parse(text, name) for name, text in sources.items()}
    offered = {name: _defined_names(tree) for name, tree in trees.items()}
    problems = []
    for importer, tree in sorted(trees.items()):
        for line, target, name in _imports(tree, set(rank)):
            where = f"{importer}.py:{line}"
            what = f"{target}" + (f".{name}" if name else "")
            if target not in rank or importer not in rank:
                problems.append(f"{where}: {what}: a module docs/design.md does not place")
            elif rank[target] <= rank[importer]:
                kind = "the package itself" if target == "__init__" else "a module not below it"
                problems.append(f"{where}: imports {what}, {kind}")
            elif ONLY_IMPORTER.get(target, importer) != importer:
                problems.append(f"{where}: imports {target}, which only "
                                f"{ONLY_IMPORTER[target]} may import")
            if name is None or target not in offered:
                continue
            if name.startswith("_") and not name.startswith("__"):
                problems.append(f"{where}: imports {what}, a private name")
            elif name != "*" and name not in offered[target]:
                problems.append(f"{where}: imports {what}, which {target} neither "
                                f"defines nor exports in __all__")
    return problems


def package_sources() -> dict[str, str]:
    sources = {}
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
                sources[name[:-3]] = f.read()
    return sources


def test_the_layering_check_finds_what_breaks_it():
    defined = {"__init__": "from ._version import __version__\n__all__ = ['__version__']\n",
               "_version": "__version__ = '1'\n",
               "_core_import": "from ._socknotify import ffi, lib\n__all__ = ['ffi', 'lib']\n",
               "port": "from ._core_import import ffi, lib\n_BACKENDS = {}\n"
                       "def fileno_of(sock): ...\n__all__ = ['fileno_of']\n",
               "selector": "from .port import fileno_of\nclass NotifySelector: ...\n"}
    assert layering_violations(defined) == []
    for module, text, expected in [
        ("launcher", "def f():\n    from . import __version__\n",
         "launcher.py:2: imports __init__.__version__, the package itself"),
        ("loop", "import socknotify_loop\n", "loop.py:1: imports __init__, the package itself"),
        ("port", "from .selector import NotifySelector\n",
         "port.py:1: imports selector.NotifySelector, a module not below it"),
        ("probe", "from ._core_import import lib\n",
         "probe.py:1: imports _core_import, which only port may import"),
        ("probe", "from .port import _BACKENDS\n",
         "probe.py:1: imports port._BACKENDS, a private name"),
        ("probe", "from .port import ffi\n",
         "probe.py:1: imports port.ffi, which port neither defines nor exports in __all__"),
        ("selector", "from .port import _fileno\n",
         "selector.py:1: imports port._fileno, a private name"),
    ]:
        changed = {**defined, module: text + defined.get(module, "")}
        assert layering_violations(changed) == [expected], module


def test_python_modules_import_downward_only():
    sources = package_sources()
    on_disk = set(sources) | {"_socknotify"}
    placed = {name for layer in LAYERS for name in layer}
    assert on_disk == placed, ("modules docs/design.md's layers (LAYERS) do not place, "
                               f"or that are gone: {sorted(on_disk ^ placed)}")
    assert layering_violations(sources) == []
