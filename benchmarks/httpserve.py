"""One HTTP server for httpbench.py: a small app on one loop, until ended.

    python benchmarks/httpserve.py KIND LOOP PORT [CPU]

KIND is ``uvicorn`` (an ASGI app answering every request with a short
plain-text body, served by uvicorn with ``loop="none"``, so it runs on the
loop made here) or ``aiohttp`` (the same answer from an aiohttp
``web.Application``). LOOP is a name of loops.py. The process pins itself
to CPU, prints ``READY <loop class>`` once it listens on 127.0.0.1:PORT,
and serves until it is terminated.
"""
from __future__ import annotations

import asyncio
import os
import sys

if __name__ == "__main__" and not __package__:
    # Run by path, like the worker: the project root last on sys.path.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.append(sys.path.pop(0))
    from benchmarks.httpserve import main
    sys.exit(main(sys.argv))

from . import loops

BODY = b"Hello, world!"
KINDS = ("uvicorn", "aiohttp")


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


def uvicorn_http() -> str:
    """httptools where installed (what ``uvicorn[standard]`` users get),
    else h11."""
    try:
        import httptools  # noqa: F401
        return "httptools"
    except ImportError:
        return "h11"


def ready(loop) -> None:
    cls = type(loop)
    print(f"READY {cls.__module__}.{cls.__qualname__}", flush=True)


async def serve_uvicorn(port: int) -> None:
    import uvicorn
    config = uvicorn.Config(asgi_app, host="127.0.0.1", port=port, loop="none",
                            http=uvicorn_http(), lifespan="off", access_log=False,
                            log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        if serving.done():
            serving.result()     # its error
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    ready(asyncio.get_running_loop())
    await serving


async def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def hello(request):
        return web.Response(body=BODY, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    ready(asyncio.get_running_loop())
    await asyncio.Event().wait()


def main(argv) -> int:
    kind, loop_name, port = argv[1], argv[2], int(argv[3])
    if len(argv) > 4 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(argv[4])})
    if kind not in KINDS:
        raise SystemExit(f"unknown server kind {kind!r}: one of {', '.join(KINDS)}")
    loop = loops.loop_factory(loop_name)()
    asyncio.set_event_loop(loop)
    serve = serve_uvicorn if kind == "uvicorn" else serve_aiohttp
    try:
        loop.run_until_complete(serve(port))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
