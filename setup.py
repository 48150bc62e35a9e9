# Only what pyproject.toml cannot say: the cffi module, the limited-API
# wheel tag, and keeping the cffi builder out of the wheel.
import platform
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_without_builder(build_py):
    """build_py that leaves socknotify_loop/_build.py out of the wheel: it is
    the build recipe (cffi loads it from the source tree or the unpacked
    sdist), useless once the core is compiled."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("socknotify_loop", "_build")]


options = {}
# cffi compiles the core against CPython's limited API (_socknotify.abi3.so /
# _socknotify.pyd), so one wheel per platform serves CPython 3.9 and later:
# tag it cp39-abi3. PyPy has no limited API, and neither have free-threaded
# and debug CPython builds (cffi compiles the full API there): their wheels
# keep their own interpreter tags.
if (platform.python_implementation() == "CPython"
        and not sysconfig.get_config_var("Py_GIL_DISABLED")
        and not hasattr(sys, "gettotalrefcount")):
    options["bdist_wheel"] = {"py_limited_api": "cp39"}

setup(
    cffi_modules=["socknotify_loop/_build.py:ffibuilder"],
    cmdclass={"build_py": build_py_without_builder},
    options=options,
)
