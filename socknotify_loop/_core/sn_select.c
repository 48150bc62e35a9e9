/*
 * sn_select.c -- the selector's fast path: buffers lent once
 * (sn_port_bind), then one call per select (sn_port_select) that applies
 * the changes already written into them, re-arms what the last select
 * reported, waits, and writes (caller key, selector mask) pairs back.
 *
 * Why a path of its own: a selector's steady state is "re-arm what I
 * reported, wait, tell me what is ready", thousands of times a second.
 * Through sn_port_process() each select would pack its changes into fresh
 * memory, cross the FFI with them, and unpack notifications into Python
 * objects; here nothing but two integers crosses (the change count and the
 * timeout) and the answer is read from memory the caller owns, the masks
 * already computed as selectors.EpollSelector computes them.
 *
 * The hazards: the buffers belong to the caller and are written only
 * inside a select, so one thread selects at a time (`selecting`, a
 * compare-and-swap: a second one gets sn_error_busy(), never a torn
 * buffer), and a rebind waits for no select -- it fails as busy instead.
 * A change that failed must still reach its owner: it comes back as a
 * readiness pair with the full mask of its filter, as EPOLLERR would, and
 * the owner's next recv/send meets the error. A select cut short by a
 * signal with nothing to report returns the interruption, so that the
 * Python handler runs (PEP 475: the selector then waits for the time
 * left, handing it back here in milliseconds).
 *
 * Sources read: CPython's selectors.py (EpollSelector's masks, the
 * retry after a signal); Microsoft's article "Winsock socket state
 * notifications" (one call applies changes and dequeues); trio's
 * _io_epoll.py and _io_windows.py for what a loop asks of its I/O manager
 * per iteration.
 */
#include "sn_run.h"

#include <stdlib.h>
#include <string.h>

int sn_port_bind(sn_port_t *handle, sn_registration_t *changes, uint32_t changes_cap,
                 uint64_t *out, uint32_t out_cap) {
    sn_layer_t *port = sn__layer(handle);
    sn_kevent_t *events;
    int err;
    if ((err = sn__enter(&port->base)) != 0)
        return err;
    if (!sn_atomic_cas(&port->selecting, 0, 1)) {
        sn__leave(&port->base);
        return SN_ERROR_BUSY;
    }
    /* The kernel events of a select, translated into `out`: as many as
       `out` has pairs. Ours, so allocated here, once per bind. */
    events = malloc((size_t)(out_cap / 2 + 1) * sizeof *events);
    if (events == NULL) {
        sn_atomic_store(&port->selecting, 0);
        sn__leave(&port->base);
        return SN_ERROR_NO_MEMORY;
    }
    free(port->bound_events);
    port->bound_events = events;
    port->bound_changes = changes;
    port->bound_changes_cap = changes_cap;
    port->bound_out = out;
    port->bound_out_cap = out_cap;
    sn_atomic_store(&port->selecting, 0);
    sn__leave(&port->base);
    return 0;
}

int sn_port_select_posted(sn_port_t *handle) {
    sn_layer_t *port = sn__layer(handle);
    /* Written by the selecting thread only, read by it after its select. */
    return port->last_select_posted;
}

uint32_t sn_port_select_changes(sn_port_t *handle) {
    sn_layer_t *port = sn__layer(handle);
    /* Written by the selecting thread only, read by it after its select. */
    return port->last_select_count;
}

int64_t sn_port_select(sn_port_t *handle, uint32_t count, double timeout_ms) {
    sn_layer_t *port = sn__layer(handle);
    sn_sink_t sink;
    uint32_t i, max_events;
    int64_t wait_ms;
    int err;

    if ((err = sn__enter(&port->base)) != 0)
        return -(int64_t)err;
    if (!sn_atomic_cas(&port->selecting, 0, 1)) {
        sn__leave(&port->base);
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
    if (count != 0 ||
        !sn__run_quick(port, &wait_ms, port->bound_events, max_events, &sink, &err))
        err = sn__run(port, SN_PROCESS_REARM | SN_PROCESS_QUIET_REMOVE,
                      port->bound_changes, count, wait_ms, max_events,
                      port->bound_events, &sink);
    /* A change that failed: its owner hears of it as readiness, once (two
       ENABLEs of one registration in the select, merged into one, share
       their verdict: one pair). */
    for (i = 0; i < count; i++) {
        const sn_registration_t *reg = &port->bound_changes[i];
        uint64_t mask;
        uint32_t j;
        if (reg->result == 0 || reg->op != SN_OP_ENABLE)
            continue;
        mask = sn__select_mask(reg->events, SN_EVENT_ERR);
        for (j = 0; j < i && mask != 0; j++)
            if (port->bound_changes[j].key == reg->key && port->bound_changes[j].result != 0 &&
                port->bound_changes[j].op == SN_OP_ENABLE)
                mask = 0;
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
    port->last_select_posted = sink.posted;
    sn_atomic_store(&port->selecting, 0);
    sn__leave(&port->base);
    if (err != 0 && err != SN_ERROR_INTERRUPTED)
        return -(int64_t)err;
    if (err == SN_ERROR_INTERRUPTED && sink.n == 0 && sink.io == 0)
        return -(int64_t)err;
    /* The usual answer, one pair, travels in the return value itself: the
       caller then reads no buffer (an indexed read of it costs the Python
       caller more than the two integer operations that decode the answer). */
    if (sink.n == 1 && sink.io == 0 && port->bound_out[0] <= SN_SELECT_ONE_MAX_KEY &&
        port->bound_out[1] >= 1 && port->bound_out[1] <= 3)
        return (int64_t)((port->bound_out[0] << 2) | port->bound_out[1]);
    return ((int64_t)sink.n | ((int64_t)sink.io << 32)) << 2;
}

/* The entry points a loop calls every iteration, taking the port by its
   address: cffi converts an integer argument for less than a pointer, and
   a call of one argument (poll, block) builds no argument tuple. */
uintptr_t sn_port_address(sn_port_t *handle) {
    sn_layer_t *port = sn__layer(handle);
    return (uintptr_t)port;
}

int64_t sn_port_select_at(uintptr_t port, uint32_t count, double timeout_ms) {
    return sn_port_select((sn_port_t *)port, count, timeout_ms);
}

int64_t sn_port_poll_at(uintptr_t port) {
    return sn_port_select((sn_port_t *)port, 0, 0.0);
}

int64_t sn_port_block_at(uintptr_t port) {
    return sn_port_select((sn_port_t *)port, 0, -1.0);
}

int64_t sn_port_wait_at(uintptr_t port, double timeout_ms) {
    return sn_port_select((sn_port_t *)port, 0, timeout_ms);
}

int sn_port_change_at(uintptr_t port, uint64_t socket, uint64_t key, uint16_t events,
                      uint8_t op, uint8_t trigger) {
    return sn_port_change((sn_port_t *)port, socket, key, events, op, trigger);
}
