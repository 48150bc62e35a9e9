/*
 * sn_run.h -- one call on a port (sn_run.c) and the one conversion of a
 * timeout. Internal to the port's files; cffi never sees it.
 */
#ifndef SN_RUN_H
#define SN_RUN_H

#include "sn_call.h"

/* The one routine behind sn_port_process(), sn_port_change()
   and sn_port_select(): apply re-arms and changes, wait, translate; wait
   again for the time left while everything dequeued was dropped. The
   caller has entered the port; `timeout_ms` is already whole milliseconds
   (sn__wait_ms), SN_INFINITE or 0. */
int sn__run(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
            uint32_t count, int64_t timeout_ms, uint32_t max_events,
            sn_kevent_t *given_events, sn_sink_t *sink);

/* sn__run for the selector's usual call on an epoll-like backend (no
   change of the caller's, a handful of re-arms): 1 when it answered the
   call (*err set), 0 when sn__run must go on, for the time left in
   *timeout_ms (see sn_run.c). */
int sn__run_quick(sn_layer_t *port, int64_t *timeout_ms, sn_kevent_t *events,
                  uint32_t max_events, sn_sink_t *sink, int *err);

/* The longest wait asked of a backend: what fits the int of epoll_wait()
   and stays below the DWORD INFINITE of the Windows waits. */
#define SN_LONGEST_WAIT_MS  INT64_C(0x7FFFFFFF)

/* A timeout in milliseconds, as a double, turned into the whole
   milliseconds a backend waits: rounded UP, so that a wait never ends
   before the time asked (the stdlib selectors round up too: a loop woken
   before its timer is due would spin); negative waits forever; NaN and
   zero poll; clamped to SN_LONGEST_WAIT_MS. The one conversion of a
   timeout in the package: the Python side hands over seconds * 1000 as
   it is (turning it into an integer in Python, a float floor and an
   int() call, cost more than the rest of a timed wait's set-up). Inline:
   every select goes through it. */
SN_INLINE int64_t sn__wait_ms(double timeout_ms) {
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

#endif /* SN_RUN_H */
