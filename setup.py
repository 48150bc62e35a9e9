# Only here for cffi_modules: everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["socknotify_loop/_build.py:ffibuilder"])
