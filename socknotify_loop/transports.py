"""The loop's own socket transports: a stream transport and a datagram transport.

asyncio's ``SelectorEventLoop`` serves every connection through its private
``_SelectorSocketTransport`` and ``_SelectorDatagramTransport``. Their
behaviour is the contract programs rely on; their code is written for any
selector and any Python, and pays for that on every event. This module keeps
the behaviour (the public ``asyncio.Transport`` / ``asyncio.DatagramTransport``
interfaces, flow control both ways, half-close, ``BufferedProtocol``, the
exception handler's context, the ``repr``, ``ResourceWarning``) and writes
the paths that run per event for this loop. The choices, and why:

- The read callback registered with the loop is the read path itself.
  asyncio registers ``_read_ready``, which calls ``_read_ready_cb``, which is
  the Protocol or the BufferedProtocol path: two Python frames per event.
  Here :meth:`SocketTransport.set_protocol` picks the path and, when the kind
  of protocol changes while reading, registers the other one (``start_tls``
  swaps a ``Protocol`` for asyncio's ``SSLProtocol``, a ``BufferedProtocol``).
- The write path tests the plain case first: one flag, ``_can_send``, says
  that nothing is buffered, no end of file was written, no sendfile is in
  progress and the connection is not lost (it is recomputed where any of
  those changes, all off the hot path; under callgrind on 3.11 the four
  tests it replaces cost about 550 instructions per Protocol round trip,
  and with the flag the round trip went from 27,030 to 26,361);
  then a non-empty ``bytes`` object (one type test, where ``isinstance``
  against three types is a call); then one ``send``, and a full send
  returns at once. The rarer cases (other buffer types, errors, a
  non-empty buffer) go to :meth:`_write_checked`, which keeps asyncio's order
  of checks and errors.
- The datagram transport's ``sendto`` does the same: ``_can_send`` says
  that no datagram is queued and the connection is not lost; with it, a
  non-empty ``bytes`` object and no address to check against the
  endpoint's own, the datagram goes to the socket at once, and the rest
  goes through :meth:`DatagramTransport._sendto_checked`, in asyncio's
  order. Its read has two methods, one for a connected IPv4 socket (see
  ``DatagramTransport.__init__``) and one for the rest, so that neither
  tests per datagram which it is. Together about 830 fewer instructions
  per UDP round trip under callgrind on CPython 3.11 (docs/design.md).
- The write buffer is one ``bytearray``: a partial send keeps only what is
  left, deleting from its front is cheap in CPython (the array moves its
  start, not its bytes), and ``get_write_buffer_size`` is ``len``.
  (asyncio 3.12+ keeps a deque of memoryviews of the caller's objects; a
  copy here means a ``bytearray`` changed after ``write`` cannot change what
  is sent, as in asyncio up to 3.11.)
- State lives in plain instance attributes (CPython specialises their reads)
  with asyncio's names where programs are known to read them (``_sock``,
  ``_sock_fd``, ``_protocol``, ``_loop``, ``_closing``, ``_paused``,
  ``_buffer``, ``_conn_lost``, ``_server``, ``_eof``, ``_empty_waiter``);
  the size asked of ``recv`` is an instance attribute (a class attribute
  read through an instance is not specialised on 3.11).
- A read asks for at most 64 KiB, not asyncio's 256 KiB, until a read
  fills what it asked for. ``recv(n)`` allocates ``n`` bytes before it
  reads and shrinks them after. glibc serves an allocation above its mmap
  threshold (128 KiB until a large block is freed, which may never happen)
  with a fresh mapping, so asyncio's every read of a 100-byte message maps
  256 KiB, faults a page in, remaps it smaller and unmaps it: three system
  calls and a page fault per read, measured at 17.7 us against 2.4 us for
  a 64 KiB read (CPython 3.11, a socket pair, this machine). A read that
  fills its 64 KiB asks for ``max_size`` (256 KiB) next, so a bulk
  transfer still moves in asyncio's blocks; one that returns less than
  64 KiB goes back to the small size.
- Each ready event still runs as an asyncio ``Handle``. A registration
  whose reader was an object of the transport's own, run without a handle,
  was considered: the iteration runs such an object through its ``_run()``.
  But asyncio runs a transport's protocol callbacks in the ``contextvars``
  context copied when reading began (Python 3.15 passes it explicitly), so
  that object would still enter a context per event: the one step it would
  save is the iteration's test of the handle's arguments, a few bytecodes,
  and the registration rules of docs/design.md ("A registration's life")
  would have a second kind of reader to cover. The plain ``Handle`` is run
  inline by :meth:`socknotify_loop.loop.Loop._run_once`, which is already
  one call frame less than asyncio's ``Handle._run``.

Everything here is portable: the transports use the loop's ``_add_reader``,
``_add_writer``, ``_remove_reader`` and ``_remove_writer`` and the socket's
own methods, the same on every platform and backend.
"""
from __future__ import annotations

import _socket
import asyncio
import collections
import inspect
import logging
import socket
import sys
import warnings
from asyncio import base_events, constants, trsock
from typing import Any

__all__ = ["SocketTransport", "DatagramTransport"]

logger = logging.getLogger("asyncio")

# asyncio's private names this module needs, which typeshed does not declare.
_constants: Any = constants
_base_events: Any = base_events
_LOG_THRESHOLD_FOR_CONNLOST_WRITES: int = _constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES
_SENDFILE_TRY_NATIVE: Any = _constants._SendfileMode.TRY_NATIVE
_TransportSocket: Any = trsock.TransportSocket

#: Bytes asked of one recv() at most: asyncio's figure, so that a bulk
#: transfer drains as much per read.
_MAX_SIZE = 256 * 1024
#: Bytes asked of one recv() until a read fills them (see the module
#: docstring): below glibc's default mmap threshold of 128 KiB.
_SMALL_READ = 64 * 1024
#: The largest datagram an IPv4 or IPv6 socket can receive (the 16-bit
#: length of UDP and of IP, less the headers, is below it): a datagram
#: read of it is never truncated, and stays below the mmap threshold.
_LARGEST_IP_DATAGRAM = 64 * 1024

# Python 3.13 made a server track its transports: Server._attach and
# _detach take the transport (they took nothing before), and an unclosed
# transport detaches itself when collected. Asked of the signature, not the
# version, so that a backport is followed too.
_ATTACH_TAKES_TRANSPORT = len(inspect.signature(_base_events.Server._attach).parameters) > 1
# Python 3.13 sends an empty datagram (it returned without sending before)
# and counts 8 bytes of header per buffered datagram.
_SEND_EMPTY_DATAGRAM = sys.version_info >= (3, 13)
_DATAGRAM_HEADER = 8 if sys.version_info >= (3, 13) else 0
# Python 3.14 words the stream write's TypeError differently.
if sys.version_info >= (3, 14):
    _WRITE_TYPE_MESSAGE = "data argument must be a bytes, bytearray, or memoryview object, not {!r}"
else:
    _WRITE_TYPE_MESSAGE = "data argument must be a bytes-like object, not {!r}"
_DATAGRAM_TYPE_MESSAGE = "data argument must be a bytes-like object, not {!r}"
# Python 3.12 gave the stream transport a writelines() of its own, which
# checks end of file and sendfile before anything else, in its own words.
_WRITELINES_CHECKS_FIRST = sys.version_info >= (3, 12)
#: What DatagramTransport._sendto_checked answers for a datagram dropped
#: or queued: nothing to send now.
_DONE: Any = object()


# A socket's family and type as plain numbers: socket.socket's properties
# make an enum member on every read (an IntEnum lookup through four Python
# frames), the C socket's own descriptors answer the number. Anything else
# passed as a socket (a test's mock, as CPython's suites pass) is asked
# for its attributes. The test is of the object's real type, not
# isinstance(): a mock made with spec=socket.socket claims the socket
# class through its __class__, and the C descriptors refuse it.
_c_family: Any = getattr(_socket.socket, "family", None)
_c_type: Any = getattr(_socket.socket, "type", None)


def _family_of(sock: Any) -> Any:
    if _c_family is not None and issubclass(type(sock), _socket.socket):
        return _c_family.__get__(sock)
    return sock.family


def _type_of(sock: Any) -> Any:
    if _c_type is not None and issubclass(type(sock), _socket.socket):
        return _c_type.__get__(sock)
    return sock.type


_IP_FAMILIES = (int(socket.AF_INET), int(socket.AF_INET6))


def _set_nodelay(sock: socket.socket) -> None:
    """TCP_NODELAY on a TCP socket, as asyncio sets it: small writes go out
    without waiting for the peer's acknowledgement of the last ones."""
    if (_family_of(sock) in _IP_FAMILIES
            and _type_of(sock) == socket.SOCK_STREAM
            and sock.proto == socket.IPPROTO_TCP):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _polling(loop: Any, fd: int, event: int) -> bool:
    """Whether the loop's selector watches ``fd`` for ``event`` (for repr)."""
    key = loop.selector_key(fd)
    return key is not None and bool(key.events & event)


def _set_result_unless_cancelled(waiter: asyncio.Future[None]) -> None:
    """Wake ``waiter`` unless its owner gave up on it."""
    if not waiter.cancelled():
        waiter.set_result(None)


class _Common:
    """What both transports share: their state, closing, errors, flow control
    of writes, ``get_extra_info``, ``repr`` and ``ResourceWarning``.

    A mixin placed before asyncio's public base class, which brings the
    ``_extra`` slot and ``get_extra_info``.
    """

    # No class-level defaults for what the read and write paths read:
    # CPython 3.11 does not specialise the read of an instance attribute
    # that shadows a class attribute, and each such read was a generic
    # lookup (244 instructions per raw Protocol round trip for _sock,
    # _can_send and the read sizes together, 25,143 to 24,899 under
    # callgrind). __del__ and __repr__, which may meet an instance whose
    # __init__ failed early, read _sock with getattr.
    _sock: socket.socket | None
    # write() may send at once (SocketTransport keeps it current).
    _can_send: bool
    _extra: dict[str, Any]
    _loop: Any
    _protocol: Any
    _buffer: Any

    def _setup(self, loop: Any, sock: socket.socket, protocol: Any,
               extra: dict[str, Any] | None, context: Any) -> None:
        """The state both transports share. Each ``__init__`` sets its own
        after it, then :meth:`_enter`: nothing outside the transport knows
        of it before every attribute is set."""
        self._loop = loop
        self._sock = sock
        self._server = None    # the server, once attached to it (_enter)
        self._closing = False
        self._can_send = False
        self._sock_fd = sock.fileno()
        self._context = context
        self._protocol_connected = False
        self._conn_lost = 0    # counts writes after the connection was lost
        self._paused = False   # reading paused by pause_reading()
        # Flow control of writes (asyncio's defaults: 64 KiB high, a
        # quarter of it low).
        self._protocol_paused = False
        self._high_water = 64 * 1024
        self._low_water = 16 * 1024
        self._extra = {} if extra is None else extra
        self._extra["socket"] = _TransportSocket(sock)
        try:
            self._extra["sockname"] = sock.getsockname()
        except OSError:
            self._extra["sockname"] = None
        if "peername" not in self._extra:
            try:
                self._extra["peername"] = sock.getpeername()
            except OSError:
                self._extra["peername"] = None

    def _enter(self, server: Any) -> None:
        """The last step of ``__init__``: attach to ``server`` (asyncio's
        Server refuses once closed: its _attach asserts that it still has
        sockets, which a server closed while a connection was being
        accepted has not) and join the loop's transports."""
        if server is not None:
            if _ATTACH_TAKES_TRANSPORT:
                server._attach(self)
            else:
                server._attach()
            self._server = server
        self._loop._transports[self._sock_fd] = self

    def _abandon(self, sock: Any) -> None:
        """``__init__`` failed: the transport was never handed out, so its
        socket is closed now, not by a finalizer (asyncio leaves it to the
        transport's, which warns of an unclosed transport, or to the
        socket's), and the peer sees the connection end at once."""
        self._sock = None
        sock.close()

    def _call_soon(self, callback: Any, *args: Any) -> None:
        if self._context is None:
            self._loop.call_soon(callback, *args)
        else:
            self._loop.call_soon(callback, *args, context=self._context)

    def _add_reader(self, callback: Any) -> None:
        if self._context is None:
            self._loop._add_reader(self._sock_fd, callback)
        else:
            self._loop._add_reader(self._sock_fd, callback, context=self._context)

    def _add_writer(self, callback: Any) -> None:
        if self._context is None:
            self._loop._add_writer(self._sock_fd, callback)
        else:
            self._loop._add_writer(self._sock_fd, callback, context=self._context)

    def _start(self, waiter: asyncio.Future[None] | None) -> None:
        """connection_made, then reading, then the waiter, each as a callback
        of its own (asyncio's order: reading starts once connection_made ran)."""
        self._call_soon(self._protocol.connection_made, self)
        self._call_soon(self._start_reading)
        if waiter is not None:
            self._call_soon(_set_result_unless_cancelled, waiter)

    def _start_reading(self) -> None:
        if not self._closing and not self._paused:
            self._add_reader(self._reader())

    def _reader(self) -> Any:
        raise NotImplementedError

    _max_size: int
    _read_size: int
    # A read of at least this many bytes calls _resize_read: what it asked
    # for while small (a full read grows it), 0 while large (any read may
    # shrink it), never when max_size is at most the small size.
    _resize_at: int

    @property
    def max_size(self) -> int:
        """The most bytes one read asks for (asyncio's attribute of the
        same name; a program or test may set it)."""
        return self._max_size

    @max_size.setter
    def max_size(self, value: int) -> None:
        self._max_size = value
        self._set_read_size(min(value, self._first_read_size()))

    def _set_read_size(self, size: int) -> None:
        self._read_size = size
        if size < self._max_size:
            self._resize_at = size
        elif size > _SMALL_READ:
            self._resize_at = 0
        else:
            self._resize_at = sys.maxsize

    def _first_read_size(self) -> int:
        """What a read asks for before any read filled it."""
        return _SMALL_READ

    def _update_can_send(self) -> None:
        """Recompute ``_can_send`` after a change of the state it sums up."""

    def __repr__(self) -> str:
        info = [type(self).__name__]
        if getattr(self, "_sock", None) is None:
            info.append("closed")
        elif getattr(self, "_closing", False):
            info.append("closing")
        fd = getattr(self, "_sock_fd", None)
        info.append(f"fd={fd}")
        loop = getattr(self, "_loop", None)
        if loop is not None and fd is not None and not loop.is_closed():
            info.append("read=polling" if _polling(loop, fd, 1) else "read=idle")
            state = "polling" if _polling(loop, fd, 2) else "idle"
            try:
                size = self.get_write_buffer_size()
            except AttributeError:   # an __init__ that failed before the buffer
                size = 0
            info.append(f"write=<{state}, bufsize={size}>")
        return "<{}>".format(" ".join(info))

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def abort(self) -> None:
        self._force_close(None)

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol
        self._protocol_connected = True

    def get_protocol(self) -> Any:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return not self._closing and not self._paused

    def pause_reading(self) -> None:
        if self._closing or self._paused:
            return
        self._paused = True
        self._loop._remove_reader(self._sock_fd)
        if self._loop.get_debug():
            logger.debug("%r pauses reading", self)

    def resume_reading(self) -> None:
        if self._closing or not self._paused:
            return
        self._paused = False
        self._add_reader(self._reader())
        if self._loop.get_debug():
            logger.debug("%r resumes reading", self)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop._remove_reader(self._sock_fd)
        if not self._buffer:
            self._conn_lost += 1
            self._update_can_send()
            self._loop._remove_writer(self._sock_fd)
            self._call_soon(self._call_connection_lost, None)

    def __del__(self, _warn: Any = warnings.warn) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None:
            # Closed before the warning, which may raise (-W error) or, on
            # an object that something left half made, fail to format.
            sock.close()
            server = getattr(self, "_server", None)   # set once attached
            if server is not None and _ATTACH_TAKES_TRANSPORT:
                server._detach(self)
            _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)

    def _fatal_error(self, exc: BaseException,
                     message: str = "Fatal error on transport") -> None:
        """Close at once after ``exc``; a failure other than an OSError (a
        protocol's callback raising, a bug) goes to the exception handler."""
        if isinstance(exc, OSError):
            if self._loop.get_debug():
                logger.debug("%r: %s", self, message, exc_info=True)
        else:
            self._loop.call_exception_handler({
                "message": message,
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            })
        self._force_close(exc)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._conn_lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._after_buffer_cleared()
        # Both removed whatever the buffer and the flags say (asyncio removes
        # the writer only for a non-empty buffer, the reader only if not yet
        # closing): an exception part way through a write or a close (a
        # MemoryError, a signal handler's) may have left a writer with
        # nothing buffered, or the flag set before its reader was removed.
        self._closing = True
        self._loop._remove_writer(self._sock_fd)
        self._loop._remove_reader(self._sock_fd)
        self._conn_lost += 1
        self._update_can_send()
        self._call_soon(self._call_connection_lost, exc)

    def _after_buffer_cleared(self) -> None:
        """Hook for a transport that counts its buffer apart from it."""

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            if self._protocol_connected:
                self._protocol.connection_lost(exc)
        finally:
            # Nothing of this descriptor may stay in the selector once it is
            # closed: the next socket given its number would meet the key
            # (its registration failing underneath, the connection hung).
            # The paths that got here removed both already; this holds
            # whatever exception cut one of them short.
            loop = self._loop
            loop._remove_reader(self._sock_fd)
            loop._remove_writer(self._sock_fd)
            self._sock.close()  # type: ignore[union-attr]  # once: _conn_lost guards
            self._sock = None
            self._protocol = None
            self._loop = None
            server = self._server
            if server is not None:
                if _ATTACH_TAKES_TRANSPORT:
                    server._detach(self)
                else:
                    server._detach()
                self._server = None

    # Flow control of writes: the protocol is told to pause above the high
    # mark and to resume at or below the low one.

    def set_write_buffer_limits(self, high: int | None = None,
                                low: int | None = None) -> None:
        self._set_write_buffer_limits(high, low)
        self._maybe_pause_protocol()

    def _set_write_buffer_limits(self, high: int | None = None,
                                 low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high_water = high
        self._low_water = low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low_water, self._high_water)

    def _maybe_pause_protocol(self) -> None:
        if self.get_write_buffer_size() <= self._high_water or self._protocol_paused:
            return
        self._protocol_paused = True
        self._flow_callback(self._protocol.pause_writing, "pause_writing")

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and self.get_write_buffer_size() <= self._low_water:
            self._protocol_paused = False
            self._flow_callback(self._protocol.resume_writing, "resume_writing")

    def _flow_callback(self, callback: Any, name: str) -> None:
        """The protocol's pause_writing() or resume_writing(): a failure is
        the exception handler's, as with asyncio, and the transport goes on."""
        try:
            callback()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": f"protocol.{name}() failed",
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            })


class SocketTransport(_Common, asyncio.Transport):
    """A stream transport on a connected TCP or Unix socket."""

    # What asyncio's loop asks of a transport before start_tls and sendfile.
    _start_tls_compatible = True
    _sendfile_compatible = _SENDFILE_TRY_NATIVE

    def __init__(self, loop: Any, sock: socket.socket, protocol: Any,
                 waiter: asyncio.Future[None] | None = None,
                 extra: dict[str, Any] | None = None, server: Any = None,
                 context: Any = None) -> None:
        self._buffered = False
        try:
            self._setup(loop, sock, protocol, extra, context)
            self._buffer = bytearray()
            self._eof = False
            self._empty_waiter: asyncio.Future[None] | None = None
            self.max_size = _MAX_SIZE   # the property: sets _read_size too
            self.set_protocol(protocol)
            _set_nodelay(sock)
            self._enter(server)
        except BaseException:
            self._abandon(sock)
            raise
        self._can_send = True
        self._start(waiter)

    def _reader(self) -> Any:
        return self._read_into if self._buffered else self._read

    @property
    def _read_ready_cb(self) -> Any:
        """What asyncio's transport names its read path for the protocol's
        kind, None once closing (Python 3.13's close() clears it; CPython's
        test_ssl reads it to tell a closed transport)."""
        return None if self._closing else self._reader()

    def _update_can_send(self) -> None:
        self._can_send = not (self._buffer or self._eof or self._conn_lost
                              or self._empty_waiter is not None)

    def set_protocol(self, protocol: Any) -> None:
        buffered = isinstance(protocol, asyncio.BufferedProtocol)
        switch = buffered is not self._buffered
        self._buffered = buffered
        super().set_protocol(protocol)
        if switch and self._sock is not None:
            # This transport's reader, registered for the other kind of
            # protocol, is replaced (asyncio reaches the right path through
            # one more call per event; here the registration itself is the
            # path). Only its own: before reading starts the socket's
            # registration, if any, is not the transport's.
            key = self._loop.selector_key(self._sock_fd)
            if key is None:
                return
            reader = key.data[0]
            if (reader is not None and not reader._cancelled
                    and reader._callback in (self._read, self._read_into)):
                self._add_reader(self._reader())

    # -- reading -----------------------------------------------------------

    def _read(self) -> None:
        """Ready to read, for a Protocol: recv, then data_received."""
        if self._conn_lost:
            return
        try:
            data = self._sock.recv(self._read_size)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal read error on socket transport")
            return
        if data:
            if len(data) >= self._resize_at:
                self._resize_read(len(data))
            try:
                self._protocol.data_received(data)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")
        else:
            self._read_eof()

    def _resize_read(self, got: int) -> None:
        """After a read of ``got`` bytes: a read that filled what it asked
        for asks for ``max_size`` next (more is likely waiting); a large
        read that got less than the small size goes back to it."""
        if got == self._read_size:
            self._set_read_size(self._max_size)
        elif got < _SMALL_READ:
            self._set_read_size(min(self._max_size, _SMALL_READ))

    def _read_into(self) -> None:
        """Ready to read, for a BufferedProtocol: into its own buffer."""
        if self._conn_lost:
            return
        try:
            buf = self._protocol.get_buffer(-1)
            if not len(buf):
                raise RuntimeError("get_buffer() returned an empty buffer")
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.get_buffer() call failed.")
            return
        try:
            nbytes = self._sock.recv_into(buf)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal read error on socket transport")
            return
        if not nbytes:
            self._read_eof()
            return
        try:
            self._protocol.buffer_updated(nbytes)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.buffer_updated() call failed.")

    def _read_eof(self) -> None:
        """The peer's end of file: eof_received() says whether to stay open
        (for writing); if not, the transport closes."""
        if self._loop.get_debug():
            logger.debug("%r received EOF", self)
        try:
            keep_open = self._protocol.eof_received()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
            return
        if keep_open:
            # Nothing more can be read: stop asking.
            self._loop._remove_reader(self._sock_fd)
        else:
            self.close()

    # -- writing -----------------------------------------------------------

    def write(self, data: Any) -> None:
        """Send ``data`` now as far as the socket takes it, buffer the rest."""
        if not self._can_send or type(data) is not bytes or not data:
            data = self._write_checked(data)
            if data is None:
                return
        try:
            n = self._sock.send(data)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            n = 0
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal write error on socket transport")
            return
        if n != len(data):
            self._buffer_rest(data, n)

    def _buffer_rest(self, data: Any, n: int) -> None:
        """What a direct send left: into the buffer, sent when writable.

        In this order, so that an exception at any step (copying a large
        rest may raise MemoryError; a signal handler may raise anywhere)
        leaves a state the transport goes on from: ``_can_send`` off
        first (a later write goes behind whatever got buffered), then the
        writer, then the copy. A writer with nothing buffered sends nothing
        and removes itself; a buffer without a writer would never drain,
        and a close() would wait for it forever."""
        self._can_send = False
        self._add_writer(self._write_ready)
        self._buffer.extend(memoryview(data)[n:])
        self._maybe_pause_protocol()

    def _write_checked(self, data: Any) -> Any:
        """write()'s checks for every case but the plain one, in asyncio's
        order: the type, end of file, sendfile, empty data, a lost
        connection (counted, and logged past a threshold), data already
        buffered (appended). Returns what write()'s one send is to send
        now, or None.

        A memoryview whose items are not single bytes, or that has more
        than one dimension, is sent as the bytes it views: write() counts
        what send() took, in bytes, against the data's ``len()``, which
        counts such a view's items (its rows, for a 2-D one), and a
        partial send would otherwise be taken for a whole one or cut at
        the wrong place (asyncio's transport loses those bytes). A view
        that is not C-contiguous is left as it is, for send() to refuse
        with asyncio's BufferError."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(_WRITE_TYPE_MESSAGE.format(type(data).__name__))
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if self._empty_waiter is not None:
            raise RuntimeError("unable to write; sendfile is in progress")
        if not data:
            return None
        if self._conn_lost:
            if self._conn_lost >= _LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                logger.warning("socket.send() raised exception.")
            self._conn_lost += 1
            self._can_send = False
            return None
        if self._buffer:
            self._buffer.extend(data)   # a view's bytes, whatever its items
            self._maybe_pause_protocol()
            return None
        if (type(data) is memoryview and (data.itemsize != 1 or data.ndim != 1)
                and data.c_contiguous):
            return data.cast("B")
        return data

    def writelines(self, list_of_data: Any) -> None:
        """Write the concatenation of ``list_of_data`` (one send, not many).

        With the running Python's checks, as write() has: asyncio up to
        3.11 joins the list and calls write(), whose checks then refuse
        (a list that does not join fails first); from 3.12 writelines()
        checks end of file and sendfile first, in its own words, then
        takes each item as a memoryview."""
        if _WRITELINES_CHECKS_FIRST:
            if self._eof:
                raise RuntimeError("Cannot call writelines() after write_eof()")
            if self._empty_waiter is not None:
                raise RuntimeError("unable to writelines; sendfile is in progress")
            if not list_of_data:
                return
            list_of_data = [memoryview(data) for data in list_of_data]
        self.write(b"".join(list_of_data))

    def _write_ready(self) -> None:
        """Writable with data buffered: send what the socket takes."""
        if self._conn_lost:
            return
        buffer = self._buffer
        try:
            n = self._sock.send(buffer)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop._remove_writer(self._sock_fd)
            buffer.clear()
            self._fatal_error(exc, "Fatal write error on socket transport")
            if self._empty_waiter is not None:
                self._empty_waiter.set_exception(exc)
            return
        if n:
            del buffer[:n]
        self._maybe_resume_protocol()  # may write more
        if not buffer:
            self._update_can_send()
            self._loop._remove_writer(self._sock_fd)
            if self._empty_waiter is not None:
                self._empty_waiter.set_result(None)
            if self._closing:
                # close() with data buffered: the data is out, now close.
                if not self._conn_lost:
                    self._conn_lost += 1
                    self._can_send = False
                    self._call_connection_lost(None)
            elif self._eof:
                self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]

    def write_eof(self) -> None:
        """Half-close: no more writes; the buffered data still goes first."""
        if self._closing or self._eof:
            return
        self._eof = True
        self._can_send = False
        if not self._buffer:
            self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]

    def can_write_eof(self) -> bool:
        return True

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            super()._call_connection_lost(exc)
        finally:
            if self._empty_waiter is not None:
                self._empty_waiter.set_exception(
                    ConnectionError("Connection is closed by peer"))

    # -- sendfile (the loop's _sendfile_native drives these) ----------------

    def _make_empty_waiter(self) -> asyncio.Future[None]:
        """A future done once the write buffer is empty."""
        if self._empty_waiter is not None:
            raise RuntimeError("Empty waiter is already set")
        self._empty_waiter = self._loop.create_future()
        self._can_send = False
        if not self._buffer:
            self._empty_waiter.set_result(None)
        return self._empty_waiter

    def _reset_empty_waiter(self) -> None:
        self._empty_waiter = None
        self._update_can_send()


class DatagramTransport(_Common, asyncio.Transport, asyncio.DatagramTransport):
    """A datagram transport on a UDP (or Unix datagram) socket.

    Also an ``asyncio.Transport``, as asyncio's is (CPython's tests check
    it), so ``pause_reading``/``resume_reading`` work on it too."""

    def __init__(self, loop: Any, sock: socket.socket, protocol: Any,
                 address: Any = None, waiter: asyncio.Future[None] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        try:
            self._setup(loop, sock, protocol, extra, None)
            self._buffer: collections.deque[tuple[bytes, Any]] = collections.deque()
            self._address = address
            self._buffer_size = 0
            self.max_size = _MAX_SIZE   # the property: sets _read_size too
            self.set_protocol(protocol)
            self._enter(None)
        except BaseException:
            self._abandon(sock)
            raise
        # Connected (to ``address`` or already): send(), not sendto().
        self._connected = bool(self._extra["peername"])
        # A connected IPv4 socket receives from its peer alone (connect(2):
        # "the only address from which datagrams are received"; Winsock's
        # connect: datagrams from any other address are discarded), so
        # its reads are recv() with the peer's address, the tuple recvfrom
        # would make: recvfrom formats the sender's address on every read
        # (inet_ntop, whose printf is about 2,500 instructions per round
        # trip of the UDP benchmark, CPython 3.11). Not IPv6, whose
        # recvfrom may report a flow label or scope the connect did not
        # name, nor Unix datagrams, whose sender's name may differ.
        self._peer: Any = (self._extra["peername"]
                           if self._connected and _family_of(sock) == socket.AF_INET else None)
        self._can_send = True
        self._start(waiter)

    def _reader(self) -> Any:
        # Two read paths, so that neither tests which one it is per event.
        return self._read if self._peer is None else self._read_peer

    def _update_can_send(self) -> None:
        self._can_send = not (self._buffer or self._conn_lost)

    def _first_read_size(self) -> int:
        """A datagram is read whole or cut, so its read never grows: on an
        IPv4 or IPv6 socket, the largest datagram there is (below the mmap
        threshold, see the module docstring); on any other (a Unix
        datagram may be larger) asyncio's ``max_size``."""
        sock = self._sock
        if sock is not None and _family_of(sock) in _IP_FAMILIES:
            return _LARGEST_IP_DATAGRAM
        return _MAX_SIZE

    def get_write_buffer_size(self) -> int:
        return self._buffer_size

    def _after_buffer_cleared(self) -> None:
        self._buffer_size = 0

    def _read(self) -> None:
        """Ready to read: one datagram and its sender's address to
        datagram_received."""
        if self._conn_lost:
            return
        try:
            data, addr = self._sock.recvfrom(self._read_size)  # type: ignore[union-attr]
        except BaseException as exc:
            self._read_failed(exc)
            return
        self._protocol.datagram_received(data, addr)

    def _read_peer(self) -> None:
        """_read for a connected IPv4 socket: recv, and its peer's address
        (see __init__)."""
        if self._conn_lost:
            return
        try:
            data = self._sock.recv(self._read_size)  # type: ignore[union-attr]
        except BaseException as exc:
            self._read_failed(exc)
            return
        self._protocol.datagram_received(data, self._peer)

    def _read_failed(self, exc: BaseException) -> None:
        """What a read's exception means: nothing to read yet
        (BlockingIOError, InterruptedError), an error the socket reports
        (an OSError, such as the ICMP error of an earlier datagram) for
        error_received, SystemExit and KeyboardInterrupt to go on, and
        anything else a fatal error."""
        if isinstance(exc, (BlockingIOError, InterruptedError)):
            return
        if isinstance(exc, OSError):
            self._protocol.error_received(exc)
        elif isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise exc
        else:
            self._fatal_error(exc, "Fatal read error on datagram transport")

    def sendto(self, data: Any, addr: Any = None) -> None:
        """Send one datagram now, or queue it while earlier ones wait."""
        # The plain case tested first, as in the stream transport's
        # write(): nothing queued and the connection not lost
        # (_can_send), a non-empty bytes object, and no address to check
        # against the endpoint's own. Anything else goes through
        # _sendto_checked, in asyncio's order of checks and errors.
        if (not self._can_send or type(data) is not bytes or not data
                or (addr is not None and self._address is not None)):
            addr = self._sendto_checked(data, addr)
            if addr is _DONE:
                return
        try:
            if self._connected:
                self._sock.send(data)  # type: ignore[union-attr]
            else:
                self._sock.sendto(data, addr)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            self._add_writer(self._sendto_ready)
            self._queue(data, addr)
        except OSError as exc:
            self._protocol.error_received(exc)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal write error on datagram transport")

    def _sendto_checked(self, data: Any, addr: Any) -> Any:
        """sendto()'s checks for every case but the plain one: the address
        to send to now, or _DONE when the datagram was dropped or queued
        (or, from a check, an exception)."""
        if type(data) is not bytes and not isinstance(data, (bytearray, memoryview)):
            raise TypeError(_DATAGRAM_TYPE_MESSAGE.format(type(data).__name__))
        if not data and not _SEND_EMPTY_DATAGRAM:
            return _DONE
        address = self._address
        if address:
            # Not `addr not in (None, address)`: that builds a tuple per call.
            if addr is not None and addr is not address and addr != address:
                raise ValueError(f"Invalid address: must be None or {address}")
            addr = address
        if self._conn_lost and self._address:
            if self._conn_lost >= _LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                logger.warning("socket.send() raised exception.")
            self._conn_lost += 1
            return _DONE
        if self._buffer:
            self._queue(data, addr)
            return _DONE
        return addr

    def _queue(self, data: Any, addr: Any) -> None:
        """A datagram into the queue, sent once the socket is writable.

        ``_can_send`` goes off first, as in the stream transport's
        ``_buffer_rest``: whatever step an exception cuts short, a later
        datagram is not sent ahead of a queued one."""
        self._can_send = False
        # A copy: the caller may reuse a mutable buffer. Its length is
        # what is counted, added here and taken back when it is sent (a
        # memoryview's len() counts its items, not its bytes).
        data = bytes(data)
        self._buffer.append((data, addr))
        self._buffer_size += len(data) + _DATAGRAM_HEADER
        self._maybe_pause_protocol()

    def _sendto_ready(self) -> None:
        """Writable with datagrams queued: send them in order."""
        if self._conn_lost:
            return
        buffer = self._buffer
        while buffer:
            data, addr = buffer.popleft()
            self._buffer_size -= len(data) + _DATAGRAM_HEADER
            try:
                if self._connected:
                    self._sock.send(data)  # type: ignore[union-attr]
                else:
                    self._sock.sendto(data, addr)  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                buffer.appendleft((data, addr))  # the next writable event
                self._buffer_size += len(data) + _DATAGRAM_HEADER
                break
            except OSError as exc:
                self._protocol.error_received(exc)
                return
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                # The writer goes first: the failed datagram is out of the
                # queue, which may now be empty, and _force_close removes
                # the writer only for a non-empty queue. Left registered,
                # it would run again after connection_lost, on a transport
                # without a loop (asyncio's does, and fails there), and
                # stay in the selector for a closed descriptor, which the
                # next socket given that number would inherit.
                self._loop._remove_writer(self._sock_fd)
                self._fatal_error(exc, "Fatal write error on datagram transport")
                return
        self._maybe_resume_protocol()  # may queue more
        if not buffer:
            self._update_can_send()
            self._loop._remove_writer(self._sock_fd)
            if self._closing:
                # close() with datagrams queued: they are out, now close.
                self._conn_lost += 1
                self._can_send = False
                self._call_connection_lost(None)


class _SendfileFallback(asyncio.Protocol):
    """The protocol a stream transport has while ``loop.sendfile`` writes a
    file through it by reads and writes (where no native sendfile applies).

    asyncio's loop does this with a private protocol class that accepts only
    its own transports' private base; this one does the same for ours: the
    transport's protocol is set aside with reading paused, the writes wait
    for the buffer to drain below its low mark, and :meth:`restore` puts
    the protocol back (with a ``resume_writing`` it would otherwise miss).
    """

    def __init__(self, transport: SocketTransport) -> None:
        self._transport = transport
        self._proto = transport.get_protocol()
        self._should_resume_reading = transport.is_reading()
        self._should_resume_writing = transport._protocol_paused
        transport.pause_reading()
        transport.set_protocol(self)
        # Writing is paused from the start if the transport already was.
        self._writable: asyncio.Future[None] | None = (
            transport._loop.create_future() if self._should_resume_writing else None)

    async def drain(self) -> None:
        """Return once another block may be written."""
        if self._transport.is_closing():
            raise ConnectionError("Connection closed by peer")
        if self._writable is not None:
            await self._writable

    def connection_made(self, transport: Any) -> None:
        raise RuntimeError("Invalid state: connection should have been established already.")

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._writable is not None:
            # The file was not all sent: for the sender, always an error.
            self._writable.set_exception(
                exc if exc is not None else ConnectionError("Connection is closed by peer"))
        self._proto.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._transport._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            self._writable.set_result(None)
            self._writable = None

    def data_received(self, data: bytes) -> None:
        raise RuntimeError("Invalid state: reading should be paused")

    def eof_received(self) -> None:
        raise RuntimeError("Invalid state: reading should be paused")

    async def restore(self) -> None:
        """Give the transport back to its protocol."""
        transport = self._transport
        transport.set_protocol(self._proto)
        if self._should_resume_reading:
            transport.resume_reading()
        if self._writable is not None:
            # Nothing waits on it any more: the protocol is switched back.
            self._writable.cancel()
        if self._should_resume_writing:
            self._proto.resume_writing()


async def sendfile_fallback(loop: Any, transport: SocketTransport, file: Any,
                            offset: int, count: int | None) -> int:
    """``loop.sendfile`` by reads (in the loop's executor) and writes, in
    blocks of at most 16 KiB (asyncio's), for the loop's own stream
    transport. Returns the bytes sent; the file's position ends after them."""
    if offset:
        file.seek(offset)
    block = min(count, 16384) if count else 16384
    buf = bytearray(block)
    sent = 0
    proto = _SendfileFallback(transport)
    try:
        while True:
            if count:
                block = min(count - sent, block)
                if block <= 0:
                    return sent
            view = memoryview(buf)[:block]
            got = await loop.run_in_executor(None, file.readinto, view)
            if not got:
                return sent   # end of file
            await proto.drain()
            transport.write(view[:got])   # copied into the buffer if not sent
            sent += got
    finally:
        if sent > 0 and hasattr(file, "seek"):
            file.seek(offset + sent)
        await proto.restore()
