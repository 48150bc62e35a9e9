/*
 * check.h -- the checks every C test driver under tests/c makes, and how
 * it reports them: a failed check prints its file, line and expression
 * (CHECK_EQ also both values) to stderr and counts in `failures`; the
 * run goes on, so one run shows every failed check. RUN(test) prints the
 * test's name, padded to RUN_WIDTH columns (a driver may set its own
 * before including this), then "ok" or "FAILED". Each driver prints its
 * own summary from `checks` and `failures` and exits non-zero when any
 * check failed.
 *
 * Included by the Linux drivers (test_core_posix.c, test_record_states.c)
 * and the Windows ones (test_afd_polyfill.c, test_win_internals.c,
 * test_win_port.c); one program is one translation unit, so the counters
 * are the driver's own. Found next to the driver (#include "check.h"),
 * whatever -I the build scripts pass.
 */
#ifndef SN_TEST_CHECK_H
#define SN_TEST_CHECK_H

#include <stdio.h>

static int failures;   /* checks that failed */
static int checks;     /* checks made */

/* Checks run in several threads at once (the drivers' thread tests), so
   the counters move atomically (GCC's builtins: every driver is built
   with gcc or mingw-w64's gcc). They are read once those threads have
   been joined. */
#define CHECK_COUNT(counter) ((void)__atomic_fetch_add(&(counter), 1, __ATOMIC_RELAXED))

#define CHECK(cond) do { \
    CHECK_COUNT(checks); \
    if (!(cond)) { \
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        CHECK_COUNT(failures); \
    } \
} while (0)

#define CHECK_EQ(a, b) do { \
    unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
    CHECK_COUNT(checks); \
    if (a_ != b_) { \
        fprintf(stderr, "%s:%d: CHECK failed: %s == %s (0x%llx != 0x%llx)\n", \
                __FILE__, __LINE__, #a, #b, a_, b_); \
        CHECK_COUNT(failures); \
    } \
} while (0)

#ifndef RUN_WIDTH
#  define RUN_WIDTH 36
#endif

#define RUN(test) do { \
    int before = failures; \
    printf("%-*s", RUN_WIDTH, #test); fflush(stdout); \
    test(); \
    printf("%s\n", failures == before ? "ok" : "FAILED"); fflush(stdout); \
} while (0)

#endif /* SN_TEST_CHECK_H */
