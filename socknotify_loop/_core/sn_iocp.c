/*
 * sn_iocp.c -- the notification port on a Windows I/O completion port.
 *
 * The OS model. Windows 11 and Server 2022 give readiness notifications a
 * home in the completion port itself: ProcessSocketNotifications (PSN)
 * applies a batch of registrations (socket, key, event filter, ENABLE /
 * DISABLE / REMOVE, LEVEL or EDGE, ONESHOT or PERSISTENT) and then dequeues
 * completion packets, in one kernel transition. A notification is a packet
 * whose lpCompletionKey is the registration's key and whose
 * dwNumberOfBytesTransferred holds the SOCK_NOTIFY_EVENT_* mask; anything
 * posted with PostQueuedCompletionStatus comes out of the same call. Where
 * PSN is missing (Windows 10, Server 2019, Wine) sn_afd.c provides a
 * function with the same signature and contract, built on IOCTL_AFD_POLL.
 * This file is the port code for both: one completion port, and one
 * pointer saying which of the two functions processes it. That is the whole
 * difference between the "psn" and "afd" backends.
 *
 * The hazards, and so why the code is the way it is:
 *   - PSN is not in mingw-w64 10's headers, and not in ws2_32 before
 *     Windows 11. Its types are declared in sn_win.h (layout checked below
 *     against the SDK's x64 offsets) and the function is looked up at run
 *     time, so the extension still loads where it is missing and the afd
 *     backend takes over.
 *   - The kernel gives back whatever key was registered, 64 bits wide. The
 *     port layer (sn_table.c) never registers keys with bit 63 set, so that
 *     half of the key space is ours (the table is sn_keys.h):
 *     SN_POST_COMPLETION_KEY marks packets of sn_port_post(), whose caller
 *     key travels in lpOverlapped (a packet posted through the port is
 *     never an OVERLAPPED the kernel touches, so the pointer-sized field is
 *     free to carry a number); SN_CLOSE_COMPLETION_KEY wakes waiters when
 *     the port closes; SN_AFD_COMPLETION_KEY marks the polyfill's internal
 *     packets, which it consumes before they reach us.
 *   - PSN applies the batch and waits in one kernel transition, so a
 *     registration the kernel refuses cannot shorten that wait, and the
 *     kernel refuses more than bad handles: sockets of layered providers,
 *     sockets tied to another completion port. The selector asks
 *     sn_port_check() (is it an open socket?) at register() time and the
 *     port layer refuses bad arguments before the call; a batch that
 *     brings a caller's ENABLE (a new socket's, or a modify: either may be
 *     refused) is applied in a call of its own before the wait, and a
 *     call that fails as a whole is taken apart registration by
 *     registration (iocp__isolate); a socket the OS refuses while it is
 *     still open is served
 *     by the polyfill on the same port (sn_iocp_fallback.c). What
 *     remains is a socket closed between register() and the next select;
 *     its failure is reported when the call returns. (The polyfill, which
 *     applies before it waits, turns its wait into a poll when a
 *     registration failed.)
 *   - One kernel key per socket until its REMOVE event is dequeued, and a
 *     call that fails applies nothing: the backends say so to the port
 *     layer (SN_CAP_KEY_FIXED, SN_RESULT_UNAPPLIED_BIT), which keeps every
 *     record accordingly; the strict backend (sn_model.c) enforces both
 *     in tests.
 *   - PSN's and our structures have the same field order but not the same
 *     types (a SOCKET and a PVOID against two uint64_t on x64, and our
 *     result field is .result, theirs .registrationResult): every field is
 *     converted explicitly, never by casting one array to the other.
 *   - "Nothing arrived in time" is WAIT_TIMEOUT (258) in the SDK headers
 *     and ERROR_TIMEOUT (1460) on one documentation page: both are a
 *     timeout, not a failure. Registration results are valid either way.
 *   - The timeout is a UINT32 whose maximum means INFINITE: the port's own
 *     SN_INFINITE maps to it, and finite waits are clamped just below it,
 *     so a long but finite timeout never turns into forever.
 *
 * One port for everything: pipes and subprocesses issue overlapped I/O on
 * the same completion port. Their handles are associated under
 * SN_IO_COMPLETION_KEY, so their completions come back with that key and
 * lpOverlapped pointing at the OVERLAPPED that finished; they leave here as
 * SN_EVENT_IO events keyed by that address, and the Python side (which owns
 * the OVERLAPPED objects) reads bytes and status from them. Process-exit
 * waits use RegisterWaitWithQueue, which posts with completion key 0; the
 * port layer never issues kernel key 0 (generations start at 1), so key 0
 * means the same thing. Any other reserved key is dropped.
 *
 * The port's other pieces, one file each: which function processes a port
 * -- the OS's, the polyfill's or the strict model's -- and the bare calls
 * of each without a port (sn_iocp_fn.c); the buffers a port keeps for the
 * batches that do not fit on the stack (sn_iocp_buf.c); the sockets the
 * port's own function refused, which the polyfill serves on the same port
 * (sn_iocp_fallback.c). The strict model, its backend's table and its
 * controls are sn_model.c's, compiled into test builds only: nothing here
 * knows of it. This file is the port and the operations tables of psn and
 * afd: open, the one call, post, wake, close.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and its C samples, the learn.microsoft.com pages for
 * ProcessSocketNotifications, SOCK_NOTIFY_REGISTRATION and
 * GetQueuedCompletionStatusEx, and windows-sys for the SDK's layout.
 */
#ifdef _WIN32

#include "sn_afd.h"
#include "sn_iocp_fn.h"
#include "sn_iocp_buf.h"
#include "sn_iocp_fallback.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The SDK's 64-bit layout (x64 and ARM64 alike), which the kernel reads:
   checked, not assumed, on every Windows build (sn_win.h refuses 32-bit
   Windows outright, so these can never be compiled out). */
_Static_assert(sizeof(void *) == 8 && sizeof(ULONG_PTR) == 8 && sizeof(SOCKET) == 8,
               "64-bit pointers, completion keys and sockets");
_Static_assert(sizeof(((OVERLAPPED_ENTRY *)0)->lpCompletionKey) == sizeof(uint64_t),
               "a completion key carries a 64-bit kernel key");
_Static_assert(sizeof(SOCK_NOTIFY_REGISTRATION) == 24, "SOCK_NOTIFY_REGISTRATION size");
_Static_assert(offsetof(SOCK_NOTIFY_REGISTRATION, socket) == 0, "socket offset");
_Static_assert(offsetof(SOCK_NOTIFY_REGISTRATION, completionKey) == 8, "completionKey offset");
_Static_assert(offsetof(SOCK_NOTIFY_REGISTRATION, eventFilter) == 16, "eventFilter offset");
_Static_assert(offsetof(SOCK_NOTIFY_REGISTRATION, operation) == 18, "operation offset");
_Static_assert(offsetof(SOCK_NOTIFY_REGISTRATION, triggerFlags) == 19, "triggerFlags offset");
_Static_assert(offsetof(SOCK_NOTIFY_REGISTRATION, registrationResult) == 20,
               "registrationResult offset");
_Static_assert(sizeof(OVERLAPPED_ENTRY) == 32, "OVERLAPPED_ENTRY size");

/* Our constants are PSN's values (socknotify.h says so; keep it true). */
_Static_assert(SN_EVENT_IN == SOCK_NOTIFY_EVENT_IN && SN_EVENT_OUT == SOCK_NOTIFY_EVENT_OUT &&
               SN_EVENT_HANGUP == SOCK_NOTIFY_EVENT_HANGUP &&
               SN_EVENT_ERR == SOCK_NOTIFY_EVENT_ERR &&
               SN_EVENT_REMOVE == SOCK_NOTIFY_EVENT_REMOVE, "event values");
_Static_assert(SN_OP_ENABLE == SOCK_NOTIFY_OP_ENABLE && SN_OP_DISABLE == SOCK_NOTIFY_OP_DISABLE &&
               SN_OP_REMOVE == SOCK_NOTIFY_OP_REMOVE, "operation values");
_Static_assert(SN_TRIGGER_ONESHOT == SOCK_NOTIFY_TRIGGER_ONESHOT &&
               SN_TRIGGER_PERSISTENT == SOCK_NOTIFY_TRIGGER_PERSISTENT &&
               SN_TRIGGER_LEVEL == SOCK_NOTIFY_TRIGGER_LEVEL &&
               SN_TRIGGER_EDGE == SOCK_NOTIFY_TRIGGER_EDGE, "trigger values");

/* Batches this small translate on the stack; larger ones use one of the
   port's buffers (sn_iocp_buf.c). */
#define IOCP_STACK_REGS 32
#define IOCP_STACK_ENTRIES 128
/* The first part of a wait whose call carries the port's own re-arms
   (ms): see iocp__apply_and_wait. */
#define IOCP_REARM_WAIT_MS 10

/* ----------------------------------------------------------------- the port */

typedef struct iocp_port {
    HANDLE iocp;
    const iocp_function_t *fn;  /* the function that processes it (sn_iocp_fn.h) */
    /* Sockets the port's own function refused and the polyfill serves
       instead (sn_iocp_fallback.c). */
    iocp_fallbacks_t fallbacks;
    /* Room for the batches that do not fit on the stack (sn_iocp_buf.c). */
    iocp_buffers_t buffers;
} iocp_port_t;

int sn_iocp_open(sn_port_t *port, const iocp_function_t *fn) {
    iocp_port_t *ip;
    DWORD error;

    ip = calloc(1, sizeof *ip);
    if (ip == NULL)
        return SN_ERROR_NO_MEMORY;
    /* Concurrency 0: as many running threads as processors. */
    ip->iocp = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    if (ip->iocp == NULL)
        goto err1;
    ip->fn = fn;
    sn_iocp_fallback_init(&ip->fallbacks);
    sn_iocp_buf_init(&ip->buffers);
    port->impl = ip;
    return 0;

err1:
    error = GetLastError();
    free(ip);
    return (int)error;
}

static int iocp__open_psn(sn_port_t *port) {
    const iocp_function_t *psn = sn_iocp_function(SN_BACKEND_PSN);
    if (psn == NULL)
        return SN_ERROR_NOT_SUPPORTED;
    return sn_iocp_open(port, psn);
}

static int iocp__open_afd(sn_port_t *port) {
    return sn_iocp_open(port, sn_iocp_function(SN_BACKEND_AFD));
}

/* sn_port's timeout (ms, SN_INFINITE for ever) as PSN's UINT32. */
static UINT32 iocp__timeout(int64_t timeout_ms) {
    if (timeout_ms < 0)
        return INFINITE;
    if (timeout_ms >= (int64_t)INFINITE)
        return INFINITE - 1;   /* finite stays finite */
    return (UINT32)timeout_ms;
}

/* One dequeued packet as a kernel event. Returns 0 for a packet to drop.
   `emulated`: the port's function is ours (the polyfill or the strict
   model), whose notifications are known to carry no OVERLAPPED. */
static int iocp__kevent(const OVERLAPPED_ENTRY *entry, sn_kevent_t *out, int emulated) {
    uint64_t key = (uint64_t)entry->lpCompletionKey;
    if (key == SN_POST_COMPLETION_KEY) {
        /* sn_port_post(): the caller's key rides in lpOverlapped. */
        out->key = (uint64_t)(uintptr_t)entry->lpOverlapped;
        out->events = 0;
        out->posted = 1;
        return 1;
    }
    if (key == SN_IO_COMPLETION_KEY || key == 0) {
        /* An overlapped completion: the OVERLAPPED's address identifies it;
           its owner reads the result from the OVERLAPPED itself. */
        out->key = (uint64_t)(uintptr_t)entry->lpOverlapped;
        out->events = SN_EVENT_IO;
        out->posted = 1;
        return 1;
    }
    if (key & SN_RESERVED_KEY_BIT) {
        /* SN_CLOSE_COMPLETION_KEY (the waiter sees the port closing), or a
           reserved key nobody here issued. */
        return 0;
    }
    if (entry->lpOverlapped != NULL && emulated) {
        /* Under a registration's key, yet with an OVERLAPPED: not one of
           our emulations' notifications (they carry none) but the
           completion of overlapped I/O that someone issued on a socket the
           strict model associated with this port when it was registered,
           as the OS does ("associates a set of sockets with a completion
           port"; an association outlives the registration: the handle
           "remains associated with that I/O completion port until it is
           closed"). Its byte count is no event mask: dropped.
           On the OS's own function the packet is kept. Its reference page
           calls a notification's lpOverlapped reserved, and likens the
           notifications to a job object's, whose packets do fill that
           field: nothing promises it is NULL. Dropping a real notification
           would leave its registration deaf for good, while a completion
           read as events is at worst a spurious readiness, which asyncio
           copes with (its level-triggered re-arm looks again). The
           probe's question "a notification's lpOverlapped" settles it. */
        return 0;
    }
    /* A notification: the registration's (kernel) key and its events. */
    out->key = key;
    out->events = entry->dwNumberOfBytesTransferred;
    out->posted = 0;
    return 1;
}

static int iocp__whole_call_failed(DWORD rc) {
    return rc != ERROR_SUCCESS && rc != WAIT_TIMEOUT && rc != ERROR_TIMEOUT;
}

/* A modify the OS refused, of a registration it holds (the port layer
   says so: SN_TRIGGER_MODIFY_ONLY): perhaps because it is armed, which the
   reference page may forbid ("Notifications must not be re-enabled until
   the SOCK_NOTIFY_EVENT_DISABLE notification is received"). So once more,
   after a DISABLE (with the ENABLE's trigger, which DISABLE may need too),
   in one call that does not wait. Returns the ENABLE's new verdict. */
static DWORD iocp__reenable(sn_port_t *port, iocp_port_t *ip,
                            const SOCK_NOTIFY_REGISTRATION *kreg) {
    SOCK_NOTIFY_REGISTRATION two[2];
    DWORD rc;
    two[0] = *kreg;
    two[0].operation = SOCK_NOTIFY_OP_DISABLE;
    two[0].triggerFlags = (UINT8)(kreg->triggerFlags &
                                  (SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE));
    two[0].registrationResult = ERROR_SUCCESS;
    two[1] = *kreg;
    two[1].registrationResult = ERROR_SUCCESS;
    SN_COUNT(port, SN_COUNT_WAITS);
    rc = ip->fn->process(ip->iocp, 2, two, 0, 0, NULL, NULL);
    if (iocp__whole_call_failed(rc))
        return kreg->registrationResult;
    return two[1].registrationResult;
}

/* The OS function's verdicts back into the caller's records: a refused
   modify tried once more after a DISABLE (iocp__reenable; *reenabled
   counts those it saved), refusals the polyfill can make good handed to
   it (sn_iocp_fallback.c). `routed` marks the registrations the polyfill
   applied already. Returns 1 if a change whose failure is news
   (sn__failure_is_news) is still refused. */
static int iocp__verdicts(sn_port_t *port, iocp_port_t *ip, sn_registration_t *regs,
                          SOCK_NOTIFY_REGISTRATION *kregs, const uint8_t *routed,
                          uint32_t count, int *reenabled) {
    uint32_t i;
    int refused = 0;
    for (i = 0; i < count; i++) {
        if (routed[i])
            continue;
        if (kregs[i].registrationResult & SN_RESULT_UNAPPLIED_BIT) {
            /* Not applied (iocp__isolate): nothing to try again or hand
               over; the port layer keeps the registration as it was. */
            regs[i].result = (uint32_t)kregs[i].registrationResult;
            refused |= sn__failure_is_news(&regs[i]);
            continue;
        }
        if (!ip->fn->polyfill && kregs[i].registrationResult != ERROR_SUCCESS &&
            kregs[i].registrationResult != WSAENOTSOCK && regs[i].op == SN_OP_ENABLE &&
            (regs[i].trigger & SN_TRIGGER_MODIFY_ONLY) &&
            iocp__reenable(port, ip, &kregs[i]) == ERROR_SUCCESS) {
            kregs[i].registrationResult = ERROR_SUCCESS;
            (*reenabled)++;
        }
        if (!ip->fn->polyfill && sn_iocp_fallback_take(&ip->fallbacks, ip->iocp, &kregs[i]))
            SN_COUNT(port, SN_COUNT_FALLBACKS);
        regs[i].result = (uint32_t)kregs[i].registrationResult;
        if (regs[i].result != 0 && sn__failure_is_news(&regs[i]))
            refused = 1;
    }
    return refused;
}

/* A call that failed as a whole ("the entire operation failed, and no
   changes occurred"), for a reason that may not go away: the article's
   threaded sample says the call "can fail ... due to invalid input such
   as a bad handle", and asyncio routinely queues a REMOVE for a socket
   its owner has closed already. Sent again as it was, the batch would
   fail again at every call, and the loop with it. So each registration
   is applied alone, without waiting: those the OS takes are applied,
   and one that fails a call of its own was not applied either: it is
   marked so (sn__unapplied: the port layer keeps its record as it was,
   unless the socket is gone, and its owner alone hears that call's
   error: retiring the record instead would leave the kernel's
   registration live under a key nothing reports). If every one fails alone
   and a call with no registration at all fails too, the fault is the
   port's, not a registration's: nothing was applied (SN_RESULT_UNAPPLIED,
   as before) and the error is returned. Returns 0 when the batch is
   settled, *refused set if a change whose failure is news still failed. */
static int iocp__isolate(sn_port_t *port, iocp_port_t *ip, sn_registration_t *regs,
                         SOCK_NOTIFY_REGISTRATION *kregs, const uint8_t *routed,
                         uint32_t count, DWORD rc, int *refused) {
    uint32_t i, tried = 0, failed = 0;
    int reenabled = 0;
    DWORD one;
    for (i = 0; i < count; i++) {
        if (routed[i] || kregs[i].operation == SOCK_NOTIFY_OP_NONE)
            continue;
        tried++;
        SN_COUNT(port, SN_COUNT_WAITS);
        kregs[i].registrationResult = ERROR_SUCCESS;
        one = ip->fn->process(ip->iocp, 1, &kregs[i], 0, 0, NULL, NULL);
        if (iocp__whole_call_failed(one)) {
            /* Its own call failed as a whole: it changed nothing either. */
            kregs[i].registrationResult = sn__unapplied(one);
            failed++;
        }
    }
    if (tried != 0 && failed == tried) {
        SN_COUNT(port, SN_COUNT_WAITS);
        if (iocp__whole_call_failed(ip->fn->process(ip->iocp, 0, NULL, 0, 0, NULL, NULL))) {
            for (i = 0; i < count; i++)
                if (!routed[i])
                    regs[i].result = SN_RESULT_UNAPPLIED;
            return (int)rc;
        }
    }
    *refused = iocp__verdicts(port, ip, regs, kregs, routed, count, &reenabled);
    return 0;
}

/* The caller's registrations as the kernel's (the port's function's), and
   where each goes: a socket the polyfill serves has its change applied
   there now (`routed`), its verdict read at once, and the wait turned
   into a poll (*timeout_ms 0) when that verdict is news; *rearms is set
   when the batch carries the port's own re-arms. Returns 1 if a change
   whose failure its owner must hear before any wait is in the batch. */
static int iocp__translate(iocp_port_t *ip, sn_registration_t *regs,
                           SOCK_NOTIFY_REGISTRATION *kregs, uint8_t *routed, uint32_t count,
                           int64_t *timeout_ms, int *rearms) {
    uint32_t i;
    DWORD result;
    int verdict_first = 0;
    for (i = 0; i < count; i++) {
        kregs[i].socket = (SOCKET)regs[i].socket;
        kregs[i].completionKey = (PVOID)(uintptr_t)regs[i].key;
        kregs[i].eventFilter = regs[i].events;
        kregs[i].operation = regs[i].op;
        /* The kernel (or the polyfill) tracks registrations itself. */
        kregs[i].triggerFlags = regs[i].trigger & (UINT8)~SN_TRIGGER_INTERNAL;
        kregs[i].registrationResult = ERROR_SUCCESS;
        routed[i] = 0;
        if (regs[i].op == SN_OP_NONE)
            continue;
        if (!ip->fn->polyfill &&
            sn_iocp_fallback_route(&ip->fallbacks, ip->iocp, &kregs[i], &result)) {
            /* A socket the polyfill serves: every change went there. */
            regs[i].result = (uint32_t)result;
            routed[i] = 1;
            if (result != 0 && sn__failure_is_news(&regs[i]))
                *timeout_ms = 0;
        } else if (regs[i].op == SN_OP_ENABLE && (regs[i].trigger & SN_TRIGGER_REARM)) {
            if (!ip->fn->polyfill)
                *rearms = 1;
        } else if (sn__failure_is_news(&regs[i]) &&
                   (regs[i].op != SN_OP_ENABLE || !ip->fn->polyfill)) {
            /* A change whose failure its owner must hear before any wait:
               not only a socket's first ENABLE may be refused, a modify of
               a registration the OS holds (add_writer on a socket
               registered for reading) may be too, and a DISABLE or a
               REMOVE that is not quiet. (The polyfill, which applies
               before it waits, shortens its own wait for an ENABLE it
               refuses.) */
            verdict_first = 1;
        }
    }
    return verdict_first;
}

/* A caller's change may be refused: the batch applied in a call of its
   own that does not wait, so that its owner hears of a refusal before the
   wait (*timeout_ms turned to 0: a poll). Returns the error of a port
   that fails (iocp__isolate), else 0. */
static int iocp__apply_first(sn_port_t *port, iocp_port_t *ip, sn_registration_t *regs,
                             SOCK_NOTIFY_REGISTRATION *kregs, const uint8_t *routed,
                             uint32_t count, int64_t *timeout_ms) {
    DWORD rc;
    int err, refused = 0, reenabled = 0;
    SN_COUNT(port, SN_COUNT_WAITS);
    rc = ip->fn->process(ip->iocp, count, kregs, 0, 0, NULL, NULL);
    if (iocp__whole_call_failed(rc)) {
        /* "The entire operation failed, and no changes occurred": find
           the registration that makes it fail. */
        if ((err = iocp__isolate(port, ip, regs, kregs, routed, count, rc, &refused)) != 0)
            return err;
        if (refused)
            *timeout_ms = 0;
    } else if (iocp__verdicts(port, ip, regs, kregs, routed, count, &reenabled)) {
        *timeout_ms = 0;
    }
    return 0;
}

/* THE call: registrations (the caller's, then re-arms) and the wait, in one.
   Returns the call's status; *got is how many entries it dequeued.
   The OS may refuse a re-arm too (nothing promises it takes every
   ENABLE of a registration it holds), and a refusal is known only
   after the call's wait; the polyfill that takes the socket over then
   cannot shorten a wait that is over. Applying the re-arms in a call
   of their own first would cost a kernel transition at every wait
   that follows a delivery. So such a wait is cut in two: the call that
   carries the re-arms waits IOCP_REARM_WAIT_MS at most (*split set, and
   *deadline for a finite wait), then a call with nothing to apply waits
   for the time left (sn_iocp_process). A loop with work pays nothing (its
   events end the first part); an idle one, one more wake-up per wait; a
   refused re-arm, at most that much delay. */
static DWORD iocp__apply_and_wait(sn_port_t *port, iocp_port_t *ip,
                                  SOCK_NOTIFY_REGISTRATION *kregs, uint32_t count,
                                  int64_t timeout_ms, int rearms, uint32_t max_events,
                                  OVERLAPPED_ENTRY *entries, UINT32 *got, int *split,
                                  int64_t *deadline) {
    UINT32 wait = iocp__timeout(timeout_ms);
    if (rearms && count != 0 && !ip->fn->polyfill && max_events != 0 &&
        (timeout_ms < 0 || timeout_ms > IOCP_REARM_WAIT_MS)) {
        if (timeout_ms > 0)
            *deadline = sn_deadline(timeout_ms);
        wait = IOCP_REARM_WAIT_MS;
        *split = 1;
    }
    SN_COUNT(port, SN_COUNT_WAITS);
    if (max_events == 0) {
        /* PSN's rule: no room for entries means no wait at all. */
        return ip->fn->process(ip->iocp, count, count ? kregs : NULL, 0, 0, NULL, NULL);
    }
    return ip->fn->process(ip->iocp, count, count ? kregs : NULL, wait, max_events, entries,
                           got);
}

/* The verdicts of THE call that carried registrations (`count` of them),
   whose status is *rc: read back into the caller's records, or, if the
   call failed as a whole, found registration by registration and the
   wait made again. *rc and *got become those of the last wait; *split is
   cleared when that wait was the whole of it. Returns the error of a
   port that fails (iocp__isolate), else 0. */
static int iocp__wait_verdicts(sn_port_t *port, iocp_port_t *ip, sn_registration_t *regs,
                               SOCK_NOTIFY_REGISTRATION *kregs, const uint8_t *routed,
                               uint32_t count, int64_t timeout_ms, uint32_t max_events,
                               OVERLAPPED_ENTRY *entries, DWORD *rc, UINT32 *got, int *split) {
    int err, refused = 0, reenabled = 0;
    if (iocp__whole_call_failed(*rc)) {
        /* Nothing was applied, nor waited for: each registration
           alone, then (unless the port itself fails: the port layer
           keeps every record as it was, SN_RESULT_UNAPPLIED, and the
           call fails) a poll for what is at hand. The caller then
           hears at once of the change that failed. */
        if ((err = iocp__isolate(port, ip, regs, kregs, routed, count, *rc, &refused)) != 0)
            return err;
        *split = 0;    /* the wait below is the whole of it */
        SN_COUNT(port, SN_COUNT_WAITS);
        *rc = max_events == 0
                  ? ip->fn->process(ip->iocp, 0, NULL, 0, 0, NULL, NULL)
                  : ip->fn->process(ip->iocp, 0, NULL, refused ? 0 : iocp__timeout(timeout_ms),
                                    max_events, entries, got);
        return 0;
    }
    iocp__verdicts(port, ip, regs, kregs, routed, count, &reenabled);
    if (reenabled && max_events > *got &&
        (*rc == ERROR_SUCCESS || *rc == WAIT_TIMEOUT || *rc == ERROR_TIMEOUT)) {
        /* A modify applied only after this call dequeued: what it
           asks for may be at hand already, so look once more. */
        UINT32 more = 0;
        SN_COUNT(port, SN_COUNT_WAITS);
        if (ip->fn->process(ip->iocp, 0, NULL, 0, max_events - *got, entries + *got,
                            &more) == ERROR_SUCCESS && more != 0) {
            *got += more;
            *rc = ERROR_SUCCESS;
        }
    }
    return 0;
}

/* The `got` dequeued entries as kernel events: the polyfill's own packets
   taken out first, then every packet that is no event dropped (*dropped
   counts both, *received the events). */
static void iocp__deliver(iocp_port_t *ip, OVERLAPPED_ENTRY *entries, UINT32 got,
                          sn_kevent_t *events, uint32_t *received, uint32_t *dropped) {
    UINT32 j;
    if (!ip->fn->polyfill) {
        /* The polyfill's packets came out of the OS's wait: its own. (The
           strict model's wait leaves them to this line too, as the OS's
           does: its own registrations live in an instance of the
           polyfill's state apart from the fallback's.) */
        UINT32 left = (UINT32)sn_iocp_fallback_translate(&ip->fallbacks, ip->iocp,
                                                         entries, got);
        *dropped += got - left;
        got = left;
    }
    for (j = 0; j < got; j++) {
        if (iocp__kevent(&entries[j], &events[*received], ip->fn->emulated))
            (*received)++;
        else
            (*dropped)++;
    }
}

int sn_iocp_process(sn_port_t *port, sn_registration_t *regs, uint32_t count,
                         int64_t timeout_ms, sn_kevent_t *events, uint32_t max_events,
                         uint32_t *received, uint32_t *dropped) {
    iocp_port_t *ip = port->impl;
    SOCK_NOTIFY_REGISTRATION stack_regs[IOCP_STACK_REGS];
    OVERLAPPED_ENTRY stack_entries[IOCP_STACK_ENTRIES];
    uint8_t stack_routed[IOCP_STACK_REGS];
    SOCK_NOTIFY_REGISTRATION *kregs = stack_regs;
    OVERLAPPED_ENTRY *entries = stack_entries;
    uint8_t *routed = stack_routed;
    iocp_buffer_t *buf = NULL;
    UINT32 got = 0;
    DWORD rc;
    int err = 0, verdict_first, rearms = 0, split = 0;
    int64_t deadline = 0;

    *received = 0;
    *dropped = 0;
    if (count > IOCP_STACK_REGS || max_events > IOCP_STACK_ENTRIES) {
        buf = sn_iocp_buf_take(&ip->buffers, count > IOCP_STACK_REGS ? count : 0,
                               max_events > IOCP_STACK_ENTRIES ? max_events : 0);
        if (buf == NULL)
            return SN_ERROR_NO_MEMORY;
        if (count > IOCP_STACK_REGS) {
            kregs = buf->regs;
            routed = buf->routed;
        }
        if (max_events > IOCP_STACK_ENTRIES)
            entries = buf->entries;
    }
    verdict_first = iocp__translate(ip, regs, kregs, routed, count, &timeout_ms, &rearms);

    if (verdict_first && max_events != 0 && timeout_ms != 0) {
        /* A caller's change may be refused: hear it before waiting. */
        if ((err = iocp__apply_first(port, ip, regs, kregs, routed, count, &timeout_ms)) != 0)
            goto out;
        count = 0;
    }

    rc = iocp__apply_and_wait(port, ip, kregs, count, timeout_ms, rearms, max_events, entries,
                              &got, &split, &deadline);
    if (count != 0 &&
        (err = iocp__wait_verdicts(port, ip, regs, kregs, routed, count, timeout_ms, max_events,
                                   entries, &rc, &got, &split)) != 0)
        goto out;
    if (split && got == 0 && (rc == WAIT_TIMEOUT || rc == ERROR_TIMEOUT)) {
        /* The rest of a wait cut in two (iocp__apply_and_wait), with every
           verdict known and a refused re-arm's socket in the polyfill's
           care. */
        int64_t left = timeout_ms < 0 ? -1 : sn_time_left(deadline);
        if (left != 0) {
            SN_COUNT(port, SN_COUNT_WAITS);
            rc = ip->fn->process(ip->iocp, 0, NULL, iocp__timeout(left), max_events, entries,
                             &got);
        }
    }
    if (rc == WAIT_TIMEOUT || rc == ERROR_TIMEOUT)
        goto out;        /* *received stays 0 */
    if (rc != ERROR_SUCCESS) {
        err = (int)rc;
        goto out;
    }
    iocp__deliver(ip, entries, got, events, received, dropped);
out:
    if (buf != NULL)
        sn_iocp_buf_give(&ip->buffers, buf);
    return err;
}

int sn_iocp_post(sn_port_t *port, uint64_t key) {
    iocp_port_t *ip = port->impl;
    SN_COUNT(port, SN_COUNT_WAKES);
    /* lpOverlapped carries the key; the kernel never dereferences a posted
       packet's OVERLAPPED, it only hands the pointer back. */
    if (!PostQueuedCompletionStatus(ip->iocp, 0, (ULONG_PTR)SN_POST_COMPLETION_KEY,
                                    (LPOVERLAPPED)(uintptr_t)key))
        return (int)GetLastError();
    return 0;
}

void sn_iocp_wake_all(sn_port_t *port) {
    iocp_port_t *ip = port->impl;
    /* One packet wakes one waiter, and a waiter may take several: close()
       calls this every millisecond until every waiter has left. Leftover
       packets die with the port. */
    SN_COUNT(port, SN_COUNT_WAKES);
    PostQueuedCompletionStatus(ip->iocp, 0, (ULONG_PTR)SN_CLOSE_COMPLETION_KEY, NULL);
}

void sn_iocp_close(sn_port_t *port, int inherited) {
    iocp_port_t *ip = port->impl;
    (void)inherited;   /* no fork on Windows */
    if (ip == NULL)
        return;
    /* The polyfill's polls write into its memory until they complete on
       this port: it cancels them and drains their completions while the
       port still exists, then closes its helpers (see sn_afd_port_closed).
       Only then may the port go. PSN registrations end with the port. */
    if (ip->fn->closed != NULL)
        ip->fn->closed(ip->iocp);
    if (ip->fn->on_polyfill || sn_iocp_fallback_used(&ip->fallbacks))
        sn_afd_port_closed(ip->iocp);
    CloseHandle(ip->iocp);
    /* No thread is inside process() any more (sn_port_close waited for
       them), so every buffer is back in the pool. */
    sn_iocp_buf_free_all(&ip->buffers);
    sn_iocp_fallback_free(&ip->fallbacks);
    free(ip);
    port->impl = NULL;
}

uint64_t sn_iocp_os_handle(sn_port_t *port) {
    return (uint64_t)(uintptr_t)((iocp_port_t *)port->impl)->iocp;
}

int sn_iocp_check(sn_port_t *port, uint64_t socket) {
    int type = 0, len = sizeof type;
    (void)port;
    /* What PSN and the polyfill refuse a registration for: a value that is
       not an open socket (a CRT file descriptor, a closed socket). */
    if (getsockopt((SOCKET)socket, SOL_SOCKET, SO_TYPE, (char *)&type, &len) != 0)
        return WSAGetLastError();
    return 0;
}

#ifndef SO_BSP_STATE
#define SO_BSP_STATE 0x1009   /* ws2def.h; mingw-w64's headers lack it */
#endif

/* A 32-bit FNV-1a hash of a peer address (never 0: 0 means "none"). */
static uint32_t iocp__hash(const unsigned char *p, int n) {
    uint32_t h = 2166136261u;
    int i;
    for (i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h != 0 ? h : 1;
}

/* What the socket under a handle value is (sn_identity_t), in one
   getsockopt(SO_BSP_STATE): its type and protocol, local and remote
   addresses. The registration's own reading of the socket, so that a
   renewal after closesocket() cannot tie the socket that took the value
   (see sn_rearm.h, sn__socket_gone). An unbound socket may fail the
   option (the reference page leaves it open), a reset one may too: then
   only what SO_TYPE says is known, and the addresses are unknown
   (`addressed` 0), not "unbound". */
int sn_iocp_identify_socket(SOCKET s, int bsp_state, sn_identity_t *out) {
    union {
        CSADDR_INFO info;
        unsigned char bytes[sizeof(CSADDR_INFO) + 2 * sizeof(SOCKADDR_STORAGE)];
    } buf;
    int len = (int)sizeof buf, type = 0;
    const CSADDR_INFO *c = &buf.info;
    DWORD flags;
    memset(out, 0, sizeof *out);
    /* A handle value closed already is told by the process's handle table
       alone: no Winsock call, which is an I/O request on the socket (and
       under Wine 8 one that races the socket's closesocket() in another
       thread can outlive the socket object: see sn_afd.c, afd__closed).
       The identity is read before a REMOVE too, and asyncio closes a
       socket just after its unregister. */
    if (!GetHandleInformation((HANDLE)s, &flags))
        return WSAENOTSOCK;
    if (!bsp_state || getsockopt(s, SOL_SOCKET, SO_BSP_STATE, (char *)&buf, &len) != 0) {
        if (bsp_state && WSAGetLastError() == WSAENOTSOCK)
            return WSAENOTSOCK;
        len = (int)sizeof type;
        if (getsockopt(s, SOL_SOCKET, SO_TYPE, (char *)&type, &len) != 0)
            return WSAGetLastError();
        out->kind = (uint16_t)(0x8000u | (unsigned)(type & 0xff));
        return 0;
    }
    /* The type alone: what the fallback above reads too, and what an
       unbound socket's answer (if it has one) already says right. */
    out->kind = (uint16_t)(0x8000u | (unsigned)(c->iSocketType & 0xff));
    out->addressed = 1;
    /* Every sockaddr has its port right after its 2-byte family. */
    if (c->LocalAddr.lpSockaddr != NULL && c->LocalAddr.iSockaddrLength >= 4) {
        const unsigned char *a = (const unsigned char *)c->LocalAddr.lpSockaddr;
        out->local_port = (uint16_t)((a[2] << 8) | a[3]);
    }
    if (c->iSocketType == SOCK_STREAM && c->RemoteAddr.lpSockaddr != NULL &&
        c->RemoteAddr.iSockaddrLength >= 4) {
        const unsigned char *a = (const unsigned char *)c->RemoteAddr.lpSockaddr;
        if (a[2] != 0 || a[3] != 0)
            out->peer = iocp__hash(a, c->RemoteAddr.iSockaddrLength);
    }
    return 0;
}

int sn_iocp_identify(sn_port_t *port, uint64_t socket, sn_identity_t *out) {
    (void)port;
    return sn_iocp_identify_socket((SOCKET)socket, 1, out);
}

void sn_iocp_add_afd_counters(sn_port_t *port, uint64_t *out) {
    sn_afd_counters(((iocp_port_t *)port->impl)->iocp, out);
}

#define IOCP_TRIGGERS_PSN \
    (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE)
/* An AFD poll reports a level snapshot; edges cannot be told apart from a
   still-true level (see sn_afd.c). */
#define IOCP_TRIGGERS_AFD \
    (SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL)

/* The two backends of every build (the strict model's table, of a test
   build, is sn_model.c's). */
const sn_backend_ops_t sn_psn_ops = IOCP_OPS(
    SN_BACKEND_PSN, IOCP_TRIGGERS_PSN, sn_iocp_available_psn, iocp__open_psn,
    sn_iocp_identify, NULL);
const sn_backend_ops_t sn_afd_ops = IOCP_OPS(
    SN_BACKEND_AFD, IOCP_TRIGGERS_AFD, sn_iocp_available_afd, iocp__open_afd,
    sn_iocp_identify, sn_iocp_add_afd_counters);

#endif /* _WIN32 */
