/*
 * sn_iocp_fallback.h -- the sockets a completion port's own function
 * refused and the AFD polyfill serves instead, on the same port
 * (sn_iocp_fallback.c). Internal to the port code (sn_iocp.c owns one
 * iocp_fallbacks_t per port); cffi never sees it.
 */
#ifndef SN_IOCP_FALLBACK_H
#define SN_IOCP_FALLBACK_H

#ifdef _WIN32

#include "sn_win.h"
#include "sn_hash.h"

typedef struct iocp_fallbacks {
    SRWLOCK lock;               /* guards `sockets` */
    sn_hash_t sockets;          /* socket -> 1 (sn_hash.h) */
    volatile long used;         /* the polyfill ever served a socket here */
} iocp_fallbacks_t;

void sn_iocp_fallback_init(iocp_fallbacks_t *fb);
void sn_iocp_fallback_free(iocp_fallbacks_t *fb);

/* Whether the polyfill ever served a socket of this port: one read, the
   whole cost of the fallback on a port that never needed it. */
SN_INLINE int sn_iocp_fallback_used(iocp_fallbacks_t *fb) {
    return sn_atomic_load(&fb->used) != 0;
}

/* A registration of a socket the polyfill serves goes to the polyfill
   (register-only, at once), its verdict in *result, and leaves `kreg` an
   OP_NONE for the port's own function: returns 1. Returns 0, `kreg`
   untouched, for any other socket. A REMOVE forgets the socket. */
int sn_iocp_fallback_route(iocp_fallbacks_t *fb, HANDLE iocp,
                           SOCK_NOTIFY_REGISTRATION *kreg, DWORD *result);

/* A registration the port's own function refused: if the polyfill can
   make it good (an ENABLE of a handle that is still an open socket), the
   polyfill applies it, the socket is served by the polyfill from now on,
   kreg->registrationResult becomes 0, and 1 is returned. Otherwise 0, and
   the refusal stands, unless it was memory that the takeover lacked: then
   the result becomes ERROR_NOT_ENOUGH_MEMORY, and the polyfill keeps
   nothing of the socket. */
int sn_iocp_fallback_take(iocp_fallbacks_t *fb, HANDLE iocp,
                          SOCK_NOTIFY_REGISTRATION *kreg);

/* The polyfill's packets among `got` entries the port's own wait
   dequeued, turned into notifications in place (sn_afd_translate);
   returns the entries left. Nothing to do, and `got` back, on a port
   whose polyfill never served a socket. */
ULONG sn_iocp_fallback_translate(iocp_fallbacks_t *fb, HANDLE iocp,
                                 OVERLAPPED_ENTRY *entries, ULONG got);

#endif /* _WIN32 */
#endif /* SN_IOCP_FALLBACK_H */
