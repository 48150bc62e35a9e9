/*
 * sn_hash.c -- socket value -> value, the one hash table of the core
 * (sn_hash.h says what it is; this file how it stays correct).
 *
 * Why one table: the port's socket index and the AFD polyfill's socket
 * table answer the same question -- which state belongs to this socket
 * value -- under the same load (thousands of sockets, a lookup for every
 * change) and the same hazard: Microsoft's article "Winsock socket state
 * notifications" warns that socket handle values are reused at once, so a
 * value may be entered again while its old state still lives on (the port
 * keeps a REMOVING record until its REMOVE event, the polyfill keeps a
 * state until the kernel gives its poll back). Two implementations (open
 * addressing in the port, chained buckets in the polyfill) were two places
 * to get that wrong (and the PSN backend's fallback set and the strict
 * model had two more); open addressing was kept, for it allocates nothing
 * per entry and probes one array.
 *
 * The reuse hazard is why sn_hash_del names the value as well as the
 * socket: the state that leaves must not take the entry of the newer state
 * that replaced it under the same socket value.
 *
 * Deleted cells become tombstones (a probe must walk past them); they are
 * counted with the entries in `used`, and a table mostly made of them is
 * rehashed at the same size instead of grown. wepoll keeps its sockets in
 * a tree (tree.c) and mio in a map of its own; neither was copied.
 */
#include "sn_hash.h"

#include <stdlib.h>

int sn_hash_reserve(sn_hash_t *table) {
    sn_hash_cell_t *old = table->cells, *fresh;
    uint32_t old_cap = table->cap, new_cap, i;

    /* At most half full, entries and tombstones together. */
    if ((table->used + 1) * 2 <= table->cap)
        return 0;
    new_cap = old_cap ? old_cap * 2 : 64;
    /* Mostly tombstones? Rehash at the same size instead of growing. */
    if (old_cap && table->count * 4 < old_cap)
        new_cap = old_cap;
    if (new_cap < old_cap)
        return SN_ERROR_NO_MEMORY;      /* 2**32 cells: out of reach anyway */
    fresh = calloc(new_cap, sizeof *fresh);
    if (fresh == NULL)
        return SN_ERROR_NO_MEMORY;
    table->cells = fresh;
    table->cap = new_cap;
    table->used = 0;
    table->count = 0;
    for (i = 0; i < old_cap; i++) {
        if (old[i].value != SN_HASH_EMPTY && old[i].value != SN_HASH_TOMBSTONE)
            sn_hash_put(table, old[i].socket, old[i].value);
    }
    free(old);
    return 0;
}

void sn_hash_put(sn_hash_t *table, uint64_t socket, uint64_t value) {
    uint32_t mask = table->cap - 1;
    uint32_t pos = sn_hash_mix(socket) & mask;
    sn_hash_cell_t *free_cell = NULL;

    for (;;) {
        sn_hash_cell_t *cell = &table->cells[pos];
        if (cell->value == SN_HASH_EMPTY) {
            if (free_cell == NULL) {
                free_cell = cell;
                table->used++;
            }
            break;
        }
        if (cell->value == SN_HASH_TOMBSTONE) {
            if (free_cell == NULL)
                free_cell = cell;   /* reused: `used` already counts it */
        } else if (cell->socket == socket) {
            cell->value = value;    /* a newer state for the same value */
            return;
        }
        pos = (pos + 1) & mask;
    }
    free_cell->socket = socket;
    free_cell->value = value;
    table->count++;
}

void sn_hash_del(sn_hash_t *table, uint64_t socket, uint64_t value) {
    uint32_t mask, pos;
    if (table->cap == 0)
        return;
    mask = table->cap - 1;
    pos = sn_hash_mix(socket) & mask;
    for (;;) {
        sn_hash_cell_t *cell = &table->cells[pos];
        if (cell->value == SN_HASH_EMPTY)
            return;
        if (cell->value != SN_HASH_TOMBSTONE && cell->socket == socket) {
            if (cell->value == value) {
                cell->value = SN_HASH_TOMBSTONE;
                table->count--;
            }
            return;
        }
        pos = (pos + 1) & mask;
    }
}

uint64_t sn_hash_next(const sn_hash_t *table, uint32_t *pos) {
    for (; *pos < table->cap; (*pos)++) {
        uint64_t value = table->cells[*pos].value;
        if (value != SN_HASH_EMPTY && value != SN_HASH_TOMBSTONE) {
            (*pos)++;
            return value;
        }
    }
    return SN_HASH_EMPTY;
}

void sn_hash_free(sn_hash_t *table) {
    free(table->cells);
    table->cells = NULL;
    table->cap = table->used = table->count = 0;
}
