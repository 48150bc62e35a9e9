/*
 * sn_afd_port.h -- the AFD polyfill's state for one completion port, and
 * the registry that finds it from the port's HANDLE (sn_afd_port.c).
 * Internal to the polyfill's files (sn_afd*.c); cffi never sees it. The
 * functions the port code calls (sn_afd_port_closed, sn_afd_statistics,
 * sn_afd_counters) are declared in sn_win.h.
 */
#ifndef SN_AFD_PORT_H
#define SN_AFD_PORT_H

#ifdef _WIN32

#include "sn_internal.h"
#include "sn_win.h"
#include "sn_list.h"
#include "sn_afd_table.h"

typedef struct afd_port {
    HANDLE iocp;
    SRWLOCK lock;           /* guards everything below */
    afd_table_t table;      /* socket -> afd_sock_t; live states only */
    uint32_t polls_in_flight;
    sn_list_t groups;       /* afd_group_t (sn_afd_group.c) */
    sn_list_t updates;      /* afd_sock_t whose poll may need work */
    sn_list_t registry_link;  /* in the registry; guarded by its lock */
    /* Kernel calls made for this port (SN_COUNT_AFD_*), for the port's
       sn_port_counters(): how many system calls one ProcessSocket-
       Notifications call costs when it is rebuilt on AFD. */
    volatile uint64_t counters[SN_COUNTERS];
} afd_port_t;

#define AFD_COUNT(ap, what) sn_atomic_add64(&(ap)->counters[what], 1)

/* The polyfill's state for the port `iocp`, created at first use (after
   the one-time NT setup, whose error it returns). 0 or an error. */
DWORD sn_afd_port_get(HANDLE iocp, afd_port_t **out);

#endif /* _WIN32 */
#endif /* SN_AFD_PORT_H */
