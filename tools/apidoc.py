#!/usr/bin/env python3
"""Write docs/api.md, the API reference, from the public names' docstrings.

    python tools/apidoc.py            # rewrite docs/api.md
    python tools/apidoc.py --check    # exit 1 if docs/api.md is stale

The public surface is ``socknotify_loop.__all__``; classes list their
public methods and properties. Signatures come from :mod:`inspect`, so the
page is generated on Linux with the Python that CI's check uses (3.11).
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "api.md")

HEADER = """# API reference

Generated from the docstrings by `python tools/apidoc.py`; do not edit by
hand. The guide to choosing and installing the loop is in the README and
`docs/switching.md`; the design in `docs/design.md`.
"""


def _doc(obj) -> str:
    return inspect.cleandoc(inspect.getdoc(obj) or "(no docstring)")


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def _members(cls) -> list:
    out = []
    for name, value in sorted(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, property):
            out.append((name, "property", "", _doc(value)))
        elif inspect.isfunction(value):
            if name == "__init__":
                continue
            out.append((name, "method", _signature(value), _doc(value)))
    return out


def render() -> str:
    import socknotify_loop
    parts = [HEADER]
    constants = []
    from socknotify_loop import _factory
    # The policy API is served lazily (and deprecated on 3.14+), so it is
    # not in __all__; it is public on 3.9-3.13 and documented here.
    policy_api = {"EventLoopPolicy": _factory.event_loop_policy_class(),
                  "install": _factory.install}
    for name in [*socknotify_loop.__all__, *policy_api]:
        obj = policy_api[name] if name in policy_api else getattr(socknotify_loop, name)
        if inspect.isclass(obj):
            parts.append(f"## class `{name}{_signature(obj)}`\n\n{_doc(obj)}\n")
            for member, kind, signature, doc in _members(obj):
                title = f"`{name}.{member}{signature}`" if kind == "method" \
                    else f"`{name}.{member}` (property)"
                parts.append(f"### {title}\n\n{doc}\n")
        elif callable(obj):
            parts.append(f"## `{name}{_signature(obj)}`\n\n{_doc(obj)}\n")
        else:
            constants.append(f"| `{name}` | `{obj!r}` |")
    if constants:
        parts.append("## Constants\n\nThe values of the Winsock `SOCK_NOTIFY_*` constants "
                     "they stand for.\n\n| name | value |\n| --- | --- |\n"
                     + "\n".join(constants) + "\n")
    return "\n".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    options = parser.parse_args(argv)
    text = render()
    if options.check:
        with open(PAGE, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{PAGE} is stale: run python tools/apidoc.py", file=sys.stderr)
                return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
