/*
 * epoll_faults.c -- an LD_PRELOAD shim that makes epoll fail on demand, for
 * the tests of what the port does when the kernel refuses (tests/
 * test_reliability.py). The kernel will not run out of watches
 * (fs.epoll.max_user_watches) or memory when a test asks, so this does it.
 *
 * Control is by files in the folder named by SOCKNOTIFY_FAULTS, read at
 * every call so that a test can arm a fault after its set-up:
 *   add      epoll_ctl(EPOLL_CTL_ADD) fails with the errno written in it
 *   create   epoll_create1() fails with the errno written in it
 *   stale    the first n calls of epoll_wait() with a timeout (n written in
 *            it, counted from the process start) each return at once one
 *            event under a key no registration has: what a wait dequeues
 *            for a registration removed after the kernel queued it
 * A missing file (or variable) means the real call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>

/* The errno written in the control file `name`, or 0 when it is absent. */
static int fault(const char *name) {
    const char *dir = getenv("SOCKNOTIFY_FAULTS");
    char path[PATH_MAX];
    FILE *f;
    int err = 0;
    if (dir == NULL)
        return 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%d", &err) != 1)
        err = 0;
    fclose(f);
    return err;
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event) {
    static int (*real)(int, int, int, struct epoll_event *);
    int err;
    if (op == EPOLL_CTL_ADD && (err = fault("add")) != 0) {
        errno = err;
        return -1;
    }
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "epoll_ctl");
    return real(epfd, op, fd, event);
}

int epoll_create1(int flags) {
    static int (*real)(int);
    int err;
    if ((err = fault("create")) != 0) {
        errno = err;
        return -1;
    }
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "epoll_create1");
    return real(flags);
}

int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout) {
    static int (*real)(int, struct epoll_event *, int, int);
    static int served;
    if (timeout != 0 && maxevents > 0 && served < fault("stale")) {
        served++;
        events[0].events = EPOLLIN;
        /* Slot 0x7FFFFFFF, generation 0xFFFF: never a live record's key. */
        events[0].data.u64 = UINT64_C(0xFFFF00007FFFFFFF);
        return 1;
    }
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "epoll_wait");
    return real(epfd, events, maxevents, timeout);
}
