"""tools/chroot.py's pure parts: which Debian mirror it takes from apt's
configuration, and which pip settings name local folders to mount.

The chroot itself is exercised by tox's py314 and py315 environments, which
run this suite inside it.
"""
from __future__ import annotations

import importlib.util
import os

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
