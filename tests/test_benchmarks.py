"""benchmarks/ as a package: its modules import, its command runs by name
and by path, a worker run by path (as the Windows CPython under Wine runs
it) reports, and the figures are summed up as before (pyperf's statistics,
ratios paired within a round, pyperf files that pyperf reads back).

Every check runs in a child Python whose sys.path ends with the project
root, so this process keeps importing the installed socknotify_loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# pyperf is in the `test` extra for Linux CPython, where these tests run.
pytestmark = pytest.mark.skipif(
    sys.platform == "win32" or sys.implementation.name != "cpython",
    reason="the benchmarks' orchestrator is tested on Linux CPython (pyperf in the test extra)")


def _python(args, cwd, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _script(body: str, tmp_path) -> dict:
    """Run ``body`` with the project root last on sys.path; its JSON answer."""
    code = f"import sys; sys.path.append({ROOT!r})\n" + textwrap.dedent(body)
    proc = _python(["-c", code], cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("how", [["-m", "benchmarks.run"], [os.path.join("benchmarks", "run.py")]],
                         ids=["module", "path"])
def test_command_line_help(how):
    proc = _python([*how, "--help"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "--rounds" in proc.stdout and "--no-wine" in proc.stdout


def test_every_module_imports(tmp_path):
    optional = {"plots": "matplotlib", "trio_cases": "trio"}
    answer = _script(f"""
        import importlib, importlib.util, json, os
        names = sorted(n[:-3] for n in os.listdir({os.path.join(ROOT, "benchmarks")!r})
                       if n.endswith(".py") and n != "__init__.py")
        optional = {optional!r}
        done = []
        for name in names:
            if name in optional and importlib.util.find_spec(optional[name]) is None:
                continue
            importlib.import_module("benchmarks." + name)
            done.append(name)
        print(json.dumps(done))
        """, tmp_path)
    for name in ("run", "runner", "worker", "cases", "loops", "report", "targets",
                 "pyperf_files", "machine", "wine_side", "kernel_calls"):
        assert name in answer


def test_worker_run_by_path(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "describe": ["asyncio"],
        "measurements": [{"case": "pingpong_protocol", "loop": "asyncio"}],
        "cfg": {"count": 50, "timeout": 30}}))
    proc = _python([os.path.join(ROOT, "benchmarks", "worker.py"), str(spec)], cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert records[0]["describe"] == "asyncio" and records[0]["available"]
    assert records[-1]["case"] == "pingpong_protocol" and records[-1]["value"] > 0
    assert records[-1]["ops"] == 50


@pytest.mark.parametrize("kind", ["floor", "floor-timer", "ours", "asyncio"])
def test_the_floor_command_runs_each_kind_to_its_count(kind, tmp_path):
    """floor.py's runs, without valgrind: each drives the ping-pong to
    the count asked and stops (the counter's answer is printed here)."""
    answer = _script(f"""
        import json
        from benchmarks import cases, floor
        ticks = []
        tick = cases.Counter.tick
        def counted(self, k=1):
            ticks.append(k)
            return tick(self, k)
        cases.Counter.tick = counted
        floor.run_one({kind!r}, 40)
        print(json.dumps(len(ticks)))
        """, tmp_path)
    assert answer == 40


def test_statistics_paired_ratios_and_pyperf_files(tmp_path):
    answer = _script(f"""
        import json, pyperf
        from benchmarks import pyperf_files, runner
        records = [
            {{"case": "c", "loop": "ours", "round": 0, "value": 2.0, "unit": "ops/s"}},
            {{"case": "c", "loop": "ref", "round": 0, "value": 1.0, "unit": "ops/s"}},
            {{"case": "c", "loop": "ours", "round": 1, "value": 3.0, "unit": "ops/s"}},
            {{"case": "c", "loop": "ref", "round": 1, "value": 3.0, "unit": "ops/s"}},
            {{"case": "c", "loop": "ours", "round": 2, "value": 1.0, "unit": "ops/s"}},
            {{"case": "c", "loop": "ref", "round": 2, "error": "TimeoutError"}},
        ]
        summary = runner.summarise(records, "ours", ["ref"])["c"]
        results = {{"meta": {{"pyperf": {{"cpu_count": 2}}}},
                    "linux": {{"records": records, "memory": [
                        {{"case": "m", "loop": "ours", "value": 512.0, "unit": "bytes"}}]}}}}
        paths = pyperf_files.write(results, {str(tmp_path / "pyperf")!r})
        loaded = {{}}
        for path in paths:
            for bench in pyperf.BenchmarkSuite.load(path).get_benchmarks():
                loaded[path.rsplit("/", 1)[1] + ":" + bench.get_name()] = [
                    bench.get_values(), bench.get_unit(), bench.get_metadata()["cpu_count"]]
        print(json.dumps({{"summary": summary, "loaded": loaded}}))
        """, tmp_path)
    ours = answer["summary"]["loops"]["ours"]["stats"]
    assert ours == {"median": 2.0, "mean": 2.0, "stdev": 1.0, "min": 1.0, "max": 3.0, "n": 3}
    # Paired within a round: 2/1 and 3/3; round 2 has no peer figure.
    ratio = answer["summary"]["ratios"]["ref"]["stats"]
    assert (ratio["median"], ratio["min"], ratio["max"], ratio["n"]) == (1.5, 1.0, 2.0, 2)
    assert answer["summary"]["loops"]["ref"]["error"] == "TimeoutError"
    loaded = answer["loaded"]
    assert loaded["linux-ours.json:c"] == [[0.5, 1 / 3, 1.0], "second", 2]
    assert loaded["linux-ref.json:c"] == [[1.0, 1 / 3], "second", 2]
    assert loaded["linux-ours-memory.json:m"] == [[512.0], "byte", 2]


def test_scaling_table_and_its_kept_section(tmp_path):
    """benchmarks/scaling.py's table (medians, ranges, scale against one
    worker of the same kind, the GIL's state) and its section of
    docs/benchmarks.md surviving a full run's rewrite of the page."""
    page = tmp_path / "page.md"
    answer = _script(f"""
        import json
        from benchmarks import report, scaling
        result = {{"figures": {{"1 threads": [100.0, 110.0, 90.0], "1 processes": [100.0],
                               "2 threads": [190.0, 200.0, 180.0], "2 processes": [150.0],
                               "2 threads (GIL on)": [95.0]}},
                   "gil": {{"1 threads": False, "1 processes": False, "2 threads": False,
                            "2 processes": False, "2 threads (GIL on)": True}}}}
        begin, end = report.KEPT_THREADS
        with open({str(page)!r}, "w") as f:
            f.write("# old page\\n" + begin + "\\n## One loop per thread\\n" + end + "\\n")
        print(json.dumps({{"table": scaling._table(result, True).splitlines(),
                          "kept": report.kept_sections({str(page)!r})}}))
        """, tmp_path)
    table = answer["table"]
    assert table[2] == "| 1 threads | 100 | 90-110 | 1.00x | off |"
    assert table[4] == "| 2 threads | 190 | 180-200 | 1.90x | off |"
    assert table[5] == "| 2 processes | 150 | 150-150 | 1.50x | off |"
    assert table[6] == "| 2 threads (GIL on) | 95 | 95-95 | 0.95x | on |"
    assert answer["kept"][1:] == [
        "<!-- threads: measured by benchmarks/scaling.py, kept by report.py -->",
        "## One loop per thread", "<!-- /threads -->"]


# -- the peers and the HTTP case -------------------------------------------------------------

WRK_OK = """\
Running 2s test @ http://127.0.0.1:8000/
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    10.01ms    1.00ms  20.00ms   90.00%
    Req/Sec     5.00k   100.00     5.10k    80.00%
  10000 requests in 2.00s, 1.50MB read
Requests/sec:   4999.50
Transfer/sec:    750.00KB
"""


def test_peers_missing_or_too_new_are_reported_with_the_reason(tmp_path):
    """A peer that pip cannot install, or that is not for this Python,
    is an unavailable loop with the reason, never a silent omission; each
    missing peer is asked of pip on its own."""
    answer = _script("""
        import json, subprocess, sys
        from benchmarks import loops, peers
        asked = []
        def install(requirement):
            asked.append(requirement)
            return subprocess.CompletedProcess([], 1, "", "WARNING: Location x is ignored\\n"
                "ERROR: No matching distribution found for " + requirement + "\\n")
        loops.PEER_MODULES["nosuchpeer"] = "socknotify_no_such_peer_module"
        real = peers.requirements
        peers.requirements = lambda: dict(real(), nosuchpeer="nosuchpeer>=1")
        outcome = peers.ensure(["asyncio", "nosuchpeer", "nosuchpeer"], lambda line: None,
                               install=install)
        zuvloop = loops.describe("zuvloop") if sys.version_info < (3, 14) else None
        print(json.dumps({"outcome": outcome, "asked": asked, "zuvloop": zuvloop,
                          "file": sorted(real()),
                          "packages": loops.packages_of("aiofastnet-uvloop"),
                          "ours": [loops.uses_our_package(n) for n in
                                   ("aiofastnet-socknotify", "aiofastnet-asyncio", "socknotify")]}))
        """, tmp_path)
    assert answer["asked"] == ["nosuchpeer>=1"]
    assert answer["outcome"] == {"nosuchpeer": {
        "error": "pip install 'nosuchpeer>=1' failed: "
                 "ERROR: No matching distribution found for nosuchpeer>=1"}}
    if answer["zuvloop"] is not None:
        assert answer["zuvloop"]["available"] is False
        assert "CPython 3.14 and later" in answer["zuvloop"]["error"]
    assert answer["file"] == ["aiofastnet", "rloop", "uvloop", "veloxloop", "zuvloop"]
    assert answer["packages"] == ["aiofastnet", "uvloop"]
    assert answer["ours"] == [True, False, True]


def test_wrk_output_and_http_ratios_within_rounds(tmp_path):
    answer = _script(f"""
        import json
        from benchmarks import httpbench, report
        ok = {WRK_OK!r}
        parsed = [httpbench.parse_wrk(ok),
                  httpbench.parse_wrk(ok.replace("Requests/sec",
                      "  Socket errors: connect 0, read 3, write 0, timeout 2\\nRequests/sec")),
                  httpbench.parse_wrk(ok.replace("Requests/sec",
                      "  Non-2xx or 3xx responses: 7\\nRequests/sec")),
                  httpbench.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")]
        records = [
            {{"case": "http_aiohttp", "loop": "asyncio", "round": 0, "value": 100.0}},
            {{"case": "http_aiohttp", "loop": "socknotify", "round": 0, "value": 120.0}},
            {{"case": "http_aiohttp", "loop": "asyncio", "round": 1, "value": 200.0}},
            {{"case": "http_aiohttp", "loop": "socknotify", "round": 1, "value": 180.0}},
            {{"case": "http_aiohttp", "loop": "rloop", "round": 0,
              "error": "server did not start"}},
        ]
        summary = httpbench.summarise(records, ["asyncio", "socknotify", "rloop"])
        section = {{"http": {{"settings": {{"wrk": "wrk -t1 -c50", "placement": "p",
                                           "rounds": 2}},
                             "cases": {{"http_aiohttp": summary,
                                       "http_uvicorn": {{"error": "uvicorn is not installed"}}}}}}}}
        print(json.dumps({{"parsed": parsed, "summary": summary,
                          "table": report.http_table(section),
                          "peers": report.PEERS_TEXT}}))
        """, tmp_path)
    ok, socket_errors, non_2xx, refused = answer["parsed"]
    assert ok == {"value": 4999.5, "unit": "requests/s", "requests": 10000}
    assert socket_errors["error"].startswith("wrk: socket errors 0/3/0/2")
    assert non_2xx == {"error": "wrk: 7 non-2xx answers"}
    assert refused["error"].startswith("wrk reported no rate: unable to connect")
    ours = answer["summary"]["loops"]["socknotify"]
    # Paired within each round: 120/100 and 180/200.
    assert (ours["ratio"]["median"], ours["ratio"]["min"], ours["ratio"]["max"]) == (1.05, 0.9, 1.2)
    assert answer["summary"]["loops"]["asyncio"]["ratio"] is None
    assert answer["summary"]["loops"]["rloop"]["error"] == "server did not start"
    table = "\n".join(answer["table"])
    assert "| ours (epoll) | 150 (120-180) | **1.05x (0.90x-1.20x)** |" in table
    assert "| asyncio | 150 (100-200) | 1.00x |" in table
    assert "| rloop | failed: server did not start | - |" in table
    assert "not measured: uvicorn is not installed" in table
    assert any(line.startswith("| zuvloop |") for line in answer["peers"])


def test_each_peer_against_ours_paired_within_rounds_and_said_in_words(tmp_path):
    """The peers' table divides each peer's rate by ours round by round;
    its sentences say ahead, tie or behind from those medians and the A/A
    band, and a failed figure is left out, not counted."""
    answer = _script("""
        import json
        from benchmarks import report

        def cell(*rates):
            return {"per_round": {str(i): r for i, r in enumerate(rates) if r is not None},
                    "stats": {"median": 1, "min": 1, "max": 1}, "error": None}

        summary = {
            "pingpong_streams": {"loops": {
                "asyncio": cell(100, 100, 100), "asyncio-aa": cell(100, 110, 90),
                "socknotify": cell(100, 100, 100), "uvloop": cell(150, 120, 200),
                "rloop": cell(100, 105, 95)}},
            "churn": {"loops": {
                "asyncio": cell(10, 10, 10), "asyncio-aa": cell(10, 10, 10),
                "socknotify": cell(10, 10, 10), "uvloop": cell(20, 20, 20),
                "rloop": cell(5, 6, None)}},
            "udp_pingpong": {"loops": {
                "asyncio": cell(10, 10, 10), "asyncio-aa": cell(10, 10, 10),
                "socknotify": cell(10, 10, 10), "uvloop": cell(10, 10, 10),
                "rloop": {"per_round": {}, "stats": None, "error": "boom"}}},
        }
        section = {"usable": ["asyncio", "asyncio-aa", "socknotify", "uvloop", "rloop"],
                   "ours": ["socknotify"], "summary": {"socknotify": summary}}
        print(json.dumps(report.peers_against_ours(section, "linux")))
        """, tmp_path)
    text = "\n".join(answer)
    assert "| case | uvloop / ours (epoll) | rloop / ours (epoll) |" in text
    # uvloop over ours per round: 1.5, 1.2, 2.0 -> median 1.5 (1.2-2.0).
    assert "| ping-pong, streams (100 B) | 1.50x (1.20x-2.00x) | 1.00x (0.95x-1.05x) |" in text
    assert "| connection churn (connect, exchange, close) | 2.00x | 0.55x (0.50x-0.60x) |" in text
    assert "| UDP datagram ping-pong (100 B) | 1.00x | - |" in text
    assert "A/A band, 0.90x-1.10x" in text
    assert ("- uvloop: faster than this loop in 2 cases (1.50x-2.00x of its rate), tied in "
            "1 case (1.00x of its rate) (3 cases measured on both).") in text
    assert ("- rloop: tied in 1 case (1.00x of its rate), slower in 1 case (0.55x of its "
            "rate) (2 cases measured on both).") in text


@pytest.mark.parametrize("kind", ["uvicorn", "aiohttp"])
@pytest.mark.parametrize("loop", ["socknotify", "aiofastnet-socknotify"])
def test_http_server_serves_on_the_loop_named(kind, loop, tmp_path):
    """httpserve.py, as httpbench.py starts it (without wrk): it says READY
    once it listens, answers a request on the loop named, and stops."""
    import importlib.util
    needed = {"uvicorn": "uvicorn", "aiohttp": "aiohttp"}[kind]
    for module in (needed, *(("aiofastnet",) if loop.startswith("aiofastnet") else ())):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the integrations extra)")
    answer = _script(f"""
        import json, os, urllib.request
        from benchmarks import httpbench
        # The server, run by path, puts the project root last on sys.path:
        # socknotify_loop is the installed one, as in this process.
        env = {{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}
        proc, port, served_by = httpbench.start_server({kind!r}, {loop!r}, env, None)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/", timeout=30) as reply:
                body = reply.read().decode()
        finally:
            httpbench.stop_server(proc)
        print(json.dumps({{"body": body, "served_by": served_by, "exit": proc.returncode}}))
        """, tmp_path)
    assert answer["body"] == "Hello, world!"
    assert answer["served_by"] == "socknotify_loop.loop.Loop"


def test_pythons_section_shows_the_peers_of_each_version(tmp_path):
    """benchmarks/pythons.py's section (CPython 3.14 and 3.15, where zuvloop
    exists): a peer's instructions against asyncio's and ours, its timing
    paired within rounds, and a peer that did not install, with pip's
    reason."""
    counted = ("pingpong_protocol", "pingpong_streams", "udp_pingpong", "pingpong_sock")
    instructions = {case: {"asyncio": {"per_round_trip": 1000.0},
                           "socknotify": {"per_round_trip": 500.0},
                           "zuvloop": {"per_round_trip": 250.0}} for case in counted}
    per_round = {"asyncio": {"0": 10.0, "1": 20.0}, "asyncio-aa": {"0": 10.0, "1": 20.0},
                 "socknotify": {"0": 12.0, "1": 22.0}, "zuvloop": {"0": 15.0, "1": 40.0}}
    summary = {case: {"loops": {name: {"per_round": values}
                                for name, values in per_round.items()}, "ratios": {}}
               for case in counted}
    results = {"meta": {"python": "3.14.2"}, "linux": {
        "instructions": instructions, "summary": {"socknotify": summary},
        "loops": {"zuvloop": {"available": True, "version": "0.0.17"},
                  "uvloop": {"available": False,
                             "error": "pip install 'uvloop>=0.23' failed: ERROR: no wheel"}}}}
    path = tmp_path / "pythons-x-py314.json"
    path.write_text(json.dumps(results))
    answer = _script(f"""
        import json
        from benchmarks import pythons
        print(json.dumps(pythons.section([{str(path)!r}])))
        """, tmp_path)
    text = "\n".join(answer)
    assert "| 3.14.2 | zuvloop: pingpong_protocol | 250 | 0.250 | 0.500 | 1.75x (1.50x-2.00x) |" \
        in text
    assert "| 3.14.2 | zuvloop: udp_pingpong | 250 | 0.250 | 0.500 | not timed |" in text
    assert ("| 3.14.2 | uvloop | unavailable: pip install 'uvloop>=0.23' failed: "
            "ERROR: no wheel | - | - | - |") in text
