/*
 * sn_epoll.c -- the notification-port contract on Linux epoll.
 *
 * The OS model. An epoll instance holds "interest items" keyed by (file
 * description, fd number); epoll_ctl changes one item per system call and
 * epoll_wait dequeues ready items. EPOLLONESHOT disarms an item after one
 * report until the next EPOLL_CTL_MOD, which is exactly SOCK_NOTIFY's
 * LEVEL|ONESHOT; without it an item is persistent, and EPOLLET makes it
 * edge-triggered. So the mapping is direct:
 *     OP_ENABLE   EPOLL_CTL_ADD for an item the port knows is new,
 *                 EPOLL_CTL_MOD for one the kernel holds (each falls back
 *                 to the other where the kernel knows better)
 *     OP_DISABLE  EPOLL_CTL_DEL (see below)
 *     OP_REMOVE   EPOLL_CTL_DEL, then a REMOVE event of our own
 *     post()      a queue of ours plus an eventfd that wakes the wait
 *
 * The hazards, and so why the code is the way it is:
 *   - epoll cannot apply registrations and wait in one transition; Linux
 *     pays one epoll_ctl per change. The contract (apply, then wait) is kept;
 *     the saving that batching buys on Windows is not available here.
 *   - EPOLLERR and EPOLLHUP are reported whatever the interest mask says,
 *     even a mask of 0, so "disabled" cannot be a MOD to an empty mask: a
 *     disabled registration is deleted from epoll, and the next ENABLE adds
 *     it back (MOD fails with ENOENT, then ADD).
 *   - The kernel removes an item by itself when the last fd referring to the
 *     file description is closed, queued readiness included. A closed and
 *     reused fd number is therefore new to epoll: MOD says ENOENT, we ADD.
 *     But while a dup() of the fd lives (in this process or a forked
 *     child), the item outlives the close and can no longer be reached by
 *     number: an orphan. A persistent orphan would fire at every wait,
 *     for ever, and only a new epoll instance gets rid of it. So the
 *     selector's registrations stay EPOLLONESHOT in the kernel, and each
 *     re-arm is an EPOLL_CTL_MOD: an orphan then fires at most once, is
 *     dropped by the port as stale, and stays disarmed. (Keeping the items
 *     persistent and the one-shot rule in the port saved that MOD; it also
 *     cost a rebuild of the interest set per orphan, which needs a spare
 *     descriptor and a spare watch per item, and replaced the file behind
 *     the port's handle. docs/design.md has the measurements.) A caller of
 *     the Port API that asks for a persistent item must remove it before
 *     closing its descriptor, as epoll(7) asks of everyone.
 *   - A new registration is one EPOLL_CTL_ADD: the port tells a new item
 *     (SN_TRIGGER_ADD) from one the kernel holds (SN_TRIGGER_MODIFY_ONLY),
 *     so neither costs a failed call first. ADD meets EEXIST when the
 *     kernel still holds an item the port forgot (a registration re-keyed
 *     under the same descriptor): then it is modified.
 *   - epoll says EPOLLRDHUP when the peer shut its sending side down and
 *     EPOLLHUP when both directions are gone. The first is a hang-up of the
 *     read side only (a read meets EOF; a write may still block on a full
 *     buffer); the second makes both reads and writes return at once. So
 *     EPOLLRDHUP is HANGUP, and EPOLLHUP is HANGUP with IN and OUT: the
 *     selector masks then come out exactly as selectors.EpollSelector's.
 *   - REMOVE and posted packets must come out of the same wait as kernel
 *     events. They wait in a queue; an eventfd registered with a reserved
 *     key is readable while the queue is not empty, so any thread blocked
 *     in epoll_wait wakes. A thread woken with the queue empty (a sibling
 *     took it, or a forked child wrote the shared eventfd) drains the
 *     eventfd, so nobody spins on it. Once the port is closing the eventfd
 *     is never drained: being level-triggered it wakes every waiter.
 *
 * Sources read: epoll(7), epoll_ctl(2) (ERR/HUP always reported, ONESHOT
 * semantics), eventfd(2); the Winsock socket-state-notifications article for
 * the contract; trio's _io_epoll.py and CPython's selectors.EpollSelector for
 * how they map EPOLLHUP/EPOLLERR to "readable and writable".
 */
#ifdef __linux__

#define _GNU_SOURCE
#include "sn_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct epoll_port {
    int epfd;
    int wakefd;
    sn_mutex_t queue_lock;      /* guards the queue */
    sn_kevent_t *queue;         /* ring buffer of REMOVE and posted events */
    uint32_t queue_head;
    uint32_t queue_len;
    uint32_t queue_cap;         /* power of two, or 0 */
} epoll_port_t;

static void epoll__wake(sn_port_t *port, epoll_port_t *ep) {
    uint64_t one = 1;
    SN_COUNT(port, SN_COUNT_WAKES);
    if (write(ep->wakefd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is saturated, so it is readable already. */
    }
}

static int epoll__queue_push(sn_port_t *port, uint64_t key, uint32_t events,
                             uint32_t posted) {
    epoll_port_t *ep = port->impl;
    sn_kevent_t *cell;
    int err = 0;

    sn_mutex_lock(&ep->queue_lock);
    if (ep->queue_len == ep->queue_cap) {
        uint32_t new_cap = ep->queue_cap ? ep->queue_cap * 2 : 16;
        sn_kevent_t *bigger = malloc((size_t)new_cap * sizeof *bigger);
        uint32_t i;
        if (bigger == NULL) {
            err = ENOMEM;
            goto out;
        }
        for (i = 0; i < ep->queue_len; i++)
            bigger[i] = ep->queue[(ep->queue_head + i) & (ep->queue_cap - 1)];
        free(ep->queue);
        ep->queue = bigger;
        ep->queue_head = 0;
        ep->queue_cap = new_cap;
    }
    cell = &ep->queue[(ep->queue_head + ep->queue_len) & (ep->queue_cap - 1)];
    cell->key = key;
    cell->events = events;
    cell->posted = posted;
    __atomic_store_n(&ep->queue_len, ep->queue_len + 1, __ATOMIC_RELEASE);
    if (ep->queue_len == 1)
        epoll__wake(port, ep);   /* just became non-empty: wake a waiter */
out:
    sn_mutex_unlock(&ep->queue_lock);
    return err;
}

/* Take up to max queued events. `woken`: the eventfd fired for this
   caller, so if the queue is (now) empty the eventfd is drained -- unless
   the port is closing, when it must stay readable for every waiter. */
static uint32_t epoll__queue_take(sn_port_t *port, sn_kevent_t *out, uint32_t max,
                                  int woken) {
    epoll_port_t *ep = port->impl;
    uint32_t n = 0;
    /* The common case, nothing queued and no wake-up, costs neither the
       lock nor a read: a stale answer only delays a packet to the wake-up
       it caused. */
    if (!woken && __atomic_load_n(&ep->queue_len, __ATOMIC_ACQUIRE) == 0)
        return 0;
    sn_mutex_lock(&ep->queue_lock);
    while (n < max && ep->queue_len > 0) {
        out[n++] = ep->queue[ep->queue_head];
        ep->queue_head = (ep->queue_head + 1) & (ep->queue_cap - 1);
        __atomic_store_n(&ep->queue_len, ep->queue_len - 1, __ATOMIC_RELEASE);
    }
    if ((n > 0 || woken) && ep->queue_len == 0 && !sn_atomic_load(&port->closing)) {
        uint64_t count;
        ssize_t ignored;
        SN_COUNT(port, SN_COUNT_DRAINS);
        ignored = read(ep->wakefd, &count, sizeof count);
        (void)ignored;
    }
    sn_mutex_unlock(&ep->queue_lock);
    return n;
}

static int epoll__available(const char **why) {
    *why = "Linux: epoll with EPOLLONESHOT provides the contract natively";
    return 1;
}

/* The eventfd's item in the port's epoll instance. */
static int epoll__add_wake(int epfd, int wakefd) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.u64 = SN_EPOLL_WAKE_KEY;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, wakefd, &ev);
}

static int epoll__open(sn_port_t *port) {
    epoll_port_t *ep = calloc(1, sizeof *ep);
    int err;

    if (ep == NULL)
        return ENOMEM;
    ep->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ep->epfd < 0)
        goto err1;
    ep->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ep->wakefd < 0)
        goto err2;
    if (epoll__add_wake(ep->epfd, ep->wakefd) < 0)
        goto err3;
    sn_mutex_init(&ep->queue_lock);
    port->impl = ep;
    return 0;

err3:
    err = errno;
    close(ep->wakefd);
    errno = err;
err2:
    err = errno;
    close(ep->epfd);
    errno = err;
err1:
    err = errno;
    free(ep);
    return err;
}

static uint32_t epoll__interest(uint16_t events, uint8_t trigger) {
    uint32_t interest = 0;
    if (events & SN_EVENT_IN)
        interest |= EPOLLIN;
    if (events & SN_EVENT_OUT)
        interest |= EPOLLOUT;
    if (events & SN_EVENT_HANGUP)
        interest |= EPOLLRDHUP;
    if (trigger & SN_TRIGGER_ONESHOT)
        interest |= EPOLLONESHOT;
    if (trigger & SN_TRIGGER_EDGE)
        interest |= EPOLLET;
    return interest;
}

static uint32_t epoll__events(uint32_t ready) {
    uint32_t events = 0;
    if (ready & EPOLLIN)
        events |= SN_EVENT_IN;
    if (ready & EPOLLOUT)
        events |= SN_EVENT_OUT;
    if (ready & EPOLLRDHUP)
        events |= SN_EVENT_HANGUP;
    if (ready & EPOLLHUP)
        events |= SN_EVENT_HANGUP | SN_EVENT_IN | SN_EVENT_OUT;
    if (ready & EPOLLERR)
        events |= SN_EVENT_ERR;
    return events;
}

static int epoll__ctl(sn_port_t *port, int op, int fd, struct epoll_event *ev) {
    epoll_port_t *ep = port->impl;
    SN_COUNT(port, SN_COUNT_CHANGES);
    return epoll_ctl(ep->epfd, op, fd, ev);
}

static uint32_t epoll__apply(sn_port_t *port, const sn_registration_t *reg) {
    int fd = (int)reg->socket;
    struct epoll_event ev;

    if (reg->socket > 0x7fffffff)
        return EBADF;
    memset(&ev, 0, sizeof ev);
    switch (reg->op) {
    case SN_OP_ENABLE:
        ev.events = epoll__interest(reg->events, reg->trigger);
        ev.data.u64 = reg->key;
        if (reg->trigger & SN_TRIGGER_ADD) {
            if (epoll__ctl(port, EPOLL_CTL_ADD, fd, &ev) == 0)
                return 0;
            /* EEXIST: the kernel kept an item the port has forgotten
               (re-keyed under the same descriptor and file). */
            if (errno != EEXIST)
                return (uint32_t)errno;
            return epoll__ctl(port, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : (uint32_t)errno;
        }
        if (epoll__ctl(port, EPOLL_CTL_MOD, fd, &ev) == 0)
            return 0;
        /* ENOENT for a registration the kernel had: its fd was closed
           (and the number may be another file's now), which must not
           inherit the registration. */
        if (errno != ENOENT || (reg->trigger & SN_TRIGGER_MODIFY_ONLY))
            return (uint32_t)errno;
        return epoll__ctl(port, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : (uint32_t)errno;
    case SN_OP_DISABLE:
        /* Deleting is the only way to silence EPOLLERR/EPOLLHUP too. An fd
           already disabled has no item: that is success, if it is open. */
        if (epoll__ctl(port, EPOLL_CTL_DEL, fd, &ev) == 0)
            return 0;
        if (errno == ENOENT && fcntl(fd, F_GETFD) >= 0)
            return 0;
        return (uint32_t)errno;
    case SN_OP_REMOVE:
        if (epoll__ctl(port, EPOLL_CTL_DEL, fd, &ev) != 0) {
            /* ENOENT on an open fd: the registration was disabled. */
            if (!(errno == ENOENT && fcntl(fd, F_GETFD) >= 0))
                return (uint32_t)errno;
        }
        /* epoll drops the item's queued readiness with it: the REMOVE
           event is ours to make, and a quiet remove needs none. */
        if (reg->trigger & SN_TRIGGER_QUIET)
            return 0;
        return (uint32_t)epoll__queue_push(port, reg->key, SN_EVENT_REMOVE, 0);
    default:
        return 0;   /* SN_OP_NONE: a placeholder the port layer rejected */
    }
}

static int epoll__process(sn_port_t *port, sn_registration_t *regs, uint32_t count,
                          int64_t timeout_ms, sn_kevent_t *events,
                          uint32_t max_events, uint32_t *received, uint32_t *dropped) {
    epoll_port_t *ep = port->impl;
    /* epoll_wait writes its answer straight into the caller's event
       array: no allocation, whatever max_events is, and ONE wait (a second
       one would report a persistent level registration twice). A struct
       epoll_event (12 bytes on x86-64, where it is packed; at most 16
       elsewhere) is never larger than an sn_kevent_t (16), so the answer
       fits in the room left, and it is widened in place from the last
       entry down: entry j is read before anything is written over it,
       since the events written so far all lie above it. */
    char *raw;
    struct epoll_event ev;
    uint32_t i, n = 0;
    int wait_ms, got, j, woken = 0, failed = 0;
    int err = 0;

    typedef char epoll_event_fits[sizeof(struct epoll_event) <= sizeof(sn_kevent_t) ? 1 : -1];
    (void)sizeof(epoll_event_fits);

    *received = 0;
    *dropped = 0;
    for (i = 0; i < count; i++) {
        if (regs[i].op == SN_OP_NONE)
            continue;
        regs[i].result = epoll__apply(port, &regs[i]);
        failed |= regs[i].result != 0 && sn__failure_is_news(&regs[i]);
    }
    if (max_events == 0)
        return 0;    /* registrations only */

    n = epoll__queue_take(port, events, max_events, 0);
    if (n == max_events)
        goto out;
    /* A failed change is news for the caller now: poll, do not block. */
    if (n > 0 || timeout_ms == 0 || failed)
        wait_ms = 0;
    else if (timeout_ms < 0)
        wait_ms = -1;
    else
        wait_ms = timeout_ms > 0x7fffffff ? 0x7fffffff : (int)timeout_ms;
    raw = (char *)(events + n);
    SN_COUNT(port, SN_COUNT_WAITS);
    got = epoll_wait(ep->epfd, (struct epoll_event *)(void *)raw,
                     (int)(max_events - n), wait_ms);
    if (got < 0) {
        /* EINTR: the caller hears of it (its signal handler runs next),
           unless there is something to report already. */
        if (n == 0)
            err = errno;
        goto out;
    }
    for (j = got - 1; j >= 0; j--) {
        sn_kevent_t *kev = &events[n + (uint32_t)j];
        memcpy(&ev, raw + (size_t)j * sizeof ev, sizeof ev);
        kev->key = ev.data.u64;
        kev->events = epoll__events(ev.events);
        kev->posted = 0;
    }
    /* The eventfd's entries are not events: squeeze them out. */
    for (j = 0; j < got; j++) {
        if (events[n + (uint32_t)j].key == SN_EPOLL_WAKE_KEY) {
            woken = 1;
            continue;
        }
        events[n + (uint32_t)(j - woken)] = events[n + (uint32_t)j];
    }
    n += (uint32_t)(got - woken);
    if (woken) {
        uint32_t taken = epoll__queue_take(port, events + n, max_events - n, 1);
        n += taken;
        if (taken == 0)
            *dropped = 1;   /* a wake-up for nothing we can report */
    }
out:
    *received = n;
    return err;
}

static int epoll__post(sn_port_t *port, uint64_t key) {
    return epoll__queue_push(port, key, 0, 1);
}

static void epoll__wake_all(sn_port_t *port) {
    /* Level-triggered and, once closing, never drained: every thread in
       epoll_wait on this instance wakes and sees the port closing. */
    epoll__wake(port, port->impl);
}

static void epoll__close(sn_port_t *port, int inherited) {
    epoll_port_t *ep = port->impl;
    if (ep == NULL)
        return;
    close(ep->wakefd);
    close(ep->epfd);
    /* In a forked child the queue lock may have been copied held by a
       parent thread: leave it alone. */
    if (!inherited) {
        sn_mutex_destroy(&ep->queue_lock);
    }
    free(ep->queue);
    free(ep);
    port->impl = NULL;
}

static uint64_t epoll__os_handle(sn_port_t *port) {
    return (uint64_t)((epoll_port_t *)port->impl)->epfd;
}

static int epoll__check(sn_port_t *port, uint64_t socket) {
    /* Changes are applied at once on epoll (SN_CAP_CHANGES_AT_ONCE), and
       epoll_ctl's answer is the real check. */
    (void)port;
    (void)socket;
    return 0;
}

const sn_backend_ops_t sn_epoll_ops = {
    .id = SN_BACKEND_EPOLL,
    .triggers = SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE,
    .caps = SN_CAP_CHANGES_AT_ONCE,
    .available = epoll__available,
    .open = epoll__open,
    .process = epoll__process,
    .post = epoll__post,
    .wake_all = epoll__wake_all,
    .close = epoll__close,
    .os_handle = epoll__os_handle,
    .check = epoll__check,
};

#endif /* __linux__ */

/* ISO C wants a declaration in every translation unit, also where the
   #ifdef above leaves none (MSVC and -pedantic warn otherwise). */
typedef int sn_epoll_c_is_linux_only;
