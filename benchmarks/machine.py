"""What the figures were measured on: CPU, kernel, load, Pythons."""
from __future__ import annotations

import datetime
import os
import platform
import sys


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _distribution() -> str:
    try:
        with open("/etc/os-release") as f:
            fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        return fields.get("PRETTY_NAME", "").strip('"')
    except OSError:
        return ""


def _hypervisor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return "yes" if " hypervisor" in f.read() else "no"
    except OSError:
        return "unknown"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (OSError, AttributeError):    # Windows has no load average
        return "unknown"


def wine_version() -> str:
    """Wine's version when this Windows Python runs under Wine, else ''
    (ntdll exports wine_get_version only under Wine)."""
    if sys.platform != "win32":
        return ""
    try:
        import ctypes
        get = ctypes.WinDLL("ntdll").wine_get_version
    except (OSError, AttributeError):
        return ""
    get.restype = ctypes.c_char_p
    return "Wine " + get().decode("ascii", "replace")


def describe() -> dict:
    """The machine, as far as the figures depend on it."""
    windows = sys.platform == "win32"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "virtualised": _hypervisor(),
        "kernel": platform.version() if windows else platform.release(),
        "os": f"Windows {platform.release()}" if windows else _distribution(),
        "wine": wine_version(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "loadavg_start": loadavg(),
    }
