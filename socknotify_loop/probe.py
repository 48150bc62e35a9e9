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
- ENABLE without LEVEL or EDGE (refused?).

Each question runs on a fresh completion port through the bare function
(:class:`~socknotify_loop.port.RawPort`, the port module's wrapper of
``sn_raw_*`` in the core: no table, no key translation), with sockets
from :func:`socket.socketpair`. Where the OS lacks the function the probe
says so and prints the model's answers (and the AFD polyfill's, for
contrast) only.
"""
from __future__ import annotations

import platform
import socket
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, TextIO, Tuple

from .port import (
    ERROR_TIMEOUT,
    EVENT_IN,
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
)


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
            if backend == "psn" and answer != answers[question.name]["strict"]:
                mark = "   <-- differs from the model"
            out.write(f"  {question.name:<{width}}  {answer}{mark}\n")
    return answers


def main(out: TextIO = sys.stdout) -> int:
    """``--probe-os``: 0 once the table is printed, 1 if it cannot run here."""
    try:
        probe(out)
    except OSError as exc:
        sys.stderr.write(f"socknotify_loop: {exc}\n")
        return 1
    return 0
