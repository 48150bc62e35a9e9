/*
 * sn_internal.h -- what the portable port layer (sn_port.c) and the backends
 * share. cffi never sees this file.
 *
 * Division of labour:
 *   sn_port.c   owns the registration table: caller key <-> kernel key, the
 *               generation that makes stale notifications recognisable, the
 *               lock that lets several threads share one port, and the retry
 *               of a wait whose notifications were all stale.
 *   backend     applies registrations whose .key is already the KERNEL key,
 *               waits, and returns kernel events (sn_kevent_t). It behaves
 *               exactly like ProcessSocketNotifications: a successful
 *               SN_OP_REMOVE produces one SN_EVENT_REMOVE event for that key,
 *               one-shot registrations disarm after one delivery, packets
 *               posted with post() come back with posted = 1.
 */
#ifndef SN_INTERNAL_H
#define SN_INTERNAL_H

#include "socknotify.h"
#include <stddef.h>

#ifdef _WIN32
#  ifndef WIN32_LEAN_AND_MEAN
#    define WIN32_LEAN_AND_MEAN
#  endif
#  include <winsock2.h>
#  include <windows.h>
typedef SRWLOCK sn_mutex_t;
#  define SN_ERROR_NOT_SUPPORTED   ERROR_NOT_SUPPORTED
#  define SN_ERROR_NOT_REGISTERED  ERROR_NOT_FOUND
#  define SN_ERROR_INVALID         ERROR_INVALID_PARAMETER
#  define SN_ERROR_NO_MEMORY       ERROR_NOT_ENOUGH_MEMORY
#else
#  include <errno.h>
#  include <pthread.h>
typedef pthread_mutex_t sn_mutex_t;
#  define SN_ERROR_NOT_SUPPORTED   ENOSYS
#  define SN_ERROR_NOT_REGISTERED  ENOENT
#  define SN_ERROR_INVALID         EINVAL
#  define SN_ERROR_NO_MEMORY       ENOMEM
#endif

void sn_mutex_init(sn_mutex_t *m);
void sn_mutex_lock(sn_mutex_t *m);
void sn_mutex_unlock(sn_mutex_t *m);
void sn_mutex_destroy(sn_mutex_t *m);

/* Monotonic milliseconds, for recomputing the remaining timeout. */
int64_t sn_now_ms(void);

/* One event as the backend returns it. */
typedef struct sn_kevent {
    uint64_t key;      /* kernel key of a registration, or the posted key */
    uint32_t events;   /* SN_EVENT_* bits; 0 for a posted packet */
    uint32_t posted;   /* 1 when the packet came from post() */
} sn_kevent_t;

typedef struct sn_backend_ops {
    const char *name;
    /* Create the backend's state in port->impl. */
    int (*open)(sn_port_t *port);
    /* Apply regs[i] (with kernel keys) in order, filling regs[i].result, then
       wait up to timeout_ms for events. Called WITHOUT the table lock held. */
    int (*process)(sn_port_t *port, sn_registration_t *regs, uint32_t count,
                   int64_t timeout_ms, sn_kevent_t *events, uint32_t max_events,
                   uint32_t *received);
    int (*post)(sn_port_t *port, uint64_t key);
    void (*close)(sn_port_t *port);
    uint64_t (*os_handle)(sn_port_t *port);
} sn_backend_ops_t;

/* A registration record: one per registered socket. */
typedef struct sn_record {
    uint64_t socket;
    uint64_t user_key;
    uint32_t generation;  /* bumped each time the slot is freed */
    uint16_t events;      /* the event filter of the last ENABLE */
    uint8_t  trigger;     /* the trigger flags of the last ENABLE */
    uint8_t  state;       /* SN_RECORD_* */
    uint8_t  delivered;   /* one-shot, delivered, waiting for a REARM call */
    uint8_t  lazy;        /* one-shot kept by us, not the kernel (see sn_port.c) */
} sn_record_t;

enum {
    SN_RECORD_FREE = 0,
    SN_RECORD_LIVE = 1,      /* registered with the kernel (armed or not) */
    SN_RECORD_REMOVING = 2,  /* OP_REMOVE accepted; waiting for the REMOVE event */
};

struct sn_port {
    const sn_backend_ops_t *ops;
    int backend;
    void *impl;                 /* backend state */

    sn_mutex_t lock;            /* guards everything below */
    sn_record_t *records;       /* slot -> record */
    uint32_t records_cap;
    uint32_t *free_slots;       /* stack of free slot numbers */
    uint32_t free_count;
    uint32_t live_count;
    /* socket -> slot, open addressing with linear probing; 0 = empty,
       otherwise slot + 1; SN_TOMBSTONE marks a deleted entry. */
    uint32_t *index;
    uint32_t index_cap;         /* power of two */
    uint32_t index_used;        /* entries + tombstones */
    /* Delivered one-shot registrations awaiting an SN_PROCESS_REARM call;
       tracked once such a call has been made (rearm_mode). */
    uint32_t *rearm_slots;
    uint32_t rearm_count;
    uint32_t rearm_cap;
    int rearm_mode;
};

/* The kernel key of a slot: the generation in the high half, so a reused
   slot never produces a key that an old notification could carry. Bit 63 is
   never set, which keeps the top of the key space free for posted packets,
   and generations start at 1, so no kernel key is 0: key 0 belongs to the
   packets RegisterWaitWithQueue posts (see sn_iocp.c). */
#define SN_KERNEL_KEY(slot, generation) \
    ((((uint64_t)(generation) & 0x7fffffffu) << 32) | (uint64_t)(slot))
#define SN_KEY_SLOT(key)        ((uint32_t)((key) & 0xffffffffu))
#define SN_KEY_GENERATION(key)  ((uint32_t)(((key) >> 32) & 0x7fffffffu))
#define SN_IO_COMPLETION_KEY    0xFFFFFFFFFFFFFFFDull

#ifdef __linux__
extern const sn_backend_ops_t sn_epoll_ops;
#endif
#ifdef _WIN32
extern const sn_backend_ops_t sn_psn_ops;   /* the OS's ProcessSocketNotifications */
extern const sn_backend_ops_t sn_afd_ops;   /* the same port code on the polyfill */
int sn_psn_available(void);                 /* 1 when ws2_32 exports the function */
#endif

#endif /* SN_INTERNAL_H */
