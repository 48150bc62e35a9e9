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
# IOCTL_AFD_POLL polyfill; the psn backend is compile-checked only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
core="$root/socknotify_loop/_core"
cc=${MINGW_CC:-x86_64-w64-mingw32-gcc}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${OUT_DIR:-}" ] || trap 'rm -rf "$out"' EXIT

# No -DNDEBUG: the asserts on the AFD polyfill's state transitions stay on
# in this build (test_afd_polyfill.c refuses to compile otherwise).
flags="-Wall -Wextra -Werror -O2"
# Every C file of the core, found rather than listed (a file added to the
# core is checked too), warnings as errors: the CI's Windows compile check.
# The test program links all of them, as the extension does; the files for
# other systems compile to nothing.
rm -f "$out"/*.o     # an OUT_DIR reused after a file left the core
for src in "$core"/*.c; do
    f=$(basename "$src")
    "$cc" $flags -c "$src" -o "$out/${f%.c}.o"
done
"$cc" $flags -I"$core" "$here/test_afd_polyfill.c" "$out"/*.o \
    -o "$out/test_afd_polyfill.exe" -lws2_32 -lntdll
echo "built $out/test_afd_polyfill.exe"
# The core's internals through their seams: the base-socket lookup under a
# played layered provider, and the allocations per wait, counted by
# wrapping the C allocator at link time (the core objects stay as built).
"$cc" $flags -I"$core" "$here/test_win_internals.c" "$out"/*.o \
    -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc \
    -o "$out/test_win_internals.exe" -lws2_32 -lntdll
echo "built $out/test_win_internals.exe"
[ -z "${NO_RUN:-}" ] || exit 0

export WINEPREFIX=${WINEPREFIX:-$root/.wine-cache/prefix-ctest}
export WINEDEBUG=${WINEDEBUG:--all}
wine=$(command -v wine64 || command -v wine)
# Windows programs under Wine want a stdin; the first run creates the prefix.
"$wine" "$out/test_afd_polyfill.exe" </dev/null
"$wine" "$out/test_win_internals.exe" </dev/null
