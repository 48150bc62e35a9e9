"""Facts about the platform the tests run on, and the skip marks they make."""
import sys

import pytest

LINUX = sys.platform.startswith("linux")
WINDOWS = sys.platform == "win32"

linux_only = pytest.mark.skipif(not LINUX, reason="Linux (epoll, /proc, fork) only")
windows_only = pytest.mark.skipif(not WINDOWS, reason="Windows only")


def running_under_wine() -> bool:
    """True in a Windows Python running under Wine (ntdll exports wine_get_version)."""
    if sys.platform != "win32":
        return False
    import ctypes
    try:
        return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")
    except OSError:
        return False
