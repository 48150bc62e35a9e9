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
- what a notification's lpOverlapped (reserved) holds (NULL?),
- two ENABLEs of one registration in one call (is the second refused?),
- an ENABLE on a second port (refused, or does it overwrite the first
  port's registration: which port hears?),
- an ENABLE with a new filter after a notification was queued (is the
  queued one still delivered?),
- a REMOVE sent to a port that does not hold the socket (refused, or is
  the other port's registration removed: does REMOVE check the port?),
- and of Windows itself: does getsockopt(SO_BSP_STATE) answer for a
  connection the peer reset?

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
import struct
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


def _apply(port: RawPort, sock: socket.socket, key: int, events: int, op: int,
           trigger: int) -> Optional[str]:
    """One registration applied, no wait: None if it was accepted, else
    what happened (:func:`_registered`)."""
    return _registered(*port.call([(sock, key, events, op, trigger)], 0, 0)[:2])


def _enable(port: RawPort, sock: socket.socket, key: int, events: int,
            trigger: int) -> Optional[str]:
    """An ENABLE applied, no wait: None if accepted, else what happened."""
    return _apply(port, sock, key, events, OP_ENABLE, trigger)


#: What a question asks once its socket is registered: (the port, the
#: registered socket ``a``, its peer ``b``, the registration's key) -> the answer.
Then = Callable[[RawPort, socket.socket, socket.socket, int], str]


def _after_enable(key: int, events: int, trigger: int, then: Then) -> Callable[[str], str]:
    """The shape most questions have: a fresh pair and a fresh port, ``a``
    registered (ENABLE of ``events`` under ``key``), then ``then`` asks the
    rest. A refused first ENABLE is the answer itself."""
    def ask(backend: str) -> str:
        a, b = _pair()
        with a, b, RawPort(backend) as port:
            return _enable(port, a, key, events, trigger) or then(port, a, b, key)
    return ask


# -- what each question asks after its first ENABLE --------------------------------

def _accepted(port: RawPort, a: socket.socket, b: socket.socket, key: int) -> str:
    """Nothing more: the first ENABLE's verdict is the answer."""
    return "accepted"


def _enable_again_under_key_2(port: RawPort, a: socket.socket, b: socket.socket,
                              key: int) -> str:
    problem = _enable(port, a, 2, EVENT_IN, PERSISTENT)
    if problem:
        return f"second ENABLE {problem}"
    b.send(b"x")
    return _which_key(_keys(port.collect(300), EVENT_IN))


def _remove_and_enable_under_key_2(port: RawPort, a: socket.socket, b: socket.socket,
                                   key: int) -> str:
    rc, results, _ = port.call([(a, key, 0, OP_REMOVE, 0),
                                (a, 2, EVENT_IN, OP_ENABLE, PERSISTENT)], 0, 0)
    if rc or results[1]:
        return f"refused (call {rc}, results {results})"
    b.send(b"x")
    notes = port.collect(300)
    told = _which_key(_keys(notes, EVENT_IN))
    return f"{told}; REMOVE under {_keys(notes, EVENT_REMOVE) or 'none'}"


def _disable_with_data_queued(port: RawPort, a: socket.socket, b: socket.socket,
                              key: int) -> str:
    b.send(b"x")
    time.sleep(0.1)          # the notification is queued by now
    problem = _apply(port, a, key, EVENT_IN, OP_DISABLE, 0)
    if problem:
        return f"DISABLE {problem}"
    keys = _keys(port.collect(300), EVENT_IN)
    return "queued notification delivered" if keys else "nothing after DISABLE"


def _send_twice_unread(port: RawPort, a: socket.socket, b: socket.socket, key: int) -> str:
    b.send(b"1")
    first = _keys(port.collect(300), EVENT_IN)
    b.send(b"2")             # the first byte is still unread
    second = _keys(port.collect(300), EVENT_IN)
    if not first:
        return "no notification for the first data"
    return "notified again for new data" if second else "one notification until drained"


def _rearm_with_data_unread(port: RawPort, a: socket.socket, b: socket.socket,
                            key: int) -> str:
    b.send(b"x")
    if not _keys(port.collect(300), EVENT_IN):
        return "no notification for the data"
    problem = _enable(port, a, key, EVENT_IN, ONESHOT)
    if problem:
        return f"re-arm {problem}"
    return "fires again at once" if _keys(port.collect(300), EVENT_IN) \
        else "silent until new data"


def _enable_again_with_out(port: RawPort, a: socket.socket, b: socket.socket,
                           key: int) -> str:
    problem = _enable(port, a, key, EVENT_IN | EVENT_OUT, PERSISTENT)
    if problem:
        return problem
    return "accepted, new filter used" if _keys(port.collect(300), EVENT_OUT) \
        else "accepted, old filter kept"


def _remove_then_close(port: RawPort, a: socket.socket, b: socket.socket, key: int) -> str:
    rc, results, _ = port.call([(a, key, 0, OP_REMOVE, 0)], 0, 0)
    a.close()
    if rc or results[0]:
        return f"REMOVE refused (call {rc}, results {results})"
    return "REMOVE event delivered" if _keys(port.collect(300), EVENT_REMOVE) \
        else "no REMOVE event"


def _close_with_data_queued(port: RawPort, a: socket.socket, b: socket.socket,
                            key: int) -> str:
    b.send(b"x")
    time.sleep(0.1)          # the notification is queued by now
    a.close()
    return "delivered after the close" if _keys(port.collect(300), EVENT_IN) \
        else "nothing after the close"


def _disable_without_trigger(port: RawPort, a: socket.socket, b: socket.socket,
                             key: int) -> str:
    return _apply(port, a, key, EVENT_IN, OP_DISABLE, 0) or "accepted"


# -- the questions of another shape: two ports, a closed handle, no pair -----------

def _on_a_second_port(key: int, remove_first: bool, close_first: bool) -> Callable[[str], str]:
    """``a`` registered with one port, then ENABLEd on a second one; the
    first may have removed it first, and may be closed by then."""
    def ask(backend: str) -> str:
        a, b = _pair()
        with a, b, RawPort(backend) as first:
            problem = _enable(first, a, key, EVENT_IN, ONESHOT)
            if problem:
                return f"first port {problem}"
            if remove_first:
                first.call([(a, key, 0, OP_REMOVE, 0)], 0, 0)
            if close_first:
                first.close()
            with RawPort(backend) as second:
                return _enable(second, a, key, EVENT_IN, ONESHOT) or "accepted"
    return ask


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
        problem = _enable(port, c, 9, EVENT_IN, PERSISTENT)
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
            return _enable(port, a, 15, EVENT_IN, ONESHOT) or "accepted"
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
        problem = _enable(port, a, 16, EVENT_OUT, ONESHOT)
        if problem:
            return problem
        notes = port.collect(3000 if backend != "afd" else 1500)
        if _keys(notes, EVENT_ERR):
            return "ERR reported"
        return "OUT without ERR" if _keys(notes, EVENT_OUT) else "nothing"


def two_enables_in_one_call(backend: str) -> str:
    # One registration enabled twice in one call (asyncio's register()
    # then modify() before the next select): is the second refused, for
    # the registration the first has just armed?
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        rc, results, _ = port.call([(a, 19, EVENT_IN, OP_ENABLE, ONESHOT),
                                    (a, 19, EVENT_IN | EVENT_OUT, OP_ENABLE, ONESHOT)], 0, 0)
        if rc not in (0, WAIT_TIMEOUT, ERROR_TIMEOUT):
            return f"whole call failed (error {rc})"
        if results[1] and not results[0]:
            return f"second refused (error {results[1]})"
        if results[0] or results[1]:
            return f"refused (results {results})"
        return "both accepted, " + ("second filter used" if _keys(port.collect(300), EVENT_OUT)
                                    else "first filter kept")


def modify_with_a_notification_queued(backend: str) -> str:
    # A one-shot registration for IN that fired (data arrived, nobody
    # dequeued yet), then ENABLEd for OUT: is the IN notification queued
    # before the ENABLE still delivered?
    a, b = _pair()
    with a, b, RawPort(backend) as port:
        problem = _enable(port, a, 23, EVENT_IN, ONESHOT)
        if problem:
            return problem
        b.send(b"x")
        time.sleep(0.1)          # the notification is queued by now
        problem = _enable(port, a, 23, EVENT_OUT, ONESHOT)
        if problem:
            return f"second ENABLE {problem}"
        return ("queued notification delivered" if _keys(port.collect(300), EVENT_IN)
                else "nothing of the old filter")


def second_port_enable_who_hears(backend: str) -> str:
    # A socket registered with one port and ENABLEd on a second: refused,
    # or does the second ENABLE overwrite the first registration ("re-
    # registering ... overwrites the existing registration")?
    a, b = _pair()
    with a, b, RawPort(backend) as first:
        problem = _enable(first, a, 20, EVENT_IN, PERSISTENT)
        if problem:
            return f"first port {problem}"
        with RawPort(backend) as second:
            problem = _enable(second, a, 21, EVENT_IN, PERSISTENT)
            if problem:
                return problem
            b.send(b"x")
            first_hears = bool(_keys(first.collect(300), EVENT_IN))
            second_hears = bool(_keys(second.collect(300), EVENT_IN))
    return {(True, True): "accepted; both ports hear",
            (False, True): "accepted, overwrites: only the second port hears",
            (True, False): "accepted; only the first port hears",
            (False, False): "accepted; neither port hears"}[(first_hears, second_hears)]


def remove_from_another_port(backend: str) -> str:
    # A REMOVE sent to a port that does not hold the socket, which another
    # port holds: does REMOVE check the port, or remove the other port's
    # registration?
    a, b = _pair()
    with a, b, RawPort(backend) as first:
        problem = _enable(first, a, 22, EVENT_IN, PERSISTENT)
        if problem:
            return f"first port {problem}"
        with RawPort(backend) as second:
            rc, results, _ = second.call([(a, 22, 0, OP_REMOVE, 0)], 0, 0)
            if rc not in (0, WAIT_TIMEOUT, ERROR_TIMEOUT):
                return f"whole call failed (error {rc})"
            if results[0]:
                return f"refused (error {results[0]})"
            b.send(b"x")
            there = first.collect(300)
            here = second.collect(300)
    if _keys(there, EVENT_REMOVE) or (not _keys(there, EVENT_IN) and not _keys(here, EVENT_REMOVE)):
        return "accepted: the first port's registration removed"
    if _keys(here, EVENT_REMOVE):
        return "accepted: the first port's registration removed, its REMOVE event here"
    return "accepted, nothing removed"


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


class Question(NamedTuple):
    """One documented-but-unverified rule, and how to ask a backend."""

    name: str
    ask: Callable[[str], str]


#: Every question, in the report's order: most are a registration and what
#: follows it (:func:`_after_enable`), one line each.
QUESTIONS: Tuple[Question, ...] = (
    Question("key change without REMOVE",
             _after_enable(1, EVENT_IN, PERSISTENT, _enable_again_under_key_2)),
    Question("REMOVE then ENABLE (new key) in one call",
             _after_enable(1, EVENT_IN, PERSISTENT, _remove_and_enable_under_key_2)),
    Question("delivery after DISABLE",
             _after_enable(3, EVENT_IN, PERSISTENT, _disable_with_data_queued)),
    Question("socket registered with another port",
             _on_a_second_port(4, remove_first=False, close_first=False)),
    Question("port closed with the socket registered",
             _on_a_second_port(5, remove_first=False, close_first=True)),
    Question("port closed after the socket's REMOVE",
             _on_a_second_port(6, remove_first=True, close_first=True)),
    Question("edge-triggered, not drained",
             _after_enable(7, EVENT_IN, TRIGGER_EDGE | TRIGGER_PERSISTENT, _send_twice_unread)),
    Question("ENABLE without LEVEL or EDGE",
             _after_enable(8, EVENT_IN, TRIGGER_ONESHOT, _accepted)),
    Question("closed handle in a batch", closed_handle_in_a_batch),
    Question("LEVEL|ONESHOT re-armed, data unread",
             _after_enable(11, EVENT_IN, ONESHOT, _rearm_with_data_unread)),
    Question("ENABLE of an armed registration, new filter",
             _after_enable(12, EVENT_IN, PERSISTENT, _enable_again_with_out)),
    Question("socket closed before its REMOVE event",
             _after_enable(13, EVENT_IN, ONESHOT, _remove_then_close)),
    Question("closesocket() with a notification queued",
             _after_enable(14, EVENT_IN, PERSISTENT, _close_with_data_queued)),
    Question("socket tied by CreateIoCompletionPort", tied_by_create_io_completion_port),
    Question("failed connect, OUT-only filter", failed_connect_out_only),
    Question("DISABLE without trigger flags",
             _after_enable(17, EVENT_IN, PERSISTENT, _disable_without_trigger)),
    Question("a notification's lpOverlapped", notification_overlapped),
    Question("two ENABLEs of one registration in one call", two_enables_in_one_call),
    Question("ENABLE on a second port: who hears", second_port_enable_who_hears),
    Question("ENABLE (new filter) with a notification queued",
             modify_with_a_notification_queued),
    Question("REMOVE sent to another port", remove_from_another_port),
)


#: getsockopt's level and SO_BSP_STATE (ws2def.h), and the offsets of
#: CSADDR_INFO's two address lengths on x64 (each a SOCKET_ADDRESS: a
#: pointer, then the length).
_SO_BSP_STATE = 0x1009
_LOCAL_LENGTH = struct.Struct("=8xi")
_REMOTE_LENGTH = struct.Struct("=24xi")


def bsp_state_after_reset() -> str:
    """What getsockopt(SO_BSP_STATE) answers for a connection the peer
    reset: the port reads a socket's identity with it before every renewal
    and REMOVE, and takes a failure for "unknown"."""
    a, b = _pair()
    with a:
        try:
            before = a.getsockopt(socket.SOL_SOCKET, _SO_BSP_STATE, 256)
        except OSError as exc:
            b.close()
            return f"fails even connected (error {getattr(exc, 'winerror', exc.errno)})"
        b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        b.close()                 # a reset
        time.sleep(0.1)
        try:
            a.recv(1)
        except OSError:
            pass                  # the reset, as expected
        try:
            after = a.getsockopt(socket.SOL_SOCKET, _SO_BSP_STATE, 256)
        except OSError as exc:
            return f"fails after the reset (error {getattr(exc, 'winerror', exc.errno)})"
    local = _LOCAL_LENGTH.unpack_from(after)[0] if len(after) >= 28 else 0
    remote = _REMOTE_LENGTH.unpack_from(after)[0] if len(after) >= 28 else 0
    had_remote = _REMOTE_LENGTH.unpack_from(before)[0] if len(before) >= 28 else 0
    return ("answers after the reset: local address " + ("kept" if local else "gone") +
            ", peer address " + ("kept" if remote else "gone" if had_remote else "never known"))


#: Questions about the operating system rather than the function: asked
#: once, answered by this Windows whatever the backend.
OS_QUESTIONS: Tuple[Tuple[str, Callable[[], str]], ...] = (
    ("SO_BSP_STATE after a reset", bsp_state_after_reset),
)

#: What the strict model answers in its default modes (no SN_MODEL_MODE_*
#: set), question by question: the readings the port is written against.
#: The probe prints them for a build without the model (a production
#: build); tests/test_strict_model.py checks the model answers so.
MODEL_ANSWERS: Dict[str, str] = {
    "key change without REMOVE": "first key kept",
    "REMOVE then ENABLE (new key) in one call": "first key kept; REMOVE under [1]",
    "delivery after DISABLE": "queued notification delivered",
    "socket registered with another port": "refused (error 87)",
    "port closed with the socket registered": "refused (error 87)",
    "port closed after the socket's REMOVE": "accepted",
    "edge-triggered, not drained": "one notification until drained",
    "ENABLE without LEVEL or EDGE": "refused (error 87)",
    "closed handle in a batch": "its registration failed (error 1168), the rest applied",
    "LEVEL|ONESHOT re-armed, data unread": "fires again at once",
    "ENABLE of an armed registration, new filter": "accepted, new filter used",
    "socket closed before its REMOVE event": "REMOVE event delivered",
    "closesocket() with a notification queued": "delivered after the close",
    "socket tied by CreateIoCompletionPort": "accepted",
    "failed connect, OUT-only filter": "ERR reported",
    "DISABLE without trigger flags": "accepted",
    "a notification's lpOverlapped": "lpOverlapped NULL",
    "two ENABLEs of one registration in one call": "both accepted, second filter used",
    "ENABLE on a second port: who hears": "refused (error 87)",
    "ENABLE (new filter) with a notification queued": "nothing of the old filter",
    "REMOVE sent to another port": "refused (error 1168)",
}


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
    ``{question: {backend: answer}}``. A production build has no strict
    model: its column is then what the model answers (MODEL_ANSWERS)."""
    if sys.platform != "win32":
        raise OSError("the OS probe asks Windows's ProcessSocketNotifications: "
                      "run it on Windows")
    available = available_backends()
    has_psn, why = available["psn"]
    has_model = available["strict"][0]
    columns = (["psn"] if has_psn else []) + ["strict", "afd"]
    titles = {"psn": "the OS did", "strict": "the strict model assumes",
              "afd": "the AFD polyfill does"}
    out.write(f"socknotify_loop OS probe on {platform.platform()}\n")
    out.write(f"ProcessSocketNotifications: {why}\n")
    if not has_psn:
        out.write("The OS lacks the function: only the model (and the polyfill) answer.\n")
    if not has_model:
        out.write("This build has no strict model (a test build's): its answers below are "
                  "the ones it gives in its default modes, as recorded.\n")
    answers: Dict[str, Dict[str, str]] = {}
    for question in QUESTIONS:
        answers[question.name] = {
            backend: (ask(question, backend) if backend != "strict" or has_model
                      else MODEL_ANSWERS[question.name])
            for backend in columns}
    width = max(len(q.name) for q in QUESTIONS)
    for backend in columns:
        out.write(f"\n{titles[backend]}:\n")
        for question in QUESTIONS:
            answer = answers[question.name][backend]
            mark = ""
            if backend == "psn" and meaning(answer) != meaning(answers[question.name]["strict"]):
                mark = "   <-- differs from the model"
            out.write(f"  {question.name:<{width}}  {answer}{mark}\n")
    out.write("\nthis Windows:\n")
    for name, ask_os in OS_QUESTIONS:
        try:
            answer = ask_os()
        except OSError as exc:
            answer = f"error: {exc}"
        answers[name] = {"os": answer}
        out.write(f"  {name:<{width}}  {answer}\n")
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
