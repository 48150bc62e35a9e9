/*
 * sn_afd_port.h -- the AFD polyfill's state for one completion port, and
 * the registry that finds it from the port's HANDLE (sn_afd_port.c).
 * Internal to the polyfill's files (sn_afd*.c); cffi never sees it. The
 * rest of the core reaches these through sn_afd.h (sn_afd_port_closed,
 * sn_afd_statistics, sn_afd_counters, in sn_afd.c). The port owns its
 * sockets (an afd_sockets_t, sn_afd_sock.h); the socket layer never sees
 * the port.
 */
#ifndef SN_AFD_PORT_H
#define SN_AFD_PORT_H

#ifdef _WIN32

#include "sn_internal.h"
#include "sn_win.h"
#include "sn_list.h"
#include "sn_afd_sock.h"

/* A port may have two instances of the polyfill's state, told apart by
   the completion key their polls complete under: the one every caller of
   the polyfill's function gets (SN_AFD_COMPLETION_KEY), and the strict
   model's own (SN_AFD_MODEL_COMPLETION_KEY), so that the model's
   registration of a socket and the fallback's are two, as the OS's and
   the polyfill's would be on Windows. */
typedef struct afd_port {
    HANDLE iocp;            /* the port's handle: the registry's key, with */
    ULONG_PTR instance;     /* the completion key of its polls */
    SRWLOCK lock;           /* guards `socks` */
    afd_sockets_t socks;    /* the registered sockets and their polls */
    sn_list_t registry_link;  /* in the registry; guarded by its lock */
} afd_port_t;

/* The polyfill's state for the port `iocp` and the instance `instance`
   (a completion key, above), created at first use (after the one-time NT
   setup, whose error it returns). 0 or an error. */
DWORD sn_afd_port_get(HANDLE iocp, ULONG_PTR instance, afd_port_t **out);

/* sn_afd_port_closed(), sn_afd_counters(), sn_afd_statistics() of
   sn_afd.h: the port's states released (every instance), its counts (of
   every instance), its bookkeeping (the callers' instance). */
void sn_afd_port_release(HANDLE iocp);
void sn_afd_port_counters(HANDLE iocp, uint64_t *counters);
DWORD sn_afd_port_statistics(HANDLE iocp, UINT32 *registered, UINT32 *polls_in_flight);

#endif /* _WIN32 */
#endif /* SN_AFD_PORT_H */
