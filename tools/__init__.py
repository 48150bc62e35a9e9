"""The project's own tools, run from the repository root.

A regular package (not a namespace one) so that ``python -m tools.wine``
finds this folder first, whatever ``tools`` an installed distribution may
also provide.
"""
