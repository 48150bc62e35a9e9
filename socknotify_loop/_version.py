"""The package version, in one place.

setuptools reads it statically (``[tool.setuptools.dynamic]`` in
pyproject.toml) without importing the package, whose compiled core does not
exist yet at build time; ``tools/wine/`` reads it the same way.
"""
__version__ = "0.2.0"
