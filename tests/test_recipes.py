"""The server recipes of docs/switching.md, each run as written: gunicorn
with the uvicorn-worker package (through the launcher, and with a worker
class naming the loop), Hypercorn (through the launcher and from code), and
a Django ASGI project under uvicorn. Every server listens on 127.0.0.1, is
asked for its loop over HTTP, and is stopped within a bounded time.

Linux only: gunicorn does not run on Windows, and these recipes are proven
on Linux (the loop under them is the same Python code on every backend)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from typing import Callable, List, Optional

import pytest
from servers import PortTaken, child_env, need, on_a_free_port, stop_process

import socknotify_loop

# The platform's loop class (socknotify_loop.Loop), as a running loop names it.
OURS = f"{socknotify_loop.Loop.__module__}.{socknotify_loop.Loop.__qualname__}"

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32",
                       reason="gunicorn has no Windows port; these recipes are tested on Linux"),
    pytest.mark.timeout(120),
]

START_TIMEOUT = 45      # seconds for a server to answer its first request

# An ASGI app answering any GET with the module.qualname of its running loop.
LOOP_APP = textwrap.dedent("""\
    import asyncio

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        loop = asyncio.get_running_loop()
        body = f"{type(loop).__module__}.{type(loop).__qualname__}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    """)


def get_body(port: int, path: str = "/") -> bytes:
    """One HTTP/1.0 GET (no chunked body) on a fresh connection; the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    response = b"".join(chunks)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.split(b"\r\n", 1)[0].split(b" ")[1] == b"200", response
    return body


def serve_and_ask(cmd: Callable[[int], List[str]], cwd: str, requests: int = 3,
                  path: str = "/", env: Optional[dict] = None) -> List[str]:
    """Start ``cmd(port)`` (a server on 127.0.0.1:port, a free port), GET
    ``path`` ``requests`` times once it answers, stop it; the bodies. A
    server that could not bind because its port was taken meanwhile (by a
    suite running beside this one) is started again on another port
    (on_a_free_port). The server's output is in the assertion message when
    it never answers."""
    def serve(port: int) -> List[str]:
        server = subprocess.Popen(cmd(port), cwd=cwd, env={**child_env(), **(env or {})},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            first = _first_answer(server, port, path)
            return [first.decode()] + [get_body(port, path).decode()
                                       for _ in range(requests - 1)]
        finally:
            stop_process(server)
            if server.stdout:
                server.stdout.close()
    return on_a_free_port(serve)


def _first_answer(server: subprocess.Popen, port: int, path: str) -> bytes:
    """The first body ``server`` serves; PortTaken if it ended saying its
    port was in use; a test failure if it ended or timed out otherwise."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            return get_body(port, path)
        except (ConnectionRefusedError, ConnectionResetError):
            if server.poll() is not None or time.monotonic() > deadline:
                stop_process(server)
                output = server.stdout.read() if server.stdout else ""
                if "in use" in output:
                    raise PortTaken(f"{server.args} could not bind its port:\n{output}") from None
                pytest.fail(f"{server.args} did not serve:\n{output}")
            time.sleep(0.1)


# -- gunicorn with the uvicorn-worker package ----------------------------------------------

def test_gunicorn_uvicorn_worker_through_the_launcher(tmp_path):
    """`python -m socknotify_loop -m gunicorn -k uvicorn_worker.UvicornWorker`,
    two workers. The worker asks for uvicorn's `auto` loop, which is uvloop
    when uvloop is installed: the launcher's uvloop makes our loop too."""
    need("gunicorn")
    need("uvicorn_worker")
    (tmp_path / "app.py").write_text(LOOP_APP)
    bodies = serve_and_ask(
        lambda port: [sys.executable, "-m", "socknotify_loop", "-m", "gunicorn",
                      "-k", "uvicorn_worker.UvicornWorker", "--workers", "2",
                      "--bind", f"127.0.0.1:{port}", "--graceful-timeout", "5", "app:app"],
        cwd=str(tmp_path), requests=6)
    assert bodies == [OURS] * 6


WORKER_MODULE = textwrap.dedent("""\
    from uvicorn_worker import UvicornWorker


    class SocknotifyWorker(UvicornWorker):
        # uvicorn 0.36+ takes a loop factory as "module:callable".
        CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS,
                         "loop": "socknotify_loop:new_event_loop"}
    """)


def test_gunicorn_worker_class_naming_the_loop(tmp_path):
    """Plain `gunicorn -k workers.SocknotifyWorker`: no launcher."""
    need("gunicorn")
    need("uvicorn_worker")
    (tmp_path / "app.py").write_text(LOOP_APP)
    (tmp_path / "workers.py").write_text(WORKER_MODULE)
    bodies = serve_and_ask(
        lambda port: [sys.executable, "-m", "gunicorn", "-k", "workers.SocknotifyWorker",
                      "--workers", "2", "--bind", f"127.0.0.1:{port}",
                      "--graceful-timeout", "5", "app:app"],
        cwd=str(tmp_path), requests=6)
    assert bodies == [OURS] * 6


# -- Hypercorn ---------------------------------------------------------------------------

@pytest.mark.parametrize("worker_class", ["asyncio", "uvloop"])
def test_hypercorn_through_the_launcher(tmp_path, worker_class):
    """Hypercorn's asyncio worker, and its uvloop worker (whose loop
    factory is uvloop.new_event_loop, ours under the launcher)."""
    need("hypercorn")
    if worker_class == "uvloop":
        need("uvloop")
    (tmp_path / "app.py").write_text(LOOP_APP)
    bodies = serve_and_ask(
        lambda port: [sys.executable, "-m", "socknotify_loop", "-m", "hypercorn",
                      "-k", worker_class, "--bind", f"127.0.0.1:{port}", "app:app"],
        cwd=str(tmp_path))
    assert bodies == [OURS] * 3


HYPERCORN_FROM_CODE = textwrap.dedent("""\
    import sys

    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    import socknotify_loop
    from app import app

    config = Config()
    config.bind = [f"127.0.0.1:{sys.argv[1]}"]
    socknotify_loop.run(serve(app, config))
    """)


def test_hypercorn_from_code(tmp_path):
    need("hypercorn")
    (tmp_path / "app.py").write_text(LOOP_APP)
    (tmp_path / "serve.py").write_text(HYPERCORN_FROM_CODE)
    bodies = serve_and_ask(lambda port: [sys.executable, "serve.py", str(port)],
                           cwd=str(tmp_path))
    assert bodies == [OURS] * 3


# -- Django's ASGI application under uvicorn -----------------------------------------------

DJANGO_FILES = {
    "mysite/__init__.py": "",
    "mysite/settings.py": textwrap.dedent("""\
        SECRET_KEY = "only-for-this-test"
        DEBUG = False
        ALLOWED_HOSTS = ["127.0.0.1"]
        ROOT_URLCONF = "mysite.urls"
        INSTALLED_APPS = []
        DATABASES = {}
        USE_TZ = True
        """),
    "mysite/urls.py": textwrap.dedent("""\
        import asyncio

        from django.http import HttpResponse
        from django.urls import path


        async def which_loop(request):
            loop = asyncio.get_running_loop()
            return HttpResponse(f"{type(loop).__module__}.{type(loop).__qualname__}")

        urlpatterns = [path("loop", which_loop)]
        """),
    "mysite/asgi.py": textwrap.dedent("""\
        import os

        from django.core.asgi import get_asgi_application

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
        application = get_asgi_application()
        """),
}


def test_django_asgi_under_uvicorn(tmp_path):
    """`uvicorn mysite.asgi:application --loop socknotify_loop:new_event_loop`;
    the async view answers on our loop."""
    need("django")
    need("uvicorn")
    for name, text in DJANGO_FILES.items():
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        (tmp_path / name).write_text(text)
    bodies = serve_and_ask(
        lambda port: [sys.executable, "-m", "uvicorn", "mysite.asgi:application",
                      "--host", "127.0.0.1", "--port", str(port),
                      "--loop", "socknotify_loop:new_event_loop", "--lifespan", "off"],
        cwd=str(tmp_path), path="/loop")
    assert bodies == [OURS] * 3
