"""The Debian packages the Windows build and its runs need: Wine, mingw-w64,
and osslsigncode (the Windows CPython's signature check, signing.py)."""
from __future__ import annotations

import os
import shutil
import subprocess

from .config import run

APT_PACKAGES = ["wine64", "gcc-mingw-w64-x86-64", "osslsigncode"]
#: the cross compiler gcc-mingw-w64-x86-64 installs
MINGW_CC = "x86_64-w64-mingw32-gcc"


def missing_programs() -> list:
    """The programs of APT_PACKAGES this machine lacks."""
    missing = [] if shutil.which("wine") or shutil.which("wine64") else ["wine"]
    return missing + [name for name in (MINGW_CC, "osslsigncode") if not shutil.which(name)]


def ensure_apt_packages() -> None:
    """Install Wine, mingw-w64 and osslsigncode with apt-get when one is
    missing. Only root can; anyone else gets the command to run instead."""
    if not missing_programs():
        return
    if os.geteuid() != 0:
        raise SystemExit(f"{', '.join(missing_programs())} missing; install them as root: "
                         f"apt-get install -y {' '.join(APT_PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], env=env, stdout=subprocess.DEVNULL)
