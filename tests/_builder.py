"""The package's build-time module (socknotify_loop/_build.py), loaded by path."""
import importlib.util
import os
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDER = os.path.join(ROOT, "socknotify_loop", "_build.py")


def load_builder() -> ModuleType:
    """A fresh copy of ``_build.py``. By path: the builder is a build-time
    file the wheel leaves out, and importing it through the package would
    load the compiled core."""
    spec = importlib.util.spec_from_file_location("socknotify_loop_build", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
