"""The PNG plots of docs/benchmarks.md (matplotlib, no display needed)."""
from __future__ import annotations

import os
from typing import Dict, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .runner import IDLE_SIZES, TIMED_CASES  # noqa: E402

LABELS = {
    "asyncio": "asyncio", "asyncio-aa": "asyncio A/A", "proactor-aa": "Proactor A/A",
    "uvloop": "uvloop", "trio": "trio",
    "socknotify": "ours (epoll)",
    "proactor": "Proactor", "winselector": "WinSelector", "winloop": "winloop",
    "socknotify-afd": "ours (afd)", "socknotify-psn": "ours (psn)",
    "socknotify-asyncio-transports": "ours, asyncio's transports",
}
SHORT_CASES = {
    "pingpong_streams": "streams", "pingpong_protocol": "protocol", "pingpong_sock": "sock_*",
    "concurrent_50": "50 conns", "large_1mib": "1 MiB", "udp_pingpong": "UDP", "churn": "churn",
}
for _n in IDLE_SIZES:
    SHORT_CASES[f"idle_{_n}"] = f"idle {_n}"
FAILED_STYLE = {"marker": "x", "linestyle": "none", "markersize": 9, "markeredgewidth": 2,
                "clip_on": False, "zorder": 5}


def distinct_colours(count: int) -> list:
    """``count`` colours no two of which are alike: tab10's ten, then the
    twenty of tab20b and tab20c (cycling tab10 alone gave a plot with eleven
    system calls two pairs of same-coloured bars)."""
    palette = ([plt.cm.tab10(i) for i in range(10)]
               + [plt.cm.tab20b(i) for i in range(0, 20, 2)]
               + [plt.cm.tab20c(i) for i in range(0, 20, 2)])
    if count > len(palette):
        raise ValueError(f"{count} series, but only {len(palette)} distinct colours")
    return palette[:count]


def _mark_failed(ax, x: float, colour) -> None:
    """A loop that failed a case: an x on the axis and the word, where its
    bar would be, so a failure is not mistaken for a missing loop."""
    ax.plot([x], [0], color=colour, **FAILED_STYLE)
    ax.annotate("failed", (x, 0), textcoords="offset points", xytext=(0, 8),
                rotation=90, ha="center", va="bottom", fontsize=7, color=colour)


def _failed_handle(colour="black"):
    """The legend entry explaining the x."""
    from matplotlib.lines import Line2D
    return Line2D([], [], color=colour, label="failed", **FAILED_STYLE)


def _ratios_to(section: dict, reference: str, failures: Optional[dict] = None):
    """{loop: {case: (median, min, max)}} of loop/reference, paired per round;
    ``failures`` receives {loop: {case, ...}} of the cases a loop failed."""
    summary = next(iter(section["summary"].values()))
    out: Dict[str, dict] = {}
    for case in TIMED_CASES:
        entry = summary.get(case)
        if not entry or reference not in entry["loops"]:
            continue
        ref_rounds = entry["loops"][reference]["per_round"]
        for loop, cell in entry["loops"].items():
            if cell.get("error") and not cell.get("per_round") and failures is not None:
                failures.setdefault(loop, set()).add(case)
            ratios = [v / ref_rounds[r] for r, v in cell["per_round"].items()
                      if r in ref_rounds and ref_rounds[r] > 0]
            if ratios:
                ratios.sort()
                out.setdefault(loop, {})[case] = (ratios[len(ratios) // 2] if len(ratios) % 2
                                                  else sum(ratios[len(ratios) // 2 - 1:
                                                                  len(ratios) // 2 + 1]) / 2,
                                                  ratios[0], ratios[-1])
    return out


def ratio_plot(section: dict, reference: str, title: str, path: str) -> bool:
    failures: Dict[str, set] = {}
    data = _ratios_to(section, reference, failures)
    cases = [c for c in TIMED_CASES if any(c in v for v in data.values())]
    loops = [name for name in section["usable"] if name in data or name in failures]
    if not data:
        return False
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / max(len(loops), 1)
    handles = []
    for i, loop in enumerate(loops):
        colour = f"C{i % 10}"
        edge = "black" if loop.startswith("socknotify") else None
        xs, ys, lo, hi = [], [], [], []
        for j, case in enumerate(cases):
            x = j + (i - (len(loops) - 1) / 2) * width
            if case in data.get(loop, {}):
                med, mn, mx = data[loop][case]
                xs.append(x)
                ys.append(med)
                lo.append(med - mn)
                hi.append(mx - med)
            elif case in failures.get(loop, ()):
                _mark_failed(ax, x, colour)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colour, edgecolor=edge,
               linewidth=1.2)
        # Drawn by hand: a loop that failed every case has no bar to show.
        handles.append(Patch(facecolor=colour, edgecolor=edge, linewidth=1.2,
                             label=LABELS.get(loop, loop)))
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([SHORT_CASES.get(c, c) for c in cases])
    ax.set_ylabel(f"rate / {LABELS.get(reference, reference)} (same round)")
    ax.set_title(title)
    if failures:
        handles.append(_failed_handle())
    ax.legend(handles=handles, ncol=len(handles), fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


PANEL_NAMES = {"linux": "Linux", "wine": "Wine", "windows": "Windows"}


def idle_plot(results: dict, path: str) -> bool:
    sections = [(n, results[n]) for n in ("linux", "wine", "windows")
                if results.get(n) and any(results[n].get("summary", {}).values())]
    if not sections:
        return False
    fig, axes = plt.subplots(1, len(sections), figsize=(6 * len(sections), 4), squeeze=False)
    drew = False
    for ax, (name, section) in zip(axes[0], sections):
        summary = next(iter(section["summary"].values()))
        for loop in section["usable"]:
            xs, ys = [], []
            for n in IDLE_SIZES:
                cell = summary.get(f"idle_{n}", {}).get("loops", {}).get(loop)
                if cell and cell["stats"]:
                    xs.append(n)
                    ys.append(cell["stats"]["median"])
            failed = [n for n in IDLE_SIZES
                      if (summary.get(f"idle_{n}", {}).get("loops", {}).get(loop) or {})
                      .get("error") and n not in xs]
            if xs or failed:
                drew = True
                line, = ax.plot(xs, ys, marker="o", label=LABELS.get(loop, loop),
                                linewidth=2.5 if loop.startswith("socknotify") else 1.2)
                # A loop that failed at a size (select()'s 512) gets an x on the axis.
                if failed:
                    ax.plot(failed, [0] * len(failed), color=line.get_color(), **FAILED_STYLE)
                    ax.annotate(f"{LABELS.get(loop, loop)} failed", (failed[0], 0),
                                textcoords="offset points", xytext=(5, 8), fontsize=7,
                                color=line.get_color())
        ax.set_xscale("log")
        ax.set_xlabel("idle registered connections")
        ax.set_ylabel("round trips/s, active connection")
        ax.set_title("Wine (compare within the panel only)" if name == "wine"
                     else PANEL_NAMES[name])
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    if drew:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drew


def syscall_plot(section: dict, path: str) -> bool:
    data = section.get("syscalls") or {}
    cases = [c for c in TIMED_CASES if isinstance(data.get(c), dict)]
    if not cases:
        return False
    # One colour per system call across both panels: the top five of every loop.
    names = []
    for case in cases:
        for result in data[case].values():
            for name, _ in sorted(result.get("calls", {}).items(), key=lambda kv: -kv[1])[:5]:
                if name not in names:
                    names.append(name)
    colours = dict(zip(names + ["other"], distinct_colours(len(names) + 1)))
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4), squeeze=False)
    legend: Dict[str, object] = {}
    any_failed = False
    for ax, case in zip(axes[0], cases):
        # Every loop measured, in the order recorded; one that failed keeps
        # its slot, marked, rather than vanishing from the panel.
        loops = [n for n, r in data[case].items() if "calls" in r or r.get("error")]
        measured = [n for n in loops if "calls" in data[case][n]]
        ax.set_xticks(range(len(loops)))
        ax.set_xticklabels([LABELS.get(n, n) for n in loops])
        xs = [loops.index(n) for n in measured]
        bottom = [0.0] * len(measured)
        for name in names + ["other"]:
            heights = []
            for loop in measured:
                calls = data[case][loop]["calls"]
                heights.append(sum(v for k, v in calls.items() if k not in names)
                               if name == "other" else calls.get(name, 0.0))
            if any(heights):
                legend[name] = ax.bar(xs, heights, bottom=bottom, label=name,
                                      color=colours[name])
            bottom = [b + h for b, h in zip(bottom, heights)]
        for x, loop in enumerate(loops):
            if loop not in measured:
                _mark_failed(ax, x, "black")
                any_failed = True
        ax.set_xlim(-0.6, len(loops) - 0.4)
        ax.set_title(f"{SHORT_CASES.get(case, case)}: system calls per 1000 round trips")
    # One legend for both panels, outside them: inside, it covered bars.
    ordered = [name for name in names + ["other"] if name in legend]
    handles = [legend[name] for name in ordered]
    if any_failed:
        handles.append(_failed_handle())
        ordered.append("failed")
    fig.legend(handles, ordered, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5),
               title="system call")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


CALL_BARS = [("iterations", "loop iterations"), ("waits", "waits (epoll_wait / PSN function)"),
             ("changes", "epoll_ctl"), ("afd_nt_calls", "AFD polyfill NT calls")]


def calls_plot(section: dict, title: str, path: str) -> bool:
    """Per round trip, one panel per ping-pong case: loop iterations, waits,
    and the calls besides the wait (epoll_ctl; the AFD polyfill's NT calls)."""
    data = (section.get("kernel_calls") or {}).get("cases") or {}
    cases = [c for c in TIMED_CASES if data.get(c)]
    if not cases:
        return False
    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.8), squeeze=False)
    handles = {}
    for ax, case in zip(axes[0], cases):
        loops = [n for n in section["usable"] if n in data[case] and "error" not in data[case][n]]
        width = 0.8 / len(CALL_BARS)
        for i, (field, name) in enumerate(CALL_BARS):
            xs, ys = [], []
            for j, loop in enumerate(loops):
                r = data[case][loop]
                value = r.get(field) if field in ("iterations", "afd_nt_calls") \
                    else (r.get("counters") or {}).get(field)
                if value:
                    xs.append(j + (i - (len(CALL_BARS) - 1) / 2) * width)
                    ys.append(value)
            if xs:
                handles[name] = ax.bar(xs, ys, width, color=f"C{i}")
        ax.set_xticks(range(len(loops)))
        ax.set_xticklabels([LABELS.get(n, n) for n in loops], fontsize=8)
        ax.set_title(f"{SHORT_CASES.get(case, case)}: per round trip", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.legend(list(handles.values()), list(handles), fontsize=8, loc="center left",
               bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def memory_plot(results: dict, path: str) -> bool:
    sections = [(n, results[n]) for n in ("linux", "wine", "windows")
                if results.get(n, {}).get("memory")]
    if not sections:
        return False
    fig, axes = plt.subplots(1, len(sections), figsize=(6 * len(sections), 4), squeeze=False)
    for ax, (name, section) in zip(axes[0], sections):
        failed_any = False
        # Every loop measured; one that failed keeps its slot, marked.
        records = [r for r in section["memory"] if r.get("case") == "memory_streams"
                   and (r.get("value") is not None or r.get("error"))]
        xs = range(len(records))
        ax.bar([x for x, r in zip(xs, records) if r.get("value") is not None],
               [r["value"] / 1024 for r in records if r.get("value") is not None],
               color=["C1" if r["loop"].startswith("socknotify") else "C0"
                      for r in records if r.get("value") is not None])
        for x, r in zip(xs, records):
            if r.get("value") is None:
                _mark_failed(ax, x, "black")
                failed_any = True
        ax.set_xticks(list(xs))
        ax.set_xticklabels([LABELS.get(r["loop"], r["loop"]) for r in records])
        ax.set_xlim(-0.6, len(records) - 0.4)
        ax.set_ylabel("KiB per idle connection")
        ax.set_title(PANEL_NAMES[name]
                     + ": RSS per idle connection (KiB), lower is better\n"
                     "(idle TCP connections held open by streams: asyncio's, trio's for trio)",
                     fontsize=10)
        if failed_any:
            ax.legend(handles=[_failed_handle()], fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(results: dict, img_dir: str) -> dict:
    """Write the plots; return {kind: file name} for the page."""
    images: Dict[str, object] = {"ratios": {}, "calls": {}}
    for name, reference, title in (
            ("linux", "asyncio", "Linux: rate relative to asyncio's default loop"),
            ("wine", "proactor", "Wine: rate relative to ProactorEventLoop -- ranks loops "
                                 "inside Wine only, no proxy for Windows timings\n(every "
                                 "socket call goes through wineserver; AFD polls cost most "
                                 "there)"),
            ("windows", "proactor", "Windows: rate relative to ProactorEventLoop")):
        section = results.get(name)
        if section and any(section.get("summary", {}).values()):
            filename = f"bench_{name}_ratios.png"
            if ratio_plot(section, reference, title, os.path.join(img_dir, filename)):
                images["ratios"][name] = filename
        if section:
            filename = f"bench_{name}_kernel_calls.png"
            if calls_plot(section, f"{PANEL_NAMES[name]}: kernel calls per round trip "
                                   "(counted by the port)", os.path.join(img_dir, filename)):
                images["calls"][name] = filename
    # A native Windows run's page sits beside the Linux + Wine one: own names.
    tag = "bench_windows_" if "windows" in results else "bench_"
    if idle_plot(results, os.path.join(img_dir, f"{tag}idle_scaling.png")):
        images["idle"] = f"{tag}idle_scaling.png"
    if results.get("linux") and syscall_plot(results["linux"],
                                             os.path.join(img_dir, "bench_syscalls.png")):
        images["syscalls"] = "bench_syscalls.png"
    if memory_plot(results, os.path.join(img_dir, f"{tag}memory.png")):
        images["memory"] = f"{tag}memory.png"
    return images
