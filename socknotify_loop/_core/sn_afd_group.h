/*
 * sn_afd_group.h -- the AFD polyfill's helper handles, one per group of
 * sockets (sn_afd_group.c). Internal to the polyfill's files (sn_afd*.c);
 * cffi never sees it.
 */
#ifndef SN_AFD_GROUP_H
#define SN_AFD_GROUP_H

#ifdef _WIN32

#include "sn_win.h"
#include "sn_list.h"

/* One helper handle and the sockets whose polls it carries. */
typedef struct afd_group {
    HANDLE helper;
    uint32_t users;
    sn_list_t link;   /* in the port's groups: full ones at the head,
                         groups with room at the tail */
} afd_group_t;

/* A group with room for one more socket, opening one (a helper handle
   associated with `iocp` under completion key `key`) if all in `groups`
   are full. 0 or an error. */
DWORD sn_afd_group_acquire(sn_list_t *groups, HANDLE iocp, ULONG_PTR key, afd_group_t **out);

/* A socket of `group` is gone. The group is kept, even empty. */
void sn_afd_group_release(sn_list_t *groups, afd_group_t *group);

/* Close every helper handle (which cancels the polls they still carry).
   The groups stay, so states that point at them stay valid until their
   completions are drained. */
void sn_afd_group_close_helpers(sn_list_t *groups);

/* Free every group (helpers already closed). */
void sn_afd_group_free_all(sn_list_t *groups);

#endif /* _WIN32 */
#endif /* SN_AFD_GROUP_H */
