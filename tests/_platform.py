"""Facts about the platform the tests run on, and the skip marks they make."""
import signal
import sys

import pytest

LINUX = sys.platform.startswith("linux")
WINDOWS = sys.platform == "win32"

linux_only = pytest.mark.skipif(not LINUX, reason="Linux (epoll, /proc, fork) only")
windows_only = pytest.mark.skipif(not WINDOWS, reason="Windows only")
#: A test whose signal handler is SIGALRM's, fired by setitimer.
no_sigalrm = pytest.mark.skipif(
    not hasattr(signal, "setitimer"),
    reason="SIGALRM and signal.setitimer are POSIX only (no such signal or timer here)")


def running_under_wine() -> bool:
    """True in a Windows Python running under Wine (ntdll exports wine_get_version)."""
    if sys.platform != "win32":
        return False
    import ctypes
    try:
        return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")
    except OSError:
        return False


#: Why a test that closes sockets from one thread while another thread's
#: Winsock calls are on them skips its Windows backends under Wine. That is
#: legal on Windows (the other call fails with WSAENOTSOCK at worst); Wine
#: 8.0's server frees the socket object while a request still holds its
#: file (server/sock.c, sock_destroy; the request made by server/async.c),
#: then crashes (the file's user woken after the free, or fd.c's and
#: sock.c's assertions) or applies the dead socket's events to whatever
#: object took its memory.
WINE_CLOSE_RACE = ("Wine 8.0's wineserver frees a socket another thread's request "
                   "still names (server/sock.c, sock_destroy): under Wine this race "
                   "crashes the server or misreports events")

#: Why a test that closes a port from one thread while another thread waits
#: on it, with a hundred sockets' AFD polls pending, skips under Wine. Legal
#: on Windows (the wait ends with ERROR_ABANDONED_WAIT_0, the polls are
#: cancelled); Wine 8.0's server crashes during that close, intermittently
#: on the strict model and always with its harshest modes, the same on code
#: before and after the port's close changed. A server crash is the
#: server's fault whatever its client does; the crash was not traced to
#: its line in Wine's source.
WINE_PORT_CLOSE_RACE = ("Wine 8.0's wineserver crashes when a completion port with "
                        "pending AFD polls is closed under another thread's wait")
