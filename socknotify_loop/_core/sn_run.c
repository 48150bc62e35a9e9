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
 * passed. sn__run owns that retry for every backend (sn__run_wait). The
 * AFD polyfill has a loop of its own inside its one call (sn_afd.c),
 * because it stands in for the OS function, which never returns for its
 * own packets -- that loop is part of being ProcessSocketNotifications,
 * and uses the same deadline arithmetic (sn_deadline, sn_time_left:
 * sn_platform.h). What is left to Python is only the retry after a signal
 * (PEP 475), since a signal's Python handler runs only between two calls
 * into the core; it hands the time left back as milliseconds, rounded by
 * sn__wait_ms.
 *
 * Timeouts. The Python side hands every timeout over as milliseconds in a
 * double (seconds * 1000.0) and the core rounds it, once, in sn__wait_ms:
 * up, so that a wait never ends before its time (a loop woken before its timer
 * is due would spin: asyncio and the stdlib selectors round up too).
 *
 * Two threads. Where the backend applies changes in the call that waits
 * (the completion-port backends: ProcessSocketNotifications applies, then
 * dequeues), a batch is translated under the lock and applied outside it.
 * Another thread's batch, translated later, could then reach the kernel
 * first: a REMOVE of a registration whose ENABLE is still on its way fails
 * (nothing is registered yet) and retires the record, and the ENABLE then
 * ties the socket under a retired key that nothing reports and close()
 * does not remove. So batches are applied in the order they were
 * translated. A thread alone in the port keeps the one call that applies
 * and waits; once two threads are in sn__run at once, the port is
 * "ordered" for good: every batch is applied and settled under the lock,
 * in a call of its own that does not wait (as epoll's are), and the wait
 * follows, without changes. The batch a thread translated alone just
 * before that may still be on its way: a thread that finds one waits for
 * it to be settled before it translates, waking the port meanwhile so
 * that a wait that carries it returns (sn__order_enter).
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
static uint32_t sn__deliver(sn_layer_t *port, const sn_kevent_t *events,
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
                if (ev->key != SN_QUIET_WAKE_KEY)
                    sink->posted = 1;   /* ... and it was the caller's */
            }
            continue;
        }
        recno = SN_KEY_RECNO(ev->key);
        if (recno >= port->records_cap)
            continue;
        record = &port->records[recno];
        if (record->state == SN_REC_FREE ||
            record->generation != SN_KEY_GENERATION(ev->key)) {
            /* Stale: queued for a registration since retired, or the
               one report of a one-shot item whose descriptor was closed
               while its file lived on elsewhere (and which is now
               disarmed for good). */
            continue;
        }
        if (ev->events & SN_EVENT_REMOVE) {
            /* Input from outside: a REMOVE event ends only a removal the
               port applied; any other is not ours (the kernel's own, for
               a registration the port never removed) and is dropped. */
            if (!sn__rec_removing(record))
                continue;
            if (sink->notes != NULL && !record->quiet && sn__sink_room(sink, 0)) {
                sink->notes[sink->n].key = record->user_key;
                sink->notes[sink->n].events = SN_EVENT_REMOVE;
                sink->n++;
            }
            if (record->state == SN_REC_REKEYING)
                sn__rebirth(port, recno);
            else
                sn__record_retire(port, recno);
            continue;
        }
        /* Queued before a DISABLE or REMOVE ("might still be delivered"),
           or dequeued by another thread's wait before it: the caller asked
           for nothing more. */
        if (record->state >= SN_REC_DISABLED)
            continue;
        /* A one-shot registration delivered already (FIRED): the kernel
           disarmed it, so a second notification under its key was queued
           before that delivery -- for instance before the DISABLE with
           which the port re-enables an armed registration (sn_iocp.c) --
           and reporting it would report the one readiness twice. Unless
           nothing of the first was reported: then the first may have been
           the one queued before that DISABLE, for the filter it ended (IN,
           where the caller now asks for OUT), and this one the delivery of
           the filter enabled since. Dropped, it would be lost with the
           readiness it tells of until some other event ended the wait. */
        if (record->state == SN_REC_FIRED) {
            if (!record->unheard || !sn__rec_heard(port, record))
                continue;
        }
        /* A one-shot delivery disarmed the registration in the kernel,
           whatever we make of it: note it for the next re-arm even if
           nothing in it is reported (the kernel may deliver a condition
           outside the filter, such as an error). Nothing of it for the
           caller: see FIRED above. */
        if (port->rearm_mode && (record->trigger & SN_TRIGGER_ONESHOT) &&
            record->state == SN_REC_ENABLED && sn__rearm_push(port, recno) &&
            !sn__rec_fire(port, record,
                          sink->notes != NULL
                              ? (ev->events & ((uint32_t)record->events | SN_EVENT_ERR)) == 0
                              : sn__select_mask(record->events, ev->events) == 0))
            port->rearm_count--;   /* refused: off the list again */
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

/* Small batches translate on the stack. */
#define SN_STACK_REGS    16
#define SN_STACK_EVENTS  256

/* The kernel registrations and memos of one call: the one place a call
   gets that memory. On the stack when they fit; past that, the port's own
   for the selecting thread (grown once and kept: one thread selects at a
   time, and a busy loop re-arms more than a stack's worth of sockets at
   every select), the heap's for any other caller (freed when its call
   ends). */
typedef struct sn_scratch {
    sn_registration_t *kregs;
    sn_memo_t *memos;
    uint32_t cap;
    int heap;            /* kregs and memos are this call's, from malloc */
    int selecting;       /* the caller is the port's selecting thread */
    sn_registration_t stack_kregs[SN_STACK_REGS];
    sn_memo_t stack_memos[SN_STACK_REGS];
} sn_scratch_t;

static void sn__scratch_init(sn_scratch_t *s, int selecting) {
    s->kregs = s->stack_kregs;
    s->memos = s->stack_memos;
    s->cap = SN_STACK_REGS;
    s->heap = 0;
    s->selecting = selecting;
}

/* Make the scratch hold `total` (lock held). 0, or SN_ERROR_NO_MEMORY with
   the scratch as it was. */
static int sn__scratch_fit(sn_layer_t *port, sn_scratch_t *s, uint32_t total) {
    sn_registration_t *kregs;
    sn_memo_t *memos;
    if (total <= s->cap)
        return 0;
    if (s->selecting && total <= port->select_scratch_cap) {
        s->kregs = port->select_kregs;
        s->memos = port->select_memos;
        s->cap = port->select_scratch_cap;
        return 0;
    }
    kregs = malloc((size_t)total * sizeof *kregs);
    memos = malloc((size_t)total * sizeof *memos);
    if (kregs == NULL || memos == NULL) {
        free(kregs);
        free(memos);
        return SN_ERROR_NO_MEMORY;
    }
    if (s->heap) {
        free(s->kregs);
        free(s->memos);
    }
    s->heap = !s->selecting;
    if (s->selecting) {
        free(port->select_kregs);
        free(port->select_memos);
        port->select_kregs = kregs;
        port->select_memos = memos;
        port->select_scratch_cap = total;
    }
    s->kregs = kregs;
    s->memos = memos;
    s->cap = total;
    return 0;
}

static void sn__scratch_release(sn_scratch_t *s) {
    if (s->heap) {
        free(s->kregs);
        free(s->memos);
    }
}

/* Apply `total` kernel registrations at once and settle them, under the
   table lock (a backend with SN_CAP_CHANGES_AT_ONCE: a system call each,
   never blocking), so that no other thread's change comes between the
   translation and the kernel: a re-arm translated here and applied after
   another thread removed the registration, closed its descriptor and
   registered the reused number would re-key the new registration to a
   dead key. The first `callers` are the caller's `regs`. Returns how many
   of the caller's changes failed whose failure is news (sn__caller_news). */
static uint32_t sn__apply_at_once(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                                  sn_registration_t *kregs, sn_memo_t *memos,
                                  uint32_t callers, uint32_t total, sn_kevent_t *events) {
    uint32_t got = 0, dropped = 0, i, refused = 0;
    int call_error = port->base.ops->process(&port->base, kregs, total, 0, events, 0, &got, &dropped);
    sn__settle(port, flags, regs, kregs, memos, callers, total, call_error);
    for (i = 0; i < callers; i++)
        refused += regs[i].result != 0 && sn__caller_news(&regs[i], flags);
    return refused;
}

/* A call's first half, under the table lock: the caller's changes, then
   the port's own re-arms and deferred ENABLEs, translated into the
   scratch; applied and settled at once where the backend does so. Sets
   *total to what the wait still has to apply, *refused to how many of
   the caller's changes failed already (whose failure is news) and *ndeferred to how many deferred
   ENABLEs the batch carries: at most `room`, since each may fail and take
   an entry of the call's answer (the rest wait for the next call). */
static int sn__run_prepare(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                           uint32_t count, sn_scratch_t *s, sn_kevent_t *events,
                           uint32_t room, uint32_t *total, uint32_t *refused,
                           uint32_t *ndeferred) {
    uint32_t internal = 0;
    if (flags & SN_PROCESS_REARM)
        port->rearm_mode = 1;
    if (sn__scratch_fit(port, s, count + ((flags & SN_PROCESS_REARM) ? port->rearm_count : 0) +
                                 port->deferred_count + port->unsent_count) != 0)
        return SN_ERROR_NO_MEMORY;
    /* The caller's changes first: a registration it removes or re-enables
       in this call is then no longer due for a re-arm of ours. */
    *refused = count != 0 ? sn__prepare(port, flags, regs, s->kregs, s->memos, count) : 0;
    if ((flags & SN_PROCESS_REARM) && port->rearm_count != 0)
        internal = sn__prepare_rearms(port, s->kregs + count, s->memos + count);
    if (port->unsent_count != 0)
        internal += sn__prepare_unsent(port, s->kregs + count + internal,
                                       s->memos + count + internal, UINT32_MAX);
    *ndeferred = 0;
    if (port->deferred_count != 0) {
        *ndeferred = sn__prepare_deferred(port, s->kregs + count + internal,
                                          s->memos + count + internal, room);
        internal += *ndeferred;
    }
    *total = count + internal;
    if (*total != 0 && (port->base.ops->caps & SN_CAP_CHANGES_AT_ONCE)) {
        *refused += sn__apply_at_once(port, flags, regs, s->kregs, s->memos, count, *total,
                                      events);
        *total = 0;
    }
    return 0;
}

/* The room left in a call's answer, in entries: `max_events` of them, of
   which those written since `base` are taken. */
static uint32_t sn__room_left(const sn_sink_t *sink, uint32_t max_events, uint32_t base) {
    uint32_t used = sink->n + sink->io - base;
    return max_events > used ? max_events - used : 0;
}

/* Enter the ordering of "Two threads" (top of this file); lock held, and
   held again on return. Returns 1 if this call counts as a runner (to be
   left by sn__order_leave). */
static int sn__order_enter(sn_layer_t *port) {
    unsigned spins = 0;
    if (port->base.ops->caps & SN_CAP_CHANGES_AT_ONCE)
        return 0;   /* applied under the lock always */
    if (++port->runners > 1)
        port->ordered = 1;
    while (port->ordered && port->unapplied != 0) {
        /* A batch translated before the port was ordered is on its way;
           its wait may be long, so wake it now and then (the wake is
           dropped by whichever wait takes it, which waits again). */
        sn_mutex_unlock(&port->lock);
        if (spins++ % 8 == 0)
            port->base.ops->wake_all(&port->base);
        sn_sleep_ms(1);
        sn_mutex_lock(&port->lock);
    }
    return 1;
}

static void sn__order_leave(sn_layer_t *port, int runner, int unapplied) {
    if (!runner && !unapplied)
        return;
    sn_mutex_lock(&port->lock);
    port->runners -= (uint32_t)(runner != 0);
    port->unapplied -= (uint32_t)(unapplied != 0);
    sn_mutex_unlock(&port->lock);
}

/* Apply a batch at once, under the lock, in a call that does not wait
   (an ordered port: "Two threads" above), settle it, report its deferred
   ENABLEs that failed; then the same for the deferred ENABLEs it freed (a
   re-key whose REMOVE failed), so that none of them sits out the wait.
   Returns how many of the caller's changes failed (whose failure is news). */
static uint32_t sn__apply_ordered(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                                  sn_scratch_t *s, sn_kevent_t *events, uint32_t callers,
                                  uint32_t total, uint32_t max_events, uint32_t base,
                                  sn_sink_t *sink) {
    uint32_t refused = 0, round, room;
    for (round = 0; round < 2 && total != 0; round++) {
        uint32_t got = 0, dropped = 0, i;
        int call_error = port->base.ops->process(&port->base, s->kregs, total, 0, events, 0,
                                                 &got, &dropped);
        sn__settle(port, flags, regs, s->kregs, s->memos, callers, total, call_error);
        sn__report_deferred_failures(s->kregs, s->memos, callers, total, sink);
        for (i = 0; i < callers; i++)
            refused += regs[i].result != 0 && sn__caller_news(&regs[i], flags);
        callers = 0;
        total = 0;
        if (port->deferred_count != 0 && max_events != 0) {
            (void)sn__scratch_fit(port, s, port->deferred_count);
            room = sn__room_left(sink, max_events, base);
            total = sn__prepare_deferred(port, s->kregs, s->memos,
                                         room < s->cap ? room : s->cap);
        }
    }
    return refused;
}

/* Whether a caller's change in the batch is a REMOVE that holds an ENABLE
   back until its REMOVE event (a re-key: sn_translate.c). */
static int sn__holds_enable_back(const sn_memo_t *memos, uint32_t callers) {
    uint32_t i;
    for (i = 0; i < callers; i++)
        if (!memos[i].skip && memos[i].waits == SN_WAITS_REKEY)
            return 1;
    return 0;
}

/* A re-key (or a handle value reused after closesocket()) is a quiet
   REMOVE whose ENABLE waits for its REMOVE event, or goes at once if the
   REMOVE fails because the socket was closed. Only the call's end tells
   which, and a call that waits ends when something arrives: the ENABLE
   could sit out the whole wait on a readable socket, its owner told the
   change succeeded. So such a batch is applied here, without waiting and
   without the lock (as the wait would apply it), settled, and the ENABLE
   it frees is prepared to ride in the wait. Returns the call's error;
   sets *total and *ndeferred to the batch the wait applies, and turns the wait
   into a poll when an ENABLE its owner thought applied failed. */
static int sn__apply_before_wait(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                                 sn_scratch_t *s, sn_kevent_t *events, uint32_t callers,
                                 uint32_t max_events, uint32_t base, sn_sink_t *sink,
                                 uint32_t *total, uint32_t *ndeferred, int64_t *timeout_ms) {
    uint32_t got = 0, dropped = 0, before, room;
    int err = port->base.ops->process(&port->base, s->kregs, *total, 0, events, 0,
                                      &got, &dropped);
    sn_mutex_lock(&port->lock);
    before = sink->n;
    sn__settle(port, flags, regs, s->kregs, s->memos, callers, *total, err);
    sn__report_deferred_failures(s->kregs, s->memos, callers, *total, sink);
    if (sink->n != before)
        *timeout_ms = 0;
    *total = *ndeferred = 0;
    if (err == 0) {
        (void)sn__scratch_fit(port, s, port->deferred_count);
        room = sn__room_left(sink, max_events, base);
        *total = *ndeferred = sn__prepare_deferred(port, s->kregs, s->memos,
                                                   room < s->cap ? room : s->cap);
    }
    sn_mutex_unlock(&port->lock);
    return err;
}

/* Whether a call waits again after a wait that returned: the one rule of
   "wait again for the time left" (see the top of this file), for sn__run
   and its quick path alike. A wait that failed, or reported something,
   ends the call; so does one that timed out or was interrupted (it
   dequeued nothing), and a closing port. A poll goes round once more only
   to apply the ENABLEs that waited for a REMOVE event it dequeued
   (`deferred`, once: `*rounds`). A timed wait goes on for the time left,
   written to *timeout_ms from `deadline`. */
static int sn__wait_again(sn_layer_t *port, int err, uint32_t reported, uint32_t got,
                          uint32_t dropped, int deferred, uint32_t *rounds,
                          int64_t deadline, int64_t *timeout_ms) {
    if (err != 0 || reported != 0)
        return 0;
    if (*timeout_ms == 0) {
        if (!deferred || (*rounds)++ != 0)
            return 0;
    } else if (got == 0 && dropped == 0) {
        return 0;        /* timed out, or interrupted */
    }
    if (sn_atomic_load(&port->base.closing))
        return 0;        /* woken by close() */
    if (*timeout_ms > 0) {
        *timeout_ms = sn_time_left(deadline);
        if (*timeout_ms <= 0)
            return 0;    /* timed out, with only dropped events dequeued */
    }
    return 1;
}

/* After a wait whose every event was dropped, before the wait again (lock
   taken and left here): the ENABLEs that waited for a REMOVE event just
   dequeued, as the next wait's batch (*total, all of them *ndeferred), as
   many as the scratch and the answer have room for; the rest stay on
   their list for the next call. On an ordered port they are applied at
   once; otherwise the batch is on its way (*unapplied). Returns 0 if one
   of them failed, reported: the call ends. */
static int sn__run_next(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                        sn_scratch_t *s, sn_kevent_t *events, uint32_t max_events,
                        uint32_t base, sn_sink_t *sink, int runner, uint32_t *total,
                        uint32_t *ndeferred, int *unapplied) {
    uint32_t room;
    sn_mutex_lock(&port->lock);
    (void)sn__scratch_fit(port, s, port->deferred_count);
    room = sn__room_left(sink, max_events, base);
    *total = *ndeferred = sn__prepare_deferred(port, s->kregs, s->memos,
                                               room < s->cap ? room : s->cap);
    if (*total != 0 && runner) {
        if (port->ordered) {
            uint32_t before = sink->n + sink->io;
            (void)sn__apply_ordered(port, flags, regs, s, events, 0, *total, max_events, base,
                                    sink);
            *total = *ndeferred = 0;
            if (sink->n + sink->io != before) {
                sn_mutex_unlock(&port->lock);
                return 0;    /* a deferred ENABLE failed: reported */
            }
        } else {
            port->unapplied++;
            *unapplied = 1;
        }
    }
    sn_mutex_unlock(&port->lock);
    return 1;
}

/* A call's second half: the wait, which applies the batch at hand
   (`total` registrations: the caller's `callers` first, `ndeferred`
   deferred ENABLEs among them), settles it and delivers what it
   dequeued; then the wait again for the time left while everything
   dequeued was dropped (the top of this file). Returns the call's error;
   *unapplied is cleared once a batch on its way is settled. */
static int sn__run_wait(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                        sn_scratch_t *s, sn_kevent_t *events, uint32_t max_events,
                        uint32_t base, sn_sink_t *sink, int runner, uint32_t callers,
                        uint32_t total, uint32_t ndeferred, int64_t timeout_ms,
                        int64_t deadline, int *unapplied) {
    uint32_t rounds = 0;
    int err = 0;
    for (;;) {
        uint32_t got = 0, dropped = 0, reported = 0, room, wait_max;
        int deferred = 0;
        /* Room for the events of this wait: the answer's, less what is
           written already and one entry per deferred ENABLE in the batch.
           None left (a caller with room for one, and a deferred ENABLE):
           the batch is applied without waiting, then the wait follows. */
        room = sn__room_left(sink, max_events, base);
        wait_max = room > ndeferred ? room - ndeferred : 0;
        err = port->base.ops->process(&port->base, s->kregs, total,
                                      wait_max != 0 ? timeout_ms : 0, events, wait_max,
                                      &got, &dropped);
        if (total != 0 || got != 0) {
            sn_mutex_lock(&port->lock);
            if (total != 0) {
                uint32_t before = sink->n;
                sn__settle(port, flags, regs, s->kregs, s->memos, callers, total, err);
                sn__report_deferred_failures(s->kregs, s->memos, callers, total, sink);
                reported += sink->n - before;
                total = 0;   /* registrations are applied once, by the first call */
                callers = 0;
                port->unapplied -= (uint32_t)*unapplied;   /* settled */
                *unapplied = 0;
            }
            reported += sn__deliver(port, events, got, sink);
            deferred = port->deferred_count != 0;
            sn_mutex_unlock(&port->lock);
        }
        if (max_events == 0)
            break;    /* registrations only: deferred ENABLEs wait for a call with room */
        if (wait_max == 0) {
            /* Only applied, to keep room for its failures: now the wait. */
            if (err != 0 || reported != 0 || sn_atomic_load(&port->base.closing))
                break;
        } else if (!sn__wait_again(port, err, reported, got, dropped, deferred, &rounds,
                                   deadline, &timeout_ms)) {
            break;
        }
        /* Everything dequeued was dropped: wait again for what is left,
           with the ENABLEs that waited for a REMOVE event just dequeued. */
        if (!sn__run_next(port, flags, regs, s, events, max_events, base, sink, runner, &total,
                          &ndeferred, unapplied))
            break;
    }
    return err;
}

/* The one routine behind sn_port_process() and sn_port_select(): apply
   re-arms and changes, wait, translate; wait again for the time left while
   everything dequeued was dropped. The caller has entered the port. */
int sn__run(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
            uint32_t count, int64_t timeout_ms, uint32_t max_events,
            sn_kevent_t *given_events, sn_sink_t *sink) {
    sn_scratch_t scratch;
    sn_kevent_t stack_events[SN_STACK_EVENTS];
    sn_kevent_t *events = stack_events;
    uint32_t total = 0, refused = 0, callers = count;
    /* The deferred ENABLEs in the batch at hand: each may fail, and its
       failure takes an entry of the answer, so the wait is asked for that
       many events fewer (the answer's room: max_events entries, of which
       those written since `base` are taken). */
    uint32_t ndeferred = 0, base = sink->n + sink->io;
    int64_t deadline = 0;
    int err, runner, unapplied = 0;

    /* The select path is the only caller with its own events buffer. */
    sn__scratch_init(&scratch, given_events != NULL);
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
    runner = sn__order_enter(port);
    err = sn__run_prepare(port, flags, regs, count, &scratch, events, max_events, &total,
                          &refused, &ndeferred);
    if (err == 0 && total != 0 && runner) {
        if (port->ordered) {
            refused += sn__apply_ordered(port, flags, regs, &scratch, events, callers, total,
                                         max_events, base, sink);
            total = ndeferred = 0;
            callers = 0;
            if (sink->n + sink->io != base)
                timeout_ms = 0;   /* a deferred ENABLE failed: news for its owner */
        } else {
            port->unapplied++;    /* on its way, outside the lock */
            unapplied = 1;
        }
    }
    sn_mutex_unlock(&port->lock);
    if (err != 0 || (max_events == 0 && total == 0))
        goto out;        /* no memory, or registrations only, applied */
    /* A change refused here is news for the caller: do not sit on it. */
    if (refused != 0)
        timeout_ms = 0;
    if (total != 0 && timeout_ms != 0 && max_events != 0 &&
        sn__holds_enable_back(scratch.memos, callers)) {
        err = sn__apply_before_wait(port, flags, regs, &scratch, events, callers, max_events,
                                    base, sink, &total, &ndeferred, &timeout_ms);
        callers = 0;
        /* Settled. The ENABLEs it freed, if any, are translated and ride
           in the wait: until that is settled the batch is still on its
           way, and no thread may apply a change after it (sn__order_enter)
           -- a REMOVE of the same registration would reach the kernel
           first, fail, and retire the record under the ENABLE. */
        if (total == 0) {
            sn__order_leave(port, 0, unapplied);
            unapplied = 0;
        }
        if (err != 0)
            goto out;
    }

    err = sn__run_wait(port, flags, regs, &scratch, events, max_events, base, sink, runner,
                       callers, total, ndeferred, timeout_ms, deadline, &unapplied);
out:
    sn__order_leave(port, runner, unapplied);
    sn__scratch_release(&scratch);
    if (events != stack_events && events != given_events)
        free(events);
    return err;
}

int sn_port_process(sn_port_t *handle, uint32_t flags,
                    sn_registration_t *registrations, uint32_t count,
                    double timeout_ms,
                    sn_notification_t *notifications, uint32_t max_notifications,
                    uint32_t *received) {
    sn_layer_t *port = sn__layer(handle);
    sn_sink_t sink;
    int err;

    *received = 0;
    if (flags & ~(uint32_t)(SN_PROCESS_REARM | SN_PROCESS_QUIET_REMOVE))
        return SN_ERROR_INVALID;
    if ((err = sn__enter(&port->base)) != 0)
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
    sn__leave(&port->base);
    return err;
}

int sn_port_change(sn_port_t *handle, uint64_t socket, uint64_t key, uint16_t events,
                   uint8_t op, uint8_t trigger) {
    sn_layer_t *port = sn__layer(handle);
    sn_registration_t reg;
    sn_sink_t sink;
    int err;

    if ((err = sn__enter(&port->base)) != 0)
        return err;
    reg.socket = socket;
    reg.key = key;
    reg.events = events;
    reg.op = op;
    reg.trigger = trigger;
    reg.result = 0;
    memset(&sink, 0, sizeof sink);
    err = sn__run(port, SN_PROCESS_QUIET_REMOVE, &reg, 1, 0, 0, NULL, &sink);
    sn__leave(&port->base);
    return err != 0 ? err : (int)reg.result;
}

/* The selector's usual call on a backend that applies each change at once
   (epoll): no change of the caller's, only the re-arms and the wait. It
   does what sn__run does for that case without its batch machinery (its
   5 KiB of stack, the scratch, the memo pass over a caller's changes),
   through the same parts: the re-arms, when they fit SN_QUICK_REARMS, are
   prepared, applied and settled under the table lock (sn__apply_at_once,
   for the reason it gives); then one wait without the lock, the delivery
   under it, and sn__run's own rule for waiting again (its cost against
   sn__run's: docs/design.md, "The C core's files").
   Returns 1 when it answered the call (*err set); 0 when sn__run must:
   the port is not in that case (nothing done yet), or the wait dequeued
   only stale events, and sn__run -- the one owner of "wait again" -- waits
   for the time left, written to *timeout_ms. */
#define SN_QUICK_REARMS  16

int sn__run_quick(sn_layer_t *port, int64_t *timeout_ms, sn_kevent_t *events,
                  uint32_t max_events, sn_sink_t *sink, int *err) {
    sn_registration_t kregs[SN_QUICK_REARMS];
    sn_memo_t memos[SN_QUICK_REARMS];
    uint32_t got = 0, dropped = 0, reported = 0, rounds = 0, n;
    int64_t deadline = 0;

    if ((port->base.ops->caps & (SN_CAP_CHANGES_AT_ONCE | SN_CAP_KEY_FIXED)) !=
            SN_CAP_CHANGES_AT_ONCE)
        return 0;
    sn_mutex_lock(&port->lock);
    if (port->deferred_count != 0 || port->unsent_count != 0 ||
        port->rearm_count > SN_QUICK_REARMS) {
        sn_mutex_unlock(&port->lock);
        return 0;
    }
    port->rearm_mode = 1;
    n = port->rearm_count != 0 ? sn__prepare_rearms(port, kregs, memos) : 0;
    if (n != 0)
        (void)sn__apply_at_once(port, SN_PROCESS_REARM | SN_PROCESS_QUIET_REMOVE, NULL,
                                kregs, memos, 0, n, events);
    sn_mutex_unlock(&port->lock);

    if (*timeout_ms > 0)
        deadline = sn_deadline(*timeout_ms);
    *err = port->base.ops->process(&port->base, NULL, 0, *timeout_ms, events, max_events, &got, &dropped);
    if (got != 0) {
        sn_mutex_lock(&port->lock);
        reported = sn__deliver(port, events, got, sink);
        sn_mutex_unlock(&port->lock);
    }
    /* No ENABLE waits for a REMOVE event on this backend (no
       SN_CAP_KEY_FIXED): nothing deferred. */
    return !sn__wait_again(port, *err, reported, got, dropped, 0, &rounds, deadline,
                           timeout_ms);
}
