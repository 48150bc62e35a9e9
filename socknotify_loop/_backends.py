"""Backend names as people type them (``SOCKNOTIFY_BACKEND``, ``--info``).

No import of the compiled core here: the launcher parses the name before
anything else is loaded, and :mod:`socknotify_loop.port` can call the same
function for its ``backend=`` argument and the environment variable.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

__all__ = ["BACKEND_NAMES", "ENVIRONMENT_VARIABLE", "parse_backend_name",
           "backend_from_environment"]

#: Every backend the C core knows. (Which one is preferred where several
#: are available is decided in one place, the C core's backend table.)
#: ``strict`` is the strict model of ProcessSocketNotifications for tests
#: (Windows only, never chosen unless named).
BACKEND_NAMES: Tuple[str, ...] = ("psn", "afd", "epoll", "strict")

#: The environment variable that forces a backend.
ENVIRONMENT_VARIABLE = "SOCKNOTIFY_BACKEND"


def parse_backend_name(text: str) -> str:
    """The canonical backend name for ``text``: case-insensitive, with
    surrounding whitespace ignored (``" EPOLL "`` -> ``"epoll"``).

    Raises :class:`ValueError` naming the choices for anything else,
    including an empty name, and :class:`TypeError` for a non-string.
    """
    if not isinstance(text, str):
        raise TypeError(f"a backend name must be a str, not {type(text).__name__}")
    name = text.strip().lower()
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown socknotify_loop backend {text!r} "
                         f"(choose from {', '.join(BACKEND_NAMES)})")
    return name


def backend_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The backend ``SOCKNOTIFY_BACKEND`` forces, canonical, or None when
    the variable is unset or blank (the best available backend is used).

    Raises :class:`ValueError` for a name that is not a backend; the message
    says where the name came from.
    """
    value = (os.environ if environ is None else environ).get(ENVIRONMENT_VARIABLE, "")
    if not value.strip():
        return None
    try:
        return parse_backend_name(value)
    except ValueError as exc:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={value!r}: {exc}") from None
