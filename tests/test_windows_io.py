"""Overlapped I/O on the loop's port (Windows): subprocesses, pipes, named
pipes and port wake-ups, next to sockets served by add_reader.

CPython's own suites for the same features run in tests/conformance/
(SubprocessTestsMixin, SubprocessMixin, the named-pipe tests); these are
the behaviours they do not cover: both kinds of completion on one port at
scale, a process killed mid-stream, handles not leaked, close() draining.
"""
from __future__ import annotations

import asyncio
import gc
import signal
import socket
import sys
import threading
import time

import pytest
from _platform import open_handles, running_under_wine

import socknotify_loop
from socknotify_loop.selector import NotifySelector

WINDOWS = sys.platform == "win32"
windows_only = pytest.mark.skipif(not WINDOWS, reason="Windows overlapped I/O")

if WINDOWS:
    from asyncio import windows_utils

# A child that writes `count` numbered lines, flushing each, `pause` s apart.
STREAMER = ("import sys, time\n"
            "count, pause = int(sys.argv[1]), float(sys.argv[2])\n"
            "for i in range(count):\n"
            "    sys.stdout.write(f'line {i}\\n'); sys.stdout.flush()\n"
            "    time.sleep(pause)\n")


#: Wine 8.0's CreateProcess fails with ERROR_INTERNAL_ERROR when the new
#: process ends before reporting that it started and leaves no exit status
#: (dlls/ntdll/unix/process.c, NtCreateUserProcess); seen only on a loaded
#: machine, in the process creation itself, before any loop code runs.
WINE_SPAWN_FAILED = 1359


#: How many times spawn() tries to start a process under Wine.
SPAWN_ATTEMPTS = 3


async def spawn(*args, **kwargs):
    """asyncio.create_subprocess_exec, tried again (SPAWN_ATTEMPTS in all)
    when Wine itself fails to start the process; the last try's error
    stands, and anywhere else the first error stands."""
    for _ in range(SPAWN_ATTEMPTS - 1):
        try:
            return await asyncio.create_subprocess_exec(*args, **kwargs)
        except OSError as exc:
            if getattr(exc, "winerror", None) != WINE_SPAWN_FAILED or not running_under_wine():
                raise
    return await asyncio.create_subprocess_exec(*args, **kwargs)


@pytest.fixture
def loop():
    loop = socknotify_loop.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()
    gc.collect()   # a transport left unclosed warns here, in its own test


def run(loop, coro, timeout=60):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


# -- the selector: which notifications are I/O completions ----------------------

@windows_only
def test_io_completion_is_never_taken_for_a_socket():
    """An OVERLAPPED address that equals a registration's tag is an I/O
    completion (EVENT_IO), not readiness of that socket: the core keeps the
    two apart, and select() hands the completion to the selector's
    io_completion_handler (and raises without one: nobody would finish it)."""
    import ctypes

    from socknotify_loop.port import IO_COMPLETION_KEY
    post = ctypes.windll.kernel32.PostQueuedCompletionStatus
    post.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p]
    selector = NotifySelector()
    a, b = socket.socketpair()
    try:
        key = selector.register(a, 1)   # EVENT_READ
        tag = selector._records[key.fd].tag
        assert post(selector.port.os_handle, 0, IO_COMPLETION_KEY, tag)
        with pytest.raises(RuntimeError, match="io_completion_handler"):
            selector.select(1)
        completed = []
        selector.io_completion_handler = completed.extend
        assert post(selector.port.os_handle, 0, IO_COMPLETION_KEY, tag)
        # The completion alone ends the wait: its handler scheduled work
        # the caller's loop must run (a wait that went on would take 30 s).
        started = time.monotonic()
        assert selector.select(30) == []
        assert time.monotonic() - started < 15
        assert completed == [tag]
        b.send(b"x")
        assert [k.fileobj for k, _ in selector.select(1)] == [a]
    finally:
        selector.close()
        a.close()
        b.close()


# -- subprocesses -----------------------------------------------------------------

@windows_only
def test_loop_has_a_proactor_on_its_own_port(loop):
    assert loop._proactor._iocp == loop._selector.port.os_handle
    assert isinstance(loop, asyncio.SelectorEventLoop)
    # The selector's I/O completions go to that proactor, and nowhere else.
    assert loop._selector.io_completion_handler == loop._proactor.complete


@windows_only
def test_a_cancelled_wait_leaves_the_cache(loop):
    """wait_for_handle() cancelled: its operation is unregistered, and the
    loop drops it from the proactor's cache after the next wait, so the
    cache does not grow and nothing is reported as unexpected."""
    import _overlapped
    import _winapi
    errors = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    event = _overlapped.CreateEvent(None, True, False, None)
    try:
        async def main():
            for _ in range(3):
                fut = loop._proactor.wait_for_handle(event, 10)
                await asyncio.sleep(0.02)
                fut.cancel()
                await asyncio.gather(fut, return_exceptions=True)
            for _ in range(100):
                if loop._proactor.pending == 0:
                    break
                await asyncio.sleep(0.01)

        run(loop, main())
        assert loop._proactor.pending == 0
        assert errors == []
    finally:
        _winapi.CloseHandle(event)


@windows_only
def test_subprocess_output_streams_while_1000_sockets_are_served(loop):
    """One port: a child's stdout (overlapped pipe reads) and 1000 sockets
    (notifications, add_reader) make progress side by side."""
    pairs = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    try:
        for _ in range(1000):
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
            client.setblocking(False)
            server.setblocking(False)
            pairs.append((client, server))
    finally:
        listener.close()
    echoes = [0]

    def on_readable(sock):
        data = sock.recv(4096)
        if data:
            echoes[0] += 1
            sock.send(data)   # back to the client side, which reads it too

    for client, server in pairs:
        loop.add_reader(server, on_readable, server)
        loop.add_reader(client, lambda c=client: c.recv(4096))

    async def main():
        proc = await spawn(
            sys.executable, "-c", STREAMER, "40", "0.005",
            stdout=asyncio.subprocess.PIPE)
        lines = []
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            # Traffic on a slice of the sockets between lines of output.
            for client, _server in pairs[(len(lines) * 25) % 1000:][:25]:
                client.send(b"x")
        await proc.wait()
        deadline = time.monotonic() + 30
        while echoes[0] < len(lines) * 25 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return proc.returncode, lines

    try:
        returncode, lines = run(loop, main(), 120)
        assert returncode == 0
        assert lines == [f"line {i}".encode() for i in range(40)]
        assert echoes[0] == 40 * 25
    finally:
        for client, server in pairs:
            loop.remove_reader(client)
            loop.remove_reader(server)
            client.close()
            server.close()


@windows_only
def test_subprocess_killed_mid_stream(loop):
    async def main():
        proc = await spawn(
            sys.executable, "-c", STREAMER, "100000", "0.001",
            stdout=asyncio.subprocess.PIPE)
        first = await proc.stdout.readline()
        assert first.startswith(b"line 0")
        proc.kill()
        rest = await proc.stdout.read()   # to EOF (ERROR_BROKEN_PIPE)
        returncode = await proc.wait()
        return returncode, rest

    returncode, rest = run(loop, main())
    assert returncode != 0
    assert rest == b"" or rest.endswith(b"\n") or b"line" in rest


@windows_only
def test_subprocess_shell_and_stdin(loop):
    async def main():
        proc = await asyncio.create_subprocess_shell(
            f'"{sys.executable}" -c "import sys; sys.stdout.write(sys.stdin.read().upper())"',
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate(b"through the port")
        return proc.returncode, out

    assert run(loop, main()) == (0, b"THROUGH THE PORT")


# -- pipes ---------------------------------------------------------------------

@windows_only
def test_connect_read_and_write_pipe(loop):
    # Duplex, as windows_utils.Popen makes them: the write transport reads
    # its end to learn the reader went away (as on ProactorEventLoop).
    read_end, write_end = windows_utils.pipe(overlapped=(True, True), duplex=True)
    reader_pipe = windows_utils.PipeHandle(read_end)
    writer_pipe = windows_utils.PipeHandle(write_end)

    async def main():
        stream = asyncio.StreamReader()
        reading, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), reader_pipe)
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, writer_pipe)
        transport.write(b"hello ")
        transport.write(b"pipe")
        transport.close()
        data = await stream.read()
        # StreamReaderProtocol keeps the transport open at EOF (as on any
        # loop): its owner closes it. Then both let go of their handles.
        reading.close()
        for _ in range(200):
            if reading._sock is None and transport._sock is None:
                break
            await asyncio.sleep(0.01)
        return data, reading._sock, transport._sock

    assert run(loop, main()) == (b"hello pipe", None, None)


@windows_only
def test_named_pipe_server_and_client(loop):
    address = rf"\\.\pipe\socknotify_loop_test_{id(loop)}"

    lost = []

    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(data.upper())

        def eof_received(self):
            self.transport.close()

        def connection_lost(self, exc):
            lost.append(exc)

    async def main():
        [server] = await loop.start_serving_pipe(Echo, address)
        answers = []
        for word in (b"one", b"two", b"three"):
            stream = asyncio.StreamReader()
            transport, _ = await loop.create_pipe_connection(
                lambda stream=stream: asyncio.StreamReaderProtocol(stream), address)
            transport.write(word)
            answers.append(await stream.readexactly(len(word)))
            transport.close()
        server.close()
        # The server side sees each client go (and closes its transport).
        while len(lost) < 3:
            await asyncio.sleep(0.01)
        return answers

    assert run(loop, main()) == [b"ONE", b"TWO", b"THREE"]


# -- wake-ups -------------------------------------------------------------------

@windows_only
def test_call_soon_threadsafe_posts_to_the_port(loop, monkeypatch):
    posted = []
    port = loop._selector.port
    original = port.post
    monkeypatch.setattr(port, "post", lambda key: (posted.append(key), original(key)))
    woken = loop.create_future()

    def later():
        time.sleep(0.2)
        loop.call_soon_threadsafe(woken.set_result, time.monotonic())

    thread = threading.Thread(target=later)
    thread.start()
    at = run(loop, woken, 10)
    thread.join()
    assert time.monotonic() - at < 1.0
    assert posted == [0]


@windows_only
def test_a_burst_of_threadsafe_calls_posts_one_packet(loop, monkeypatch):
    posted = []
    port = loop._selector.port
    original = port.post
    monkeypatch.setattr(port, "post", lambda key: (posted.append(key), original(key)))
    ran = []
    thread = threading.Thread(
        target=lambda: [loop.call_soon_threadsafe(ran.append, i) for i in range(1000)])
    thread.start()
    thread.join()
    run(loop, asyncio.sleep(0))
    assert ran == list(range(1000))
    assert posted == [0]
    # The next call, after an iteration, wakes the loop again.
    woken = loop.create_future()
    threading.Timer(0.1, loop.call_soon_threadsafe, (woken.set_result, 1)).start()
    assert run(loop, woken, 10) == 1
    assert posted == [0, 0]


@windows_only
def test_ctrl_c_interrupts_a_loop_waiting_on_a_pipe(loop):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")

    async def wait_on_child():
        proc = await spawn(
            sys.executable, "-c", "import time; time.sleep(20)",
            stdout=asyncio.subprocess.PIPE)
        try:
            await proc.stdout.read()
        finally:
            proc.kill()
            await proc.communicate()

    raised_at = []

    def raise_sigint():
        time.sleep(1.0)
        raised_at.append(time.monotonic())
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        thread = threading.Thread(target=raise_sigint)
        thread.start()
        task = loop.create_task(wait_on_child())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(task)
        caught_at = time.monotonic()
        thread.join()
        assert caught_at - raised_at[0] < 0.5, caught_at - raised_at[0]
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        signal.signal(signal.SIGINT, previous)


@windows_only
def test_a_run_cut_right_after_it_set_the_wakeup_fd_leaves_later_runs_working(monkeypatch):
    """A Ctrl+C landing right after run_forever() pointed the signal wakeup
    descriptor at the loop's self-pipe must not leave it there: once the
    loop closed its self-pipe, every later run in the main thread would
    fail restoring a handle Windows' set_wakeup_fd refuses."""
    real = signal.set_wakeup_fd
    cut = []

    def set_then_cut(fd, *args, **kwargs):
        previous = real(fd, *args, **kwargs)
        if not cut:
            cut.append(fd)
            raise KeyboardInterrupt   # a signal handler's, as the call returns
        return previous

    loop = socknotify_loop.new_event_loop()
    try:
        monkeypatch.setattr(signal, "set_wakeup_fd", set_then_cut)
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(0))
        monkeypatch.undo()
    finally:
        loop.close()
    assert cut, "the loop did not set the wakeup descriptor"
    assert signal.set_wakeup_fd(-1) == -1   # nothing left on the closed self-pipe
    for _ in range(2):
        again = socknotify_loop.new_event_loop()
        try:
            assert again.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
        finally:
            again.close()


# -- life cycle --------------------------------------------------------------------

@windows_only
def test_close_cancels_and_drains_pending_reads():
    """A read still pending at close(): cancelled, its completion dequeued
    before the port closes (the kernel owns its buffer until then)."""
    loop = socknotify_loop.new_event_loop()
    read_end, write_end = windows_utils.pipe(overlapped=(True, True))
    reader_pipe = windows_utils.PipeHandle(read_end)
    try:
        async def start():
            transport, _ = await loop.connect_read_pipe(asyncio.Protocol, reader_pipe)
            await asyncio.sleep(0.05)
            return transport

        transport = loop.run_until_complete(start())
        proactor = loop._proactor
        selector = loop._selector
        assert proactor.pending >= 1
        loop.close()
        assert proactor.pending == 0
        assert loop._selector is None
        assert selector.io_completion_handler is None
        # The loop is gone, so transport.close() cannot schedule anything:
        # the pipe is closed below; the transport just forgets it.
        transport._sock = None
    finally:
        reader_pipe.close()
        windows_utils.PipeHandle(write_end).close()


@windows_only
def test_no_handle_leaks():
    def cycle():
        loop = socknotify_loop.new_event_loop()
        try:
            async def main():
                for _ in range(5):
                    proc = await spawn(
                        sys.executable, "-c", "import sys; print(sys.stdin.read())",
                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE)
                    out, _ = await proc.communicate(b"x" * 1000)
                    assert out.strip() == b"x" * 1000
                proc = await spawn(
                    sys.executable, "-c", STREAMER, "100000", "0.001",
                    stdout=asyncio.subprocess.PIPE)
                await proc.stdout.readline()
                proc.kill()
                await proc.communicate()   # to EOF: the transports close

            run(loop, main(), 120)
        finally:
            loop.close()

    cycle()   # first use loads DLLs, creates caches
    import gc
    gc.collect()
    before = open_handles()
    for _ in range(3):
        cycle()
    gc.collect()
    after = open_handles()
    # A loop holds its port, self-pipe and helper handles; 3 cycles of 6
    # processes each leaking even one handle would add 18.
    assert after - before <= 3, (before, after)
