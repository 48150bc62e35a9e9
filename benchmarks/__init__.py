"""socknotify_loop's benchmarks: our loop against its peers, in interleaved
rounds, with exact counters beside the timings (see README.md here).

    python -m benchmarks.run --help      # from the project root
    python benchmarks/run.py --help      # the same, run by path

Standard library only at import time: the workers import this package in
the Windows CPython under Wine too, where only the loops are installed.
"""
