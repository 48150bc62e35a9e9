"""Scenario 4 of the Winsock article: DeregisterAndWait.

Removing a registration is asynchronous: OP_REMOVE succeeds at once, but
notifications already queued for the socket may still come out of the port
afterwards. The last thing the port ever says about a registration is its
REMOVE notification, so per-socket state may only be freed once that has
arrived. ``deregister_and_wait`` below does what the sample's helper does:
OP_REMOVE in the same call that waits, then keep waiting, dropping the
socket's stale notifications, until REMOVE comes. (The sample drops every
other notification too, so it may only be used with a single registered
socket; this one hands other keys' notifications back instead.)

The program shows:
  1. a registered socket, with unread data, removed: REMOVE arrives, and then
     nothing more comes for its key even when more data is sent;
  2. OP_REMOVE of a socket already closed fails with OSError (closing a
     socket deregisters it silently) and no REMOVE ever comes. A closed
     socket object has no fileno, so its old descriptor number is passed.

    python examples/deregister_and_wait.py [--backend auto|psn|afd|epoll|strict]

Exit status: 0 when both behaved as described, 1 otherwise.
"""
import argparse
import socket
import sys
import time

from socknotify_loop.port import (
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_REMOVE,
    OP_REMOVE,
    TRIGGER_LEVEL,
    TRIGGER_PERSISTENT,
    Port,
    Registration,
)

QUIET = 0.3     # seconds of silence that count as "nothing arrives"


def deregister_and_wait(port, sock, key, timeout):
    """Remove ``sock``'s registration and wait for its REMOVE notification.

    Returns ``(stale, others)``: how many notifications for ``key`` were
    dropped on the way, and the notifications of other keys, which the caller
    still has to handle. Raises OSError if OP_REMOVE fails (then no REMOVE
    will come) and TimeoutError if REMOVE does not arrive in ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    registrations = [Registration(sock, key, 0, OP_REMOVE)]
    stale, others = 0, []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no REMOVE notification for key {key} in {timeout} s")
        batch = port.process(registrations, timeout=left)
        registrations = []
        for index, (got_key, events) in enumerate(batch):
            if got_key != key:
                others.append((got_key, events))
            elif events & EVENT_REMOVE:
                # Whatever this call dequeued after REMOVE is someone else's.
                others.extend(batch[index + 1:])
                return stale, others
            else:
                stale += 1


def check(condition, what):
    print(f"{'ok' if condition else 'FAIL'}: {what}")
    return condition


def remove_live_socket(port):
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        port.process([Registration(a, 1, EVENT_IN | EVENT_HANGUP,
                                   trigger=TRIGGER_LEVEL | TRIGGER_PERSISTENT)], timeout=0)
        b.send(b"unread")
        # Persistent and level-triggered, with the data left unread: the port
        # keeps reporting key 1, so notifications may be queued when we remove it.
        first = port.process(timeout=5)
        ok = check(any(key == 1 and events & EVENT_IN for key, events in first),
                   "key 1 reported readable")
        stale, others = deregister_and_wait(port, a, 1, timeout=5)
        ok &= check(not others, f"REMOVE for key 1 arrived ({stale} stale notifications dropped)")
        ok &= check(port.registered == 0, "no registration left")
        b.send(b"more data")
        after = port.process(timeout=QUIET)
        ok &= check(after == [],
                    f"nothing more for key 1 after REMOVE, though data was sent: {after}")
    return ok


def remove_closed_socket(port):
    a, b = socket.socketpair()
    with b:
        port.process([Registration(a, 2, EVENT_IN)], timeout=0)
        fd = a.fileno()
        a.close()
        try:
            deregister_and_wait(port, fd, 2, timeout=1)
        except TimeoutError:
            return check(False, "OP_REMOVE of a closed socket should have failed")
        except OSError as exc:
            ok = check(True, f"OP_REMOVE of a closed socket failed: {type(exc).__name__}: {exc}")
        else:
            return check(False, "OP_REMOVE of a closed socket succeeded")
        after = port.process(timeout=QUIET)
        ok &= check(after == [], f"and no REMOVE came: {after}")
        ok &= check(port.registered == 0, "no registration left")
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "psn", "afd", "epoll", "strict"])
    args = parser.parse_args(argv)
    try:
        with Port(None if args.backend == "auto" else args.backend) as port:
            print(f"backend: {port.backend}")
            ok = remove_live_socket(port)
            ok &= remove_closed_socket(port)
    except OSError as exc:
        print(f"FAIL: {type(exc).__name__}: {exc}")
        return 1
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
