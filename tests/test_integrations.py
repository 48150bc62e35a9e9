"""socknotify_loop under the tools users pick loops with: uvicorn's --loop,
pytest-asyncio's loop factories (and its older policy fixture), anyio's
loop_factory. Each test skips only when that tool is not installed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

import socknotify_loop

# Subprocesses import the same copy of the package as the tests (the source
# tree here, the installed wheel under Wine).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(socknotify_loop.__file__)))
OURS = "socknotify_loop.loop.Loop"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
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


def test_uvicorn_serves_on_our_loop(tmp_path):
    pytest.importorskip("uvicorn")
    (tmp_path / "tiny_app.py").write_text(ASGI_APP)
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tiny_app:app", "--host", "127.0.0.1",
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
        bodies = []
        for _ in range(5):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
                assert response.status == 200
                bodies.append(response.read().decode())
        assert bodies == [OURS] * 5
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stdout:
            server.stdout.close()


# -- pytest-asyncio -------------------------------------------------------------------------

PYTEST_ASYNCIO_TESTS = textwrap.dedent("""\
    import asyncio
    import pytest

    @pytest.mark.asyncio
    async def test_loop_is_ours():
        loop = asyncio.get_running_loop()
        assert f"{type(loop).__module__}.{type(loop).__qualname__}" == "%s"

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
    """ % OURS)

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


def _run_pytest(directory) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
         "ignore::DeprecationWarning", str(directory)],
        cwd=str(directory), env=_env(), capture_output=True, text=True, timeout=300)


def _pytest_asyncio_version():
    pytest_asyncio = pytest.importorskip("pytest_asyncio")
    from importlib.metadata import version
    return tuple(int(part) for part in re.findall(r"\d+", version("pytest-asyncio"))[:2]), \
        pytest_asyncio


def test_pytest_asyncio_loop_factories_hook(tmp_path):
    found, _ = _pytest_asyncio_version()
    if found < (1, 4):
        pytest.skip(f"pytest-asyncio {found} has no pytest_asyncio_loop_factories hook")
    (tmp_path / "conftest.py").write_text(HOOK_CONFTEST)
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
    (tmp_path / "conftest.py").write_text(POLICY_CONFTEST)
    (tmp_path / "test_with_policy.py").write_text(PYTEST_ASYNCIO_TESTS)
    result = _run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


# -- anyio ---------------------------------------------------------------------------------------

def test_anyio_loop_factory():
    anyio = pytest.importorskip("anyio")

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
