"""tools/wine's checks before it starts: the Python packages its Linux side
imports (cffi, build), installed into a virtual environment or asked for
anywhere else, before any command has done work.

The Wine runs themselves are tox's wine311 and wine313 environments.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "tools", "wine")
NAME = "socknotify_wine_tool_under_test"


@pytest.fixture(scope="module")
def host():
    if not os.path.isdir(FOLDER):
        pytest.skip("tools/ is not shipped here")
    spec = importlib.util.spec_from_file_location(
        NAME, os.path.join(FOLDER, "__init__.py"), submodule_search_locations=[FOLDER])
    package = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = package
    try:
        spec.loader.exec_module(package)
        yield importlib.import_module(f"{NAME}.host")
    finally:
        for name in [n for n in sys.modules if n == NAME or n.startswith(NAME + ".")]:
            del sys.modules[name]


def versions(**known):
    def installed(name):
        if name not in known:
            raise importlib.metadata.PackageNotFoundError(name)
        return known[name]
    return installed


def test_nothing_missing(host):
    assert host.missing_host_packages(versions(cffi="2.0.0", build="1.3.0")) == []


def test_missing_and_too_old_named(host):
    assert host.missing_host_packages(versions()) == ["cffi>=2.0", "build"]
    assert host.missing_host_packages(versions(cffi="1.17.1", build="1.0")) == ["cffi>=2.0"]


def test_cffi_floor_is_the_build_requirement(host):
    """The cffi the C code is emitted with is the one pyproject.toml builds with."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert "\"cffi>=2.0; implementation_name == 'cpython'\"" in text
    assert "cffi>=2.0" in host.HOST_REQUIREMENTS


def test_outside_a_virtualenv_stops_with_the_command(host, monkeypatch):
    monkeypatch.setattr(host, "missing_host_packages", lambda: ["build"])
    monkeypatch.setattr(host, "in_virtualenv", lambda: False)
    ran = []
    monkeypatch.setattr(host, "run", lambda cmd, **kw: ran.append(cmd))
    with pytest.raises(SystemExit) as stop:
        host.ensure_host_packages()
    assert "-m pip install 'build'" in str(stop.value)
    assert ran == []


def test_in_a_virtualenv_installs_what_is_missing(host, monkeypatch):
    answers = iter([["cffi>=2.0", "build"], []])
    monkeypatch.setattr(host, "missing_host_packages", lambda: next(answers))
    monkeypatch.setattr(host, "in_virtualenv", lambda: True)
    ran = []
    monkeypatch.setattr(host, "run", lambda cmd, **kw: ran.append(cmd))
    host.ensure_host_packages()
    assert ran == [[sys.executable, "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", "cffi>=2.0", "build"]]


def test_pip_failing_to_satisfy_stops(host, monkeypatch):
    monkeypatch.setattr(host, "missing_host_packages", lambda: ["build"])
    monkeypatch.setattr(host, "in_virtualenv", lambda: True)
    monkeypatch.setattr(host, "run", lambda cmd, **kw: None)
    with pytest.raises(SystemExit, match="pip did not install build"):
        host.ensure_host_packages()


def test_checked_before_any_command_runs(tmp_path):
    """A Python that lacks a package and is no virtualenv stops at once, for
    every command, before apt or the Windows Python are touched."""
    if not os.path.isdir(FOLDER):
        pytest.skip("tools/ is not shipped here")
    if sys.platform == "win32":
        pytest.skip("a tool for Linux hosts only")
    code = (
        "import importlib.metadata, sys\n"
        "real = importlib.metadata.version\n"
        "def version(name):\n"
        "    if name == 'build':\n"
        "        raise importlib.metadata.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "importlib.metadata.version = version\n"
        "sys.base_prefix = sys.prefix\n"
        "import runpy\n"
        "sys.argv = ['tools.wine', 'wheel']\n"
        "runpy.run_module('tools.wine', run_name='__main__')\n")
    env = dict(os.environ, SOCKNOTIFY_WINE_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "needs on the Linux side:" in proc.stderr
    assert "build" in proc.stderr.split("needs on the Linux side:")[1].split(".")[0]
    assert "[wine]" not in proc.stdout
    assert not (tmp_path / "cache").exists()
