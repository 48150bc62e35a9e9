/*
 * sn_afd_sock.h -- one registered socket of the AFD polyfill, the state
 * machine of its poll, and the set of sockets of one port
 * (sn_afd_sock.c). Internal to the polyfill's files (sn_afd*.c); cffi
 * never sees it.
 *
 * The dependency runs one way: the port (sn_afd_port.h) owns an
 * afd_sockets_t and includes this header; the socket layer sees nothing
 * of the port but that set.
 */
#ifndef SN_AFD_SOCK_H
#define SN_AFD_SOCK_H

#ifdef _WIN32

#include "sn_internal.h"
#include "sn_afd_nt.h"
#include "sn_afd_group.h"
#include "sn_hash.h"
#include "sn_list.h"

/* Where the one poll of a socket stands. */
enum {
    AFD_POLL_IDLE = 0,     /* none in flight: we own iosb and poll_info */
    AFD_POLL_IN_FLIGHT,    /* the kernel owns them */
    AFD_POLL_CANCELLED,    /* cancel requested: the kernel still owns them */
};

/* What becomes of a socket's state when its poll comes back. */
enum {
    AFD_FATE_LIVE = 0,     /* registered: turn the completion into events */
    AFD_FATE_REMOVING,     /* OP_REMOVE accepted: emit REMOVE, then free */
    AFD_FATE_ORPHAN,       /* socket gone or replaced: free silently */
};

typedef struct afd_sock {
    /* Kernel-owned while poll_status != AFD_POLL_IDLE. The address of iosb
       is the ApcContext of the poll, so it comes back as lpOverlapped. */
    afd_iosb_t iosb;
    afd_poll_info_t poll_info;

    SOCKET socket;          /* the caller's socket: the table key; in the
                               table while LIVE */
    SOCKET base;            /* what AFD polls */
    SOCKET poll_base;       /* the base the poll in flight was issued for */
    ULONG_PTR key;          /* the registration's completion key */
    ULONG poll_events;      /* AFD_POLL_* of the poll in flight */
    afd_group_t *group;
    uint16_t filter;        /* SOCK_NOTIFY_REGISTER_EVENT_* */
    uint8_t oneshot;
    uint8_t armed;          /* enabled and not disarmed by a one-shot delivery */
    uint8_t poll_status;    /* AFD_POLL_*; changed by sn_afd_sock.c only */
    uint8_t fate;           /* AFD_FATE_*; changed by sn_afd_sock.c only */
    uint8_t enabled_since_submit;
    sn_list_t update_link;  /* on the port's update list (linked = queued) */
} afd_sock_t;

/* The state a completion packet of ours (key SN_AFD_COMPLETION_KEY, or an
   instance's own: sn_afd_port.h) is
   about: its lpOverlapped is the address of the state's iosb. */
#define AFD_SOCK_OF_OVERLAPPED(ov) \
    CONTAINING_RECORD((afd_iosb_t *)(ov), afd_sock_t, iosb)

/* The sockets of one port and what their polls need of it: all the
   socket layer knows of its port, which embeds it (sn_afd_port.h). */
typedef struct afd_sockets {
    HANDLE iocp;            /* the completion port the polls complete on */
    ULONG_PTR packet_key;   /* the completion key they complete under: the
                               polyfill's instance (sn_afd_port.h) */
    sn_hash_t table;        /* socket -> afd_sock_t *: live states only */
    uint32_t polls_in_flight;
    sn_list_t groups;       /* afd_group_t (sn_afd_group.c) */
    sn_list_t updates;      /* afd_sock_t whose poll may need work */
    /* Kernel calls made for this port (SN_COUNT_AFD_*), for the port's
       sn_port_counters(): how many system calls one ProcessSocket-
       Notifications call costs when it is rebuilt on AFD. */
    volatile uint64_t counters[SN_COUNTERS];
} afd_sockets_t;

#define AFD_COUNT(ss, what) sn_atomic_add64(&(ss)->counters[what], 1)

/* An empty set for the completion port `iocp`, its polls completing
   under `packet_key`. */
void sn_afd_sockets_init(afd_sockets_t *ss, HANDLE iocp, ULONG_PTR packet_key);

/* Everything below: the port's lock held. */

/* The live state of `socket`, or NULL. */
afd_sock_t *sn_afd_sock_find(afd_sockets_t *ss, SOCKET socket);

/* The first live state at table position *pos or later, with *pos moved
   past it; NULL once past the last. Start with *pos = 0; detaching the
   state returned before the next call visits every live state once. */
afd_sock_t *sn_afd_sock_next(afd_sockets_t *ss, uint32_t *pos);

/* Release the table (the port is going; every state is gone). */
void sn_afd_sockets_free(afd_sockets_t *ss);

/* A new live state for `socket` (polled through `base`), in the table,
   with a helper group, unarmed, no poll. 0 or an error. */
DWORD sn_afd_sock_new(afd_sockets_t *ss, SOCKET socket, SOCKET base, afd_sock_t **out);

/* Put a live state on the update list: its poll is made to match what it
   wants at the next sn_afd_flush. */
void sn_afd_sock_queue(afd_sockets_t *ss, afd_sock_t *sock);

/* The registration ends (fate AFD_FATE_REMOVING or AFD_FATE_ORPHAN): the
   state leaves the table for good, and is freed now if no poll is in
   flight, otherwise when the poll's completion is fed back. */
void sn_afd_sock_detach(afd_sockets_t *ss, afd_sock_t *sock, uint8_t fate);

/* Submit, keep or cancel the polls of every queued state. */
void sn_afd_flush(afd_sockets_t *ss);

/* A poll of ours completed: turn it into at most one notification entry.
   Returns 1 when *out was written. May free the state. */
int sn_afd_sock_feed(afd_sockets_t *ss, afd_sock_t *sock, OVERLAPPED_ENTRY *out);

#endif /* _WIN32 */
#endif /* SN_AFD_SOCK_H */
