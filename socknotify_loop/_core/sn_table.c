/*
 * sn_table.c -- the port's registration table: one record per registered
 * socket, found by its record number (its index in the records array,
 * half of its kernel key), with the generation that makes stale
 * notifications recognisable, and the socket index that finds a record
 * from its socket value (sn_hash.c).
 *
 * Why a table at all? ProcessSocketNotifications hands back whatever
 * completion key a registration was made with, and Microsoft's article
 * "Winsock socket state notifications" says two things that make raw
 * caller keys dangerous:
 *   - closesocket() deregisters a socket silently (no REMOVE event), yet
 *     notifications already queued on the port are still delivered;
 *   - socket handle values are reused at once by the next socket.
 * So a packet queued for a closed socket can surface after its handle value
 * was registered again, and with raw keys it would be reported to the new
 * registration. The kernel therefore never sees the caller's key. It sees
 * SN_KERNEL_KEY(recno, generation); the generation of a record number is
 * bumped every time the record number is freed, and a dequeued key whose
 * generation no longer matches its record is dropped. epoll gets the same
 * scheme, because the same contract must hold on every backend even where
 * the kernel would have been kind to us.
 *
 * A record is retired (record number freed, generation bumped) when:
 *   - the REMOVE event of a successful OP_REMOVE is dequeued (the event is
 *     passed on to the caller with the record's key: the documented moment
 *     when per-registration state may be freed), or at once for a caller
 *     that asked for quiet removes (the selector: stale packets are
 *     dropped by generation anyway);
 *   - an OP_REMOVE fails with any error: the socket is already gone
 *     (closed), so no REMOVE will ever come;
 *   - an OP_ENABLE names a socket value whose live record carries another
 *     caller key: the handle value was reused (or the caller re-keyed), and
 *     nothing queued under the old key may reach the new one;
 *   - an OP_ENABLE fails (the kernel's view of the socket is then unknown).
 *
 * The hazards here are memory ones: the records array moves when it grows
 * (a record pointer held across sn__record_new is stale), and a record
 * number must never be handed out twice (the stack of free record numbers
 * holds each once: retiring a FREE record does nothing). Record numbers
 * stay below 2**31 (SN_RECNO_LIMIT) and generations below 2**31, so no
 * kernel key has bit 63 set (sn_keys.h).
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * (silent deregistration on closesocket, queued notifications still
 * delivered, handle values reused at once); wepoll's port.c and sock.c,
 * which key their packets by a pointer to per-socket state and so must
 * keep that state alive until the kernel is done with it -- the generation
 * in the key is this port's answer to the same problem.
 */
#include "sn_table.h"
#include "sn_rearm.h"

#include <stdlib.h>
#include <string.h>

#define SN_RECNO_LIMIT 0x7fffffffu

static int sn__records_grow(sn_layer_t *port) {
    uint32_t old_cap = port->records_cap;
    uint32_t new_cap = 0;
    sn_record_t *records;
    uint32_t *free_recnos;
    uint32_t i;

    /* Both arrays grow to the same capacity: the free list holds at most
       every record number. records_cap moves only when both have. */
    records = sn__array_grow(port->records, old_cap, 64, SN_RECNO_LIMIT,
                             sizeof *records, &new_cap);
    if (records == NULL)
        return SN_ERROR_NO_MEMORY;
    port->records = records;
    free_recnos = sn__array_grow(port->free_recnos, old_cap, 64, SN_RECNO_LIMIT,
                                 sizeof *free_recnos, &new_cap);
    if (free_recnos == NULL)
        return SN_ERROR_NO_MEMORY;
    port->free_recnos = free_recnos;
    memset(records + old_cap, 0, (size_t)(new_cap - old_cap) * sizeof *records);
    for (i = old_cap; i < new_cap; i++)
        records[i].generation = 1;   /* no kernel key is ever 0 */
    /* Push new record numbers so that the lowest number is popped first. */
    for (i = new_cap; i > old_cap; i--)
        port->free_recnos[port->free_count++] = i - 1;
    port->records_cap = new_cap;
    return 0;
}

int sn__record_new(sn_layer_t *port, uint64_t socket, uint64_t user_key,
                   uint32_t *recno_out) {
    int err;
    uint32_t recno;
    sn_record_t *record;

    if (port->free_count == 0 && (err = sn__records_grow(port)) != 0)
        return err;
    if ((err = sn_hash_reserve(&port->index)) != 0)
        return err;
    recno = port->free_recnos[port->free_count - 1];
    record = &port->records[recno];
    if (!sn__rec_open(port, record, socket, user_key))
        return SN_ERROR_INVALID;   /* a free number whose record is not FREE */
    port->free_count--;
    /* Replaces the entry of an older record of the same socket value (one
       still REMOVING): lookups find the newest. */
    sn_hash_put(&port->index, socket, (uint64_t)recno + 1);
    port->live_count++;
    *recno_out = recno;
    return 0;
}

void sn__record_retire(sn_layer_t *port, uint32_t recno) {
    sn_record_t *record = &port->records[recno];
    /* Every caller checks first (a generation that matches belongs to a
       used record): a retire of a free record would push its number twice
       on the free stack, so it is refused (counted, and reported by the
       checked build). */
    if (!sn__rec_free(port, record))
        return;
    /* Only this record's entry: a newer record of the same socket value
       may have replaced it. */
    sn_hash_del(&port->index, record->socket, (uint64_t)recno + 1);
    port->free_recnos[port->free_count++] = recno;
    port->live_count--;
}

int sn__rebirth(sn_layer_t *port, uint32_t recno) {
    if (!sn__deferred_push(port, recno)) {
        sn__record_retire(port, recno);
        return 0;
    }
    if (!sn__rec_reborn(port, &port->records[recno])) {
        port->deferred_count--;   /* taken back: nothing was reborn */
        return 0;
    }
    return 1;
}

static const char *const sn__state_names[SN_REC_STATES] = {
    "FREE", "ENABLED", "FIRED", "DISABLED", "REMOVING", "REKEYING",
};

const char *sn__rec_state_name(unsigned state) {
    return state < SN_REC_STATES ? sn__state_names[state] : "(not a state)";
}

#ifdef SN_CHECK_TRANSITIONS
#include <stdio.h>

void (*sn__transition_hook)(const char *transition, unsigned state);
#endif

int sn__transition_refused(sn_layer_t *port, const char *transition, unsigned state,
                           const char *file, int line) {
    SN_COUNT(&port->base, SN_COUNT_REFUSED);
#ifdef SN_CHECK_TRANSITIONS
    if (sn__transition_hook != NULL) {
        sn__transition_hook(transition, state);
        return 0;
    }
    fprintf(stderr, "%s:%d: record transition '%s' refused from state %s\n",
            file, line, transition, sn__rec_state_name(state));
    abort();
#else
    (void)transition;
    (void)state;
    (void)file;
    (void)line;
    return 0;
#endif
}

void sn__table_free(sn_layer_t *port) {
    free(port->records);
    free(port->free_recnos);
    sn_hash_free(&port->index);
    port->records = NULL;
    port->free_recnos = NULL;
    port->records_cap = port->free_count = port->live_count = 0;
}
