"""Scenario 1 of the Winsock article: a simple replacement for poll().

One thread, one socket. A listener accepts a single connection from a helper
thread, which sends a known payload and closes. The accepted socket is
registered once, PERSISTENT and LEVEL-triggered, with the filter IN | HANGUP:
like poll(), it keeps reporting "readable" for as long as data is unread, so
nothing ever needs re-arming and the loop only waits (port.process with no
registrations plays the part of the sample's GetQueuedCompletionStatusEx).

Per notification: on IN, one non-blocking recv (level-triggered, so leftover
data simply fires again); on HANGUP, drain what is left and stop; on ERR,
get the detailed error the way the sample does, from a non-blocking recv
(SO_ERROR when recv does not fail), report it and exit 1. At the end the
socket is removed and its REMOVE notification awaited, as the sample does
before closing.

    python examples/poll_replacement.py [--backend auto|psn|afd|epoll|strict] [--reset]

--reset makes the client abort the connection (RST) instead of sending: the
program then reports the connection error and exits 1, which shows the ERR
path. Exit status: 0 when every byte arrived intact, 1 on any failure.
"""
import argparse
import socket
import struct
import sys
import threading
import time

from socknotify_loop.port import (
    EVENT_ERR,
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_REMOVE,
    OP_REMOVE,
    TRIGGER_LEVEL,
    TRIGGER_PERSISTENT,
    Port,
    Registration,
)

KEY = 1
PAYLOAD = bytes(range(256)) * 256      # 64 KiB: several recvs, so IN fires repeatedly
CHUNK = 4096
PIECE = 8192
WAIT = 10.0                            # seconds without any notification = failure


def client(address, reset, registered):
    with socket.create_connection(address, timeout=WAIT) as sock:
        if reset:
            # Wait until the server watches the socket, then abort: SO_LINGER
            # with a zero timeout turns close() into a reset.
            registered.wait(WAIT)
            linger = struct.pack("HH" if sys.platform == "win32" else "ii", 1, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        else:
            # In pieces, with pauses: the server sees IN several times before HANGUP.
            for start in range(0, len(PAYLOAD), PIECE):
                sock.sendall(PAYLOAD[start:start + PIECE])
                time.sleep(0.005)


def connection_error(sock):
    """The detailed error behind an ERR notification."""
    try:
        sock.recv(1)
    except BlockingIOError:
        pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return f"SO_ERROR {code}" if code else "no error pending on the socket"


def receive(port, sock):
    """Loop on the port until the client hangs up; returns the bytes received."""
    received = bytearray()
    notifications = 0
    while True:
        batch = port.process(timeout=WAIT)
        if not batch:
            raise RuntimeError(f"no notification for {WAIT} s")
        for key, events in batch:
            if key != KEY:
                raise RuntimeError(f"unexpected key {key}")
            notifications += 1
            if events & EVENT_ERR:
                raise ConnectionError(connection_error(sock))
            if events & EVENT_IN:
                try:
                    data = sock.recv(CHUNK)
                except BlockingIOError:
                    data = None
                except OSError as exc:
                    raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
                if data:
                    received += data
                elif data == b"":
                    events |= EVENT_HANGUP     # end of stream seen before the flag
            if events & EVENT_HANGUP:
                # The peer closed: whatever it sent before is still queued.
                while True:
                    try:
                        data = sock.recv(CHUNK)
                    except OSError as exc:
                        raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
                    if not data:
                        break
                    received += data
                print(f"client hung up after {notifications} notifications")
                return bytes(received)


def deregister(port, sock):
    """OP_REMOVE, then wait for the REMOVE notification (see deregister_and_wait.py)."""
    batch = port.process([Registration(sock, KEY, 0, OP_REMOVE)], timeout=WAIT)
    while batch:
        if any(key == KEY and events & EVENT_REMOVE for key, events in batch):
            return
        batch = port.process(timeout=WAIT)
    raise RuntimeError("no REMOVE notification")


def run(backend, reset):
    registered = threading.Event()
    with Port(backend) as port, socket.socket() as listener:
        print(f"backend: {port.backend}")
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(WAIT)
        helper = threading.Thread(target=client, daemon=True,
                                  args=(listener.getsockname(), reset, registered))
        helper.start()
        sock, _ = listener.accept()
        with sock:
            sock.setblocking(False)
            port.process([Registration(sock, KEY, EVENT_IN | EVENT_HANGUP,
                                       trigger=TRIGGER_LEVEL | TRIGGER_PERSISTENT)],
                         timeout=0)
            registered.set()
            try:
                data = receive(port, sock)
            finally:
                deregister(port, sock)
        helper.join(WAIT)
    print(f"received {len(data)} bytes")
    if data != PAYLOAD:
        raise RuntimeError(f"expected {len(PAYLOAD)} known bytes, got {len(data)} "
                           f"{'different' if len(data) == len(PAYLOAD) else ''}")
    print("all bytes match: OK")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "psn", "afd", "epoll", "strict"])
    parser.add_argument("--reset", action="store_true", help="client aborts with a reset")
    args = parser.parse_args(argv)
    try:
        run(None if args.backend == "auto" else args.backend, args.reset)
    except ConnectionError as exc:
        print(f"connection error: {exc}")
        return 1
    except (OSError, RuntimeError) as exc:
        print(f"FAIL: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
