#!/usr/bin/env bash
# Build tests/c/test_afd_polyfill.c with mingw-w64 and run it under Wine (or
# print the command for a real Windows machine). Exits non-zero if the build
# warns or fails, or if any check fails.
#
#   tests/c/run_wine.sh            # build + run under Wine
#   WINEPREFIX=/path tests/c/run_wine.sh
#   NO_RUN=1 tests/c/run_wine.sh   # build (and warning check) only
#
# Wine 8 has no ProcessSocketNotifications, so this exercises the
# IOCTL_AFD_POLL polyfill; the psn backend is compile-checked only. On
# Windows itself (Git Bash or MSYS2, with a mingw-w64 gcc on PATH: the
# c-tests job of .github/workflows/windows.yml) the same script builds with
# that gcc and runs the programs natively, psn included where the OS has it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
core="$root/socknotify_loop/_core"
case "$(uname -s)" in
    MINGW*|MSYS*|CYGWIN*) native=1; default_cc=gcc ;;
    *) native=; default_cc=x86_64-w64-mingw32-gcc ;;
esac
cc=${MINGW_CC:-$default_cc}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${OUT_DIR:-}" ] || trap 'rm -rf "$out"' EXIT

# No -DNDEBUG: the asserts on the AFD polyfill's state transitions stay on
# in this build (test_afd_polyfill.c refuses to compile otherwise). A test
# build of the core (-DSN_TESTING: the strict model, which the programs
# drive), as socknotify_loop/_build.py makes for SOCKNOTIFY_TESTING=1.
flags="-Wall -Wextra -Werror -O2 -DSN_TESTING"
# Every C file of the core, found rather than listed (a file added to the
# core is checked too), warnings as errors: the CI's Windows compile check.
# The test program links all of them, as the extension does; the files for
# other systems compile to nothing.
rm -f "$out"/*.o     # an OUT_DIR reused after a file left the core
for src in "$core"/*.c; do
    f=$(basename "$src")
    "$cc" $flags -c "$src" -o "$out/${f%.c}.o"
done
# Portability of the Windows C: ISO C11 with no GNU extension and no VLA
# (the dialect MSVC compiles with /std:c11, as socknotify_loop/_build.py
# asks for it), every file, no warning.
# Both kinds of build: production (the wheel's) and test (SN_TESTING).
for src in "$core"/*.c; do
    "$cc" -std=c11 -pedantic -Wall -Wextra -Wvla -Werror -fsyntax-only "$src"
    "$cc" -std=c11 -pedantic -Wall -Wextra -Wvla -Werror -fsyntax-only -DSN_TESTING "$src"
done
# A 32-bit Windows build must stop with the core's own message: its keys
# are 64-bit and PVOID/ULONG_PTR are 32-bit there (sn_win.h).
if "$cc" -m32 -fsyntax-only "$core/sn_iocp.c" 2>"$out/win32.log"; then
    echo "a 32-bit Windows build of the core compiled: sn_win.h must refuse it" >&2
    exit 1
fi
if ! grep -q "supports 64-bit Windows only" "$out/win32.log"; then
    cat "$out/win32.log" >&2
    echo "a 32-bit Windows build failed without the core's own #error" >&2
    exit 1
fi
echo "ISO C11 (-pedantic) on every core file, and the 32-bit refusal: ok"
"$cc" $flags -I"$core" "$here/test_afd_polyfill.c" "$out"/*.o \
    -o "$out/test_afd_polyfill.exe" -lws2_32 -lntdll
echo "built $out/test_afd_polyfill.exe"
# The core's internals through their seams: the base-socket lookup under a
# played layered provider, and the allocations per wait, counted by
# wrapping the C allocator at link time (the core objects stay as built).
"$cc" $flags -I"$core" "$here/test_win_internals.c" "$out"/*.o \
    -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free \
    -o "$out/test_win_internals.exe" -lws2_32 -lntdll
echo "built $out/test_win_internals.exe"
# The port code on the strict model, driven call by call.
"$cc" $flags -I"$core" "$here/test_win_port.c" "$out"/*.o \
    -o "$out/test_win_port.exe" -lws2_32 -lntdll
echo "built $out/test_win_port.exe"
[ -z "${NO_RUN:-}" ] || exit 0

if [ -n "$native" ]; then
    "$out/test_afd_polyfill.exe" </dev/null
    "$out/test_win_internals.exe" </dev/null
    "$out/test_win_port.exe" </dev/null
    exit 0
fi
export WINEPREFIX=${WINEPREFIX:-$root/.wine-cache/prefix-ctest}
# Wine makes the prefix on first use, but not the folders above it.
mkdir -p "$(dirname "$WINEPREFIX")"
export WINEDEBUG=${WINEDEBUG:--all}
wine=$(command -v wine64 || command -v wine)
server=$(command -v wineserver || echo /usr/lib/wine/wineserver64)
# The prefix's wineserver and the services it starts inherit this script's
# stdout and hold it open after the programs end: end them on the way out,
# so whoever reads this script's output sees it end.
trap '"$server" -k 2>/dev/null; "$server" -w 2>/dev/null' EXIT
# Windows programs under Wine want a stdin; the first run creates the prefix.
# Each program takes seconds; the bound turns a hang into a named failure.
timeout 300 "$wine" "$out/test_afd_polyfill.exe" </dev/null
timeout 300 "$wine" "$out/test_win_internals.exe" </dev/null
timeout 300 "$wine" "$out/test_win_port.exe" </dev/null
