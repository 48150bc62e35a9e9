/*
 * sn_afd_group.c -- the helper handles AFD polls are issued on, each
 * shared by a group of up to AFD_GROUP_SIZE sockets of one port.
 *
 * Why helpers at all: a poll is issued on a handle opened on \Device\Afd,
 * not on the socket, and that handle is associated with the caller's
 * port, so the sockets themselves stay free of any port association (the
 * essay in sn_afd.c). Why groups: one helper per socket would cost a
 * handle each; one helper for all would make every cancel slow (below).
 * This file owns opening, sharing and closing them; which socket uses
 * which group is recorded in the socket's state (sn_afd_sock.c).
 */
#ifdef _WIN32

#include "sn_afd_group.h"
#include "sn_keys.h"

#include <assert.h>
#include <stdlib.h>

/* The helper device. Any name under \Device\Afd opens an AFD endpoint that
   is not a socket; the name only shows up in handle listings. */
#define AFD_HELPER_NAME L"\\\\.\\GLOBALROOT\\Device\\Afd\\SockNotify"

/* Sockets per helper handle. Cancelling a poll on a helper gets slower the
   more polls the helper has outstanding (trio measured cubic growth that
   starts to bite around 1000 per handle and chose 500; wepoll and mio use
   32, c-ares 128). This polyfill cancels whenever a socket's interest grows
   while a poll is in flight, so cancel cost matters more to us than the
   price of extra helpers, which is one handle per group. 32 keeps every
   cancel cheap; it was not re-measured here (Wine timings say nothing about
   Windows). */
#define AFD_GROUP_SIZE 32

static DWORD afd__group_open(sn_list_t *groups, HANDLE iocp, ULONG_PTR key, afd_group_t **out) {
    afd_group_t *group;
    DWORD error;

    group = calloc(1, sizeof *group);
    if (group == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    group->helper = CreateFileW(AFD_HELPER_NAME, SYNCHRONIZE,
                                FILE_SHARE_READ | FILE_SHARE_WRITE, NULL,
                                OPEN_EXISTING, FILE_FLAG_OVERLAPPED, NULL);
    if (group->helper == INVALID_HANDLE_VALUE)
        goto err1;
    /* The helper's completions come to the caller's port under our key. */
    if (CreateIoCompletionPort(group->helper, iocp, key, 0) == NULL)
        goto err2;
    /* Nobody waits on the helper handle itself: spare the kernel signalling
       it. Best effort (a refusal only costs a little). Completion packets
       on success are NOT skipped: every poll must complete on the port. */
    SetFileCompletionNotificationModes(group->helper, FILE_SKIP_SET_EVENT_ON_HANDLE);
    sn_list_push_back(groups, &group->link);
    *out = group;
    return 0;

err2:
    error = GetLastError();
    CloseHandle(group->helper);
    SetLastError(error);
err1:
    error = GetLastError();
    free(group);
    return error;
}

DWORD sn_afd_group_acquire(sn_list_t *groups, HANDLE iocp, ULONG_PTR key, afd_group_t **out) {
    sn_list_t *last = sn_list_last(groups);
    afd_group_t *group = last != NULL ? SN_CONTAINER_OF(last, afd_group_t, link) : NULL;
    DWORD error;

    if (group == NULL || group->users >= AFD_GROUP_SIZE) {
        if ((error = afd__group_open(groups, iocp, key, &group)) != 0)
            return error;
    }
    group->users++;
    if (group->users == AFD_GROUP_SIZE) {
        /* Full: out of the way of the next acquire. */
        sn_list_remove(&group->link);
        sn_list_push_front(groups, &group->link);
    }
    *out = group;
    return 0;
}

void sn_afd_group_release(sn_list_t *groups, afd_group_t *group) {
    assert(group->users > 0);
    /* Empty groups are kept (a helper is one handle) until the port closes. */
    if (group->users-- == AFD_GROUP_SIZE) {
        sn_list_remove(&group->link);
        sn_list_push_back(groups, &group->link);
    }
}

void sn_afd_group_close_helpers(sn_list_t *groups) {
    sn_list_t *node;
    for (node = sn_list_first(groups); node != NULL; node = sn_list_next(groups, node)) {
        afd_group_t *group = SN_CONTAINER_OF(node, afd_group_t, link);
        CloseHandle(group->helper);
        group->helper = NULL;
    }
}

void sn_afd_group_free_all(sn_list_t *groups) {
    sn_list_t *node;
    while ((node = sn_list_first(groups)) != NULL) {
        sn_list_remove(node);
        free(SN_CONTAINER_OF(node, afd_group_t, link));
    }
}

#endif /* _WIN32 */
