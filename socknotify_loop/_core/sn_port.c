/*
 * sn_port.c -- the portable half of a notification port: the registration
 * table, stale-notification filtering, "wait again for the time left",
 * the life cycle (close, fork), and backend selection.
 *
 * Why a table at all? ProcessSocketNotifications hands back whatever
 * completion key a registration was made with, and Microsoft's article
 * "Winsock socket state notifications" says two things that make raw
 * caller keys dangerous:
 *   - closesocket() deregisters a socket silently (no REMOVE event), yet
 *     notifications already queued on the port are still delivered;
 *   - socket handle values are reused at once by the next socket.
 * So a packet queued for a closed socket can surface after its handle value
 * was registered again, and with raw keys it would be reported to the new
 * registration. The kernel therefore never sees the caller's key. It sees
 * SN_KERNEL_KEY(slot, generation); the generation of a slot is bumped every
 * time the slot is freed, and a dequeued key whose generation no longer
 * matches its slot is dropped. epoll gets the same scheme, because the same
 * contract must hold on every backend even where the kernel would have
 * been kind to us.
 *
 * A record is retired (slot freed, generation bumped) when:
 *   - the REMOVE event of a successful OP_REMOVE is dequeued (the event is
 *     passed on to the caller with the record's key: the documented moment
 *     when per-registration state may be freed), or at once for a caller
 *     that asked for quiet removes (the selector: stale packets are
 *     dropped by generation anyway);
 *   - an OP_REMOVE fails with any error: the socket is already gone
 *     (closed), so no REMOVE will ever come;
 *   - an OP_ENABLE names a socket value whose live record carries another
 *     caller key: the handle value was reused (or the caller re-keyed), and
 *     nothing queued under the old key may reach the new one;
 *   - an OP_ENABLE fails (the kernel's view of the socket is then unknown).
 *
 * One kernel key per socket (SN_CAP_KEY_FIXED: the completion-port
 * backends). ProcessSocketNotifications keeps a socket's first completion
 * key until the REMOVE event of its registration has been dequeued ("to
 * change completion keys, deregister the notification, wait for the
 * SOCK_NOTIFY_EVENT_REMOVE message, and then re-register"). A new kernel
 * key before that would be ignored by the kernel, every later packet would
 * carry the old one and be dropped as stale: a deaf socket. So there:
 *   - a quiet REMOVE keeps its record (REMOVING) until the REMOVE event;
 *   - an ENABLE of a REMOVING record waits in it (reborn) and goes to the
 *     kernel under a new generation once the event is dequeued (or at once
 *     if the REMOVE failed: the socket was closed); the ENABLEs that waited
 *     go out with the next kernel call (sn__prepare_deferred), within the
 *     same sn_port_process() when its wait dequeued the event;
 *   - an ENABLE of a LIVE record with another caller key (re-key, or a
 *     value reused after a silent closesocket(): the port cannot tell) is
 *     a quiet REMOVE whose ENABLE waits the same way;
 *   - nothing but the REMOVE event is reported for a REMOVING record, and
 *     nothing at all for a DISABLEd one ("notifications that have already
 *     been queued might still be delivered": not to our caller);
 *   - a call that failed as a whole (SN_RESULT_UNAPPLIED: "the entire
 *     operation failed, and no changes occurred") puts every record back
 *     as it was, re-arms and waiting ENABLEs included;
 *   - close() REMOVEs every live registration first, so that a socket
 *     outliving the port is not left tied to it.
 *
 * A failed caller ENABLE never leaves the call blocked: the backends turn
 * the wait into a poll when one failed, so the caller hears of the failure
 * now rather than whenever some other event ends the wait. (A failed
 * REMOVE or DISABLE needs nobody's attention: the registration is gone
 * either way, so it does not shorten the wait.)
 *
 * One-shot re-arms (SN_PROCESS_REARM). A selector re-enables, at every
 * select, what it reported at the previous one: that is how one-shot
 * registrations give level-triggered selector semantics. The port keeps the
 * list of delivered one-shot registrations itself and appends their
 * ENABLEs to the next such call, so the steady state crosses the FFI with
 * nothing but the wait.
 *
 * One-shot in the kernel, everywhere. On epoll a re-arm is an
 * EPOLL_CTL_MOD of its own, and keeping the selector's items level and
 * persistent (the port keeping the one-shot rule) would save it. That was
 * tried and given up: a persistent item whose descriptor is closed while a
 * dup() or a forked child keeps the file open (an orphan) can no longer be
 * reached by number, fires at every wait, and only a rebuild of the whole
 * interest set gets rid of it -- O(registrations) per orphan, a new
 * descriptor when the process has none left, a watch per item when the
 * kernel has none left, and a new file behind the port's OS handle. A
 * one-shot orphan fires once, is dropped here as stale, and is disarmed
 * for good: O(1), with nothing to fail. docs/design.md has the figures.
 *
 * Removes that name another registration. A REMOVE (or DISABLE) carries
 * the caller's key as well as the socket; for a caller that asked for
 * quiet removes (the selector) the key must be the record's. Otherwise a
 * REMOVE issued for a registration that its owner has since replaced
 * (closed, number reused, registered again by another thread) would take
 * the new registration away.
 *
 * Closing. Python objects may call a port from any thread, and close() may
 * come while others are inside. Every entry point counts itself in
 * `users` (an atomic increment) and THEN looks at `closing`; close() sets
 * `closing` and THEN waits for `users` to drop to zero, waking the waiters
 * (backend wake_all) every millisecond until they have left. Either close
 * sees the caller, or the caller sees the port closing and backs out, so
 * no call ever touches released resources. The struct itself is freed
 * only by sn_port_free(), which the owner of the last reference calls: a
 * late call on a closed port reads valid memory and fails cleanly.
 *
 * fork(). A child inherits the epoll instance and eventfd as shared file
 * descriptions. Any use from the child would disturb the parent, so in a
 * child every call fails as on a closed port, and close() only closes the
 * child's copies of the descriptors (sn_platform.h, fork generation).
 *
 * Locking: one mutex guards the table. It is held while registrations are
 * translated and while dequeued events are translated, never across the
 * kernel wait, so several threads can block in sn_port_process() at once.
 */
#include "sn_internal.h"

#include <stdlib.h>
#include <string.h>

#define SN_TOMBSTONE 0xffffffffu
#define SN_SLOT_LIMIT 0x7fffffffu

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
    record->in_kernel = 0;
    record->disabled = 0;
    record->quiet = 0;
    record->reborn = 0;
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
    record->in_kernel = 0;
    record->disabled = 0;
    record->quiet = 0;
    record->reborn = 0;
    record->generation = (record->generation + 1) & 0x7fffffffu;
    if (record->generation == 0)
        record->generation = 1;
    port->free_slots[port->free_count++] = slot;
    port->live_count--;
}

/* Append `slot` to a growable list of slots (doubling from `first_cap`).
   Returns 0, leaving the list as it was, if there is no memory. */
static int sn__slots_push(uint32_t **slots, uint32_t *count, uint32_t *cap,
                          uint32_t first_cap, uint32_t slot) {
    if (*count == *cap) {
        uint32_t new_cap = *cap ? *cap * 2 : first_cap;
        uint32_t *bigger = realloc(*slots, (size_t)new_cap * sizeof *bigger);
        if (bigger == NULL)
            return 0;
        *slots = bigger;
        *cap = new_cap;
    }
    (*slots)[(*count)++] = slot;
    return 1;
}

/* One kernel key per socket (SN_CAP_KEY_FIXED). An ENABLE that came
   while the socket's REMOVE was on its way waited in the record; the
   REMOVE event is in (or the REMOVE failed: the socket is gone), so the
   registration starts again under a NEW kernel key, now allowed, and its
   ENABLE goes to the kernel with the next call (sn__prepare_deferred).
   Returns 0 if there was no memory to remember that: the record is then
   retired and its owner hears of the failure as an error event. */
static int sn__deferred_push(sn_port_t *port, uint32_t slot) {
    return sn__slots_push(&port->deferred_slots, &port->deferred_count,
                          &port->deferred_cap, 16, slot);
}

static int sn__rebirth(sn_port_t *port, uint32_t slot) {
    sn_record_t *record = &port->records[slot];
    if (!sn__deferred_push(port, slot)) {
        sn__record_retire(port, slot);
        return 0;
    }
    record->generation = (record->generation + 1) & 0x7fffffffu;
    if (record->generation == 0)
        record->generation = 1;
    record->state = SN_RECORD_LIVE;
    record->user_key = record->next_key;
    record->events = record->next_events;
    record->trigger = record->next_trigger;
    record->reborn = 0;
    record->quiet = 0;
    record->disabled = 0;
    record->delivered = 0;
    record->in_kernel = 0;
    return 1;
}

/* ------------------------------------------------------------- backends */

const sn_backend_ops_t *const sn_backends[] = {
#ifdef _WIN32
    &sn_psn_ops,    /* the OS's own function, where it exists */
    &sn_afd_ops,    /* the polyfill, everywhere else on Windows */
    &sn_strict_ops, /* the strict model: never the default (afd always is) */
#endif
#ifdef __linux__
    &sn_epoll_ops,
#endif
    NULL,
};

static const sn_backend_ops_t *sn__ops_for(int backend) {
    int i;
    for (i = 0; sn_backends[i] != NULL; i++) {
        if (sn_backends[i]->id == backend)
            return sn_backends[i];
    }
    return NULL;
}

int sn_backend_default(void) {
    int i;
    const char *why;
    for (i = 0; sn_backends[i] != NULL; i++) {
        if (sn_backends[i]->available(&why))
            return sn_backends[i]->id;
    }
    return -1;
}

int sn_backend_available(int backend, char *buf, uint32_t buf_size) {
    const sn_backend_ops_t *ops;
    const char *why = "no backend for this operating system";
    int available = 0;

    if (backend == SN_BACKEND_AUTO)
        backend = sn_backend_default();
    ops = sn__ops_for(backend);
    if (ops != NULL) {
        available = ops->available(&why);
    } else if (backend >= SN_BACKEND_EPOLL && backend <= SN_BACKEND_STRICT) {
        /* Not compiled for this operating system. */
        why = backend == SN_BACKEND_EPOLL ? "epoll exists only on Linux"
            : backend == SN_BACKEND_PSN ? "ProcessSocketNotifications exists only on Windows"
            : backend == SN_BACKEND_AFD ? "IOCTL_AFD_POLL exists only on Windows"
            : "the strict model of ProcessSocketNotifications runs only on Windows";
    }
    if (buf != NULL && buf_size > 0) {
        strncpy(buf, why, buf_size - 1);
        buf[buf_size - 1] = '\0';
    }
    return available;
}

int sn_backend_triggers(int backend) {
    const sn_backend_ops_t *ops = sn__ops_for(backend);
    return ops != NULL ? ops->triggers : 0;
}

int sn_backend_caps(int backend) {
    const sn_backend_ops_t *ops = sn__ops_for(backend);
    return ops != NULL ? ops->caps : 0;
}

/* ------------------------------------------------------------ life cycle */

int sn_error_not_supported(void) { return SN_ERROR_NOT_SUPPORTED; }
int sn_error_not_registered(void) { return SN_ERROR_NOT_REGISTERED; }
int sn_error_invalid(void) { return SN_ERROR_INVALID; }
int sn_error_closed(void) { return SN_ERROR_CLOSED; }
int sn_error_busy(void) { return SN_ERROR_BUSY; }
int sn_error_interrupted(void) { return SN_ERROR_INTERRUPTED; }

static int sn__inherited(const sn_port_t *port) {
    return port->fork_generation != sn_fork_generation();
}

/* Count the caller in, unless the port is closing or inherited. */
static int sn__enter(sn_port_t *port) {
    sn_atomic_inc(&port->users);
    if (sn_atomic_load(&port->closing) || sn__inherited(port)) {
        sn_atomic_dec(&port->users);
        return SN_ERROR_CLOSED;
    }
    return 0;
}

static void sn__leave(sn_port_t *port) {
    sn_atomic_dec(&port->users);
}

int sn_port_enter(sn_port_t *port) { return sn__enter(port); }
void sn_port_leave(sn_port_t *port) { sn__leave(port); }

#ifndef _WIN32
/* Windows only: the strict model and the bare functions (sn_iocp.c). */
int64_t sn_model_control(sn_port_t *port, int what, uint64_t socket, int64_t value) {
    (void)port; (void)what; (void)socket; (void)value;
    return -(int64_t)SN_ERROR_NOT_SUPPORTED;
}
int sn_raw_open(int backend, uint64_t *handle) {
    (void)backend; (void)handle;
    return SN_ERROR_NOT_SUPPORTED;
}
int sn_raw_process(int backend, uint64_t handle, sn_registration_t *registrations,
                   uint32_t count, uint32_t timeout_ms,
                   sn_notification_t *notifications, uint32_t max_notifications,
                   uint32_t *received) {
    (void)backend; (void)handle; (void)registrations; (void)count; (void)timeout_ms;
    (void)notifications; (void)max_notifications;
    *received = 0;
    return SN_ERROR_NOT_SUPPORTED;
}
int sn_raw_close(int backend, uint64_t handle) {
    (void)backend; (void)handle;
    return SN_ERROR_NOT_SUPPORTED;
}
#endif

sn_port_t *sn_port_open(int backend, int *error) {
    const sn_backend_ops_t *ops;
    const char *why;
    sn_port_t *port;
    int err;

    if (backend == SN_BACKEND_AUTO)
        backend = sn_backend_default();
    ops = sn__ops_for(backend);
    if (ops == NULL || !ops->available(&why)) {
        *error = SN_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    port = calloc(1, sizeof *port);
    if (port == NULL) {
        *error = SN_ERROR_NO_MEMORY;
        return NULL;
    }
    sn_fork_watch();
    port->fork_generation = sn_fork_generation();
    port->ops = ops;
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

uint32_t sn_port_registered(sn_port_t *port) {
    uint32_t n;
    if (sn__enter(port) != 0)
        return 0;
    sn_mutex_lock(&port->lock);
    n = port->live_count;
    sn_mutex_unlock(&port->lock);
    sn__leave(port);
    return n;
}

int sn_port_os_handle(sn_port_t *port, uint64_t *handle) {
    int err = sn__enter(port);
    if (err != 0)
        return err;
    *handle = port->ops->os_handle(port);
    sn__leave(port);
    return 0;
}

uint64_t sn_io_completion_key(void) {
    return SN_IO_COMPLETION_KEY;
}

int sn_port_post(sn_port_t *port, uint64_t key) {
    int err = sn__enter(port);
    if (err != 0)
        return err;
    err = port->ops->post(port, key);
    sn__leave(port);
    return err;
}

int sn_port_check(sn_port_t *port, uint64_t socket) {
    int err = sn__enter(port);
    if (err != 0)
        return err;
    err = port->ops->check(port, socket);
    sn__leave(port);
    return err;
}

uint32_t sn_port_counters(sn_port_t *port, uint64_t *out, uint32_t n) {
    uint64_t all[SN_COUNTERS];
    uint32_t i;
    if (n > SN_COUNTERS)
        n = SN_COUNTERS;
    for (i = 0; i < SN_COUNTERS; i++)
        all[i] = sn_atomic_load64(&port->counters[i]);
    if (port->ops->add_counters != NULL && sn__enter(port) == 0) {
        port->ops->add_counters(port, all);
        sn__leave(port);
    }
    for (i = 0; i < n; i++)
        out[i] = all[i];
    return n;
}

/* REMOVEs on close (SN_CAP_KEY_FIXED): a socket that outlives its port
   must not stay tied to the dead one, where the next port's registration
   would be refused ("a socket can be associated with only one completion
   port"). One register-only call, no wait; failures (sockets closed
   meanwhile) need nobody's attention. No thread is inside. */
static void sn__remove_all(sn_port_t *port) {
    sn_registration_t *regs;
    uint32_t slot, n = 0, got = 0, dropped = 0;
    if (port->live_count == 0)
        return;
    regs = malloc((size_t)port->live_count * sizeof *regs);
    if (regs == NULL)
        return;
    for (slot = 0; slot < port->records_cap && n < port->live_count; slot++) {
        sn_record_t *record = &port->records[slot];
        if (record->state != SN_RECORD_LIVE)
            continue;
        regs[n].socket = record->socket;
        regs[n].key = SN_KERNEL_KEY(slot, record->generation);
        regs[n].events = 0;
        regs[n].op = SN_OP_REMOVE;
        regs[n].trigger = 0;
        regs[n].result = 0;
        n++;
    }
    if (n != 0)
        port->ops->process(port, regs, n, 0, NULL, 0, &got, &dropped);
    free(regs);
}

/* Release what the port owns besides its struct (no thread inside). */
static void sn__release(sn_port_t *port, int inherited) {
    if (!inherited && (port->ops->caps & SN_CAP_KEY_FIXED))
        sn__remove_all(port);
    port->ops->close(port, inherited);
    free(port->records);
    free(port->free_slots);
    free(port->index);
    free(port->rearm_slots);
    free(port->deferred_slots);
    port->deferred_slots = NULL;
    port->deferred_count = port->deferred_cap = 0;
    free(port->bound_events);
    port->bound_events = NULL;
    free(port->select_kregs);
    free(port->select_pending);
    port->select_kregs = NULL;
    port->select_pending = NULL;
    port->select_scratch_cap = 0;
    port->bound_changes = NULL;
    port->bound_out = NULL;
    port->records = NULL;
    port->free_slots = NULL;
    port->index = NULL;
    port->rearm_slots = NULL;
    port->records_cap = port->free_count = port->live_count = 0;
    port->index_cap = port->index_used = 0;
    port->rearm_count = port->rearm_cap = 0;
    sn_atomic_store(&port->closed, 1);
}

int sn_port_close(sn_port_t *port) {
    if (port == NULL)
        return 0;
    if (!sn_atomic_cas(&port->closing, 0, 1))
        return 0;                   /* closed, or being closed, already */
    if (sn__inherited(port)) {
        /* The child of a fork: the parent's threads are not here, and the
           descriptions are shared with the parent. Close our copies. */
        sn__release(port, 1);
        return 0;
    }
    /* Waiters see `closing` when they wake; wake them until all are out.
       A late entrant sees `closing` and backs out on its own. */
    while (sn_atomic_load(&port->users) != 0) {
        port->ops->wake_all(port);
        sn_sleep_ms(1);
    }
    sn__release(port, 0);
    return 0;
}

void sn_port_free(sn_port_t *port) {
    if (port == NULL)
        return;
    sn_port_close(port);
    if (!sn_atomic_load(&port->closed) && !sn__inherited(port)) {
        /* Closed by another thread that is still releasing: only the
           owner of the last reference calls us, so that thread is inside
           sn_port_close(); wait for it. */
        while (!sn_atomic_load(&port->closed))
            sn_sleep_ms(1);
    }
    sn_mutex_destroy(&port->lock);
    free(port);
}

/* ---------------------------------------------------------- the process */

/* What a call remembers about a registration between handing it to the
   kernel and reading the result back. */
typedef struct sn_pending {
    uint32_t slot;
    uint8_t skip;         /* rejected before reaching the kernel */
    uint8_t kind;         /* SN_PENDING_* */
    uint8_t fresh;        /* ENABLE: the record was made for it */
    uint8_t was_disabled; /* DISABLE/ENABLE: the record's flag before */
    uint8_t waits;        /* ENABLE held in a REMOVING record (KEY_FIXED) */
} sn_pending_t;

enum { SN_PENDING_CALLER = 0, SN_PENDING_REARM = 1, SN_PENDING_DEFERRED = 2,
       SN_PENDING_DEFERRED_FAILED = 3 };

static int sn__valid_trigger(const sn_backend_ops_t *ops, uint8_t trigger) {
    int persistence = trigger & (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT);
    int level = trigger & (SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE);
    if (trigger & ~(SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT |
                    SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE))
        return SN_ERROR_INVALID;
    if (persistence == (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT) ||
        level == (SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE))
        return SN_ERROR_INVALID;
    /* ProcessSocketNotifications: "one of SOCK_NOTIFY_TRIGGER_LEVEL or
       SOCK_NOTIFY_TRIGGER_EDGE must be supplied" with ENABLE. */
    if (level == 0)
        return SN_ERROR_INVALID;
    if (trigger & ~ops->triggers)
        return SN_ERROR_NOT_SUPPORTED;
    return 0;
}

/* Translate the caller's registrations into kernel ones (lock held).
   Returns how many ENABLEs were refused before reaching the kernel. */
static uint32_t sn__prepare(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
                            sn_registration_t *kregs, sn_pending_t *pending,
                            uint32_t count) {
    uint32_t i, refused = 0;
    int key_fixed = (port->ops->caps & SN_CAP_KEY_FIXED) != 0;
    for (i = 0; i < count; i++) {
        sn_registration_t *reg = &regs[i];
        sn_registration_t *kreg = &kregs[i];
        sn_pending_t *p = &pending[i];
        sn_record_t *record;
        uint32_t slot = 0;
        int err = 0;

        *kreg = *reg;
        kreg->result = 0;
        reg->result = 0;
        p->skip = 0;
        p->kind = SN_PENDING_CALLER;
        p->fresh = 0;
        p->waits = 0;
        p->was_disabled = 0;
        record = sn__lookup(port, reg->socket, &slot);

        switch (reg->op) {
        case SN_OP_ENABLE:
            if (reg->events & ~(SN_EVENT_IN | SN_EVENT_OUT | SN_EVENT_HANGUP)) {
                err = SN_ERROR_INVALID;
                break;
            }
            if ((err = sn__valid_trigger(port->ops, reg->trigger)) != 0)
                break;
            if (key_fixed && record != NULL && record->state == SN_RECORD_REMOVING) {
                /* The kernel keeps this socket's key until the REMOVE
                   event is dequeued: the ENABLE waits for it in the
                   record, and goes to the kernel under a new key then. */
                record->reborn = 1;
                record->next_key = reg->key;
                record->next_events = reg->events;
                record->next_trigger = reg->trigger;
                p->slot = slot;
                p->skip = 1;
                p->waits = 1;
                kreg->op = SN_OP_NONE;
                continue;
            }
            if (record != NULL && record->state == SN_RECORD_LIVE &&
                record->user_key != reg->key) {
                if (key_fixed) {
                    /* Re-keyed, or the value reused after a silent
                       closesocket(): the port cannot tell which. The
                       kernel keeps the old key for a live registration,
                       and whatever it queued under it must not reach the
                       new key. So: a quiet REMOVE now, and this ENABLE
                       waits in the record for its REMOVE event (or goes
                       at once if the REMOVE fails: the socket was closed,
                       and the kernel holds nothing). */
                    record->state = SN_RECORD_REMOVING;
                    record->quiet = 1;
                    record->reborn = 1;
                    record->next_key = reg->key;
                    record->next_events = reg->events;
                    record->next_trigger = reg->trigger;
                    p->was_disabled = record->disabled;
                    p->waits = 2;
                    p->slot = slot;
                    kreg->op = SN_OP_REMOVE;
                    kreg->events = 0;
                    kreg->trigger = SN_TRIGGER_QUIET;
                    kreg->key = SN_KERNEL_KEY(slot, record->generation);
                    continue;
                } else {
                    /* The socket value was reused (or re-keyed): whatever
                       is queued under the old key must not reach this one. */
                    sn__record_retire(port, slot);
                    record = NULL;
                }
            }
            if (record == NULL || record->state != SN_RECORD_LIVE) {
                /* May grow (move) the table: `record` is not read after. */
                if ((err = sn__record_new(port, reg->socket, reg->key, &slot)) != 0)
                    break;
                p->fresh = 1;
            }
            kreg->trigger |= port->records[slot].in_kernel ? SN_TRIGGER_MODIFY_ONLY
                                                           : SN_TRIGGER_ADD;
            p->was_disabled = port->records[slot].disabled;
            port->records[slot].events = reg->events;
            port->records[slot].trigger = reg->trigger;
            port->records[slot].delivered = 0;
            port->records[slot].disabled = 0;
            break;
        case SN_OP_DISABLE:
        case SN_OP_REMOVE:
            if (reg->op == SN_OP_REMOVE && record != NULL && record->reborn &&
                record->state == SN_RECORD_REMOVING && record->next_key == reg->key) {
                /* The ENABLE that waits for the REMOVE event is taken
                   back: the kernel never heard of it. */
                record->reborn = 0;
                p->skip = 1;
                kreg->op = SN_OP_NONE;
                continue;
            }
            if (record == NULL || record->state != SN_RECORD_LIVE ||
                ((flags & SN_PROCESS_QUIET_REMOVE) && record->user_key != reg->key)) {
                err = SN_ERROR_NOT_REGISTERED;
                break;
            }
            p->was_disabled = record->disabled;
            record->delivered = 0;   /* nothing for a re-arm to renew */
            if (reg->op == SN_OP_REMOVE) {
                record->state = SN_RECORD_REMOVING;
                record->quiet = (flags & SN_PROCESS_QUIET_REMOVE) != 0;
                if (flags & SN_PROCESS_QUIET_REMOVE)
                    kreg->trigger |= SN_TRIGGER_QUIET;
            } else {
                /* Nothing is reported from now on, even what the kernel
                   had queued before ("might still be delivered"). */
                record->disabled = 1;
            }
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
            refused += reg->op == SN_OP_ENABLE;
            /* NONE is harmless to the kernel: it keeps the batch aligned. */
            kreg->op = SN_OP_NONE;
            continue;
        }
        p->slot = slot;
        kreg->key = SN_KERNEL_KEY(slot, port->records[slot].generation);
    }
    return refused;
}

/* Note a delivered one-shot registration for the next SN_PROCESS_REARM
   call (defined below). */
static int sn__rearm_push(sn_port_t *port, uint32_t slot);

/* A registration of a call that failed as a whole (SN_RESULT_UNAPPLIED:
   "no changes occurred"): put the record back as it was before the call
   (lock held). */
static void sn__unapply(sn_port_t *port, const sn_registration_t *kreg, sn_pending_t *p) {
    sn_record_t *record = &port->records[p->slot];
    if (record->state == SN_RECORD_FREE ||
        SN_KERNEL_KEY(p->slot, record->generation) != kreg->key)
        return;
    if (p->kind == SN_PENDING_REARM) {
        if (record->state == SN_RECORD_LIVE && sn__rearm_push(port, p->slot))
            record->delivered = 1;
        return;
    }
    if (p->kind == SN_PENDING_DEFERRED) {
        if (!sn__deferred_push(port, p->slot))
            sn__record_retire(port, p->slot);
        return;
    }
    switch (kreg->op) {
    case SN_OP_REMOVE:
        record->state = SN_RECORD_LIVE;
        record->quiet = 0;
        record->disabled = p->was_disabled;
        break;
    case SN_OP_DISABLE:
        record->disabled = p->was_disabled;
        break;
    case SN_OP_ENABLE:
        if (p->fresh)
            sn__record_retire(port, p->slot);   /* the kernel never had it */
        else
            record->disabled = p->was_disabled;
        break;
    default:
        break;
    }
}

/* Read the kernel's verdicts back into the table (lock held). The first
   `callers` kernel registrations are the caller's; the rest are the port's
   own re-arms and deferred ENABLEs, whose verdicts settle the table but
   belong to no caller registration. `call_error` is the call's error, for
   the registrations of a call that failed as a whole. */
static void sn__settle(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
                       sn_registration_t *kregs, sn_pending_t *pending,
                       uint32_t callers, uint32_t count, int call_error) {
    uint32_t i;
    int key_fixed = (port->ops->caps & SN_CAP_KEY_FIXED) != 0;
    int failed_whole = 0;
    for (i = 0; i < count; i++)
        failed_whole |= !pending[i].skip && kregs[i].result == SN_RESULT_UNAPPLIED;
    if (failed_whole && call_error == 0)
        call_error = SN_ERROR_INVALID;
    for (i = 0; i < count; i++) {
        sn_pending_t *p = &pending[i];
        sn_record_t *record;
        if (p->skip) {
            if (p->waits && failed_whole) {
                /* Its REMOVE never reached the kernel: nothing to wait for. */
                port->records[p->slot].reborn = 0;
                regs[i].result = (uint32_t)call_error;
            }
            continue;
        }
        if (kregs[i].result == SN_RESULT_UNAPPLIED) {
            if (i < callers)
                regs[i].result = (uint32_t)call_error;
            if (p->waits == 2)
                port->records[p->slot].reborn = 0;   /* and back to LIVE: */
            sn__unapply(port, &kregs[i], p);
            continue;
        }
        if (i < callers)
            /* A re-key's REMOVE is ours: the caller's ENABLE waits. */
            regs[i].result = p->waits == 2 ? 0 : kregs[i].result;
        record = &port->records[p->slot];
        /* A verdict about an older generation of this slot has nothing
           left to settle. */
        if (SN_KERNEL_KEY(p->slot, record->generation) != kregs[i].key)
            continue;
        if (kregs[i].result == 0) {
            if (kregs[i].op == SN_OP_ENABLE)
                record->in_kernel = 1;
            else if (kregs[i].op == SN_OP_DISABLE)
                record->in_kernel = 0;
            /* A quiet REMOVE retires now: nothing more will be reported
               under this registration's key. Not where the kernel keeps
               the key until the REMOVE event: the record waits for it. */
            else if (kregs[i].op == SN_OP_REMOVE && (flags & SN_PROCESS_QUIET_REMOVE) &&
                     !key_fixed)
                sn__record_retire(port, p->slot);
            continue;
        }
        if (p->kind == SN_PENDING_DEFERRED) {
            /* An ENABLE its owner was told succeeded (it waited for a
               REMOVE event): the owner hears of the failure as an error
               event, reported by sn__run with these fields. */
            kregs[i].key = record->user_key;
            kregs[i].events = record->events;
            p->kind = SN_PENDING_DEFERRED_FAILED;
            sn__record_retire(port, p->slot);
            continue;
        }
        /* A failed re-arm of ours: the descriptor went away under its
           owner. The kernel has nothing armed for it, so nothing can be
           delivered; the record stays, so that the owner's next change
           meets the same error (a modify, like epoll_ctl MOD: ENOENT) and
           its REMOVE retires it. */
        if (i >= callers)
            continue;
        /* A failed REMOVE means the socket is already gone (closesocket
           deregistered it silently): no REMOVE event will come, so an
           ENABLE waiting for one goes ahead now. A failed ENABLE leaves
           the kernel's view unknown. Either way nothing more may be
           delivered under this registration's key. */
        if (kregs[i].op == SN_OP_REMOVE && record->reborn)
            sn__rebirth(port, p->slot);
        else if (kregs[i].op == SN_OP_REMOVE || kregs[i].op == SN_OP_ENABLE)
            sn__record_retire(port, p->slot);
    }
}

/* Note a delivered one-shot registration for the next SN_PROCESS_REARM
   call. Returns 0 if there is no memory, in which case the caller simply
   does not get that registration re-armed for it (as without the flag). */
static int sn__rearm_push(sn_port_t *port, uint32_t slot) {
    return sn__slots_push(&port->rearm_slots, &port->rearm_count, &port->rearm_cap, 64, slot);
}

/* Where translated notifications go: process() wants sn_notification_t,
   select() wants (key, selector mask) pairs and I/O keys. */
typedef struct sn_sink {
    sn_notification_t *notes;   /* process(): or NULL for select() */
    uint64_t *out;              /* select(): pairs from the front */
    uint32_t cap;               /* notifications, or words of out */
    uint32_t n;                 /* notifications, or pairs, stored */
    uint32_t io;                /* select(): I/O keys, stored from the back */
    int woken;                  /* select(): a posted packet arrived */
} sn_sink_t;

/* The selector mask of delivered events, as selectors.EpollSelector
   computes it from epoll's bits: readable on IN or a hang-up (a read
   meets EOF), writable on OUT, both on an error. A half-closed peer is a
   hang-up of the read side only: reporting it writable would wake a
   writer whose buffer is still full, again and again. */
static uint64_t sn__select_mask(uint16_t filter, uint32_t events) {
    uint64_t mask = 0, wanted = 0;
    if (events & (SN_EVENT_IN | SN_EVENT_HANGUP | SN_EVENT_ERR))
        mask |= SN_SELECT_READ;
    if (events & (SN_EVENT_OUT | SN_EVENT_ERR))
        mask |= SN_SELECT_WRITE;
    if (filter & (SN_EVENT_IN | SN_EVENT_HANGUP))
        wanted |= SN_SELECT_READ;
    if (filter & SN_EVENT_OUT)
        wanted |= SN_SELECT_WRITE;
    return mask & wanted;
}

/* Turn kernel events into the sink's form (lock held). Returns how many
   were reported or, for select(), made the call return (a wake-up). */
static uint32_t sn__deliver(sn_port_t *port, const sn_kevent_t *events,
                            uint32_t count, sn_sink_t *sink) {
    uint32_t i, before = sink->n + sink->io + (uint32_t)sink->woken;
    for (i = 0; i < count; i++) {
        const sn_kevent_t *ev = &events[i];
        uint32_t slot, wanted;
        sn_record_t *record;
        if (ev->posted) {
            /* A posted packet (events 0) or an I/O completion (SN_EVENT_IO). */
            if (sink->notes != NULL) {
                sink->notes[sink->n].key = ev->key;
                sink->notes[sink->n].events = ev->events;
                sink->n++;
            } else if (ev->events & SN_EVENT_IO) {
                sink->io++;
                sink->out[sink->cap - sink->io] = ev->key;
            } else {
                sink->woken = 1;   /* a wake-up: the select returns */
            }
            continue;
        }
        slot = SN_KEY_SLOT(ev->key);
        if (slot >= port->records_cap)
            continue;
        record = &port->records[slot];
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
            if (sink->notes != NULL && !record->quiet) {
                sink->notes[sink->n].key = record->user_key;
                sink->notes[sink->n].events = SN_EVENT_REMOVE;
                sink->n++;
            }
            if (record->reborn)
                sn__rebirth(port, slot);
            else
                sn__record_retire(port, slot);
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
            !record->delivered && sn__rearm_push(port, slot))
            record->delivered = 1;
        if (sink->notes != NULL) {
            wanted = ev->events & ((uint32_t)record->events | SN_EVENT_ERR);
            if (wanted == 0)
                continue;
            sink->notes[sink->n].key = record->user_key;
            sink->notes[sink->n].events = wanted;
            sink->n++;
        } else {
            uint64_t mask = sn__select_mask(record->events, ev->events);
            if (mask == 0)
                continue;
            sink->out[2 * sink->n] = record->user_key;
            sink->out[2 * sink->n + 1] = mask;
            sink->n++;
        }
    }
    return sink->n + sink->io + (uint32_t)sink->woken - before;
}

/* The port's own re-arms (SN_PROCESS_REARM): an ENABLE, with the filter
   and trigger of the registration's last ENABLE, for every one-shot
   registration delivered since the last such call and still live. Written
   into kregs after the caller's changes (lock held); returns how many. */
static uint32_t sn__prepare_rearms(sn_port_t *port, sn_registration_t *kregs,
                                   sn_pending_t *pending) {
    uint32_t i, n = 0;
    for (i = 0; i < port->rearm_count; i++) {
        uint32_t slot = port->rearm_slots[i];
        sn_record_t *record = &port->records[slot];
        if (record->state != SN_RECORD_LIVE || !record->delivered)
            continue;   /* removed or re-enabled by its owner meanwhile */
        record->delivered = 0;
        kregs[n].socket = record->socket;
        kregs[n].key = SN_KERNEL_KEY(slot, record->generation);
        kregs[n].events = record->events;
        kregs[n].op = SN_OP_ENABLE;
        /* A re-arm renews what the kernel has: if the descriptor was
           closed meanwhile, it must fail, not arm whatever file took the
           number (the failure retires the record silently). */
        kregs[n].trigger = (uint8_t)(record->trigger | SN_TRIGGER_REARM |
                                     (record->in_kernel ? SN_TRIGGER_MODIFY_ONLY
                                                        : SN_TRIGGER_ADD));
        kregs[n].result = 0;
        pending[n].slot = slot;
        pending[n].skip = 0;
        pending[n].kind = SN_PENDING_REARM;
        pending[n].waits = 0;
        n++;
    }
    port->rearm_count = 0;
    return n;
}

/* The ENABLEs that waited for their socket's REMOVE event (sn__rebirth),
   under the record's new kernel key. Written into kregs (lock held);
   returns how many. */
static uint32_t sn__prepare_deferred(sn_port_t *port, sn_registration_t *kregs,
                                     sn_pending_t *pending) {
    uint32_t i, n = 0;
    for (i = 0; i < port->deferred_count; i++) {
        uint32_t slot = port->deferred_slots[i];
        sn_record_t *record = &port->records[slot];
        if (record->state != SN_RECORD_LIVE || record->in_kernel || record->disabled)
            continue;   /* removed, disabled or re-enabled by its owner meanwhile */
        kregs[n].socket = record->socket;
        kregs[n].key = SN_KERNEL_KEY(slot, record->generation);
        kregs[n].events = record->events;
        kregs[n].op = SN_OP_ENABLE;
        /* A fresh registration under the new key. */
        kregs[n].trigger = (uint8_t)(record->trigger | SN_TRIGGER_ADD);
        kregs[n].result = 0;
        pending[n].slot = slot;
        pending[n].skip = 0;
        pending[n].kind = SN_PENDING_DEFERRED;
        pending[n].waits = 0;
        n++;
    }
    port->deferred_count = 0;
    return n;
}

/* A deferred ENABLE that failed: its owner, told it succeeded, hears of it
   as an error event (lock held). */
static void sn__report_deferred_failures(const sn_registration_t *kregs,
                                         const sn_pending_t *pending, uint32_t from,
                                         uint32_t count, sn_sink_t *sink) {
    uint32_t i;
    for (i = from; i < count; i++) {
        if (pending[i].kind != SN_PENDING_DEFERRED_FAILED)
            continue;
        if (sink->notes != NULL) {
            if (sink->n >= sink->cap)
                continue;
            sink->notes[sink->n].key = kregs[i].key;
            sink->notes[sink->n].events = SN_EVENT_ERR;
            sink->n++;
        } else {
            uint64_t mask = sn__select_mask(kregs[i].events, SN_EVENT_ERR);
            if (mask == 0 || 2 * (sink->n + 1) + sink->io > sink->cap)
                continue;
            sink->out[2 * sink->n] = kregs[i].key;
            sink->out[2 * sink->n + 1] = mask;
            sink->n++;
        }
    }
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
    sn_pending_t *pending = malloc((size_t)total * sizeof *pending);
    if (kregs == NULL || pending == NULL) {
        free(kregs);
        free(pending);
        return SN_ERROR_NO_MEMORY;
    }
    free(port->select_kregs);
    free(port->select_pending);
    port->select_kregs = kregs;
    port->select_pending = pending;
    port->select_scratch_cap = total;
    return 0;
}

/* The one routine behind sn_port_process() and sn_port_select(): apply
   re-arms and changes, wait, translate; wait again for the time left while
   everything dequeued was dropped. The caller has entered the port. */
static int sn__run(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
                   uint32_t count, int64_t timeout_ms, uint32_t max_events,
                   sn_kevent_t *given_events, sn_sink_t *sink) {
    sn_registration_t stack_kregs[SN_STACK_REGS];
    sn_pending_t stack_pending[SN_STACK_REGS];
    sn_kevent_t stack_events[SN_STACK_EVENTS];
    sn_registration_t *kregs = stack_kregs;
    sn_pending_t *pending = stack_pending;
    sn_kevent_t *events = stack_events;
    uint32_t internal = 0, total, refused, kcap = SN_STACK_REGS, callers = count, rounds = 0;
    int64_t deadline = 0;
    int scratch = 0;     /* kregs and pending are the port's (select path) */
    int err = 0;

    if (given_events != NULL) {
        events = given_events;
    } else if (max_events > SN_STACK_EVENTS) {
        events = malloc((size_t)max_events * sizeof *events);
        if (events == NULL)
            return SN_ERROR_NO_MEMORY;
    }
    if (timeout_ms > 0)
        deadline = sn_now_ms() + timeout_ms;

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
        pending = port->select_pending;
        scratch = 1;
        kcap = port->select_scratch_cap;
    } else if (total > SN_STACK_REGS) {
        kregs = malloc((size_t)total * sizeof *kregs);
        pending = malloc((size_t)total * sizeof *pending);
        if (kregs == NULL || pending == NULL) {
            sn_mutex_unlock(&port->lock);
            err = SN_ERROR_NO_MEMORY;
            goto out;
        }
        kcap = total;
    }
    /* The caller's changes first: a registration it removes or re-enables
       in this call is then no longer due for a re-arm of ours. */
    refused = sn__prepare(port, flags, regs, kregs, pending, count);
    if (flags & SN_PROCESS_REARM)
        internal = sn__prepare_rearms(port, kregs + count, pending + count);
    internal += sn__prepare_deferred(port, kregs + count + internal, pending + count + internal);
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
        sn__settle(port, flags, regs, kregs, pending, count, total, call_error);
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

    for (;;) {
        uint32_t got = 0, dropped = 0, reported;
        int deferred = 0;
        err = port->ops->process(port, kregs, total, timeout_ms,
                                 events, max_events, &got, &dropped);
        reported = 0;
        if (total != 0 || got != 0) {
            sn_mutex_lock(&port->lock);
            if (total != 0) {
                uint32_t before = sink->n;
                sn__settle(port, flags, regs, kregs, pending, callers, total, err);
                sn__report_deferred_failures(kregs, pending, callers, total, sink);
                reported += sink->n - before;
                total = 0;   /* registrations are applied once, by the first call */
                callers = 0;
            }
            reported += sn__deliver(port, events, got, sink);
            deferred = port->deferred_count != 0;
            sn_mutex_unlock(&port->lock);
        }
        if (err != 0 || reported != 0)
            break;
        if (timeout_ms == 0) {
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
        if (timeout_ms > 0) {
            timeout_ms = deadline - sn_now_ms();
            if (timeout_ms <= 0)
                break;
        }
        sn_mutex_lock(&port->lock);
        if (port->deferred_count > kcap && scratch) {
            if (sn__grow_select_scratch(port, port->deferred_count) == 0) {
                kregs = port->select_kregs;
                pending = port->select_pending;
                kcap = port->select_scratch_cap;
            }
        } else if (port->deferred_count > kcap) {
            sn_registration_t *k = malloc((size_t)port->deferred_count * sizeof *k);
            sn_pending_t *pe = malloc((size_t)port->deferred_count * sizeof *pe);
            if (k == NULL || pe == NULL) {
                free(k);
                free(pe);
            } else {
                if (kregs != stack_kregs)
                    free(kregs);
                if (pending != stack_pending)
                    free(pending);
                kregs = k;
                pending = pe;
                kcap = port->deferred_count;
            }
        }
        if (port->deferred_count <= kcap)
            total = sn__prepare_deferred(port, kregs, pending);
        sn_mutex_unlock(&port->lock);
    }
out:
    if (!scratch && kregs != stack_kregs)
        free(kregs);
    if (!scratch && pending != stack_pending)
        free(pending);
    if (events != stack_events && events != given_events)
        free(events);
    return err;
}

int sn_port_process(sn_port_t *port, uint32_t flags,
                    sn_registration_t *registrations, uint32_t count,
                    int64_t timeout_ms,
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
    err = sn__run(port, flags, registrations, count, timeout_ms,
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

int sn_port_bind(sn_port_t *port, sn_registration_t *changes, uint32_t changes_cap,
                 uint64_t *out, uint32_t out_cap) {
    sn_kevent_t *events;
    int err;
    if ((err = sn__enter(port)) != 0)
        return err;
    if (!sn_atomic_cas(&port->selecting, 0, 1)) {
        sn__leave(port);
        return SN_ERROR_BUSY;
    }
    /* The kernel events of a select, translated into `out`: as many as
       `out` has pairs. Ours, so allocated here, once per bind. */
    events = malloc((size_t)(out_cap / 2 + 1) * sizeof *events);
    if (events == NULL) {
        sn_atomic_store(&port->selecting, 0);
        sn__leave(port);
        return SN_ERROR_NO_MEMORY;
    }
    free(port->bound_events);
    port->bound_events = events;
    port->bound_changes = changes;
    port->bound_changes_cap = changes_cap;
    port->bound_out = out;
    port->bound_out_cap = out_cap;
    sn_atomic_store(&port->selecting, 0);
    sn__leave(port);
    return 0;
}

/* The longest wait the select path asks of a backend: what fits the
   int of epoll_wait() and stays below the DWORD INFINITE of the Windows
   waits (the same clamp as the Python selector's timeout_ms()). */
#define SN_LONGEST_WAIT_MS  INT64_C(0x7FFFFFFF)

/* sn_port_select()'s timeout is milliseconds as a double, so the loop can
   hand over `seconds * 1000.0` as it is: turning it into an integer in
   Python (a float floor and an int() call) cost more than the rest of a
   timed wait's set-up. Rounded up, so a wait never ends early (the stdlib
   selectors round up too); negative waits forever; NaN polls. */
static int64_t sn__wait_ms(double timeout_ms) {
    int64_t ms;
    if (timeout_ms < 0)
        return SN_INFINITE;
    if (!(timeout_ms > 0))
        return 0;
    if (timeout_ms >= (double)SN_LONGEST_WAIT_MS)
        return SN_LONGEST_WAIT_MS;
    ms = (int64_t)timeout_ms;
    return (double)ms < timeout_ms ? ms + 1 : ms;
}

/* The loop's usual call on a backend that applies each change at once
   (epoll): no change of the caller's, only the wait. It does
   what sn__run does for that case, without its batch machinery: the
   re-arms are applied under the table lock (for the reason sn__run gives)
   in batches on the stack, and settled in place (a re-arm that succeeded
   puts the item in the kernel; one that failed leaves the record for its
   owner's next change, as sn__settle does); then one wait, and the
   delivery. Returns 1 when it answered the call (err set); 0 when the
   caller must go on with sn__run: the port is not in that case, or the
   wait dequeued only stale events and must wait again (for the time
   left, written to *timeout_left). */
#define SN_QUICK_BATCH  16

static int sn__select_quick(sn_port_t *port, int64_t timeout_ms, sn_kevent_t *events,
                            uint32_t max_events, sn_sink_t *sink, int *err,
                            int64_t *timeout_left) {
    sn_registration_t kregs[SN_QUICK_BATCH];
    uint32_t slots[SN_QUICK_BATCH];
    uint32_t got = 0, dropped = 0, reported = 0, i, n;

    int64_t deadline = 0;

    if ((port->ops->caps & (SN_CAP_CHANGES_AT_ONCE | SN_CAP_KEY_FIXED)) !=
            SN_CAP_CHANGES_AT_ONCE)
        return 0;
    if (timeout_ms > 0)
        deadline = sn_now_ms() + timeout_ms;
    sn_mutex_lock(&port->lock);
    if (port->deferred_count != 0) {
        sn_mutex_unlock(&port->lock);
        return 0;
    }
    port->rearm_mode = 1;
    i = 0;
    while (i < port->rearm_count) {
        for (n = 0; n < SN_QUICK_BATCH && i < port->rearm_count; i++) {
            uint32_t slot = port->rearm_slots[i];
            sn_record_t *record = &port->records[slot];
            if (record->state != SN_RECORD_LIVE || !record->delivered)
                continue;   /* removed or re-enabled by its owner meanwhile */
            record->delivered = 0;
            kregs[n].socket = record->socket;
            kregs[n].key = SN_KERNEL_KEY(slot, record->generation);
            kregs[n].events = record->events;
            kregs[n].op = SN_OP_ENABLE;
            /* As in sn__prepare_rearms: a re-arm must not arm whatever
               file took a closed descriptor's number. */
            kregs[n].trigger = (uint8_t)(record->trigger | SN_TRIGGER_REARM |
                                         (record->in_kernel ? SN_TRIGGER_MODIFY_ONLY
                                                            : SN_TRIGGER_ADD));
            kregs[n].result = 0;
            slots[n++] = slot;
        }
        if (n == 0)
            break;
        port->ops->process(port, kregs, n, 0, events, 0, &got, &dropped);
        while (n-- > 0)
            if (kregs[n].result == 0)
                port->records[slots[n]].in_kernel = 1;
    }
    port->rearm_count = 0;
    sn_mutex_unlock(&port->lock);

    got = dropped = 0;
    *err = port->ops->process(port, NULL, 0, timeout_ms, events, max_events, &got, &dropped);
    if (got != 0) {
        sn_mutex_lock(&port->lock);
        reported = sn__deliver(port, events, got, sink);
        sn_mutex_unlock(&port->lock);
    }
    if (*err != 0 || reported != 0 || timeout_ms == 0 || (got == 0 && dropped == 0) ||
        sn_atomic_load(&port->closing))
        return 1;
    /* Only stale events: sn__run waits again, for the time left. */
    if (timeout_ms > 0) {
        *timeout_left = deadline - sn_now_ms();
        if (*timeout_left <= 0)
            return 1;
    }
    return 0;
}

uint32_t sn_port_select_changes(sn_port_t *port) {
    /* Written by the selecting thread only, read by it after its select. */
    return port->last_select_count;
}

int64_t sn_port_select(sn_port_t *port, uint32_t count, double timeout_ms) {
    sn_sink_t sink;
    uint32_t i, max_events;
    int64_t wait_ms;
    int err;

    if ((err = sn__enter(port)) != 0)
        return -(int64_t)err;
    if (!sn_atomic_cas(&port->selecting, 0, 1)) {
        sn__leave(port);
        return -(int64_t)SN_ERROR_BUSY;
    }
    memset(&sink, 0, sizeof sink);
    sink.out = port->bound_out;
    sink.cap = port->bound_out_cap;
    port->last_select_count = 0;
    if (count > port->bound_changes_cap || port->bound_out == NULL ||
        sink.cap / 2 <= count) {
        err = SN_ERROR_INVALID;
        goto out;
    }
    port->last_select_count = count;
    /* Room for the failure pairs of the changes, then kernel events. */
    max_events = sink.cap / 2 - count;
    wait_ms = sn__wait_ms(timeout_ms);
    if (count != 0 || !sn__select_quick(port, wait_ms, port->bound_events, max_events,
                                        &sink, &err, &wait_ms))
        err = sn__run(port, SN_PROCESS_REARM | SN_PROCESS_QUIET_REMOVE,
                      port->bound_changes, count, wait_ms, max_events,
                      port->bound_events, &sink);
    /* A change that failed: its owner hears of it as readiness, once. */
    for (i = 0; i < count; i++) {
        const sn_registration_t *reg = &port->bound_changes[i];
        uint64_t mask;
        if (reg->result == 0 || reg->op != SN_OP_ENABLE)
            continue;
        mask = sn__select_mask(reg->events, SN_EVENT_ERR);
        if (mask == 0)
            continue;
        port->bound_out[2 * sink.n] = reg->key;
        port->bound_out[2 * sink.n + 1] = mask;
        sink.n++;
    }
    /* The I/O keys were stored from the back: move them behind the pairs. */
    if (sink.io != 0)
        memmove(sink.out + 2 * sink.n, sink.out + sink.cap - sink.io,
                (size_t)sink.io * sizeof *sink.out);
out:
    sn_atomic_store(&port->selecting, 0);
    sn__leave(port);
    if (err != 0 && err != SN_ERROR_INTERRUPTED)
        return -(int64_t)err;
    if (err == SN_ERROR_INTERRUPTED && sink.n == 0 && sink.io == 0)
        return -(int64_t)err;
    /* The usual answer, one pair, travels in the return value itself: the
       caller then reads no buffer (an indexed read of the buffer costs the
       Python caller more than the two integer operations that decode it). */
    if (sink.n == 1 && sink.io == 0 && port->bound_out[0] <= SN_SELECT_ONE_MAX_KEY &&
        port->bound_out[1] >= 1 && port->bound_out[1] <= 3)
        return (int64_t)((port->bound_out[0] << 2) | port->bound_out[1]);
    return ((int64_t)sink.n | ((int64_t)sink.io << 32)) << 2;
}

int64_t sn_port_select_at(uintptr_t port, uint32_t count, double timeout_ms) {
    return sn_port_select((sn_port_t *)port, count, timeout_ms);
}

int64_t sn_port_poll_at(uintptr_t port) {
    return sn_port_select((sn_port_t *)port, 0, 0.0);
}

int64_t sn_port_wait_at(uintptr_t port, double timeout_ms) {
    return sn_port_select((sn_port_t *)port, 0, timeout_ms);
}

int64_t sn_port_block_at(uintptr_t port) {
    return sn_port_select((sn_port_t *)port, 0, -1.0);
}

uintptr_t sn_port_address(sn_port_t *port) {
    return (uintptr_t)port;
}

int sn_port_change_at(uintptr_t port, uint64_t socket, uint64_t key, uint16_t events,
                      uint8_t op, uint8_t trigger) {
    return sn_port_change((sn_port_t *)port, socket, key, events, op, trigger);
}
