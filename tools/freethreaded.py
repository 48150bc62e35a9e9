#!/usr/bin/env python3
"""Free-threaded CPython 3.14 ("3.14t"), built once into the sid chroot.

    python -m tools.freethreaded ensure     # build (once) and print the interpreter's path
    python -m tools.freethreaded path       # where it is (or would be), inside the tree
    python -m tools.chroot test --py 3.14t  # our suite and CPython's, with PYTHON_GIL=0

Neither Debian 12 nor sid packages a free-threaded CPython (there is no
``-nogil`` package), so this builds one, from Debian's own source package
for ``python3.14``: a ``deb-src`` line for the mirror the chroot was made
from (tools/chroot.py), ``apt-get source --download-only`` (apt checks the
files against the signed ``Sources`` index), and the upstream tarball that
package carries (``python3.14_X.Y.Z.orig.tar.xz``). The tarball, not the
Debian-patched tree: Debian's patches fit an interpreter installed under
``/usr`` (its install schemes, multiarch paths), and this one lives in a
prefix of its own, ``/opt/python3.14t`` inside the chroot, where the
chroot's venvs find it as ``python3.14t`` (a link in ``/usr/local/bin``).

``./configure --disable-gil`` with neither PGO nor LTO (``make -j2``: the
machine has 2 shared cores; ~16 minutes there), then ``make install``,
which installs pip (ensurepip) and CPython's ``test`` package (the
conformance suites bind our loop into it). cffi 2.0 or later, the first
with free-threaded support, goes into the interpreter itself; the test
venv (tools/chroot.py's ``venv-3.14t``) is made from it with our ``test``
extra.

Cached: the build writes a stamp (source version, configure options,
build time) into the prefix, last; a prefix with a matching stamp is used
as it is. A lock of its own (``<tree>.freethreaded.lock``) makes two runs
starting at once build it once, the second waiting and then finding it.
Needs root, like the chroot.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
import time
from typing import List, Optional

if __name__ == "__main__" and not __package__:   # run as a file: tools/ is no package then
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import chroot  # noqa: E402

#: The CPython release line built, and the name its interpreter goes by.
VERSION = "3.14"
NAME = f"python{VERSION}t"
SOURCE_PACKAGE = f"python{VERSION}"
#: Inside the chroot.
PREFIX = f"/opt/{NAME}"
BUILD_DIR = f"/root/build-{NAME}"
LINK = f"/usr/local/bin/{NAME}"
STAMP = ".socknotify-build.json"
CONFIGURE = ["--disable-gil", f"--prefix={PREFIX}", "--with-ensurepip=install"]
#: What the build needs in the chroot besides tools/chroot.py's packages:
#: make and the headers of the standard library's C modules that the tests
#: use (ssl, zlib, bz2, lzma, sqlite3, expat, uuid, zstd, ctypes' libffi),
#: dpkg-dev for ``apt-get source``, xz-utils for the tarball.
BUILD_PACKAGES = ["make", "pkg-config", "dpkg-dev", "xz-utils", "libssl-dev",
                  "zlib1g-dev", "libbz2-dev", "liblzma-dev", "libsqlite3-dev",
                  "libexpat1-dev", "uuid-dev", "libzstd-dev", "libffi-dev"]
#: In the interpreter itself: cffi 2.0 is the first release that supports
#: the free-threaded build (its extension modules declare themselves safe
#: without the GIL; older ones re-enable the GIL on import).
BASE_REQUIREMENTS = ["cffi>=2.0"]
#: A CPython 3.14 release tarball (``Python-3.14.N.tar.*``) to build from
#: instead of Debian's source package: for mirrors that serve Debian's
#: binary packages but not ``python3.14``'s source (``apt-get source``
#: then fails with 404 for its .dsc and tarballs).
SOURCE_VARIABLE = "SOCKNOTIFY_CPYTHON_SOURCE"
SOURCES_FILE = "/etc/apt/sources.list.d/socknotify-deb-src.list"


def log(message: str) -> None:
    print(f"[freethreaded] {message}", file=sys.stderr, flush=True)


def _read_stamp(path: str) -> Optional[dict]:
    try:
        with open(path + PREFIX + "/" + STAMP, encoding="utf-8") as f:
            answer: dict = json.load(f)
            return answer
    except (OSError, ValueError):
        return None


def _current(stamp: Optional[dict]) -> bool:
    return bool(stamp) and stamp.get("configure") == CONFIGURE and (
        stamp.get("base_requirements") == BASE_REQUIREMENTS)


def ensure(source: Optional[str] = None) -> str:
    """The interpreter's path inside the chroot, built first if need be
    (from ``source``, a CPython 3.14 release tarball, when given; else
    from $SOCKNOTIFY_CPYTHON_SOURCE; else from Debian's source package)."""
    path = chroot.ensure(BUILD_PACKAGES)
    with chroot._flock(path + ".freethreaded.lock", chroot.fcntl.LOCK_EX):
        if not _current(_read_stamp(path)):
            _build(path, source or os.environ.get(SOURCE_VARIABLE) or None)
    return f"{PREFIX}/bin/{NAME}"


def _source_line(path: str) -> str:
    stamp = chroot._stamp(path) or {}
    return f"deb-src {stamp.get('mirror') or chroot.mirror()} {chroot.SUITE} main\n"


def _fetch_source(path: str) -> str:
    """Debian's source package downloaded into BUILD_DIR (fresh); the
    upstream tarball's path inside the tree."""
    with chroot._flock(path + ".make.lock", chroot.fcntl.LOCK_EX):
        with open(path + SOURCES_FILE, "w", encoding="utf-8") as f:
            f.write(_source_line(path))
        chroot._in_tree(path, ["apt-get", "-o", "DPkg::Lock::Timeout=900",
                               *[f"-o{option}" for option in ("Acquire::Check-Valid-Until=false",)],
                               "update", "-qq"])
    if os.path.exists(path + BUILD_DIR):
        shutil.rmtree(path + BUILD_DIR)
    os.makedirs(path + BUILD_DIR)
    # As root, apt's download sandbox user cannot write into /root.
    if chroot._in_tree(path, ["apt-get", "-o", "APT::Sandbox::User=root", "source",
                              "--download-only", "-qq", SOURCE_PACKAGE], cwd=BUILD_DIR,
                       check=False) != 0:
        sys.exit(f"tools/freethreaded.py: `apt-get source {SOURCE_PACKAGE}` failed (above): "
                 f"this mirror may serve Debian's binary packages without that source. "
                 f"Build from a CPython {VERSION} release tarball instead: "
                 f"python -m tools.freethreaded ensure --source Python-{VERSION}.N.tar.xz "
                 f"(or set ${SOURCE_VARIABLE} for tox's py314t).")
    tarballs = glob.glob(path + BUILD_DIR + f"/{SOURCE_PACKAGE}_*.orig.tar.*")
    if len(tarballs) != 1:
        sys.exit(f"tools/freethreaded.py: expected one upstream tarball in {BUILD_DIR}, "
                 f"found {tarballs}")
    return tarballs[0][len(path):]


def _given_source(path: str, given: str) -> str:
    """A CPython release tarball from the host copied into BUILD_DIR
    (fresh); its path inside the tree."""
    name = os.path.basename(given)
    if not re.match(rf"Python-{re.escape(VERSION)}\.\d+\.tar\.(gz|xz|bz2)$", name):
        sys.exit(f"tools/freethreaded.py: {given} is not a CPython {VERSION} release "
                 f"tarball (Python-{VERSION}.N.tar.gz/xz)")
    if os.path.exists(path + BUILD_DIR):
        shutil.rmtree(path + BUILD_DIR)
    os.makedirs(path + BUILD_DIR)
    shutil.copyfile(given, path + BUILD_DIR + "/" + name)
    return BUILD_DIR + "/" + name


def _version_of(tarball: str) -> str:
    """3.14.N from python3.14_3.14.N.orig.tar.xz or Python-3.14.N.tar.gz."""
    found = re.search(rf"({re.escape(VERSION)}\.\d+)", os.path.basename(tarball))
    return found.group(1) if found else "unknown"


def _build(path: str, given: Optional[str]) -> None:
    started = time.monotonic()
    with chroot._mounted(path):
        tarball = _given_source(path, given) if given else _fetch_source(path)
        version = _version_of(tarball)
        origin = os.path.basename(tarball) if given else (
            f"Debian's {os.path.basename(tarball)}")
        log(f"building CPython {version} with {' '.join(CONFIGURE)} from {origin} "
            f"(make -j2, no PGO/LTO: about a quarter of an hour)")
        source = f"{BUILD_DIR}/src"
        chroot._in_tree(path, ["mkdir", "-p", source])
        chroot._in_tree(path, ["tar", "-xf", tarball, "-C", source, "--strip-components=1"])
        if os.path.exists(path + PREFIX):
            shutil.rmtree(path + PREFIX)
        chroot._in_tree(path, ["./configure", "-q", *CONFIGURE], cwd=source)
        chroot._in_tree(path, ["make", "-s", "-j2"], cwd=source)
        chroot._in_tree(path, ["make", "-s", "install"], cwd=source)
        interpreter = f"{PREFIX}/bin/{NAME}"
        chroot._in_tree(path, [interpreter, "-c",
                               "import sys; assert not sys._is_gil_enabled(), 'GIL on'"])
        chroot._in_tree(path, [interpreter, "-m", "pip", "install", "-q",
                               *BASE_REQUIREMENTS])
        chroot._in_tree(path, ["ln", "-sf", interpreter, LINK])
        shutil.rmtree(path + BUILD_DIR)
    seconds = round(time.monotonic() - started)
    with open(path + PREFIX + "/" + STAMP, "w", encoding="utf-8") as f:
        json.dump({"version": version, "source": origin, "configure": CONFIGURE,
                   "base_requirements": BASE_REQUIREMENTS, "seconds": seconds}, f, indent=1)
    log(f"built {interpreter} in {seconds} s")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("ensure", help="build the interpreter once; print its path inside")
    make.add_argument("--source", help="a CPython 3.14 release tarball to build from instead "
                      f"of Debian's source package (or ${SOURCE_VARIABLE})")
    commands.add_parser("path", help="print the interpreter's path inside the chroot")
    options = parser.parse_args(argv)
    if options.command == "ensure":
        print(ensure(options.source))
        return 0
    print(chroot.tree() + f"{PREFIX}/bin/{NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
