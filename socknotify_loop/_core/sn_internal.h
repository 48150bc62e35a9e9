/*
 * sn_internal.h -- what the portable port layer and the backends share:
 * the backend contract (sn_backend_ops_t), the part of the port a backend
 * sees (struct sn_port), kernel keys. The port layer's own part of the
 * port is in sn_layer.h, its records in sn_record.h: no backend includes
 * them. cffi never sees this file.
 *
 * Division of labour:
 *   port layer  owns the registration table: caller key <-> kernel key, the
 *               generation that makes stale notifications recognisable, the
 *               lock that lets several threads share one port, the life
 *               cycle (close, fork), and the retry of a wait whose packets
 *               it dropped ("wait again for the time left": sn__run, and
 *               nowhere else in the port code).
 *   backend     applies registrations whose .key is already the KERNEL key,
 *               waits once, and returns kernel events (sn_kevent_t) and how
 *               many packets it dropped itself. It behaves
 *               exactly like ProcessSocketNotifications: a successful
 *               SN_OP_REMOVE produces one SN_EVENT_REMOVE event for that key,
 *               one-shot registrations disarm after one delivery, packets
 *               posted with post() come back with posted = 1.
 *
 * The port layer's files, one concern each (each opens with its essay;
 * the small internal headers next to them carry what crosses files):
 *   sn_port.c       life cycle: open, enter/leave, close, fork, free; post,
 *                   check, counters, the OS handle
 *   sn_backends.c   the backend registry and queries, the error codes, the
 *                   raw calls where the OS has none
 *   sn_layer.h      the port layer's part of the port (sn_layer_t)
 *   sn_record.h     a record's states and its one function per transition
 *   sn_table.c/.h   records, their record numbers and generations, the
 *                   socket index
 *   sn_hash.c/.h    socket -> value, the core's one hash table (also the AFD
 *                   polyfill's, the PSN fallback set's, the strict model's)
 *   sn_translate.c/.h  a call's changes in (caller key -> kernel key, one
 *                   kernel key per socket) and its verdicts back
 *   sn_rearm.c/.h   the one-shot re-arm list and the deferred-ENABLE list
 *   sn_run.c/.h     one call: apply, wait, deliver, wait again; the one
 *                   timeout conversion (sn__wait_ms)
 *   sn_select.c     the selector's fast path (bind, select)
 *   sn_call.h       the memo and the sink a call's files share
 * The backends: sn_epoll.c (Linux); on Windows sn_iocp.c (the port on a
 * completion port, for psn, afd and strict) with sn_iocp_fn.c (which
 * function processes it), sn_iocp_buf.c (the buffers it keeps) and
 * sn_iocp_fallback.c (the refused sockets the polyfill serves), the
 * polyfill behind sn_afd.h (sn_afd*.c), the strict model (sn_model.c);
 * sn_platform*.c the few OS services the port needs.
 */
#ifndef SN_INTERNAL_H
#define SN_INTERNAL_H

#include "socknotify.h"
#include <stddef.h>

#include "sn_platform.h"
#include "sn_hash.h"

/* One event as the backend returns it. */
typedef struct sn_kevent {
    uint64_t key;      /* kernel key of a registration, or the posted key */
    uint32_t events;   /* SN_EVENT_* bits; 0 for a posted packet */
    uint32_t posted;   /* 1 when the packet came from post(), or is an I/O
                          completion (events == SN_EVENT_IO) */
} sn_kevent_t;

/* What tells a socket from another that later took its handle value,
   where the kernel does not (sn_backend_ops.identify): facts about a
   socket that never change once known. 0 in a field: not known (yet). */
typedef struct sn_identity {
    uint32_t peer;        /* a hash of a stream socket's peer address */
    uint16_t local_port;  /* the port it is bound to */
    uint16_t kind;        /* address family, type and protocol; 0: unread */
    /* 1 when the addresses were read: local_port 0 then means unbound.
       0 when they could not be (the OS would not say): local_port and peer
       are unknown, not "none". */
    uint8_t  addressed;
} sn_identity_t;

/* Everything that differs between backends, in one table. The port layer
   never asks which backend it runs on: it reads this. */
typedef struct sn_backend_ops {
    int id;             /* SN_BACKEND_* */
    int triggers;       /* SN_TRIGGER_* flags honoured faithfully */
    int caps;           /* SN_CAP_* */
    /* 1 if the backend can be opened here; a sentence saying why. */
    int (*available)(const char **why);
    /* Create the backend's state in port->impl. */
    int (*open)(sn_port_t *port);
    /* Apply regs[i] (with kernel keys) in order, filling regs[i].result,
       then wait ONCE, up to timeout_ms, for events. *dropped counts what
       the wait consumed and threw away itself (a wake-up already served
       by a sibling, a packet with a reserved key): the port layer, which
       owns "wait again for the time left", needs it to tell a wait that
       ended for nothing from one that timed out. Called WITHOUT the
       table lock held. */
    int (*process)(sn_port_t *port, sn_registration_t *regs, uint32_t count,
                   int64_t timeout_ms, sn_kevent_t *events, uint32_t max_events,
                   uint32_t *received, uint32_t *dropped);
    int (*post)(sn_port_t *port, uint64_t key);
    /* Make every thread waiting in process() return soon, and keep it so:
       called repeatedly by close() until they have all left. */
    void (*wake_all)(sn_port_t *port);
    /* Release the OS resources. `inherited`: the port was opened by the
       parent of this forked process; close this process's copies only,
       touching no state shared with the parent. */
    void (*close)(sn_port_t *port, int inherited);
    uint64_t (*os_handle)(sn_port_t *port);
    /* A cheap check that a socket can be registered (see sn_port_check). */
    int (*check)(sn_port_t *port, uint64_t socket);
    /* What the socket under this handle value is (sn_identity_t): 0, or
       the error that says it is no socket. NULL where the kernel itself
       refuses to renew a registration for a file that took a closed
       descriptor's number (epoll: EPOLL_CTL_MOD fails with ENOENT). */
    int (*identify)(sn_port_t *port, uint64_t socket, sn_identity_t *out);
    /* Add counts kept outside the port struct (the polyfill's own kernel
       calls) into out[SN_COUNTERS]; NULL when there are none. */
    void (*add_counters)(sn_port_t *port, uint64_t *out);
} sn_backend_ops_t;

/* Internal capability (beside the public SN_CAP_*): the backend's kernel
   keeps a socket's FIRST completion key until the REMOVE event of its
   registration has been dequeued (ProcessSocketNotifications: "to change
   completion keys, deregister the notification, wait for the
   SOCK_NOTIFY_EVENT_REMOVE message, and then re-register"). The port then
   never gives a live socket a new kernel key: see sn_translate.c, "One
   kernel key per socket". */
#define SN_CAP_KEY_FIXED 0x100

/* Internal capability: a DISABLE disarms the kernel's registration and
   leaves it in place (ProcessSocketNotifications: a later ENABLE renews
   it, under its first key), where epoll's DISABLE deletes the item. The
   port layer keeps `in_kernel` accordingly (sn_record.h), so that the
   ENABLE after a DISABLE makes the checks of a renewal. */
#define SN_CAP_DISABLE_KEEPS 0x200

/* A backend's verdict for a registration that was not applied, because a
   call that carried it failed as a whole ("the entire operation failed,
   and no changes occurred"): the bit, with that call's error in the low
   bits; SN_RESULT_UNAPPLIED (all ones) for every registration of a call
   the backend gave up on, whose error is the call's return value. The
   port layer keeps each such record as it was (unless the socket is gone
   meanwhile: then closesocket() ended its registration) and reports the
   error to the change's owner. */
#define SN_RESULT_UNAPPLIED_BIT 0x80000000u
#define SN_RESULT_UNAPPLIED 0xFFFFFFFFu
SN_INLINE uint32_t sn__unapplied(uint32_t error) {
    return SN_RESULT_UNAPPLIED_BIT | (error & 0x7FFFFFFEu);
}

/* Set by the port layer in a kernel registration's trigger (never by a
   caller: outside SN_TRIGGER_*): the registration is already in the
   kernel, so ENABLE must modify it and fail if the kernel no longer has
   it -- the descriptor was closed, and its number may name another file
   now, which must not inherit the old registration. Backends strip it. */
#define SN_TRIGGER_MODIFY_ONLY 0x80
/* Likewise in a kernel REMOVE: the caller asked for quiet removes, so the
   backend need not produce the REMOVE event at all (the port layer would
   drop it as stale). PSN produces it anyway; it is dropped. */
#define SN_TRIGGER_QUIET 0x40
/* Set on the port's own re-arms (SN_PROCESS_REARM): nobody waits to hear
   that one failed (its descriptor went away under its owner), so a failure
   must not turn the call's wait into a poll the way a caller's does. */
#define SN_TRIGGER_REARM 0x20
/* Set in an ENABLE when the port knows the kernel holds no item for the
   registration (a new record, or one disabled since): a backend whose
   change differs for a new item (epoll: ADD, not MOD) tries that first,
   so registering a socket costs one system call. */
#define SN_TRIGGER_ADD 0x10
#define SN_TRIGGER_INTERNAL \
    (SN_TRIGGER_MODIFY_ONLY | SN_TRIGGER_QUIET | SN_TRIGGER_REARM | SN_TRIGGER_ADD)

/* Whether a kernel registration's failure is news someone must hear now,
   so that the call that carries it does not block (sn_port_process(): "if
   a caller's change failed, the call does not block"): every change but
   the port's own re-arms (nobody waits to hear of those) and the quiet
   REMOVEs (whose caller asked to hear nothing of the removal: the
   registration is gone either way). */
SN_INLINE int sn__failure_is_news(const sn_registration_t *kreg) {
    return kreg->op != SN_OP_NONE && !(kreg->trigger & SN_TRIGGER_REARM) &&
           !(kreg->op == SN_OP_REMOVE && (kreg->trigger & SN_TRIGGER_QUIET));
}

/* ProcessSocketNotifications' rules for the trigger of an ENABLE, written
   once for the port layer (sn_translate.c) and the AFD polyfill (sn_afd.c),
   each of which answers in its own error codes: 0 for a valid trigger
   whose flags are all in `honoured`; SN_TRIGGER_VERDICT_INVALID for one
   with unknown bits, ONESHOT with PERSISTENT, LEVEL with EDGE, or neither
   LEVEL nor EDGE ("one of SOCK_NOTIFY_TRIGGER_LEVEL or
   SOCK_NOTIFY_TRIGGER_EDGE must be supplied"); SN_TRIGGER_VERDICT_UNSUPPORTED
   for a valid one that asks for what the backend cannot do. (port.py's
   Registration checks the unknown bits and the exclusive pairs when it is
   made, so that such a mistake raises ValueError, with its reason, at the
   line that made it; the rules here stay the authority, for whatever
   reaches the core, and answer in the registration's result.) */
enum { SN_TRIGGER_VERDICT_INVALID = 1, SN_TRIGGER_VERDICT_UNSUPPORTED = 2 };
#define SN_TRIGGER_ALL \
    (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE)
SN_INLINE int sn__trigger_verdict(unsigned trigger, unsigned honoured) {
    unsigned persistence = trigger & (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT);
    unsigned level = trigger & (SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE);
    if ((trigger & ~(unsigned)SN_TRIGGER_ALL) != 0 ||
        persistence == (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT) ||
        level == (SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE) || level == 0)
        return SN_TRIGGER_VERDICT_INVALID;
    if (trigger & ~honoured)
        return SN_TRIGGER_VERDICT_UNSUPPORTED;
    return 0;
}

/* The part of a port that every file sees, the backends included: the
   backend's table and state, the life cycle, the counters. The port
   layer's own part (its table of records, the re-arm and deferred lists,
   the selector's buffers) follows it in sn_layer_t (sn_layer.h), which no
   backend includes. */
struct sn_port {
    const sn_backend_ops_t *ops;
    void *impl;                 /* backend state */

    /* Life cycle, read without the lock (see sn_port.c, "Closing"). */
    volatile long users;        /* threads inside a call on this port */
    volatile long closing;      /* set once by sn_port_close() */
    volatile long closed;       /* OS resources released */
    unsigned long fork_generation;  /* sn_fork_generation() at open */

    /* Kernel calls made for this port (SN_COUNT_*). */
    volatile uint64_t counters[SN_COUNTERS];
};

/* Count one kernel call of kind `what` (relaxed: statistics only). */
#define SN_COUNT(port, what) sn_atomic_add64(&(port)->counters[what], 1)

/* The kernel key of a record number: the generation in the high half, so
   a reused record number never produces a key that an old notification
   could carry. Bit 63 is
   never set, which keeps the top of the key space free for the reserved
   keys (sn_keys.h), and generations start at 1, so no kernel key is 0:
   key 0 belongs to the packets RegisterWaitWithQueue posts (see sn_iocp.c). */
#define SN_KERNEL_KEY(recno, generation) \
    ((((uint64_t)(generation) & 0x7fffffffu) << 32) | (uint64_t)(recno))
#define SN_KEY_RECNO(key)       ((uint32_t)((key) & 0xffffffffu))
#define SN_KEY_GENERATION(key)  ((uint32_t)(((key) >> 32) & 0x7fffffffu))

#include "sn_keys.h"

/* The backends compiled on this platform, best first: the one place that
   says which backend is preferred. NULL-terminated. */
extern const sn_backend_ops_t *const sn_backends[];

#ifdef __linux__
extern const sn_backend_ops_t sn_epoll_ops;
#endif
#ifdef _WIN32
extern const sn_backend_ops_t sn_psn_ops;   /* the OS's ProcessSocketNotifications */
extern const sn_backend_ops_t sn_afd_ops;   /* the same port code on the polyfill */
#ifdef SN_TESTING
extern const sn_backend_ops_t sn_strict_ops; /* the strict model (sn_model.c), tests */
#endif
#endif

/* SN_BACKEND_STRICT's number, which a production build's header does not
   define: sn_backend_available() still answers for it, saying how to get
   it. */
#define SN_BACKEND_STRICT_NUMBER 4

/* The backend table of an SN_BACKEND_* id compiled here, or NULL
   (sn_backends.c). */
const sn_backend_ops_t *sn__ops_for(int backend);

/* Whether the port was opened by the parent of this forked process. */
SN_INLINE int sn__inherited(const sn_port_t *port) {
    return port->fork_generation != sn_fork_generation();
}

/* Count the caller in, unless the port is closing or inherited (sn_port.c,
   "Closing"). Inline: every entry point starts with it. */
SN_INLINE int sn__enter(sn_port_t *port) {
    sn_atomic_inc(&port->users);
    if (sn_atomic_load(&port->closing) || sn__inherited(port)) {
        sn_atomic_dec(&port->users);
        return SN_ERROR_CLOSED;
    }
    return 0;
}

SN_INLINE void sn__leave(sn_port_t *port) {
    sn_atomic_dec(&port->users);
}

/* The same, for entry points that live in a backend's file
   (sn_model_control, in a test build). */
int sn_port_enter(sn_port_t *port);
void sn_port_leave(sn_port_t *port);

#endif /* SN_INTERNAL_H */
