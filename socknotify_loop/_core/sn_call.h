/*
 * sn_call.h -- what the files behind one call on a port share: the memo a
 * call keeps about each kernel registration (sn_translate.c, sn_rearm.c,
 * sn_run.c), the sink notifications are written to (sn_run.c,
 * sn_rearm.c, sn_select.c), and the selector mask of an event. Types and
 * one inline function, no file of its own. Internal to the port's files;
 * cffi never sees it.
 */
#ifndef SN_CALL_H
#define SN_CALL_H

#include "sn_record.h"

/* What a call remembers about one kernel registration between handing it
   to the kernel and reading its verdict back (a memo; the selector's
   "pending" changes are another thing: changes not yet handed to the
   port). */
typedef struct sn_memo {
    uint32_t recno;
    uint8_t skip;         /* rejected before reaching the kernel */
    uint8_t kind;         /* SN_MEMO_* */
    uint8_t fresh;        /* ENABLE: the record was made for it */
    uint8_t before;       /* the record's state before the change
                             (sn_rstate_t), for undoing it */
    uint8_t waits;        /* SN_WAITS_*: an ENABLE that waits in a record
                             for its REMOVE event (SN_CAP_KEY_FIXED) */
} sn_memo_t;

/* SN_MEMO_MERGED: a caller's second ENABLE of a registration in one
   batch, merged into the first (sn_translate.c), whose index `recno`
   holds and whose result it shares. */
/* SN_MEMO_RESENT: a quiet REMOVE of the port's own, sent again after a
   call that failed as a whole did not apply it (sn_rearm.c). */
enum { SN_MEMO_CALLER = 0, SN_MEMO_REARM = 1, SN_MEMO_DEFERRED = 2,
       SN_MEMO_DEFERRED_FAILED = 3, SN_MEMO_MERGED = 4, SN_MEMO_RESENT = 5 };

/* Why a caller's ENABLE is not in the kernel batch as an ENABLE. */
enum {
    SN_WAITS_NONE = 0,    /* it is (or it is not an ENABLE) */
    SN_WAITS_HELD = 1,    /* the record was removing already: the ENABLE
                             waits in it, and a NONE holds its place in
                             the batch */
    SN_WAITS_REKEY = 2,   /* the record was live under another key: a
                             quiet REMOVE of the port's own goes in the
                             ENABLE's place, and the ENABLE waits for its
                             REMOVE event */
};

/* The same for a caller's change as it came (sn__failure_is_news): its
   failure shortens the call's wait unless it is a quiet REMOVE. */
SN_INLINE int sn__caller_news(const sn_registration_t *reg, uint32_t flags) {
    return reg->op != SN_OP_NONE &&
           !(reg->op == SN_OP_REMOVE && (flags & SN_PROCESS_QUIET_REMOVE));
}

/* Where translated notifications go: process() wants sn_notification_t,
   select() wants (key, selector mask) pairs and I/O keys. */
typedef struct sn_sink {
    sn_notification_t *notes;   /* process(): or NULL for select() */
    uint64_t *out;              /* select(): pairs from the front */
    uint32_t cap;               /* notifications, or words of out */
    uint32_t n;                 /* notifications, or pairs, stored */
    uint32_t io;                /* select(): I/O keys, stored from the back */
    int woken;                  /* select(): a posted packet arrived */
    int posted;                 /* select(): one not under SN_QUIET_WAKE_KEY */
} sn_sink_t;

/* The selector mask of delivered events, as selectors.EpollSelector
   computes it from epoll's bits: readable on IN or a hang-up (a read
   meets EOF), writable on OUT, both on an error. A half-closed peer is a
   hang-up of the read side only: reporting it writable would wake a
   writer whose buffer is still full, again and again. */
SN_INLINE uint64_t sn__select_mask(uint16_t filter, uint32_t events) {
    uint64_t mask = 0, wanted = 0;
    if (events & (SN_EVENT_IN | SN_EVENT_HANGUP | SN_EVENT_ERR))
        mask |= SN_SELECT_READ;
    if (events & (SN_EVENT_OUT | SN_EVENT_ERR))
        mask |= SN_SELECT_WRITE;
    if (filter & (SN_EVENT_IN | SN_EVENT_HANGUP))
        wanted |= SN_SELECT_READ;
    if (filter & SN_EVENT_OUT)
        wanted |= SN_SELECT_WRITE;
    return mask & wanted;
}

#endif /* SN_CALL_H */
