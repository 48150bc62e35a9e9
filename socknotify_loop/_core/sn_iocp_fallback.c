/*
 * sn_iocp_fallback.c -- refusals: the sockets a completion port's own
 * function (the OS's ProcessSocketNotifications, or the strict model)
 * refused, served by the AFD polyfill on the same port instead.
 *
 * The model. The OS's function refuses what the polyfill accepts: sockets
 * of a layered or non-IFS provider, a socket associated with another
 * completion port (one a proactor loop used, or one left tied to a port
 * closed without REMOVEs), transient errors. Such a socket must neither
 * stay deaf nor block a wait. So the port code (sn_iocp.c) applies a batch
 * that brings a caller's ENABLE (a socket's first, or a modify of a
 * registration the OS holds: the text does not say the OS takes every
 * modify) in a call of its own that does not wait, before the call that
 * waits; and an ENABLE
 * refused for a handle that is still an open socket is given to the
 * polyfill on the same port, which polls the base socket through its own
 * helper handles and needs no association with the port. From then on
 * every change of that socket goes to the polyfill; the polyfill's
 * packets, dequeued by the OS's wait, are translated by it
 * (sn_afd_translate). This file keeps the set of such sockets and makes
 * those three moves: hand a refusal over, route a later change, translate
 * what the wait brought. It costs nothing until the first refusal (one
 * flag read per call), and one extra call per batch that registers a new
 * socket (sn_iocp.c's).
 *
 * The hazards:
 *   - A closed socket is refused by the polyfill too, and its owner must
 *     hear of it: only a refusal of a handle that getsockopt still takes
 *     for a socket is handed over.
 *   - The set is read by every call of every thread and written only at a
 *     refusal or a REMOVE: a reader/writer lock, behind a flag that stays
 *     0 on a port that never needed the polyfill, so such a port never
 *     takes the lock at all. The flag is set before the polyfill is first
 *     asked to take a socket, not once it has: a takeover that fails
 *     half-way (no memory for the set) leaves a poll whose completion the
 *     port's wait must still hand to the polyfill.
 *   - A socket whose REMOVE went to the polyfill is forgotten at once: its
 *     value may be reused by a socket the OS's function accepts.
 *   - The polyfill's packets carry its own reserved key
 *     (SN_AFD_COMPLETION_KEY, sn_keys.h): left untranslated they would be
 *     dropped as reserved, and the socket would go deaf.
 *   - The polyfill-only backend has nothing to fall back to; the port code
 *     never asks this file on it.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and the reference pages of ProcessSocketNotifications and
 * CreateIoCompletionPort (a handle is associated with one port only);
 * wepoll's ws.c (a layered provider's socket, and the base socket beneath
 * it that the polyfill polls).
 */
#ifdef _WIN32

#include "sn_iocp_fallback.h"
#include "sn_afd.h"

#include <string.h>

void sn_iocp_fallback_init(iocp_fallbacks_t *fb) {
    InitializeSRWLock(&fb->lock);
    memset(&fb->sockets, 0, sizeof fb->sockets);   /* all zeros: empty */
    fb->used = 0;
}

void sn_iocp_fallback_free(iocp_fallbacks_t *fb) {
    sn_hash_free(&fb->sockets);
}

static int iocp__fb_has(iocp_fallbacks_t *fb, SOCKET s) {
    int has;
    if (!sn_iocp_fallback_used(fb))
        return 0;
    AcquireSRWLockShared(&fb->lock);
    has = sn_hash_get(&fb->sockets, (uint64_t)s) != SN_HASH_EMPTY;
    ReleaseSRWLockShared(&fb->lock);
    return has;
}

static int iocp__fb_add(iocp_fallbacks_t *fb, SOCKET s) {
    int err;
    AcquireSRWLockExclusive(&fb->lock);
    if ((err = sn_hash_reserve(&fb->sockets)) == 0) {
        sn_hash_put(&fb->sockets, (uint64_t)s, 1);
        sn_atomic_store(&fb->used, 1);
    }
    ReleaseSRWLockExclusive(&fb->lock);
    return err;
}

/* Forget `s` (its REMOVE went to the polyfill). */
static void iocp__fb_remove(iocp_fallbacks_t *fb, SOCKET s) {
    AcquireSRWLockExclusive(&fb->lock);
    sn_hash_del(&fb->sockets, (uint64_t)s, 1);
    ReleaseSRWLockExclusive(&fb->lock);
}

/* One registration, applied by the polyfill now (register-only). */
static DWORD iocp__afd_apply(HANDLE iocp, SOCK_NOTIFY_REGISTRATION *kreg) {
    DWORD rc = sn_afd_process_socket_notifications(iocp, 1, kreg, 0, 0, NULL, NULL);
    return rc != ERROR_SUCCESS ? rc : kreg->registrationResult;
}

/* A refusal the polyfill can make good: the ENABLE failed although the
   handle is an open socket (a closed one is refused by the polyfill too,
   and its owner must hear of it). */
static int iocp__worth_fallback(const SOCK_NOTIFY_REGISTRATION *kreg) {
    int type = 0, len = sizeof type;
    return kreg->operation == SOCK_NOTIFY_OP_ENABLE && kreg->registrationResult != 0 &&
           getsockopt(kreg->socket, SOL_SOCKET, SO_TYPE, (char *)&type, &len) == 0;
}

int sn_iocp_fallback_route(iocp_fallbacks_t *fb, HANDLE iocp,
                           SOCK_NOTIFY_REGISTRATION *kreg, DWORD *result) {
    if (!iocp__fb_has(fb, kreg->socket))
        return 0;
    *result = iocp__afd_apply(iocp, kreg);
    if (kreg->operation == SOCK_NOTIFY_OP_REMOVE)
        iocp__fb_remove(fb, kreg->socket);
    kreg->operation = SOCK_NOTIFY_OP_NONE;
    return 1;
}

int sn_iocp_fallback_take(iocp_fallbacks_t *fb, HANDLE iocp,
                          SOCK_NOTIFY_REGISTRATION *kreg) {
    SOCK_NOTIFY_REGISTRATION again;
    DWORD err;
    if (!iocp__worth_fallback(kreg))
        return 0;
    again = *kreg;
    again.registrationResult = 0;
    /* From here on the polyfill may hold state for the port, whose polls'
       packets the port's wait must hand back to it (a refused takeover's
       REMOVE still completes a poll) and which close() must release. */
    sn_atomic_store(&fb->used, 1);
    if ((err = iocp__afd_apply(iocp, &again)) != 0) {
        /* The polyfill would have served the socket but for memory: the
           owner hears that, not the OS's refusal ("not supported"), which
           would tell it to give up on a socket that works. */
        if (err == ERROR_NOT_ENOUGH_MEMORY)
            kreg->registrationResult = err;
        return 0;
    }
    if ((err = (DWORD)iocp__fb_add(fb, again.socket)) != 0) {
        /* The polyfill holds the socket now, but the set that routes its
           changes and marks the port as needing the polyfill's clean-up
           had no room: undo the registration (a REMOVE allocates nothing),
           or its polls would outlive the port's close unseen. */
        again.operation = SOCK_NOTIFY_OP_REMOVE;
        again.registrationResult = 0;
        iocp__afd_apply(iocp, &again);
        kreg->registrationResult = err;
        return 0;
    }
    kreg->registrationResult = 0;
    return 1;
}

ULONG sn_iocp_fallback_translate(iocp_fallbacks_t *fb, HANDLE iocp,
                                 OVERLAPPED_ENTRY *entries, ULONG got) {
    if (!sn_iocp_fallback_used(fb))
        return got;
    return sn_afd_translate(iocp, entries, got);
}

#endif /* _WIN32 */

/* ISO C wants a declaration in every translation unit, also where the
   #ifdef above leaves none (MSVC and -pedantic warn otherwise). */
typedef int sn_iocp_fallback_c_is_windows_only;
