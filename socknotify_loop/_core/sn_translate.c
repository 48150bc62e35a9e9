/*
 * sn_translate.c -- a call's changes on their way in and their verdicts on
 * their way back: the caller's registrations turned into kernel ones
 * (caller key -> kernel key, the checks ProcessSocketNotifications makes,
 * what one kernel key per socket demands), and the kernel's per-
 * registration results read back into the table, including the undoing of
 * a call that failed as a whole.
 *
 * One kernel key per socket (SN_CAP_KEY_FIXED: the completion-port
 * backends). ProcessSocketNotifications keeps a socket's first completion
 * key until the REMOVE event of its registration has been dequeued ("to
 * change completion keys, deregister the notification, wait for the
 * SOCK_NOTIFY_EVENT_REMOVE message, and then re-register"). A new kernel
 * key before that would be ignored by the kernel, every later packet would
 * carry the old one and be dropped as stale: a deaf socket. So there:
 *   - a quiet REMOVE keeps its record (REMOVING) until the REMOVE event;
 *   - an ENABLE of a REMOVING record waits in it (reborn) and goes to the
 *     kernel under a new generation once the event is dequeued (or at once
 *     if the REMOVE failed: the socket was closed); the ENABLEs that waited
 *     go out with the next kernel call (sn__prepare_deferred), within the
 *     same sn_port_process() when its wait dequeued the event;
 *   - an ENABLE of a LIVE record with another caller key (re-key, or a
 *     value reused after a silent closesocket(): the port cannot tell) is
 *     a quiet REMOVE whose ENABLE waits the same way;
 *   - nothing but the REMOVE event is reported for a REMOVING record, and
 *     nothing at all for a DISABLEd one ("notifications that have already
 *     been queued might still be delivered": not to our caller);
 *   - a call that failed as a whole (SN_RESULT_UNAPPLIED: "the entire
 *     operation failed, and no changes occurred") puts every record back
 *     as it was, re-arms and waiting ENABLEs included;
 *   - close() REMOVEs every live registration first, so that a socket
 *     outliving the port is not left tied to it (sn_port.c).
 *
 * A failed caller change never leaves the call blocked: the port layer
 * turns the wait into a poll when one was refused before the kernel, and
 * the backends do when the kernel refused one, so the caller hears of the
 * failure now rather than whenever some other event ends the wait. The
 * exception is a quiet REMOVE (the selector's): its caller asked to hear
 * nothing of the removal, and the registration is gone either way.
 *
 * Removes that name another registration. A REMOVE (or DISABLE) carries
 * the caller's key as well as the socket; for a caller that asked for
 * quiet removes (the selector) the key must be the record's. Otherwise a
 * REMOVE issued for a registration that its owner has since replaced
 * (closed, number reused, registered again by another thread) would take
 * the new registration away.
 *
 * The hazard of this file is the record pointer: creating a record may
 * move the records array (sn__record_new), so after it the record is read
 * by record number again, never through a pointer taken before. And every verdict
 * is checked against the record's current generation: a verdict about an
 * older generation of the record number has nothing left to settle.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and the ProcessSocketNotifications reference page (trigger rules, the
 * per-registration result, "the entire operation failed, and no changes
 * occurred", changing completion keys); epoll_ctl(2) for the MOD/ADD
 * errors the epoll backend maps onto the same verdicts.
 */
#include "sn_translate.h"
#include "sn_rearm.h"
#include "sn_table.h"

static int sn__valid_trigger(const sn_backend_ops_t *ops, uint8_t trigger) {
    switch (sn__trigger_verdict(trigger, (unsigned)ops->triggers)) {
    case 0:
        return 0;
    case SN_TRIGGER_VERDICT_UNSUPPORTED:
        return SN_ERROR_NOT_SUPPORTED;
    default:
        return SN_ERROR_INVALID;
    }
}

/* What translating one of the caller's changes came to (besides an error
   code, > 0): its kernel registration goes to the kernel under the
   record's key (SN_PREP_KEYED), or the change was arranged whole -- its
   kernel registration and memo written (SN_PREP_DONE). */
enum { SN_PREP_KEYED = 0, SN_PREP_DONE = -1 };

/* The caller's ENABLE at index `i` of the batch, for `record` (the used
   record of its socket, or NULL) at *recno (lock held). */
static int sn__prepare_enable(sn_layer_t *port, const sn_registration_t *reg,
                              sn_registration_t *kregs, uint32_t i, sn_memo_t *p,
                              sn_record_t *record, uint32_t *recno) {
    sn_registration_t *kreg = &kregs[i];
    int key_fixed = (port->base.ops->caps & SN_CAP_KEY_FIXED) != 0, err;
    if (reg->events & ~(SN_EVENT_IN | SN_EVENT_OUT | SN_EVENT_HANGUP))
        return SN_ERROR_INVALID;
    if ((err = sn__valid_trigger(port->base.ops, reg->trigger)) != 0)
        return err;
    if (record != NULL && record->batch == port->batch_serial &&
        record->state == SN_REC_ENABLED && record->user_key == reg->key) {
        /* Enabled already in this batch (register, then modify, before the
           call): one ENABLE per registration reaches the kernel, with the
           last filter. A kernel may refuse a second ENABLE of a
           registration the first armed. */
        sn_registration_t *first = &kregs[record->batch_slot];
        if (!sn__rec_merge(port, record, reg->events, reg->trigger))
            return SN_ERROR_INVALID;
        first->events = reg->events;
        first->trigger = (uint8_t)(reg->trigger | (first->trigger & SN_TRIGGER_INTERNAL));
        p->skip = 1;
        p->kind = SN_MEMO_MERGED;
        p->recno = record->batch_slot;
        kreg->op = SN_OP_NONE;
        return SN_PREP_DONE;
    }
    if (key_fixed && record != NULL && sn__rec_removing(record)) {
        /* The kernel keeps this socket's key until the REMOVE event is
           dequeued: the ENABLE waits for it in the record, and goes to the
           kernel under a new key then. */
        if (!sn__rec_wait(port, record, reg->key, reg->events, reg->trigger))
            return SN_ERROR_INVALID;
        p->recno = *recno;
        p->skip = 1;
        p->waits = SN_WAITS_HELD;
        kreg->op = SN_OP_NONE;
        return SN_PREP_DONE;
    }
    /* A live registration whose socket is gone: closed without a REMOVE
       (closesocket() ended its registration), its handle value perhaps
       another socket's now (the selector makes an unregister and a
       register before the next select one ENABLE). This ENABLE makes a
       new registration, which nothing queued for the old one may reach:
       the old record retires, with no REMOVE, which would act on the
       stranger's socket (sn__socket_gone). */
    if (record != NULL && sn__rec_live(record) && record->in_kernel &&
        sn__socket_gone(port, record) != 0) {
        sn__record_retire(port, *recno);
        record = NULL;
    }
    /* Re-keyed: a new registration of the same socket. */
    if (record != NULL && sn__rec_live(record) && record->user_key != reg->key) {
        if (key_fixed) {
            /* The kernel keeps the old key for a live registration, and
               whatever it queued under it must not reach the new key. So:
               a quiet REMOVE now, and this ENABLE waits in the record for
               its REMOVE event (or goes at once if the REMOVE fails: the
               socket was closed meanwhile, and the kernel holds nothing). */
            p->before = record->state;
            if (!sn__rec_rekey(port, record, reg->key, reg->events, reg->trigger))
                return SN_ERROR_INVALID;
            p->waits = SN_WAITS_REKEY;
            p->recno = *recno;
            kreg->op = SN_OP_REMOVE;
            kreg->events = 0;
            kreg->trigger = SN_TRIGGER_QUIET;
            kreg->key = SN_KERNEL_KEY(*recno, record->generation);
            return SN_PREP_DONE;
        }
        /* Whatever is queued under the old key must not reach this one. */
        sn__record_retire(port, *recno);
        record = NULL;
    }
    if (record == NULL || !sn__rec_live(record)) {
        /* May grow (move) the table: `record` is not read after. */
        if ((err = sn__record_new(port, reg->socket, reg->key, recno)) != 0)
            return err;
        p->fresh = 1;
    }
    record = &port->records[*recno];
    if (!record->in_kernel)
        sn__socket_identify(port, record);
    kreg->trigger |= record->in_kernel ? SN_TRIGGER_MODIFY_ONLY : SN_TRIGGER_ADD;
    p->before = record->state;
    if (!sn__rec_enable(port, record, reg->events, reg->trigger, i)) {
        if (p->fresh)
            sn__record_retire(port, *recno);
        return SN_ERROR_INVALID;
    }
    return SN_PREP_KEYED;
}

/* The caller's DISABLE or REMOVE, for `record` (the used record of its
   socket, or NULL) at `recno` (lock held). */
static int sn__prepare_removal(sn_layer_t *port, uint32_t flags, const sn_registration_t *reg,
                               sn_registration_t *kreg, sn_memo_t *p, sn_record_t *record,
                               uint32_t recno) {
    int err;
    if (reg->op == SN_OP_REMOVE && record != NULL &&
        record->state == SN_REC_REKEYING && record->next_key == reg->key) {
        /* The ENABLE that waits for the REMOVE event is taken back: the
           kernel never heard of it. */
        if (!sn__rec_take_back(port, record))
            return SN_ERROR_INVALID;
        p->skip = 1;
        kreg->op = SN_OP_NONE;
        return SN_PREP_DONE;
    }
    /* Input from outside: a change for no live registration of the
       caller's is refused with an error, never a transition. */
    if (record == NULL || !sn__rec_live(record) ||
        ((flags & SN_PROCESS_QUIET_REMOVE) && record->user_key != reg->key))
        return SN_ERROR_NOT_REGISTERED;
    /* Closed since it was registered, its handle value perhaps another
       socket's: closesocket() ended the registration, and a REMOVE or
       DISABLE sent now would act on the stranger's (sn__socket_gone). The
       record retires; the change is answered with why. */
    if (record->in_kernel && (err = sn__socket_gone(port, record)) != 0) {
        sn__record_retire(port, recno);
        return err;
    }
    /* A FIRED record leaves the re-arm list's concern either way: nothing
       for a re-arm to renew. */
    p->before = record->state;
    if (reg->op == SN_OP_REMOVE) {
        if (!sn__rec_remove(port, record, (flags & SN_PROCESS_QUIET_REMOVE) != 0))
            return SN_ERROR_INVALID;
        if (flags & SN_PROCESS_QUIET_REMOVE)
            kreg->trigger |= SN_TRIGGER_QUIET;
        return SN_PREP_KEYED;
    }
    /* Nothing is reported from now on, even what the kernel had queued
       before ("might still be delivered"). */
    if (!sn__rec_disable(port, record))
        return SN_ERROR_INVALID;
    /* With the trigger of the ENABLE it ends, whatever the caller gave:
       the reference page's "one of LEVEL or EDGE must be supplied" may
       hold for DISABLE too. */
    kreg->trigger = record->trigger;
    return SN_PREP_KEYED;
}

/* Translate the caller's registrations into kernel ones (lock held).
   Returns how many of them were refused before reaching the kernel whose
   failure is news (sn__caller_news). */
uint32_t sn__prepare(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                     sn_registration_t *kregs, sn_memo_t *memos, uint32_t count) {
    uint32_t i, refused = 0;
    /* A new batch: what an earlier one marked is no longer in it. */
    if (++port->batch_serial == 0)
        port->batch_serial = 1;
    for (i = 0; i < count; i++) {
        sn_registration_t *reg = &regs[i];
        sn_registration_t *kreg = &kregs[i];
        sn_memo_t *p = &memos[i];
        sn_record_t *record;
        uint32_t recno = 0;
        int err;

        *kreg = *reg;
        kreg->result = 0;
        reg->result = 0;
        p->skip = 0;
        p->kind = SN_MEMO_CALLER;
        p->fresh = 0;
        p->waits = SN_WAITS_NONE;
        p->before = SN_REC_FREE;
        record = sn__lookup(port, reg->socket, &recno);

        switch (reg->op) {
        case SN_OP_ENABLE:
            err = sn__prepare_enable(port, reg, kregs, i, p, record, &recno);
            break;
        case SN_OP_DISABLE:
        case SN_OP_REMOVE:
            err = sn__prepare_removal(port, flags, reg, kreg, p, record, recno);
            break;
        case SN_OP_NONE:
            p->skip = 1;
            continue;
        default:
            err = SN_ERROR_INVALID;
            break;
        }
        if (err == SN_PREP_DONE)
            continue;
        if (err != SN_PREP_KEYED) {
            reg->result = (uint32_t)err;
            p->skip = 1;
            refused += (uint32_t)sn__caller_news(reg, flags);
            /* NONE is harmless to the kernel: it keeps the batch aligned. */
            kreg->op = SN_OP_NONE;
            continue;
        }
        p->recno = recno;
        kreg->key = SN_KERNEL_KEY(recno, port->records[recno].generation);
    }
    return refused;
}

/* A registration a call that failed as a whole carried
   (SN_RESULT_UNAPPLIED_BIT: "no changes occurred"): put the record back
   as it was before the call (lock held). */
static void sn__unapply(sn_layer_t *port, const sn_registration_t *kreg, sn_memo_t *p) {
    sn_record_t *record = &port->records[p->recno];
    if (record->state == SN_REC_FREE ||
        SN_KERNEL_KEY(p->recno, record->generation) != kreg->key)
        return;
    if (p->kind == SN_MEMO_REARM) {
        /* Back on the re-arm list, unless its owner changed it meanwhile. */
        if (record->state == SN_REC_ENABLED && sn__rearm_push(port, p->recno) &&
            !sn__rec_fire(port, record, 0))
            port->rearm_count--;   /* refused: off the list again */
        return;
    }
    if (p->kind == SN_MEMO_DEFERRED) {
        if (!sn__deferred_push(port, p->recno))
            sn__record_retire(port, p->recno);
        return;
    }
    if (p->kind == SN_MEMO_RESENT) {
        /* Still removing: once more with the next call, memory allowing
           (else the registration stays the kernel's under a key nothing
           reports, as after a failed REMOVE). */
        (void)sn__unsent_push(port, p->recno);
        return;
    }
    if (kreg->op == SN_OP_ENABLE && p->fresh) {
        sn__record_retire(port, p->recno);   /* the kernel never had it */
        return;
    }
    if (kreg->op != SN_OP_ENABLE && kreg->op != SN_OP_DISABLE && kreg->op != SN_OP_REMOVE)
        return;
    /* A one-shot registration that had fired is still disarmed in the
       kernel: back on the re-arm list, or its owner would never hear of
       it again. */
    if (p->before == SN_REC_FIRED && !sn__rearm_push(port, p->recno))
        p->before = SN_REC_ENABLED;
    (void)sn__rec_restore(port, record, p->before);
}

/* A change the batch skipped (lock held): one merged into an earlier
   ENABLE of the batch takes that one's verdict; a re-key's ENABLE whose
   REMOVE a call that failed as a whole carried hears the call's error. */
static void sn__settle_skipped(sn_layer_t *port, sn_registration_t *regs, const sn_memo_t *p,
                               uint32_t i, uint32_t callers, int failed_whole,
                               int call_error) {
    if (p->kind == SN_MEMO_MERGED && i < callers) {
        /* Merged into an earlier ENABLE of the batch: its verdict. */
        regs[i].result = regs[p->recno].result;
        return;
    }
    if (p->waits != SN_WAITS_NONE && failed_whole) {
        /* Its REMOVE never reached the kernel: nothing to wait
           for. (Unless the REMOVE event came meanwhile and the
           record was reborn, or the owner took the ENABLE back.) */
        if (port->records[p->recno].state == SN_REC_REKEYING)
            (void)sn__rec_take_back(port, &port->records[p->recno]);
        regs[i].result = (uint32_t)call_error;
    }
}

/* A registration the kernel did not apply (SN_RESULT_UNAPPLIED_BIT; lock
   held). Returns 1 if it is settled; 0 if its socket is gone meanwhile,
   its result then the error it failed with, to be settled as any failed
   change is. `reg` is the caller's, NULL for one of the port's own. */
static int sn__settle_unapplied(sn_layer_t *port, sn_registration_t *reg,
                                sn_registration_t *kreg, sn_memo_t *p, int call_error) {
    /* Not applied: a call that carried it failed as a whole, and
       "no changes occurred". Unless its socket is gone meanwhile
       (closesocket() ended the registration: then it failed as any
       change fails, sn__settle_refused), the record goes back to what it was
       -- a re-key's REMOVE undone with the ENABLE that waited --
       and the change's owner hears the call's error. */
    uint32_t error = kreg->result == SN_RESULT_UNAPPLIED
                         ? (uint32_t)call_error
                         : kreg->result & ~SN_RESULT_UNAPPLIED_BIT;
    sn_record_t *record = &port->records[p->recno];
    if (kreg->result == SN_RESULT_UNAPPLIED || record->state == SN_REC_FREE ||
        SN_KERNEL_KEY(p->recno, record->generation) != kreg->key ||
        sn__socket_gone(port, record) == 0) {
        /* A quiet REMOVE is the port's to finish: its caller
           forgets the registration (sn__prepare_unsent). */
        if (kreg->op == SN_OP_REMOVE && (kreg->trigger & SN_TRIGGER_QUIET) &&
            p->waits == SN_WAITS_NONE && record->state == SN_REC_REMOVING &&
            SN_KERNEL_KEY(p->recno, record->generation) == kreg->key &&
            sn__unsent_push(port, p->recno)) {
            if (reg != NULL)
                reg->result = 0;
            return 1;
        }
        if (reg != NULL)
            reg->result = error;
        sn__unapply(port, kreg, p);
        return 1;
    }
    kreg->result = error;
    return 0;
}

/* A change the kernel applied, of the record's current generation (lock
   held). */
static void sn__settle_applied(sn_layer_t *port, uint32_t flags, const sn_registration_t *kreg,
                               uint32_t recno, sn_record_t *record, int key_fixed) {
    if (kreg->op == SN_OP_ENABLE)
        (void)sn__rec_held(port, record, 1);
    /* In the backend's own meaning: epoll's DISABLE deletes the
       item; ProcessSocketNotifications' disarms a registration
       that stays (SN_CAP_DISABLE_KEEPS), which the next ENABLE
       renews, with a renewal's checks. */
    else if (kreg->op == SN_OP_DISABLE &&
             !(port->base.ops->caps & SN_CAP_DISABLE_KEEPS))
        (void)sn__rec_held(port, record, 0);
    /* A quiet REMOVE retires now: nothing more will be reported
       under this registration's key. Not where the kernel keeps
       the key until the REMOVE event: the record waits for it. */
    else if (kreg->op == SN_OP_REMOVE && (flags & SN_PROCESS_QUIET_REMOVE) &&
             !key_fixed)
        sn__record_retire(port, recno);
}

/* A change the kernel refused, of the record's current generation (lock
   held). `caller`: the change is the caller's, not one of the port's own. */
static void sn__settle_refused(sn_layer_t *port, sn_registration_t *kreg, sn_memo_t *p,
                               sn_record_t *record, int caller) {
    if (p->kind == SN_MEMO_DEFERRED) {
        /* An ENABLE its owner was told succeeded (it waited for a
           REMOVE event): the owner hears of the failure as an error
           event, reported by sn__run with these fields. */
        kreg->key = record->user_key;
        kreg->events = record->events;
        p->kind = SN_MEMO_DEFERRED_FAILED;
        sn__record_retire(port, p->recno);
        return;
    }
    if (p->kind == SN_MEMO_RESENT) {
        /* A quiet REMOVE sent again failed: the socket is gone (or
           the registration with it), and no REMOVE event will come. */
        if (record->state == SN_REC_REKEYING)
            sn__rebirth(port, p->recno);
        else
            sn__record_retire(port, p->recno);
        return;
    }
    /* A failed re-arm of ours: the descriptor went away under its
       owner (the record is not retired: see sn__prepare_rearms). The kernel has nothing armed for it, so nothing can be
       delivered; the record stays, so that the owner's next change
       meets the same error (a modify, like epoll_ctl MOD: ENOENT) and
       its REMOVE retires it. */
    if (!caller)
        return;
    /* A failed REMOVE means the socket is already gone (closesocket
       deregistered it silently): no REMOVE event will come, so an
       ENABLE waiting for one goes ahead now. A failed ENABLE leaves
       the kernel's view unknown. Either way nothing more may be
       delivered under this registration's key. */
    if (kreg->op == SN_OP_REMOVE && record->state == SN_REC_REKEYING)
        sn__rebirth(port, p->recno);
    else if (kreg->op == SN_OP_REMOVE || kreg->op == SN_OP_ENABLE)
        sn__record_retire(port, p->recno);
}

/* Read the kernel's verdicts back into the table (lock held). The first
   `callers` kernel registrations are the caller's; the rest are the port's
   own re-arms and deferred ENABLEs, whose verdicts settle the table but
   belong to no caller registration. `call_error` is the call's error, for
   the registrations of a call that failed as a whole. */
void sn__settle(sn_layer_t *port, uint32_t flags, sn_registration_t *regs,
                sn_registration_t *kregs, sn_memo_t *memos,
                uint32_t callers, uint32_t count, int call_error) {
    uint32_t i;
    int key_fixed = (port->base.ops->caps & SN_CAP_KEY_FIXED) != 0;
    int failed_whole = 0;
    for (i = 0; i < count; i++)
        failed_whole |= !memos[i].skip && kregs[i].result == SN_RESULT_UNAPPLIED;
    if (failed_whole && call_error == 0)
        call_error = SN_ERROR_INVALID;
    for (i = 0; i < count; i++) {
        sn_memo_t *p = &memos[i];
        sn_record_t *record;
        if (p->skip) {
            sn__settle_skipped(port, regs, p, i, callers, failed_whole, call_error);
            continue;
        }
        if ((kregs[i].result & SN_RESULT_UNAPPLIED_BIT) &&
            sn__settle_unapplied(port, i < callers ? &regs[i] : NULL, &kregs[i], p,
                                 call_error))
            continue;
        if (i < callers)
            /* A re-key's REMOVE is ours: the caller's ENABLE waits. */
            regs[i].result = p->waits == SN_WAITS_REKEY ? 0 : kregs[i].result;
        record = &port->records[p->recno];
        /* A verdict about an older generation of this record number has nothing
           left to settle. */
        if (SN_KERNEL_KEY(p->recno, record->generation) != kregs[i].key)
            continue;
        if (kregs[i].result == 0)
            sn__settle_applied(port, flags, &kregs[i], p->recno, record, key_fixed);
        else
            sn__settle_refused(port, &kregs[i], p, record, i < callers);
    }
}
