/*
 * sn_rearm.h -- the port's two lists of work it does on its own in the
 * next call (sn_rearm.c): the one-shot re-arms (SN_PROCESS_REARM) and the
 * ENABLEs that waited for their socket's REMOVE event (SN_CAP_KEY_FIXED).
 * Internal to the port's files; cffi never sees it. Everything here is
 * called with the port's lock held.
 */
#ifndef SN_REARM_H
#define SN_REARM_H

#include "sn_run.h"

/* Note a delivered one-shot registration for the next SN_PROCESS_REARM
   call. Returns 0 if there is no memory, in which case the caller simply
   does not get that registration re-armed for it (as without the flag). */
int sn__rearm_push(sn_port_t *port, uint32_t slot);

/* Note a reborn record (sn__rebirth) whose ENABLE goes to the kernel with
   the next call. Returns 0, the list unchanged, if there is no memory. */
int sn__deferred_push(sn_port_t *port, uint32_t slot);

/* The re-arms, written into kregs/memos; returns how many. */
uint32_t sn__prepare_rearms(sn_port_t *port, sn_registration_t *kregs, sn_memo_t *memos);

/* The deferred ENABLEs, written into kregs/memos; returns how many. */
uint32_t sn__prepare_deferred(sn_port_t *port, sn_registration_t *kregs, sn_memo_t *memos);

/* A deferred ENABLE that failed (memo kind SN_MEMO_DEFERRED_FAILED, its
   kreg holding the owner's key and filter): its owner, told it
   succeeded, hears of it as an error event in the sink. */
void sn__report_deferred_failures(const sn_registration_t *kregs, const sn_memo_t *memos,
                                  uint32_t from, uint32_t count, sn_sink_t *sink);

/* Release both lists (the port is closing; no thread inside). */
void sn__rearm_free(sn_port_t *port);

#endif /* SN_REARM_H */
