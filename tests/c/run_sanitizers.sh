#!/usr/bin/env bash
# The C core under AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer:
#  1. a C driver linked with the core directly, leak checking on;
#  2. the Python Port/selector tests with the core built with ASan and the
#     runtime preloaded (CPython itself keeps memory to exit, so leak
#     checking is off there; memory errors still abort the run).
# Any sanitizer report fails the script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
core="$root/socknotify_loop/_core"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -Wall -Wextra -Werror"

# Every C file of the core, found rather than listed (the Windows files
# compile to nothing here), as the extension links them.
core_sources=("$core"/*.c)
gcc $flags -I"$core" "$here/test_core_posix.c" "${core_sources[@]}" \
    -lpthread -o "$out/test_core_posix"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$out/test_core_posix"

# The same driver under ThreadSanitizer: close() racing waiters, posters
# and selects must show no data race.
gcc -g -O1 -fno-omit-frame-pointer -fsanitize=thread -Wall -Wextra -Werror -I"$core" \
    "$here/test_core_posix.c" "${core_sources[@]}" -lpthread -o "$out/test_core_posix_tsan"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tsan.supp" "$out/test_core_posix_tsan"

# Python tests against an ASan build of the extension, built out of tree.
build="$out/pkg"
mkdir -p "$build"
cp -r "$root/socknotify_loop" "$build/"
rm -f "$build"/socknotify_loop/_socknotify*.so
(cd "$build" && CFLAGS="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all" \
    LDFLAGS="-fsanitize=address,undefined" \
    python -c "import sys; sys.path.insert(0, 'socknotify_loop'); import _build; _build.ffibuilder.compile(tmpdir='.', verbose=False)" >/dev/null)
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
# From inside the build folder: `python -m` puts the current directory
# first on sys.path, and it must be the ASan build, never the source tree.
ls "$build"/socknotify_loop/_socknotify*.so >/dev/null   # the ASan build exists
cd "$build"
PYTHONPATH="$build" LD_PRELOAD="$libasan:$libubsan" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    python -m pytest -q -p no:cacheprovider --rootdir "$build" "$root/tests/test_port.py" \
    "$root/tests/test_selector.py" "$root/tests/test_faults.py" "$root/tests/test_reliability.py" \
    "$root/tests/test_epoll_oneshot.py" ${SANITIZE_EXTRA_TESTS:-}
echo "sanitizers: clean"
