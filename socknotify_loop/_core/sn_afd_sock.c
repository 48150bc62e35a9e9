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
 *       IDLE --submit--> IN_FLIGHT --cancel--> CANCELLED
 *        ^                   |                     |
 *        +---- completion ---+---- completion -----+
 *
 *     No second poll while one is out (two completions for one state
 *     would leave no way to tell which is the last), no cancel of a poll
 *     that is not in flight, no completion for a state with none out.
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
 *
 * The set of a port's sockets (afd_sockets_t) lives here too: the table
 * that finds a live state from its socket (the core's one hash table,
 * sn_hash.c, socket -> state address), the update list, the helper
 * groups, the count of polls in flight. The port (sn_afd_port.c) owns the
 * set and its lock; this file never sees the port, so the dependency runs
 * one way, port -> sockets.
 *
 * One lookup per change? An ENABLE on the afd backend finds its socket
 * twice: in the port's index (sn_table.c) and in this table. A cookie in
 * the port's record (this state's address) would save the second lookup,
 * but the polyfill takes what ProcessSocketNotifications takes -- a
 * SOCK_NOTIFY_REGISTRATION, nothing else -- because the port code, the
 * strict model and the bare probe call the OS function and the polyfill
 * through one pointer (sn_iocp.c), and a state may be freed by the
 * polyfill alone (a LOCAL_CLOSE, a completion) while the record lives on:
 * a cookie would be a dangling pointer the port could not see go stale.
 * One hashed probe per change is the price of keeping that signature.
 */
#ifdef _WIN32

#include "sn_afd_sock.h"
#include "sn_afd_ws.h"

#include <assert.h>
#include <stdlib.h>

/* ------------------------------------------------------------- transitions */

static void afd__poll_move(afd_sock_t *sock, uint8_t to) {
    uint8_t from = sock->poll_status;
    assert((from == AFD_POLL_IDLE && to == AFD_POLL_IN_FLIGHT) ||       /* submitted */
           (from == AFD_POLL_IN_FLIGHT && to == AFD_POLL_CANCELLED) ||  /* cancel asked */
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

void sn_afd_sockets_init(afd_sockets_t *ss, HANDLE iocp, ULONG_PTR packet_key) {
    ss->iocp = iocp;
    ss->packet_key = packet_key;
    sn_list_init(&ss->groups);
    sn_list_init(&ss->updates);
}

/* The table's value for a state, and back: its address. */
#define AFD_SOCK_VALUE(sock) ((uint64_t)(uintptr_t)(sock))
#define AFD_SOCK_OF_VALUE(v) ((afd_sock_t *)(uintptr_t)(v))

afd_sock_t *sn_afd_sock_find(afd_sockets_t *ss, SOCKET socket) {
    uint64_t v = sn_hash_get(&ss->table, (uint64_t)socket);
    return v != SN_HASH_EMPTY ? AFD_SOCK_OF_VALUE(v) : NULL;
}

afd_sock_t *sn_afd_sock_next(afd_sockets_t *ss, uint32_t *pos) {
    uint64_t v = sn_hash_next(&ss->table, pos);
    return v != SN_HASH_EMPTY ? AFD_SOCK_OF_VALUE(v) : NULL;
}

void sn_afd_sockets_free(afd_sockets_t *ss) {
    sn_hash_free(&ss->table);
}

/* Whether the table maps the state's socket to this very state. */
SN_INLINE int afd__sock_in_table(afd_sockets_t *ss, afd_sock_t *sock) {
    return sn_hash_get(&ss->table, (uint64_t)sock->socket) == AFD_SOCK_VALUE(sock);
}

void sn_afd_sock_queue(afd_sockets_t *ss, afd_sock_t *sock) {
    /* Only a live registration has a poll worth making. */
    assert(sock->fate == AFD_FATE_LIVE);
    if (!sn_list_is_linked(&sock->update_link))
        sn_list_push_back(&ss->updates, &sock->update_link);
}

static void afd__sock_unqueue(afd_sock_t *sock) {
    if (sn_list_is_linked(&sock->update_link))
        sn_list_remove(&sock->update_link);
}

/* ------------------------------------------------------------ sock states */

DWORD sn_afd_sock_new(afd_sockets_t *ss, SOCKET socket, SOCKET base, afd_sock_t **out) {
    afd_sock_t *sock;
    DWORD error;

    /* Zeroed: IDLE, LIVE, unarmed, on no list. */
    sock = calloc(1, sizeof *sock);
    if (sock == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    sock->socket = socket;
    sock->base = base;
    if ((error = (DWORD)sn_hash_reserve(&ss->table)) != 0 ||
        (error = sn_afd_group_acquire(&ss->groups, ss->iocp, ss->packet_key, &sock->group)) != 0) {
        free(sock);
        return error;
    }
    /* A socket value is in the table at most once: the states of closed
       sockets left it when their registrations ended. */
    assert(sn_afd_sock_find(ss, socket) == NULL);
    sn_hash_put(&ss->table, (uint64_t)socket, AFD_SOCK_VALUE(sock));
    *out = sock;
    return 0;
}

/* Free a state that is out of the table and has no poll in flight. */
static void afd__sock_free(afd_sockets_t *ss, afd_sock_t *sock) {
    assert(sock->poll_status == AFD_POLL_IDLE && sock->fate != AFD_FATE_LIVE);
    assert(!afd__sock_in_table(ss, sock));
    afd__sock_unqueue(sock);
    sn_afd_group_release(&ss->groups, sock->group);
    free(sock);
}

static void afd__sock_cancel(afd_sockets_t *ss, afd_sock_t *sock) {
    /* Whatever NtCancelIoFileEx says -- cancelled, or STATUS_NOT_FOUND
       because the poll already completed and its packet is queued -- the
       completion is still ahead of us, and the kernel owns iosb and
       poll_info until it arrives. */
    AFD_COUNT(ss, SN_COUNT_AFD_CANCELS);
    sn_afd_nt_cancel(sock->group->helper, &sock->iosb);
    afd__poll_move(sock, AFD_POLL_CANCELLED);
}

void sn_afd_sock_detach(afd_sockets_t *ss, afd_sock_t *sock, uint8_t fate) {
    afd__fate_move(sock, fate);
    sn_hash_del(&ss->table, (uint64_t)sock->socket, AFD_SOCK_VALUE(sock));
    afd__sock_unqueue(sock);
    switch (sock->poll_status) {
    case AFD_POLL_IDLE:
        /* Nothing in flight: nobody else references this memory. */
        afd__sock_free(ss, sock);
        break;
    case AFD_POLL_IN_FLIGHT:
        /* In flight: ask for it back; sn_afd_sock_feed finishes the job. */
        afd__sock_cancel(ss, sock);
        break;
    case AFD_POLL_CANCELLED:
        /* Already asked for back: sn_afd_sock_feed finishes the job. */
        break;
    }
}

static DWORD afd__sock_submit(afd_sockets_t *ss, afd_sock_t *sock, ULONG events) {
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
    AFD_COUNT(ss, SN_COUNT_AFD_POLLS);
    status = sn_afd_nt_poll(sock->group->helper, &sock->iosb, &sock->poll_info);
    /* PENDING, or SUCCESS when a condition already held: either way a
       completion packet is queued on the port (the helper does not skip
       completion ports on success). */
    if (status == AFD_STATUS_PENDING || AFD_NT_SUCCESS(status)) {
        afd__poll_move(sock, AFD_POLL_IN_FLIGHT);
        sock->poll_events = events;
        sock->poll_base = sock->base;
        sock->enabled_since_submit = 0;
        ss->polls_in_flight++;
        return 0;
    }
    /* Failed at once: no packet will come, the memory is ours again. */
    return sn_afd_nt_error(status);
}

/* Make the poll in flight match what the registration wants. */
static void afd__sock_update(afd_sockets_t *ss, afd_sock_t *sock) {
    ULONG wanted = sock->armed ? afd__poll_events_for(sock->filter) : 0;
    DWORD error;

    switch (sock->poll_status) {
    case AFD_POLL_IDLE:
        /* Nothing in flight: submit if armed. */
        if (wanted == 0)
            return;
        error = afd__sock_submit(ss, sock, wanted);
        if (error == 0)
            return;
        if (error == ERROR_INVALID_HANDLE) {
            /* The socket was closed: drop it, as PSN does, without REMOVE. */
            sn_afd_sock_detach(ss, sock, AFD_FATE_ORPHAN);
            return;
        }
        /* Any other refusal: tell the owner through an ERR notification
           rather than fail somebody else's wait, and disarm so that the
           next ENABLE retries. */
        sock->armed = 0;
        AFD_COUNT(ss, SN_COUNT_AFD_POSTS);
        PostQueuedCompletionStatus(ss->iocp, SOCK_NOTIFY_EVENT_ERR, sock->key, NULL);
        return;
    case AFD_POLL_IN_FLIGHT:
        /* In flight. It still serves if it covers every wanted condition and
           watches the right socket: a disarmed or narrowed registration just
           ignores what it reports. Otherwise cancel; the completion comes
           back through sn_afd_sock_feed, which queues us again. */
        if ((wanted & ~sock->poll_events) == 0 && sock->poll_base == sock->base)
            return;
        afd__sock_cancel(ss, sock);
        return;
    case AFD_POLL_CANCELLED:
        /* Waiting for the cancelled poll to come back. */
        return;
    }
}

void sn_afd_flush(afd_sockets_t *ss) {
    sn_list_t *node;
    while ((node = sn_list_first(&ss->updates)) != NULL) {
        afd_sock_t *sock = SN_CONTAINER_OF(node, afd_sock_t, update_link);
        sn_list_remove(node);
        afd__sock_update(ss, sock);
    }
}

int sn_afd_sock_feed(afd_sockets_t *ss, afd_sock_t *sock, OVERLAPPED_ENTRY *out) {
    afd_ntstatus_t status = sock->iosb.u.Status;
    UINT32 events = 0;

    /* The kernel has given iosb and poll_info back. */
    assert(ss->polls_in_flight > 0);
    afd__poll_move(sock, AFD_POLL_IDLE);
    ss->polls_in_flight--;

    switch (sock->fate) {
    case AFD_FATE_REMOVING:
        /* OP_REMOVE was accepted while this poll was in flight: its final
           completion is here, so the REMOVE goes out and the memory goes. */
        out->lpCompletionKey = sock->key;
        out->lpOverlapped = NULL;
        out->Internal = 0;
        out->dwNumberOfBytesTransferred = SOCK_NOTIFY_EVENT_REMOVE;
        afd__sock_free(ss, sock);
        return 1;
    case AFD_FATE_ORPHAN:
        /* Socket closed or replaced under a new key: nothing to say. */
        afd__sock_free(ss, sock);
        return 0;
    }

    if (status == AFD_STATUS_CANCELLED) {
        /* We cancelled it to change the poll: submit the new one. */
        sn_afd_sock_queue(ss, sock);
        return 0;
    }
    if (status == AFD_STATUS_INVALID_HANDLE) {
        /* The socket handle went away under the poll. */
        sn_afd_sock_detach(ss, sock, AFD_FATE_ORPHAN);
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
                sn_afd_ws_check(sock->socket) == 0 &&
                sn_afd_ws_base_socket(sock->socket, &base) == 0) {
                sock->base = base;
                sn_afd_sock_queue(ss, sock);
            } else {
                sn_afd_sock_detach(ss, sock, AFD_FATE_ORPHAN);
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
        sn_afd_sock_queue(ss, sock);
        return 0;
    }
    if (sock->oneshot)
        sock->armed = 0;            /* until the next OP_ENABLE */
    else
        sn_afd_sock_queue(ss, sock); /* persistent: poll again before the next wait */
    out->lpCompletionKey = sock->key;
    out->lpOverlapped = NULL;
    out->Internal = 0;
    out->dwNumberOfBytesTransferred = events;
    return 1;
}

#endif /* _WIN32 */
