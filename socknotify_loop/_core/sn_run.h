/*
 * sn_run.h -- what the files behind one port call share: the memo a call
 * keeps about each kernel registration, the sink notifications are
 * written to, and the translation in both directions (sn_translate.c:
 * changes in, verdicts back; sn_run.c: events out). Internal to the port's
 * files; cffi never sees it. Everything here is called with the port's
 * lock held.
 */
#ifndef SN_RUN_H
#define SN_RUN_H

#include "sn_internal.h"

/* What a call remembers about one kernel registration between handing it
   to the kernel and reading its verdict back (a memo; the selector's
   "pending" changes are another thing: changes not yet handed to the
   port). */
typedef struct sn_memo {
    uint32_t slot;
    uint8_t skip;         /* rejected before reaching the kernel */
    uint8_t kind;         /* SN_MEMO_* */
    uint8_t fresh;        /* ENABLE: the record was made for it */
    uint8_t was_disabled; /* DISABLE/ENABLE: the record's flag before */
    uint8_t waits;        /* ENABLE held in a REMOVING record (KEY_FIXED) */
} sn_memo_t;

enum { SN_MEMO_CALLER = 0, SN_MEMO_REARM = 1, SN_MEMO_DEFERRED = 2,
       SN_MEMO_DEFERRED_FAILED = 3 };

/* Where translated notifications go: process() wants sn_notification_t,
   select() wants (key, selector mask) pairs and I/O keys. */
typedef struct sn_sink {
    sn_notification_t *notes;   /* process(): or NULL for select() */
    uint64_t *out;              /* select(): pairs from the front */
    uint32_t cap;               /* notifications, or words of out */
    uint32_t n;                 /* notifications, or pairs, stored */
    uint32_t io;                /* select(): I/O keys, stored from the back */
    int woken;                  /* select(): a posted packet arrived */
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

/* sn_translate.c. Translate the caller's registrations into kernel ones;
   returns how many ENABLEs were refused before reaching the kernel. */
uint32_t sn__prepare(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
                     sn_registration_t *kregs, sn_memo_t *memos, uint32_t count);

/* sn_translate.c. Read the kernel's verdicts back into the table. The
   first `callers` kernel registrations are the caller's; the rest are the
   port's own re-arms and deferred ENABLEs. `call_error` is the call's
   error, for the registrations of a call that failed as a whole. */
void sn__settle(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
                sn_registration_t *kregs, sn_memo_t *memos,
                uint32_t callers, uint32_t count, int call_error);

/* sn_run.c. The one routine behind sn_port_process(), sn_port_change()
   and sn_port_select(): apply re-arms and changes, wait, translate; wait
   again for the time left while everything dequeued was dropped. The
   caller has entered the port; `timeout_ms` is already whole milliseconds
   (sn__wait_ms), SN_INFINITE or 0. */
int sn__run(sn_port_t *port, uint32_t flags, sn_registration_t *regs,
            uint32_t count, int64_t timeout_ms, uint32_t max_events,
            sn_kevent_t *given_events, sn_sink_t *sink);

/* The longest wait asked of a backend: what fits the int of epoll_wait()
   and stays below the DWORD INFINITE of the Windows waits. */
#define SN_LONGEST_WAIT_MS  INT64_C(0x7FFFFFFF)

/* sn_run.c. A timeout in milliseconds, as a double, turned into the whole
   milliseconds a backend waits: rounded UP, so that a wait never ends
   before the time asked (the stdlib selectors round up too: a loop woken
   before its timer is due would spin); negative waits forever; NaN and
   zero poll; clamped to SN_LONGEST_WAIT_MS. The one conversion of a
   timeout in the package: the Python side hands over seconds * 1000. */
int64_t sn__wait_ms(double timeout_ms);

#endif /* SN_RUN_H */
