"""Throwaway PostgreSQL and Redis servers for the integration tests.

Used three ways:

* the Linux tests' fixtures (``pg_dsn``, ``redis_url``, bound in
  tests/conftest.py) start a server per test session on 127.0.0.1 and stop it afterwards;
* ``python -m tools.wine`` starts PostgreSQL on the Linux side before it runs the
  Windows pytest under Wine, and passes the address down in
  ``SOCKNOTIFY_TEST_PG_DSN`` (the Windows Python reaches it through loopback);
* on any machine, an address already in ``SOCKNOTIFY_TEST_PG_DSN`` or
  ``SOCKNOTIFY_TEST_REDIS_URL`` is used as is and nothing is started.

A missing server binary or library skips the test with the reason, except
when ``SOCKNOTIFY_REQUIRE_INTEGRATIONS=1`` (set by CI): then it fails, so CI
can never pass by skipping.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

PG_DSN_VAR = "SOCKNOTIFY_TEST_PG_DSN"
REDIS_URL_VAR = "SOCKNOTIFY_TEST_REDIS_URL"
REQUIRE_VAR = "SOCKNOTIFY_REQUIRE_INTEGRATIONS"


def integrations_required() -> bool:
    return os.environ.get(REQUIRE_VAR, "") not in ("", "0")


def skip_or_fail(reason: str) -> None:
    """Skip the current test, or fail it when CI requires the integrations."""
    import pytest
    if integrations_required():
        pytest.fail(f"{reason} (and {REQUIRE_VAR}=1 forbids skipping)", pytrace=False)
    pytest.skip(reason)


def need(module: str, package: str | None = None):
    """Import a library a test needs, or skip/fail saying which to install."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        skip_or_fail(f"{package or module} is not installed ({exc}); "
                     "pip install -e '.[test,integrations]'")


def free_port() -> int:
    """A port nothing is bound to now. Only now: another process (a suite
    running beside this one) may bind it before a server does; servers
    start through on_a_free_port(), which then tries another."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: How many ports a server's start tries before its failure stands.
PORT_ATTEMPTS = 3

T = TypeVar("T")


class PortTaken(RuntimeError):
    """A server could not bind the port free_port() chose for it: another
    process bound it in between."""


def on_a_free_port(start: Callable[[int], T]) -> T:
    """``start(port)`` on a free port, and again on another while it raises
    PortTaken, for PORT_ATTEMPTS ports; after that its PortTaken stands.
    Any other failure stands at once."""
    for _ in range(PORT_ATTEMPTS - 1):
        try:
            return start(free_port())
        except PortTaken:
            pass
    return start(free_port())


def _log_size(log: str) -> int:
    try:
        return os.path.getsize(log)
    except OSError:
        return 0


def _port_was_taken(log: str, since: int = 0) -> bool:
    """Whether a server's log, from byte ``since`` on, says its port was in use."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            return b"Address already in use" in f.read()
    except OSError:
        return False


def _wait_for_port(port: int, proc: subprocess.Popen | None, what: str,
                   log: str | None = None, timeout: float = 30.0,
                   hello: tuple[bytes, bytes] | None = None) -> None:
    """Wait until the server listens on ``port``. With ``hello`` (what to
    send, how the answer starts), the listener must also answer as the
    server does: one that merely accepts may be another process's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        with contextlib.suppress(OSError), \
                socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            if hello is None:
                return
            sock.sendall(hello[0])
            if sock.recv(64).startswith(hello[1]):
                return
        time.sleep(0.05)
    detail = ""
    if log and os.path.exists(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            detail = "\n" + f.read()[-2000:]
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}{detail}")


# -- PostgreSQL -----------------------------------------------------------------------------

def postgres_bindir() -> str | None:
    """The newest PostgreSQL server binaries: Debian's /usr/lib/postgresql/N/bin,
    else initdb on PATH."""
    def major(path: str) -> int:
        digits = path.split(os.sep)[-3]
        return int(digits) if digits.isdigit() else 0
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=major)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _as_server_user(cmd: list) -> list:
    """PostgreSQL refuses to run as root: run it as the `postgres` account."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 with trust auth; yields its DSN."""
    bindir = postgres_bindir()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found; "
                                "apt-get install postgresql")
    if sys.platform != "win32" and os.geteuid() == 0 and not shutil.which("runuser"):
        raise FileNotFoundError("running as root needs runuser to start PostgreSQL")
    # Not pytest's tmp_path: that is private to root, and the server runs as postgres.
    base = tempfile.mkdtemp(prefix="socknotify-pg-")
    data = os.path.join(base, "data")
    log = os.path.join(base, "server.log")
    if sys.platform != "win32" and os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    started = False
    try:
        subprocess.run(_as_server_user(
            [os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--locale=C", "--no-sync"]),
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

        def start(port: int) -> int:
            # fsync off: a test cluster never needs to survive a crash.
            options = (f"-p {port} -c listen_addresses=127.0.0.1 -k {base} "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                       "-c max_connections=40")
            logged = _log_size(log)   # pg_ctl appends: this start's lines come after
            try:
                subprocess.run(_as_server_user(
                    [os.path.join(bindir, "pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60",
                     "-o", options, "start"]),
                    check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=90)
            except subprocess.CalledProcessError as exc:
                if _port_was_taken(log, logged):
                    raise PortTaken(f"PostgreSQL: 127.0.0.1:{port} was in use") from exc
                raise
            return port

        port = on_a_free_port(start)
        started = True
        _wait_for_port(port, None, "PostgreSQL", log)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(_as_server_user(
                [os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate", "-w",
                 "stop"]), check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=60)
        shutil.rmtree(base, ignore_errors=True)


# -- Redis ----------------------------------------------------------------------------------

@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on 127.0.0.1, no persistence; yields its URL."""
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if binary is None:
        raise FileNotFoundError("redis-server not found; apt-get install redis-server")
    base = tempfile.mkdtemp(prefix="socknotify-redis-")
    log = os.path.join(base, "server.log")

    def start(port: int) -> tuple[int, subprocess.Popen]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", base, "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_for_port(port, proc, "redis-server", log, hello=(b"PING\r\n", b"+PONG"))
        except RuntimeError as exc:
            stop_process(proc)
            if _port_was_taken(log):
                raise PortTaken(f"redis-server: 127.0.0.1:{port} was in use") from exc
            raise
        return port, proc

    try:
        port, proc = on_a_free_port(start)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(proc)
        shutil.rmtree(base, ignore_errors=True)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate ``proc``; kill it if it has not exited after ``timeout`` s."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- pytest fixtures (tests/conftest.py binds them) -----------------------------------------

def server_fixture(variable: str, start, what: str):
    """A session fixture yielding the address in ``variable``, or else that of
    a server ``start()`` runs for the session (skipped/failed if it cannot)."""
    import pytest

    @pytest.fixture(scope="session")
    def fixture():
        if os.environ.get(variable):
            yield os.environ[variable]
            return
        if sys.platform == "win32":
            # Under Wine the server runs on the Linux side: tools/wine starts it.
            skip_or_fail(f"{what}: no server address in {variable} "
                         "(tools/wine sets it when it can start one on Linux)")
        try:
            server = start()
            address = server.__enter__()
        except (FileNotFoundError, subprocess.CalledProcessError, RuntimeError) as exc:
            detail = getattr(exc, "stderr", None) or b""
            skip_or_fail(f"{what} could not be started: {exc} "
                         f"{detail.decode(errors='replace') if detail else ''}".strip())
        try:
            yield address
        finally:
            server.__exit__(None, None, None)
    return fixture


# -- running code on our loop, and in child processes ----------------------------------------

def child_env() -> dict:
    """``os.environ`` for a child Python that must import the same copy of
    socknotify_loop as the tests (the source tree here, the installed wheel
    under Wine): its parent folder first on PYTHONPATH."""
    import socknotify_loop
    parent = os.path.dirname(os.path.dirname(os.path.abspath(socknotify_loop.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = parent + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_on_loop(main, timeout: float = 120.0):
    """Run ``main()`` on a fresh socknotify_loop Loop (checking that the loop in
    use is ours), bounded by ``timeout`` seconds."""
    import asyncio

    import socknotify_loop

    async def checked():
        loop = asyncio.get_running_loop()
        assert type(loop) is socknotify_loop.Loop, type(loop)
        return await asyncio.wait_for(main(), timeout)

    return socknotify_loop.run(checked())


def selector_threads() -> list:
    """Threads started by the selector-thread fallbacks pyzmq and tornado use on
    ProactorEventLoop (tornado names its thread "Tornado selector")."""
    import threading
    return [t.name for t in threading.enumerate() if "selector" in t.name.lower()]
