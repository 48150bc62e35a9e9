/*
 * sn_iocp_buf.h -- the buffers a completion port keeps for the calls whose
 * batches do not fit on the stack (sn_iocp_buf.c). Internal to the port
 * code (sn_iocp.c owns one iocp_buffers_t per port); cffi never sees it.
 */
#ifndef SN_IOCP_BUF_H
#define SN_IOCP_BUF_H

#ifdef _WIN32

#include "sn_win.h"

/* Room for one call's kernel registrations and dequeued entries. */
typedef struct iocp_buffer {
    struct iocp_buffer *next;   /* on the idle stack */
    SOCK_NOTIFY_REGISTRATION *regs;
    OVERLAPPED_ENTRY *entries;
    uint8_t *routed;            /* beside regs: applied by the polyfill already */
    uint32_t regs_cap;
    uint32_t entries_cap;
} iocp_buffer_t;

/* A port's buffers while no call holds them. */
typedef struct iocp_buffers {
    SRWLOCK lock;               /* guards `idle` */
    iocp_buffer_t *idle;        /* a stack */
} iocp_buffers_t;

void sn_iocp_buf_init(iocp_buffers_t *pool);

/* A buffer with room for `regs` registrations (and as many `routed`
   flags) and `entries` entries, or NULL when memory ran out (the pool
   keeps what it had). */
iocp_buffer_t *sn_iocp_buf_take(iocp_buffers_t *pool, uint32_t regs, uint32_t entries);

/* Give a buffer taken from `pool` back. */
void sn_iocp_buf_give(iocp_buffers_t *pool, iocp_buffer_t *buf);

/* Free every buffer. Only once no call holds one (the port is closing and
   every thread has left its process()). */
void sn_iocp_buf_free_all(iocp_buffers_t *pool);

#endif /* _WIN32 */
#endif /* SN_IOCP_BUF_H */
