"""tools/test_all.py's pure parts: the order environments start in, its own
options, and the report that ends a run (times, the over-budget warning).

The whole tool runs in CI (`.ci/run`), where a fault in it fails the run.
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "test_all.py")


@pytest.fixture(scope="module")
def tool():
    if not os.path.exists(TOOL) or not os.path.exists(os.path.join(ROOT, "tox.ini")):
        pytest.skip("tools/ and tox.ini are not shipped here")
    spec = importlib.util.spec_from_file_location("test_all_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_tox_environment_has_its_place_in_the_order(tool):
    # A new environment missing from LONGEST_FIRST would start last: if it
    # is long, the run waits for it alone.
    envs = tool.envlist()
    assert sorted(envs) == sorted(tool.LONGEST_FIRST)
    assert tool.ordered(envs) == tool.LONGEST_FIRST


def test_order_keeps_unknown_environments_at_the_end(tool):
    assert tool.ordered(["lint", "custom", "wine313", "py311"]) == [
        "wine313", "py311", "lint", "custom"]


def test_the_chroot_maker_starts_before_the_other_chroot_version(tool):
    # The first of the two to run on a new machine makes the chroot (about
    # 4 minutes) while the other waits for it: the maker goes first.
    order = tool.ordered(tool.envlist())
    assert order.index("py314") < order.index("py315")


def test_opt_in_environments_run_only_when_named(tool):
    # py314t is a tox environment outside envlist: the default run leaves
    # it out, ALL brings the envlist beside it, and it starts first.
    assert not set(tool.OPT_IN) & set(tool.envlist())
    assert tool.chosen_envs(None) == tool.envlist()
    assert tool.chosen_envs(["py314t"]) == ["py314t"]
    assert tool.chosen_envs(["ALL", "py314t"]) == tool.envlist() + ["py314t"]
    assert tool.ordered(tool.chosen_envs(["ALL", "py314t"]))[0] == "py314t"


@pytest.mark.parametrize("argv, expected", [
    ([], (3, False, [])),
    (["--jobs", "1"], (1, False, [])),
    (["--jobs=2", "--full", "-e", "py311"], (2, True, ["-e", "py311"])),
    (["-e", "py311", "--", "--full", "tests/test_port.py"],
     (3, False, ["-e", "py311", "--", "--full", "tests/test_port.py"])),
])
def test_own_options_are_taken_before_tox_arguments(tool, argv, expected):
    assert tool.split_args(argv) == expected


@pytest.mark.parametrize("bad", [["--jobs", "0"], ["--jobs", "x"], ["--jobs"]])
def test_bad_jobs_is_refused(tool, bad):
    with pytest.raises(SystemExit, match="--jobs takes a whole number"):
        tool.split_args(bad)


def _results(tmp_path, envs):
    data = {"testenvs": {
        name: {"setup": [{"command": ["pip"], "output": "", "err": "", "retcode": 0,
                          "elapsed": 1.0}],
               "test": [{"command": ["pytest", "-q"], "output": f"{name} out\n1 passed in 1s\n",
                         "err": "", "retcode": code, "elapsed": seconds}]}
        for name, (seconds, code) in envs.items()}}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_report_gives_each_environment_its_time_and_log(tool, tmp_path, capsys):
    result = _results(tmp_path, {"py311": (99.0, 0), "wine311": (500.0, 1)})
    tool.report(result, ["wine311", "py311"], 600.0, str(tmp_path / "logs"))
    out = capsys.readouterr().out
    assert "===== wine311: FAILED in 501 s" in out
    assert "===== py311: ok in 100 s" in out
    assert "1 passed in 1s" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and " s  " in line]
    assert [row[0] for row in rows] == ["wine311", "py311"]   # the slowest first
    assert "whole run: 600 s (10.0 min)" in out
    assert "WARNING" not in out
    assert (tmp_path / "logs" / "py311.log").read_text().startswith("$ pip\n")


def test_report_warns_past_the_budget_naming_the_slowest(tool, tmp_path, capsys):
    envs = {"py39": (300.0, 0), "wine311": (1800.0, 0), "wine313": (1700.0, 0), "lint": (30.0, 0)}
    result = _results(tmp_path, envs)
    tool.report(result, list(envs), tool.BUDGET_MINUTES * 60 + 1, str(tmp_path / "logs"))
    warning = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("WARNING")]
    assert len(warning) == 1
    assert "over the 45-minute budget" in warning[0]
    assert "wine311 1801 s, wine313 1701 s, py39 301 s" in warning[0]


def test_report_without_a_result_file_says_so(tool, tmp_path, capsys):
    tool.report(str(tmp_path / "missing.json"), ["py311"], 10.0, str(tmp_path / "logs"))
    assert "no tox result file" in capsys.readouterr().out
