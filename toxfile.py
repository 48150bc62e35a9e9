"""tox's inline plugin: the runner of the py314, py315 and py314t environments.

Those environments test CPython 3.14 and 3.15 (and the free-threaded
3.14t) inside a Debian sid chroot (tools/chroot.py); tox itself, and the
virtualenv it makes for them, run on the host's Python, which has none of
them. tox refuses an environment whose name (py314) names another Python
than its ``basepython``; this runner is tox's virtualenv runner without
that check, and only the environments that name it (``runner =
host-python``) use it.
"""
from __future__ import annotations

from typing import Any

from tox.plugin import impl
from tox.tox_env.python.virtual_env.runner import VirtualEnvRunner


class HostPythonRunner(VirtualEnvRunner):
    """A virtualenv on ``basepython``, whatever Python the env's name gives."""

    @staticmethod
    def id() -> str:
        return "host-python"

    @classmethod
    def _validate_base_python(cls, env_name: str, base_pythons: list[str],
                              *args: Any, **kwargs: Any) -> list[str]:
        return base_pythons


@impl
def tox_register_tox_env(register: Any) -> None:
    register.add_run_env(HostPythonRunner)
