"""Fixtures shared by the test modules (tests/conformance has its own), and
the line every run ends with, its skips counted by why (_skips.py); the
conformance runs get it too, this file being loaded for everything under
tests/."""
from __future__ import annotations

from typing import Generator

import _skips
import pytest
import servers

from socknotify_loop import port as port_module

# Every backend is a parameter; one this machine lacks is skipped with the
# core's reason (e.g. psn under Wine and on Windows 10: "ProcessSocket-
# Notifications not exported by ws2_32"), so the report shows what did not run.
ALL_BACKENDS = [
    pytest.param(name, marks=pytest.mark.skipif(
        not ok, reason=f"backend {name!r} unavailable: {why}"))
    for name, (ok, why) in port_module.available_backends().items()
]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    # pyproject.toml sets pytest-asyncio's option; without that plugin (it is
    # in the `integrations` extra, not `test`) pytest would warn that the
    # option is unknown. Declared here only then, so the plugin's own
    # declaration stands whenever it is installed.
    if not pluginmanager.hasplugin("asyncio"):
        parser.addini("asyncio_default_fixture_loop_scope",
                      "pytest-asyncio's option (pyproject.toml); unused without it")


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend's name in turn (the unavailable ones skipped)."""
    return request.param


# Session fixtures: a PostgreSQL and a redis-server started for this run, or
# the addresses tools/wine (or the developer) put in the environment.
pg_dsn = servers.server_fixture(servers.PG_DSN_VAR, servers.postgres_server, "PostgreSQL")
redis_url = servers.server_fixture(servers.REDIS_URL_VAR, servers.redis_server, "Redis")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(
        terminalreporter: pytest.TerminalReporter) -> Generator[None, None, None]:
    """After pytest's own summaries (`-rs` lists each skip) and right before
    its last line ("315 passed, 240 skipped in ..."), one line saying why the
    tests were skipped, by kind: `skipped 240: 180 Windows only, ...`."""
    yield
    reports = [report for report in terminalreporter.stats.get("skipped", [])
               if getattr(report, "count_towards_summary", True)]
    line = _skips.summary_line(_skips.skip_reason(report.longrepr) for report in reports)
    if line:
        terminalreporter.write_line(line)
