#!/usr/bin/env bash
# The C core under AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer:
#  1. C drivers linked with the core directly, leak checking on: the port
#     under churn and threads (test_core_posix.c) and the record's state
#     machine walked table by table (test_record_states.c);
#  2. the Python Port/selector tests and the thread stress of
#     test_threads.py with the core built with ASan and the runtime
#     preloaded (CPython itself keeps memory to exit, so leak checking is
#     off there; memory errors still abort the run).
# Every build here checks every record transition (SN_CHECK_TRANSITIONS,
# sn_record.h): a transition from a state it does not start from aborts
# with the transition, the state and the line.
# Any sanitizer report fails the script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
core="$root/socknotify_loop/_core"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
checked="-DSN_CHECK_TRANSITIONS"
# The C drivers link a test build of the core (SN_TESTING), as the
# extension below is one.
flags="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -Wall -Wextra -Werror $checked -DSN_TESTING"

# Every C file of the core, found rather than listed (the Windows files
# compile to nothing here), as the extension links them.
core_sources=("$core"/*.c)
gcc $flags -I"$core" "$here/test_core_posix.c" "${core_sources[@]}" \
    -lpthread -o "$out/test_core_posix"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$out/test_core_posix"
gcc $flags -I"$core" "$here/test_record_states.c" "${core_sources[@]}" \
    -lpthread -o "$out/test_record_states"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$out/test_record_states"

# The same driver under ThreadSanitizer: close() racing waiters, posters
# and selects, and one port per thread in many threads at once (what one
# event loop per thread does on a free-threaded Python), must show no
# data race.
gcc -g -O1 -fno-omit-frame-pointer -fsanitize=thread -Wall -Wextra -Werror $checked -DSN_TESTING -I"$core" \
    "$here/test_core_posix.c" "${core_sources[@]}" -lpthread -o "$out/test_core_posix_tsan"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tsan.supp" "$out/test_core_posix_tsan"

# Python tests against an ASan build of the extension, built out of tree.
build="$out/pkg"
mkdir -p "$build"
cp -r "$root/socknotify_loop" "$build/"
rm -f "$build"/socknotify_loop/_socknotify*.so
# A test build (SOCKNOTIFY_TESTING=1: the core's test-only parts and
# declarations), as CI's Wine envs build theirs.
(cd "$build" && SOCKNOTIFY_TESTING=1 CFLAGS="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all $checked" \
    LDFLAGS="-fsanitize=address,undefined" \
    python -c "import sys; sys.path.insert(0, 'socknotify_loop'); import _build; _build.ffibuilder.compile(tmpdir='.', verbose=False)" >/dev/null)
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
# From inside the build folder: `python -m` puts the current directory
# first on sys.path, and it must be the ASan build, never the source tree.
ls "$build"/socknotify_loop/_socknotify*.so >/dev/null   # the ASan build exists
# ... and checks its record transitions (CFLAGS reached the compiler).
# (Not `nm | grep -q`: grep quitting early fails nm, and pipefail the test.)
if ! nm "$build"/socknotify_loop/_socknotify*.so | grep sn__transition_refused >/dev/null; then
    echo "the ASan build of the extension has no record transition checks" >&2
    exit 1
fi
cd "$build"
PYTHONPATH="$build" LD_PRELOAD="$libasan:$libubsan" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    python -m pytest -q -p no:cacheprovider --rootdir "$build" "$root/tests/test_port.py" \
    "$root/tests/test_selector.py" "$root/tests/test_faults.py" "$root/tests/test_reliability.py" \
    "$root/tests/test_epoll_oneshot.py" "$root/tests/test_threads.py" ${SANITIZE_EXTRA_TESTS:-}
echo "sanitizers: clean"
