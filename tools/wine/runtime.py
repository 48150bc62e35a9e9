"""Running Windows programs under Wine: the binary, its environment, paths."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

from .config import CACHE, log
from .python import WINDOWS_PYTHONS, ensure_windows_python


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
    env["WINEPREFIX"] = os.path.join(CACHE, "prefix-" + WINDOWS_PYTHONS[version].tag)
    env["WINEDEBUG"] = "-all"
    env["WINEDLLOVERRIDES"] = "mscoree,mshtml="   # no Mono/Gecko install dialogs
    env.pop("DISPLAY", None)
    env["PYTHONUTF8"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def windows_path(path: str) -> str:
    """A Linux path as the Windows side sees it (Wine maps / to Z:)."""
    return "Z:" + os.path.abspath(path).replace("/", "\\")


#: What a Wine client prints when its wineserver dies (an assertion, such
#: as Wine 8.0's ``server/sock.c:1331: sock_poll_event: Assertion
#: `sock->obj.ops == &sock_ops' failed``, or a crash). The prefix's
#: processes then wait forever for a server that is gone.
SERVER_DEATH = (b"wineserver crashed", b"wineserver64: server/", b"wineserver: server/")
#: The return code of a run whose wineserver died.
SERVER_DIED = 125


def wine_python(version: str, args, check: bool = True, timeout: float | None = None,
                cwd: str | None = None, env: dict[str, str] | None = None,
                echo: bool = True) -> subprocess.CompletedProcess:
    """Run the Windows Python with ``args``; its output is kept in the
    result's ``stdout`` and, with ``echo``, written out as it comes.

    ``timeout`` (seconds) bounds the run: past it, every process of the
    prefix is ended and the result's return code is 124 (timeout(1)'s).
    A wineserver that dies (SERVER_DEATH in the output) ends the run at
    once, with every process of the prefix and return code SERVER_DIED,
    instead of leaving it to wait for the timeout.
    ``env`` replaces the version's own environment (wine_env), and names
    the prefix.
    """
    # Checked before every run: unpacked and signature-checked on first
    # use, its signed binaries unchanged since on every later one.
    exe = os.path.join(ensure_windows_python(version), "python.exe")
    cmd = [wine_binary(), exe, *args]
    env = env if env is not None else wine_env(version)
    if echo:
        log(" ".join(cmd))
    # Windows Python under Wine needs a real stdin, and pipes for its output
    # (with a regular file as stdout it stops at start: "can't initialize
    # sys standard streams", WinError 6).
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    pipe = proc.stdout
    chunks: list[bytes] = []
    server_died = threading.Event()

    def pump() -> None:
        tail = b""
        for chunk in iter(lambda: pipe.read1(65536), b""):
            chunks.append(chunk)
            if echo:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            # The message may straddle two chunks.
            if any(sign in tail + chunk for sign in SERVER_DEATH):
                server_died.set()
            tail = chunk[-64:]

    reader = threading.Thread(target=pump, name="wine-output", daemon=True)
    reader.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    returncode = None
    while returncode is None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            log(f"the Windows Python did not finish within {timeout:.0f} s: "
                "ending every process of its Wine prefix")
            proc.kill()
            proc.wait()
            stop_wineserver(version, env)
            returncode = 124
        elif server_died.wait(1.0 if left is None else min(left, 1.0)):
            # Give the process a moment to exit by itself, then end it.
            try:
                returncode = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log("the wineserver of this prefix died (see above: a Wine bug, not a "
                    "test verdict): ending every process of the prefix")
                proc.kill()
                proc.wait()
                stop_wineserver(version, env)
                returncode = SERVER_DIED
        else:
            returncode = proc.poll()
    # The end of the output is not the end of the process: the wineserver
    # that the first Windows process of a prefix starts, and the services it
    # starts in turn (services.exe, winedevice.exe, rpcss.exe...), inherit
    # that process's stdout and keep the pipe open until they exit. They
    # exit a few seconds after the last Windows process, or never while a
    # stray child of the program lives on, so waiting for the pipe's end
    # (as subprocess.run does) can wait forever beside a finished
    # python.exe. Wait for the process instead, then end the prefix's
    # leftovers if the pipe is still held.
    reader.join(timeout=15)
    if reader.is_alive():
        stop_wineserver(version, env)
        reader.join(timeout=30)
    if reader.is_alive():
        log("the Wine prefix's processes still hold the output pipe; its rest is lost")
    else:
        pipe.close()
    result = subprocess.CompletedProcess(cmd, returncode, b"".join(chunks), None)
    if check and returncode != 0:
        raise SystemExit(f"Windows Python exited with {returncode}")
    return result


def stop_wineserver(version: str, env: dict[str, str] | None = None) -> None:
    """End the wineserver of this version's prefix (or of the prefix ``env``
    names), and wait until it is gone, so none lingers between runs."""
    server = shutil.which("wineserver") or "/usr/lib/wine/wineserver64"
    if os.path.exists(server):
        env = env if env is not None else wine_env(version)
        subprocess.run([server, "-k"], check=False, env=env, stderr=subprocess.DEVNULL)
        subprocess.run([server, "-w"], check=False, env=env, stderr=subprocess.DEVNULL)
