/*
 * sn_hash.h -- the core's one map from a socket value to a 64-bit value
 * (sn_hash.c): the port's socket index (socket -> record number + 1,
 * sn_table.c), the AFD polyfill's table (socket -> its afd_sock_t,
 * sn_afd_sock.c), the set of sockets the PSN backend handed to the
 * polyfill (sn_iocp_fallback.c) and the strict model's registrations
 * (sn_model.c)
 * are all this table. cffi never sees this file.
 *
 * Open addressing with linear probing, kept at most half full (entries and
 * tombstones together), each cell holding the socket beside its value so
 * that a probe never leaves the cell array. Socket values are small
 * integers (descriptors) or multiples of 4 (Windows handles): a
 * multiplicative mix spreads both over the cells.
 *
 * Values: anything but SN_HASH_EMPTY (0) and SN_HASH_TOMBSTONE (all ones),
 * which mark free and deleted cells. A record number is stored plus one, a
 * pointer as it is.
 *
 * No lock inside: each owner guards its table with its own lock.
 */
#ifndef SN_HASH_H
#define SN_HASH_H

#include "sn_platform.h"

#define SN_HASH_EMPTY      UINT64_C(0)
#define SN_HASH_TOMBSTONE  UINT64_C(0xFFFFFFFFFFFFFFFF)

typedef struct sn_hash_cell {
    uint64_t socket;
    uint64_t value;     /* SN_HASH_EMPTY, SN_HASH_TOMBSTONE, or an entry */
} sn_hash_cell_t;

/* All zeros is an empty table. */
typedef struct sn_hash {
    sn_hash_cell_t *cells;
    uint32_t cap;       /* power of two; 0 until the first reserve */
    uint32_t used;      /* entries + tombstones */
    uint32_t count;     /* entries */
} sn_hash_t;

SN_INLINE uint32_t sn_hash_mix(uint64_t socket) {
    uint64_t h = socket * UINT64_C(0x9E3779B97F4A7C15);
    return (uint32_t)(h >> 32);
}

/* The value stored for `socket`, or SN_HASH_EMPTY. Inline: the port looks
   a socket up for every change it translates. */
SN_INLINE uint64_t sn_hash_get(const sn_hash_t *table, uint64_t socket) {
    uint32_t mask, pos;
    if (table->cap == 0)
        return SN_HASH_EMPTY;
    mask = table->cap - 1;
    pos = sn_hash_mix(socket) & mask;
    for (;;) {
        const sn_hash_cell_t *cell = &table->cells[pos];
        if (cell->value == SN_HASH_EMPTY)
            return SN_HASH_EMPTY;
        if (cell->value != SN_HASH_TOMBSTONE && cell->socket == socket)
            return cell->value;
        pos = (pos + 1) & mask;
    }
}

/* Make room for one more sn_hash_put (grow, or rehash away tombstones).
   0, or SN_ERROR_NO_MEMORY with the table unchanged. */
int sn_hash_reserve(sn_hash_t *table);

/* Map `socket` to `value`, replacing what it mapped to. Never fails after
   a successful sn_hash_reserve. */
void sn_hash_put(sn_hash_t *table, uint64_t socket, uint64_t value);

/* Unmap `socket` if it maps to `value` (a newer entry for the same socket
   value stays). */
void sn_hash_del(sn_hash_t *table, uint64_t socket, uint64_t value);

/* The first entry at cell *pos or later, with *pos moved past it;
   SN_HASH_EMPTY once past the last. Start with *pos = 0; deleting the
   entry returned before the next call visits every entry once. */
uint64_t sn_hash_next(const sn_hash_t *table, uint32_t *pos);

/* Release the cells (the values belong to their owners). */
void sn_hash_free(sn_hash_t *table);

#endif /* SN_HASH_H */
