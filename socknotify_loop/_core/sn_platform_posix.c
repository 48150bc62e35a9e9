/*
 * sn_platform_posix.c -- sn_platform.h on POSIX: pthread mutexes,
 * CLOCK_MONOTONIC, nanosleep, and fork detection with pthread_atfork.
 *
 * Why fork detection: a forked child shares the parent's epoll instance
 * and eventfd (the file descriptions, not copies of them). A child that
 * used an inherited port would steal the parent's notifications, write
 * the parent's eventfd, or wait forever on a copy of the parent's waiter
 * count. asyncio's loops are not usable across fork() either; the port
 * makes that explicit: in the child every call fails as on a closed port,
 * and close() only closes the child's copies of the descriptors.
 */
#ifndef _WIN32
#define _POSIX_C_SOURCE 200809L   /* clock_gettime, nanosleep under -std=c99 */
#include "sn_platform.h"

#include <time.h>

void sn_mutex_init(sn_mutex_t *m) { pthread_mutex_init(m, NULL); }
void sn_mutex_lock(sn_mutex_t *m) { pthread_mutex_lock(m); }
void sn_mutex_unlock(sn_mutex_t *m) { pthread_mutex_unlock(m); }
void sn_mutex_destroy(sn_mutex_t *m) { pthread_mutex_destroy(m); }

int64_t sn_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sn_sleep_ms(unsigned ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

static volatile long sn__forks;
static pthread_once_t sn__fork_once = PTHREAD_ONCE_INIT;

static void sn__in_child(void) {
    /* Only this thread exists in the child: a plain increment would do,
       the atomic keeps sanitizers quiet. */
    sn_atomic_inc(&sn__forks);
}

static void sn__install_fork_handler(void) {
    pthread_atfork(NULL, NULL, sn__in_child);
}

void sn_fork_watch(void) {
    pthread_once(&sn__fork_once, sn__install_fork_handler);
}

unsigned long sn_fork_generation(void) {
    return (unsigned long)sn_atomic_load(&sn__forks);
}

#endif /* !_WIN32 */

/* ISO C wants a declaration in every translation unit, also on Windows,
   where the #ifdef above leaves none (MSVC and -pedantic warn otherwise). */
typedef int sn_platform_posix_c_is_posix_only;
