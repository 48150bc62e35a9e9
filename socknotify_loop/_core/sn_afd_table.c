/*
 * sn_afd_table.c -- socket -> state for the AFD polyfill: a chained hash
 * table that doubles when it holds as many entries as buckets.
 *
 * Why a file of its own: every registration names its socket, and ENABLE,
 * DISABLE and REMOVE must each find that socket's state among thousands;
 * the table is that lookup and nothing else. It holds LIVE states only
 * (sn_afd_sock.c takes a state out the moment its registration ends, even
 * while its poll is still in flight), so a socket value is in it at most
 * once. The entries are embedded in the states: the table allocates only
 * its bucket array.
 */
#ifdef _WIN32

#include "sn_afd_table.h"

#include <assert.h>
#include <stdlib.h>

static uint32_t afd__hash(const afd_table_t *table, SOCKET socket) {
    /* Handle values are multiples of 4: mix them before masking. */
    uint64_t h = (uint64_t)socket * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & (table->bucket_count - 1);
}

afd_table_entry_t *sn_afd_table_find(afd_table_t *table, SOCKET socket) {
    sn_list_t *chain, *node;
    if (table->bucket_count == 0)
        return NULL;
    chain = &table->buckets[afd__hash(table, socket)];
    for (node = sn_list_first(chain); node != NULL; node = sn_list_next(chain, node)) {
        afd_table_entry_t *entry = SN_CONTAINER_OF(node, afd_table_entry_t, link);
        if (entry->socket == socket)
            return entry;
    }
    return NULL;
}

DWORD sn_afd_table_insert(afd_table_t *table, afd_table_entry_t *entry) {
    if (table->count >= table->bucket_count) {
        uint32_t new_count = table->bucket_count ? table->bucket_count * 2 : 64;
        sn_list_t *fresh = calloc(new_count, sizeof *fresh);
        sn_list_t *old = table->buckets;
        uint32_t old_count = table->bucket_count, i;
        if (fresh == NULL)
            return ERROR_NOT_ENOUGH_MEMORY;
        for (i = 0; i < new_count; i++)
            sn_list_init(&fresh[i]);
        table->buckets = fresh;
        table->bucket_count = new_count;
        /* Relink every entry: heads cannot be copied, their neighbours
           point at them. */
        for (i = 0; i < old_count; i++) {
            sn_list_t *node;
            while ((node = sn_list_first(&old[i])) != NULL) {
                afd_table_entry_t *moved = SN_CONTAINER_OF(node, afd_table_entry_t, link);
                sn_list_remove(node);
                sn_list_push_front(&fresh[afd__hash(table, moved->socket)], node);
            }
        }
        free(old);
    }
    assert(sn_afd_table_find(table, entry->socket) == NULL);
    sn_list_push_front(&table->buckets[afd__hash(table, entry->socket)], &entry->link);
    table->count++;
    return 0;
}

void sn_afd_table_remove(afd_table_t *table, afd_table_entry_t *entry) {
    if (!sn_list_is_linked(&entry->link))
        return;
    sn_list_remove(&entry->link);
    table->count--;
}

afd_table_entry_t *sn_afd_table_next(afd_table_t *table, uint32_t *bucket) {
    for (; *bucket < table->bucket_count; (*bucket)++) {
        sn_list_t *node = sn_list_first(&table->buckets[*bucket]);
        if (node != NULL)
            return SN_CONTAINER_OF(node, afd_table_entry_t, link);
    }
    return NULL;
}

void sn_afd_table_free(afd_table_t *table) {
    free(table->buckets);
    table->buckets = NULL;
    table->bucket_count = 0;
    table->count = 0;
}

#endif /* _WIN32 */
