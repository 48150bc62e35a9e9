"""The test suite run by pytest in the Windows Python under Wine, against
the installed wheel, with PostgreSQL and Redis on the Linux side."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time

from .config import CACHE, ROOT, load_file, log
from .lock import install_locked
from .python import install_sitecustomize, pip_for_windows
from .runtime import SERVER_DIED, stop_wineserver, windows_path, wine_python

TESTS = os.path.join(ROOT, "tests")
#: seconds one pytest run under Wine may take: the whole suite takes about
#: 250 s; pytest-timeout ends a stuck test after 300 s (pyproject.toml), and
#: this ends a run stuck anywhere else, so CI fails naming it, in time.
RUN_TIMEOUT = 900


@contextlib.contextmanager
def integration_servers():
    """Start PostgreSQL and Redis on the Linux side for the Windows integration
    tests, which reach them on 127.0.0.1 through SOCKNOTIFY_TEST_PG_DSN and
    SOCKNOTIFY_TEST_REDIS_URL (an address already set is used as is). Without
    a server binary that server is not started and its tests say so (they
    fail when SOCKNOTIFY_REQUIRE_INTEGRATIONS=1)."""
    # tests/servers.py: the same helper the Linux tests use.
    servers = load_file("socknotify_test_servers", os.path.join(TESTS, "servers.py"))
    with contextlib.ExitStack() as stack:
        for variable, start in ((servers.PG_DSN_VAR, servers.postgres_server),
                                (servers.REDIS_URL_VAR, servers.redis_server)):
            if os.environ.get(variable):
                continue
            try:
                address = stack.enter_context(start())
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                log(f"{variable}: server not started: {exc}")
                continue
            log(f"{variable}={address}")
            os.environ[variable] = address
            stack.callback(os.environ.pop, variable, None)
        yield


def finished_pytest(output: str) -> bool:
    """True if pytest's output ends with its summary ("3 passed in 1.2s")."""
    tail = [line for line in output.splitlines() if line.strip()][-3:]
    summary = re.compile(r"(\d+ (passed|failed|skipped|errors?|deselected)|no tests ran)"
                         r".* in [\d.]+s")
    return any(summary.search(line) for line in tail)


def pytest_runs(pytest_args) -> list:
    """The pytest argument lists to run: the arguments as given (paths
    relative to the project made Windows paths), or with options only, the
    whole suite in two runs so our own tests' counts and the CPython
    conformance counts are reported apart."""
    args = [windows_path(os.path.join(ROOT, arg))
            if not arg.startswith("-") and os.path.exists(os.path.join(ROOT, arg.split("::")[0]))
            and not os.path.isabs(arg) else arg for arg in pytest_args]
    if any(arg.startswith(("Z:", "tests")) or arg.endswith(".py") for arg in args):
        return [args]
    conformance = windows_path(os.path.join(TESTS, "conformance"))
    return [args + ["--ignore=" + conformance, windows_path(TESTS)], args + [conformance]]


def run_tests(version: str, wheel: str, pytest_args) -> int:
    """Install the test requirements (lock.py's LOCK, pinned and hashed) and
    the wheel into the Windows Python, then run pytest there; returns
    pytest's exit status."""
    install_locked(version)
    pip_for_windows(version, ["--no-deps", "--force-reinstall", wheel])
    install_sitecustomize(version)
    # Run from a folder without the source package, so the installed wheel
    # is what gets imported; one folder per Python, because CPython's tests
    # name their scratch files by process id (os_helper.TESTFN), and two
    # Wine prefixes running side by side hand out the same Windows ids: in
    # one folder, one run's sendfile tests read and delete the other's file.
    rundir = os.path.join(CACHE, "run", "cp" + version.replace(".", ""))
    os.makedirs(rundir, exist_ok=True)
    try:
        with integration_servers():
            return _run_windows_pytest(version, pytest_runs(pytest_args), rundir)
    finally:
        stop_wineserver(version)


def _run_windows_pytest(version: str, runs, rundir: str) -> int:
    status = 0
    for run_args in runs:
        start = time.monotonic()
        proc = wine_python(version, ["-m", "pytest", "-p", "no:cacheprovider",
                                     "--rootdir", windows_path(ROOT), "-rfEs", *run_args],
                           check=False, cwd=rundir, timeout=RUN_TIMEOUT)
        log(f"pytest under Wine (Python {version}) exited {proc.returncode} "
            f"after {time.monotonic() - start:.0f} s")
        returncode = proc.returncode
        if returncode == SERVER_DIED:
            log("the wineserver died during this run: the tests after the one running "
                "then did not run; the run fails")
        if returncode == 0 and not finished_pytest(proc.stdout.decode("utf-8", "replace")):
            # A Windows process that calls a function Wine does not
            # implement is ended with exit status 0: without pytest's
            # closing summary line, the run did not finish.
            log("pytest printed no summary line: the process ended early (see above)")
            returncode = 1
        status = status or returncode
    return status
