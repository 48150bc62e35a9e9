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

/* Note a removing record whose quiet REMOVE was not applied (a call that
   failed as a whole carried it): sent again with the next call. Returns
   0, the list unchanged, if there is no memory. */
int sn__unsent_push(sn_layer_t *port, uint32_t recno);

/* The quiet REMOVEs that were not applied, written into kregs/memos (at
   most `limit`; the rest stay queued); returns how many. */
uint32_t sn__prepare_unsent(sn_layer_t *port, sn_registration_t *kregs, sn_memo_t *memos,
                            uint32_t limit);

/* Whether the registration a record stands for is gone from the kernel
   because its socket is: closed without a REMOVE (closesocket()
   deregisters silently), its handle value perhaps handed to a new socket.
   Where the kernel can tell (epoll: the backend has no identify op), it
   refuses a renewal itself. ProcessSocketNotifications cannot: its
   ENABLE "overwrites the existing registration" or makes one, and
   nothing says its REMOVE or DISABLE checks which port holds the socket,
   so a renewal, a REMOVE or a DISABLE of a dead socket's registration
   would act on the stranger's socket that took its handle value --
   register it here under the dead socket's key, or remove it from the
   port (another loop's) that holds it. So before any of them
   (sn_translate.c, sn__prepare_rearms, sn_port.c's REMOVEs at close) the
   port reads what the socket is and compares it with what it was
   (sn__identity_differs), as it reads it for every renewal. Returns 0 for
   the same socket (what is known of it updated) or one the port cannot
   tell apart; else the error the change gets: the identify op's for a
   handle that is no socket, SN_ERROR_NOT_REGISTERED for another socket.
   Lock held (or no thread inside: close). */
SN_INLINE int sn__socket_gone(sn_layer_t *port, sn_record_t *record) {
    sn_identity_t now;
    int err;
    if (port->base.ops->identify == NULL)
        return 0;
    if ((err = port->base.ops->identify(&port->base, record->socket, &now)) != 0)
        return err;
    if (sn__identity_differs(&record->ident, &now))
        return SN_ERROR_NOT_REGISTERED;
    (void)sn__rec_identify(port, record, &now, 1);
    return 0;
}

/* What the socket is, read as its registration is made (an ENABLE that
   adds one): the reference for sn__socket_gone. Lock held. */
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
        /* Closed, its handle value perhaps another socket's: no re-arm, as
           epoll's MOD fails (see below); its owner's next change meets the
           same answer. */
        if (record->in_kernel && sn__socket_gone(port, record) != 0)
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

/* Release the lists (the port is closing; no thread inside). */
void sn__rearm_free(sn_layer_t *port);

#endif /* SN_REARM_H */
