"""Build the Windows wheel with mingw-w64 and run the test suite in a real
Windows CPython under Wine, on a Linux machine that has none of it yet.

From the repository root:

    python -m tools.wine setup  --py 3.11   # apt packages, Windows Python, Wine prefix
    python -m tools.wine wheel  --py 3.11   # dist/socknotify_loop-*-cp39-abi3-win_amd64.whl
    python -m tools.wine test   --py 3.11 [-- pytest args]  # install wheel + deps, run pytest
    python -m tools.wine all    --py 3.11 [-- pytest args]  # the three in order
    python -m tools.wine bench  --py 3.11 [-- run.py args]  # benchmarks/run.py natively in it
    python -m tools.wine lock   # write tools/wine/requirements.txt (what the Pythons get)

``--backend NAME`` (test, all) runs pytest with SOCKNOTIFY_BACKEND=NAME, so
the selector, loop and every suite that takes the default backend run on
it: ``--backend strict`` is the strict model of ProcessSocketNotifications.

test and all build (or reuse) a test wheel: the core compiled with its
test-only parts, the strict model among them, and their declarations
(SOCKNOTIFY_TESTING=1), which the tests of the strict model need; ``wheel``
builds the production one, which has none of them.

``--check-transitions`` (test, all) builds the wheel afresh with every
record transition of the C core checked (SN_CHECK_TRANSITIONS, sn_record.h):
a transition from a state it does not start from aborts the Windows Python
with its name and line. The wheel in dist/ is then that build.

Checked on Debian 12 with Wine 8.0. Windows Python under Wine needs stdin
from /dev/null and stdout/stderr on pipes (runtime.py); where the Windows
Python comes from, how it is checked before it runs and what it lacks:
python.py and signing.py; the packages installed into it: lock.py.
"""
from __future__ import annotations

import argparse
import os
import sys

from .apt import ensure_apt_packages
from .bench import run_bench
from .compile import CHECK_TRANSITIONS, TESTING
from .host import ensure_host_packages
from .lock import write_lock
from .python import WINDOWS_PYTHONS, ensure_windows_python
from .run import run_tests
from .runtime import wine_python
from .wheel import build_wheel, fresh_wheel, is_test_wheel, wheel_path

COMMANDS = ["setup", "wheel", "test", "all", "bench", "lock"]


def setup(version: str) -> None:
    """Wine and mingw-w64, the Windows Python, and a prefix that runs it."""
    ensure_apt_packages()
    ensure_windows_python(version)
    # The first run in a new prefix also makes the prefix (about 20 s).
    wine_python(version, ["-c", "import sys; print(sys.version)"], timeout=300)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.wine",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--py", default="3.11", choices=sorted(WINDOWS_PYTHONS))
    parser.add_argument("--backend", default=None,
                        help="SOCKNOTIFY_BACKEND for the test run (e.g. strict)")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" goes to pytest (to run.py for bench) untouched.
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser.add_argument("--check-transitions", action="store_true",
                        help="build the core with every record transition checked")
    options = parser.parse_args(argv)
    version = options.py
    if options.backend:
        # Wine hands the Linux environment to the Windows process.
        os.environ["SOCKNOTIFY_BACKEND"] = options.backend
    if options.check_transitions:
        os.environ[CHECK_TRANSITIONS] = "1"
    # cffi and build, before the first command needing them has done any
    # work (host.py).
    ensure_host_packages()
    if options.command in ("test", "all"):
        # The tests steer the strict model: a test build (SN_TESTING).
        os.environ[TESTING] = "1"
    if options.command == "setup":
        setup(version)
        return 0
    if options.command == "lock":
        write_lock()
        return 0
    if options.command == "wheel":
        build_wheel(version)
        return 0
    if options.command == "bench":
        setup(version)
        return run_bench(version, fresh_wheel(version), extra)
    if options.command == "test":
        wheel = wheel_path()
        if options.check_transitions or not is_test_wheel(wheel):
            wheel = build_wheel(version)
        return run_tests(version, wheel, extra)
    setup(version)
    return run_tests(version, build_wheel(version), extra)


if __name__ == "__main__":
    sys.exit(main())
