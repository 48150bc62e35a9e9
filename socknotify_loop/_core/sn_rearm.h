/*
 * sn_rearm.h -- the port's two lists of work it does on its own in the
 * next call (sn_rearm.c): the one-shot re-arms (SN_PROCESS_REARM) and the
 * ENABLEs that waited for their socket's REMOVE event (SN_CAP_KEY_FIXED).
 * Internal to the port's files; cffi never sees it. Everything here is
 * called with the port's lock held.
 */
#ifndef SN_REARM_H
#define SN_REARM_H

#include "sn_call.h"

/* Append `recno` to a growable list of record numbers, growing it
   (doubling from `first_cap`). Returns 0, leaving the list as it was, if
   there is no memory. */
int sn__recnos_grow_push(uint32_t **recnos, uint32_t *count, uint32_t *cap,
                         uint32_t first_cap, uint32_t recno);

/* Note a delivered one-shot registration for the next SN_PROCESS_REARM
   call. Returns 0 if there is no memory, in which case the caller simply
   does not get that registration re-armed for it (as without the flag).
   Inline, as every re-arm of a busy selector passes here. */
SN_INLINE int sn__rearm_push(sn_layer_t *port, uint32_t recno) {
    if (port->rearm_count < port->rearm_cap) {
        port->rearm_recnos[port->rearm_count++] = recno;
        return 1;
    }
    return sn__recnos_grow_push(&port->rearm_recnos, &port->rearm_count,
                                &port->rearm_cap, 64, recno);
}

/* Note a reborn record (sn__rebirth) whose ENABLE goes to the kernel with
   the next call. Returns 0, the list unchanged, if there is no memory. */
int sn__deferred_push(sn_layer_t *port, uint32_t recno);

/* Whether the socket under a record's handle value is no longer the one
   its registration was made for: closed without a REMOVE (closesocket()
   deregisters silently) and the value handed to a new socket. Where the
   kernel can tell (epoll: the backend has no identify op), it refuses the
   renewal itself. ProcessSocketNotifications cannot: its ENABLE "overwrites
   the existing registration" or makes one, so renewing a dead socket's
   registration would tie a stranger's socket to this port, its readiness
   reported under the dead socket's key and its owner's own port refused
   ("one socket, one port"). So a renewal (a re-arm; a caller's modify,
   which then makes a new registration: sn_translate.c) first reads what
   the socket is and compares it with what it was
   (sn__identity_differs); the same socket has what is known of it
   updated. A value that is no socket at all is left to the kernel, which
   fails it. Lock held. */
SN_INLINE int sn__socket_replaced(sn_layer_t *port, sn_record_t *record) {
    sn_identity_t now;
    if (port->base.ops->identify == NULL ||
        port->base.ops->identify(&port->base, record->socket, &now) != 0)
        return 0;
    if (sn__identity_differs(&record->ident, &now))
        return 1;
    (void)sn__rec_identify(port, record, &now, 1);
    return 0;
}

/* What the socket is, read as its registration is made (an ENABLE that
   adds one): the reference for sn__socket_replaced. Lock held. */
SN_INLINE void sn__socket_identify(sn_layer_t *port, sn_record_t *record) {
    sn_identity_t now;
    if (port->base.ops->identify == NULL)
        return;
    if (port->base.ops->identify(&port->base, record->socket, &now) != 0)
        memset(&now, 0, sizeof now);
    (void)sn__rec_identify(port, record, &now, 0);
}

/* One ENABLE of the port's own for record `recno`, under its current
   kernel key and with its last filter, written into *kreg and *memo: what
   a re-arm and a deferred ENABLE have in common (`trigger` and `kind` say
   which). */
SN_INLINE void sn__own_enable(const sn_record_t *record, uint32_t recno, uint8_t trigger,
                              uint8_t kind, sn_registration_t *kreg, sn_memo_t *memo) {
    kreg->socket = record->socket;
    kreg->key = SN_KERNEL_KEY(recno, record->generation);
    kreg->events = record->events;
    kreg->op = SN_OP_ENABLE;
    kreg->trigger = trigger;
    kreg->result = 0;
    memo->recno = recno;
    memo->skip = 0;
    memo->kind = kind;
    memo->waits = SN_WAITS_NONE;
}

/* The port's own re-arms (SN_PROCESS_REARM): an ENABLE, with the filter
   and trigger of the registration's last ENABLE, for every one-shot
   registration delivered since the last such call and still live. Written
   into kregs after the caller's changes; returns how many. Inline: a busy
   selector re-arms at every select. */
SN_INLINE uint32_t sn__prepare_rearms(sn_layer_t *port, sn_registration_t *kregs,
                                     sn_memo_t *memos) {
    uint32_t i, n = 0;
    for (i = 0; i < port->rearm_count; i++) {
        uint32_t recno = port->rearm_recnos[i];
        sn_record_t *record = &port->records[recno];
        if (record->state != SN_REC_FIRED || !sn__rec_rearm(port, record))
            continue;   /* removed, disabled or re-enabled by its owner meanwhile */
        /* Closed, its handle value another socket's: no re-arm, as epoll's
           MOD fails (see below). */
        if (record->in_kernel && sn__socket_replaced(port, record))
            continue;
        /* A re-arm renews what the kernel has: if the descriptor was
           closed meanwhile, it must fail, not arm whatever file took the
           number. The failure reaches nobody at once (sn__settle keeps
           the record, ENABLED with nothing armed): the owner's next
           change meets the same error and retires it. */
        sn__own_enable(record, recno,
                       (uint8_t)(record->trigger | SN_TRIGGER_REARM |
                                 (record->in_kernel ? SN_TRIGGER_MODIFY_ONLY
                                                    : SN_TRIGGER_ADD)),
                       SN_MEMO_REARM, &kregs[n], &memos[n]);
        n++;
    }
    port->rearm_count = 0;
    return n;
}


/* The deferred ENABLEs, at most `limit` (the rest stay queued), written
   into kregs/memos; returns how many. */
uint32_t sn__prepare_deferred(sn_layer_t *port, sn_registration_t *kregs, sn_memo_t *memos,
                              uint32_t limit);

/* A deferred ENABLE that failed (memo kind SN_MEMO_DEFERRED_FAILED, its
   kreg holding the owner's key and filter): its owner, told it
   succeeded, hears of it as an error event in the sink. */
void sn__report_deferred_failures(const sn_registration_t *kregs, const sn_memo_t *memos,
                                  uint32_t from, uint32_t count, sn_sink_t *sink);

/* Release both lists (the port is closing; no thread inside). */
void sn__rearm_free(sn_layer_t *port);

#endif /* SN_REARM_H */
