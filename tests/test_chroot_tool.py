"""tools/chroot.py's pure parts: which Debian mirror it takes from apt's
configuration, and which pip settings name local folders to mount; and
tools/freethreaded.py's: the free-threaded version's place among the
chroot's Pythons, the tarballs it accepts, and when its cached build is
current.

The chroot itself is exercised by tox's py314 and py315 environments, which
run this suite inside it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "chroot.py")


@pytest.fixture(scope="module")
def chroot():
    if not os.path.exists(TOOL):
        pytest.skip("tools/ is not shipped here")
    pytest.importorskip("fcntl", reason="the chroot tool runs on Linux hosts only")
    spec = importlib.util.spec_from_file_location("chroot_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mirrors_from_deb822_and_one_line_sources(chroot, tmp_path):
    (tmp_path / "sources.list").write_text(
        "# comment\n"
        "deb [arch=amd64] http://mirror.example/debian/ bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n")
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://deb.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://off.example/debian\nEnabled: no\n")
    (parts / "other.list").write_text("deb https://packages.example/apt stable main\n")
    (parts / "ignored.list.disabled").write_text("deb http://never.example/debian x main\n")
    assert chroot.apt_mirrors(str(tmp_path)) == [
        "http://mirror.example/debian", "http://deb.example/debian"]


def test_mirror_variable_wins(chroot, monkeypatch):
    monkeypatch.setenv(chroot.MIRROR_VARIABLE, "http://chosen.example/debian")
    assert chroot.mirror() == "http://chosen.example/debian"


def test_local_pip_paths(chroot, tmp_path):
    index = tmp_path / "pypi" / "simple"
    index.mkdir(parents=True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bundle = tmp_path / "ca.crt"
    bundle.write_text("")
    found = chroot._local_paths([
        f"file://{index} https://pypi.org/simple", str(wheels), str(bundle),
        "/no/such/folder", "180"])
    # A local "simple" index links to ../../files: its parent goes in whole.
    assert found == [str(tmp_path / "pypi"), str(wheels), str(bundle)]


def test_free_threaded_python_in_the_chroot(tmp_path):
    """3.14t is one of the chroot's versions, with the test extra only and
    a build of its own; a CPython 3.14 release tarball is taken, anything
    else refused before a copy; a stamp is current only for the same
    configure options and base requirements. In a child Python with the
    project root on sys.path (tools/ as a package), so this process keeps
    importing the installed socknotify_loop."""
    if not os.path.exists(os.path.join(ROOT, "tools", "freethreaded.py")):
        pytest.skip("tools/ is not shipped here")
    pytest.importorskip("fcntl", reason="the chroot tool runs on Linux hosts only")
    code = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
from tools import chroot, freethreaded as ft
refused = []
for name in ("Python-3.13.9.tar.xz", "python3.14_3.14.7.orig.tar.xz", "Python-3.14.7.zip"):
    try:
        ft._given_source({str(tmp_path)!r}, name)
    except SystemExit as exc:
        refused.append(name)
print(json.dumps({{
    "versions": list(chroot.VERSIONS), "extras": [chroot._extras(v) for v in chroot.VERSIONS],
    "refused": refused,
    "version_of": [ft._version_of("python3.14_3.14.10.orig.tar.xz"),
                   ft._version_of("/x/Python-3.14.7.tar.gz")],
    "current": [ft._current({{"configure": ft.CONFIGURE,
                              "base_requirements": ft.BASE_REQUIREMENTS}}),
                ft._current({{"configure": ft.CONFIGURE[:1],
                              "base_requirements": ft.BASE_REQUIREMENTS}}),
                ft._current(None)],
    "configure": ft.CONFIGURE, "name": ft.NAME}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["versions"] == ["3.14", "3.15", "3.14t"]
    assert answer["extras"] == ["test,integrations", "test,integrations", "test"]
    assert answer["refused"] == ["Python-3.13.9.tar.xz", "python3.14_3.14.7.orig.tar.xz",
                                 "Python-3.14.7.zip"]
    assert answer["version_of"] == ["3.14.10", "3.14.7"]
    assert answer["current"] == [True, False, False]
    assert "--disable-gil" in answer["configure"] and answer["name"] == "python3.14t"
