#!/usr/bin/env python3
"""CPython 3.14 and 3.15 for the test suite: a cached Debian sid chroot.

    python -m tools.chroot ensure                 # build (or update) the chroot
    python -m tools.chroot test --py 3.14 [-- pytest args]
    python -m tools.chroot shell --py 3.15        # a shell in the chroot's venv
    python -m tools.chroot run -- CMD ...         # any command inside it
    python -m tools.chroot run --py 3.14 --fresh --with valgrind -- CMD ...

The host is Debian 12 with pyenv Pythons up to 3.13; Debian's development
release ("sid") packages the newer CPythons, and with them
``libpython3.X-testsuite``, CPython's own ``test`` package, which the
conformance suites (tests/conformance) bind our loop into. So the newer
Pythons are tested inside a sid tree made by ``mmdebstrap`` and cached under
``~/.cache/socknotify_loop/`` ($XDG_CACHE_HOME respected): made once per
machine (about 4 minutes), then reused; when the package list below
grows, the missing packages are installed into the cached tree with apt.

Each run bind-mounts /proc, /sys and /dev into the tree (as slaves, so
nothing done inside propagates back), copies the host's DNS and pip
configuration in (pip.conf files, PIP_* variables, the CA bundle they
name, and the local package folders they point to, mounted read-only at
the same paths). Runs for the two Pythons may overlap (CI runs them side
by side): each holds its version's lock (its venv and its copy of the
project are its own), and the mounts are shared, made by the first run in
and removed by the last one out.

``test`` copies the project's tracked files (what a fresh clone has) into
the tree, installs it with its ``test`` and ``integrations`` extras into a
venv made by that Python (``pythonX.Y -m venv``; kept between runs while
the test requirements are unchanged, the project itself always
reinstalled), and
runs tox's own two pytest runs there: our suite, then CPython's
conformance suites. Needs root (chroot, mount), as CI has.
"""
from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Dict, Iterator, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The Pythons the chroot carries; tox's py314 and py315 envs test them.
PYTHONS = ("3.14", "3.15")
#: Free-threaded builds, which Debian does not package: tools/freethreaded.py
#: builds each once into the chroot (tox's py314t env). Their venvs get the
#: ``test`` extra only: several libraries of the ``integrations`` extra
#: have no free-threaded wheels, and their tests skip, naming the library.
FREE_THREADED = ("3.14t",)
VERSIONS = PYTHONS + FREE_THREADED
SUITE = "sid"
#: Every package the tests need: each Python with its headers (the C core
#: is built by cffi at install time), venv and CPython's test package; a C
#: compiler; git; the servers the integration tests start (PostgreSQL runs
#: as its own user through runuser, from util-linux); CA certificates for
#: pip's downloads.
PACKAGES = sorted(
    [pkg for version in PYTHONS for pkg in (
        f"python{version}", f"python{version}-dev", f"python{version}-venv",
        f"libpython{version}-testsuite")]
    + ["gcc", "libc6-dev", "libffi-dev", "git", "ca-certificates", "util-linux",
       "postgresql", "redis-server"])
#: Debian's sid Release file on some mirrors is past its Valid-Until date
#: (a snapshot mirror): apt must not refuse it.
APT_OPTIONS = ['Acquire::Check-Valid-Until "false"']
STAMP = ".socknotify-chroot.json"
MIRROR_VARIABLE = "SOCKNOTIFY_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def log(message: str) -> None:
    print(f"[chroot] {message}", file=sys.stderr, flush=True)


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "socknotify_loop")


def tree() -> str:
    return os.path.join(cache_dir(), f"{SUITE}-chroot")


# -- the Debian mirror ------------------------------------------------------------------------

def apt_mirrors(etc: str = "/etc/apt") -> List[str]:
    """The Debian archive URIs this machine's apt uses (sources.list and
    sources.list.d, one-line and deb822 formats), security archives left
    out, in the order apt reads them."""
    files = []
    main = os.path.join(etc, "sources.list")
    if os.path.isfile(main):
        files.append(main)
    parts = os.path.join(etc, "sources.list.d")
    if os.path.isdir(parts):
        files += [os.path.join(parts, name) for name in sorted(os.listdir(parts))
                  if name.endswith((".list", ".sources"))]
    uris: List[str] = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() and (
                        fields.get("Enabled", "yes").lower() != "no"):
                    uris += fields.get("URIs", "").split()
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    uris.append(words[1])
    wanted = []
    for uri in uris:
        uri = uri.rstrip("/")
        if re.search(r"/debian$", uri) and "security" not in uri and uri not in wanted:
            wanted.append(uri)
    return wanted


def mirror() -> str:
    """$SOCKNOTIFY_DEBIAN_MIRROR, else the first Debian archive apt uses
    here, else deb.debian.org."""
    chosen = os.environ.get(MIRROR_VARIABLE)
    if chosen:
        return chosen
    found = apt_mirrors()
    return found[0] if found else DEFAULT_MIRROR


# -- making the tree --------------------------------------------------------------------------

def _stamp(path: str) -> Optional[dict]:
    try:
        with open(os.path.join(path, STAMP), encoding="utf-8") as f:
            answer: dict = json.load(f)
            return answer
    except (OSError, ValueError):
        return None


def _write_stamp(path: str, packages: List[str], source: str) -> None:
    with open(os.path.join(path, STAMP), "w", encoding="utf-8") as f:
        json.dump({"suite": SUITE, "packages": sorted(packages), "mirror": source}, f,
                  indent=1)


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        sys.exit(f"tools/chroot.py: {what} needs root (mmdebstrap, chroot, mount)")


def _apt_install_on_host(package: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=900"]
    subprocess.check_call(["apt-get", *lock, "update", "-qq"], env=env)
    subprocess.check_call(["apt-get", *lock, "install", "-y", "-qq", package], env=env,
                          stdout=subprocess.DEVNULL)


def ensure(extra: List[str] = ()) -> str:
    """The chroot's path, made or brought up to date (PACKAGES + extra).

    Under a lock of its own: two runs starting at once on a new machine
    make the tree once, the second finding it made."""
    _require_root("making the chroot")
    path = tree()
    os.makedirs(cache_dir(), exist_ok=True)
    with _flock(path + ".make.lock", fcntl.LOCK_EX):
        return _ensure(path, sorted(set(PACKAGES) | set(extra)))


def _ensure(path: str, wanted: List[str]) -> str:
    stamp = _stamp(path)
    if stamp is not None and stamp.get("suite") == SUITE:
        missing = sorted(set(wanted) - set(stamp.get("packages", [])))
        if missing:
            log(f"installing {' '.join(missing)} into {path}")
            with _mounted(path):
                _in_tree(path, ["apt-get", "-o", "DPkg::Lock::Timeout=900", "update", "-qq"])
                _in_tree(path, ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                *missing])
            _write_stamp(path, sorted(set(stamp["packages"]) | set(missing)),
                         stamp.get("mirror", ""))
        return path
    if os.path.exists(path):
        sys.exit(f"{path} exists but is not a chroot made by tools/chroot.py; remove it")
    if not shutil.which("mmdebstrap"):
        log("installing mmdebstrap")
        _apt_install_on_host("mmdebstrap")
    source = mirror()
    partial = path + ".partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)
    command = ["mmdebstrap", "--variant=apt", "--quiet",
               *[f"--aptopt={option}" for option in APT_OPTIONS],
               f"--include={','.join(wanted)}", SUITE, partial, source]
    log(f"making the {SUITE} chroot from {source} (a few minutes, once): "
        + " ".join(shlex.quote(word) for word in command))
    subprocess.check_call(command)
    _write_stamp(partial, wanted, source)
    os.rename(partial, path)
    return path


# -- running inside it ------------------------------------------------------------------------

@contextlib.contextmanager
def _flock(name: str, how: int) -> Iterator[None]:
    with open(name, "w") as lock:
        fcntl.flock(lock, how)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _locked(path: str, version: Optional[str]) -> contextlib.AbstractContextManager[None]:
    """One run at a time per Python: a run owns that version's venv and its
    copy of the project. A run in no venv takes the lock of no version."""
    return _flock(f"{path}.lock-{version or 'none'}", fcntl.LOCK_EX)


def _mounts_below(path: str) -> List[str]:
    """The mount points inside the tree, as the kernel lists them."""
    prefix = path.rstrip("/") + "/"
    targets = []
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            target = line.split()[1].replace("\\040", " ")
            if target.startswith(prefix):
                targets.append(target)
    return targets


def _pip_config_files() -> List[str]:
    """The pip configuration files pip reads here (global, user, $PIP_CONFIG_FILE)."""
    home = os.path.expanduser("~")
    candidates = ["/etc/pip.conf", "/etc/xdg/pip/pip.conf",
                  os.path.join(home, ".pip", "pip.conf"),
                  os.path.join(os.environ.get("XDG_CONFIG_HOME") or
                               os.path.join(home, ".config"), "pip", "pip.conf")]
    if os.environ.get("PIP_CONFIG_FILE"):
        candidates.append(os.environ["PIP_CONFIG_FILE"])
    return [path for path in candidates if os.path.isfile(path)]


def _local_paths(values: List[str]) -> List[str]:
    """Absolute paths and file:// URLs among pip settings' words that exist here."""
    found = []
    for value in values:
        for word in value.split():
            if word.startswith("file://"):
                word = word[len("file://"):]
            if word.startswith("/") and os.path.exists(word):
                word = os.path.normpath(word)
                # A local "simple" index links to its files relatively
                # (../../files/...): the folder holding it goes in whole.
                if os.path.basename(word) == "simple":
                    word = os.path.dirname(word)
                found.append(word)
    return found


def _pip_settings() -> List[str]:
    values = [value for name, value in os.environ.items() if name.startswith("PIP_")]
    for path in _pip_config_files():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in parser.sections():
            values += list(parser[section].values())
    return values


def _copy_in(source: str, target: str) -> None:
    """Copy a host file into the tree. A symbolic link at the target is
    removed first: written through, an absolute link would name a host file."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(target):
        os.unlink(target)
    shutil.copyfile(source, target)


@contextlib.contextmanager
def _mounted(path: str) -> Iterator[None]:
    """/proc, /sys, /dev and pip's local folders mounted in, DNS and pip's
    configuration copied in, for as long as any run inside needs them.

    Every run holds a shared lock on ``<tree>.users`` while it is inside;
    the mounts are made and removed under the exclusive ``<tree>.mount.lock``,
    by the first run in and by the last one out (the one that can take the
    users' lock exclusively once its own shared hold is gone). A run ended
    without unmounting (killed) leaves the mounts to the next one, which
    finds them in place."""
    users = open(path + ".users", "w")
    try:
        with _flock(path + ".mount.lock", fcntl.LOCK_EX):
            fcntl.flock(users, fcntl.LOCK_SH)
            if not os.path.ismount(os.path.join(path, "proc")):
                _mount(path)
        try:
            yield
        finally:
            with _flock(path + ".mount.lock", fcntl.LOCK_EX):
                fcntl.flock(users, fcntl.LOCK_UN)
                try:
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass        # another run is inside: it unmounts
                else:
                    _unmount(path)
                    fcntl.flock(users, fcntl.LOCK_UN)
    finally:
        users.close()


def _unmount(path: str) -> None:
    for target in reversed(_mounts_below(path)):
        # Busy (a process started inside still runs): detached lazily,
        # so no mount outlives the run.
        if subprocess.call(["umount", "-R", target], stderr=subprocess.DEVNULL) != 0:
            subprocess.call(["umount", "-R", "-l", target], stderr=subprocess.DEVNULL)


def _mount(path: str) -> None:
    for name in ("etc/resolv.conf", "etc/hosts"):
        source = os.path.join("/", name)
        if os.path.isfile(source):
            _copy_in(source, os.path.join(path, name))
    for config in _pip_config_files():
        _copy_in(config, path + config)
    folders: List[str] = []
    for local in _local_paths(_pip_settings()):
        target = path + local
        if os.path.isfile(local):      # a CA bundle: a copy will do
            _copy_in(local, target)
        elif local not in folders:
            folders.append(local)
    try:
        for name, how in (("proc", ["-t", "proc", "proc"]), ("sys", ["--rbind", "/sys"]),
                          ("dev", ["--rbind", "/dev"])):
            target = os.path.join(path, name)
            subprocess.check_call(["mount", *how, target])
            if how[0] == "--rbind":
                subprocess.check_call(["mount", "--make-rslave", target])
        for folder in folders:
            target = path + folder
            os.makedirs(target, exist_ok=True)
            subprocess.check_call(["mount", "--bind", folder, target])
            subprocess.check_call(["mount", "-o", "remount,bind,ro", target])
    except BaseException:
        _unmount(path)
        raise


def _environment(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The variables a command inside sees: a clean base, plus the host's
    pip, CI and project settings."""
    env = {"HOME": "/root", "LANG": "C.UTF-8", "TERM": os.environ.get("TERM", "dumb"),
           "DEBIAN_FRONTEND": "noninteractive",
           "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for name, value in os.environ.items():
        if name.startswith(("PIP_", "SOCKNOTIFY_")) or name in ("CI", "PYTEST_ADDOPTS"):
            env[name] = value
    env.pop(MIRROR_VARIABLE, None)
    env.update(extra or {})
    return env


def _in_tree(path: str, argv: List[str], env: Optional[Dict[str, str]] = None,
             cwd: str = "/", check: bool = True) -> int:
    """Run argv inside the (mounted) chroot; its exit status."""
    environment = _environment(env)
    command = ["chroot", path, "/usr/bin/env", "-i",
               *[f"{key}={value}" for key, value in sorted(environment.items())],
               "/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd, *argv]
    status = subprocess.call(command)
    if check and status != 0:
        raise subprocess.CalledProcessError(status, argv)
    return status


# -- the project's tests ----------------------------------------------------------------------

def _tracked_files() -> List[str]:
    """The files a fresh clone has (git ls-files), or every file but build
    leftovers when this is not a git checkout (an unpacked sdist)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached"], cwd=ROOT, check=True,
                             capture_output=True).stdout
        return [name for name in out.decode().split("\0")
                if name and os.path.isfile(os.path.join(ROOT, name))]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".tox", "build", "dist", "__pycache__"}
        names = []
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
            names += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files
                      if not f.endswith((".so", ".pyc"))]
        return names


def _copy_project(path: str, version: str) -> str:
    """A fresh copy of the tracked files at /root/src-X.Y inside; its path there."""
    inside = f"/root/src-{version}"
    target = path + inside
    if os.path.exists(target):
        shutil.rmtree(target)
    for name in _tracked_files():
        destination = os.path.join(target, name)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), destination)
    return inside


def _requirements_key(version: str) -> str:
    """What the venv's contents depend on besides the project itself."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(version.encode())
    return digest.hexdigest()[:16]


def _extras(version: str) -> str:
    return "test" if version in FREE_THREADED else "test,integrations"


def _ensure_venv(path: str, version: str, source: str) -> str:
    """/root/venv-X.Y inside, made by pythonX.Y -m venv with the test
    requirements, kept while pyproject.toml is unchanged; the project is
    reinstalled from ``source`` every time. Its path inside."""
    venv = f"/root/venv-{version}"
    key_file = path + venv + "/.socknotify-requirements"
    key = _requirements_key(version)
    try:
        with open(key_file, encoding="utf-8") as f:
            fresh = f.read().strip() == key
    except OSError:
        fresh = False
    if fresh:
        log(f"reinstalling the project into {venv}")
        _in_tree(path, [f"{venv}/bin/pip", "install", "-q", "--no-deps", "--force-reinstall",
                        source])
        return venv
    if os.path.exists(path + venv):
        shutil.rmtree(path + venv)
    log(f"making {venv} with Python {version} and the test requirements")
    _in_tree(path, [f"python{version}", "-m", "venv", venv])
    _in_tree(path, [f"{venv}/bin/pip", "install", "-q", f"{source}[{_extras(version)}]"])
    with open(key_file, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return venv


def test(version: str, pytest_args: List[str]) -> int:
    """The project's suite and CPython's conformance suites on Python
    ``version`` inside the chroot: tox's two pytest runs. Exit status."""
    if version not in VERSIONS:
        sys.exit(f"tools/chroot.py: Python {version} is not in the chroot ({VERSIONS})")
    path = _ensure_python(version)
    with _locked(path, version), _mounted(path):
        source = _copy_project(path, version)
        venv = _ensure_venv(path, version, source)
        env = {"SOCKNOTIFY_EXPECT_INSTALLED": "1", "VIRTUAL_ENV": venv,
               "PATH": f"{venv}/bin:" + _environment()["PATH"]}
        if version in FREE_THREADED:
            # The GIL off for everything the suites import (pytest's
            # plugins included), as a free-threaded deployment runs;
            # tests/test_threads.py checks in a child without it that the
            # package alone keeps the GIL off.
            env.update(PYTHON_GIL="0", SOCKNOTIFY_REQUIRE_INTEGRATIONS="0")
        # Our pytest runs from the copy, which has no compiled core: the
        # tests import the installed package (tests/test_packaging.py
        # checks it), as in tox's envs.
        pytest = [f"{venv}/bin/pytest", "-p", "no:cacheprovider", "-q", "-rfEs"]
        if pytest_args:
            return _in_tree(path, pytest + pytest_args, env=env, cwd=source, check=False)
        first = _in_tree(path, pytest + ["--ignore=tests/conformance", "tests"], env=env,
                         cwd=source, check=False)
        second = _in_tree(path, pytest + ["tests/conformance"], env=env, cwd=source,
                          check=False)
        return first or second


def _ensure_python(version: Optional[str], extra: List[str] = ()) -> str:
    """The chroot's path, made if need be, with ``version`` in it: a
    free-threaded one is built there (once) by tools/freethreaded.py."""
    if version in FREE_THREADED:
        from tools import freethreaded
        freethreaded.ensure()
    return ensure(extra)


def run(argv: List[str], version: Optional[str], fresh: bool = False,
        extra: List[str] = ()) -> int:
    """A command inside the chroot (with ``extra`` Debian packages), in
    version's venv when given; with ``fresh``, from a new copy of the
    project, installed into that venv first."""
    path = _ensure_python(version, extra)
    with _locked(path, version), _mounted(path):
        env = {}
        cwd = "/root"
        if version:
            venv = f"/root/venv-{version}"
            if fresh:
                cwd = _copy_project(path, version)
                _ensure_venv(path, version, cwd)
            elif not os.path.isdir(path + venv):
                sys.exit(f"no {venv} yet: run `python -m tools.chroot test --py {version}`")
            env = {"VIRTUAL_ENV": venv, "PATH": f"{venv}/bin:" + _environment()["PATH"]}
        return _in_tree(path, argv or ["/bin/bash"], env=env, cwd=cwd, check=False)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("ensure", help="make the chroot, or install what it lacks")
    make.add_argument("--with", dest="extra", default="",
                      help="more Debian packages, comma-separated (e.g. valgrind)")
    commands.add_parser("path", help="print the chroot's path")
    tests = commands.add_parser("test", help="the suite and CPython's conformance suites")
    tests.add_argument("--py", required=True, choices=VERSIONS)
    tests.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    shell = commands.add_parser("shell", help="an interactive shell inside")
    shell.add_argument("--py", choices=VERSIONS)
    command = commands.add_parser("run", help="a command inside (after --)")
    command.add_argument("--py", choices=VERSIONS, help="in that Python's venv")
    command.add_argument("--fresh", action="store_true",
                         help="in a new copy of the project, installed into --py's venv")
    command.add_argument("--with", dest="extra", default="",
                         help="Debian packages the command needs, comma-separated")
    command.add_argument("argv", nargs="+")
    options = parser.parse_args(argv)
    if options.command == "ensure":
        print(ensure([name for name in options.extra.split(",") if name]))
        return 0
    if options.command == "path":
        print(tree())
        return 0
    if options.command == "test":
        return test(options.py, options.pytest_args)
    if options.command == "shell":
        return run([], options.py)
    if options.fresh and not options.py:
        parser.error("--fresh needs --py")
    return run(options.argv, options.py, options.fresh,
               [name for name in options.extra.split(",") if name])


if __name__ == "__main__":
    sys.exit(main())
