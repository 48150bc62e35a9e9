/*
 * sn_rearm.c -- the work a port does on its own at the next call: the
 * re-arms of delivered one-shot registrations, and the ENABLEs that
 * waited for their socket's REMOVE event.
 *
 * One-shot re-arms (SN_PROCESS_REARM). A selector re-enables, at every
 * select, what it reported at the previous one: that is how one-shot
 * registrations give level-triggered selector semantics. The port keeps the
 * list of delivered one-shot registrations itself and appends their
 * ENABLEs to the next such call, so the steady state crosses the FFI with
 * nothing but the wait.
 *
 * One-shot in the kernel, everywhere. On epoll a re-arm is an
 * EPOLL_CTL_MOD of its own, and keeping the selector's items level and
 * persistent (the port keeping the one-shot rule) would save it. That was
 * tried and given up: a persistent item whose descriptor is closed while a
 * dup() or a forked child keeps the file open (an orphan) can no longer be
 * reached by number, fires at every wait, and only a rebuild of the whole
 * interest set gets rid of it -- O(registrations) per orphan, a new
 * descriptor when the process has none left, a watch per item when the
 * kernel has none left, and a new file behind the port's OS handle. A
 * one-shot orphan fires once, is dropped as stale (sn_run.c), and is disarmed
 * for good: O(1), with nothing to fail. docs/design.md has the figures.
 *
 * Deferred ENABLEs (SN_CAP_KEY_FIXED: the completion-port backends).
 * ProcessSocketNotifications keeps a socket's first completion key until
 * the REMOVE event of its registration has been dequeued (Microsoft's
 * article: "to change completion keys, deregister the notification, wait
 * for the SOCK_NOTIFY_EVENT_REMOVE message, and then re-register"). An ENABLE
 * that came while the REMOVE was on its way waits in its record
 * (sn_translate.c); when the event is in, the record is reborn under a new
 * generation (sn__rebirth, sn_table.c) and its ENABLE joins the deferred
 * list, which the next kernel call carries.
 *
 * The hazard of both lists: an entry may be stale by the time it is used
 * -- the record removed, retired, re-enabled by its owner or even reused
 * by another socket -- so each entry is checked against its record's
 * state when the call is prepared, never trusted. Both lists grow by
 * doubling; with no memory left a delivered registration is not re-armed
 * for the caller (it stays as it would without SN_PROCESS_REARM), and a
 * reborn record is retired, its owner hearing of it as an error event.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * (one-shot registrations and their re-enabling, the REMOVE event and
 * completion keys) and the ProcessSocketNotifications reference page;
 * epoll(7) on EPOLLONESHOT and its re-arm by EPOLL_CTL_MOD.
 */
#include "sn_rearm.h"

#include <stdlib.h>

int sn__recnos_grow_push(uint32_t **recnos, uint32_t *count, uint32_t *cap,
                         uint32_t first_cap, uint32_t recno) {
    if (*count == *cap) {
        uint32_t *bigger = sn__array_grow(*recnos, *cap, first_cap, UINT32_MAX,
                                          sizeof *bigger, cap);
        if (bigger == NULL)
            return 0;
        *recnos = bigger;
    }
    (*recnos)[(*count)++] = recno;
    return 1;
}

int sn__deferred_push(sn_layer_t *port, uint32_t recno) {
    return sn__recnos_grow_push(&port->deferred_recnos, &port->deferred_count,
                                &port->deferred_cap, 16, recno);
}

int sn__unsent_push(sn_layer_t *port, uint32_t recno) {
    return sn__recnos_grow_push(&port->unsent_recnos, &port->unsent_count,
                                &port->unsent_cap, 16, recno);
}

/* A quiet REMOVE is its caller's last word: it forgets the registration
   whatever the result. One that a call failing as a whole did not apply
   ("no changes occurred": the kernel still holds the registration, armed
   perhaps) is the port's to finish, or the registration would be re-armed
   and reported for nobody. Its record stays removing (nothing is reported
   for it), on this list, and the REMOVE goes again with the next call,
   under the same key. Lock held. */
uint32_t sn__prepare_unsent(sn_layer_t *port, sn_registration_t *kregs,
                            sn_memo_t *memos, uint32_t limit) {
    uint32_t i, n = 0, kept = 0;
    for (i = 0; i < port->unsent_count; i++) {
        uint32_t recno = port->unsent_recnos[i];
        sn_record_t *record = &port->records[recno];
        if (!sn__rec_removing(record))
            continue;   /* retired meanwhile */
        if (n == limit) {
            port->unsent_recnos[kept++] = recno;
            continue;
        }
        kregs[n].socket = record->socket;
        kregs[n].key = SN_KERNEL_KEY(recno, record->generation);
        kregs[n].events = 0;
        kregs[n].op = SN_OP_REMOVE;
        kregs[n].trigger = SN_TRIGGER_QUIET;
        kregs[n].result = 0;
        memos[n].recno = recno;
        memos[n].skip = 0;
        memos[n].kind = SN_MEMO_RESENT;
        memos[n].fresh = 0;
        memos[n].before = record->state;
        memos[n].waits = SN_WAITS_NONE;
        n++;
    }
    port->unsent_count = kept;
    return n;
}

/* The ENABLEs that waited for their socket's REMOVE event (sn__rebirth),
   under the record's new kernel key, at most `limit` of them: each may
   fail and take an entry of the call's answer, so a call carries no more
   than its answer has room for, and the rest wait, in order, for the next
   call. Written into kregs (lock held); returns how many. */
uint32_t sn__prepare_deferred(sn_layer_t *port, sn_registration_t *kregs,
                              sn_memo_t *memos, uint32_t limit) {
    uint32_t i, n = 0, kept = 0;
    for (i = 0; i < port->deferred_count; i++) {
        uint32_t recno = port->deferred_recnos[i];
        sn_record_t *record = &port->records[recno];
        if (!(SN_REC_BIT(record->state) &
              (SN_REC_BIT(SN_REC_ENABLED) | SN_REC_BIT(SN_REC_FIRED))) || record->in_kernel)
            continue;   /* removed, disabled or re-enabled by its owner meanwhile */
        if (n == limit || record->batch == port->batch_serial) {
            /* No room; or its owner's own ENABLE of it is in this batch,
               and one ENABLE per registration goes to the kernel in a
               call. Kept: a later call finds it enabled (and drops it), or
               still waiting, if that ENABLE was not applied. */
            port->deferred_recnos[kept++] = recno;
            continue;
        }
        /* A fresh registration under the new key, perhaps of another
           socket than the record's last one (a value reused). */
        sn__socket_identify(port, record);
        sn__own_enable(record, recno, (uint8_t)(record->trigger | SN_TRIGGER_ADD),
                       SN_MEMO_DEFERRED, &kregs[n], &memos[n]);
        n++;
    }
    port->deferred_count = kept;
    return n;
}

/* A deferred ENABLE that failed: its owner, told it succeeded, hears of it
   as an error event (lock held). */
void sn__report_deferred_failures(const sn_registration_t *kregs,
                                  const sn_memo_t *memos, uint32_t from,
                                  uint32_t count, sn_sink_t *sink) {
    uint32_t i;
    for (i = from; i < count; i++) {
        if (memos[i].kind != SN_MEMO_DEFERRED_FAILED)
            continue;
        if (sink->notes != NULL) {
            if (sink->n >= sink->cap)
                continue;
            sink->notes[sink->n].key = kregs[i].key;
            sink->notes[sink->n].events = SN_EVENT_ERR;
            sink->n++;
        } else {
            uint64_t mask = sn__select_mask(kregs[i].events, SN_EVENT_ERR);
            if (mask == 0 || 2 * (sink->n + 1) + sink->io > sink->cap)
                continue;
            sink->out[2 * sink->n] = kregs[i].key;
            sink->out[2 * sink->n + 1] = mask;
            sink->n++;
        }
    }
}

void sn__rearm_free(sn_layer_t *port) {
    free(port->rearm_recnos);
    free(port->deferred_recnos);
    free(port->unsent_recnos);
    port->rearm_recnos = NULL;
    port->deferred_recnos = NULL;
    port->unsent_recnos = NULL;
    port->rearm_count = port->rearm_cap = 0;
    port->deferred_count = port->deferred_cap = 0;
    port->unsent_count = port->unsent_cap = 0;
}
