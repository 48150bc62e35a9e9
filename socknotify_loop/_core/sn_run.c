/*
 * sn_run.c -- one call on a port, from the caller's changes to the
 * notifications it returns: the routine behind sn_port_process(),
 * sn_port_change() and sn_port_select() (sn__run), the stale-notification
 * filter (sn__deliver), and the one "wait again for the time left" of
 * the core; its header holds the one conversion of a timeout
 * (sn__wait_ms, inline for the select path).
 *
 * The shape of a call is ProcessSocketNotifications': apply changes in
 * order, then dequeue. Microsoft's article "Winsock socket state
 * notifications" makes both halves hazardous. Changes: closesocket()
 * deregisters silently and handle values are reused at once, so every
 * change is translated under the table lock (sn_translate.c) and, where
 * the backend applies changes one system call at a time (epoll), applied
 * under it too -- a re-arm translated here and applied after another
 * thread removed the registration, closed its descriptor and registered
 * the reused number would re-key the new registration to a dead key.
 * Dequeuing: "notifications that have already been queued might still be
 * delivered" after a DISABLE, a REMOVE or a silent close, so every kernel
 * event is checked against its record's generation and state before it is
 * reported; whatever fails the check is dropped.
 *
 * Wait again for the time left. A wait whose every packet was dropped
 * (stale, a wake-up meant for a sibling, a reserved key) must not end the
 * call: the caller asked to wait until something happened or the timeout
 * passed. sn__run owns that retry for every backend. The AFD polyfill has
 * a loop of its own inside its one call (sn_afd.c), because it stands in
 * for the OS function, which never returns for its own packets -- that
 * loop is part of being ProcessSocketNotifications, and uses the same
 * deadline arithmetic (sn_deadline, sn_time_left: sn_platform.h). What is
 * left to Python is only the retry after a signal (PEP 475), since a
 * signal's Python handler runs only between two calls into the core; it
 * hands the time left back as milliseconds, rounded by sn__wait_ms.
 *
 * Timeouts. The Python side hands every timeout over as milliseconds in a
 * double (seconds * 1000.0) and the core rounds it, once, in sn__wait_ms:
 * up, so that a wait never ends before its time (a loop woken before its timer
 * is due would spin: asyncio and the stdlib selectors round up too).
 *
 * Locking: one mutex guards the table. It is held while registrations are
 * translated and while dequeued events are translated, never across the
 * kernel wait, so several threads can block in sn_port_process() at once.
 *
 * Sources read: Microsoft's article and the ProcessSocketNotifications
 * reference page (one call applies and dequeues; queued notifications
 * outlive their registration); epoll_wait(2) (EINTR, the int timeout);
 * CPython's selectors.py and selectmodule.c (timeouts rounded up; the
 * wait resumed after a signal, PEP 475).
 */
#include "sn_run.h"
#include "sn_rearm.h"
#include "sn_table.h"
#include "sn_translate.h"

#include <stdlib.h>
#include <string.h>

/* Whether the sink has room for one more entry: a notification, or a
   (key, mask) pair in front of the I/O keys stored from the back. sn__run
   never asks the backend for more events than the room left, so this
   holds; it is checked at every write all the same, since a write past
   the caller's buffer corrupts its memory. */
static int sn__sink_room(const sn_sink_t *sink, int pair) {
    if (sink->notes != NULL)
        return sink->n < sink->cap;
    return 2 * sink->n + sink->io + (pair ? 2u : 1u) <= sink->cap;
}

/* Turn kernel events into the sink's form (lock held). Returns how many
   were reported or, for select(), made the call return (a wake-up). */
static uint32_t sn__deliver(sn_port_t *port, const sn_kevent_t *events,
                            uint32_t count, sn_sink_t *sink) {
    uint32_t i, before = sink->n + sink->io + (uint32_t)sink->woken;
    for (i = 0; i < count; i++) {
        const sn_kevent_t *ev = &events[i];
        uint32_t recno, wanted;
        sn_record_t *record;
        if (ev->posted) {
            /* A posted packet (events 0) or an I/O completion (SN_EVENT_IO). */
            if (sink->notes != NULL) {
                if (!sn__sink_room(sink, 0))
                    continue;
                sink->notes[sink->n].key = ev->key;
                sink->notes[sink->n].events = ev->events;
                sink->n++;
            } else if (ev->events & SN_EVENT_IO) {
                if (!sn__sink_room(sink, 0))
                    continue;
                sink->io++;
                sink->out[sink->cap - sink->io] = ev->key;
            } else {
                sink->woken = 1;   /* a wake-up: the select returns */
            }
            continue;
        }
        recno = SN_KEY_RECNO(ev->key);
        if (recno >= port->records_cap)
            continue;
        record = &port->records[recno];
        if (record->state == SN_RECORD_FREE ||
            record->generation != SN_KEY_GENERATION(ev->key)) {
            /* Stale: queued for a registration since retired, or the
               one report of a one-shot item whose descriptor was closed
               while its file lived on elsewhere (and which is now
               disarmed for good). */
            continue;
        }
        if (ev->events & SN_EVENT_REMOVE) {
            if (record->state != SN_RECORD_REMOVING && (port->ops->caps & SN_CAP_KEY_FIXED))
                continue;   /* not ours to end: no REMOVE was applied */
            if (sink->notes != NULL && !record->quiet && sn__sink_room(sink, 0)) {
                sink->notes[sink->n].key = record->user_key;
                sink->notes[sink->n].events = SN_EVENT_REMOVE;
                sink->n++;
            }
            if (record->reborn)
                sn__rebirth(port, recno);
            else
                sn__record_retire(port, recno);
            continue;
        }
        /* Queued before a DISABLE or REMOVE ("might still be delivered"):
           the caller asked for nothing more. */
        if (record->disabled ||
            (record->state == SN_RECORD_REMOVING && (port->ops->caps & SN_CAP_KEY_FIXED)))
            continue;
        /* A one-shot delivery disarmed the registration in the kernel,
           whatever we make of it: note it for the next re-arm even if
           nothing in it is reported (the kernel may deliver a condition
           outside the filter, such as an error). */
        if (port->rearm_mode && (record->trigger & SN_TRIGGER_ONESHOT) &&
            !record->delivered && sn__rearm_push(port, recno))
            record->delivered = 1;
        if (sink->notes != NULL) {
            wanted = ev->events & ((uint32_t)record->events | SN_EVENT_ERR);
            if (wanted == 0 || !sn__sink_room(sink, 0))
                continue;
            sink->notes[sink->n].key = record->user_key;
            sink->notes[sink->n].events = wanted;
            sink->n++;
        } else {
            uint64_t mask = sn__select_mask(record->events, ev->events);
            if (mask == 0 || !sn__sink_room(sink, 1))
                continue;
            sink->out[2 * sink->n] = record->user_key;
            sink->out[2 * sink->n + 1] = mask;
            sink->n++;
        }
    }
    return sink->n + sink->io + (uint32_t)sink->woken - before;
}

/* Whether a caller's change in the batch is a REMOVE that holds an ENABLE
   back until its REMOVE event (a re-key: sn_translate.c). */
static int sn__holds_enable_back(const sn_memo_t *memos, uint32_t callers) {
    uint32_t i;
    for (i = 0; i < callers; i++)
        if (!memos[i].skip && memos[i].waits == 2)
            return 1;
    return 0;
}

/* Small batches translate on the stack; larger ones allocate, except on
   the select path, which keeps its buffers in the port. */
#define SN_STACK_REGS    16
#define SN_STACK_EVENTS  256

/* Make the select path's scratch hold `total` registrations (lock held;
   only the selecting thread gets here). 0, or SN_ERROR_NO_MEMORY with
   the old scratch kept. */
static int sn__grow_select_scratch(sn_port_t *port, uint32_t total) {
    sn_registration_t *kregs = malloc((size_t)total * sizeof *kregs);
    sn_memo_t *memos = malloc((size_t)total * sizeof *memos);
    if (kregs == NULL || memos == NULL) {
        free(kregs);
        free(memos);
        return SN_ERROR_NO_MEMORY;
    }
    free(port->select_kregs);
    free(port->select_memos);
    port->select_kregs = kregs;
    port->select_memos = memos;
    port->select_scratch_cap = total;
    return 0;
}

/* The one routine behind sn_port_process() and sn_port_select(): apply
   re-arms and changes, wait, translate; wait again for the time left while
   everything dequeued was dropped. The caller has entered the port. */
int sn__run(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
            uint32_t count, int64_t timeout_ms, uint32_t max_events,
            sn_kevent_t *given_events, sn_sink_t *sink) {
    sn_registration_t stack_kregs[SN_STACK_REGS];
    sn_memo_t stack_memos[SN_STACK_REGS];
    sn_kevent_t stack_events[SN_STACK_EVENTS];
    sn_registration_t *kregs = stack_kregs;
    sn_memo_t *memos = stack_memos;
    sn_kevent_t *events = stack_events;
    uint32_t internal = 0, total, refused, kcap = SN_STACK_REGS, callers = count, rounds = 0;
    /* The deferred ENABLEs in the batch at hand: each may fail, and its
       failure takes an entry of the answer, so the wait is asked for that
       many events fewer (the answer's room: max_events entries, of which
       `base` were written before). */
    uint32_t ndeferred = 0, base = sink->n + sink->io;
    int64_t deadline = 0;
    int scratch = 0;     /* kregs and memos are the port's (select path) */
    int err = 0;

    if (given_events != NULL) {
        events = given_events;
    } else if (max_events > SN_STACK_EVENTS) {
        events = malloc((size_t)max_events * sizeof *events);
        if (events == NULL)
            return SN_ERROR_NO_MEMORY;
    }
    if (timeout_ms > 0)
        deadline = sn_deadline(timeout_ms);

    sn_mutex_lock(&port->lock);
    if (flags & SN_PROCESS_REARM)
        port->rearm_mode = 1;
    total = count + ((flags & SN_PROCESS_REARM) ? port->rearm_count : 0) +
            port->deferred_count;
    if (total > SN_STACK_REGS && given_events != NULL) {
        /* The select path (the only caller with its own events buffer):
           the port's scratch, grown once. */
        if (total > port->select_scratch_cap && sn__grow_select_scratch(port, total) != 0) {
            sn_mutex_unlock(&port->lock);
            err = SN_ERROR_NO_MEMORY;
            goto out;
        }
        kregs = port->select_kregs;
        memos = port->select_memos;
        scratch = 1;
        kcap = port->select_scratch_cap;
    } else if (total > SN_STACK_REGS) {
        kregs = malloc((size_t)total * sizeof *kregs);
        memos = malloc((size_t)total * sizeof *memos);
        if (kregs == NULL || memos == NULL) {
            sn_mutex_unlock(&port->lock);
            err = SN_ERROR_NO_MEMORY;
            goto out;
        }
        kcap = total;
    }
    /* The caller's changes first: a registration it removes or re-enables
       in this call is then no longer due for a re-arm of ours. */
    refused = count != 0 ? sn__prepare(port, flags, regs, kregs, memos, count) : 0;
    if ((flags & SN_PROCESS_REARM) && port->rearm_count != 0)
        internal = sn__prepare_rearms(port, kregs + count, memos + count);
    if (port->deferred_count != 0) {
        ndeferred = sn__prepare_deferred(port, kregs + count + internal,
                                         memos + count + internal, max_events);
        internal += ndeferred;
    }
    total = count + internal;
    if (total != 0 && (port->ops->caps & SN_CAP_CHANGES_AT_ONCE)) {
        /* Applied (a system call each, never blocking) and settled under
           the table lock, so that no other thread's change comes between
           the translation and the kernel: a re-arm translated here and
           applied after another thread removed the registration, closed
           its descriptor and registered the reused number would re-key
           the new registration to a dead key. */
        uint32_t got = 0, dropped = 0, i;
        int call_error = port->ops->process(port, kregs, total, 0, events, 0, &got, &dropped);
        sn__settle(port, flags, regs, kregs, memos, count, total, call_error);
        for (i = 0; i < count; i++)
            refused += regs[i].result != 0 && regs[i].op == SN_OP_ENABLE;
        total = 0;
    }
    sn_mutex_unlock(&port->lock);
    if (max_events == 0 && total == 0)
        goto out;        /* registrations only, applied */
    /* A change refused here is news for the caller: do not sit on it. */
    if (refused != 0)
        timeout_ms = 0;
    if (total != 0 && timeout_ms != 0 && max_events != 0 &&
        sn__holds_enable_back(memos, callers)) {
        /* A re-key (or a handle value reused after closesocket()) is a
           quiet REMOVE whose ENABLE waits for its REMOVE event, or goes at
           once if the REMOVE fails because the socket was closed. Only
           the call's end tells which, and a call that waits ends when
           something arrives: the ENABLE could sit out the whole wait on a
           readable socket. So this batch is applied without waiting, and
           the ENABLE it frees rides in the wait. */
        uint32_t got = 0, dropped = 0, before;
        err = port->ops->process(port, kregs, total, 0, events, 0, &got, &dropped);
        sn_mutex_lock(&port->lock);
        before = sink->n;
        sn__settle(port, flags, regs, kregs, memos, callers, total, err);
        sn__report_deferred_failures(kregs, memos, callers, total, sink);
        if (sink->n != before)
            timeout_ms = 0;    /* an ENABLE its owner thought applied failed */
        callers = 0;
        total = ndeferred = 0;
        if (err == 0) {
            uint32_t room = max_events - (sink->n + sink->io - base);
            total = ndeferred = sn__prepare_deferred(port, kregs, memos,
                                                     room < kcap ? room : kcap);
        }
        sn_mutex_unlock(&port->lock);
        if (err != 0)
            goto out;
    }

    for (;;) {
        uint32_t got = 0, dropped = 0, reported;
        uint32_t used = sink->n + sink->io - base, wait_max;
        int deferred = 0;
        /* Room for the events of this wait: the answer's, less what is
           written already and one entry per deferred ENABLE in the batch.
           None left (a caller with room for one, and a deferred ENABLE):
           the batch is applied without waiting, then the wait follows. */
        wait_max = max_events > used + ndeferred ? max_events - used - ndeferred : 0;
        err = port->ops->process(port, kregs, total, wait_max != 0 ? timeout_ms : 0,
                                 events, wait_max, &got, &dropped);
        reported = 0;
        if (total != 0 || got != 0) {
            sn_mutex_lock(&port->lock);
            if (total != 0) {
                uint32_t before = sink->n;
                sn__settle(port, flags, regs, kregs, memos, callers, total, err);
                sn__report_deferred_failures(kregs, memos, callers, total, sink);
                reported += sink->n - before;
                total = 0;   /* registrations are applied once, by the first call */
                callers = 0;
            }
            reported += sn__deliver(port, events, got, sink);
            deferred = port->deferred_count != 0;
            sn_mutex_unlock(&port->lock);
        }
        if (err != 0 || reported != 0 || max_events == 0)
            break;    /* (registrations only: deferred ENABLEs wait for a call with room) */
        if (wait_max == 0) {
            /* Only applied, to keep room for its failures: now the wait. */
        } else if (timeout_ms == 0) {
            /* A poll still applies the ENABLEs that waited for a REMOVE
               event it dequeued: one more call, that does not wait. */
            if (!deferred || rounds++ != 0)
                break;
        } else if (got == 0 && dropped == 0) {
            break;       /* timed out, or interrupted */
        }
        if (sn_atomic_load(&port->closing))
            break;       /* woken by close() */
        /* Everything dequeued was dropped: wait again for what is left,
           with the ENABLEs that waited for a REMOVE event just dequeued. */
        if (timeout_ms > 0 && wait_max != 0) {
            timeout_ms = sn_time_left(deadline);
            if (timeout_ms == 0)
                break;
        }
        sn_mutex_lock(&port->lock);
        if (port->deferred_count > kcap && scratch) {
            if (sn__grow_select_scratch(port, port->deferred_count) == 0) {
                kregs = port->select_kregs;
                memos = port->select_memos;
                kcap = port->select_scratch_cap;
            }
        } else if (port->deferred_count > kcap) {
            sn_registration_t *k = malloc((size_t)port->deferred_count * sizeof *k);
            sn_memo_t *pe = malloc((size_t)port->deferred_count * sizeof *pe);
            if (k == NULL || pe == NULL) {
                free(k);
                free(pe);
            } else {
                if (kregs != stack_kregs)
                    free(kregs);
                if (memos != stack_memos)
                    free(memos);
                kregs = k;
                memos = pe;
                kcap = port->deferred_count;
            }
        }
        used = max_events - (sink->n + sink->io - base);   /* now the room left */
        total = sn__prepare_deferred(port, kregs, memos, used < kcap ? used : kcap);
        ndeferred = total;
        sn_mutex_unlock(&port->lock);
    }
out:
    if (!scratch && kregs != stack_kregs)
        free(kregs);
    if (!scratch && memos != stack_memos)
        free(memos);
    if (events != stack_events && events != given_events)
        free(events);
    return err;
}

int sn_port_process(sn_port_t *port, uint32_t flags,
                    sn_registration_t *registrations, uint32_t count,
                    double timeout_ms,
                    sn_notification_t *notifications, uint32_t max_notifications,
                    uint32_t *received) {
    sn_sink_t sink;
    int err;

    *received = 0;
    if (flags & ~(uint32_t)(SN_PROCESS_REARM | SN_PROCESS_QUIET_REMOVE))
        return SN_ERROR_INVALID;
    if ((err = sn__enter(port)) != 0)
        return err;
    memset(&sink, 0, sizeof sink);
    sink.notes = notifications;
    sink.cap = max_notifications;
    err = sn__run(port, flags, registrations, count, sn__wait_ms(timeout_ms),
                  max_notifications, NULL, &sink);
    /* A signal cut the wait short: what arrived is returned, like a
       select() that returns early (the caller's signal handler runs next). */
    if (err == SN_ERROR_INTERRUPTED)
        err = 0;
    *received = sink.n;
    sn__leave(port);
    return err;
}

int sn_port_change(sn_port_t *port, uint64_t socket, uint64_t key, uint16_t events,
                   uint8_t op, uint8_t trigger) {
    sn_registration_t reg;
    sn_sink_t sink;
    int err;

    if ((err = sn__enter(port)) != 0)
        return err;
    reg.socket = socket;
    reg.key = key;
    reg.events = events;
    reg.op = op;
    reg.trigger = trigger;
    reg.result = 0;
    memset(&sink, 0, sizeof sink);
    err = sn__run(port, SN_PROCESS_QUIET_REMOVE, &reg, 1, 0, 0, NULL, &sink);
    sn__leave(port);
    return err != 0 ? err : (int)reg.result;
}

/* The selector's usual call on a backend that applies each change at once
   (epoll): no change of the caller's, only the re-arms and the wait. It
   does what sn__run does for that case without its batch machinery (its
   5 KiB of stack, the memo pass over the results, the general settle):
   the re-arms, when they fit SN_QUICK_REARMS, are prepared and applied
   under the table lock, for the reason sn__run gives, and settled in place
   (a re-arm that succeeded puts the item in the kernel; one that failed
   leaves the record for its owner's next change, as sn__settle does);
   then one wait without the lock, and the delivery under it. Under
   callgrind on CPython 3.14, the select calls of a streams round trip
   (four) cost about 3,300 instructions in the core through sn__run and
   2,300 through this path.
   Returns 1 when it answered the call (*err set); 0 when sn__run must:
   the port is not in that case (nothing done yet), or the wait dequeued
   only stale events, and sn__run -- the one owner of "wait again" -- waits
   for the time left, written to *timeout_ms. */
#define SN_QUICK_REARMS  16

int sn__run_quick(sn_port_t *port, int64_t *timeout_ms, sn_kevent_t *events,
                  uint32_t max_events, sn_sink_t *sink, int *err) {
    sn_registration_t kregs[SN_QUICK_REARMS];
    sn_memo_t memos[SN_QUICK_REARMS];
    uint32_t got = 0, dropped = 0, reported = 0, n;
    int64_t deadline = 0;

    if ((port->ops->caps & (SN_CAP_CHANGES_AT_ONCE | SN_CAP_KEY_FIXED)) !=
            SN_CAP_CHANGES_AT_ONCE)
        return 0;
    sn_mutex_lock(&port->lock);
    if (port->deferred_count != 0 || port->rearm_count > SN_QUICK_REARMS) {
        sn_mutex_unlock(&port->lock);
        return 0;
    }
    port->rearm_mode = 1;
    n = port->rearm_count != 0 ? sn__prepare_rearms(port, kregs, memos) : 0;
    if (n != 0) {
        port->ops->process(port, kregs, n, 0, events, 0, &got, &dropped);
        while (n-- > 0)
            if (kregs[n].result == 0)
                port->records[memos[n].recno].in_kernel = 1;
    }
    sn_mutex_unlock(&port->lock);

    if (*timeout_ms > 0)
        deadline = sn_deadline(*timeout_ms);
    got = dropped = 0;
    *err = port->ops->process(port, NULL, 0, *timeout_ms, events, max_events, &got, &dropped);
    if (got != 0) {
        sn_mutex_lock(&port->lock);
        reported = sn__deliver(port, events, got, sink);
        sn_mutex_unlock(&port->lock);
    }
    if (*err != 0 || reported != 0 || *timeout_ms == 0 || (got == 0 && dropped == 0) ||
        sn_atomic_load(&port->closing))
        return 1;
    if (*timeout_ms > 0) {
        *timeout_ms = sn_time_left(deadline);
        if (*timeout_ms <= 0)
            return 1;      /* timed out, with only stale events dequeued */
    }
    return 0;
}
