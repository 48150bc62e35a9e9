"""``python -m socknotify_loop``: run an asyncio program on the loop.

See :mod:`socknotify_loop.launcher` for the options.
"""
import sys

from socknotify_loop.launcher import main

if __name__ == "__main__":
    sys.exit(main())
