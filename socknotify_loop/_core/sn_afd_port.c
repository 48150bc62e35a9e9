/*
 * sn_afd_port.c -- the AFD polyfill's per-port state over its life: the
 * registry that finds it from the completion port's HANDLE, its creation
 * at first use, its statistics and counters, and its release when the
 * port closes.
 *
 * Why a registry: ProcessSocketNotifications takes nothing but the port's
 * HANDLE, and the polyfill has the same signature, so its state for a port
 * must be found from the handle alone. Few ports exist in a process, so a
 * list under one lock is plenty.
 *
 * Why closing is delicate: the kernel writes into a socket's state until
 * that state's poll completes (sn_afd_sock.c), so the port's memory can
 * only go once every poll has come back; a poll that never does makes the
 * memory leak, on purpose.
 */
#ifdef _WIN32

#include "sn_afd_port.h"
#include "sn_afd_group.h"
#include "sn_afd_nt.h"

#include <stdlib.h>

static SRWLOCK afd__registry_lock = SRWLOCK_INIT;
static sn_list_t afd__registry = SN_LIST_HEAD_INIT(afd__registry);

/* The port's state for an instance, or NULL. Registry lock held. */
static afd_port_t *afd__port_find(HANDLE iocp, ULONG_PTR instance) {
    sn_list_t *node;
    for (node = sn_list_first(&afd__registry); node != NULL;
         node = sn_list_next(&afd__registry, node)) {
        afd_port_t *ap = SN_CONTAINER_OF(node, afd_port_t, registry_link);
        if (ap->iocp == iocp && ap->instance == instance)
            return ap;
    }
    return NULL;
}

DWORD sn_afd_port_get(HANDLE iocp, ULONG_PTR instance, afd_port_t **out) {
    afd_port_t *ap;
    DWORD error;

    if ((error = sn_afd_nt_init()) != 0)
        return error;
    AcquireSRWLockExclusive(&afd__registry_lock);
    ap = afd__port_find(iocp, instance);
    if (ap == NULL) {
        ap = calloc(1, sizeof *ap);
        if (ap != NULL) {
            ap->iocp = iocp;
            ap->instance = instance;
            InitializeSRWLock(&ap->lock);
            sn_afd_sockets_init(&ap->socks, iocp, instance);
            sn_list_push_front(&afd__registry, &ap->registry_link);
        }
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
    if (ap == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    *out = ap;
    return 0;
}

/* The instances of a port, as many as there are.  */
#define AFD_INSTANCES 2
static const ULONG_PTR afd__instances[AFD_INSTANCES] = {
    SN_AFD_COMPLETION_KEY, SN_AFD_MODEL_COMPLETION_KEY,
};

/* Take the port's states out of the registry: no caller finds them again.
   Returns how many were there, in ap[]. */
static int afd__port_take(HANDLE iocp, afd_port_t *ap[AFD_INSTANCES]) {
    int i, n = 0;
    AcquireSRWLockExclusive(&afd__registry_lock);
    for (i = 0; i < AFD_INSTANCES; i++) {
        afd_port_t *one = afd__port_find(iocp, afd__instances[i]);
        if (one != NULL) {
            sn_list_remove(&one->registry_link);
            ap[n++] = one;
        }
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
    return n;
}

/* Polls of ours the kernel still owns, in every instance taken. */
static uint32_t afd__in_flight(afd_port_t **ap, int n) {
    uint32_t total = 0;
    int i;
    for (i = 0; i < n; i++)
        total += ap[i]->socks.polls_in_flight;
    return total;
}

/* Dequeue until every poll of the instances has come back or `ms` have
   passed, waiting again for the time left (sn_deadline, sn_time_left: the
   core's one deadline arithmetic, sn_platform.h), each completion fed to
   the instance whose key it carries. Everything else dequeued is dropped:
   the port is closing. */
static void afd__drain(afd_port_t **ap, int n, DWORD ms) {
    int64_t deadline = sn_deadline(ms);
    OVERLAPPED_ENTRY entries[64];

    while (afd__in_flight(ap, n) > 0) {
        int64_t left = sn_time_left(deadline);
        ULONG got = 0, i;
        int k;
        if (left == 0)
            return;
        AFD_COUNT(&ap[0]->socks, SN_COUNT_AFD_DEQUEUES);
        if (!GetQueuedCompletionStatusEx(ap[0]->iocp, entries, 64, &got, (DWORD)left, FALSE))
            return;
        for (i = 0; i < got; i++) {
            OVERLAPPED_ENTRY scratch;
            for (k = 0; k < n; k++)
                if (entries[i].lpCompletionKey == ap[k]->instance)
                    sn_afd_sock_feed(&ap[k]->socks,
                                     AFD_SOCK_OF_OVERLAPPED(entries[i].lpOverlapped),
                                     &scratch);
        }
    }
}

void sn_afd_port_release(HANDLE iocp) {
    afd_port_t *ap[AFD_INSTANCES];
    afd_sock_t *sock;
    int n = afd__port_take(iocp, ap), k;

    if (n == 0)
        return;
    for (k = 0; k < n; k++) {
        uint32_t pos = 0;
        AcquireSRWLockExclusive(&ap[k]->lock);
        /* Every live state is orphaned: freed now if idle, else cancelled
           and freed when its completion is drained below. States already
           REMOVING or ORPHAN are reachable only through the completions
           still ahead. (Detaching takes the state out of the table, so the
           walk moves on.) */
        while ((sock = sn_afd_sock_next(&ap[k]->socks, &pos)) != NULL)
            sn_afd_sock_detach(&ap[k]->socks, sock, AFD_FATE_ORPHAN);
    }
    /* Cancellation of an AFD poll completes promptly; a few seconds is
       a generous bound for a kernel under load. */
    afd__drain(ap, n, 5000);
    /* Closing a helper cancels whatever it still carries; drain again. */
    for (k = 0; k < n; k++)
        sn_afd_group_close_helpers(&ap[k]->socks.groups);
    afd__drain(ap, n, 1000);
    for (k = 0; k < n; k++)
        ReleaseSRWLockExclusive(&ap[k]->lock);
    if (afd__in_flight(ap, n) > 0) {
        /* Some poll never came back. The kernel may still write into its
           state: leaking it (and the groups those states point at) is the
           only safe choice. */
        return;
    }
    for (k = 0; k < n; k++) {
        sn_afd_group_free_all(&ap[k]->socks.groups);
        sn_afd_sockets_free(&ap[k]->socks);
        free(ap[k]);
    }
}

void sn_afd_port_counters(HANDLE iocp, uint64_t *counters) {
    afd_port_t *ap;
    int i, k;
    AcquireSRWLockExclusive(&afd__registry_lock);
    for (k = 0; k < AFD_INSTANCES; k++) {
        ap = afd__port_find(iocp, afd__instances[k]);
        if (ap == NULL)
            continue;
        for (i = SN_COUNT_AFD_POLLS; i <= SN_COUNT_AFD_POSTS; i++)
            counters[i] += sn_atomic_load64(&ap->socks.counters[i]);
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
}

DWORD sn_afd_port_statistics(HANDLE iocp, UINT32 *registered, UINT32 *polls_in_flight) {
    afd_port_t *ap;
    DWORD error = ERROR_NOT_FOUND;
    AcquireSRWLockExclusive(&afd__registry_lock);
    ap = afd__port_find(iocp, SN_AFD_COMPLETION_KEY);
    if (ap != NULL) {
        AcquireSRWLockExclusive(&ap->lock);
        *registered = ap->socks.table.count;
        *polls_in_flight = ap->socks.polls_in_flight;
        ReleaseSRWLockExclusive(&ap->lock);
        error = 0;
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
    return error;
}

#endif /* _WIN32 */
