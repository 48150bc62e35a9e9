"""The OS probe: ``python -m socknotify_loop --probe-os``.

Microsoft documents rules of ProcessSocketNotifications that nobody here
could check, since no machine of the project's has the function (Wine does
not export it). The port is written against the strictest reading of each
(the ``strict`` backend, ``socknotify_loop/_core/sn_model.c``, enforces it
in tests). This module asks the OS's own function the same questions, on
the machine at hand, and prints its answers beside the model's, so one run
on Windows 11 or Server 2022 settles them:

- a key change without REMOVE (which key do later notifications carry?),
- REMOVE and ENABLE of one socket in one call (the same question),
- delivery after DISABLE of a notification queued before it,
- a socket registered with another completion port (refused?),
- a socket left registered with a port that was closed (refused by the next?),
- edge-triggered without draining (a second notification for new data?),
- ENABLE without LEVEL or EDGE (refused?),
- a closed handle in a batch (its registration's error, or the whole call's?),
- a LEVEL|ONESHOT registration re-armed with data unread (fires at once?),
- ENABLE of an armed registration with a new filter (refused? which filter?),
- a socket closed after its REMOVE, before the REMOVE event is dequeued
  (does the event still come?),
- closesocket() with a notification queued (delivered after the close?),
- a socket tied to a completion port by CreateIoCompletionPort (refused,
  with which error?),
- a failed non-blocking connect watched for OUT only (does ERR come?),
- DISABLE with no trigger flags (refused?),
- what a notification's lpOverlapped (reserved) holds (NULL?).

Answers are compared by meaning: "refused (error 87)" and "refused (error
10045)" are the same answer to "is it refused?", and the report marks only
a difference in meaning (the codes are printed for the record).

Each question runs on a fresh completion port through the bare function
(:class:`~socknotify_loop.port.RawPort`, the port module's wrapper of
``sn_raw_*`` in the core: no table, no key translation), with sockets
from :func:`socket.socketpair`. Where the OS lacks the function the probe
says so and prints the model's answers (and the AFD polyfill's, for
contrast) only.
"""
from __future__ import annotations

import platform
import re
import socket
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, TextIO, Tuple

from .port import (
    ERROR_TIMEOUT,
    EVENT_ERR,
    EVENT_IN,
    EVENT_OUT,
    EVENT_REMOVE,
    OP_DISABLE,
    OP_ENABLE,
    OP_REMOVE,
    TRIGGER_EDGE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    TRIGGER_PERSISTENT,
    WAIT_TIMEOUT,
    RawPort,
    available_backends,
)

__all__ = ["RawPort", "Question", "QUESTIONS", "ask", "probe", "main"]

ONESHOT = TRIGGER_LEVEL | TRIGGER_ONESHOT
PERSISTENT = TRIGGER_LEVEL | TRIGGER_PERSISTENT


def _pair() -> Tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _keys(notes: List[Tuple[int, int]], bit: int) -> List[int]:
    return sorted({key for key, events in notes if events & bit})


def _which_key(keys: List[int]) -> str:
    """Key 1 was the first ENABLE's, key 2 the later one's."""
    return {1: "first key kept", 2: "new key used"}.get(keys[0], f"keys {keys}") \
        if len(keys) == 1 else f"keys {keys}"


def _registered(rc: int, results: List[int]) -> Optional[str]:
    """None if the one registration was accepted, else what happened."""
    if rc not in (0, WAIT_TIMEOUT, ERROR_TIMEOUT):
        return f"call failed (error {rc})"
    if results and results[0]:
        return f"refused (error {results[0]})"
    return None


# -- the questions: each takes a backend name and says what it did ---------------

def key_change_without_remove(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 1, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        problem = _registered(*port.call([(a, 2, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return f"second ENABLE {problem}"
        b.send(b"x")
        return _which_key(_keys(port.collect(300), EVENT_IN))


def remove_then_enable_in_one_call(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 1, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        rc, results, _ = port.call([(a, 1, 0, OP_REMOVE, 0),
                                    (a, 2, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)
        if rc or results[1]:
            return f"refused (call {rc}, results {results})"
        b.send(b"x")
        notes = port.collect(300)
        told = _which_key(_keys(notes, EVENT_IN))
        return f"{told}; REMOVE under {_keys(notes, EVENT_REMOVE) or 'none'}"


def delivery_after_disable(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 3, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        b.send(b"x")
        time.sleep(0.1)          # the notification is queued by now
        problem = _registered(*port.call([(a, 3, EVENT_IN, OP_DISABLE, 0)], 0, 0)[:2])
        if problem:
            return f"DISABLE {problem}"
        keys = _keys(port.collect(300), EVENT_IN)
        return "queued notification delivered" if keys else "nothing after DISABLE"


def another_port(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as first, RawPort(backend) as second:
        problem = _registered(*first.call([(a, 4, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
        if problem:
            return f"first port {problem}"
        return _registered(*second.call([(a, 4, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2]) \
            or "accepted"


def closed_port_without_remove(backend: str) -> str:
    a, b = _pair()
    with a, b:
        with RawPort(backend) as first:
            problem = _registered(*first.call([(a, 5, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
            if problem:
                return f"first port {problem}"
        with RawPort(backend) as second:
            return _registered(*second.call([(a, 5, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2]) \
                or "accepted"


def closed_port_after_remove(backend: str) -> str:
    a, b = _pair()
    with a, b:
        with RawPort(backend) as first:
            problem = _registered(*first.call([(a, 6, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
            if problem:
                return f"first port {problem}"
            first.call([(a, 6, 0, OP_REMOVE, 0)], 0, 0)
        with RawPort(backend) as second:
            return _registered(*second.call([(a, 6, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2]) \
                or "accepted"


def edge_without_draining(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call(
            [(a, 7, EVENT_IN, OP_ENABLE, TRIGGER_EDGE | TRIGGER_PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        b.send(b"1")
        first = _keys(port.collect(300), EVENT_IN)
        b.send(b"2")             # the first byte is still unread
        second = _keys(port.collect(300), EVENT_IN)
        if not first:
            return "no notification for the first data"
        return "notified again for new data" if second else "one notification until drained"


def enable_without_trigger(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        return _registered(*port.call([(a, 8, EVENT_IN, OP_ENABLE, TRIGGER_ONESHOT)], 0, 0)[:2]) \
            or "accepted"


class _Handle:
    """A bare handle value where :meth:`RawPort.call` wants a socket."""

    def __init__(self, value: int) -> None:
        self.value = value

    def fileno(self) -> int:
        return self.value


def closed_handle_in_a_batch(backend: str) -> str:
    a, b = _pair()
    c, d = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(c, 9, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        closed = _Handle(c.fileno())
        c.close()
        d.close()
        rc, results, _ = port.call([(closed, 9, 0, OP_REMOVE, 0),  # type: ignore[list-item]
                                    (a, 10, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)
        if rc not in (0, WAIT_TIMEOUT, ERROR_TIMEOUT):
            return f"whole call failed (error {rc})"
        if results[0] and not results[1]:
            return f"its registration failed (error {results[0]}), the rest applied"
        return f"results {results}"


def oneshot_rearm_unread(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 11, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
        if problem:
            return problem
        b.send(b"x")
        if not _keys(port.collect(300), EVENT_IN):
            return "no notification for the data"
        problem = _registered(*port.call([(a, 11, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
        if problem:
            return f"re-arm {problem}"
        return "fires again at once" if _keys(port.collect(300), EVENT_IN) \
            else "silent until new data"


def enable_armed_new_filter(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 12, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        problem = _registered(*port.call(
            [(a, 12, EVENT_IN | EVENT_OUT, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        return "accepted, new filter used" if _keys(port.collect(300), EVENT_OUT) \
            else "accepted, old filter kept"


def closed_before_remove_event(backend: str) -> str:
    a, b = _pair()
    with b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 13, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
        if problem:
            return problem
        rc, results, _ = port.call([(a, 13, 0, OP_REMOVE, 0)], 0, 0)
        if rc or results[0]:
            a.close()
            return f"REMOVE refused (call {rc}, results {results})"
        a.close()
        return "REMOVE event delivered" if _keys(port.collect(300), EVENT_REMOVE) \
            else "no REMOVE event"


def closesocket_with_queued(backend: str) -> str:
    a, b = _pair()
    with b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 14, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            a.close()
            return problem
        b.send(b"x")
        time.sleep(0.1)          # the notification is queued by now
        a.close()
        return "delivered after the close" if _keys(port.collect(300), EVENT_IN) \
            else "nothing after the close"


def tied_by_create_io_completion_port(backend: str) -> str:
    import ctypes

    # Looked up by name: they exist on Windows only, where this runs, and
    # the type checker also reads this module as on Linux.
    names = ("WinDLL", "get_last_error")
    kernel32 = getattr(ctypes, names[0])("kernel32", use_last_error=True)
    last_error = getattr(ctypes, names[1])
    create = kernel32.CreateIoCompletionPort
    create.restype = ctypes.c_void_p
    create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32]
    close = kernel32.CloseHandle
    close.argtypes = [ctypes.c_void_p]
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        other = create(ctypes.c_void_p(-1), None, 0, 0)
        if not other:
            return f"no completion port (error {last_error()})"
        try:
            if not create(a.fileno(), other, 1, 0):
                return f"not tied (error {last_error()})"
            return _registered(*port.call([(a, 15, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2]) \
                or "accepted"
        finally:
            close(other)


def failed_connect_out_only(backend: str) -> str:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    address = closed.getsockname()
    closed.close()               # nobody listens there now
    a = socket.socket()
    a.setblocking(False)
    with a, RawPort(backend) as port:
        a.connect_ex(address)
        problem = _registered(*port.call(
            [(a, 16, EVENT_OUT, OP_ENABLE, ONESHOT)], 0, 0)[:2])
        if problem:
            return problem
        notes = port.collect(3000 if backend != "afd" else 1500)
        if _keys(notes, EVENT_ERR):
            return "ERR reported"
        return "OUT without ERR" if _keys(notes, EVENT_OUT) else "nothing"


#: In a raw notification's events: the packet carried an lpOverlapped
#: (``sn_raw_process``, ``_core/sn_iocp_fn.c``).
_RAW_OVERLAPPED = 1 << 31


def notification_overlapped(backend: str) -> str:
    # The port takes a packet under a registration's key that carries an
    # OVERLAPPED for the completion of overlapped I/O, not a notification.
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 18, EVENT_IN, OP_ENABLE, ONESHOT)], 0, 0)[:2])
        if problem:
            return problem
        b.send(b"x")
        mine = [events for key, events in port.collect(1500) if key == 18]
        if not mine:
            return "nothing"
        return "lpOverlapped set" if mine[0] & _RAW_OVERLAPPED else "lpOverlapped NULL"


def disable_without_trigger(backend: str) -> str:
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _registered(*port.call([(a, 17, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)[:2])
        if problem:
            return problem
        return _registered(*port.call([(a, 17, EVENT_IN, OP_DISABLE, 0)], 0, 0)[:2]) \
            or "accepted"


class Question(NamedTuple):
    """One documented-but-unverified rule, and how to ask a backend."""

    name: str
    ask: Callable[[str], str]


QUESTIONS: Tuple[Question, ...] = (
    Question("key change without REMOVE", key_change_without_remove),
    Question("REMOVE then ENABLE (new key) in one call", remove_then_enable_in_one_call),
    Question("delivery after DISABLE", delivery_after_disable),
    Question("socket registered with another port", another_port),
    Question("port closed with the socket registered", closed_port_without_remove),
    Question("port closed after the socket's REMOVE", closed_port_after_remove),
    Question("edge-triggered, not drained", edge_without_draining),
    Question("ENABLE without LEVEL or EDGE", enable_without_trigger),
    Question("closed handle in a batch", closed_handle_in_a_batch),
    Question("LEVEL|ONESHOT re-armed, data unread", oneshot_rearm_unread),
    Question("ENABLE of an armed registration, new filter", enable_armed_new_filter),
    Question("socket closed before its REMOVE event", closed_before_remove_event),
    Question("closesocket() with a notification queued", closesocket_with_queued),
    Question("socket tied by CreateIoCompletionPort", tied_by_create_io_completion_port),
    Question("failed connect, OUT-only filter", failed_connect_out_only),
    Question("DISABLE without trigger flags", disable_without_trigger),
    Question("a notification's lpOverlapped", notification_overlapped),
)


def meaning(answer: str) -> str:
    """An answer without its error codes: what it means, for comparing
    the OS's answers with the model's."""
    return re.sub(r"\s*\((?:call |error )[^)]*\)", "", answer).strip()


def ask(question: Question, backend: str) -> str:
    """The backend's answer, or what went wrong asking."""
    try:
        return question.ask(backend)
    except OSError as exc:
        return f"error: {exc}"


def probe(out: TextIO = sys.stdout) -> Dict[str, Dict[str, str]]:
    """Ask every question of the OS's function (where it exists), of the
    strict model and of the AFD polyfill; print a table; return
    ``{question: {backend: answer}}``."""
    if sys.platform != "win32":
        raise OSError("the OS probe asks Windows's ProcessSocketNotifications: "
                      "run it on Windows")
    available = available_backends()
    has_psn, why = available["psn"]
    columns = (["psn"] if has_psn else []) + ["strict", "afd"]
    titles = {"psn": "the OS did", "strict": "the strict model assumes",
              "afd": "the AFD polyfill does"}
    out.write(f"socknotify_loop OS probe on {platform.platform()}\n")
    out.write(f"ProcessSocketNotifications: {why}\n")
    if not has_psn:
        out.write("The OS lacks the function: only the model (and the polyfill) answer.\n")
    answers: Dict[str, Dict[str, str]] = {}
    for question in QUESTIONS:
        answers[question.name] = {backend: ask(question, backend) for backend in columns}
    width = max(len(q.name) for q in QUESTIONS)
    for backend in columns:
        out.write(f"\n{titles[backend]}:\n")
        for question in QUESTIONS:
            answer = answers[question.name][backend]
            mark = ""
            if backend == "psn" and meaning(answer) != meaning(answers[question.name]["strict"]):
                mark = "   <-- differs from the model"
            out.write(f"  {question.name:<{width}}  {answer}{mark}\n")
    out.write(REPORT_REQUEST if has_psn else REPORT_NO_PSN)
    return answers


#: What the owner of a machine with the function is asked to send back.
REPORT_REQUEST = """
Please send this whole output back to the project (an issue on its tracker
titled "probe-os: " and the Windows build above), together with the output
of `python -m socknotify_loop --info` and of `ver` in cmd.exe. Every line
marked "differs from the model" is a rule the project's tests read
otherwise than this Windows does; the lines without a mark confirm a
reading. Run it on an otherwise idle machine, as a normal user, with no
third-party firewall or layered service provider if you can (say if not).
"""

REPORT_NO_PSN = """
This Windows has no ProcessSocketNotifications (it needs Windows 11 or
Server 2022, build 20348, and later): nothing to send back from here.
"""


def main(out: TextIO = sys.stdout) -> int:
    """``--probe-os``: 0 once the table is printed, 1 if it cannot run here."""
    try:
        probe(out)
    except OSError as exc:
        sys.stderr.write(f"socknotify_loop: {exc}\n")
        return 1
    return 0
