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
