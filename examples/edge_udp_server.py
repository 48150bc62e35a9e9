"""Scenario 2 of the Winsock article: an edge-triggered UDP server.

The UDP socket is registered EDGE | PERSISTENT for IN *before* it is bound:
no datagram can arrive before the registration exists, so no rising edge can
be missed (the sample's reason for that order). An edge fires only when the
socket goes from "nothing queued" to "something queued", so on each
notification the server must read until the socket reports WOULDBLOCK
(BlockingIOError); stop earlier and the next edge may never come. That is
also why the socket is non-blocking. UDP has no connection, so no HANGUP
ever arrives: the server stops when it has counted all the datagrams.

A helper thread sends N numbered datagrams over loopback, pausing now and
then so the receive buffer cannot overflow; the server checks it got each
one exactly once. As in the sample, the registration is removed (and its
REMOVE awaited) before the socket is closed.

    python examples/edge_udp_server.py [--backend auto|psn|afd|epoll|strict] [--count N]

Exit status: 0 when all N datagrams arrived; 3 when the backend has no
edge-triggered mode (the 'afd' polyfill); 1 on any other failure.
"""
import argparse
import socket
import sys
import threading
import time

from socknotify_loop.port import (
    EVENT_ERR,
    EVENT_IN,
    EVENT_REMOVE,
    OP_REMOVE,
    TRIGGER_EDGE,
    TRIGGER_PERSISTENT,
    Port,
    Registration,
)

KEY = 1
WAIT = 10.0          # seconds without any notification = failure
BURST = 10           # datagrams between two pauses of the sender
EXIT_NO_EDGE = 3


def sender(address, count):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for number in range(count):
            sock.sendto(b"datagram %06d" % number, address)
            if number % BURST == BURST - 1:
                time.sleep(0.002)


def detailed_error(sock):
    try:
        sock.recv(1)
    except BlockingIOError:
        pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"SO_ERROR {sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)}"


def drain(sock, seen):
    """Read until WOULDBLOCK, recording each datagram's number; returns how many."""
    got = 0
    while True:
        try:
            data = sock.recv(512)
        except BlockingIOError:
            return got
        number = int(data.split()[1])
        if number in seen:
            raise RuntimeError(f"datagram {number} received twice")
        seen.add(number)
        got += 1


def serve(port, sock, count):
    seen = set()
    edges = 0
    while len(seen) < count:
        batch = port.process(timeout=WAIT)
        if not batch:
            raise RuntimeError(f"no notification for {WAIT} s, "
                               f"{len(seen)} of {count} datagrams received")
        for key, events in batch:
            if key != KEY:
                raise RuntimeError(f"unexpected key {key}")
            if events & EVENT_ERR:
                raise RuntimeError(f"socket error: {detailed_error(sock)}")
            if events & EVENT_IN:
                edges += 1
                drain(sock, seen)
    return edges


def deregister(port, sock):
    batch = port.process([Registration(sock, KEY, 0, OP_REMOVE)], timeout=WAIT)
    while batch:
        if any(key == KEY and events & EVENT_REMOVE for key, events in batch):
            return
        batch = port.process(timeout=WAIT)
    raise RuntimeError("no REMOVE notification")


def run(backend, count):
    with Port(backend) as port, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        print(f"backend: {port.backend}")
        if not port.supports(TRIGGER_EDGE):
            print(f"edge-triggered notifications are not supported by the {port.backend} "
                  f"backend: it reports readiness levels only; use TRIGGER_LEVEL "
                  f"(see poll_replacement.py)")
            return EXIT_NO_EDGE
        sock.setblocking(False)
        registration = Registration(sock, KEY, EVENT_IN, trigger=TRIGGER_EDGE | TRIGGER_PERSISTENT)
        try:
            port.process([registration], timeout=0)
            registered_before_bind = True
        except OSError as exc:
            # A backend may refuse an unbound socket. Registering after bind
            # is then safe only because the sender starts after the
            # registration: nothing can be queued before it.
            print(f"registration before bind refused ({exc}); registering after bind")
            registered_before_bind = False
        sock.bind(("127.0.0.1", 0))
        if not registered_before_bind:
            port.process([registration], timeout=0)
        helper = threading.Thread(target=sender, args=(sock.getsockname(), count), daemon=True)
        helper.start()
        try:
            edges = serve(port, sock, count)
        finally:
            deregister(port, sock)
        helper.join(WAIT)
    print(f"received {count} of {count} datagrams in {edges} edge notifications: OK")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "psn", "afd", "epoll", "strict"])
    parser.add_argument("--count", type=int, default=200, help="datagrams to send")
    args = parser.parse_args(argv)
    try:
        return run(None if args.backend == "auto" else args.backend, args.count)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"FAIL: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
