"""Scenario 3 of the Winsock article: a multi-threaded TCP echo server.

One port, N worker threads all waiting in ``port.process``. Every
registration (the listener and each accepted socket) is LEVEL | ONESHOT: a
notification disarms its registration, so one state change goes to exactly
one thread, and that thread owns the socket until it re-arms it. Re-arming
is never a call of its own: each thread collects the registrations it owes
(re-enable the listener, register a new connection, re-enable or remove a
client) in a local list and hands them to its NEXT ``process`` call, which
applies them and then waits, in one kernel transition on Windows.

The completion key of every registration names a context object with a
``kind`` header (LISTENER or CLIENT), kept in a dict shared by the threads
under a lock, like the sample's context pointers with a type header. A
client that hangs up (recv returns b"") or fails gets OP_REMOVE; its context
is freed and its socket closed only when the REMOVE notification arrives. A
registration that fails is cleaned up by the thread that owned it: a
best-effort OP_REMOVE, and if that fails too, the socket is closed and the
context dropped at once (no REMOVE will come). Shutdown: the main thread
posts SERVER_EXIT_KEY; the thread that receives it posts it again and
returns, so the packet is relayed from thread to thread until all are gone.

The driver connects 100 clients (threads), each sending 10 messages and
checking every echoed byte, then prints one summary line.

    python examples/threaded_tcp_server.py [--backend auto|psn|afd|epoll|strict]
                                           [--threads 4] [--clients 100] [--messages 10]

Exit status: 0 only if every byte was echoed intact and no context is left.
"""
import argparse
import itertools
import random
import socket
import sys
import threading
import time

from socknotify_loop.port import (
    EVENT_ERR,
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_REMOVE,
    OP_ENABLE,
    OP_REMOVE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    Port,
    Registration,
)

LISTENER = "listener"
CLIENT = "client"
SERVER_EXIT_KEY = 2 ** 64 - 2       # a key no context uses (Port.post forbids 2**64-1)
ONESHOT = TRIGGER_LEVEL | TRIGGER_ONESHOT
CHUNK = 4096
WAIT = 30.0


class SocketContext:
    """What a completion key stands for: the socket and its kind."""

    __slots__ = ("kind", "sock", "key")

    def __init__(self, kind, sock, key):
        self.kind = kind
        self.sock = sock
        self.key = key


class EchoServer:
    def __init__(self, port, listener):
        self.port = port
        self.lock = threading.Lock()          # guards everything below
        self.contexts = {}                    # completion key -> SocketContext
        self.keys = itertools.count(1)
        self.removed = 0                      # REMOVE notifications handled
        self.clients_freed = 0                # client contexts dropped (REMOVE or clean-up)
        self.echoed = 0                       # bytes echoed
        self.failed_registrations = 0
        self.errors = []
        self.per_thread = []                  # notifications handled by each thread
        self.listener = self.new_context(LISTENER, listener)

    def new_context(self, kind, sock):
        with self.lock:
            context = SocketContext(kind, sock, next(self.keys))
            self.contexts[context.key] = context
        return context

    def drop_context(self, context):
        with self.lock:
            del self.contexts[context.key]
            if context.kind == CLIENT:
                self.clients_freed += 1
        if context.kind == CLIENT:
            context.sock.close()

    def fail(self, message):
        with self.lock:
            self.errors.append(message)
        self.port.post(SERVER_EXIT_KEY)       # stop everyone

    # -- one worker thread ------------------------------------------------

    def worker(self):
        pending = []      # registrations owed: applied by the next process() call
        handled = 0
        try:
            while True:
                registrations, pending = pending, []
                try:
                    batch = self.port.process(registrations, timeout=None)
                except OSError as exc:
                    if not any(reg.result for reg in registrations):
                        self.fail(f"process() failed: {exc}")
                        return
                    # Some registrations failed; this call's notifications
                    # were kept and come out of the next call.
                    batch = self.clean_up_failed(registrations)
                for key, events in batch:
                    if key == SERVER_EXIT_KEY:
                        self.port.post(SERVER_EXIT_KEY)    # relay to the next thread
                        return
                    handled += 1
                    with self.lock:
                        context = self.contexts.get(key)
                    if context is None:
                        self.fail(f"notification for unknown key {key}")
                        continue
                    if context.kind == LISTENER:
                        pending.extend(self.on_listener(context))
                    elif context.kind == CLIENT:
                        pending.extend(self.on_client(context, events))
                    else:
                        self.fail(f"context of unknown kind {context.kind!r}")
        finally:
            with self.lock:
                self.per_thread.append(handled)

    def clean_up_failed(self, registrations):
        """The owner of a failed registration cleans it up; returns any
        notifications the clean-up call dequeued."""
        batch = []
        for reg in registrations:
            if not reg.result:
                continue
            with self.lock:
                self.failed_registrations += 1
                context = self.contexts.get(reg.key)
            if context is None:
                continue
            if context.kind == LISTENER:
                # The listener belongs to the main thread: without it no
                # client can connect, so give up.
                self.fail(f"re-arming the listener failed: {reg.error}")
                continue
            if reg.op == OP_ENABLE:
                # Best effort: a successful OP_REMOVE means a REMOVE
                # notification will free the context as usual.
                try:
                    batch += self.port.process(
                        [Registration(context.sock, context.key, 0, OP_REMOVE)], timeout=0)
                    continue
                except OSError:
                    pass
            # Never registered, or no longer: no REMOVE will come.
            self.drop_context(context)
        return batch

    def on_listener(self, context):
        owed = []
        try:
            sock, _ = context.sock.accept()
        except BlockingIOError:
            pass               # someone else's connection attempt vanished
        except OSError as exc:
            print(f"accept failed: {exc}")
        else:
            sock.settimeout(WAIT)   # recv is called only when IN is reported
            client = self.new_context(CLIENT, sock)
            owed.append(Registration(sock, client.key, EVENT_IN | EVENT_HANGUP,
                                     OP_ENABLE, ONESHOT))
        owed.append(Registration(context.sock, context.key, EVENT_IN, OP_ENABLE, ONESHOT))
        return owed

    def on_client(self, context, events):
        if events & EVENT_REMOVE:
            # The last notification of this registration: now it may go.
            self.drop_context(context)
            with self.lock:
                self.removed += 1
            return []
        if events & (EVENT_IN | EVENT_HANGUP | EVENT_ERR):
            # One chunk per notification: level-triggered, the rest fires again.
            try:
                data = context.sock.recv(CHUNK)
                if data:
                    context.sock.sendall(data)
            except OSError:
                data = b""     # reset or timed out: treat like a hang-up
            if not data:
                return [Registration(context.sock, context.key, 0, OP_REMOVE)]
            with self.lock:
                self.echoed += len(data)
        return [Registration(context.sock, context.key, EVENT_IN | EVENT_HANGUP,
                             OP_ENABLE, ONESHOT)]


# -- the driver ---------------------------------------------------------------

def message(client, number):
    rng = random.Random(client * 1000 + number)
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))


def run_client(address, client, messages, results):
    sent = 0
    try:
        with socket.create_connection(address, timeout=WAIT) as sock:
            for number in range(messages):
                data = message(client, number)
                sock.sendall(data)
                echoed = bytearray()
                while len(echoed) < len(data):
                    chunk = sock.recv(len(data) - len(echoed))
                    if not chunk:
                        raise ConnectionError("server closed the connection")
                    echoed += chunk
                if echoed != data:
                    raise ValueError(f"message {number}: echoed bytes differ")
                sent += len(data)
        results[client] = (messages, sent, None)
    except Exception as exc:     # reported by the main thread
        results[client] = (0, sent, f"client {client}: {type(exc).__name__}: {exc}")


def run(backend, threads, clients, messages):
    with Port(backend) as port, socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.setblocking(False)
        server = EchoServer(port, listener)
        port.process([Registration(listener, server.listener.key, EVENT_IN, OP_ENABLE, ONESHOT)],
                     timeout=0)
        workers = [threading.Thread(target=server.worker, daemon=True) for _ in range(threads)]
        for worker in workers:
            worker.start()

        results = {}
        address = listener.getsockname()
        client_threads = [threading.Thread(target=run_client, daemon=True,
                                           args=(address, n, messages, results))
                          for n in range(clients)]
        for thread in client_threads:
            thread.start()
        for thread in client_threads:
            thread.join(WAIT * 2)

        # Every client has closed: wait for their REMOVE notifications.
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with server.lock:
                if server.clients_freed >= clients or server.errors:
                    break
            time.sleep(0.01)

        port.post(SERVER_EXIT_KEY)
        for worker in workers:
            worker.join(WAIT)
        alive = sum(worker.is_alive() for worker in workers)

        # The workers are gone: remove the listener and wait for its REMOVE
        # here (the relayed exit packet may still be queued: skip it).
        batch = port.process([Registration(listener, server.listener.key, 0, OP_REMOVE)],
                             timeout=WAIT)
        while batch and not any(k == server.listener.key and e & EVENT_REMOVE for k, e in batch):
            batch = port.process(timeout=WAIT)
        if batch:
            server.drop_context(server.listener)

    errors = list(server.errors)
    errors += [error for _, _, error in results.values() if error]
    if len(results) < clients:
        errors.append(f"{clients - len(results)} clients never finished")
    if alive:
        errors.append(f"{alive} server threads did not exit")
    done_messages = sum(count for count, _, _ in results.values())
    done_bytes = sum(sent for _, sent, _ in results.values())
    if server.echoed != done_bytes:
        errors.append(f"server echoed {server.echoed} bytes, clients checked {done_bytes}")
    left = len(server.contexts)
    print(f"backend {port.backend}, {threads} threads "
          f"(notifications per thread: {sorted(server.per_thread)}), "
          f"{server.removed} REMOVE notifications, "
          f"{server.failed_registrations} failed registrations")
    print(f"summary: clients={len(results)}/{clients} "
          f"messages={done_messages}/{clients * messages} "
          f"bytes={done_bytes} contexts_left={left}")
    if left:
        errors.append(f"{left} contexts left")
    for error in errors[:10]:
        print(f"FAIL: {error}")
    if not errors:
        print("all echoed bytes match: OK")
    return 1 if errors else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "psn", "afd", "epoll", "strict"])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        return run(None if args.backend == "auto" else args.backend,
                   args.threads, args.clients, args.messages)
    except OSError as exc:
        print(f"FAIL: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
