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


def open_handles() -> int:
    """Handles (Windows) or file descriptors (Linux) this process holds.

    On Windows this is GetProcessHandleCount. Wine 8.0 answers that with 0
    whatever the process holds (dlls/ntdll/unix/process.c, ProcessHandleCount
    is a stub), which would make every leak test pass; under Wine the count
    is taken from the system's handle table instead
    (NtQuerySystemInformation's SystemExtendedHandleInformation, which Wine
    fills from its server), keeping this process's entries."""
    if not WINDOWS:
        import os
        return len(os.listdir("/proc/self/fd"))
    import ctypes
    from ctypes import wintypes
    if not running_under_wine():
        count = wintypes.DWORD()
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        if not kernel32.GetProcessHandleCount(kernel32.GetCurrentProcess(), ctypes.byref(count)):
            raise ctypes.WinError(ctypes.get_last_error())
        return count.value
    return _handles_in_system_table()


def _handles_in_system_table() -> int:
    import ctypes
    import os

    class Entry(ctypes.Structure):   # SYSTEM_HANDLE_TABLE_ENTRY_INFO_EX
        _fields_ = [("object", ctypes.c_void_p), ("pid", ctypes.c_size_t),
                    ("handle", ctypes.c_size_t), ("access", ctypes.c_ulong),
                    ("creator_back_trace", ctypes.c_ushort), ("type", ctypes.c_ushort),
                    ("attributes", ctypes.c_ulong), ("reserved", ctypes.c_ulong)]

    system_extended_handle_information = 64
    status_info_length_mismatch = 0xC0000004
    ntdll = ctypes.WinDLL("ntdll")
    query = ntdll.NtQuerySystemInformation
    query.restype = ctypes.c_ulong
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        returned = ctypes.c_ulong()
        status = query(system_extended_handle_information, buf, size, ctypes.byref(returned))
        if status != status_info_length_mismatch:
            break
        size = max(size * 2, returned.value + 4096)
    if status != 0:
        raise OSError(f"NtQuerySystemInformation(SystemExtendedHandleInformation) "
                      f"failed with NTSTATUS {status:#010x}")
    header = 2 * ctypes.sizeof(ctypes.c_size_t)   # NumberOfHandles, Reserved
    count = ctypes.c_size_t.from_buffer(buf).value
    entries = (Entry * count).from_buffer(buf, header)
    pid = os.getpid()
    mine = sum(1 for entry in entries if entry.pid == pid)
    if mine == 0:
        raise OSError("the system's handle table lists no handle of this process")
    return mine
