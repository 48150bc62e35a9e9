/*
 * sn_afd_sock.c -- the state of one registered socket in the AFD polyfill
 * and the state machine of its one poll: submit, keep, cancel, and turn a
 * completion back into the notification PSN would have produced.
 *
 * Why a file of its own: this is where the polyfill's memory safety
 * lives. A poll's IO_STATUS_BLOCK and AFD_POLL_INFO are inside the state,
 * and the kernel writes them until the poll's completion is dequeued, so
 * a state may outlive its registration; every rule about when it may be
 * freed, and every change of its two state variables, is in this file.
 *
 * The two variables and their only legal moves (asserted where they
 * change: afd__poll_move, afd__fate_move):
 *
 *   poll_status: who owns iosb and poll_info
 *
 *       IDLE --submit--> PENDING --cancel--> CANCELLED
 *        ^                  |                    |
 *        +---- completion --+---- completion ----+
 *
 *     No second poll while one is out (two completions for one state
 *     would leave no way to tell which is the last), no cancel of a poll
 *     that is not pending, no completion for a state with none out.
 *
 *   fate: what the next completion means
 *
 *       LIVE --OP_REMOVE accepted--> REMOVING   (REMOVE event, then freed)
 *       LIVE --socket gone/replaced, port closing--> ORPHAN (freed, silent)
 *
 *     REMOVING and ORPHAN are final: such a state is out of the table and
 *     off the update list, and is reachable only through the completion
 *     still ahead of it. A state is freed only when IDLE and not LIVE.
 *
 * The asserts are compiled in wherever NDEBUG is not defined: the
 * mingw-w64 builds of the C test (tests/c/run_wine.sh) and of the wheel
 * (tools/wine/compile.py) define nothing of the kind.
 */
#ifdef _WIN32

#include "sn_afd_sock.h"
#include "sn_afd_ws.h"

#include <assert.h>
#include <stdlib.h>

/* ------------------------------------------------------------- transitions */

static void afd__poll_move(afd_sock_t *sock, uint8_t to) {
    uint8_t from = sock->poll_status;
    assert((from == AFD_POLL_IDLE && to == AFD_POLL_PENDING) ||       /* submitted */
           (from == AFD_POLL_PENDING && to == AFD_POLL_CANCELLED) ||  /* cancel asked */
           (from != AFD_POLL_IDLE && to == AFD_POLL_IDLE));           /* completed */
    (void)from;
    sock->poll_status = to;
}

static void afd__fate_move(afd_sock_t *sock, uint8_t to) {
    assert(sock->fate == AFD_FATE_LIVE &&
           (to == AFD_FATE_REMOVING || to == AFD_FATE_ORPHAN));
    sock->fate = to;
}

/* ------------------------------------------------------------ translations */

/* Conditions to ask AFD for, for an event filter. */
static ULONG afd__poll_events_for(uint16_t filter) {
    ULONG events = AFD_POLL_ALWAYS;
    /* A peer's FIN makes recv() return 0 at once: readable. */
    if (filter & SOCK_NOTIFY_REGISTER_EVENT_IN)
        events |= AFD_POLL_RECEIVE | AFD_POLL_ACCEPT | AFD_POLL_DISCONNECT;
    if (filter & SOCK_NOTIFY_REGISTER_EVENT_HANGUP)
        events |= AFD_POLL_DISCONNECT;
    if (filter & SOCK_NOTIFY_REGISTER_EVENT_OUT)
        events |= AFD_POLL_SEND;
    return events;
}

/* SOCK_NOTIFY_EVENT_* for the AFD conditions a poll reported. CONNECT is
   ignored: it stays set for as long as the socket is connected. */
static UINT32 afd__notify_events_for(ULONG afd) {
    UINT32 events = 0;
    if (afd & (AFD_POLL_RECEIVE | AFD_POLL_ACCEPT | AFD_POLL_DISCONNECT))
        events |= SOCK_NOTIFY_EVENT_IN;
    if (afd & AFD_POLL_DISCONNECT)
        events |= SOCK_NOTIFY_EVENT_HANGUP;
    if (afd & AFD_POLL_SEND)
        events |= SOCK_NOTIFY_EVENT_OUT;
    if (afd & (AFD_POLL_ABORT | AFD_POLL_CONNECT_FAIL))
        events |= SOCK_NOTIFY_EVENT_ERR;
    return events;
}

/* ------------------------------------------------------- table and queue */

afd_sock_t *sn_afd_sock_find(afd_port_t *ap, SOCKET socket) {
    afd_table_entry_t *entry = sn_afd_table_find(&ap->table, socket);
    return entry != NULL ? SN_CONTAINER_OF(entry, afd_sock_t, entry) : NULL;
}

void sn_afd_sock_queue(afd_port_t *ap, afd_sock_t *sock) {
    /* Only a live registration has a poll worth making. */
    assert(sock->fate == AFD_FATE_LIVE);
    if (!sn_list_is_linked(&sock->update_link))
        sn_list_push_back(&ap->updates, &sock->update_link);
}

static void afd__sock_unqueue(afd_sock_t *sock) {
    if (sn_list_is_linked(&sock->update_link))
        sn_list_remove(&sock->update_link);
}

/* ------------------------------------------------------------ sock states */

DWORD sn_afd_sock_new(afd_port_t *ap, SOCKET socket, SOCKET base, afd_sock_t **out) {
    afd_sock_t *sock;
    DWORD error;

    /* Zeroed: IDLE, LIVE, unarmed, on no list. */
    sock = calloc(1, sizeof *sock);
    if (sock == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    sock->entry.socket = socket;
    sock->base = base;
    if ((error = sn_afd_group_acquire(&ap->groups, ap->iocp, &sock->group)) != 0)
        goto err1;
    if ((error = sn_afd_table_insert(&ap->table, &sock->entry)) != 0)
        goto err2;
    *out = sock;
    return 0;

err2:
    sn_afd_group_release(&ap->groups, sock->group);
err1:
    free(sock);
    return error;
}

/* Free a state that is out of the table and has no poll in flight. */
static void afd__sock_free(afd_port_t *ap, afd_sock_t *sock) {
    assert(sock->poll_status == AFD_POLL_IDLE && sock->fate != AFD_FATE_LIVE);
    assert(!sn_list_is_linked(&sock->entry.link));
    afd__sock_unqueue(sock);
    sn_afd_group_release(&ap->groups, sock->group);
    free(sock);
}

static void afd__sock_cancel(afd_port_t *ap, afd_sock_t *sock) {
    /* Whatever NtCancelIoFileEx says -- cancelled, or STATUS_NOT_FOUND
       because the poll already completed and its packet is queued -- the
       completion is still ahead of us, and the kernel owns iosb and
       poll_info until it arrives. */
    AFD_COUNT(ap, SN_COUNT_AFD_CANCELS);
    sn_afd_nt_cancel(sock->group->helper, &sock->iosb);
    afd__poll_move(sock, AFD_POLL_CANCELLED);
}

void sn_afd_sock_detach(afd_port_t *ap, afd_sock_t *sock, uint8_t fate) {
    afd__fate_move(sock, fate);
    sn_afd_table_remove(&ap->table, &sock->entry);
    afd__sock_unqueue(sock);
    switch (sock->poll_status) {
    case AFD_POLL_IDLE:
        /* Nothing in flight: nobody else references this memory. */
        afd__sock_free(ap, sock);
        break;
    case AFD_POLL_PENDING:
        /* In flight: ask for it back; sn_afd_sock_feed finishes the job. */
        afd__sock_cancel(ap, sock);
        break;
    case AFD_POLL_CANCELLED:
        /* Already asked for back: sn_afd_sock_feed finishes the job. */
        break;
    }
}

static DWORD afd__sock_submit(afd_port_t *ap, afd_sock_t *sock, ULONG events) {
    afd_ntstatus_t status;

    sock->poll_info.Timeout.QuadPart = INT64_MAX;
    sock->poll_info.NumberOfHandles = 1;
    sock->poll_info.Exclusive = FALSE;
    sock->poll_info.Handles[0].Handle = (HANDLE)sock->base;
    sock->poll_info.Handles[0].Events = events;
    sock->poll_info.Handles[0].Status = 0;
    sock->iosb.u.Status = AFD_STATUS_PENDING;
    /* From here until the completion is dequeued the kernel owns iosb and
       poll_info (input and output buffer are the same memory). */
    AFD_COUNT(ap, SN_COUNT_AFD_POLLS);
    status = sn_afd_nt_poll(sock->group->helper, &sock->iosb, &sock->poll_info);
    /* PENDING, or SUCCESS when a condition already held: either way a
       completion packet is queued on the port (the helper does not skip
       completion ports on success). */
    if (status == AFD_STATUS_PENDING || AFD_NT_SUCCESS(status)) {
        afd__poll_move(sock, AFD_POLL_PENDING);
        sock->poll_events = events;
        sock->poll_base = sock->base;
        sock->enabled_since_submit = 0;
        ap->polls_in_flight++;
        return 0;
    }
    /* Failed at once: no packet will come, the memory is ours again. */
    return sn_afd_nt_error(status);
}

/* Make the poll in flight match what the registration wants. */
static void afd__sock_update(afd_port_t *ap, afd_sock_t *sock) {
    ULONG wanted = sock->armed ? afd__poll_events_for(sock->filter) : 0;
    DWORD error;

    switch (sock->poll_status) {
    case AFD_POLL_IDLE:
        /* Nothing in flight: submit if armed. */
        if (wanted == 0)
            return;
        error = afd__sock_submit(ap, sock, wanted);
        if (error == 0)
            return;
        if (error == ERROR_INVALID_HANDLE) {
            /* The socket was closed: drop it, as PSN does, without REMOVE. */
            sn_afd_sock_detach(ap, sock, AFD_FATE_ORPHAN);
            return;
        }
        /* Any other refusal: tell the owner through an ERR notification
           rather than fail somebody else's wait, and disarm so that the
           next ENABLE retries. */
        sock->armed = 0;
        AFD_COUNT(ap, SN_COUNT_AFD_POSTS);
        PostQueuedCompletionStatus(ap->iocp, SOCK_NOTIFY_EVENT_ERR, sock->key, NULL);
        return;
    case AFD_POLL_PENDING:
        /* In flight. It still serves if it covers every wanted condition and
           watches the right socket: a disarmed or narrowed registration just
           ignores what it reports. Otherwise cancel; the completion comes
           back through sn_afd_sock_feed, which queues us again. */
        if ((wanted & ~sock->poll_events) == 0 && sock->poll_base == sock->base)
            return;
        afd__sock_cancel(ap, sock);
        return;
    case AFD_POLL_CANCELLED:
        /* Waiting for the cancelled poll to come back. */
        return;
    }
}

void sn_afd_flush(afd_port_t *ap) {
    sn_list_t *node;
    while ((node = sn_list_first(&ap->updates)) != NULL) {
        afd_sock_t *sock = SN_CONTAINER_OF(node, afd_sock_t, update_link);
        sn_list_remove(node);
        afd__sock_update(ap, sock);
    }
}

int sn_afd_sock_feed(afd_port_t *ap, afd_sock_t *sock, OVERLAPPED_ENTRY *out) {
    afd_ntstatus_t status = sock->iosb.u.Status;
    UINT32 events = 0;

    /* The kernel has given iosb and poll_info back. */
    assert(ap->polls_in_flight > 0);
    afd__poll_move(sock, AFD_POLL_IDLE);
    ap->polls_in_flight--;

    switch (sock->fate) {
    case AFD_FATE_REMOVING:
        /* OP_REMOVE was accepted while this poll was in flight: its final
           completion is here, so the REMOVE goes out and the memory goes. */
        out->lpCompletionKey = sock->key;
        out->lpOverlapped = NULL;
        out->Internal = 0;
        out->dwNumberOfBytesTransferred = SOCK_NOTIFY_EVENT_REMOVE;
        afd__sock_free(ap, sock);
        return 1;
    case AFD_FATE_ORPHAN:
        /* Socket closed or replaced under a new key: nothing to say. */
        afd__sock_free(ap, sock);
        return 0;
    }

    if (status == AFD_STATUS_CANCELLED) {
        /* We cancelled it to change the poll: submit the new one. */
        sn_afd_sock_queue(ap, sock);
        return 0;
    }
    if (status == AFD_STATUS_INVALID_HANDLE) {
        /* The socket handle went away under the poll. */
        sn_afd_sock_detach(ap, sock, AFD_FATE_ORPHAN);
        return 0;
    }
    if (!AFD_NT_SUCCESS(status)) {
        /* The poll itself failed: the socket is in trouble. */
        events = SOCK_NOTIFY_EVENT_ERR;
    } else if (sock->poll_info.NumberOfHandles >= 1) {
        ULONG afd = sock->poll_info.Handles[0].Events;
        if (afd & AFD_POLL_LOCAL_CLOSE) {
            /* The socket this poll watched was closed. If the registration
               was re-enabled since, and its value now names a live socket
               again, the close was the OLD socket's (handle values are
               reused at once): carry on with the new one. Otherwise the
               registration died with its socket, silently. */
            SOCKET base;
            if (sock->enabled_since_submit &&
                sn_afd_ws_check(sock->entry.socket) == 0 &&
                sn_afd_ws_base_socket(sock->entry.socket, &base) == 0) {
                sock->base = base;
                sn_afd_sock_queue(ap, sock);
            } else {
                sn_afd_sock_detach(ap, sock, AFD_FATE_ORPHAN);
            }
            return 0;
        }
        events = afd__notify_events_for(afd);
    }

    if (!sock->armed) {
        /* Disabled (or a one-shot already delivered) while in flight. */
        return 0;
    }
    events &= (UINT32)sock->filter | SOCK_NOTIFY_EVENT_ERR;
    if (events == 0) {
        /* Nothing the registration wants (the filter narrowed while the
           poll was out, or a spurious wake): poll again. */
        sn_afd_sock_queue(ap, sock);
        return 0;
    }
    if (sock->oneshot)
        sock->armed = 0;            /* until the next OP_ENABLE */
    else
        sn_afd_sock_queue(ap, sock); /* persistent: poll again before the next wait */
    out->lpCompletionKey = sock->key;
    out->lpOverlapped = NULL;
    out->Internal = 0;
    out->dwNumberOfBytesTransferred = events;
    return 1;
}

#endif /* _WIN32 */
