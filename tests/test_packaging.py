"""How the package is found and described: the installed copy under test,
one version, and a clear error when a source tree's C core is not built."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import socknotify_loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.dirname(os.path.abspath(socknotify_loop.__file__))
TIMEOUT = 60


def test_installed_package_under_test():
    """tox and the Wine runs set SOCKNOTIFY_EXPECT_INSTALLED: their tests
    must exercise the installed wheel, never the source folder."""
    if not os.environ.get("SOCKNOTIFY_EXPECT_INSTALLED"):
        pytest.skip("SOCKNOTIFY_EXPECT_INSTALLED is not set (a developer run)")
    source = os.path.join(ROOT, "socknotify_loop")
    assert os.path.normcase(PACKAGE_DIR) != os.path.normcase(source), (
        f"the tests imported the source tree {source}, not the installed package")


def test_version_is_the_distribution_version():
    from importlib.metadata import version
    assert socknotify_loop.__version__ == version("socknotify_loop")


def import_copy_without_core(tmp_path, source_tree: bool) -> subprocess.CompletedProcess:
    """Import a copy of the package that lacks the compiled module, from
    its parent folder (what `python -m` does in a fresh checkout)."""
    copy = tmp_path / "socknotify_loop"
    # copyfile, not copytree's default copy2: on Windows 3.12+ copy2 calls
    # CopyFile2, which Wine 8 lacks (the process aborts).
    shutil.copytree(PACKAGE_DIR, str(copy), copy_function=shutil.copyfile,
                    ignore=shutil.ignore_patterns("_socknotify*", "__pycache__"))
    if source_tree:
        (tmp_path / "pyproject.toml").write_text("")
    # -S: no site-packages, so neither an installed copy nor the finder of
    # an editable install can supply the missing module.
    return subprocess.run([sys.executable, "-S", "-E", "-c", "import socknotify_loop"],
                          cwd=str(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT)


def test_unbuilt_source_tree_says_how_to_build(tmp_path):
    proc = import_copy_without_core(tmp_path, source_tree=True)
    assert proc.returncode != 0, proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ImportError: socknotify_loop's C core is not built in "), proc.stdout
    assert str(tmp_path / "socknotify_loop") in last
    assert "`pip install -e .`" in last
    assert "ModuleNotFoundError" not in proc.stdout


def test_incomplete_install_says_reinstall(tmp_path):
    proc = import_copy_without_core(tmp_path, source_tree=False)
    assert proc.returncode != 0, proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ImportError: socknotify_loop's C core (_socknotify) is missing"), \
        proc.stdout
    # The package is not on PyPI: the hint reinstalls from a file or a folder.
    assert "pip install --force-reinstall --no-deps <wheel file or checkout folder>" in last


def test_api_reference_covers_the_public_names():
    """docs/api.md is rendered by Sphinx's autodoc (the lint env builds the
    site with warnings as errors); this checks it names every public name,
    so a new one cannot be left out of the reference."""
    page = os.path.join(ROOT, "docs", "api.md")
    if not os.path.exists(page):
        pytest.skip("docs/ is not shipped here")
    with open(page, encoding="utf-8") as f:
        text = f.read()
    documented = set()
    for line in text.splitlines():
        parts = line.split("::", 1)
        if line.startswith(".. auto") and len(parts) == 2:
            documented.add(parts[1].strip().rsplit(".", 1)[-1])
    missing = [name for name in socknotify_loop.__all__
               if name not in documented and name != "__version__"]
    assert not missing, f"docs/api.md has no autodoc entry for {missing}"
    assert "socknotify_loop.__version__" in text
    for name in ("EventLoopPolicy", "install", "main", "use_socknotify_loop"):
        assert name in documented, name


def _source_copy(tmp_path) -> str:
    """The files a build from source needs, copied without any compiled
    core; skips where no setup.py is beside the tests."""
    if not os.path.exists(os.path.join(ROOT, "setup.py")):
        pytest.skip("no setup.py beside the tests")
    source = tmp_path / "source"
    os.makedirs(source)
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copyfile(os.path.join(ROOT, name), str(source / name))
    shutil.copytree(os.path.join(ROOT, "socknotify_loop"), str(source / "socknotify_loop"),
                    ignore=shutil.ignore_patterns("_socknotify*", "__pycache__", "*.so",
                                                  "*.pyd"))
    return str(source)


def _pip_wheel(source: str, out: str, timeout: float = 220,
               **env: str) -> subprocess.CompletedProcess:
    """`pip wheel` of ``source`` (an in-tree build: its build/ folder is
    kept between builds), with ``env`` added to the environment."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", **env)
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, source],
                          capture_output=True, text=True, env=env, timeout=timeout)


build_once = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11) or not sys.platform.startswith("linux"),
    reason="one Python is enough: the build is the same on every one")


@build_once
@pytest.mark.timeout(240)
def test_missing_compiler_is_one_paragraph_naming_the_build_tools(tmp_path):
    """pip building from source without a working C compiler (CC names
    none) ends in setup.py's paragraph naming the Build Tools and wheels."""
    source = _source_copy(tmp_path)
    result = _pip_wheel(source, str(tmp_path / "out"), CC="socknotify-no-such-compiler")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "its C core could not be compiled" in output, output
    assert "Build Tools for Visual" in output and "win_amd64.whl" in output, output
    assert "socknotify-no-such-compiler" in output, output
    assert not os.path.exists(str(tmp_path / "out")) or not os.listdir(str(tmp_path / "out"))


@build_once
@pytest.mark.timeout(300)
def test_rebuild_in_the_same_tree_uses_the_compiler_asked_for(tmp_path):
    """A second `pip install .` / `pip wheel .` in a tree an earlier build
    left build/ in compiles again with the CC it is given (setuptools would
    skip the core as up to date and ship the first build's), and leaves no
    object folder behind."""
    source = _source_copy(tmp_path)
    first = _pip_wheel(source, str(tmp_path / "first"), timeout=140)
    assert first.returncode == 0, first.stdout + first.stderr
    build = os.path.join(source, "build")
    assert os.path.isdir(build), "the build was not in the tree: nothing to test"
    second = _pip_wheel(source, str(tmp_path / "second"), timeout=140,
                        CC="socknotify-no-such-compiler")
    output = second.stdout + second.stderr
    assert second.returncode != 0, "the rebuild did not run the compiler CC names:\n" + output
    assert "socknotify-no-such-compiler" in output, output
    leftovers = [os.path.relpath(os.path.join(folder, name), build)
                 for folder, _, names in os.walk(build)
                 for name in names if name.endswith((".o", ".obj"))]
    assert not leftovers, f"{len(leftovers)} object files left in build/, {leftovers[:2]}..."


# The README's figures table row -> the row of docs/benchmarks.md's Linux
# table it is taken from.
README_FIGURE_ROWS = {
    "ping-pong, streams": "ping-pong, streams (100 B)",
    "ping-pong, raw Protocol": "ping-pong, raw Protocol (100 B)",
    "50 connections": "50 connections, streams ping-pong",
    "1 MiB messages": "1 MiB messages echoed",
    "connection churn": "connection churn (connect, exchange, close)",
    "1 active + 10,000 idle connections": "1 active connection + 10000 idle",
}


def _table(lines: list, header_start: str) -> list:
    """The rows (cells without the edges) of the Markdown table whose header
    line starts with ``header_start``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|")))))
    return rows


def _number(cell: str) -> float:
    """'41.5k (40.9k-42.6k)', '1,942 MiB/s', '**0.94x** (...)' -> the first figure."""
    import re
    text = re.match(r"[*\s]*([\d.,]+)(k?)", cell)
    assert text, cell
    return float(text.group(1).replace(",", "")) * (1000 if text.group(2) else 1)


def test_readme_figures_are_the_benchmark_pages():
    """Every figure of the README's decision table is the one
    docs/benchmarks.md shows (asyncio, uvloop and our medians, our ratio to
    asyncio, and uvloop's to ours from the peers' table): re-running the
    benchmarks without updating the README fails here."""
    readme, page = os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "benchmarks.md")
    if not os.path.exists(page):
        pytest.skip("docs/ is not shipped here")
    with open(readme, encoding="utf-8") as f:
        ours = {row["case"]: row for row in _table(f.read().splitlines(), "| case | asyncio |")}
    with open(page, encoding="utf-8") as f:
        text = f.read()
    # Our page names the Linux section first; its table starts "| case | unit |".
    linux = text.split("\n## Linux\n", 1)[1].splitlines()
    measured = {row["case"]: row for row in _table(linux, "| case | unit |")}
    versus = {row["case"]: row for row in _table(linux, "| case | uvloop / ours (epoll) |")}
    assert set(ours) == set(README_FIGURE_ROWS), sorted(ours)
    for case, source in README_FIGURE_ROWS.items():
        mine, theirs = ours[case], measured[source]
        assert _number(mine["asyncio"]) == _number(theirs["asyncio"]), case
        assert _number(mine["uvloop"]) == _number(theirs["uvloop"]), case
        assert _number(mine["this loop"]) == _number(theirs["ours (epoll)"]), case
        assert _number(mine["this / asyncio"]) == _number(theirs["ours (epoll) / asyncio"]), case
        assert (_number(mine["uvloop / this"])
                == _number(versus[source]["uvloop / ours (epoll)"])), case


# The extras a full run installs, in the order the requirement files list them.
FULL_RUN_EXTRAS = ("test", "integrations")


def _requirement_sections(path: str) -> dict:
    """A requirement file's lines by section: those before any section
    header under "runtime", then each under the header above it, a comment
    line naming an extra (``# test``, ``# integrations``)."""
    sections: dict = {"runtime": []}
    current = "runtime"
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if line.startswith("#") and line[1:].strip() in FULL_RUN_EXTRAS:
                current = line[1:].strip()
                sections.setdefault(current, [])
                continue
            line = line.split("#", 1)[0].strip()
            if line:
                sections[current].append(line)
    return sections


def _project_requirements() -> dict:
    """pyproject.toml's runtime dependencies ("runtime") and its extras."""
    path = os.path.join(ROOT, "pyproject.toml")
    if not os.path.exists(path):
        pytest.skip("no pyproject.toml beside the tests")
    try:
        import tomllib
    except ImportError:     # Python < 3.11: pytest itself depends on tomli there
        tomllib = pytest.importorskip("tomli")
    with open(path, "rb") as f:
        project = tomllib.load(f)["project"]
    return {"runtime": project["dependencies"], **project["optional-dependencies"]}


def test_requirement_files_match_the_extras():
    """The extras are the one list: `test` for the quick run, `integrations`
    for the libraries the integration and recipe tests exercise. The
    requirement files (for installs that do not go through pyproject.toml:
    tools/check_dist.py, tools/wine) are for full runs: they hold the
    runtime dependencies and both extras, each under a header naming it
    (``# test``, ``# integrations``), the Windows one as they apply to
    Windows CPython."""
    from packaging.requirements import Requirement

    project = _project_requirements()
    assert set(project) == {"runtime", *FULL_RUN_EXTRAS}, \
        "a new extra: decide whether full runs (the requirement files) install it"
    wanted = {name: [Requirement(r) for r in project[name]]
              for name in ("runtime", *FULL_RUN_EXTRAS)}
    both = {r.name for r in wanted["test"]} & {r.name for r in wanted["integrations"]}
    assert not both, f"in both the test and the integrations extra: {sorted(both)}"

    def normal(requirements):
        return sorted(str(r) for r in requirements)

    windows_cpython = {"implementation_name": "cpython", "sys_platform": "win32",
                       "os_name": "nt", "platform_system": "Windows"}

    def on_windows(requirements):
        applying = []
        for requirement in requirements:
            if requirement.marker is None or requirement.marker.evaluate(windows_cpython):
                requirement = Requirement(str(requirement))
                requirement.marker = None
                applying.append(requirement)
        return applying

    for name, select in (("requirements.txt", list), ("requirements-windows.txt", on_windows)):
        found = _requirement_sections(os.path.join(ROOT, "tests", name))
        assert list(found) == ["runtime", *FULL_RUN_EXTRAS], \
            f"tests/{name}: sections {list(found)}, not runtime, then {FULL_RUN_EXTRAS}"
        for section, lines in found.items():
            expected = select(wanted[section])
            assert normal(Requirement(line) for line in lines) == normal(expected), \
                f"tests/{name}'s {section} section differs from pyproject.toml's"


def test_tests_readme_names_every_test_file():
    """tests/README.md's table says where each kind of test goes: every
    test file (tests/test_*.py, tests/c/test_*.c, the conformance modules)
    is named there, by its path under tests/ or by a pattern such as
    `conformance/test_cpython_*.py`, so a new test module cannot go
    unlisted."""
    import fnmatch
    import glob
    import re

    tests = os.path.join(ROOT, "tests")
    readme = os.path.join(tests, "README.md")
    if not os.path.exists(readme):
        pytest.skip("tests/README.md is not shipped here")
    with open(readme, encoding="utf-8") as f:
        named = set(re.findall(r"`([^`\s]+)`", f.read()))
    files = sorted(os.path.relpath(path, tests).replace(os.sep, "/")
                   for pattern in ("test_*.py", "c/test_*.c", "conformance/test_*.py")
                   for path in glob.glob(os.path.join(tests, pattern)))
    assert files
    unnamed = [path for path in files
               if not any(fnmatch.fnmatchcase(path, name) for name in named)]
    assert not unnamed, f"tests/README.md does not name {unnamed}"


def _only_includes(path: str) -> bool:
    """Whether a Markdown page is an ``{include}`` with nothing but MyST
    directives beside it (a repository browser shows the directives)."""
    import re

    with open(path, encoding="utf-8") as f:
        text = f.read()
    rest = re.sub(r"```\{[a-z]+\}.*?```", "", text, flags=re.S)
    return "```{include}" in text and not rest.strip()


def test_links_reach_a_readable_file():
    """Every relative link of the README, the changelog and docs/*.md names
    an existing file, and none a page made of an ``{include}`` directive
    alone (docs/index.md, docs/changelog.md): in a repository browser such
    a page shows the directive, so links name the included file, and the
    docs site maps them back (docs/conf.py)."""
    import glob
    import re

    docs = os.path.join(ROOT, "docs")
    if not os.path.isdir(docs):
        pytest.skip("docs/ is not shipped here")
    pages = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md"),
             *sorted(glob.glob(os.path.join(docs, "*.md")))]
    include_only = {os.path.normpath(p) for p in pages if _only_includes(p)}
    assert {os.path.normpath(os.path.join(docs, name))
            for name in ("index.md", "changelog.md")} <= include_only
    wrong = []
    for page in pages:
        if os.path.normpath(page) in include_only:
            continue
        with open(page, encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page),
                                                 target.split("#", 1)[0]))
            if not os.path.exists(path) or path in include_only:
                wrong.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert not wrong, wrong
