/*
 * sn_port.c -- the portable half of a notification port: the registration
 * table, stale-notification filtering, and backend selection.
 *
 * Why a table at all? ProcessSocketNotifications hands back whatever
 * completion key a registration was made with, and the seeds say two things
 * that make raw caller keys dangerous:
 *   - closesocket() deregisters a socket silently (no REMOVE event), yet
 *     notifications already queued on the port are still delivered;
 *   - socket handle values are reused at once by the next socket.
 * So a packet queued for a closed socket can surface after its handle value
 * was registered again, and with raw keys it would be reported to the new
 * registration. The kernel therefore never sees the caller's key. It sees
 * SN_KERNEL_KEY(slot, generation); the generation of a slot is bumped every
 * time the slot is freed, and a dequeued key whose generation no longer
 * matches its slot is dropped. This is the "slot + generation" scheme of
 * socket-notifications.md; epoll gets it too, because the same contract must
 * hold on every backend even where the kernel would have been kind to us.
 *
 * A record is retired (slot freed, generation bumped) when:
 *   - the REMOVE event of a successful OP_REMOVE is dequeued (the event is
 *     passed on to the caller with the record's key: the documented moment
 *     when per-registration state may be freed);
 *   - an OP_REMOVE fails with any error: the socket is already gone
 *     (closed), so no REMOVE will ever come;
 *   - an OP_ENABLE names a socket value whose live record carries another
 *     caller key: the handle value was reused (or the caller re-keyed), and
 *     nothing queued under the old key may reach the new one;
 *   - an OP_ENABLE fails (the kernel's view of the socket is then unknown).
 * An OP_ENABLE on a socket whose record is REMOVING starts a fresh record;
 * the old one stays reachable by slot only, until its REMOVE arrives.
 *
 * Lazy one-shot (epoll, SN_PROCESS_REARM callers only). A caller that
 * asks the port to re-arm what it delivered, at the start of its next call,
 * sees exactly the behaviour of a persistent level-triggered registration
 * whose deliveries are ignored between a delivery and that next call; and
 * no wait happens in between, since the next call re-arms before it waits.
 * Where re-arming costs a system call per socket (epoll_ctl) and the kernel
 * offers persistent level registrations for free, the port therefore keeps
 * such one-shot registrations persistent in the kernel and the one-shot
 * state itself ("delivered") in the record: a re-arm is a flag cleared, not
 * a system call. Registrations made without the flag in force keep
 * EPOLLONESHOT. On Windows the kernel applies re-arms inside the wait
 * anyway, so nothing is gained and nothing changes there.
 *
 * Locking: one mutex guards the table. It is held while registrations are
 * translated and while dequeued events are translated, never across the
 * kernel wait, so several threads can block in sn_port_process() at once.
 */
#ifndef _WIN32
#define _POSIX_C_SOURCE 200809L   /* clock_gettime under -std=c99 */
#endif
#include "sn_internal.h"

#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define SN_TOMBSTONE 0xffffffffu
#define SN_SLOT_LIMIT 0x7fffffffu

/* Small batches translate on the stack; larger ones allocate. */
#define SN_STACK_EVENTS 256

int sn_error_not_supported(void) { return SN_ERROR_NOT_SUPPORTED; }
int sn_error_not_registered(void) { return SN_ERROR_NOT_REGISTERED; }
int sn_error_invalid(void) { return SN_ERROR_INVALID; }

/* ---------------------------------------------------------------- index */

static uint32_t sn__hash(uint64_t socket) {
    /* Socket values are small integers (fds) or multiples of 4 (handles):
       mix the bits so both spread over the table. */
    uint64_t h = socket * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static int sn__index_grow(sn_port_t *port) {
    uint32_t old_cap = port->index_cap;
    uint32_t *old = port->index;
    uint32_t new_cap = old_cap ? old_cap * 2 : 64;
    uint32_t *fresh;
    uint32_t i;

    /* Mostly tombstones? Rehash at the same size instead of growing. */
    if (old_cap && port->live_count * 4 < old_cap)
        new_cap = old_cap;
    fresh = calloc(new_cap, sizeof *fresh);
    if (fresh == NULL)
        return SN_ERROR_NO_MEMORY;
    port->index = fresh;
    port->index_cap = new_cap;
    port->index_used = 0;
    for (i = 0; i < old_cap; i++) {
        uint32_t entry = old[i];
        if (entry != 0 && entry != SN_TOMBSTONE) {
            uint64_t socket = port->records[entry - 1].socket;
            uint32_t mask = new_cap - 1;
            uint32_t pos = sn__hash(socket) & mask;
            while (fresh[pos] != 0)
                pos = (pos + 1) & mask;
            fresh[pos] = entry;
            port->index_used++;
        }
    }
    free(old);
    return 0;
}

/* Position of socket's entry in the index, or of the free cell where it
   would go (*found tells which). The index must have a free cell. */
static uint32_t sn__index_find(sn_port_t *port, uint64_t socket, int *found) {
    uint32_t mask = port->index_cap - 1;
    uint32_t pos = sn__hash(socket) & mask;
    uint32_t first_tombstone = SN_TOMBSTONE;

    for (;;) {
        uint32_t entry = port->index[pos];
        if (entry == 0) {
            *found = 0;
            return first_tombstone != SN_TOMBSTONE ? first_tombstone : pos;
        }
        if (entry == SN_TOMBSTONE) {
            if (first_tombstone == SN_TOMBSTONE)
                first_tombstone = pos;
        } else if (port->records[entry - 1].socket == socket) {
            *found = 1;
            return pos;
        }
        pos = (pos + 1) & mask;
    }
}

static sn_record_t *sn__lookup(sn_port_t *port, uint64_t socket, uint32_t *slot) {
    int found;
    uint32_t pos;
    if (port->index_cap == 0)
        return NULL;
    pos = sn__index_find(port, socket, &found);
    if (!found)
        return NULL;
    *slot = port->index[pos] - 1;
    return &port->records[*slot];
}

static void sn__index_remove(sn_port_t *port, uint64_t socket, uint32_t slot) {
    int found;
    uint32_t pos;
    if (port->index_cap == 0)
        return;
    pos = sn__index_find(port, socket, &found);
    /* Only remove the entry if it still points at this slot: a newer
       record for the same socket value may have replaced it. */
    if (found && port->index[pos] == slot + 1)
        port->index[pos] = SN_TOMBSTONE;
}

/* -------------------------------------------------------------- records */

static int sn__records_grow(sn_port_t *port) {
    uint32_t old_cap = port->records_cap;
    uint32_t new_cap = old_cap ? old_cap * 2 : 64;
    sn_record_t *records;
    uint32_t *free_slots;
    uint32_t i;

    if (new_cap > SN_SLOT_LIMIT)
        return SN_ERROR_NO_MEMORY;
    records = realloc(port->records, (size_t)new_cap * sizeof *records);
    if (records == NULL)
        return SN_ERROR_NO_MEMORY;
    port->records = records;
    free_slots = realloc(port->free_slots, (size_t)new_cap * sizeof *free_slots);
    if (free_slots == NULL)
        return SN_ERROR_NO_MEMORY;
    port->free_slots = free_slots;
    memset(records + old_cap, 0, (size_t)(new_cap - old_cap) * sizeof *records);
    for (i = old_cap; i < new_cap; i++)
        records[i].generation = 1;   /* no kernel key is ever 0 */
    /* Push new slots so that the lowest number is popped first. */
    for (i = new_cap; i > old_cap; i--)
        port->free_slots[port->free_count++] = i - 1;
    port->records_cap = new_cap;
    return 0;
}

/* A fresh LIVE record for socket, entered in the index. */
static int sn__record_new(sn_port_t *port, uint64_t socket, uint64_t user_key,
                          uint32_t *slot_out) {
    int err, found;
    uint32_t slot, pos;
    sn_record_t *record;

    if (port->free_count == 0 && (err = sn__records_grow(port)) != 0)
        return err;
    /* Keep the index at most half full (entries and tombstones). */
    if ((port->index_used + 1) * 2 > port->index_cap &&
        (err = sn__index_grow(port)) != 0)
        return err;
    slot = port->free_slots[--port->free_count];
    record = &port->records[slot];
    record->socket = socket;
    record->user_key = user_key;
    record->state = SN_RECORD_LIVE;
    pos = sn__index_find(port, socket, &found);
    if (!found) {
        if (port->index[pos] == 0)
            port->index_used++;
    }
    port->index[pos] = slot + 1;
    port->live_count++;
    *slot_out = slot;
    return 0;
}

/* Free the slot; every key it ever issued becomes stale. */
static void sn__record_retire(sn_port_t *port, uint32_t slot) {
    sn_record_t *record = &port->records[slot];
    if (record->state == SN_RECORD_FREE)
        return;
    sn__index_remove(port, record->socket, slot);
    record->state = SN_RECORD_FREE;
    record->delivered = 0;
    record->lazy = 0;
    record->generation = (record->generation + 1) & 0x7fffffffu;
    if (record->generation == 0)
        record->generation = 1;
    port->free_slots[port->free_count++] = slot;
    port->live_count--;
}

/* ------------------------------------------------------------- backends */

static const sn_backend_ops_t *sn__ops_for(int backend) {
    switch (backend) {
#ifdef __linux__
    case SN_BACKEND_EPOLL: return &sn_epoll_ops;
#endif
#ifdef _WIN32
    case SN_BACKEND_PSN: return sn_psn_available() ? &sn_psn_ops : NULL;
    case SN_BACKEND_AFD: return &sn_afd_ops;
#endif
    default: return NULL;
    }
}

static int sn__default_backend(void) {
#ifdef __linux__
    return SN_BACKEND_EPOLL;
#elif defined(_WIN32)
    return sn_psn_available() ? SN_BACKEND_PSN : SN_BACKEND_AFD;
#else
    return -1;
#endif
}

int sn_backend_available(int backend, char *buf, uint32_t buf_size) {
    const char *why;
    int available;

    if (backend == SN_BACKEND_AUTO)
        backend = sn__default_backend();
    switch (backend) {
    case SN_BACKEND_EPOLL:
#ifdef __linux__
        available = 1;
        why = "Linux: epoll with EPOLLONESHOT provides the contract natively";
#else
        available = 0;
        why = "epoll exists only on Linux";
#endif
        break;
    case SN_BACKEND_PSN:
#ifdef _WIN32
        available = sn_psn_available();
        why = available
            ? "ProcessSocketNotifications exported by ws2_32"
            : "ProcessSocketNotifications not exported by ws2_32 "
              "(needs Windows 11 or Server 2022)";
#else
        available = 0;
        why = "ProcessSocketNotifications exists only on Windows";
#endif
        break;
    case SN_BACKEND_AFD:
#ifdef _WIN32
        available = 1;
        why = sn_psn_available()
            ? "IOCTL_AFD_POLL polyfill (available; the OS's own "
              "ProcessSocketNotifications is preferred)"
            : "ProcessSocketNotifications not exported by ws2_32; "
              "AFD fallback (IOCTL_AFD_POLL polyfill)";
#else
        available = 0;
        why = "IOCTL_AFD_POLL exists only on Windows";
#endif
        break;
    default:
        available = 0;
        why = "no backend for this operating system";
        break;
    }
    if (buf != NULL && buf_size > 0) {
        strncpy(buf, why, buf_size - 1);
        buf[buf_size - 1] = '\0';
    }
    return available;
}

int sn_backend_triggers(int backend) {
    switch (backend) {
    case SN_BACKEND_EPOLL:
    case SN_BACKEND_PSN:
        return SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT |
               SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE;
    case SN_BACKEND_AFD:
        /* An AFD poll reports a level snapshot; edges cannot be told apart
           from a still-true level (see sn_afd.c). */
        return SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL;
    default:
        return 0;
    }
}

sn_port_t *sn_port_open(int backend, int *error) {
    const sn_backend_ops_t *ops;
    sn_port_t *port;
    int err;

    if (backend == SN_BACKEND_AUTO)
        backend = sn__default_backend();
    ops = sn__ops_for(backend);
    if (ops == NULL) {
        *error = SN_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    port = calloc(1, sizeof *port);
    if (port == NULL) {
        *error = SN_ERROR_NO_MEMORY;
        return NULL;
    }
    port->ops = ops;
    port->backend = backend;
    sn_mutex_init(&port->lock);
    err = ops->open(port);
    if (err != 0) {
        sn_mutex_destroy(&port->lock);
        free(port);
        *error = err;
        return NULL;
    }
    *error = 0;
    return port;
}

int sn_port_backend(sn_port_t *port) {
    return port->backend;
}

uint32_t sn_port_registered(sn_port_t *port) {
    uint32_t n;
    sn_mutex_lock(&port->lock);
    n = port->live_count;
    sn_mutex_unlock(&port->lock);
    return n;
}

uint64_t sn_port_os_handle(sn_port_t *port) {
    return port->ops->os_handle(port);
}

uint64_t sn_io_completion_key(void) {
    return SN_IO_COMPLETION_KEY;
}

int sn_port_post(sn_port_t *port, uint64_t key) {
    return port->ops->post(port, key);
}

int sn_port_close(sn_port_t *port) {
    if (port == NULL)
        return 0;
    port->ops->close(port);
    sn_mutex_destroy(&port->lock);
    free(port->records);
    free(port->free_slots);
    free(port->index);
    free(port->rearm_slots);
    free(port);
    return 0;
}

/* ---------------------------------------------------------- the process */

/* What sn_port_process() remembers about a registration between handing it
   to the kernel and reading the result back. */
typedef struct sn_pending {
    uint32_t slot;
    uint8_t skip;         /* rejected before reaching the kernel */
} sn_pending_t;

static int sn__valid_trigger(int backend, uint8_t trigger) {
    int persistence = trigger & (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT);
    int level = trigger & (SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE);
    if (trigger & ~(SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT |
                    SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE))
        return SN_ERROR_INVALID;
    if (persistence == (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT) ||
        level == (SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE))
        return SN_ERROR_INVALID;
    if (trigger & ~sn_backend_triggers(backend))
        return SN_ERROR_NOT_SUPPORTED;
    return 0;
}

/* Translate the caller's registrations into kernel ones (lock held). */
static void sn__prepare(sn_port_t *port, sn_registration_t *regs,
                        sn_registration_t *kregs, sn_pending_t *pending,
                        uint32_t count) {
    uint32_t i;
    for (i = 0; i < count; i++) {
        sn_registration_t *reg = &regs[i];
        sn_registration_t *kreg = &kregs[i];
        sn_pending_t *p = &pending[i];
        sn_record_t *record;
        uint32_t slot = 0;
        int err = 0;

        *kreg = *reg;
        kreg->result = 0;
        p->skip = 0;
        record = sn__lookup(port, reg->socket, &slot);

        switch (reg->op) {
        case SN_OP_ENABLE:
            if (reg->events & ~(SN_EVENT_IN | SN_EVENT_OUT | SN_EVENT_HANGUP)) {
                err = SN_ERROR_INVALID;
                break;
            }
            if ((err = sn__valid_trigger(port->backend, reg->trigger)) != 0)
                break;
            if (record != NULL && record->state == SN_RECORD_LIVE &&
                record->user_key != reg->key) {
                /* The socket value was reused (or re-keyed): whatever is
                   queued under the old key must not reach this one. */
                sn__record_retire(port, slot);
                record = NULL;
            }
            if (record == NULL || record->state != SN_RECORD_LIVE) {
                if ((err = sn__record_new(port, reg->socket, reg->key, &slot)) != 0)
                    break;
            }
            port->records[slot].events = reg->events;
            port->records[slot].trigger = reg->trigger;
            port->records[slot].delivered = 0;
            port->records[slot].lazy = 0;
            if (port->rearm_mode && port->backend == SN_BACKEND_EPOLL &&
                (reg->trigger & SN_TRIGGER_ONESHOT) && !(reg->trigger & SN_TRIGGER_EDGE)) {
                kreg->trigger = (uint8_t)((reg->trigger & ~SN_TRIGGER_ONESHOT) |
                                          SN_TRIGGER_PERSISTENT);
                port->records[slot].lazy = 1;
            }
            break;
        case SN_OP_DISABLE:
        case SN_OP_REMOVE:
            if (record == NULL || record->state != SN_RECORD_LIVE) {
                err = SN_ERROR_NOT_REGISTERED;
                break;
            }
            if (reg->op == SN_OP_REMOVE)
                record->state = SN_RECORD_REMOVING;
            break;
        case SN_OP_NONE:
            p->skip = 1;
            continue;
        default:
            err = SN_ERROR_INVALID;
            break;
        }
        if (err != 0) {
            reg->result = (uint32_t)err;
            p->skip = 1;
            /* NONE is harmless to the kernel: it keeps the batch aligned. */
            kreg->op = SN_OP_NONE;
            continue;
        }
        p->slot = slot;
        kreg->key = SN_KERNEL_KEY(slot, port->records[slot].generation);
    }
}

/* Read the kernel's verdicts back into the table (lock held). The first
   `internal` kernel registrations are the port's own re-arms: their
   verdicts settle the table but belong to no caller registration. */
static void sn__settle(sn_port_t *port, sn_registration_t *regs,
                       sn_registration_t *kregs, sn_pending_t *pending,
                       uint32_t internal, uint32_t count) {
    uint32_t i;
    for (i = 0; i < count; i++) {
        sn_pending_t *p = &pending[i];
        sn_record_t *record;
        if (p->skip)
            continue;
        if (i >= internal)
            regs[i - internal].result = kregs[i].result;
        if (kregs[i].result == 0)
            continue;
        record = &port->records[p->slot];
        /* A verdict about an older generation of this slot has nothing
           left to settle. */
        if (SN_KERNEL_KEY(p->slot, record->generation) != kregs[i].key)
            continue;
        /* A failed REMOVE means the socket is already gone (closesocket
           deregistered it silently); a failed ENABLE leaves the kernel's
           view unknown. Either way nothing more may be delivered under
           this registration's key. */
        if (kregs[i].op == SN_OP_REMOVE || kregs[i].op == SN_OP_ENABLE)
            sn__record_retire(port, p->slot);
    }
}

/* Note a delivered one-shot registration for the next SN_PROCESS_REARM
   call. Returns 0 if there is no memory, in which case the caller simply
   does not get that registration re-armed for it (as without the flag). */
static int sn__rearm_push(sn_port_t *port, uint32_t slot) {
    if (port->rearm_count == port->rearm_cap) {
        uint32_t cap = port->rearm_cap ? port->rearm_cap * 2 : 64;
        uint32_t *bigger = realloc(port->rearm_slots, (size_t)cap * sizeof *bigger);
        if (bigger == NULL)
            return 0;
        port->rearm_slots = bigger;
        port->rearm_cap = cap;
    }
    port->rearm_slots[port->rearm_count++] = slot;
    return 1;
}

/* The events a registration asked for, plus the ones always delivered.
   A hang-up outside the filter still wakes the registration for what it
   asked for: a hung-up socket's reads and writes no longer block, and
   swallowing the event would leave a one-shot registration disarmed with
   nobody told. */
static uint32_t sn__filter(uint16_t filter, uint32_t events) {
    uint32_t wanted = events & ((uint32_t)filter | SN_EVENT_ERR | SN_EVENT_REMOVE);
    if (wanted == 0 && (events & SN_EVENT_HANGUP))
        wanted = filter & (SN_EVENT_IN | SN_EVENT_OUT);
    return wanted;
}

/* Turn kernel events into caller notifications (lock held). */
static uint32_t sn__deliver(sn_port_t *port, const sn_kevent_t *events,
                            uint32_t count, sn_notification_t *out) {
    uint32_t i, n = 0;
    for (i = 0; i < count; i++) {
        const sn_kevent_t *ev = &events[i];
        uint32_t slot;
        sn_record_t *record;
        if (ev->posted) {
            /* A posted packet (events 0) or an I/O completion (SN_EVENT_IO):
               passed through as the backend gave it. */
            out[n].key = ev->key;
            out[n].events = ev->events;
            n++;
            continue;
        }
        slot = SN_KEY_SLOT(ev->key);
        if (slot >= port->records_cap)
            continue;
        record = &port->records[slot];
        if (record->state == SN_RECORD_FREE ||
            record->generation != SN_KEY_GENERATION(ev->key))
            continue;   /* stale: queued for a registration since retired */
        if (record->lazy && record->delivered && !(ev->events & SN_EVENT_REMOVE))
            continue;   /* a lazy one-shot, delivered and not re-armed yet */
        out[n].key = record->user_key;
        out[n].events = sn__filter(record->events, ev->events);
        if (out[n].events == 0)
            continue;
        n++;
        if (ev->events & SN_EVENT_REMOVE)
            sn__record_retire(port, slot);
        else if (port->rearm_mode && (record->trigger & SN_TRIGGER_ONESHOT) &&
                 !record->delivered && sn__rearm_push(port, slot))
            record->delivered = 1;
    }
    return n;
}

/* The port's own re-arms (SN_PROCESS_REARM): an ENABLE, with the filter
   and trigger of the registration's last ENABLE, for every one-shot
   registration delivered since the last such call and still live. Written
   at the front of kregs (lock held); returns how many. */
static uint32_t sn__prepare_rearms(sn_port_t *port, sn_registration_t *kregs,
                                   sn_pending_t *pending) {
    uint32_t i, n = 0;
    for (i = 0; i < port->rearm_count; i++) {
        uint32_t slot = port->rearm_slots[i];
        sn_record_t *record = &port->records[slot];
        if (record->state != SN_RECORD_LIVE || !record->delivered)
            continue;   /* removed or re-enabled by its owner meanwhile */
        record->delivered = 0;
        if (record->lazy)
            continue;   /* armed again by clearing the flag: no kernel call */
        kregs[n].socket = record->socket;
        kregs[n].key = SN_KERNEL_KEY(slot, record->generation);
        kregs[n].events = record->events;
        kregs[n].op = SN_OP_ENABLE;
        kregs[n].trigger = record->trigger;
        kregs[n].result = 0;
        pending[n].slot = slot;
        pending[n].skip = 0;
        n++;
    }
    port->rearm_count = 0;
    return n;
}

int sn_port_process(sn_port_t *port, uint32_t flags,
                    sn_registration_t *registrations, uint32_t count,
                    int64_t timeout_ms,
                    sn_notification_t *notifications, uint32_t max_notifications,
                    uint32_t *received) {
    sn_registration_t stack_kregs[16];
    sn_pending_t stack_pending[16];
    sn_kevent_t stack_events[SN_STACK_EVENTS];
    sn_registration_t *kregs = stack_kregs;
    sn_pending_t *pending = stack_pending;
    sn_kevent_t *events = stack_events;
    uint32_t internal = 0, total;
    int64_t deadline = 0;
    int err = 0;

    *received = 0;
    if (flags & ~(uint32_t)SN_PROCESS_REARM)
        return SN_ERROR_INVALID;
    if (max_notifications > SN_STACK_EVENTS) {
        events = malloc((size_t)max_notifications * sizeof *events);
        if (events == NULL)
            return SN_ERROR_NO_MEMORY;
    }
    if (timeout_ms > 0)
        deadline = sn_now_ms() + timeout_ms;

    sn_mutex_lock(&port->lock);
    if (flags & SN_PROCESS_REARM)
        port->rearm_mode = 1;
    total = count + ((flags & SN_PROCESS_REARM) ? port->rearm_count : 0);
    if (total > 16) {
        kregs = malloc((size_t)total * sizeof *kregs);
        pending = malloc((size_t)total * sizeof *pending);
        if (kregs == NULL || pending == NULL) {
            sn_mutex_unlock(&port->lock);
            err = SN_ERROR_NO_MEMORY;
            goto out;
        }
    }
    if (flags & SN_PROCESS_REARM)
        internal = sn__prepare_rearms(port, kregs, pending);
    sn__prepare(port, registrations, kregs + internal, pending + internal, count);
    total = internal + count;
    sn_mutex_unlock(&port->lock);

    for (;;) {
        uint32_t got = 0, delivered;
        err = port->ops->process(port, kregs, total, timeout_ms,
                                 events, max_notifications, &got);
        sn_mutex_lock(&port->lock);
        if (total != 0) {
            sn__settle(port, registrations, kregs, pending, internal, total);
            total = 0;   /* registrations are applied once, by the first call */
        }
        delivered = sn__deliver(port, events, got, notifications);
        sn_mutex_unlock(&port->lock);
        *received = delivered;
        if (err != 0 || delivered != 0 || got == 0 || timeout_ms == 0)
            break;
        /* Everything dequeued was stale: wait again for what is left. */
        if (timeout_ms > 0) {
            timeout_ms = deadline - sn_now_ms();
            if (timeout_ms <= 0)
                break;
        }
    }
out:
    if (kregs != stack_kregs)
        free(kregs);
    if (pending != stack_pending)
        free(pending);
    if (events != stack_events)
        free(events);
    return err;
}

/* ------------------------------------------------------------ POSIX glue */

#ifndef _WIN32
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
#endif
