"""Facts about the platform the tests run on."""
import sys


def running_under_wine() -> bool:
    """True in a Windows Python running under Wine (ntdll exports wine_get_version)."""
    if sys.platform != "win32":
        return False
    import ctypes
    try:
        return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")
    except OSError:
        return False
