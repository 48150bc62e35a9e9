"""Running Windows programs under Wine: the binary, its environment, paths."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from .config import CACHE, log
from .python import WINDOWS_PYTHONS, python_dir


def wine_binary() -> str:
    """The wine launcher (Debian's wine64, or wine)."""
    for name in ("wine64", "wine"):
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/lib/wine/wine64", "/usr/bin/wine64"):
        if os.path.exists(path):
            return path
    raise SystemExit("wine is not installed")


def wine_env(version: str = "3.11") -> dict:
    """The environment for a Windows process of one Windows Python."""
    env = dict(os.environ)
    # One prefix (so one wineserver) per Windows Python: runs for two
    # versions may overlap, and ending one must not kill the other.
    env["WINEPREFIX"] = os.path.join(CACHE, "prefix-" + WINDOWS_PYTHONS[version][1])
    env["WINEDEBUG"] = "-all"
    env["WINEDLLOVERRIDES"] = "mscoree,mshtml="   # no Mono/Gecko install dialogs
    env.pop("DISPLAY", None)
    env["PYTHONUTF8"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def windows_path(path: str) -> str:
    """A Linux path as the Windows side sees it (Wine maps / to Z:)."""
    return "Z:" + os.path.abspath(path).replace("/", "\\")


def wine_python(version: str, args, check=True, **kwargs) -> subprocess.CompletedProcess:
    """Run the Windows Python with ``args``; its output is echoed and kept
    in the result's ``stdout``."""
    exe = os.path.join(python_dir(version), "python.exe")
    cmd = [wine_binary(), exe, *args]
    log(" ".join(cmd))
    # Windows Python under Wine needs a real stdin, and pipes for its output.
    proc = subprocess.run(cmd, check=False, stdin=subprocess.DEVNULL, env=wine_env(version),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    sys.stdout.write(proc.stdout.decode("utf-8", "replace"))
    sys.stdout.flush()
    if check and proc.returncode != 0:
        raise SystemExit(f"Windows Python exited with {proc.returncode}")
    return proc


def stop_wineserver(version: str, env: dict[str, str] | None = None) -> None:
    """End the wineserver of this version's prefix (or of the prefix ``env``
    names), and wait until it is gone, so none lingers between runs."""
    server = shutil.which("wineserver") or "/usr/lib/wine/wineserver64"
    if os.path.exists(server):
        env = env if env is not None else wine_env(version)
        subprocess.run([server, "-k"], check=False, env=env, stderr=subprocess.DEVNULL)
        subprocess.run([server, "-w"], check=False, env=env, stderr=subprocess.DEVNULL)
