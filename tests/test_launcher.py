"""`python -m socknotify_loop`: unmodified programs run on our loop."""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import time
from typing import Optional

import pytest
from servers import PortTaken, child_env, need, on_a_free_port

import socknotify_loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent("""\
    import asyncio, sys

    async def main():
        loop = asyncio.get_running_loop()
        return f"{type(loop).__module__}.{type(loop).__qualname__}"

    print("run", asyncio.run(main()))
    loop = asyncio.new_event_loop()
    print("new_event_loop", type(loop).__module__ + "." + type(loop).__qualname__)
    loop.close()
    if sys.version_info >= (3, 11):
        with asyncio.Runner() as runner:
            print("Runner", runner.run(main()))
    print("argv", sys.argv[1:])
    print("name", __name__)
    """)

# The platform's loop class (socknotify_loop.Loop), as a running loop names it.
OURS = f"{socknotify_loop.Loop.__module__}.{socknotify_loop.Loop.__qualname__}"


def launch(*args: str, cwd: str, check: bool = True,
           env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run ``python -m socknotify_loop *args``; ``env`` adds variables."""
    # The copy of the package under test: the source tree with its in-place
    # build, or an installed wheel (the Windows runs).
    env = {**child_env(), **(env or {})}
    result = subprocess.run([sys.executable, "-m", "socknotify_loop", *args],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def parse(stdout: str) -> dict:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def test_script_runs_on_our_loop(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = parse(launch(str(script), "one", "--two", cwd=str(tmp_path)).stdout)
    assert out["run"] == OURS
    assert out["new_event_loop"] == OURS
    if sys.version_info >= (3, 11):
        assert out["Runner"] == OURS
    assert out["argv"] == "['one', '--two']"
    assert out["name"] == "__main__"


def test_same_script_without_launcher_uses_stock_loop(tmp_path):
    # The control: the probe tells loops apart.
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    result = subprocess.run([sys.executable, str(script)], capture_output=True,
                            text=True, timeout=120, check=True)
    assert parse(result.stdout)["run"] != OURS


def test_module_runs_on_our_loop(tmp_path):
    package = tmp_path / "probepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(PROBE + "print('file', __file__)\n")
    out = parse(launch("-m", "probepkg.probe", "x", cwd=str(tmp_path)).stdout)
    assert out["run"] == OURS
    assert out["argv"] == "['x']"
    assert out["name"] == "__main__"
    assert out["file"].endswith(os.path.join("probepkg", "probe.py"))


def test_script_directory_is_first_on_sys_path(tmp_path):
    (tmp_path / "helper_next_to_script.py").write_text("VALUE = 42\n")
    script = tmp_path / "uses_helper.py"
    script.write_text("import helper_next_to_script as h; print('value', h.VALUE)\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert parse(launch(str(script), cwd=str(elsewhere)).stdout)["value"] == "42"


def test_exit_status_and_exceptions_propagate(tmp_path):
    exits = tmp_path / "exits.py"
    exits.write_text("import sys; sys.exit(3)\n")
    assert launch(str(exits), cwd=str(tmp_path), check=False).returncode == 3
    raises = tmp_path / "raises.py"
    raises.write_text("raise LookupError('boom')\n")
    result = launch(str(raises), cwd=str(tmp_path), check=False)
    assert result.returncode == 1 and "LookupError: boom" in result.stderr


def test_usage_errors(tmp_path):
    assert launch("no_such_script.py", cwd=str(tmp_path), check=False).returncode == 2
    help_text = launch("--help", cwd=str(tmp_path))
    assert help_text.stdout.startswith("usage:") and help_text.stderr == ""
    # A mistake is one line saying what, and one line with the way out;
    # nothing on stdout, status 2.
    for args, what in ((["-m"], "-m needs a module name"), (["-c"], "-c needs a command"),
                       (["--bogus", "x.py"], "unknown option --bogus")):
        result = launch(*args, cwd=str(tmp_path), check=False)
        assert (result.returncode, result.stdout) == (2, ""), result
        lines = result.stderr.splitlines()
        assert len(lines) == 2, result.stderr
        assert lines[0].startswith(f"socknotify_loop: {what}")
        assert lines[1] == "hint: `python -m socknotify_loop --help` lists the options"


def test_no_arguments_prints_the_usage_line_on_stderr(tmp_path):
    result = launch(cwd=str(tmp_path), check=False)
    assert (result.returncode, result.stdout) == (2, "")
    lines = result.stderr.splitlines()
    assert lines[0].startswith("usage: python -m socknotify_loop ") and "-c command" in lines[0]
    assert lines[1:] == ["hint: `python -m socknotify_loop --help` lists the options"]


def test_command_runs_on_our_loop(tmp_path):
    """`-c` as `python -c`: argv[0] "-c", the rest passed on, __main__."""
    out = parse(launch("-c", PROBE, "one", "--two", cwd=str(tmp_path)).stdout)
    assert out["run"] == out["new_event_loop"] == OURS
    assert out["argv"] == "['one', '--two']"
    assert out["name"] == "__main__"
    command = "import sys; print('path0', repr(sys.path[0])); print('argv0', sys.argv[0])"
    out = parse(launch("-c", command, cwd=str(tmp_path)).stdout)
    assert out == {"path0": "''", "argv0": "-c"}


RAISES = textwrap.dedent("""\
    def inner():
        raise LookupError("boom")

    inner()
    """)


def plain_python(*args: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=120)


def test_traceback_is_the_programs_own(tmp_path):
    """An uncaught exception prints the traceback `python script.py` and
    `python -c` print: none of the launcher's or runpy's frames."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    result = launch(str(script), cwd=str(tmp_path), check=False)
    expected = plain_python(str(script), cwd=str(tmp_path))
    assert expected.returncode == 1 and "LookupError: boom" in expected.stderr
    assert result.returncode == 1
    assert "launcher.py" not in result.stderr and "runpy" not in result.stderr, result.stderr
    if sys.implementation.name == "cpython":
        assert result.stderr == expected.stderr
    # -c: the same frames and error (whether the "<string>" source lines
    # are shown differs between Python versions).
    result = launch("-c", RAISES, cwd=str(tmp_path), check=False)
    expected = plain_python("-c", RAISES, cwd=str(tmp_path))

    def frames_and_error(stderr: str) -> list:
        lines = stderr.splitlines()
        return [line for line in lines if line.startswith("  File ")] + lines[-1:]

    assert result.returncode == expected.returncode == 1
    assert frames_and_error(result.stderr) == frames_and_error(expected.stderr)
    assert frames_and_error(result.stderr)[0] == '  File "<string>", line 4, in <module>'
    # -m: python's own traceback starts in runpy; ours starts in the module.
    result = launch("-m", "raises", cwd=str(tmp_path), check=False)
    assert result.returncode == 1
    frames = [line for line in result.stderr.splitlines() if line.startswith("  File ")]
    assert len(frames) == 2 and all(str(script) in frame for frame in frames), result.stderr
    assert result.stderr.endswith("LookupError: boom\n")


def test_traceback_goes_through_the_programs_excepthook(tmp_path):
    script = tmp_path / "hooked.py"
    script.write_text("import sys\n"
                      "sys.excepthook = lambda t, e, tb: print('hooked', t.__name__, "
                      "tb.tb_frame.f_code.co_filename == __file__)\n" + RAISES)
    result = launch(str(script), cwd=str(tmp_path), check=False)
    assert result.returncode == 1
    assert parse(result.stdout) == {"hooked": "LookupError True"}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signal status")
@pytest.mark.skipif(sys.implementation.name != "cpython",
                    reason="CPython's way of ending on KeyboardInterrupt (by SIGINT) is compared")
def test_keyboard_interrupt_ends_like_python(tmp_path):
    """An uncaught KeyboardInterrupt: the trimmed traceback, and the
    process ends by SIGINT as `python script.py` does (status -2 here)."""
    script = tmp_path / "interrupted.py"
    script.write_text("raise KeyboardInterrupt\n")
    result = launch(str(script), cwd=str(tmp_path), check=False)
    expected = plain_python(str(script), cwd=str(tmp_path))
    assert expected.returncode == -2
    assert (result.returncode, result.stderr) == (expected.returncode, expected.stderr)


@pytest.mark.skipif(sys.implementation.name != "cpython",
                    reason="compared with CPython's own report of a script's SyntaxError")
def test_syntax_error_reported_like_python(tmp_path):
    script = tmp_path / "bad_syntax.py"
    script.write_text("def broken(:\n    pass\n")
    result = launch(str(script), cwd=str(tmp_path), check=False)
    expected = plain_python(str(script), cwd=str(tmp_path))
    assert (result.returncode, result.stderr) == (expected.returncode, expected.stderr)
    assert "Traceback" not in result.stderr


def test_info(tmp_path):
    from socknotify_loop.port import backend_info
    info = backend_info()
    out = launch("--info", cwd=str(tmp_path)).stdout
    assert f"backend: {info['backend']}" in out
    assert f"reason: {info['reason']}" in out
    for name in info["available"]:
        assert f"  {name}: " in out
    assert "os: " in out and "python: " in out
    assert sys.version.split()[0] in out
    if sys.platform == "win32":
        assert "windows build: " in out


def test_info_names_forced_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("SOCKNOTIFY_BACKEND", "epoll")
    if sys.platform != "linux":
        pytest.skip("epoll is the Linux backend")
    out = launch("--info", cwd=str(tmp_path)).stdout
    assert "forced by SOCKNOTIFY_BACKEND=epoll" in out


def test_example_program(tmp_path):
    """The README's first program runs on our loop exactly as on asyncio's:
    every byte echoed, and nothing on stderr (its server's handlers finish
    before main() returns, as they do on the stock loop; a loop that took
    up I/O later than asyncio would have them cancelled, and Python 3.11
    logs each cancellation as an "Exception in callback")."""
    result = launch(os.path.join(REPO, "examples", "asyncio_echo.py"), cwd=str(tmp_path))
    assert OURS in result.stdout
    assert result.stderr == ""


# -- programs that choose their own loop ----------------------------------------------

# Prints "<label> <module.qualname of the running loop>" for a loop built by
# the expression given; the probes below call it once per route.
LOOP_TYPE = textwrap.dedent("""\
    import asyncio, sys, warnings

    async def running_type():
        loop = asyncio.get_running_loop()
        return f"{type(loop).__module__}.{type(loop).__qualname__}"

    def report(label, loop):
        try:
            print(label, loop.run_until_complete(running_type()))
        finally:
            loop.close()
    """)


def run_probe(tmp_path, body: str, env: Optional[dict] = None) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(LOOP_TYPE + textwrap.dedent(body))
    return parse(launch(str(script), cwd=str(tmp_path), env=env).stdout)


def test_selector_event_loop_class_makes_our_loop(tmp_path):
    out = run_probe(tmp_path, """\
        from asyncio import SelectorEventLoop
        if sys.platform == "win32":
            from asyncio.windows_events import SelectorEventLoop as platform_class
        else:
            from asyncio.unix_events import SelectorEventLoop as platform_class
        report("call", asyncio.SelectorEventLoop())
        report("imported", SelectorEventLoop())
        report("platform", platform_class())
        if sys.version_info >= (3, 11):
            with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
                print("runner", runner.run(running_type()))
        if sys.version_info >= (3, 12):
            print("run", asyncio.run(running_type(), loop_factory=asyncio.SelectorEventLoop))
        """)
    assert out["call"] == out["imported"] == out["platform"] == OURS
    if sys.version_info >= (3, 11):
        assert out["runner"] == OURS
    if sys.version_info >= (3, 12):
        assert out["run"] == OURS


@pytest.mark.skipif(sys.version_info < (3, 13), reason="asyncio.EventLoop is new in 3.13")
def test_event_loop_alias_makes_our_loop(tmp_path):
    out = run_probe(tmp_path, """\
        report("alias", asyncio.EventLoop())
        print("run", asyncio.run(running_type(), loop_factory=asyncio.EventLoop))
        """)
    assert out["alias"] == out["run"] == OURS


@pytest.mark.skipif(sys.platform != "win32",
                    reason="asyncio.ProactorEventLoop exists only on Windows")
def test_proactor_event_loop_class_makes_our_loop(tmp_path):
    out = run_probe(tmp_path, """\
        from asyncio.windows_events import ProactorEventLoop
        loop = asyncio.ProactorEventLoop()
        # psycopg refuses a ProactorEventLoop: ours is not one.
        print("is_proactor", isinstance(loop, asyncio.ProactorEventLoop))
        report("call", loop)
        report("imported", ProactorEventLoop())
        """)
    assert out["call"] == out["imported"] == OURS
    assert out["is_proactor"] == "False"


@pytest.mark.parametrize("policy", ["DefaultEventLoopPolicy", "WindowsSelectorEventLoopPolicy",
                                    "WindowsProactorEventLoopPolicy"])
def test_stock_policy_makes_our_loop(tmp_path, policy):
    if sys.platform != "win32" and policy.startswith("Windows"):
        pytest.skip(f"asyncio.{policy} exists only on Windows")
    out = run_probe(tmp_path, f"""\
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # 3.14+
            policy_class = asyncio.{policy}
            asyncio.set_event_loop_policy(policy_class())

            class Subclassed(policy_class):
                pass

        print("run", asyncio.run(running_type()))
        report("new_event_loop", asyncio.new_event_loop())
        report("policy", asyncio.get_event_loop_policy().new_event_loop())
        report("subclass", Subclassed().new_event_loop())
        """)
    assert out["run"] == out["new_event_loop"] == out["policy"] == out["subclass"] == OURS


def test_isinstance_checks_answer_for_asyncio_classes(tmp_path):
    out = run_probe(tmp_path, """\
        import selectors
        from asyncio import selector_events
        from socknotify_loop import Loop
        ours = asyncio.SelectorEventLoop()
        stock = asyncio.SelectorEventLoop(selectors.DefaultSelector())  # explicit selector
        print("ours_is_selector_loop", isinstance(ours, asyncio.SelectorEventLoop))
        print("ours_is_base_selector_loop", isinstance(ours, selector_events.BaseSelectorEventLoop))
        print("stock_is_selector_loop", isinstance(stock, asyncio.SelectorEventLoop))
        print("loop_subclass", issubclass(Loop, asyncio.SelectorEventLoop))
        print("not_a_loop", isinstance(object(), asyncio.SelectorEventLoop))
        print("abstract", issubclass(asyncio.SelectorEventLoop, asyncio.AbstractEventLoop))
        print("isclass", __import__("inspect").isclass(asyncio.SelectorEventLoop))
        if sys.platform == "win32":
            print("ours_is_proactor", isinstance(ours, asyncio.ProactorEventLoop))
            print("stock_proactor", isinstance(asyncio.ProactorEventLoop(asyncio.IocpProactor()),
                                               asyncio.ProactorEventLoop))
        report("explicit_selector", stock)
        ours.close()
        """)
    assert out["ours_is_selector_loop"] == out["ours_is_base_selector_loop"] == "True"
    assert out["stock_is_selector_loop"] == out["loop_subclass"] == out["abstract"] == "True"
    assert out["isclass"] == "True"
    assert out["not_a_loop"] == "False"
    # A selector given explicitly is the program's choice: asyncio's loop on it.
    assert out["explicit_selector"] != OURS
    assert out["explicit_selector"].startswith("asyncio.")
    if sys.platform == "win32":
        assert out["ours_is_proactor"] == "False"
        assert out["stock_proactor"] == "True"


def test_program_subclass_of_selector_event_loop_still_works(tmp_path):
    out = run_probe(tmp_path, """\
        import abc

        class Tagged(asyncio.SelectorEventLoop):
            def __init_subclass__(cls, tag="", **kwargs):
                super().__init_subclass__(**kwargs)
                cls.tag = tag

        class MyLoop(Tagged, tag="mine"):
            def __init__(self):
                super().__init__()
                self.made_by_program = True

            def call_soon(self, *args, **kwargs):   # zero-argument super() works
                self.calls = getattr(self, "calls", 0) + 1
                return super().call_soon(*args, **kwargs)

        class WithAbc(asyncio.SelectorEventLoop, metaclass=abc.ABCMeta):
            pass

        loop = MyLoop()
        print("made_by_program", loop.made_by_program, MyLoop.tag)
        print("metaclass", type(MyLoop).__name__, type(WithAbc).__name__)
        base = MyLoop.__mro__[2]   # MyLoop, Tagged, then asyncio's own class
        print("stock_base", type(base) is type and base.__module__ in
              ("asyncio.unix_events", "asyncio.windows_events"))
        print("instance", isinstance(loop, asyncio.SelectorEventLoop))
        report("subclass", loop)
        print("calls", loop.calls > 0)
        report("abc", WithAbc())
        """)
    assert out["subclass"].endswith(".MyLoop")
    assert out["abc"].endswith(".WithAbc")
    assert out["made_by_program"] == "True mine"
    assert out["metaclass"] == "type ABCMeta"
    assert out["stock_base"] == out["instance"] == out["calls"] == "True"


APP = textwrap.dedent("""\
    import asyncio

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        body = f"{type(loop).__module__}.{type(loop).__qualname__}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    """)


def http_get(port: int, deadline: float,
             server: Optional[subprocess.Popen] = None) -> Optional[bytes]:
    """GET / from 127.0.0.1:port, retrying until the server listens; None
    if ``server`` has ended without listening."""
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                chunks = []
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return b"".join(chunks)
                    chunks.append(chunk)
        except (ConnectionRefusedError, ConnectionResetError):
            if server is not None and server.poll() is not None:
                return None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("loop_option", ["auto", "asyncio", "none", "uvloop"])
def test_uvicorn_serves_a_request_on_our_loop(tmp_path, loop_option):
    """Every --loop choice serves on our loop, uvloop's too: `auto` picks
    uvloop whenever it is installed (uvicorn[standard] brings it), and the
    launcher's uvloop makes our loops."""
    need("uvicorn")
    if loop_option == "uvloop":
        need_uvloop()
    (tmp_path / "app.py").write_text(APP)
    env = child_env()

    def serve_one_request(port: int):
        # --limit-max-requests 1: uvicorn shuts down by itself after the request.
        server = subprocess.Popen(
            [sys.executable, "-m", "socknotify_loop", "-m", "uvicorn", "app:app",
             "--host", "127.0.0.1", "--port", str(port), "--loop", loop_option,
             "--limit-max-requests", "1"],
            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            response = http_get(port, time.monotonic() + 60, server)
            stdout, stderr = server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()
        if response is None and "in use" in stderr:
            raise PortTaken(f"uvicorn could not bind 127.0.0.1:{port}:\n{stderr}")
        return response, stderr, server.returncode

    # A port taken meanwhile (by a suite running beside this one): another.
    response, stderr, returncode = on_a_free_port(serve_one_request)
    assert response is not None, stderr
    assert response.startswith(b"HTTP/1.1 200"), (response, stderr)
    assert response.split(b"\r\n\r\n", 1)[1].decode() == OURS, stderr
    assert returncode == 0, stderr


# -- uvloop and winloop --------------------------------------------------------------------

def need_uvloop() -> None:
    """uvloop is in the `integrations` extra where it installs (CPython, not
    Windows); elsewhere its tests skip, naming why. Where it installs but is
    missing, need() skips naming it (fails when the integrations are
    required, as in CI)."""
    if importlib.util.find_spec("uvloop") is None:
        if sys.platform == "win32" or sys.implementation.name != "cpython":
            pytest.skip("uvloop exists for CPython on Linux and macOS only")
        need("uvloop")


OTHER_LOOP_PROBE = """\
    import {package}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # install(): 3.12+
        {package}.install()
    print("installed", asyncio.run(running_type()))
    report("new_event_loop", {package}.new_event_loop())
    report("Loop", {package}.Loop())
    report("policy", {package}.EventLoopPolicy().new_event_loop())
    print("run", {package}.run(running_type()))
    loop = {package}.new_event_loop()
    print("isinstance", isinstance(loop, {package}.Loop))
    loop.close()

    class Own({package}.Loop):
        pass

    report("subclass", Own())
    """


def test_uvloop_makes_our_loop(tmp_path):
    """uvloop's entry points (what `uvicorn --loop auto|uvloop` and
    programs call) make our loop under the launcher; a program's own
    subclass of uvloop.Loop stays on uvloop, and stderr says so in one line."""
    need_uvloop()
    script = tmp_path / "probe.py"
    script.write_text(LOOP_TYPE + textwrap.dedent(OTHER_LOOP_PROBE.format(package="uvloop")))
    result = launch(str(script), cwd=str(tmp_path))
    out = parse(result.stdout)
    for route in ("installed", "new_event_loop", "Loop", "policy", "run"):
        assert out[route] == OURS, (route, out)
    assert out["isinstance"] == "True"
    assert out["subclass"] == "__main__.Own"
    assert result.stderr == ("socknotify_loop: a class subclassing uvloop.Loop runs on "
                             "uvloop, not on socknotify_loop\n")
    # The control: without the launcher the same program runs on uvloop.
    plain = parse(plain_python(str(script), cwd=str(tmp_path)).stdout)
    assert plain["installed"] == plain["run"] == "uvloop.Loop"


# winloop exists for Windows only; this stands in for it on every platform,
# laid out as winloop's __init__.py is (a module-level Loop class reached
# by new_event_loop, EventLoopPolicy, install and run through the global name).
FAKE_WINLOOP = """\
import asyncio
import asyncio.events

# Python 3.14 renamed it _BaseDefaultEventLoopPolicy (policies are deprecated).
BaseDefaultEventLoopPolicy = getattr(asyncio.events, "BaseDefaultEventLoopPolicy", None) or \
    asyncio.events._BaseDefaultEventLoopPolicy


class Loop(asyncio.SelectorEventLoop):
    pass


def new_event_loop():
    return Loop()


def install():
    asyncio.set_event_loop_policy(EventLoopPolicy())


def run(main, *, loop_factory=new_event_loop):
    async def wrapper():
        if not isinstance(asyncio.get_running_loop(), Loop):
            raise TypeError("winloop.run() uses a non-winloop event loop")
        return await main
    loop = loop_factory()
    try:
        return loop.run_until_complete(wrapper())
    finally:
        loop.close()


class EventLoopPolicy(BaseDefaultEventLoopPolicy):
    def _loop_factory(self):
        return new_event_loop()
"""


def test_winloop_makes_our_loop(tmp_path):
    if importlib.util.find_spec("winloop") is None:
        (tmp_path / "winloop.py").write_text(FAKE_WINLOOP)
    script = tmp_path / "probe.py"
    script.write_text(LOOP_TYPE + textwrap.dedent(OTHER_LOOP_PROBE.format(package="winloop")))
    result = launch(str(script), cwd=str(tmp_path))
    out = parse(result.stdout)
    for route in ("installed", "new_event_loop", "Loop", "policy", "run"):
        assert out[route] == OURS, (route, out)
    assert out["isinstance"] == "True"
    assert out["subclass"] == "__main__.Own"
    assert result.stderr.splitlines() == [
        "socknotify_loop: a class subclassing winloop.Loop runs on winloop, "
        "not on socknotify_loop"]


# -- launcher faults -----------------------------------------------------------------------

def unavailable_backend() -> str:
    from socknotify_loop.port import available_backends
    for name, (ok, _) in available_backends().items():
        if not ok:
            return name
    pytest.skip("every backend is available on this machine")


def test_info_with_unavailable_backend_fails(tmp_path):
    name = unavailable_backend()
    result = launch("--info", cwd=str(tmp_path), check=False,
                    env={"SOCKNOTIFY_BACKEND": name})
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f"backend: {name}" not in lines
    assert any(line.startswith("backend: none (") and repr(name) in line
               and "not available" in line for line in lines), result.stdout
    assert f"forced by SOCKNOTIFY_BACKEND={name}" in lines


def test_unusable_backend_is_one_error_line(tmp_path):
    name = unavailable_backend()
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    for args in ([str(script)], ["-m", "asyncio"]):
        result = launch(*args, cwd=str(tmp_path), check=False, env={"SOCKNOTIFY_BACKEND": name})
        assert result.returncode == 1
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert repr(name) in lines[0] and "not available" in lines[0]


def test_backend_name_is_case_insensitive(tmp_path):
    from socknotify_loop.port import backend_info
    name = backend_info()["backend"]
    env = {"SOCKNOTIFY_BACKEND": f" {name.upper()}\t"}
    info = launch("--info", cwd=str(tmp_path), env=env).stdout.splitlines()
    assert f"backend: {name}" in info
    script = tmp_path / "backend.py"
    script.write_text("import asyncio\nloop = asyncio.new_event_loop()\n"
                      "print('backend', loop.backend)\nloop.close()\n")
    assert parse(launch(str(script), cwd=str(tmp_path), env=env).stdout)["backend"] == name


def test_unknown_backend_name_lists_the_choices(tmp_path):
    env = {"SOCKNOTIFY_BACKEND": "kqueue"}
    info = launch("--info", cwd=str(tmp_path), check=False, env=env)
    assert info.returncode == 1
    assert "backend: none (" in info.stdout and "choose from psn, afd, epoll" in info.stdout
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    result = launch(str(script), cwd=str(tmp_path), check=False, env=env)
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "'kqueue'" in result.stderr and "choose from psn, afd, epoll" in result.stderr


def test_parse_backend_name():
    from socknotify_loop._backends import backend_from_environment, parse_backend_name
    assert parse_backend_name("epoll") == "epoll"
    assert parse_backend_name(" EPOLL\n") == "epoll"
    assert parse_backend_name("Afd") == "afd"
    assert parse_backend_name("PSN") == "psn"
    for bad in ("", " ", "kqueue", "epol", "e poll"):
        with pytest.raises(ValueError, match="choose from psn, afd, epoll"):
            parse_backend_name(bad)
    with pytest.raises(TypeError):
        parse_backend_name(None)  # type: ignore[arg-type]
    assert backend_from_environment({}) is None
    assert backend_from_environment({"SOCKNOTIFY_BACKEND": "  "}) is None
    assert backend_from_environment({"SOCKNOTIFY_BACKEND": "Epoll"}) == "epoll"
    with pytest.raises(ValueError, match="SOCKNOTIFY_BACKEND='x'"):
        backend_from_environment({"SOCKNOTIFY_BACKEND": "x"})


def python_m(module: str, cwd: str) -> subprocess.CompletedProcess:
    """What plain `python -m module` does, for comparison."""
    return subprocess.run([sys.executable, "-m", module], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_missing_module_reported_like_python(tmp_path):
    package = tmp_path / "pkg_without_main"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module in ("socknotify_no_such_module", "pkg_without_main", "pkg_without_main.nope"):
        expected = python_m(module, str(tmp_path))
        result = launch("-m", module, cwd=str(tmp_path), check=False)
        assert expected.returncode == 1
        assert (result.returncode, result.stdout, result.stderr) == \
            (expected.returncode, expected.stdout, expected.stderr)
        assert len(result.stderr.splitlines()) == 1


def test_import_error_inside_module_keeps_its_traceback(tmp_path):
    (tmp_path / "imports_missing.py").write_text("import socknotify_no_such_dependency\n")
    result = launch("-m", "imports_missing", cwd=str(tmp_path), check=False)
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "No module named 'socknotify_no_such_dependency'" in result.stderr


def test_multiprocessing_children_run_on_our_loop(tmp_path):
    # uvicorn --workers/--reload start their servers this way (spawn).
    script = tmp_path / "children.py"
    script.write_text(textwrap.dedent("""\
        import asyncio, multiprocessing

        async def running_type():
            loop = asyncio.get_running_loop()
            return f"{type(loop).__module__}.{type(loop).__qualname__}"

        def child(queue):
            queue.put(asyncio.run(running_type()))
            loop = asyncio.SelectorEventLoop()
            queue.put(f"{type(loop).__module__}.{type(loop).__qualname__}")
            loop.close()

        if __name__ == "__main__":
            for method in multiprocessing.get_all_start_methods():
                context = multiprocessing.get_context(method)
                queue = context.Queue()
                process = context.Process(target=child, args=(queue,))
                process.start()
                print(method, queue.get(timeout=60), queue.get(timeout=60))
                process.join(60)
                print(method + "_exit", process.exitcode)
        """))
    out = parse(launch(str(script), cwd=str(tmp_path)).stdout)
    assert "spawn" in out
    for method in ("fork", "spawn", "forkserver"):
        if method in out:
            assert out[method] == f"{OURS} {OURS}"
            assert out[method + "_exit"] == "0"
