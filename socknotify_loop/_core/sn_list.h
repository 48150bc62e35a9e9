/*
 * sn_list.h -- the one linked list of the core: intrusive, circular,
 * doubly linked. cffi never sees this file.
 *
 * Why one helper: the AFD polyfill keeps four lists (helper groups, the
 * queue of sockets whose poll needs work, the port registry, the chains of
 * its hash table), and four sets of hand-written pointer updates are four
 * places to get an end case wrong. Here the end cases do not exist: a list
 * is a head node that points at itself when empty, so inserting and
 * unlinking never test for the first or last element.
 *
 * An element embeds an sn_list_t and is found back from it with
 * SN_CONTAINER_OF, so a list allocates nothing. An element's node is
 * {NULL, NULL} while it is on no list -- which is what calloc() gives -- so
 * "is it queued?" needs no flag of its own (sn_list_is_linked). Linking an
 * element twice or unlinking one that is on no list is a bug, asserted.
 */
#ifndef SN_LIST_H
#define SN_LIST_H

#include <assert.h>
#include <stddef.h>

#if defined(_MSC_VER) && !defined(__clang__)
#  define SN_LIST_INLINE static __inline
#else
#  define SN_LIST_INLINE static inline
#endif

typedef struct sn_list {
    struct sn_list *prev, *next;
} sn_list_t;

/* An empty head as a static initializer: static sn_list_t h = SN_LIST_HEAD_INIT(h); */
#define SN_LIST_HEAD_INIT(head) { &(head), &(head) }

/* The `type` whose member `member` is the node at `node`. */
#define SN_CONTAINER_OF(node, type, member) \
    ((type *)(void *)((char *)(node) - offsetof(type, member)))

/* Make `head` an empty list (heads only; elements start zeroed). */
SN_LIST_INLINE void sn_list_init(sn_list_t *head) {
    head->prev = head->next = head;
}

SN_LIST_INLINE int sn_list_is_empty(const sn_list_t *head) {
    return head->next == head;
}

/* Whether an element is on some list. */
SN_LIST_INLINE int sn_list_is_linked(const sn_list_t *node) {
    return node->next != NULL;
}

SN_LIST_INLINE void sn_list__link(sn_list_t *node, sn_list_t *prev, sn_list_t *next) {
    assert(!sn_list_is_linked(node));
    node->prev = prev;
    node->next = next;
    prev->next = node;
    next->prev = node;
}

SN_LIST_INLINE void sn_list_push_front(sn_list_t *head, sn_list_t *node) {
    sn_list__link(node, head, head->next);
}

SN_LIST_INLINE void sn_list_push_back(sn_list_t *head, sn_list_t *node) {
    sn_list__link(node, head->prev, head);
}

/* Take an element off its list; it reads as unlinked afterwards. */
SN_LIST_INLINE void sn_list_remove(sn_list_t *node) {
    assert(sn_list_is_linked(node));
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev = node->next = NULL;
}

/* The first / last element, or NULL for an empty list. */
SN_LIST_INLINE sn_list_t *sn_list_first(const sn_list_t *head) {
    return sn_list_is_empty(head) ? NULL : head->next;
}

SN_LIST_INLINE sn_list_t *sn_list_last(const sn_list_t *head) {
    return sn_list_is_empty(head) ? NULL : head->prev;
}

/* The element after `node` on the list `head`, or NULL after the last. */
SN_LIST_INLINE sn_list_t *sn_list_next(const sn_list_t *head, const sn_list_t *node) {
    return node->next == head ? NULL : node->next;
}

#endif /* SN_LIST_H */
