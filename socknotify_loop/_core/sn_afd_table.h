/*
 * sn_afd_table.h -- the AFD polyfill's map from a caller's socket to its
 * state (sn_afd_table.c). Internal to the polyfill's files (sn_afd*.c);
 * cffi never sees it.
 */
#ifndef SN_AFD_TABLE_H
#define SN_AFD_TABLE_H

#ifdef _WIN32

#include "sn_win.h"
#include "sn_list.h"

/* Embedded in whatever the table maps to (SN_CONTAINER_OF finds it back). */
typedef struct afd_table_entry {
    sn_list_t link;   /* in its bucket's chain */
    SOCKET socket;    /* the key */
} afd_table_entry_t;

/* All zeros is an empty table. */
typedef struct afd_table {
    sn_list_t *buckets;
    uint32_t bucket_count;  /* power of two; 0 until the first insert */
    uint32_t count;
} afd_table_t;

/* The entry for `socket`, or NULL. */
afd_table_entry_t *sn_afd_table_find(afd_table_t *table, SOCKET socket);

/* Add an entry whose socket is not in the table yet. 0 or
   ERROR_NOT_ENOUGH_MEMORY (the table is unchanged then). */
DWORD sn_afd_table_insert(afd_table_t *table, afd_table_entry_t *entry);

/* Take an entry out; nothing for one that is not in. */
void sn_afd_table_remove(afd_table_t *table, afd_table_entry_t *entry);

/* The first entry in bucket *bucket or a later one, with *bucket moved to
   its bucket; NULL once past the last. Start with *bucket = 0; removing
   the entry returned before the next call visits every entry once. */
afd_table_entry_t *sn_afd_table_next(afd_table_t *table, uint32_t *bucket);

/* Release the buckets (the entries belong to their owners). */
void sn_afd_table_free(afd_table_t *table);

#endif /* _WIN32 */
#endif /* SN_AFD_TABLE_H */
