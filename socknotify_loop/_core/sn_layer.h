/*
 * sn_layer.h -- the port as its port layer holds it (sn_layer_t): the part
 * every backend sees (struct sn_port, sn_internal.h) first, then what only
 * the port layer's files touch -- the lock, the table of records, the
 * re-arm and deferred lists, the selector's buffers and the call scratch.
 * A backend is handed a sn_port_t * and cannot see past its part; the
 * port layer turns the same pointer into its own view with sn__layer().
 * Internal to the port layer's files; cffi never sees it.
 */
#ifndef SN_LAYER_H
#define SN_LAYER_H

#include "sn_internal.h"

#include <stdlib.h>

struct sn_record;

typedef struct sn_layer {
    struct sn_port base;        /* first: a port's address is its layer's */
    volatile long selecting;    /* a thread is inside sn_port_select() */

    sn_mutex_t lock;            /* guards everything below */
    struct sn_record *records;  /* record number -> record (sn_record.h) */
    uint32_t records_cap;
    uint32_t *free_recnos;      /* stack of free record numbers */
    uint32_t free_count;
    uint32_t live_count;
    /* socket -> record number + 1 (sn_hash.h): every record not FREE. */
    sn_hash_t index;
    /* Delivered one-shot registrations awaiting an SN_PROCESS_REARM call;
       tracked once such a call has been made (rearm_mode). */
    uint32_t *rearm_recnos;
    uint32_t rearm_count;
    uint32_t rearm_cap;
    int rearm_mode;
    /* Records reborn after their REMOVE event (SN_CAP_KEY_FIXED): their
       waiting ENABLE goes to the kernel in the next call. */
    uint32_t *deferred_recnos;
    uint32_t deferred_count;
    uint32_t deferred_cap;
    /* Records whose quiet REMOVE a call that failed as a whole did not
       apply (sn_translate.c): the port sends it again with the next call,
       its caller having asked to hear nothing more of the registration. */
    uint32_t *unsent_recnos;
    uint32_t unsent_count;
    uint32_t unsent_cap;
    /* Changes applied in the order translated, where the kernel call that
       applies them also waits (sn_run.c, "Two threads"): the threads in
       sn__run now, whether two ever were at once (then every batch is
       applied under the lock), and the batches translated before that,
       to be applied outside the lock, not yet settled. */
    uint32_t runners;
    uint32_t unapplied;
    int ordered;
    /* The number of the batch being translated (sn__prepare: one per
       call's changes, never 0): a record enabled in it carries it
       (sn_record.h, `batch`). */
    uint32_t batch_serial;
    /* The count of bound changes the last select carried (sn_port_select_changes). */
    uint32_t last_select_count;
    /* Whether the last select dequeued a caller's post (sn_port_select_posted). */
    int last_select_posted;

    /* The selector's buffers (sn_port_bind), owned by the caller. */
    sn_registration_t *bound_changes;
    uint32_t bound_changes_cap;
    uint64_t *bound_out;
    uint32_t bound_out_cap;
    sn_kevent_t *bound_events;  /* ours: the kernel events of a select */
    /* The select path's kernel registrations and their bookkeeping when
       they do not fit on the stack (sn__run), grown once and kept: one
       thread selects at a time (`selecting`), and a busy loop re-arms
       more than a stack's worth of sockets on every select. */
    sn_registration_t *select_kregs;
    void *select_memos;         /* sn_memo_t[] (sn_run.h) */
    uint32_t select_scratch_cap;
} sn_layer_t;

/* The port layer's view of a port (every port is allocated as one). */
SN_INLINE sn_layer_t *sn__layer(sn_port_t *port) {
    return (sn_layer_t *)(void *)port;
}

/* The one rule of growth for the port layer's arrays (the records and
   their free list, sn_table.c; the re-arm and deferred lists, sn_rearm.c):
   a full array doubles, one with no room yet starts at `first` elements,
   and none grows past `limit` elements. Returns `array` reallocated to
   *new_cap elements of `size` bytes, or NULL with `array` as it was (out
   of memory, or at the limit): the caller keeps what it had and reports
   SN_ERROR_NO_MEMORY or its own fallback. */
SN_INLINE void *sn__array_grow(void *array, uint32_t cap, uint32_t first, uint32_t limit,
                               size_t size, uint32_t *new_cap) {
    uint32_t grown = cap ? cap * 2 : first;
    void *bigger;
    if (grown > limit || grown < cap)   /* past the limit, or 2**32 wrapped */
        return NULL;
    bigger = realloc(array, (size_t)grown * size);
    if (bigger != NULL)
        *new_cap = grown;
    return bigger;
}

#endif /* SN_LAYER_H */
