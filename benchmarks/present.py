"""How figures are named and printed, for the page (report.py) and the
targets (targets.py): loop and case labels, number formats, and the run's
own noise band (its A/A control)."""
from __future__ import annotations

from .loops import CONTROLS
from .runner import IDLE_SIZES, TIMED_CASES, paired_ratios

PLATFORM_NAMES = {"linux": "Linux", "wine": "Wine", "windows": "Windows"}
LOOP_LABELS = {
    "asyncio": "asyncio", "asyncio-aa": "asyncio again (A/A)",
    "proactor-aa": "Proactor again (A/A)", "uvloop": "uvloop", "trio": "trio",
    "socknotify": "ours (epoll)", "proactor": "Proactor", "winselector": "WinSelector",
    "winloop": "winloop", "socknotify-afd": "ours (afd)", "socknotify-psn": "ours (psn)",
    "socknotify-asyncio-transports": "ours, asyncio's transports",
    "rloop": "rloop", "veloxloop": "veloxloop", "zuvloop": "zuvloop",
    "aiofastnet-asyncio": "aiofastnet on asyncio", "aiofastnet-uvloop": "aiofastnet on uvloop",
    "aiofastnet-socknotify": "aiofastnet on ours",
}
CASE_LABELS = {
    "pingpong_streams": "ping-pong, streams (100 B)",
    "pingpong_protocol": "ping-pong, raw Protocol (100 B)",
    "pingpong_sock": "ping-pong, sock_sendall/sock_recv (100 B)",
    "concurrent_50": "50 connections, streams ping-pong",
    "large_1mib": "1 MiB messages echoed",
    "udp_pingpong": "UDP datagram ping-pong (100 B)",
    "churn": "connection churn (connect, exchange, close)",
    "memory_streams": "per idle connection, asyncio streams",
    "memory_add_reader": "per idle socket, add_reader only",
    "http_uvicorn": "uvicorn, small ASGI app",
    "http_aiohttp": "aiohttp application",
}
for _n in IDLE_SIZES:
    CASE_LABELS[f"idle_{_n}"] = f"1 active connection + {_n} idle"


def label(name: str) -> str:
    """A loop's name on the page."""
    return LOOP_LABELS.get(name, name)


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10000:
        return f"{value / 1000:.1f}k"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def fmt_stats(s: dict | None, fmt=fmt_rate, suffix="") -> str:
    """Median, then (min-max) when the rounds differ."""
    if not s:
        return "-"
    if s["min"] == s["max"]:
        return f"{fmt(s['median'])}{suffix}"
    return f"{fmt(s['median'])}{suffix} ({fmt(s['min'])}-{fmt(s['max'])})"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}x"


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1024:.1f} KiB" if abs(x) >= 1024 else f"{x:.0f} B"


def first_summary(section: dict) -> dict:
    """The per-case summary of a section (every loop's figures are in each)."""
    return next(iter(section.get("summary", {}).values()), {})


def control_band(section: dict) -> tuple[str, str, list[float]] | None:
    """(control, reference, sorted paired ratios) of this section's A/A control."""
    control = next((n for n in section.get("usable", []) if n in CONTROLS), None)
    if control is None:
        return None
    reference = CONTROLS[control]
    summary = first_summary(section)
    ratios = []
    for case in TIMED_CASES:
        cells = summary.get(case, {}).get("loops", {})
        mine = (cells.get(control) or {}).get("per_round", {})
        theirs = (cells.get(reference) or {}).get("per_round", {})
        ratios += paired_ratios(mine, theirs)
    return (control, reference, sorted(ratios)) if ratios else None


def inner_band(ratios: list[float]) -> tuple[float, float]:
    """The band holding the middle 80% of the A/A ratios."""
    return ratios[len(ratios) // 10], ratios[-1 - len(ratios) // 10]
