/*
 * sn_afd.c -- ProcessSocketNotifications, rebuilt on IOCTL_AFD_POLL for the
 * Windows systems that lack it (Windows 10, Server 2019, Wine): the entry
 * point, the registration operations, and the essay on the whole polyfill
 * (the files it is split into are listed at the end of this comment).
 *
 * The OS model. Winsock sockets of Microsoft's providers are files of the
 * AFD driver (\Device\Afd). Every select()/WSAPoll() in Windows ends up as
 * one ioctl, IOCTL_AFD_POLL: "complete when one of these sockets shows one
 * of these AFD_POLL_* conditions". Issued as overlapped I/O on any handle
 * opened on \Device\Afd, it completes through whatever completion port that
 * handle is associated with, with lpOverlapped = the ApcContext we passed.
 * So one port can carry readiness of thousands of sockets, without a thread
 * per select() and without per-socket I/O buffers. The ioctl is
 * undocumented but has been stable since Vista; wepoll, libuv, mio, trio and
 * c-ares are built on it.
 *
 * What the polyfill provides is the contract of Windows 11's
 * ProcessSocketNotifications (PSN), with the same signature, so the port
 * code (sn_iocp.c) calls either one through one pointer: registrations
 * (ENABLE / DISABLE / REMOVE, LEVEL, ONESHOT or PERSISTENT) are applied in
 * order with a per-registration result, then completions are dequeued;
 * notifications come back as OVERLAPPED_ENTRY with the registration's key
 * and the SOCK_NOTIFY_EVENT_* mask in dwNumberOfBytesTransferred; packets
 * that anybody posted pass through untouched.
 *
 * The hazards, and what they force on the design:
 *   - A poll is a request the kernel owns. Its IO_STATUS_BLOCK and
 *     AFD_POLL_INFO are written when it completes, which may be long after
 *     we lost interest. Cancelling (NtCancelIoFileEx) only asks; the
 *     completion still arrives, with STATUS_CANCELLED. So the per-socket
 *     state that embeds both is freed only after its completion has been
 *     dequeued, and each socket has at most ONE poll in flight: two polls
 *     for one socket would leave us unable to say which completion is the
 *     last. Every state change that needs a different poll cancels the old
 *     one and resubmits when its completion comes back.
 *   - A poll is a level snapshot: it completes at once if a requested
 *     condition already holds, and reports the conditions true at that
 *     moment. That is exactly LEVEL. EDGE ("only changes after enabling")
 *     cannot be rebuilt from snapshots: after a delivery, a resubmitted
 *     poll on a socket still holding unread data completes again at once,
 *     and nothing in the AFD answer says whether new data arrived in
 *     between. Faking it (suppressing repeats until a read is seen) would
 *     lose the wake-up of data arriving between our snapshot and the
 *     caller's drain. So EDGE is refused with ERROR_NOT_SUPPORTED, and the
 *     port layer advertises ONESHOT | PERSISTENT | LEVEL for this backend.
 *   - closesocket() does not tell us anything directly. A poll in flight
 *     completes with AFD_POLL_LOCAL_CLOSE (always requested for that
 *     reason), and then the state is dropped silently, as PSN drops the
 *     registration without a REMOVE. A socket closed while no poll is in
 *     flight (a disarmed one-shot) is noticed at its next ENABLE or REMOVE.
 *   - Socket handle values are reused at once. A registration whose socket
 *     was closed and whose value came back must not inherit the old
 *     socket's queued LOCAL_CLOSE: see sn_afd_sock_feed.
 *   - AFD wants the base socket, below any layered service provider:
 *     SIO_BASE_HANDLE; for LSPs that intercept it, SIO_BSP_HANDLE_POLL/
 *     _SELECT peel one layer at a time, SIO_BASE_HANDLE asked again below
 *     each (an answer naming the socket itself is no answer: see
 *     sn_afd_ws.c). Some Wine builds answer SIO_BASE_HANDLE with
 *     WSAEOPNOTSUPP (which is why trio fails there); Wine has no LSPs, so
 *     the socket itself is the base. The Wine 8.0 of Debian 12 answers it,
 *     but with the socket itself even after closesocket(): whether a
 *     handle is still an open socket is asked separately (getsockopt),
 *     where it matters -- a new registration and OP_REMOVE.
 *   - The poll is issued on a helper handle, not on the socket, and the
 *     helper is associated with our port: sockets stay free of any port
 *     association. One helper per group of sockets (AFD_GROUP_SIZE in
 *     sn_afd_group.c).
 *   - The completion packets of our polls arrive on the caller's port,
 *     mixed with everybody else's. They carry a key reserved for us
 *     (SN_AFD_COMPLETION_KEY, bit 63 set, which no kernel key of the port
 *     layer ever has), so they are recognised, translated into notification
 *     entries in place, and never returned raw. When a whole batch was ours
 *     and produced nothing (a cancellation, a filtered event), the wait
 *     resumes with the time that is left, so the caller never sees a
 *     spurious timeout. (That loop is part of standing in for the OS
 *     function, which never returns for packets of its own; the port's
 *     retry for packets it drops itself is sn_run.c's, and both count
 *     the time left with sn_deadline and sn_time_left, sn_platform.h, as
 *     the drain at close (sn_afd_port.c) and the strict model do.)
 *   - Several threads may call in at once on one port, as with PSN. A lock
 *     per port guards the state; it is never held across the wait. Polls
 *     are (re)submitted by whichever thread next enters the function, just
 *     before it waits: deferring them lets a batch of ENABLEs in one call
 *     cost one poll per socket, and keeps a persistent level registration
 *     on a socket nobody drains from spinning inside one call.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and its C samples (the contract reproduced here); wepoll's afd.c,
 * sock.c, poll_group.c and ws.c (the poll/cancel state machine, base
 * socket lookup, helper groups of 32); mio's src/sys/windows/afd.rs and
 * selector.rs (kernel-owned memory discipline, LOCAL_CLOSE handling);
 * trio's _io_windows.py (helper groups of 500 with the measurement behind
 * it, the Wine/LSP base-handle story); ponyc's sock_notify.c for how a PSN
 * user expects one-shot to behave. No code was taken from any of them.
 *
 * So that's why this code is the way it is: a table of per-socket states,
 * each with at most one poll in flight; registrations only change what a
 * socket wants and queue it; a flush just before the wait makes the polls
 * match what is wanted (submit, keep, or cancel and resubmit later);
 * completions are turned back into the notifications PSN would have
 * produced; memory the kernel may still write is freed only after the
 * kernel said it is done with it.
 *
 * Where each part lives, one concern per file (each opens with what it
 * owns and why; the internal headers are seen by the polyfill's files
 * only, never by cffi):
 *   sn_afd.h        what the rest of the core sees of the polyfill
 *   sn_afd.c        this essay; the ProcessSocketNotifications-shaped entry
 *                   point: argument rules, ENABLE / DISABLE / REMOVE, the
 *                   wait and the translation of the packets it dequeues
 *   sn_afd_sock.c   one registered socket and the state machine of its one
 *                   poll (submit, keep, cancel, completion -> notification),
 *                   with its legal transitions asserted; the set of a
 *                   port's sockets (socket -> state in the core's one hash
 *                   table, sn_hash.c), the update list
 *   sn_afd_port.c   the per-port state (which owns the set of sockets: the
 *                   files depend one way, port -> sockets), the registry
 *                   that finds it from the port HANDLE, statistics,
 *                   counters, and the close that waits for the kernel to
 *                   give every poll back
 *   sn_afd_group.c  helper handles, one per group of AFD_GROUP_SIZE sockets
 *   sn_afd_ws.c     Winsock: the base socket, and whether a socket is open
 *   sn_afd_nt.c     ntdll: issue, cancel and explain an AFD poll
 *                   (sn_afd_nt.h: the ioctl's undocumented types and codes)
 *   sn_list.h       the intrusive list every list above is made of
 */
#ifdef _WIN32

#include "sn_internal.h"
#include "sn_afd.h"
#include "sn_afd_port.h"
#include "sn_afd_ws.h"

/* ---------------------------------------------------------- registrations */

/* The trigger rules (sn__trigger_verdict) with the polyfill's answers:
   level snapshots cannot make edges (see the essay at the top), so EDGE
   is not honoured. */
static DWORD afd__check_trigger(UINT8 trigger) {
    switch (sn__trigger_verdict(trigger, SN_TRIGGER_ALL & ~(unsigned)SN_TRIGGER_EDGE)) {
    case 0:
        return 0;
    case SN_TRIGGER_VERDICT_UNSUPPORTED:
        return ERROR_NOT_SUPPORTED;
    default:
        return ERROR_INVALID_PARAMETER;
    }
}

static DWORD afd__enable(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    afd_sock_t *sock;
    SOCKET base;
    DWORD error;

    if (reg->eventFilter & ~SN_NOTIFY_FILTER_ALL)
        return ERROR_INVALID_PARAMETER;
    if ((error = afd__check_trigger(reg->triggerFlags)) != 0)
        return error;

    sock = sn_afd_sock_find(&ap->socks, reg->socket);
    if (sock != NULL && sock->key != (ULONG_PTR)reg->completionKey) {
        /* Same socket value, new key: the old socket was closed and its
           value reused (the port layer gives a reused socket a new key).
           Nothing of the old registration may reach the new one. */
        sn_afd_sock_detach(&ap->socks, sock, AFD_FATE_ORPHAN);
        sock = NULL;
    }
    if (sock == NULL) {
        /* A new registration: PSN refuses one for a handle that is not an
           open socket, and so do we. */
        if ((error = sn_afd_ws_check(reg->socket)) != 0 ||
            (error = sn_afd_ws_base_socket(reg->socket, &base)) != 0)
            return error;
        if ((error = sn_afd_sock_new(&ap->socks, reg->socket, base, &sock)) != 0)
            return error;
        sock->key = (ULONG_PTR)reg->completionKey;
    }
    sock->filter = reg->eventFilter;
    /* Neither ONESHOT nor PERSISTENT (the first scenario of Microsoft's article) means
       persistent. */
    sock->oneshot = (reg->triggerFlags & SOCK_NOTIFY_TRIGGER_ONESHOT) != 0;
    sock->armed = 1;
    sock->enabled_since_submit = 1;
    /* The poll is (re)made just before the wait. */
    sn_afd_sock_queue(&ap->socks, sock);
    return 0;
}

static DWORD afd__disable(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    afd_sock_t *sock = sn_afd_sock_find(&ap->socks, reg->socket);
    if (sock == NULL)
        return ERROR_NOT_FOUND;
    /* A poll in flight may stay: whatever it reports is ignored, and it is
       not resubmitted. The next ENABLE reuses it if it still fits. */
    sock->armed = 0;
    return 0;
}

/* Whether the socket a state polls was closed, asked of the process's
   handle table only (GetHandleInformation on the base handle, which AFD
   polls and which closes with the caller's socket), never of the socket.
   A REMOVE is applied by whichever thread enters next, typically just as
   the application closes the socket in its own (the selector's
   unregister-then-close, asyncio's order), and any Winsock call on the
   socket is an I/O request on it. Wine 8.0's server frees a socket object
   whose last handle is closed even while such a request still holds the
   socket's file (server/fd.c, DECL_HANDLER(ioctl) and server/async.c,
   async_handoff keep it until the caller's wait); the file's user is then
   freed memory, and set_fd_signaled (fd.c) or sock_poll_event (sock.c,
   its assertion on obj.ops) touches it: the wineserver dies, or an event
   of the closed socket lands on a new one allocated in its place. A
   closed value taken over by another handle reads as open here, as a
   value taken over by another socket did for getsockopt(): the REMOVE
   then succeeds and its REMOVE event comes. */
static DWORD afd__closed(const afd_sock_t *sock) {
    DWORD flags;
    return GetHandleInformation((HANDLE)sock->base, &flags) ? 0 : WSAENOTSOCK;
}

static DWORD afd__remove(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    afd_sock_t *sock = sn_afd_sock_find(&ap->socks, reg->socket);
    DWORD error;

    if (sock == NULL)
        return ERROR_NOT_FOUND;
    if ((error = afd__closed(sock)) != 0) {
        /* closesocket() already ended this registration (PSN would fail the
           REMOVE too, and send no REMOVE event). */
        sn_afd_sock_detach(&ap->socks, sock, AFD_FATE_ORPHAN);
        return error;
    }
    if (sock->poll_status == AFD_POLL_IDLE) {
        /* Nothing in flight: the REMOVE can be queued now, as a packet on
           the port, so it reaches whichever thread dequeues next, after
           anything already queued for this key. */
        AFD_COUNT(&ap->socks, SN_COUNT_AFD_POSTS);
        if (!PostQueuedCompletionStatus(ap->iocp, SOCK_NOTIFY_EVENT_REMOVE,
                                        sock->key, NULL))
            return GetLastError();   /* still registered, as PSN promises */
    }
    /* In flight: the REMOVE is emitted when the poll comes back. */
    sn_afd_sock_detach(&ap->socks, sock, AFD_FATE_REMOVING);
    return 0;
}

static DWORD afd__apply(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    switch (reg->operation) {
    case SOCK_NOTIFY_OP_NONE:    return 0;
    case SOCK_NOTIFY_OP_ENABLE:  return afd__enable(ap, reg);
    case SOCK_NOTIFY_OP_DISABLE: return afd__disable(ap, reg);
    case SOCK_NOTIFY_OP_REMOVE:  return afd__remove(ap, reg);
    default:                     return ERROR_INVALID_PARAMETER;
    }
}

/* ------------------------------------------------------- the translation */

/* Our packets among `got` dequeued entries, turned into notifications in
   place (entry j yields at most one entry n <= j); the others untouched.
   Lock held. */
static ULONG afd__translate(afd_port_t *ap, OVERLAPPED_ENTRY *entries, ULONG got) {
    ULONG j, n = 0;
    for (j = 0; j < got; j++) {
        OVERLAPPED_ENTRY *entry = &entries[j];
        if (entry->lpCompletionKey == ap->instance) {
            afd_sock_t *sock = AFD_SOCK_OF_OVERLAPPED(entry->lpOverlapped);
            n += (ULONG)sn_afd_sock_feed(&ap->socks, sock, &entries[n]);
        } else {
            /* Not ours (posted packets, other I/O): unchanged. */
            if (n != j)
                entries[n] = *entry;
            n++;
        }
    }
    return n;
}

ULONG sn_afd_translate_as(ULONG_PTR instance, HANDLE completionPort,
                          OVERLAPPED_ENTRY *entries, ULONG got) {
    afd_port_t *ap;
    ULONG n;
    if (sn_afd_port_get(completionPort, instance, &ap) != 0)
        return got;
    AcquireSRWLockExclusive(&ap->lock);
    n = afd__translate(ap, entries, got);
    /* No wait of ours follows: what the completions asked for goes out
       now (a poll to resubmit, a cancelled one to replace). */
    sn_afd_flush(&ap->socks);
    ReleaseSRWLockExclusive(&ap->lock);
    return n;
}

ULONG sn_afd_translate(HANDLE completionPort, OVERLAPPED_ENTRY *entries, ULONG got) {
    return sn_afd_translate_as(SN_AFD_COMPLETION_KEY, completionPort, entries, got);
}

/* ------------------------------------------------------------ the process */

/* Waits of a zero-timeout call that dequeued only internal packets. */
#define AFD_POLL_ONLY_ROUNDS 4

/* The parameters (completionPort ... receivedEntryCount) are those of
   SN_PSN_PARAMETERS, sn_win.h. */
DWORD WINAPI sn_afd_process_socket_notifications(SN_PSN_PARAMETERS) {
    return sn_afd_process_as(SN_AFD_COMPLETION_KEY, SN_PSN_ARGUMENTS);
}

DWORD sn_afd_process_as(ULONG_PTR instance, SN_PSN_PARAMETERS) {
    afd_port_t *ap;
    int64_t deadline = 0;
    DWORD wait_ms = timeoutMs;
    DWORD error;
    UINT32 i, rounds = 0;

    if ((error = sn_psn_check_arguments(SN_PSN_ARGUMENTS)) != 0)
        return error;
    if ((error = sn_afd_port_get(completionPort, instance, &ap)) != 0)
        return error;

    AcquireSRWLockExclusive(&ap->lock);
    for (i = 0; i < registrationCount; i++) {
        registrationInfos[i].registrationResult = afd__apply(ap, &registrationInfos[i]);
        /* Unlike PSN, which applies and waits in one kernel transition, we
           know of a refused ENABLE before waiting: the caller hears of it
           now instead of whenever another event ends the wait. */
        if (registrationInfos[i].registrationResult != 0 &&
            registrationInfos[i].operation == SOCK_NOTIFY_OP_ENABLE)
            timeoutMs = 0;
    }
    wait_ms = timeoutMs;
    if (completionCount == 0) {
        /* Register-only call: the polls go out now, since no wait follows. */
        sn_afd_flush(&ap->socks);
        ReleaseSRWLockExclusive(&ap->lock);
        return ERROR_SUCCESS;
    }
    ReleaseSRWLockExclusive(&ap->lock);

    if (timeoutMs != INFINITE)
        deadline = sn_deadline(timeoutMs);
    for (;;) {
        ULONG got = 0, n = 0;

        /* Polls are made to match the registrations just before each wait,
           including the waits resumed after a batch of internal packets
           (a cancellation that came back needs its replacement out). */
        AcquireSRWLockExclusive(&ap->lock);
        sn_afd_flush(&ap->socks);
        ReleaseSRWLockExclusive(&ap->lock);

        /* No lock held here: other threads register and wait meanwhile. */
        AFD_COUNT(&ap->socks, SN_COUNT_AFD_DEQUEUES);
        if (!GetQueuedCompletionStatusEx(completionPort, completionPortEntries,
                                         completionCount, &got, wait_ms, FALSE)) {
            error = GetLastError();
            return error == WAIT_TIMEOUT ? WAIT_TIMEOUT : error;
        }

        /* Translate in place: entry j yields at most one entry n <= j. */
        AcquireSRWLockExclusive(&ap->lock);
        n = afd__translate(ap, completionPortEntries, got);
        ReleaseSRWLockExclusive(&ap->lock);

        if (n > 0) {
            *receivedEntryCount = (UINT32)n;
            return ERROR_SUCCESS;
        }
        /* Only internal packets: wait again for the time that is left. A
           zero timeout still finishes what is immediately at hand: the
           packet may have been a cancellation whose replacement poll
           completes at once (a socket switched from IN to OUT that is
           writable now), and PSN would report that in this very call. The
           bound only guards against a loop nobody foresaw. */
        if (timeoutMs == 0) {
            if (++rounds >= AFD_POLL_ONLY_ROUNDS)
                return WAIT_TIMEOUT;
            continue;
        }
        if (timeoutMs != INFINITE) {
            int64_t left = sn_time_left(deadline);
            if (left == 0)
                return WAIT_TIMEOUT;
            wait_ms = (DWORD)left;
        }
    }
}

/* ------------------------------------------------- the port's state (sn_afd.h) */

void sn_afd_port_closed(HANDLE port) {
    sn_afd_port_release(port);
}

void sn_afd_counters(HANDLE port, uint64_t *counters) {
    sn_afd_port_counters(port, counters);
}

DWORD sn_afd_statistics(HANDLE port, UINT32 *registered, UINT32 *polls_in_flight) {
    return sn_afd_port_statistics(port, registered, polls_in_flight);
}

#endif /* _WIN32 */
