/*
 * sn_table.h -- the port's registration table (sn_table.c): records, the
 * record numbers that number them, their generations, and the socket index.
 * Internal to the port's files; cffi never sees it. Everything here is
 * called with the port's lock held.
 */
#ifndef SN_TABLE_H
#define SN_TABLE_H

#include "sn_record.h"

/* The used (live or removing) record of `socket` and its record number, or NULL. Inline:
   every change a call translates looks its socket up. */
SN_INLINE sn_record_t *sn__lookup(sn_layer_t *port, uint64_t socket,
                                  uint32_t *recno) {
    uint64_t entry = sn_hash_get(&port->index, socket);
    if (entry == SN_HASH_EMPTY)
        return NULL;
    *recno = (uint32_t)(entry - 1);
    return &port->records[*recno];
}

/* A fresh record (ENABLED) for socket, entered in the index: 0 and *recno_out,
   or SN_ERROR_NO_MEMORY with the table unchanged. May move the records
   array: a record pointer read before the call is stale after it. */
int sn__record_new(sn_layer_t *port, uint64_t socket, uint64_t user_key,
                   uint32_t *recno_out);

/* Retire a used record: its number freed, its index entry gone, every
   kernel key it ever issued stale (sn__rec_free). */
void sn__record_retire(sn_layer_t *port, uint32_t recno);

/* A REKEYING record whose REMOVE event came (or whose REMOVE failed)
   starts again under a new generation (sn__rec_reborn), its ENABLE on the
   deferred list (sn_rearm.c). Returns 0 if there was no memory to
   remember that: the record is then retired. */
int sn__rebirth(sn_layer_t *port, uint32_t recno);

/* Release the table's memory (the port is closing; no thread inside). */
void sn__table_free(sn_layer_t *port);

#endif /* SN_TABLE_H */
