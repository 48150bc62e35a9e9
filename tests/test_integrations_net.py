"""Networking libraries on socknotify_loop: pyzmq's asyncio sockets, tornado,
aiohttp, and subprocess pipes streamed beside sockets in one process.

On Windows, pyzmq and tornado fall back to a second "selector thread" when
the loop lacks ``add_reader`` (ProactorEventLoop); on our loop they must
not: each test checks that no such thread or loop was created. Warnings are
errors (pyzmq's fallback announces itself with a RuntimeWarning).
"""
from __future__ import annotations

import asyncio
import gc
import json
import sys
import time

import pytest
from servers import need, run_on_loop, selector_threads

import socknotify_loop

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(autouse=True, scope="module")
def _finalise_earlier_garbage():
    """What earlier modules left to the garbage collector is finalised now,
    not during these tests, whose warnings are errors: PyPy collects late,
    and an unclosed socket's ResourceWarning would land in the wrong test."""
    gc.collect()


# -- pyzmq ----------------------------------------------------------------------------------

def test_pyzmq_req_rep_and_pub_sub():
    zmq = need("zmq", "pyzmq")
    zmq_asyncio = need("zmq.asyncio", "pyzmq")
    before = selector_threads()

    async def main():
        ctx = zmq_asyncio.Context()
        sockets = []

        def socket(kind):
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            sockets.append(sock)
            return sock

        try:
            rep = socket(zmq.REP)
            port = rep.bind_to_random_port("tcp://127.0.0.1")
            req = socket(zmq.REQ)
            req.connect(f"tcp://127.0.0.1:{port}")

            async def serve(count):
                for _ in range(count):
                    parts = await rep.recv_multipart()
                    await rep.send_multipart([b"reply"] + parts)

            server = asyncio.ensure_future(serve(100))
            for i in range(100):
                payload = bytes([i]) * (i * 50)
                await req.send_multipart([b"%d" % i, payload])
                assert await req.recv_multipart() == [b"reply", b"%d" % i, payload]
            await asyncio.wait_for(server, 30)

            pub = socket(zmq.PUB)
            port = pub.bind_to_random_port("tcp://127.0.0.1")
            sub = socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"topic")
            sub.connect(f"tcp://127.0.0.1:{port}")
            # A subscription takes a moment to reach the publisher: publish
            # a probe until one arrives, then the numbered messages.
            for _ in range(300):
                await pub.send(b"topic probe")
                if await sub.poll(timeout=100):
                    break
            else:
                raise AssertionError("the SUB socket never received the probe")
            for i in range(200):
                await pub.send(b"other %d" % i)   # filtered out by the subscription
                await pub.send(b"topic %d" % i)
            received = []
            while len(received) < 200:
                message = await asyncio.wait_for(sub.recv(), 30)
                if message != b"topic probe":
                    received.append(message)
            assert received == [b"topic %d" % i for i in range(200)]
            # No selector loop was registered for our loop (pyzmq's fallback map).
            assert asyncio.get_running_loop() not in getattr(zmq_asyncio, "_selectors", {})
        finally:
            for sock in sockets:
                sock.close()
            ctx.term()

    run_on_loop(main)
    assert selector_threads() == before


# -- tornado --------------------------------------------------------------------------------

def test_tornado_http_server_and_client():
    need("tornado")
    import tornado.platform.asyncio as tornado_asyncio
    from tornado import httpclient, httpserver, ioloop, netutil, web

    before = selector_threads()

    class Handler(web.RequestHandler):
        def get(self):
            loop = asyncio.get_running_loop()
            self.write({"n": int(self.get_argument("n")),
                        "loop": f"{type(loop).__module__}.{type(loop).__qualname__}"})

        def post(self):
            self.write(self.request.body[::-1])

    async def main():
        io_loop = ioloop.IOLoop.current()
        # tornado wraps the running loop; on Proactor it would put an
        # AddThreadSelectorEventLoop in selector_loop instead of the loop itself.
        assert io_loop.asyncio_loop is asyncio.get_running_loop()
        assert io_loop.selector_loop is io_loop.asyncio_loop
        sockets = netutil.bind_sockets(0, "127.0.0.1")
        port = sockets[0].getsockname()[1]
        server = httpserver.HTTPServer(web.Application([(r"/", Handler)]))
        server.add_sockets(sockets)
        # The simple client: tornado's IOStream over add_reader/add_writer.
        client = httpclient.AsyncHTTPClient(force_instance=True)
        try:
            responses = await asyncio.gather(*(
                client.fetch(f"http://127.0.0.1:{port}/?n={i}") for i in range(40)))
            bodies = [json.loads(r.body) for r in responses]
            assert [b["n"] for b in bodies] == list(range(40))
            ours = f"{socknotify_loop.Loop.__module__}.{socknotify_loop.Loop.__qualname__}"
            assert {b["loop"] for b in bodies} == {ours}
            payload = bytes(range(256)) * 2048  # 512 KiB each way
            response = await client.fetch(f"http://127.0.0.1:{port}/", method="POST",
                                          body=payload, request_timeout=60,
                                          headers={"Content-Type": "application/octet-stream"})
            assert response.body == payload[::-1]
        finally:
            client.close()
            server.stop()
            await server.close_all_connections()
        # tornado's registry of the selector threads it started.
        assert not getattr(tornado_asyncio, "_selector_loops", set())

    run_on_loop(main)
    assert selector_threads() == before


# -- aiohttp --------------------------------------------------------------------------------

def test_aiohttp_server_and_client():
    aiohttp = need("aiohttp")
    from aiohttp import web

    async def hello(request):
        return web.json_response({"n": int(request.query["n"])})

    async def echo(request):
        return web.Response(body=(await request.read())[::-1])

    async def websocket(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            await ws.send_str(message.data.upper())
        return ws

    async def main():
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.add_routes([web.get("/", hello), web.post("/echo", echo),
                        web.get("/ws", websocket)])
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            base = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as session:
                async def get(i):
                    async with session.get(f"{base}/?n={i}") as response:
                        assert response.status == 200
                        return (await response.json())["n"]

                assert await asyncio.gather(*(get(i) for i in range(100))) == list(range(100))
                payload = bytes(range(256)) * 4096  # 1 MiB
                async with session.post(f"{base}/echo", data=payload) as response:
                    assert await response.read() == payload[::-1]
                async with session.ws_connect(f"{base}/ws") as ws:
                    for i in range(20):
                        await ws.send_str(f"message {i}")
                        assert (await ws.receive()).data == f"MESSAGE {i}"
        finally:
            await runner.cleanup()

    run_on_loop(main)


# -- subprocess pipes beside sockets ------------------------------------------------------------

CHILD = """\
import sys, time
for i in range(60):
    sys.stdout.write("line %d\\n" % i)
    sys.stdout.flush()
    time.sleep(0.01)
"""


IDLE_CONNECTIONS = 300  # 600 sockets in this process, with both ends


def test_subprocess_streaming_beside_sockets():
    """A child's stdout streamed through a pipe while 4 clients keep echoing
    and 300 more connections (600 sockets: past select()'s 512) stay open."""
    async def main():
        async def echo(reader, writer):
            while True:
                line = await reader.readline()
                if not line:
                    break
                writer.write(line)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=128)
        port = server.sockets[0].getsockname()[1]
        streaming = asyncio.Event()
        finished = asyncio.Event()
        during = []

        async def child():
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CHILD, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE)
            lines = []
            async for line in proc.stdout:
                lines.append(line.decode().rstrip("\r\n"))
                streaming.set()
            finished.set()
            assert await proc.wait() == 0
            return lines

        async def client(k):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            count = 0
            deadline = time.monotonic() + 60
            # Keep the sockets busy until the child has streamed everything.
            while count < 20 or not finished.is_set():
                message = f"client {k} message {count}\n".encode()
                writer.write(message)
                assert await reader.readline() == message
                if streaming.is_set() and not finished.is_set():
                    during.append(k)
                count += 1
                if time.monotonic() > deadline:
                    raise AssertionError("the child never finished streaming")
            writer.close()
            await writer.wait_closed()
            return count

        async def open_idle(count):
            # More connections than select() could watch (512 sockets on
            # Windows), held open across the child's run; opened in batches
            # so the listen backlog never overflows.
            idle = []
            for first in range(0, count, 50):
                idle += await asyncio.gather(*(
                    asyncio.open_connection("127.0.0.1", port)
                    for _ in range(first, min(count, first + 50))))
            return idle

        async with server:
            idle = await open_idle(IDLE_CONNECTIONS)
            start = time.monotonic()
            lines, *counts = await asyncio.gather(child(), *(client(k) for k in range(4)))
            # Every idle connection is still served after the child's run.
            for index, (_reader, writer) in enumerate(idle):
                writer.write(b"idle %d\n" % index)
            for index, (reader, writer) in enumerate(idle):
                assert await reader.readline() == b"idle %d\n" % index
                writer.close()
            await asyncio.gather(*(writer.wait_closed() for _, writer in idle))
        assert lines == [f"line {i}" for i in range(60)], lines
        assert all(count >= 20 for count in counts), counts
        # Socket round trips completed while the pipe was streaming.
        assert set(during) == {0, 1, 2, 3}, (during, time.monotonic() - start)

    run_on_loop(main)
