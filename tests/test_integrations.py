"""socknotify_loop under the tools users pick loops with: uvicorn's --loop
(also under a few thousand requests), pytest-asyncio's loop factories (and
its older policy fixture), anyio's loop_factory. Each test skips only when
that tool is not installed (a failure when SOCKNOTIFY_REQUIRE_INTEGRATIONS=1)."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from servers import child_env, need, stop_process

import socknotify_loop

# The platform's loop class (socknotify_loop.Loop), as a running loop names it.
OURS = f"{socknotify_loop.Loop.__module__}.{socknotify_loop.Loop.__qualname__}"

# Warnings are errors here, and in the uvicorn server (-W error).
pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(autouse=True, scope="module")
def _finalise_earlier_garbage():
    """What earlier modules left to the garbage collector is finalised now,
    not during these tests, whose warnings are errors: PyPy collects late,
    and an unclosed socket's ResourceWarning would land in the wrong test."""
    gc.collect()


def _env() -> dict:
    # Subprocesses import the same copy of the package as the tests.
    env = child_env()
    env.pop("PYTEST_ADDOPTS", None)
    return env


# -- uvicorn ------------------------------------------------------------------------------

ASGI_APP = textwrap.dedent("""\
    import asyncio

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        body = f"{type(loop).__module__}.{type(loop).__qualname__}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})
    """)


@contextlib.contextmanager
def _uvicorn(tmp_path, app_source: str):
    """uvicorn serving ``app_source`` with ``--loop socknotify_loop:new_event_loop``
    (warnings are errors in the server too); yields its port."""
    (tmp_path / "tiny_app.py").write_text(app_source)
    server = subprocess.Popen(
        [sys.executable, "-W", "error", "-m", "uvicorn", "tiny_app:app", "--host", "127.0.0.1",
         "--port", "0", "--loop", "socknotify_loop:new_event_loop", "--no-access-log"],
        cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        log = []
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            log.append(line)
            match = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
        assert port, "uvicorn did not start:\n" + "".join(log)
        yield port
    finally:
        stop_process(server)
        if server.stdout:
            server.stdout.close()


def test_uvicorn_serves_on_our_loop(tmp_path):
    need("uvicorn")
    with _uvicorn(tmp_path, ASGI_APP) as port:
        bodies = []
        for _ in range(5):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
                assert response.status == 200
                bodies.append(response.read().decode())
        assert bodies == [OURS] * 5


COUNTING_APP = textwrap.dedent("""\
    import asyncio

    served = 0

    async def app(scope, receive, send):
        global served
        if scope["type"] != "http":
            return
        if scope["path"] == "/loop":
            loop = asyncio.get_running_loop()
            body = f"{type(loop).__module__}.{type(loop).__qualname__}"
        else:
            served += 1
            body = str(served)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body.encode()})
    """)

UVICORN_CONNECTIONS = 10
UVICORN_REQUESTS_EACH = 300


async def _http_get(reader, writer, path: str) -> bytes:
    """One keep-alive HTTP/1.1 GET; returns the body (Content-Length framed)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    assert status == b"HTTP/1.1 200 OK", head
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
    return await reader.readexactly(length)


def test_uvicorn_serves_thousands_of_requests(tmp_path):
    """3000 requests over 10 keep-alive connections, the client on our loop
    too; every response counted (the app numbers them 1..N)."""
    need("uvicorn")
    total = UVICORN_CONNECTIONS * UVICORN_REQUESTS_EACH

    async def client(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return [int(await _http_get(reader, writer, "/"))
                    for _ in range(UVICORN_REQUESTS_EACH)]
        finally:
            writer.close()
            await writer.wait_closed()

    async def main(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await _http_get(reader, writer, "/loop")).decode() == OURS
        writer.close()
        await writer.wait_closed()
        results = await asyncio.gather(*(client(port) for _ in range(UVICORN_CONNECTIONS)))
        return [n for numbers in results for n in numbers]

    with _uvicorn(tmp_path, COUNTING_APP) as port:
        start = time.monotonic()
        numbers = socknotify_loop.run(asyncio.wait_for(main(port), 240))
        elapsed = time.monotonic() - start
    assert len(numbers) == total
    assert sorted(numbers) == list(range(1, total + 1)), f"{elapsed:.1f} s"


# -- pytest-asyncio -------------------------------------------------------------------------

PYTEST_ASYNCIO_TESTS = textwrap.dedent("""\
    import asyncio
    import pytest

    @pytest.mark.asyncio
    async def test_loop_is_ours():
        loop = asyncio.get_running_loop()
        assert f"{type(loop).__module__}.{type(loop).__qualname__}" == "OURS"

    @pytest.mark.asyncio
    async def test_streams_work():
        async def echo(reader, writer):
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping\\n")
            assert await reader.readline() == b"ping\\n"
            writer.close()
            await writer.wait_closed()
    """).replace('"OURS"', repr(OURS))

HOOK_CONFTEST = textwrap.dedent("""\
    import socknotify_loop

    def pytest_asyncio_loop_factories(config, item):
        return {"socknotify": socknotify_loop.new_event_loop}
    """)

POLICY_CONFTEST = textwrap.dedent("""\
    import pytest
    import socknotify_loop

    @pytest.fixture(scope="session")
    def event_loop_policy():
        return socknotify_loop.EventLoopPolicy()
    """)

# The recipe's setting (docs/switching.md): unset, pytest-asyncio warns at
# start-up, an error under -W error.
PYTEST_ASYNCIO_CONFIG = textwrap.dedent("""\
    [tool.pytest.ini_options]
    asyncio_default_fixture_loop_scope = "function"
    """)

# pytest-asyncio 1.4+ deprecates the policy fixture (the docs say to use
# the hook there): the one warning the policy recipe's run lets through.
POLICY_FIXTURE_DEPRECATED = r'ignore:Overriding the "event_loop_policy" fixture:DeprecationWarning'


def write_pytest_asyncio_recipe(directory, conftest: str) -> None:
    """The recipe's files as docs/switching.md gives them: conftest.py and
    the setting in pyproject.toml."""
    (directory / "conftest.py").write_text(conftest)
    (directory / "pyproject.toml").write_text(PYTEST_ASYNCIO_CONFIG)


def _run_pytest(directory, *warning_options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
         *warning_options, str(directory)],
        check=False, cwd=str(directory), env=_env(), capture_output=True, text=True,
        timeout=300)


def test_pytest_asyncio_recipes_are_the_docs():
    """The files these tests write are docs/switching.md's recipe, verbatim."""
    import os
    page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "docs", "switching.md")
    if not os.path.exists(page):
        pytest.skip("docs/ is not shipped here")
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for block in (HOOK_CONFTEST, POLICY_CONFTEST, PYTEST_ASYNCIO_CONFIG):
        assert block in text, block


def _pytest_asyncio_version():
    pytest_asyncio = need("pytest_asyncio", "pytest-asyncio")
    from importlib.metadata import version
    return tuple(int(part) for part in re.findall(r"\d+", version("pytest-asyncio"))[:2]), \
        pytest_asyncio


def test_pytest_asyncio_loop_factories_hook(tmp_path):
    found, _ = _pytest_asyncio_version()
    if found < (1, 4):
        pytest.skip(f"pytest-asyncio {found} has no pytest_asyncio_loop_factories hook")
    write_pytest_asyncio_recipe(tmp_path, HOOK_CONFTEST)
    (tmp_path / "test_with_factory.py").write_text(PYTEST_ASYNCIO_TESTS)
    result = _run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_pytest_asyncio_policy_fixture(tmp_path):
    found, _ = _pytest_asyncio_version()
    if sys.version_info >= (3, 14):
        pytest.skip("event loop policies are deprecated on Python 3.14+")
    if found >= (2, 0):
        pytest.skip(f"pytest-asyncio {found} may have dropped the event_loop_policy fixture")
    write_pytest_asyncio_recipe(tmp_path, POLICY_CONFTEST)
    (tmp_path / "test_with_policy.py").write_text(PYTEST_ASYNCIO_TESTS)
    result = _run_pytest(tmp_path, *(["-W", POLICY_FIXTURE_DEPRECATED] if found >= (1, 4)
                                     else []))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


# -- anyio ---------------------------------------------------------------------------------------

def test_anyio_loop_factory():
    anyio = need("anyio")

    async def main():
        import asyncio

        async def handle(stream):
            async with stream:
                await stream.send(await stream.receive())

        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, handle)
            async with await anyio.connect_tcp("127.0.0.1", port) as client:
                await client.send(b"through anyio")
                echoed = await client.receive()
            group.cancel_scope.cancel()
        return type(asyncio.get_running_loop()), echoed

    loop_type, echoed = anyio.run(
        main, backend="asyncio",
        backend_options={"loop_factory": socknotify_loop.new_event_loop})
    assert loop_type is socknotify_loop.Loop
    assert echoed == b"through anyio"
