#!/usr/bin/env python3
"""Run every test environment: `python tools/test_all.py [tox args]`.

Installs tox if it is missing, makes the pyenv Pythons 3.9-3.13 visible to it
(PYENV_VERSION lists every installed one, so the shims resolve python3.X),
then runs tox's whole envlist: Linux tests on each Python, the sanitizer run,
the sdist-to-wheel check, and the Wine suites (which install Wine, mingw-w64 and the Windows Pythons
themselves). Exits with tox's status.
"""
import os
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
    current = "%d.%d.%d" % sys.version_info[:3]
    return sorted(found, key=lambda v: v != current)


def main():
    try:
        import tox  # noqa: F401
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "tox>=4"])
    env = dict(os.environ)
    versions = pyenv_versions()
    if versions:
        env["PYENV_VERSION"] = ":".join(versions)
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        bins = [os.path.join(root, "versions", v, "bin") for v in versions]
        env["PATH"] = os.pathsep.join(bins + [env.get("PATH", "")])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.call([sys.executable, "-m", "tox", "-c", here, *sys.argv[1:]], env=env)


if __name__ == "__main__":
    sys.exit(main())
