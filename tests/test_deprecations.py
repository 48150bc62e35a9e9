"""What the README, docs/switching.md, docs/launcher.md and the pytest
recipes recommend works with DeprecationWarning as an error.

Python 3.14 deprecates asyncio's event loop policies (3.16 removes them):
every recommended way of running on our loop must then go through
``loop_factory`` or the launcher, and raise no DeprecationWarning of ours or
asyncio's. Each recipe runs in a child Python started with
``-W error::DeprecationWarning`` (and the same in PYTHONWARNINGS, for the
children it starts), on every version the project tests; the policy API
(``EventLoopPolicy``, ``install()``), kept for older code, warns there as
asyncio's policy functions do and still works.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from servers import child_env, need
from test_integrations import HOOK_CONFTEST, write_pytest_asyncio_recipe

import socknotify_loop

OURS = f"{socknotify_loop.Loop.__module__}.{socknotify_loop.Loop.__qualname__}"
STRICT = ["-W", "error::DeprecationWarning"]

LOOP_NAME = textwrap.dedent("""\
    import asyncio

    async def main():
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)
        return f"{type(loop).__module__}.{type(loop).__qualname__}"
    """)


def strict_env() -> dict:
    env = child_env()
    env["PYTHONWARNINGS"] = "error::DeprecationWarning"
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run_strict(args, cwd) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *STRICT, *args], cwd=str(cwd), env=strict_env(),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


RECIPES = {
    "run": ("socknotify_loop.run(main())", (3, 9)),
    "run_debug": ("socknotify_loop.run(main(), debug=True)", (3, 9)),
    "asyncio_run_loop_factory": (
        "asyncio.run(main(), loop_factory=socknotify_loop.new_event_loop)", (3, 12)),
    "runner_loop_factory": (
        "asyncio.Runner(loop_factory=socknotify_loop.new_event_loop).__enter__().run(main())",
        (3, 11)),
    "new_event_loop": (
        "(lambda loop: (loop.run_until_complete(main()), loop.close())[0])("
        "socknotify_loop.new_event_loop())", (3, 9)),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_runs_with_deprecations_as_errors(tmp_path, name):
    expression, since = RECIPES[name]
    if sys.version_info < since:
        pytest.skip(f"needs Python {since[0]}.{since[1]}+")
    script = tmp_path / "recipe.py"
    script.write_text(LOOP_NAME + "import socknotify_loop\n"
                      f"print('loop', {expression})\n")
    assert run_strict([str(script)], tmp_path).stdout.split() == ["loop", OURS]


def _readme_use_scripts():
    """The README's "Use" section as the programs a reader pastes: its first
    block, then each later block (an alternative) after the first block's
    set-up (everything before its call), with main()'s body printing the
    running loop's class. Yields (name, script, the Python version the block asks for)."""
    import os
    import re
    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "README.md")
    if not os.path.exists(readme):
        pytest.skip("README.md is not shipped here")
    with open(readme, encoding="utf-8") as f:
        section = f.read().split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    ran = ("    loop = type(asyncio.get_running_loop())\n"
           "    print('main ran on', f'{loop.__module__}.{loop.__qualname__}')")
    blocks = [block.replace("    ...", ran)
              for block in re.findall(r"```python\n(.*?)```", section, re.S)]
    setup = blocks[0].split("\nsocknotify_loop.run(", 1)[0] + "\n"
    for index, block in enumerate(blocks):
        script = block if index == 0 else setup + block
        since = re.search(r"# 3\.(\d+)\+", block)
        yield f"block {index + 1}", script, (3, int(since.group(1)) if since else 9)


def test_readme_use_blocks_each_run_main_once(tmp_path):
    """Pasted as it stands, each block of the README's "Use" section runs
    main() once (alternatives are separate blocks, not consecutive calls),
    on our loop, with DeprecationWarning as an error."""
    scripts = list(_readme_use_scripts())
    assert len(scripts) >= 2, "the Use section lost its alternatives"
    for name, script, since in scripts:
        if sys.version_info < since:
            continue
        path = tmp_path / "use.py"
        path.write_text(script)
        out = run_strict([str(path)], tmp_path).stdout.split("\n")
        assert [line for line in out if line] == [f"main ran on {OURS}"], (name, script, out)


def test_launcher_with_deprecations_as_errors(tmp_path):
    """``python -m socknotify_loop app.py`` and ``-m module``: asyncio.run,
    new_event_loop and (3.11+) Runner without a factory all get our loop."""
    body = LOOP_NAME + textwrap.dedent("""\
        import sys
        print("run", asyncio.run(main()))
        loop = asyncio.new_event_loop()
        print("new_event_loop", loop.run_until_complete(main()))
        loop.close()
        if sys.version_info >= (3, 11):
            with asyncio.Runner() as runner:
                print("Runner", runner.run(main()))
        """)
    (tmp_path / "app.py").write_text(body)
    expected = 3 if sys.version_info >= (3, 11) else 2
    for args in (["app.py"], ["-m", "app"]):
        out = run_strict(["-m", "socknotify_loop", *args], tmp_path).stdout.split("\n")
        names = [line.split()[1] for line in out if line]
        assert names == [OURS] * expected, out


def test_pytest_asyncio_hook_with_deprecations_as_errors(tmp_path):
    """docs/switching.md's pytest-asyncio recipe (1.4+), the test run itself
    with DeprecationWarning as an error."""
    from importlib.metadata import version
    need("pytest_asyncio", "pytest-asyncio")
    found = tuple(int(part) for part in version("pytest-asyncio").split(".")[:2])
    if found < (1, 4):
        pytest.skip(f"pytest-asyncio {found} has no pytest_asyncio_loop_factories hook")
    write_pytest_asyncio_recipe(tmp_path, HOOK_CONFTEST)
    (tmp_path / "test_recipe.py").write_text(textwrap.dedent(f"""\
        import asyncio
        import pytest

        @pytest.mark.asyncio
        async def test_loop_is_ours():
            loop = asyncio.get_running_loop()
            assert f"{{type(loop).__module__}}.{{type(loop).__qualname__}}" == {OURS!r}
        """))
    # The recipe sets the scope option (its pyproject.toml): unset,
    # pytest-asyncio itself warns (a PytestDeprecationWarning, a
    # DeprecationWarning subclass) about it.
    result = run_strict(["-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "-W", "error", str(tmp_path)], tmp_path)
    assert "1 passed" in result.stdout, result.stdout


@pytest.mark.skipif(sys.version_info < (3, 14), reason="policies are deprecated from 3.14")
def test_policy_api_warns_and_still_works_on_314_and_later():
    """Kept for older code: reaching EventLoopPolicy or install() warns, as
    asyncio's own policy functions do, and they still make our loop."""
    import asyncio
    import warnings

    with pytest.warns(DeprecationWarning, match="install"):
        install = socknotify_loop.install
    with pytest.warns(DeprecationWarning, match="EventLoopPolicy"):
        policy_class = socknotify_loop.EventLoopPolicy
    with pytest.warns(DeprecationWarning):
        asyncio.get_event_loop_policy()       # asyncio warns for its own, too
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            install()                          # the warning came with the name
        loop = policy_class().new_event_loop()
        assert type(loop) is socknotify_loop.Loop
        loop.close()
        async def name():
            return type(asyncio.get_running_loop())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert asyncio.run(name()) is socknotify_loop.Loop
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(None)
