"""The Windows build and test runs under Wine: ``python -m tools.wine --help``.

One module per job: ``apt`` (Wine and mingw-w64), ``python`` (the Windows
CPython), ``runtime`` (running it under Wine), ``compile`` (the core with
mingw-w64), ``project`` and ``wheel`` (the win_amd64 wheel), ``run`` (pytest)
and ``bench`` (benchmarks/run.py's native mode). Every module imports its
siblings relatively, so the package works whatever name it is imported
under (benchmarks/wine_side.py loads it by path).
"""
