"""The Debian packages the Windows build and its runs need: Wine and mingw-w64."""
from __future__ import annotations

import os
import shutil
import subprocess

from .config import run

APT_PACKAGES = ["wine64", "gcc-mingw-w64-x86-64"]
#: the cross compiler gcc-mingw-w64-x86-64 installs
MINGW_CC = "x86_64-w64-mingw32-gcc"


def ensure_apt_packages() -> None:
    """Install Wine and mingw-w64 with apt-get when either is missing.

    Only root can; anyone else gets the command to run instead.
    """
    if (shutil.which("wine") or shutil.which("wine64")) and shutil.which(MINGW_CC):
        return
    if os.geteuid() != 0:
        raise SystemExit("wine64 and mingw-w64 are missing; install them as root: "
                         f"apt-get install -y {' '.join(APT_PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], env=env, stdout=subprocess.DEVNULL)
