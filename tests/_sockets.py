"""Socket setup shared by the test modules: connected pairs and full buffers."""
from __future__ import annotations

import contextlib
import socket
from typing import Iterator, Optional, Tuple


def nonblocking_pair() -> Tuple[socket.socket, socket.socket]:
    """``socket.socketpair()`` (AF_UNIX on Linux, TCP loopback on Windows),
    both ends non-blocking; the caller closes them."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def tcp_pair(sndbuf: Optional[int] = None) -> Tuple[socket.socket, socket.socket]:
    """A connected TCP loopback pair (client, accepted end), blocking.
    ``sndbuf`` sets the client's SO_SNDBUF before it connects."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.socket()
        try:
            if sndbuf is not None:
                a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            a.connect(server.getsockname())
            b, _ = server.accept()
        except BaseException:
            a.close()
            raise
    return a, b


@contextlib.contextmanager
def refusing_address() -> Iterator[Tuple[str, int]]:
    """A loopback address where a TCP connect is refused, for the whole
    block: a port kept bound and never listening. Not a port bound and then
    closed: CI runs three suites side by side on one network stack, and one
    of them may bind the closed port and listen there, so that the connect
    succeeds (and then, when that listener closes, ends in a reset)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        yield probe.getsockname()


def fill_send_buffer(sock: socket.socket, chunk: int = 65536,
                     limit: int = 64 << 20) -> int:
    """Send on non-blocking ``sock`` until it would block; returns the bytes
    sent. Bounded by ``limit`` bytes, so a peer that keeps reading cannot
    keep the test here."""
    data = b"x" * chunk
    total = 0
    while total < limit:
        try:
            total += sock.send(data)
        except BlockingIOError:
            break
    return total
