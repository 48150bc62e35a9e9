"""What the figures were measured on: CPU, kernel, load, Pythons."""
from __future__ import annotations

import datetime
import os
import platform
import sys

import pyperf


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


def pyperf_metadata() -> dict:
    """pyperf's description of this machine and Python (CPU model, count,
    frequency and configuration, ASLR, boot time, Python build, timer), as
    ``python -m pyperf collect_metadata`` collects it; not the host name."""
    metadata = pyperf.Run([1.0]).get_metadata()
    for private in ("hostname", "name"):
        metadata.pop(private, None)
    return metadata


def describe() -> dict:
    """The machine, as far as the figures depend on it: pyperf's metadata,
    and what it leaves out (virtualisation, distribution, Wine, the load
    at the start and end of the run)."""
    windows = sys.platform == "win32"
    metadata = pyperf_metadata()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": metadata.get("cpu_model_name") or platform.processor() or "unknown",
        "cpus": metadata.get("cpu_count", os.cpu_count()),
        "virtualised": _hypervisor(),
        "kernel": platform.version() if windows else platform.release(),
        "os": f"Windows {platform.release()}" if windows else _distribution(),
        "wine": wine_version(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "loadavg_start": loadavg(),
        "pyperf": metadata,
    }
