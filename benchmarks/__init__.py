"""socknotify_loop's benchmarks: our loop against its peers, in interleaved
rounds, with exact counters beside the timings (see README.md here).

    python -m benchmarks.run --help      # from the project root
    python benchmarks/run.py --help      # the same, run by path

Standard library only at import time: the workers import this package in
the Windows CPython under Wine too, where only the loops are installed.
"""
from __future__ import annotations

import os


def requirement(name: str) -> str:
    """requirements.txt's line for ``name`` (its pin), for the installs that
    cannot take the whole file: the Windows Python (no uvloop there), the
    chroot's venv."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.split("=")[0].split(">")[0].split("<")[0].strip() == name:
                return line.strip()
    raise LookupError(f"{path} does not name {name}")
