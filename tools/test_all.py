#!/usr/bin/env python3
"""Run every test environment: `python tools/test_all.py [tox args]`.

Installs tox if it is missing, makes the pyenv Pythons 3.9-3.13 visible to it
(PYENV_VERSION lists every installed one, so the shims resolve python3.X),
installs Debian's pypy3 and pypy3-dev (as root, with apt-get) when the
pypy3 environment will run and they are missing, then runs tox's whole
envlist: the linters (ruff, mypy), Linux tests on each Python and on PyPy,
the sanitizer run, the sdist-to-wheel check, and the Wine suites (which
install Wine, mingw-w64 and the Windows Pythons themselves). Exits with
tox's status.
"""
import os
import shutil
import subprocess
import sys


def pyenv_versions():
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    versions = os.path.join(root, "versions")
    if not os.path.isdir(versions):
        return []
    wanted = ("3.9.", "3.10.", "3.11.", "3.12.", "3.13.")
    found = sorted(v for v in os.listdir(versions) if v.startswith(wanted))
    # The running Python first, so plain `python` stays what it was.
    current = "{}.{}.{}".format(*sys.version_info[:3])
    return sorted(found, key=lambda v: v != current)


def pypy_ready():
    """pypy3 on PATH with its C headers (pypy3-dev), which building the core needs."""
    if not shutil.which("pypy3"):
        return False
    probe = ("import os, sysconfig; "
             "print(os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))")
    result = subprocess.run(["pypy3", "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() == "True"


def selected_envs(tox_args):
    """The environments named with -e, or None for tox's whole envlist."""
    for i, arg in enumerate(tox_args):
        if arg == "--":
            break
        if arg == "-e" and i + 1 < len(tox_args):
            return tox_args[i + 1].split(",")
        if arg.startswith("-e") and len(arg) > 2:
            return arg[2:].lstrip("=").split(",")
    return None


def ensure_pypy(tox_args):
    """Install pypy3 and pypy3-dev for tox's pypy3 env if it will run."""
    envs = selected_envs(tox_args)
    if envs is not None and "pypy3" not in envs and "ALL" not in envs:
        return
    if pypy_ready():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit("tox's pypy3 env needs PyPy and its headers: "
                 "apt-get install -y pypy3 pypy3-dev")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.check_call(["apt-get", "update", "-qq"], env=env)
    subprocess.check_call(["apt-get", "install", "-y", "-qq", "pypy3", "pypy3-dev"], env=env,
                          stdout=subprocess.DEVNULL)


def main():
    try:
        import tox  # noqa: F401
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "tox>=4"])
    ensure_pypy(sys.argv[1:])
    env = dict(os.environ)
    versions = pyenv_versions()
    if versions:
        env["PYENV_VERSION"] = ":".join(versions)
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        bins = [os.path.join(root, "versions", v, "bin") for v in versions]
        env["PATH"] = os.pathsep.join(bins + [env.get("PATH", "")])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tox = subprocess.Popen([sys.executable, "-m", "tox", "-c", here, *sys.argv[1:]], env=env)
    try:
        return tox.wait()
    except KeyboardInterrupt:
        # Ctrl+C reached tox too (same terminal): let it stop its own
        # environments' processes, then say so in one line.
        try:
            tox.wait(timeout=60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            tox.kill()
            tox.wait()
        print("\ntools/test_all.py: interrupted; one environment runs alone with "
              "`python tools/test_all.py -e py311`", file=sys.stderr)
        return 130


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # during the installs before tox starts
        print("\ntools/test_all.py: interrupted", file=sys.stderr)
        sys.exit(130)
