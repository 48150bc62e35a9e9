/*
 * sn_iocp_buf.c -- the buffers a completion port keeps, so that a wait
 * with room for many entries does not allocate.
 *
 * The model. One call of the port code (sn_iocp.c) needs an array of
 * SOCK_NOTIFY_REGISTRATIONs for its batch, a flag beside each (routed to
 * the polyfill already: sn_iocp_fallback.c) and an array of
 * OVERLAPPED_ENTRYs for what it dequeues. Small batches fit on the stack.
 * A selector, though, asks for hundreds of entries on every select (its
 * whole output buffer): allocating and freeing that for each call cost
 * about 10 KB of heap traffic per wait. So the port keeps the buffers it
 * has made, on a stack of idle ones: a call takes one, grows it if it is
 * too small, and gives it back. Several threads may wait on one port at
 * once, each with a buffer of its own, so the pool holds as many buffers
 * as there were calls at once, each grown to the largest batch it served;
 * a single-threaded loop allocates once and never again
 * (tests/c/test_win_internals.c counts the allocations).
 *
 * The hazards:
 *   - A buffer is held across the wait, which may last for ever: the lock
 *     guards only the idle stack, never a buffer in use.
 *   - Growth that runs out of memory gives the buffer back as it was (what
 *     it has stays useful) and the call fails with SN_ERROR_NO_MEMORY
 *     before anything reached the kernel, so the port stays as it was.
 *   - regs and routed grow together: the port code indexes both by the
 *     same registration.
 *   - The pool is freed only when no thread can be inside process():
 *     sn_port_close() waits for them to leave before the backend's close.
 *
 * Sources read: the reference pages of GetQueuedCompletionStatusEx (the
 * entry array is the caller's memory, written during the call only) and
 * of the slim reader/writer locks.
 */
#ifdef _WIN32

#include "sn_iocp_buf.h"

#include <stdlib.h>

void sn_iocp_buf_init(iocp_buffers_t *pool) {
    InitializeSRWLock(&pool->lock);
    pool->idle = NULL;
}

void sn_iocp_buf_give(iocp_buffers_t *pool, iocp_buffer_t *buf) {
    AcquireSRWLockExclusive(&pool->lock);
    buf->next = pool->idle;
    pool->idle = buf;
    ReleaseSRWLockExclusive(&pool->lock);
}

iocp_buffer_t *sn_iocp_buf_take(iocp_buffers_t *pool, uint32_t regs, uint32_t entries) {
    iocp_buffer_t *buf;

    AcquireSRWLockExclusive(&pool->lock);
    buf = pool->idle;
    if (buf != NULL)
        pool->idle = buf->next;
    ReleaseSRWLockExclusive(&pool->lock);
    if (buf == NULL) {
        buf = calloc(1, sizeof *buf);
        if (buf == NULL)
            return NULL;
    }
    buf->next = NULL;
    if (regs > buf->regs_cap) {
        SOCK_NOTIFY_REGISTRATION *fresh = malloc((size_t)regs * sizeof *fresh);
        uint8_t *routed = malloc(regs);
        if (fresh == NULL || routed == NULL) {
            free(fresh);
            free(routed);
            goto fail;
        }
        free(buf->regs);
        free(buf->routed);
        buf->regs = fresh;
        buf->routed = routed;
        buf->regs_cap = regs;
    }
    if (entries > buf->entries_cap) {
        OVERLAPPED_ENTRY *fresh = malloc((size_t)entries * sizeof *fresh);
        if (fresh == NULL)
            goto fail;
        free(buf->entries);
        buf->entries = fresh;
        buf->entries_cap = entries;
    }
    return buf;

fail:
    sn_iocp_buf_give(pool, buf);   /* what it has stays useful */
    return NULL;
}

void sn_iocp_buf_free_all(iocp_buffers_t *pool) {
    while (pool->idle != NULL) {
        iocp_buffer_t *buf = pool->idle;
        pool->idle = buf->next;
        free(buf->regs);
        free(buf->routed);
        free(buf->entries);
        free(buf);
    }
}

#endif /* _WIN32 */

/* ISO C wants a declaration in every translation unit, also where the
   #ifdef above leaves none (MSVC and -pedantic warn otherwise). */
typedef int sn_iocp_buf_c_is_windows_only;
