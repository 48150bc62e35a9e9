"""Faults that ordinary programs can provoke, pinned down one by one.

On epoll: a registered descriptor closed while a dup() or a child process
keeps its file open leaves an item in the kernel that nothing can reach by
number (an *orphan*); the loop must never make one from its own close
order, and one the application makes must cost O(1) and never spin, even
while the process is out of descriptors or the kernel refuses watches; and
the port's OS handle stays the same file for pollers outside it.

Everywhere: the selector tolerates register/modify/unregister from other
threads while one thread selects, as ``selectors.EpollSelector`` does, and
a select refused because another thread is selecting loses nothing.

Spin tests assert both the CPU time and the number of waits during an idle
second: a loop that spins burns the CPU, but one that sleeps a little
between useless wake-ups would pass a CPU bound alone.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
from _platform import LINUX, WINE_CLOSE_RACE, running_under_wine
from _sockets import nonblocking_pair

from socknotify_loop import Loop
from socknotify_loop.selector import WAKEUP_KEY, NotifySelector

if LINUX:
    import resource  # POSIX only; the tests that use it are Linux's

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE

epoll_only = pytest.mark.skipif(not LINUX, reason="epoll: Linux only")

#: What an idle second may cost. Asyncio's own loop makes one wait and
#: uses well under 10 ms of CPU; a spinning loop made 480,000 waits.
IDLE_WAITS_LIMIT = 10
IDLE_CPU_LIMIT = 0.2


pair = nonblocking_pair


@contextlib.contextmanager
def copies_kept(kind, socks):
    """Keep the files of ``socks`` open behind their owner's back: with
    dup() in this process, or in a child process that inherited them (what
    a fork or multiprocessing's "fork" start method leaves behind)."""
    fds = [s.fileno() for s in socks]
    if kind == "dup":
        dups = [os.dup(fd) for fd in fds]
        try:
            yield
        finally:
            for fd in dups:
                os.close(fd)
        return
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, pass_fds=fds)
    try:
        yield
    finally:
        child.stdin.close()
        child.wait(10)


def idle_cost(port, wait):
    """(waits, CPU seconds) that ``wait()`` -- a call that should sleep
    about a second -- cost on ``port``."""
    waits = port.counters()["waits"]
    cpu = time.process_time()
    wall = time.monotonic()
    wait()
    wall = time.monotonic() - wall
    assert wall >= 0.9, f"the idle wait returned after {wall:.3f} s"
    return port.counters()["waits"] - waits, time.process_time() - cpu


def assert_idle(port, wait):
    waits, cpu = idle_cost(port, wait)
    assert waits <= IDLE_WAITS_LIMIT and cpu < IDLE_CPU_LIMIT, (
        f"an idle second cost {waits} waits and {cpu:.3f} s of CPU")


def idle_select(sel):
    assert sel.select(1.0) == []


@pytest.fixture
def sel():
    selector = NotifySelector("epoll")
    yield selector
    selector.close()


# -- orphans the loop could make itself ---------------------------------------


@epoll_only
@pytest.mark.timeout(30)
@pytest.mark.parametrize("keeper", ["dup", "child"])
@pytest.mark.parametrize("sockets", [2, 20])
def test_sock_recv_then_close_leaves_no_orphan(keeper, sockets):
    """``data = await loop.sock_recv(s, n); s.close()`` while a child holds
    copies: sock_recv's done callback removes the reader just before the
    close, and that removal must reach the kernel while the descriptor is
    open. Then the peers write, and an idle second stays idle."""
    loop = Loop(NotifySelector("epoll"))
    pairs = [pair() for _ in range(sockets)]
    try:
        with copies_kept(keeper, [s for s, _ in pairs]):
            async def serve_once():
                for s, peer in pairs:
                    # The reader is in place when the data comes, and the
                    # close follows the read in the same step.
                    loop.call_later(0.01, peer.send, b"x")
                    data = await loop.sock_recv(s, 10)
                    s.close()
                    assert data == b"x"
                for _, peer in pairs:
                    peer.send(b"ready for nobody")

            loop.run_until_complete(serve_once())
            assert_idle(loop._selector.port,
                        lambda: loop.run_until_complete(asyncio.sleep(1.0)))
    finally:
        loop.close()
        for s, peer in pairs:
            s.close()
            peer.close()


@contextlib.contextmanager
def forked_child(timeout=20.0):
    """A child made by os.fork() that holds copies of every descriptor of
    this process (the loop's epoll instance and its sockets included)
    until the block ends. It only waits: it never returns into the
    caller's code (pytest's or a loop's), and it ends with os._exit() when
    its pipe closes, or after ``timeout`` seconds at the latest."""
    release, held = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(held)
            ready, _, _ = select.select([release], [], [], timeout)
            os._exit(0 if ready else 3)
        finally:
            os._exit(4)
    os.close(release)
    try:
        yield pid
    finally:
        os.close(held)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError("the forked child did not end when released")
            time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
        f"the forked child ended with status {status:#x} (3: its {timeout} s ran out)"


def epoll_watched_files(epfd):
    """The inode numbers of the files epoll instance ``epfd`` has items
    for: one ``tfd:`` line per item in /proc/self/fdinfo, which lists an
    orphan too (its file is open elsewhere; its number may be free)."""
    try:
        with open(f"/proc/self/fdinfo/{epfd}", encoding="ascii") as f:
            text = f.read()
    except FileNotFoundError:
        pytest.skip("no /proc/self/fdinfo: the kernel's epoll items cannot be listed")
    return {int(ino, 16) for ino in re.findall(r"^tfd:.*\bino:([0-9a-f]+)", text, re.M)}


@epoll_only
@pytest.mark.timeout(30)
def test_sock_recv_then_close_with_a_forked_child_leaves_no_orphan():
    """The orphan as a program makes it: two sockets wait in sock_recv on
    the loop, the process forks (the child holds copies of everything),
    and each ``data = await loop.sock_recv(s, n); s.close()`` closes its
    socket the moment it returns. sock_recv's done callback removes the
    reader just before that close, and the removal must leave the kernel
    then: a removal put off to the next select would meet a closed
    descriptor and leave the item behind, alive while the child lives. So
    the epoll instance holds no item for either socket after the closes,
    and when the peers write again an idle second stays idle. (A one-shot
    orphan fires once and stays disarmed, which the idle second alone
    would not notice: the kernel's item list is what shows it.)"""
    loop = Loop(NotifySelector("epoll"))
    port = loop._selector.port
    pairs = [pair() for _ in range(2)]
    inodes = {os.fstat(s.fileno()).st_ino for s, _ in pairs}

    async def recv_then_close(s):
        data = await loop.sock_recv(s, 10)
        s.close()
        return data

    try:
        tasks = [loop.create_task(recv_then_close(s)) for s, _ in pairs]
        loop.run_until_complete(asyncio.sleep(0.05))    # both readers in the kernel
        assert not any(task.done() for task in tasks)
        assert inodes <= epoll_watched_files(port.os_handle)
        with forked_child():
            for _, peer in pairs:
                peer.send(b"x")
            assert loop.run_until_complete(asyncio.gather(*tasks)) == [b"x", b"x"]
            assert all(s.fileno() == -1 for s, _ in pairs)
            orphans = inodes & epoll_watched_files(port.os_handle)
            assert not orphans, f"{len(orphans)} epoll item(s) outlived their socket's close"
            for _, peer in pairs:
                peer.send(b"ready for nobody")
            assert_idle(port, lambda: loop.run_until_complete(asyncio.sleep(1.0)))
    finally:
        loop.close()
        for s, peer in pairs:
            s.close()
            peer.close()


@epoll_only
@pytest.mark.timeout(30)
@pytest.mark.parametrize("keeper", ["dup", "child"])
@pytest.mark.parametrize("sockets", [1, 2, 50])
def test_orphans_never_spin(sel, keeper, sockets):
    """An application closes registered sockets while copies live on, then
    unregisters them (the closed socket objects still unregister): the
    kernel items cannot be deleted by number any more. Their peers write;
    an idle second stays idle, however many orphans there are."""
    pairs = [pair() for _ in range(sockets)]
    for i, (s, _) in enumerate(pairs):
        sel.register(s, READ, i)
    for _, peer in pairs:
        peer.send(b"x")
    # Reported and re-armed: as a long-lived registration stands.
    for _ in range(2):
        assert sorted(key.data for key, _ in sel.select(1)) == list(range(sockets))
    with copies_kept(keeper, [s for s, _ in pairs]):
        for s, _ in pairs:
            s.recv(10)
            s.close()
            sel.unregister(s)
        for _, peer in pairs:
            peer.send(b"y")
        assert_idle(sel.port, lambda: idle_select(sel))
    for _, peer in pairs:
        peer.close()


@epoll_only
@pytest.mark.timeout(30)
def test_orphan_while_out_of_descriptors_does_not_spin(sel):
    """One orphan while every descriptor of the process is taken (EMFILE):
    nothing the port does about an orphan may need a new descriptor."""
    a, peer = pair()
    other, other_peer = pair()
    sel.register(a, READ, "a")
    sel.register(other, READ, "other")
    peer.send(b"x")
    for _ in range(2):
        assert [key.data for key, _ in sel.select(1)] == ["a"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    with copies_kept("dup", [a]):
        a.recv(10)
        a.close()
        sel.unregister(a)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        try:
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
            peer.send(b"y")
            assert_idle(sel.port, lambda: idle_select(sel))
            # And the port still works, out of descriptors as it is.
            other_peer.send(b"z")
            assert [key.data for key, _ in sel.select(1)] == ["other"]
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for s in (peer, other, other_peer):
        s.close()


# -- the kernel refusing, on demand -------------------------------------------


@pytest.fixture(scope="module")
def epoll_faults():
    """The LD_PRELOAD shim of tests/c/epoll_faults.c, built for this run."""
    if not LINUX:
        pytest.skip("epoll: Linux only")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fault-injection shim")
    source = os.path.join(os.path.dirname(__file__), "c", "epoll_faults.c")
    folder = tempfile.mkdtemp()
    shim = os.path.join(folder, "epoll_faults.so")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", shim, source, "-ldl"],
                   check=True)
    yield shim
    shutil.rmtree(folder, ignore_errors=True)


def run_with_faults(shim, code):
    """Run ``code`` in a child Python with the shim preloaded; it gets
    ``arm(name, errno)`` and ``disarm(name)`` to make epoll fail."""
    controls = tempfile.mkdtemp()
    prelude = textwrap.dedent(f"""
        import os
        CONTROLS = {controls!r}
        def arm(name, code):
            with open(os.path.join(CONTROLS, name), "w") as f:
                f.write(str(code))
        def disarm(name):
            os.unlink(os.path.join(CONTROLS, name))
        """)
    env = dict(os.environ, SOCKNOTIFY_FAULTS=controls)
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), shim]))
    try:
        child = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                               env=env, capture_output=True, text=True, timeout=60,
                               cwd=tempfile.gettempdir())
    finally:
        shutil.rmtree(controls, ignore_errors=True)
    assert child.returncode == 0, child.stdout + child.stderr
    return child.stdout


@pytest.mark.timeout(90)
def test_no_watch_left_never_loses_a_registration(epoll_faults):
    """The kernel refuses every new watch (ENOSPC: fs.epoll.max_user_watches
    reached) while an orphan fires: every registration the selector holds
    is still reported, and a new one is refused loudly at register()."""
    out = run_with_faults(epoll_faults, """
        import errno, os, socket
        from socknotify_loop.selector import NotifySelector
        def pair():
            a, b = socket.socketpair()
            a.setblocking(False)
            b.setblocking(False)
            return a, b
        sel = NotifySelector("epoll")
        (a, pa), (x, px) = pair(), pair()
        sel.register(a, 1, "a")
        sel.register(x, 1, "x")
        pa.send(b"1")
        for _ in range(2):
            assert [k.data for k, _ in sel.select(1)] == ["a"]
        keep = os.dup(a.fileno())
        a.recv(1)
        a.close()
        sel.unregister(a)
        arm("add", errno.ENOSPC)
        pa.send(b"2")          # the orphan fires
        for _ in range(3):
            assert sel.select(0.05) == []
        px.send(b"3")
        assert [k.data for k, _ in sel.select(1)] == ["x"], "x was lost"
        n, pn = pair()
        try:
            sel.register(n, 1, "n")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        else:
            raise AssertionError("register() without a watch left did not raise")
        assert n not in sel.get_map()
        assert sel.port.registered == len(sel.get_map()) == 1
        disarm("add")
        sel.register(n, 1, "n")
        pn.send(b"4")
        assert sorted(k.data for k, _ in sel.select(1)) == ["n", "x"]
        os.close(keep)
        print("ok")
        """)
    assert out.strip() == "ok"


@pytest.mark.timeout(90)
def test_no_epoll_instance_to_be_had_never_spins(epoll_faults):
    """epoll_create1 fails (EMFILE, injected) while an orphan fires: an
    idle second stays idle and registrations keep working."""
    out = run_with_faults(epoll_faults, """
        import errno, os, socket, time
        from socknotify_loop.selector import NotifySelector
        sel = NotifySelector("epoll")
        a, pa = socket.socketpair()
        a.setblocking(False)
        sel.register(a, 1, "a")
        pa.send(b"1")
        for _ in range(2):
            assert [k.data for k, _ in sel.select(1)] == ["a"]
        keep = os.dup(a.fileno())
        a.recv(1)
        a.close()
        sel.unregister(a)
        arm("create", errno.EMFILE)
        pa.send(b"2")
        waits, cpu = sel.port.counters()["waits"], time.process_time()
        assert sel.select(1.0) == []
        waits = sel.port.counters()["waits"] - waits
        cpu = time.process_time() - cpu
        assert waits <= 10 and cpu < 0.2, (waits, cpu)
        os.close(keep)
        print("ok")
        """)
    assert out.strip() == "ok"


@pytest.mark.timeout(90)
def test_a_wait_that_dequeues_only_stale_events_waits_for_the_time_left(epoll_faults):
    """Each wait dequeues an event for no live registration (injected): the
    port drops it and waits again for the time left, neither returning
    early (the loop would spin until its timer is due) nor waiting longer,
    and an endless wait still reports what comes later."""
    out = run_with_faults(epoll_faults, """
        import socket, threading, time
        from socknotify_loop.selector import NotifySelector
        sel = NotifySelector("epoll")
        a, pa = socket.socketpair()
        sel.register(a, 1, "a")
        arm("stale", 6)
        waits = sel.port.counters()["waits"]
        start = time.monotonic()
        assert sel.select(0.3) == []
        took = time.monotonic() - start
        assert 0.29 <= took < 2, took
        # Six stale events, each followed by a wait again: the injection ran.
        assert sel.port.counters()["waits"] - waits >= 7, sel.port.counters()
        fast = sel.loop_view
        arm("stale", 9)                 # three more, for the loop's timed wait
        start = time.monotonic()
        assert fast.wait(fast.port, 200.0) == 0
        took = time.monotonic() - start
        assert 0.19 <= took < 2, took
        arm("stale", 11)                # two more, for its endless wait
        threading.Timer(0.2, pa.send, (b"x",)).start()
        got = fast.block(fast.port)
        assert got & 3 == 1 and fast.keys[got >> 2].data == "a", got
        print("ok")
        """)
    assert out.strip() == "ok"


# -- outer pollers ----------------------------------------------------------------


@epoll_only
@pytest.mark.timeout(30)
def test_outer_poller_on_os_handle_keeps_waking(sel):
    """A host loop polls ``port.os_handle`` (a loop nested in a GUI's):
    it must keep waking for the port's events after an orphan came and
    went -- the handle stays the same file."""
    a, pa = pair()
    b, pb = pair()
    sel.register(a, READ, "a")
    sel.register(b, READ, "b")
    outer = select.epoll()
    outer.register(sel.port.os_handle, select.EPOLLIN)
    try:
        pa.send(b"1")
        for _ in range(2):
            assert [key.data for key, _ in sel.select(1)] == ["a"]
        with copies_kept("dup", [a]):
            a.recv(1)
            a.close()
            sel.unregister(a)
            for _ in range(3):
                pa.send(b"2")
                sel.select(0.05)
            pb.send(b"3")
            assert outer.poll(2), "the outer poller no longer hears the port"
            assert [key.data for key, _ in sel.select(1)] == ["b"]
    finally:
        outer.close()
        for s in (pa, b, pb):
            s.close()


# -- cost of an orphan ---------------------------------------------------------------


def _changes_per_finished_connection(idle_count, finished=20):
    """epoll_ctl calls per connection served with sock_recv and closed,
    while ``idle_count`` idle connections stay registered and a child
    process holds copies of every socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * idle_count + 1024), hard))
    loop = Loop(NotifySelector("epoll"))
    idle = [pair() for _ in range(idle_count)]
    busy = [pair() for _ in range(finished)]
    try:
        for s, _ in idle:
            loop.add_reader(s, lambda: None)
        with copies_kept("child", [s for s, _ in idle + busy]):
            async def serve(s, peer):
                loop.call_later(0.001, peer.send, b"x")
                data = await loop.sock_recv(s, 10)
                s.close()
                peer.close()    # the child's copy now reads EOF: ready for ever
                assert data == b"x"

            port = loop._selector.port
            before = port.counters()["changes"]
            for s, peer in busy:
                loop.run_until_complete(serve(s, peer))
            loop.run_until_complete(asyncio.sleep(0.05))
            return (port.counters()["changes"] - before) / finished
    finally:
        loop.close()
        for s, peer in idle + busy:
            s.close()
            peer.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@epoll_only
@pytest.mark.timeout(60)
def test_an_orphan_costs_the_same_whatever_else_is_registered():
    """A finished connection costs its registration, one re-arm (the
    iteration between the read and the done callback that removes the
    reader) and its removal: three epoll_ctl (selectors.EpollSelector
    makes two), whether 10 or 2,000 other connections are registered."""
    few = _changes_per_finished_connection(10)
    many = _changes_per_finished_connection(2000)
    assert few <= 3.5 and many <= 3.5, (few, many)


# -- what EpollSelector accepts ---------------------------------------------------------


def _modify_outcomes(selector, events):
    a, b = pair()
    try:
        selector.register(a, READ, "a")
        try:
            key = selector.modify(a, events, "a")
        except Exception as exc:   # noqa: BLE001 -- the outcome is compared
            return type(exc)
        b.send(b"x")
        return key.events, sorted((k.data, m) for k, m in selector.select(0.2))
    finally:
        selector.close()
        a.close()
        b.close()


@epoll_only
@pytest.mark.parametrize("events", [0, READ | 4, WRITE | 8])
def test_modify_accepts_what_epoll_selector_accepts(events):
    """EpollSelector.modify takes any events value: the READ and WRITE bits
    are watched, the key keeps the value (0 watches nothing but errors)."""
    expected = _modify_outcomes(selectors.EpollSelector(), events)
    assert _modify_outcomes(NotifySelector("epoll"), events) == expected


@epoll_only
@pytest.mark.parametrize("fd", [2**31, 2**40])
def test_register_huge_descriptor_raises_overflow_error(sel, fd):
    with pytest.raises(OverflowError):
        selectors.EpollSelector().register(fd, READ)
    with pytest.raises(OverflowError):
        sel.register(fd, READ)
    assert len(sel.get_map()) == 0


# -- threads --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_changes_from_another_thread_while_selecting(backend):
    """One thread selects without pause while another registers, modifies,
    unregisters and closes sockets (numbers reused at once). Idle sockets
    are never reported readable, no register raises, and when the dust
    settles the port holds exactly the registrations the selector has."""
    if backend != "epoll" and running_under_wine():
        pytest.skip(WINE_CLOSE_RACE)
    sel = NotifySelector(backend)
    stop = threading.Event()
    false_reports = []
    errors = []
    busy, busy_peer = pair()
    busy_peer.send(b"always readable")
    sel.register(busy, READ, "busy")

    def selecting():
        try:
            while not stop.is_set():
                for key, mask in sel.select(0.001):
                    # Idle sockets may be reported writable (some are
                    # watched for WRITE a moment), never readable.
                    if key.data != "busy" and mask & READ:
                        false_reports.append((key.data, mask))
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    thread = threading.Thread(target=selecting)
    thread.start()
    live = []
    try:
        deadline = time.monotonic() + 3.0
        rounds = 0
        while time.monotonic() < deadline and rounds < 400 and thread.is_alive():
            rounds += 1
            fresh = [pair() for _ in range(8)]
            for s, _ in fresh:
                sel.register(s, READ, "idle")
            for s, _ in fresh[:4]:
                sel.modify(s, READ | WRITE, "idle")
                sel.modify(s, READ, "idle")
            # Their peers hang up: were they still registered, they would
            # be readable (EOF) from now on, under whichever key.
            for s, peer in fresh[:6]:
                sel.unregister(s)
                s.close()
                peer.close()
            live.extend(fresh[6:])
            while len(live) > 40:
                s, peer = live.pop(0)
                sel.unregister(s)
                s.close()
                peer.close()
    finally:
        stop.set()
        thread.join(10)
    try:
        assert not errors, errors
        assert not false_reports, f"{len(false_reports)} reports for idle sockets"
        sel.select(0)   # changes still queued reach the port
        assert sel.port.registered == len(sel.get_map()) == len(live) + 1
    finally:
        sel.close()
        for s, peer in live + [(busy, busy_peer)]:
            s.close()
            peer.close()


@pytest.mark.timeout(30)
def test_refused_select_loses_nothing(backend):
    """A select refused because another thread is inside one (RuntimeError)
    must not have touched the queued changes: an unregister made before it
    still reaches the port, and the old socket's readiness is never
    reported for the registration that takes its place."""
    sel = NotifySelector(backend)
    x, px = pair()
    y, py = pair()
    sel.register(x, READ, "x")
    results = []
    thread = threading.Thread(target=lambda: results.append(sel.select(10)))
    thread.start()
    try:
        time.sleep(0.3)       # the thread is inside select()
        sel.unregister(x)
        with pytest.raises(RuntimeError):
            sel.select(0)
        px.send(b"unwatched")
        sel.port.post(WAKEUP_KEY)
        thread.join(10)
        assert not thread.is_alive()
        assert results == [[]]
        sel.register(y, READ, "y")
        assert sel.select(0.3) == [], "x's readiness was reported for y"
        assert sel.port.registered == len(sel.get_map()) == 1
        py.send(b"now")
        assert [key.data for key, _ in sel.select(1)] == ["y"]
    finally:
        sel.close()
        for s in (x, px, y, py):
            s.close()


@pytest.mark.skipif(running_under_wine(),
                    reason="Wine 8's wineserver crashes under this test's churn of AFD polls "
                           "from two threads (a Wine bug: a server must survive its clients); "
                           "it runs on Linux and on real Windows")
@pytest.mark.timeout(30)
def test_a_select_in_another_thread_reports_whole_keys(backend):
    """While one thread selects without pause, another registers sockets
    that are ready at once and flips a writable socket between READ and
    READ|WRITE. On epoll a new item is in the kernel as soon as register()
    has called epoll_ctl, so the select may report it before the
    registering thread is back: its key must already be in place (a select
    once met an IndexError there). And every report is within its key's
    events, as EpollSelector's are (it masks with the key it reads): a
    modify() between the wait and the reading of the key once made READ
    keys come out writable."""
    sel = NotifySelector(backend)
    stop = threading.Event()
    outside, errors = [], []
    flipped, flipped_peer = pair()
    sel.register(flipped, READ, "flipped")

    def selecting():
        try:
            while not stop.is_set():
                for key, mask in sel.select(0.001):
                    if not mask or mask & ~key.events:
                        outside.append((key.data, key.events, mask))
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    thread = threading.Thread(target=selecting)
    thread.start()
    opened = []
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and thread.is_alive():
            fresh = [pair() for _ in range(4)]
            opened.extend(fresh)
            for s, peer in fresh:
                peer.send(b"ready")
                sel.register(s, READ | WRITE, "fresh")
            for _ in range(20):
                sel.modify(flipped, READ | WRITE, "flipped")
                sel.modify(flipped, READ, "flipped")
            for s, peer in fresh:
                sel.unregister(s)
                s.close()
                peer.close()
    finally:
        stop.set()
        thread.join(10)
        sel.close()
        for s, peer in opened + [(flipped, flipped_peer)]:
            s.close()
            peer.close()
    assert not errors, errors
    assert not outside, f"{len(outside)} reports outside their key's events: {outside[:5]}"
