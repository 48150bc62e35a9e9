"""`python -m socknotify_loop`: unmodified programs run on our loop."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import socknotify_loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Subprocesses import the same copy of the package as the tests (the source
# tree here, the installed wheel under Wine).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(socknotify_loop.__file__)))

PROBE = textwrap.dedent("""\
    import asyncio, sys

    async def main():
        loop = asyncio.get_running_loop()
        return f"{type(loop).__module__}.{type(loop).__qualname__}"

    print("run", asyncio.run(main()))
    loop = asyncio.new_event_loop()
    print("new_event_loop", type(loop).__module__ + "." + type(loop).__qualname__)
    loop.close()
    if sys.version_info >= (3, 11):
        with asyncio.Runner() as runner:
            print("Runner", runner.run(main()))
    print("argv", sys.argv[1:])
    print("name", __name__)
    """)

OURS = "socknotify_loop.loop.Loop"


def launch(*args: str, cwd: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # Where the package under test was imported from: the source tree with
    # its in-place build, or an installed wheel (the Windows runs).
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-m", "socknotify_loop", *args],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def parse(stdout: str) -> dict:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def test_script_runs_on_our_loop(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = parse(launch(str(script), "one", "--two", cwd=str(tmp_path)).stdout)
    assert out["run"] == OURS
    assert out["new_event_loop"] == OURS
    if sys.version_info >= (3, 11):
        assert out["Runner"] == OURS
    assert out["argv"] == "['one', '--two']"
    assert out["name"] == "__main__"


def test_same_script_without_launcher_uses_stock_loop(tmp_path):
    # The control: the probe tells loops apart.
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    result = subprocess.run([sys.executable, str(script)], capture_output=True,
                            text=True, timeout=120, check=True)
    assert parse(result.stdout)["run"] != OURS


def test_module_runs_on_our_loop(tmp_path):
    package = tmp_path / "probepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(PROBE + "print('file', __file__)\n")
    out = parse(launch("-m", "probepkg.probe", "x", cwd=str(tmp_path)).stdout)
    assert out["run"] == OURS
    assert out["argv"] == "['x']"
    assert out["name"] == "__main__"
    assert out["file"].endswith(os.path.join("probepkg", "probe.py"))


def test_script_directory_is_first_on_sys_path(tmp_path):
    (tmp_path / "helper_next_to_script.py").write_text("VALUE = 42\n")
    script = tmp_path / "uses_helper.py"
    script.write_text("import helper_next_to_script as h; print('value', h.VALUE)\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert parse(launch(str(script), cwd=str(elsewhere)).stdout)["value"] == "42"


def test_exit_status_and_exceptions_propagate(tmp_path):
    exits = tmp_path / "exits.py"
    exits.write_text("import sys; sys.exit(3)\n")
    assert launch(str(exits), cwd=str(tmp_path), check=False).returncode == 3
    raises = tmp_path / "raises.py"
    raises.write_text("raise LookupError('boom')\n")
    result = launch(str(raises), cwd=str(tmp_path), check=False)
    assert result.returncode == 1 and "LookupError: boom" in result.stderr


def test_usage_errors(tmp_path):
    assert launch("no_such_script.py", cwd=str(tmp_path), check=False).returncode == 2
    assert launch("-m", cwd=str(tmp_path), check=False).returncode == 2
    assert launch("--bogus", cwd=str(tmp_path), check=False).returncode == 2
    assert "usage:" in launch("--help", cwd=str(tmp_path)).stdout


def test_info(tmp_path):
    from socknotify_loop.port import backend_info
    info = backend_info()
    out = launch("--info", cwd=str(tmp_path)).stdout
    assert f"backend: {info['backend']}" in out
    assert f"reason: {info['reason']}" in out
    for name in info["available"]:
        assert f"  {name}: " in out
    assert "os: " in out and "python: " in out
    assert sys.version.split()[0] in out
    if sys.platform == "win32":
        assert "windows build: " in out


def test_info_names_forced_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("SOCKNOTIFY_BACKEND", "epoll")
    if sys.platform != "linux":
        pytest.skip("epoll is the Linux backend")
    out = launch("--info", cwd=str(tmp_path)).stdout
    assert "forced by SOCKNOTIFY_BACKEND=epoll" in out


def test_example_program(tmp_path):
    out = launch(os.path.join(REPO, "examples", "asyncio_echo.py"), cwd=str(tmp_path)).stdout
    assert OURS in out
