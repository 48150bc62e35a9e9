/*
 * sn_port.c -- a notification port over its life: open on a backend,
 * the count of threads inside, close while others may still be inside,
 * fork, free; and the small calls that need nothing but the life cycle
 * (post, check, counters, the OS handle). The rest of the port is in the
 * files sn_internal.h lists: the table (sn_table.c), one call
 * (sn_run.c, sn_translate.c, sn_rearm.c), the selector's fast path
 * (sn_select.c), the backend registry (sn_backends.c).
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
 * REMOVEs on close (SN_CAP_KEY_FIXED). "A socket may be associated with
 * only a single I/O completion port" (Microsoft's article "Winsock socket
 * state notifications"): a socket that outlives the port must not stay
 * tied to the dead one, so close() REMOVEs every live registration first
 * -- but not one whose socket was closed since, whose handle value may
 * name another loop's socket now: checked as every REMOVE is.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and the ProcessSocketNotifications reference page; wepoll's port.c (a
 * port's life cycle and its reference counting); epoll(7) and fork(2) on
 * what a child shares with its parent.
 */
#include "sn_layer.h"
#include "sn_table.h"
#include "sn_rearm.h"

#include <stdlib.h>
#include <string.h>

int sn_port_enter(sn_port_t *port) { return sn__enter(port); }
void sn_port_leave(sn_port_t *port) { sn__leave(port); }

sn_port_t *sn_port_open(int backend, int *error) {
    const sn_backend_ops_t *ops;
    const char *why;
    sn_layer_t *port;
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
    port->base.fork_generation = sn_fork_generation();
    port->base.ops = ops;
    sn_mutex_init(&port->lock);
    err = ops->open(&port->base);
    if (err != 0) {
        sn_mutex_destroy(&port->lock);
        free(port);
        *error = err;
        return NULL;
    }
    *error = 0;
    return &port->base;
}

uint32_t sn_port_registered(sn_port_t *handle) {
    sn_layer_t *port = sn__layer(handle);
    uint32_t n;
    if (sn__enter(&port->base) != 0)
        return 0;
    sn_mutex_lock(&port->lock);
    n = port->live_count;
    sn_mutex_unlock(&port->lock);
    sn__leave(&port->base);
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

int sn_port_post(sn_port_t *handle, uint64_t key) {
    sn_layer_t *port = sn__layer(handle);
    int err = sn__enter(&port->base);
    if (err != 0)
        return err;
    err = port->base.ops->post(&port->base, key);
    sn__leave(&port->base);
    return err;
}

int sn_port_check(sn_port_t *handle, uint64_t socket) {
    sn_layer_t *port = sn__layer(handle);
    int err = sn__enter(&port->base);
    if (err != 0)
        return err;
    err = port->base.ops->check(&port->base, socket);
    sn__leave(&port->base);
    return err;
}

uint32_t sn_port_counters(sn_port_t *handle, uint64_t *out, uint32_t n) {
    sn_layer_t *port = sn__layer(handle);
    uint64_t all[SN_COUNTERS];
    uint32_t i;
    if (n > SN_COUNTERS)
        n = SN_COUNTERS;
    for (i = 0; i < SN_COUNTERS; i++)
        all[i] = sn_atomic_load64(&port->base.counters[i]);
    if (port->base.ops->add_counters != NULL && sn__enter(&port->base) == 0) {
        port->base.ops->add_counters(&port->base, all);
        sn__leave(&port->base);
    }
    for (i = 0; i < n; i++)
        out[i] = all[i];
    return n;
}

/* Whether a removing record's REMOVE is still to be sent (no thread
   inside: close). */
static int sn__rec_unsent(const sn_layer_t *port, uint32_t recno) {
    uint32_t i;
    for (i = 0; i < port->unsent_count; i++)
        if (port->unsent_recnos[i] == recno)
            return sn__rec_removing(&port->records[recno]);
    return 0;
}

/* REMOVEs on close (SN_CAP_KEY_FIXED): a socket that outlives its port
   must not stay tied to the dead one, where the next port's registration
   would be refused ("a socket can be associated with only one completion
   port"). One register-only call, no wait; failures (sockets closed
   meanwhile) need nobody's attention. No thread is inside. */
static void sn__remove_all(sn_layer_t *port) {
    sn_registration_t *regs;
    uint32_t recno, n = 0, got = 0, dropped = 0;
    if (port->live_count == 0)
        return;
    regs = malloc((size_t)port->live_count * sizeof *regs);
    if (regs == NULL)
        return;
    for (recno = 0; recno < port->records_cap && n < port->live_count; recno++) {
        sn_record_t *record = &port->records[recno];
        /* live_count counts the records with an index entry: live and
           removing ones alike. A removing one's REMOVE went to the kernel
           already, unless a call that failed as a whole left it unsent
           (sn__prepare_unsent): those go too. */
        /* A socket closed since, its handle value perhaps another's:
           closesocket() ended the registration, and a REMOVE would reach
           the stranger's (sn__socket_gone). */
        if ((!sn__rec_live(record) && !sn__rec_unsent(port, recno)) ||
            (record->in_kernel && sn__socket_gone(port, record) != 0))
            continue;
        regs[n].socket = record->socket;
        regs[n].key = SN_KERNEL_KEY(recno, record->generation);
        regs[n].events = 0;
        regs[n].op = SN_OP_REMOVE;
        regs[n].trigger = 0;
        regs[n].result = 0;
        n++;
    }
    if (n != 0)
        port->base.ops->process(&port->base, regs, n, 0, NULL, 0, &got, &dropped);
    free(regs);
}

/* Release what the port owns besides its struct (no thread inside). */
static void sn__release(sn_layer_t *port, int inherited) {
    if (!inherited && (port->base.ops->caps & SN_CAP_KEY_FIXED))
        sn__remove_all(port);
    port->base.ops->close(&port->base, inherited);
    sn__table_free(port);
    sn__rearm_free(port);
    free(port->bound_events);
    port->bound_events = NULL;
    free(port->select_kregs);
    free(port->select_memos);
    port->select_kregs = NULL;
    port->select_memos = NULL;
    port->select_scratch_cap = 0;
    port->bound_changes = NULL;
    port->bound_out = NULL;
    sn_atomic_store(&port->base.closed, 1);
}

int sn_port_close(sn_port_t *handle) {
    sn_layer_t *port = sn__layer(handle);
    if (port == NULL)
        return 0;
    if (!sn_atomic_cas(&port->base.closing, 0, 1))
        return 0;                   /* closed, or being closed, already */
    if (sn__inherited(&port->base)) {
        /* The child of a fork: the parent's threads are not here, and the
           descriptions are shared with the parent. Close our copies. */
        sn__release(port, 1);
        return 0;
    }
    /* Waiters see `closing` when they wake; wake them until all are out.
       A late entrant sees `closing` and backs out on its own. */
    while (sn_atomic_load(&port->base.users) != 0) {
        port->base.ops->wake_all(&port->base);
        sn_sleep_ms(1);
    }
    sn__release(port, 0);
    return 0;
}

void sn_port_free(sn_port_t *handle) {
    sn_layer_t *port = sn__layer(handle);
    if (port == NULL)
        return;
    sn_port_close(handle);
    if (!sn_atomic_load(&port->base.closed) && !sn__inherited(&port->base)) {
        /* Closed by another thread that is still releasing: only the
           owner of the last reference calls us, so that thread is inside
           sn_port_close(); wait for it. */
        while (!sn_atomic_load(&port->base.closed))
            sn_sleep_ms(1);
    }
    sn_mutex_destroy(&port->lock);
    free(port);
}
