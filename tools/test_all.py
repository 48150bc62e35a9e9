#!/usr/bin/env python3
"""Run every test environment: `python tools/test_all.py [options] [tox args]`.

What it does, in order:

1. Installs tox if it is missing and makes the pyenv Pythons 3.9-3.13
   visible to it (PYENV_VERSION lists every installed one, so the shims
   resolve python3.X).
2. Installs the Debian packages the selected environments need, all in one
   ``apt-get update`` and one ``apt-get install`` (as root): PostgreSQL and
   Redis for the integration tests, PyPy and its headers, Wine,
   mingw-w64 and osslsigncode (the Windows CPython's signature check),
   mmdebstrap for the CPython 3.14/3.15 chroot. Environments
   that would otherwise each run apt themselves find everything there.
3. Runs tox's environments side by side (``tox -p``), the longest first:
   the two Wine suites, then the chroot's CPython 3.14 (which makes the
   chroot on a new machine) before 3.15, then the rest. On a
   two-core machine three at a time keeps both cores busy: the suites wait
   on sockets, timers, child processes and package downloads much of the
   time.
4. Prints, per environment, its result, its time and the closing lines of
   its test runs, then a table of times; the whole output of each
   environment is kept in ``.tox/logs/<env>.log``. A run longer than
   BUDGET_MINUTES ends with a warning line naming the slowest environments.

CPython's conformance suites (tests/conformance) run whole on the oldest
and newest CPython (py39, py311 as the main one, py315) and on both
Windows Pythons; the middle versions (py310, py312, py313, py314) run the
set that drives the loop's own I/O (tox.ini sets SOCKNOTIFY_CONFORMANCE=
light there; tests/conformance/conftest.py says which modules). ``--full``
runs the whole set everywhere: run it before a change that touches what
only the lighter versions' suites would catch.

Options (before any tox argument):
  --jobs N   environments at once (default 3; 1 runs them one after another)
  --full     the whole conformance set on every version
Everything else goes to tox (``-e py311``, ``-- tests/test_port.py``).
The free-threaded CPython 3.14 (tox's py314t, OPT_IN) runs only when named:
``-e py314t`` alone, ``-e ALL,py314t`` with everything else.
Exits with tox's status.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: CI's budget on a fresh machine; past it the run ends with a warning.
BUDGET_MINUTES = 45
#: the order environments start in when several run at once: the longest
#: first, so that no long one starts last and runs alone. Measured on a
#: fresh two-core machine (tests/README.md has the table).
LONGEST_FIRST = ["wine311", "wine313", "py314", "py39", "py315", "pypy3", "py311",
                 "py310", "py312", "py313", "dist", "sanitizers", "lint"]
#: Environments outside tox's envlist, run only when named (``-e py314t``,
#: or ``-e ALL,py314t`` for everything and them): the free-threaded
#: CPython, whose first build on a fresh machine would take the run past
#: its budget. Long: they start first when named with others.
OPT_IN = ["py314t"]
#: Debian packages, and the environments that need them.
APT_NEEDS = {
    "postgresql": "tests", "redis-server": "tests",
    "pypy3": "pypy3", "pypy3-dev": "pypy3",
    "wine64": "wine", "gcc-mingw-w64-x86-64": "wine", "osslsigncode": "wine",
    "mmdebstrap": "chroot",
}


def pyenv_versions():
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    versions = os.path.join(root, "versions")
    if not os.path.isdir(versions):
        return []
    wanted = ("3.9.", "3.10.", "3.11.", "3.12.", "3.13.")
    found = sorted(v for v in os.listdir(versions) if v.startswith(wanted))
    # The running Python first, so plain `python` stays what it was.
    current = "{}.{}.{}".format(*sys.version_info[:3])
    return sorted(found, key=lambda v: v != current)


def split_args(argv):
    """(jobs, full, tox_args) from the command line."""
    jobs, full, rest = 3, False, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--":
            rest += [arg, *args]
            break
        if arg == "--full":
            full = True
        elif arg == "--jobs" or arg.startswith("--jobs="):
            value = arg.partition("=")[2] or (args.pop(0) if args else "")
            if not value.isdigit() or int(value) < 1:
                sys.exit("tools/test_all.py: --jobs takes a whole number of at least 1")
            jobs = int(value)
        else:
            rest.append(arg)
    return jobs, full, rest


def selected_envs(tox_args):
    """The environments named with -e, or None for tox's whole envlist."""
    for i, arg in enumerate(tox_args):
        if arg == "--":
            break
        if arg == "-e" and i + 1 < len(tox_args):
            return tox_args[i + 1].split(",")
        if arg.startswith("-e") and len(arg) > 2:
            return arg[2:].lstrip("=").split(",")
    return None


def envlist():
    """tox.ini's envlist, as written."""
    import configparser
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(os.path.join(HERE, "tox.ini"))
    return [e.strip() for e in parser.get("tox", "envlist").replace("\n", ",").split(",")
            if e.strip()]


def chosen_envs(chosen):
    """The environments to run: tox's envlist when none is named; ``ALL``
    stands for the envlist, beside any opt-in environment named with it."""
    if chosen is None:
        return envlist()
    if "ALL" in chosen:
        everything = envlist()
        return everything + [e for e in chosen if e != "ALL" and e not in everything]
    return chosen


def ordered(envs):
    """The environments, the longest first (unknown ones keep their place at the end)."""
    rank = {name: i for i, name in enumerate(OPT_IN + LONGEST_FIRST)}
    return sorted(envs, key=lambda e: rank.get(e, len(rank)))


def apt_packages_needed(envs):
    """The Debian packages the environments need that are not installed."""
    def wanted(need):
        if need == "tests":
            return any(e.startswith(("py", "wine")) for e in envs)
        if need == "wine":
            return any(e.startswith("wine") for e in envs)
        if need == "chroot":
            return any(e in ("py314", "py315", "py314t") for e in envs) and not chroot_ready()
        return need in envs

    return [pkg for pkg, need in APT_NEEDS.items() if wanted(need) and not installed(pkg)]


def shown_path(path):
    """``path`` relative to the checkout where it can be (on Windows a
    path on another drive, a temporary folder's, cannot)."""
    try:
        return os.path.relpath(path, HERE)
    except ValueError:
        return path


def chroot_ready():
    """The sid chroot is made and stamped (tools/chroot.py's tree(): the
    same folder name, 'sid-chroot'), so its Debian tools need no apt-get."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.exists(os.path.join(base, "socknotify_loop", "sid-chroot",
                                       ".socknotify-chroot.json"))


def installed(package):
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                            capture_output=True, text=True)
    return result.returncode == 0 and "install ok installed" in result.stdout


def install_system_packages(envs):
    """One apt-get update and one apt-get install for every environment."""
    if not shutil.which("dpkg-query"):
        return
    missing = apt_packages_needed(envs)
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit("the test environments need Debian packages: "
                 f"apt-get install -y {' '.join(missing)} (as root)")
    start = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=900"]
    print(f"[test_all] apt-get install {' '.join(missing)}", flush=True)
    subprocess.check_call(["apt-get", *lock, "update", "-qq"], env=env)
    subprocess.check_call(["apt-get", *lock, "install", "-y", "-qq", *missing], env=env,
                          stdout=subprocess.DEVNULL)
    print(f"[test_all] system packages installed in {time.monotonic() - start:.0f} s",
          flush=True)


def tail_lines(text, count):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-count:]


def failure_lines(text, count=20):
    """pytest's short summary lines for failures and errors (``-rfE``), and
    the conformance suites' reruns (tests/conformance/conftest.py), so the
    report names the failing test and not only how many failed."""
    lines = [line for line in text.splitlines()
             if line.startswith(("FAILED ", "ERROR ", "RERUN "))]
    if len(lines) > count:
        return lines[:count] + [f"... and {len(lines) - count} more"]
    return lines


def report(result_file, envs, elapsed, log_dir):
    """Per environment: status, time, the closing lines of each command;
    then the table of times and, past the budget, the warning."""
    try:
        with open(result_file, encoding="utf-8") as f:
            results = json.load(f).get("testenvs", {})
    except (OSError, ValueError) as exc:
        print(f"[test_all] no tox result file ({exc}); times per environment unknown")
        return
    os.makedirs(log_dir, exist_ok=True)
    times = []
    for name in envs:
        data = results.get(name)
        if not data:
            continue
        commands = data.get("setup", []) + data.get("test", [])
        seconds = sum(c.get("elapsed", 0.0) for c in commands)
        failed = any(c.get("retcode") not in (0, None) for c in data.get("test", []))
        times.append((seconds, name, "FAILED" if failed else "ok"))
        with open(os.path.join(log_dir, f"{name}.log"), "w", encoding="utf-8") as log:
            for command in commands:
                log.write("$ " + " ".join(command.get("command", [])) + "\n")
                log.write(command.get("output", "") + command.get("err", ""))
        print(f"\n===== {name}: {'FAILED' if failed else 'ok'} in {seconds:.0f} s "
              f"(whole output: {shown_path(log.name)})")
        for command in data.get("test", []):
            words = command.get("command", [])
            print("  $ " + " ".join(os.path.basename(w) if i == 0 else w
                                    for i, w in enumerate(words))[:160])
            output = command.get("output", "")
            for line in failure_lines(output) + tail_lines(output, 4):
                print("    " + line[:300])
    print("\n[test_all] time per environment (side by side, so they add up to more "
          "than the run):")
    for seconds, name, status in sorted(times, reverse=True):
        print(f"  {name:<12} {seconds:7.0f} s  {status}")
    print(f"[test_all] whole run: {elapsed:.0f} s ({elapsed / 60:.1f} min)")
    if elapsed > BUDGET_MINUTES * 60:
        slowest = ", ".join(f"{name} {seconds:.0f} s" for seconds, name, _ in
                            sorted(times, reverse=True)[:3])
        print(f"WARNING: the run took {elapsed / 60:.1f} min, over the {BUDGET_MINUTES}-minute "
              f"budget; slowest environments: {slowest}")


def main():
    jobs, full, tox_args = split_args(sys.argv[1:])
    start = time.monotonic()
    try:
        import tox  # noqa: F401
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "tox>=4"])
    chosen = selected_envs(tox_args)
    envs = ordered(chosen_envs(chosen))
    install_system_packages(envs)
    env = dict(os.environ)
    if full:
        env["SOCKNOTIFY_CONFORMANCE"] = "full"
    versions = pyenv_versions()
    if versions:
        env["PYENV_VERSION"] = ":".join(versions)
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        bins = [os.path.join(root, "versions", v, "bin") for v in versions]
        env["PATH"] = os.pathsep.join(bins + [env.get("PATH", "")])
    if chosen is None:
        tox_args = ["-e", ",".join(envs), *tox_args]
    else:
        # The same environments, the longest first.
        index = next(i for i, a in enumerate(tox_args) if a == "-e" or a.startswith("-e"))
        if tox_args[index] == "-e":
            tox_args = tox_args[:index] + ["-e", ",".join(envs)] + tox_args[index + 2:]
        else:
            tox_args = tox_args[:index] + ["-e", ",".join(envs)] + tox_args[index + 1:]
    log_dir = os.path.join(HERE, ".tox", "logs")
    os.makedirs(log_dir, exist_ok=True)
    result_file = os.path.join(log_dir, "result.json")
    parallel = ["-p", str(jobs), "--parallel-no-spinner"] if jobs > 1 and len(envs) > 1 else []
    if parallel:
        print(f"[test_all] {len(envs)} environments, {jobs} at a time: {', '.join(envs)}",
              flush=True)
    command = [sys.executable, "-m", "tox", "-c", HERE, *parallel, "--result-json",
               result_file, *tox_args]
    tox = subprocess.Popen(command, env=env)
    try:
        status = tox.wait()
    except KeyboardInterrupt:
        # Ctrl+C reached tox too (same terminal): let it stop its own
        # environments' processes, then say so in one line.
        try:
            tox.wait(timeout=60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            tox.kill()
            tox.wait()
        print("\ntools/test_all.py: interrupted; one environment runs alone with "
              "`python tools/test_all.py -e py311`", file=sys.stderr)
        return 130
    report(result_file, envs, time.monotonic() - start, log_dir)
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # during the installs before tox starts
        print("\ntools/test_all.py: interrupted", file=sys.stderr)
        sys.exit(130)
