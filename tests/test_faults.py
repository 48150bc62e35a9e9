"""Regression tests for faults found in the port, the selector and the loop.

Each test states the behaviour the code must have; they go through the
public API only (Port, Registration, NotifySelector, Loop). Scenarios that
crashed or hung run in a child Python with a timeout, and the test asserts
on its exit status and output, so a regression fails the test instead of
taking the whole run down. Waits in threads are joined with timeouts and
unblocked with a posted packet before failing.
"""
from __future__ import annotations

import asyncio
import errno
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
from _platform import WINDOWS, WINE_PORT_CLOSE_RACE, linux_only, running_under_wine, windows_only
from _sockets import fill_send_buffer, nonblocking_pair, tcp_pair

from socknotify_loop import Loop
from socknotify_loop.port import EVENT_IN, Port, Registration
from socknotify_loop.selector import WAKEUP_KEY, NotifySelector

READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE

# CPU a one-second idle wait may burn. A spinning core burns the whole second.
IDLE_CPU_LIMIT = 0.2


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def run_child(code: str, timeout: float = 60.0, env=None) -> str:
    """Run ``code`` in a child Python; it must exit 0 within ``timeout``.
    Returns its stdout. A crash (negative return code: the signal), a
    failed assertion or a hang fails the calling test with the child's
    output."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    code = textwrap.dedent(code)
    if WINDOWS:
        # A crash must end the child, not start Wine's (or Windows') crash
        # debugger, which keeps it alive: SEM_FAILCRITICALERRORS |
        # SEM_NOGPFAULTERRORBOX.
        code = "import ctypes; ctypes.windll.kernel32.SetErrorMode(3)\n" + code
    # Output goes to files, not pipes: a killed child's descendants (a
    # crash debugger) cannot keep us waiting for the pipes to close.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # From a neutral folder: `python -c` puts the current directory
        # first on sys.path, and from the repository root that is the
        # source tree (no compiled core under tox); the installed copy the
        # tests use must be what the child imports.
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=err, env=child_env, text=True,
                                 cwd=tempfile.gettempdir())
        try:
            returncode = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
            returncode = None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if returncode is None:
        pytest.fail(f"the child hung (killed after {timeout} s); output: "
                    f"{stdout[-3000:]!r} {stderr[-3000:]!r}")
    signal_note = f" (killed by signal {-returncode})" if returncode < 0 else ""
    assert returncode == 0, (
        f"child exited with {returncode} ({returncode & 0xFFFFFFFF:#x}){signal_note}:\n"
        f"stdout: {stdout[-3000:]}\nstderr: {stderr[-3000:]}")
    return stdout


def wait_in_thread(target, timeout: float):
    """Run ``target()`` in a daemon thread; returns (finished, result-or-exception)."""
    box = []

    def runner():
        try:
            box.append(("ok", target()))
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            box.append(("raised", exc))

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    thread.join(timeout)
    return (not thread.is_alive()), (box[0] if box else None), thread


# -- 1. close() racing a thread in process(): never a crash -------------------------


def test_close_racing_process_never_crashes(backend):
    """Threads poll the port in a loop while the main thread closes it,
    thousands of times (for 8 s at most): no crash (a use-after-free in
    post killed the child with SIGSEGV), and once close() has returned,
    process() and post() raise ValueError("I/O operation on closed port")."""
    out = run_child(f"""
        import threading, time
        from socknotify_loop.port import Port
        stop_at = time.monotonic() + 8
        repeats = 0
        while repeats < 20000 and time.monotonic() < stop_at:
            repeats += 1
            port = Port({backend!r})
            started = threading.Event()

            def poll():
                started.set()
                while True:
                    try:
                        port.process([], 0)
                    except ValueError as exc:
                        assert "closed port" in str(exc), exc
                        return

            threads = [threading.Thread(target=poll)]
            threads[0].start()
            started.wait()
            port.close()
            for call in (lambda: port.process([], 0), lambda: port.post(1)):
                try:
                    call()
                except ValueError as exc:
                    assert str(exc) == "I/O operation on closed port", exc
                else:
                    raise AssertionError("a closed port accepted a call")
            for thread in threads:
                thread.join(10)
                assert not thread.is_alive(), "a polling thread never saw the close"
        print("ok", repeats)
    """, timeout=120)
    assert out.split()[0] == "ok"


def test_thread_stress_close_post_process(backend):
    """Threads posting and processing while the main thread closes the port,
    a few hundred times (tests/c/run_sanitizers.sh runs this under
    AddressSanitizer): no crash, no hang, every call either works or
    raises ValueError for the closed port."""
    out = run_child(f"""
        import threading
        from socknotify_loop.port import Port
        for i in range(300):
            port = Port({backend!r})
            go = threading.Barrier(5)

            def worker(n):
                go.wait()
                while True:
                    try:
                        if n % 2:
                            port.post(n + 1)
                        got = port.process([], 0.001 if n % 2 else None)
                        assert isinstance(got, list), got
                    except ValueError as exc:
                        assert "closed port" in str(exc), exc
                        return

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
            for t in threads:
                t.start()
            go.wait()
            port.close()
            for t in threads:
                t.join(10)
                assert not t.is_alive(), "a thread was left behind by close()"
        print("ok")
    """, timeout=120)
    assert out.split() == ["ok"]


# -- 2. close() wakes every waiter ----------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("waiters", [2, 4])
def test_close_wakes_every_waiter(backend, waiters):
    """close() makes every thread blocked in process([], None) return (a
    list, possibly empty) and returns only once they left the port and its
    descriptors are closed."""
    out = run_child(f"""
        import os, sys, threading, time
        from socknotify_loop.port import Port
        LINUX = sys.platform.startswith("linux")
        count = (lambda: len(os.listdir("/proc/self/fd"))) if LINUX else (lambda: 0)
        before = count()
        port = Port({backend!r})
        results = {{}}

        def wait(n):
            try:
                results[n] = port.process([], None)
            except BaseException as exc:
                results[n] = exc

        threads = [threading.Thread(target=wait, args=(n,), daemon=True)
                   for n in range({waiters})]
        for t in threads:
            t.start()
        time.sleep(0.3)     # all of them inside the wait
        assert not results, results
        start = time.monotonic()
        port.close()
        closed_in = time.monotonic() - start
        after = count()
        for t in threads:
            t.join(max(0.1, 3 - (time.monotonic() - start)))
        stuck = sum(t.is_alive() for t in threads)
        print("closed_in", round(closed_in, 3), "fds", before, after, "stuck", stuck)
        assert stuck == 0, f"{{stuck}} of {waiters} waiters still blocked after close()"
        for n, got in results.items():
            assert isinstance(got, list), (n, got)
        assert closed_in < 2.0, closed_in
        assert after == before, ("close() returned with the port's descriptors open",
                                 before, after)
        print("ok")
    """, timeout=30)
    assert out.split()[-1] == "ok"


# -- 3. a registration that can never succeed -------------------------------------------


def _register_outcome(selector, fileobj, events=READ):
    try:
        selector.register(fileobj, events)
    except (OSError, ValueError, KeyError) as exc:
        return type(exc), getattr(exc, "errno", None)
    return None, None


@linux_only
@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["regular file", "/dev/null"])
def test_register_unpollable_file_raises_like_epoll(what):
    """Registering a regular file (or /dev/null) raises PermissionError at
    register(), as EpollSelector does, and leaves nothing registered."""
    if what == "regular file":
        f = tempfile.TemporaryFile()
    else:
        f = open(os.devnull, "rb")
    with f, selectors.EpollSelector() as reference, NotifySelector() as sel:
        expected = _register_outcome(reference, f)
        assert expected == (PermissionError, errno.EPERM)
        assert _register_outcome(sel, f) == expected
        assert f not in sel.get_map() and f.fileno() not in sel.get_map()
        assert len(sel.get_map()) == 0
        assert sel.select(0) == []


@linux_only
@pytest.mark.timeout(30)
def test_register_fd_not_open_raises_ebadf_and_number_is_reusable():
    """A descriptor that is not open: OSError(EBADF) at register(); nothing
    registered; registering a good socket that gets the same number works."""
    with selectors.EpollSelector() as reference, NotifySelector() as sel:
        a, b = nonblocking_pair()
        # A number that is not open (taken after the selectors' and the
        # pair's own, so the pair cannot land on it).
        fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)
        assert _register_outcome(reference, fd) == (OSError, errno.EBADF)
        assert _register_outcome(sel, fd) == (OSError, errno.EBADF)
        assert fd not in sel.get_map()
        with a, b:
            os.dup2(a.fileno(), fd)
            try:
                sel.register(fd, READ)
                b.send(b"x")
                deadline = time.monotonic() + 2
                ready = []
                while not ready and time.monotonic() < deadline:
                    ready = sel.select(0.1)
                assert [(key.fd, mask) for key, mask in ready] == [(fd, READ)]
            finally:
                sel.unregister(fd)
                os.close(fd)


@linux_only
@pytest.mark.timeout(30)
def test_modify_to_unpollable_file_raises_like_epoll():
    """modify() of a registered descriptor number that now names a regular
    file raises what EpollSelector raises, and leaves what it leaves."""
    outcomes = []
    with tempfile.TemporaryFile() as f:
        for make in (selectors.EpollSelector, NotifySelector):
            a, b = nonblocking_pair()
            fd = os.dup(a.fileno())
            with a, b, make() as sel:
                try:
                    sel.register(fd, READ)
                    sel.select(0)
                    os.dup2(f.fileno(), fd)   # the number now names the file
                    try:
                        sel.modify(fd, READ | WRITE)
                    except (OSError, ValueError, KeyError) as exc:
                        got = (type(exc), getattr(exc, "errno", None))
                    else:
                        got = (None, None)
                    outcomes.append((got, fd in sel.get_map()))
                finally:
                    os.close(fd)
    assert outcomes[0][0] == (PermissionError, errno.EPERM)
    assert outcomes[1] == outcomes[0]


@linux_only
@pytest.mark.timeout(30)
def test_loop_add_reader_regular_file_raises():
    """loop.add_reader() of a regular file raises PermissionError at once
    (it used to be accepted and the next run_until_complete never ended)."""
    loop = Loop()
    try:
        with tempfile.TemporaryFile() as f:
            with pytest.raises(PermissionError):
                loop.add_reader(f.fileno(), lambda: None)
            # Nothing left behind: the loop still runs and stops.
            done = loop.run_until_complete(asyncio.wait_for(asyncio.sleep(0.01, "done"), 5))
            assert done == "done"
            assert not loop.remove_reader(f.fileno())
    finally:
        loop.close()


def _unpollable_object():
    """Something every backend refuses to poll, and a cleanup."""
    if WINDOWS:
        # A file's CRT descriptor is not a SOCKET handle.
        f = tempfile.TemporaryFile()
        return f, f.close
    f = tempfile.TemporaryFile()
    return f, f.close


@pytest.mark.timeout(30)
def test_failed_change_never_leaves_select_blocked(backend):
    """Whatever register() does with an object the backend cannot poll,
    a select(None) that follows must return (or raise): a failed change
    may not be forgotten while the wait blocks forever."""
    obj, cleanup = _unpollable_object()
    sel = NotifySelector(backend)
    try:
        try:
            sel.register(obj, READ)
        except (OSError, ValueError):
            registered = False
        else:
            registered = True
        if registered:
            finished, _outcome, _ = wait_in_thread(lambda: sel.select(None), 5)
            if not finished:
                sel.port.post(WAKEUP_KEY)   # unblock it before failing
                pytest.fail("select(None) blocked on a registration that cannot succeed")
        else:
            assert obj not in sel.get_map()
    finally:
        sel.close()
        cleanup()


# -- 4. no spin on a registration the core can no longer remove ----------------------------


def _idle_select_cost(sel, timeout=1.0):
    wall, cpu = time.monotonic(), time.process_time()
    ready = sel.select(timeout)
    return ready, time.monotonic() - wall, time.process_time() - cpu


@linux_only
@pytest.mark.timeout(30)
@pytest.mark.parametrize("keeper", ["dup", "child"])
def test_closed_but_still_open_elsewhere_does_not_spin(keeper):
    """A readable socket, reported once, whose descriptor lives on elsewhere
    (os.dup, or a child process holding it) is unregistered and closed:
    epoll keeps the item, so the next select(1.0) must neither spin nor
    report it."""
    a, b = nonblocking_pair()
    child = None
    sel = NotifySelector("epoll")
    try:
        sel.register(a, READ)
        b.send(b"unread")
        assert [mask for _key, mask in sel.select(1.0)] == [READ]
        if keeper == "dup":
            kept = os.dup(a.fileno())
        else:
            kept = None
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                     pass_fds=[a.fileno()], stdin=subprocess.DEVNULL)
        sel.unregister(a)
        a.close()
        ready, wall, cpu = _idle_select_cost(sel, 1.0)
        assert ready == []
        assert wall >= 0.9, wall
        assert cpu < IDLE_CPU_LIMIT, f"select(1.0) burnt {cpu:.2f} s of CPU"
        if kept is not None:
            os.close(kept)
    finally:
        sel.close()
        b.close()
        a.close()
        if child is not None:
            child.kill()
            child.wait()


@linux_only
@pytest.mark.timeout(60)
def test_loop_handles_sigint_promptly_after_closed_dup():
    """The same state in a running Loop: SIGINT raised from a timer thread
    turns into KeyboardInterrupt within half a second."""
    out = run_child("""
        import asyncio, os, signal, socket, threading, time
        from socknotify_loop import Loop
        # Python turns SIGINT into KeyboardInterrupt only if SIGINT was not
        # ignored when it started, and a job that a non-interactive shell
        # starts in the background starts with SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loop = Loop()
        a, b = socket.socketpair()
        a.setblocking(False)
        seen = asyncio.Event()
        loop.add_reader(a.fileno(), seen.set)
        b.send(b"unread")
        loop.run_until_complete(asyncio.wait_for(seen.wait(), 5))
        kept = os.dup(a.fileno())
        loop.remove_reader(a.fileno())
        a.close()
        sent = []
        def interrupt():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(0.3, interrupt).start()
        cpu = time.process_time()
        try:
            loop.run_until_complete(asyncio.sleep(5))
        except KeyboardInterrupt:
            late = time.monotonic() - sent[0]
        else:
            raise AssertionError("no KeyboardInterrupt")
        cpu = time.process_time() - cpu
        print("late", round(late, 3), "cpu", round(cpu, 3))
        assert late < 0.5, f"SIGINT handled {late:.2f} s late"
        assert cpu < 0.3, f"{cpu:.2f} s of CPU while waiting"
        print("ok")
    """, timeout=30)
    assert out.split()[-1] == "ok"


# -- 5. no spurious write readiness on a half-closed socket -----------------------------


def _half_closed_full_pair(family):
    if family == "unix":
        a, b = socket.socketpair()
    else:
        a, b = tcp_pair(sndbuf=16384)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    a.setblocking(False)
    b.setblocking(False)
    fill_send_buffer(a)
    time.sleep(0.05)        # TCP: let the window close, then fill what it freed
    fill_send_buffer(a)
    b.shutdown(socket.SHUT_WR)
    time.sleep(0.05)        # the FIN reaches a
    return a, b


@pytest.mark.timeout(30)
@pytest.mark.parametrize("family", ["unix", "tcp"])
@pytest.mark.parametrize("events", [READ, WRITE, READ | WRITE], ids=["R", "W", "RW"])
def test_half_closed_full_socket_masks_match_reference(backend, family, events):
    """Full send buffer, peer did shutdown(SHUT_WR): NotifySelector reports
    exactly what the stdlib reports (READ for EOF, no WRITE): EpollSelector
    on Linux, SelectSelector on Windows (TCP only there)."""
    if family == "unix" and WINDOWS:
        pytest.skip("socketpair() is TCP on Windows")
    reference = selectors.SelectSelector() if WINDOWS else selectors.EpollSelector()
    a, b = _half_closed_full_pair(family)
    with a, b, reference, NotifySelector(backend) as sel:
        reference.register(a, events)
        sel.register(a, events)
        for _ in range(3):
            expected = sorted(mask for _key, mask in reference.select(0))
            got = sorted(mask for _key, mask in sel.select(0))
            assert got == expected
            time.sleep(0.02)


# -- 6. a port inherited by fork() belongs to the parent ----------------------------------


_FORK_PRELUDE = """
    import os, sys, threading, time, warnings
    warnings.simplefilter("ignore", DeprecationWarning)   # fork with threads
    from socknotify_loop.port import Port
    count = lambda: len(os.listdir("/proc/self/fd"))
    def child_status(pid):
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
"""


@linux_only
@pytest.mark.timeout(60)
def test_forked_child_sees_port_closed_and_close_frees_its_copies():
    """In a forked child every Port method but close() raises ValueError;
    the child's close() closes the child's copies of the port's descriptors;
    the parent's port still works."""
    out = run_child(_FORK_PRELUDE + """
    before = count()
    port = Port("epoll")
    port_fds = count() - before
    assert port_fds >= 1
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for name, call in [("process", lambda: port.process([], 0)),
                               ("post", lambda: port.post(1)),
                               ("registered", lambda: port.registered),
                               ("os_handle", lambda: port.os_handle)]:
                try:
                    call()
                except ValueError:
                    pass
                else:
                    print("child: port." + name + " did not raise ValueError", flush=True)
                    code |= 1
            have = count()
            port.close()
            if have - count() != port_fds:
                print("child: close() freed", have - count(), "of", port_fds, flush=True)
                code |= 2
        except BaseException as exc:
            print("child:", repr(exc), flush=True)
            code |= 4
        os._exit(code)
    assert child_status(pid) == 0, "the child's checks failed"
    port.post(5)
    assert port.process([], 1.0) == [(5, 0)]
    port.close()
    print("ok")
    """, timeout=30)
    assert out.split()[-1] == "ok"


@linux_only
@pytest.mark.timeout(60)
def test_forked_child_post_does_not_make_parent_spin():
    """A child's post() on the inherited port (refused with ValueError) must
    not leave the parent's next process(1.0) spinning or reporting it."""
    out = run_child(_FORK_PRELUDE + """
    port = Port("epoll")
    pid = os.fork()
    if pid == 0:
        try:
            port.post(9)
        except ValueError:
            os._exit(0)
        os._exit(3)
    status = child_status(pid)
    wall, cpu = time.monotonic(), time.process_time()
    got = port.process([], 1.0)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    print("child", status, "got", got, "wall", round(wall, 3), "cpu", round(cpu, 3))
    assert got == [], got
    assert cpu < 0.2, "process(1.0) burnt %.2f s of CPU" % cpu
    assert wall >= 0.9, wall
    assert status == 0, "the child's post() did not raise ValueError"
    print("ok")
    """, timeout=30)
    assert out.split()[-1] == "ok"


@linux_only
@pytest.mark.timeout(60)
def test_forked_child_close_leaves_parent_waiter_alone():
    """A parent thread waits in process(None) while a forked child closes
    the inherited port: the child's copies are closed, the parent thread
    keeps waiting and receives the parent's next post."""
    out = run_child(_FORK_PRELUDE + """
    before = count()
    port = Port("epoll")
    port_fds = count() - before
    got = []
    waiter = threading.Thread(target=lambda: got.append(port.process([], None)), daemon=True)
    waiter.start()
    time.sleep(0.2)
    pid = os.fork()
    if pid == 0:
        have = count()
        try:
            port.close()
        except BaseException as exc:
            print("child:", repr(exc), flush=True)
            os._exit(4)
        freed = have - count()
        os._exit(0 if freed == port_fds else 2)
    status = child_status(pid)
    time.sleep(0.3)
    woken_by_child = list(got)
    port.post(7)
    waiter.join(3)
    print("child", status, "early", woken_by_child, "got", got)
    assert woken_by_child == [], "the child's close() woke the parent's waiter"
    assert got == [[(7, 0)]], got
    assert status == 0, "the child's close() did not close its copies (%d)" % status
    port.close()
    print("ok")
    """, timeout=30)
    assert out.split()[-1] == "ok"


# -- 7. held notifications survive an invalid call --------------------------------------------


def _closed_socket_number():
    s = socket.socket()
    number = s.fileno()
    s.close()
    return number


def _hold_a_notification(port):
    """A readable socket's notification (key 1) dequeued by a call whose
    other registration fails: held for the next call."""
    a, b = nonblocking_pair()
    b.send(b"x")
    regs = [Registration(a, 1, EVENT_IN), Registration(_closed_socket_number(), 2, EVENT_IN)]
    # A positive timeout: the call returns as soon as `a` is reported (the
    # afd backend completes its poll asynchronously).
    with pytest.raises(OSError):
        port.process(regs, 1.0)
    return a, b


@pytest.mark.timeout(30)
@pytest.mark.parametrize("invalid", [
    pytest.param(lambda a: Registration(a, 3, 0x1000), id="events=0x1000"),
    pytest.param(lambda a: Registration(-1, 3, EVENT_IN), id="fd=-1"),
    pytest.param(lambda a: Registration(a, -5, EVENT_IN), id="key=-5"),
])
def test_held_notifications_survive_invalid_registration(backend, invalid):
    port = Port(backend)
    a, b = _hold_a_notification(port)
    try:
        with pytest.raises(ValueError):
            port.process([invalid(a)], 0)
        got = port.process([], 1.0)
        assert (1, EVENT_IN) in [(key, events & EVENT_IN) for key, events in got], got
    finally:
        port.close()
        a.close()
        b.close()


@pytest.mark.timeout(30)
def test_baseline_held_notification_is_returned(backend):
    """Without the invalid call in between, the held notification comes
    out of the next call (the premise of the two tests above)."""
    port = Port(backend)
    a, b = _hold_a_notification(port)
    try:
        got = port.process([], 1.0)
        assert (1, EVENT_IN) in [(key, events & EVENT_IN) for key, events in got], got
    finally:
        port.close()
        a.close()
        b.close()


# -- 8. plain process() after a selector's rearm calls; huge max_events ----------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("drained", [False, True], ids=["unread", "drained"])
def test_plain_process_after_selecting_does_not_spin(backend, drained):
    """select() several times with a readable socket registered, then a
    plain process() on the selector's port (no re-arm): the registration
    was delivered and not re-armed, so the wait is idle, not a spin."""
    sel = NotifySelector(backend)
    a, b = nonblocking_pair()
    try:
        sel.register(a, READ)
        b.send(b"data")
        for _ in range(3):
            assert [mask for _key, mask in sel.select(1.0)] == [READ]
        if drained:
            assert a.recv(100) == b"data"
        wall, cpu = time.monotonic(), time.process_time()
        got = sel.port.process([], 1.0)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        assert got == []
        assert wall >= 0.9, wall
        assert cpu < IDLE_CPU_LIMIT, f"process(1.0) burnt {cpu:.2f} s of CPU"
    finally:
        sel.close()
        a.close()
        b.close()


@linux_only
@pytest.mark.timeout(60)
def test_huge_max_events_does_not_allocate_it():
    """process(max_events=10**8) with nothing ready may not allocate (or
    keep) a buffer for 10**8 notifications. The child's address space is
    capped so the old 1.5 GiB allocation fails instead of swapping."""
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("AddressSanitizer reserves terabytes of address space: no RLIMIT_AS cap")
    out = run_child("""
        import os, resource
        from socknotify_loop.port import Port
        page = os.sysconf("SC_PAGE_SIZE")
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page
        def vm():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[0]) * page
        resource.setrlimit(resource.RLIMIT_AS, (vm() + (768 << 20), resource.RLIM_INFINITY))
        port = Port("epoll")
        port.post(1)
        before = rss()
        got = []
        for _ in range(3):
            got += port.process([], 0, max_events=10**8)
        port.post(2)
        got += port.process([], 0, max_events=10**8)
        grown = rss() - before
        print("grown", grown >> 20, "MiB", got)
        assert got == [(1, 0), (2, 0)], got
        assert grown < (64 << 20), grown
        print("ok")
    """, timeout=30)
    assert out.split()[-1] == "ok"


# -- Windows: duplicated (shared) sockets, close during a poll, handle reuse ----------


@windows_only
@pytest.mark.timeout(60)
def test_windows_shared_socket_closed_while_registered(backend):
    """A socket duplicated with share()/fromshare() is closed while
    registered: select() neither spins nor reports stale events, including
    for a new socket that reuses the handle value."""
    sel = NotifySelector(backend)
    a, b = nonblocking_pair()
    try:
        dup = socket.fromshare(a.share(os.getpid()))
        sel.register(a, READ)
        b.send(b"unread")
        assert [mask for _key, mask in sel.select(1.0)] == [READ]
        number = a.fileno()
        sel.unregister(a)
        a.close()
        ready, wall, cpu = _idle_select_cost(sel, 1.0)
        assert ready == []
        assert wall >= 0.9, wall
        assert cpu < IDLE_CPU_LIMIT, f"select(1.0) burnt {cpu:.2f} s"
        # New sockets until one reuses the handle value, registered for READ
        # with nothing to read: nothing may be reported for it.
        fresh = []
        try:
            for _ in range(64):
                c, d = nonblocking_pair()
                fresh += [c, d]
                if number in (c.fileno(), d.fileno()):
                    break
            reuse = next((s for s in fresh if s.fileno() == number), fresh[0])
            sel.register(reuse, READ)
            ready, _wall, cpu = _idle_select_cost(sel, 0.5)
            assert ready == [], ready
            assert cpu < IDLE_CPU_LIMIT
        finally:
            for s in fresh:
                s.close()
        dup.close()
    finally:
        sel.close()
        a.close()
        b.close()


@windows_only
@pytest.mark.timeout(60)
def test_windows_close_port_during_poll(backend):
    """A registered socket and a thread waiting in process(None): close()
    wakes the thread, which returns a list."""
    port = Port(backend)
    a, b = nonblocking_pair()
    try:
        port.process([Registration(a, 1, EVENT_IN)], 0)
        box = []
        thread = threading.Thread(target=lambda: box.append(port.process([], None)), daemon=True)
        thread.start()
        time.sleep(0.3)
        port.close()
        thread.join(3)
        assert not thread.is_alive(), "the waiter stayed blocked after close()"
        assert isinstance(box[0], list)
        with pytest.raises(ValueError):
            port.process([], 0)
    finally:
        port.close()
        a.close()
        b.close()


@windows_only
@pytest.mark.timeout(60)
def test_windows_handle_reuse_after_close(backend):
    """A registered socket is closed with data pending and its handle value
    reused by a new registration under a new key: only the new key is ever
    reported, and only when its own socket is readable."""
    port = Port(backend)
    try:
        a, b = nonblocking_pair()
        b.send(b"old")
        number = a.fileno()
        port.process([Registration(a, 1, EVENT_IN)], 0)
        a.close()
        fresh = []
        try:
            for _ in range(64):
                c, d = nonblocking_pair()
                fresh += [(c, d)]
                if c.fileno() == number:
                    break
            c, d = fresh[-1]
            got = port.process([Registration(c, 2, EVENT_IN)], 0.3)
            assert all(key != 1 for key, _ in got), got
            assert all(key != 2 for key, _ in got), got   # nothing to read yet
            d.send(b"new")
            deadline, keys = time.monotonic() + 2, []
            while 2 not in keys and time.monotonic() < deadline:
                keys += [key for key, _ in port.process([], 0.1)]
            assert 2 in keys and 1 not in keys, keys
        finally:
            for c, d in fresh:
                c.close()
                d.close()
            b.close()
    finally:
        port.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timer", [False, True], ids=["no-timer", "timer-pending"])
def test_a_selector_closed_under_a_busy_loop_ends_it_with_a_clear_error(timer):
    """Another thread closes the loop's selector while the loop serves a
    hundred readable sockets: run_forever() ends with the closed
    selector's ValueError (or RuntimeError), never an IndexError from the
    loop's reading of an answer the close emptied. (Stock asyncio's
    loop meets its closed epoll object's ValueError or EBADF.) With a
    timer pending the iteration polls before it waits: the close may land
    on either call."""
    if running_under_wine():
        pytest.skip(WINE_PORT_CLOSE_RACE)
    out = run_child(f"""
        import asyncio, socket, threading
        import socknotify_loop
        errors = {{}}
        for _ in range(15):
            loop = socknotify_loop.new_event_loop()
            if {timer!r}:
                loop.call_later(3600, lambda: None)
            pairs = [socket.socketpair() for _ in range(100)]
            for a, b in pairs:
                b.send(b"x")
                loop.add_reader(a, lambda: None)
            threading.Timer(0.03, loop._selector.close).start()
            try:
                loop.run_forever()
            except Exception as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            else:
                errors["nothing"] = errors.get("nothing", 0) + 1
            for a, b in pairs:
                a.close()
                b.close()
            try:
                loop.close()
            except Exception:
                pass
        print(sorted(errors.items()))
    """)
    assert set(dict(eval(out)).keys()) <= {"ValueError", "RuntimeError"}, out
