/*
 * sn_afd.c -- ProcessSocketNotifications, rebuilt on IOCTL_AFD_POLL for the
 * Windows systems that lack it (Windows 10, Server 2019, Wine).
 *
 * The OS model. Winsock sockets of Microsoft's providers are files of the
 * AFD driver (\Device\Afd). Every select()/WSAPoll() in Windows ends up as
 * one ioctl, IOCTL_AFD_POLL: "complete when one of these sockets shows one
 * of these AFD_POLL_* conditions". Issued as overlapped I/O on any handle
 * opened on \Device\Afd, it completes through whatever completion port that
 * handle is associated with, with lpOverlapped = the ApcContext we passed.
 * So one port can carry readiness of thousands of sockets, without a thread
 * per select() and without per-socket I/O buffers. The ioctl is
 * undocumented but has been stable since Vista; wepoll, libuv, mio, trio and
 * c-ares are built on it.
 *
 * What this file provides is the contract of Windows 11's
 * ProcessSocketNotifications (PSN), with the same signature, so the port
 * code (sn_iocp.c) calls either one through one pointer: registrations
 * (ENABLE / DISABLE / REMOVE, LEVEL, ONESHOT or PERSISTENT) are applied in
 * order with a per-registration result, then completions are dequeued;
 * notifications come back as OVERLAPPED_ENTRY with the registration's key
 * and the SOCK_NOTIFY_EVENT_* mask in dwNumberOfBytesTransferred; packets
 * that anybody posted pass through untouched.
 *
 * The hazards, and what they force on the design:
 *   - A poll is a request the kernel owns. Its IO_STATUS_BLOCK and
 *     AFD_POLL_INFO are written when it completes, which may be long after
 *     we lost interest. Cancelling (NtCancelIoFileEx) only asks; the
 *     completion still arrives, with STATUS_CANCELLED. So the per-socket
 *     state that embeds both is freed only after its completion has been
 *     dequeued, and each socket has at most ONE poll in flight: two polls
 *     for one socket would leave us unable to say which completion is the
 *     last. Every state change that needs a different poll cancels the old
 *     one and resubmits when its completion comes back.
 *   - A poll is a level snapshot: it completes at once if a requested
 *     condition already holds, and reports the conditions true at that
 *     moment. That is exactly LEVEL. EDGE ("only changes after enabling")
 *     cannot be rebuilt from snapshots: after a delivery, a resubmitted
 *     poll on a socket still holding unread data completes again at once,
 *     and nothing in the AFD answer says whether new data arrived in
 *     between. Faking it (suppressing repeats until a read is seen) would
 *     lose the wake-up of data arriving between our snapshot and the
 *     caller's drain. So EDGE is refused with ERROR_NOT_SUPPORTED, and the
 *     port layer advertises ONESHOT | PERSISTENT | LEVEL for this backend.
 *   - closesocket() does not tell us anything directly. A poll in flight
 *     completes with AFD_POLL_LOCAL_CLOSE (always requested for that
 *     reason), and then the state is dropped silently, as PSN drops the
 *     registration without a REMOVE. A socket closed while no poll is in
 *     flight (a disarmed one-shot) is noticed at its next ENABLE or REMOVE.
 *   - Socket handle values are reused at once. A registration whose socket
 *     was closed and whose value came back must not inherit the old
 *     socket's queued LOCAL_CLOSE: see afd__sock_feed.
 *   - AFD wants the base socket, below any layered service provider:
 *     SIO_BASE_HANDLE, falling back to SIO_BSP_HANDLE_POLL/_SELECT for
 *     LSPs that hide it. Some Wine builds answer SIO_BASE_HANDLE with
 *     WSAEOPNOTSUPP (which is why trio fails there); Wine has no LSPs, so
 *     the socket itself is the base. The Wine 8.0 of Debian 12 answers it,
 *     but with the socket itself even after closesocket(): whether a
 *     handle is still an open socket is asked separately (getsockopt),
 *     where it matters -- a new registration and OP_REMOVE.
 *   - The poll is issued on a helper handle, not on the socket, and the
 *     helper is associated with our port: sockets stay free of any port
 *     association. One helper per group of sockets (AFD_GROUP_SIZE below).
 *   - The completion packets of our polls arrive on the caller's port,
 *     mixed with everybody else's. They carry a key reserved for us
 *     (SN_AFD_COMPLETION_KEY, bit 63 set, which no kernel key of the port
 *     layer ever has), so they are recognised, translated into notification
 *     entries in place, and never returned raw. When a whole batch was ours
 *     and produced nothing (a cancellation, a filtered event), the wait
 *     resumes with the time that is left, so the caller never sees a
 *     spurious timeout.
 *   - Several threads may call in at once on one port, as with PSN. A lock
 *     per port guards the state; it is never held across the wait. Polls
 *     are (re)submitted by whichever thread next enters the function, just
 *     before it waits: deferring them lets a batch of ENABLEs in one call
 *     cost one poll per socket, and keeps a persistent level registration
 *     on a socket nobody drains from spinning inside one call.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and its C samples (the contract reproduced here); wepoll's afd.c,
 * sock.c, poll_group.c and ws.c (the poll/cancel state machine, base
 * socket lookup, helper groups of 32); mio's src/sys/windows/afd.rs and
 * selector.rs (kernel-owned memory discipline, LOCAL_CLOSE handling);
 * trio's _io_windows.py (helper groups of 500 with the measurement behind
 * it, the Wine/LSP base-handle story); ponyc's sock_notify.c for how a PSN
 * user expects one-shot to behave. No code was taken from any of them.
 *
 * So that's why this code is the way it is: a table of per-socket states,
 * each with at most one poll in flight; registrations only change what a
 * socket wants and queue it; a flush just before the wait makes the polls
 * match what is wanted (submit, keep, or cancel and resubmit later);
 * completions are turned back into the notifications PSN would have
 * produced; memory the kernel may still write is freed only after the
 * kernel said it is done with it.
 */
#ifdef _WIN32

#include "sn_internal.h"
#include "sn_win.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ AFD and NT */

#define IOCTL_AFD_POLL 0x00012024

#define AFD_POLL_RECEIVE           0x0001
#define AFD_POLL_RECEIVE_EXPEDITED 0x0002
#define AFD_POLL_SEND              0x0004
#define AFD_POLL_DISCONNECT        0x0008
#define AFD_POLL_ABORT             0x0010
#define AFD_POLL_LOCAL_CLOSE       0x0020
#define AFD_POLL_CONNECT           0x0040
#define AFD_POLL_ACCEPT            0x0080
#define AFD_POLL_CONNECT_FAIL      0x0100

/* Conditions every poll asks for, whatever the filter: errors are
   delivered regardless of the filter (as PSN does), and LOCAL_CLOSE is
   how we learn that the socket was closed under us. */
#define AFD_POLL_ALWAYS (AFD_POLL_ABORT | AFD_POLL_CONNECT_FAIL | AFD_POLL_LOCAL_CLOSE)

#ifndef SIO_BASE_HANDLE
#  define SIO_BASE_HANDLE 0x48000022
#endif
#ifndef SIO_BSP_HANDLE_SELECT
#  define SIO_BSP_HANDLE_SELECT 0x4800001C
#endif
#ifndef SIO_BSP_HANDLE_POLL
#  define SIO_BSP_HANDLE_POLL 0x4800001D
#endif

/* Our own names for the NT types and codes we need, so this file does not
   depend on which of winternl.h / ntstatus.h / ddk headers a toolchain has. */
typedef LONG afd_ntstatus_t;
#define AFD_STATUS_SUCCESS        ((afd_ntstatus_t)0x00000000L)
#define AFD_STATUS_PENDING        ((afd_ntstatus_t)0x00000103L)
#define AFD_STATUS_INVALID_HANDLE ((afd_ntstatus_t)0xC0000008L)
#define AFD_STATUS_CANCELLED      ((afd_ntstatus_t)0xC0000120L)
#define AFD_STATUS_NOT_FOUND      ((afd_ntstatus_t)0xC0000225L)
#define AFD_NT_SUCCESS(status)    ((status) >= 0)

typedef struct afd_iosb {
    union {
        afd_ntstatus_t Status;
        PVOID Pointer;
    } u;
    ULONG_PTR Information;
} afd_iosb_t;

typedef struct afd_poll_handle_info {
    HANDLE Handle;
    ULONG Events;
    afd_ntstatus_t Status;
} afd_poll_handle_info_t;

typedef struct afd_poll_info {
    LARGE_INTEGER Timeout;
    ULONG NumberOfHandles;
    ULONG Exclusive;
    afd_poll_handle_info_t Handles[1];
} afd_poll_info_t;

#ifdef _WIN64
_Static_assert(sizeof(afd_iosb_t) == 16, "IO_STATUS_BLOCK layout");
_Static_assert(sizeof(afd_poll_handle_info_t) == 16, "AFD_POLL_HANDLE_INFO layout");
_Static_assert(sizeof(afd_poll_info_t) == 32, "AFD_POLL_INFO layout");
#endif

typedef VOID (NTAPI *afd_apc_routine_t)(PVOID, afd_iosb_t *, ULONG);

typedef afd_ntstatus_t (NTAPI *afd_nt_device_io_control_file_t)(
    HANDLE FileHandle, HANDLE Event, afd_apc_routine_t ApcRoutine,
    PVOID ApcContext, afd_iosb_t *IoStatusBlock, ULONG IoControlCode,
    PVOID InputBuffer, ULONG InputBufferLength,
    PVOID OutputBuffer, ULONG OutputBufferLength);
typedef afd_ntstatus_t (NTAPI *afd_nt_cancel_io_file_ex_t)(
    HANDLE FileHandle, afd_iosb_t *IoRequestToCancel, afd_iosb_t *IoStatusBlock);
typedef ULONG (WINAPI *afd_rtl_nt_status_to_dos_error_t)(afd_ntstatus_t Status);

static afd_nt_device_io_control_file_t afd__NtDeviceIoControlFile;
static afd_nt_cancel_io_file_ex_t afd__NtCancelIoFileEx;
static afd_rtl_nt_status_to_dos_error_t afd__RtlNtStatusToDosError;
static DWORD afd__init_error;
static INIT_ONCE afd__init_once = INIT_ONCE_STATIC_INIT;

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

/* The one-time setup: the NT functions, looked up by name so that a
   missing one is an error code, never a DLL that fails to load. */
static BOOL CALLBACK afd__init(PINIT_ONCE once, PVOID param, PVOID *context) {
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    (void)once;
    (void)param;
    (void)context;
    if (ntdll == NULL) {
        afd__init_error = GetLastError();
        return TRUE;
    }
    /* Through void (*)(void): FARPROC's own type is not the target's. */
    afd__NtDeviceIoControlFile = (afd_nt_device_io_control_file_t)(void (*)(void))
        GetProcAddress(ntdll, "NtDeviceIoControlFile");
    afd__NtCancelIoFileEx = (afd_nt_cancel_io_file_ex_t)(void (*)(void))
        GetProcAddress(ntdll, "NtCancelIoFileEx");
    afd__RtlNtStatusToDosError = (afd_rtl_nt_status_to_dos_error_t)(void (*)(void))
        GetProcAddress(ntdll, "RtlNtStatusToDosError");
    if (afd__NtDeviceIoControlFile == NULL || afd__NtCancelIoFileEx == NULL ||
        afd__RtlNtStatusToDosError == NULL)
        afd__init_error = ERROR_PROC_NOT_FOUND;
    return TRUE;
}

static DWORD afd__ensure_init(void) {
    InitOnceExecuteOnce(&afd__init_once, afd__init, NULL, NULL);
    return afd__init_error;
}

/* ------------------------------------------------------------------ state */

typedef struct afd_port afd_port_t;
typedef struct afd_group afd_group_t;
typedef struct afd_sock afd_sock_t;

/* One helper handle and the sockets whose polls it carries. */
struct afd_group {
    HANDLE helper;
    uint32_t users;
    afd_group_t *prev, *next;   /* groups with room are at the tail */
};

/* Where the one poll of a socket stands. */
enum {
    AFD_POLL_IDLE = 0,     /* none in flight: we own iosb and poll_info */
    AFD_POLL_PENDING,      /* in flight: the kernel owns them */
    AFD_POLL_CANCELLED,    /* cancel requested: the kernel still owns them */
};

/* What becomes of a socket's state when its poll comes back. */
enum {
    AFD_FATE_LIVE = 0,     /* registered: turn the completion into events */
    AFD_FATE_REMOVING,     /* OP_REMOVE accepted: emit REMOVE, then free */
    AFD_FATE_ORPHAN,       /* socket gone or replaced: free silently */
};

struct afd_sock {
    /* Kernel-owned while poll_status != AFD_POLL_IDLE. The address of iosb
       is the ApcContext of the poll, so it comes back as lpOverlapped. */
    afd_iosb_t iosb;
    afd_poll_info_t poll_info;

    SOCKET socket;          /* the caller's socket: the table key */
    SOCKET base;            /* what AFD polls */
    SOCKET poll_base;       /* the base the poll in flight was issued for */
    ULONG_PTR key;          /* the registration's completion key */
    ULONG poll_events;      /* AFD_POLL_* of the poll in flight */
    afd_group_t *group;
    uint16_t filter;        /* SOCK_NOTIFY_REGISTER_EVENT_* */
    uint8_t oneshot;
    uint8_t armed;          /* enabled and not disarmed by a one-shot delivery */
    uint8_t poll_status;    /* AFD_POLL_* */
    uint8_t fate;           /* AFD_FATE_* */
    uint8_t enabled_since_submit;
    uint8_t queued;         /* on the port's update list */
    afd_sock_t *hash_next;
    afd_sock_t *update_prev, *update_next;
};

struct afd_port {
    HANDLE iocp;
    SRWLOCK lock;           /* guards everything below */
    afd_sock_t **buckets;   /* socket -> state, chained; live states only */
    uint32_t bucket_count;  /* power of two */
    uint32_t sock_count;
    uint32_t polls_in_flight;
    afd_group_t *groups_head, *groups_tail;
    afd_sock_t *update_head, *update_tail;  /* states whose poll may need work */
    afd_port_t *registry_next;
    /* Kernel calls made for this port (SN_COUNT_AFD_*), for the port's
       sn_port_counters(): how many system calls one ProcessSocket-
       Notifications call costs when it is rebuilt on AFD. */
    volatile uint64_t counters[SN_COUNTERS];
};

#define AFD_COUNT(ap, what) sn_atomic_add64(&(ap)->counters[what], 1)

/* The registry: port HANDLE -> polyfill state. Few ports exist in a
   process, so a list under one lock is plenty. */
static SRWLOCK afd__registry_lock = SRWLOCK_INIT;
static afd_port_t *afd__registry;

/* ---------------------------------------------------------------- helpers */

static DWORD afd__status_to_error(afd_ntstatus_t status) {
    ULONG error = afd__RtlNtStatusToDosError(status);
    return error != 0 ? (DWORD)error : ERROR_GEN_FAILURE;
}

/* The socket AFD must be asked about. Returns 0 or a Winsock error. */
static DWORD afd__base_socket(SOCKET socket, SOCKET *base) {
    static const DWORD ioctls[] = {
        SIO_BASE_HANDLE, SIO_BSP_HANDLE_POLL, SIO_BSP_HANDLE_SELECT,
    };
    DWORD first_error = 0;
    size_t i;

    for (i = 0; i < sizeof ioctls / sizeof ioctls[0]; i++) {
        SOCKET found = INVALID_SOCKET;
        DWORD bytes = 0;
        DWORD error;
        if (WSAIoctl(socket, ioctls[i], NULL, 0, &found, sizeof found, &bytes,
                     NULL, NULL) != SOCKET_ERROR && found != INVALID_SOCKET) {
            *base = found;
            return 0;
        }
        error = (DWORD)WSAGetLastError();
        /* Not a socket (closed, or never was): no other ioctl will help. */
        if (error == WSAENOTSOCK)
            return error;
        if (i == 0)
            first_error = error;
    }
    if (first_error == WSAEOPNOTSUPP) {
        /* Wine builds without SIO_BASE_HANDLE: no LSPs there, the socket
           is its own base. */
        *base = socket;
        return 0;
    }
    return first_error;
}

/* Whether `socket` still names an open socket: 0 or a Winsock error
   (WSAENOTSOCK once it was closed). The base-handle ioctls cannot tell:
   Wine 8 answers SIO_BASE_HANDLE for a closed handle as for an open one. */
static DWORD afd__socket_check(SOCKET socket) {
    int type = 0, len = sizeof type;
    if (getsockopt(socket, SOL_SOCKET, SO_TYPE, (char *)&type, &len) != 0)
        return (DWORD)WSAGetLastError();
    return 0;
}

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

/* ----------------------------------------------------------------- groups */

static void afd__group_unlink(afd_port_t *ap, afd_group_t *group) {
    if (group->prev) group->prev->next = group->next;
    else ap->groups_head = group->next;
    if (group->next) group->next->prev = group->prev;
    else ap->groups_tail = group->prev;
    group->prev = group->next = NULL;
}

static void afd__group_push_head(afd_port_t *ap, afd_group_t *group) {
    group->prev = NULL;
    group->next = ap->groups_head;
    if (ap->groups_head) ap->groups_head->prev = group;
    else ap->groups_tail = group;
    ap->groups_head = group;
}

static void afd__group_push_tail(afd_port_t *ap, afd_group_t *group) {
    group->next = NULL;
    group->prev = ap->groups_tail;
    if (ap->groups_tail) ap->groups_tail->next = group;
    else ap->groups_head = group;
    ap->groups_tail = group;
}

static DWORD afd__group_open(afd_port_t *ap, afd_group_t **out) {
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
    if (CreateIoCompletionPort(group->helper, ap->iocp, SN_AFD_COMPLETION_KEY, 0) == NULL)
        goto err2;
    /* Nobody waits on the helper handle itself: spare the kernel signalling
       it. Best effort (a refusal only costs a little). Completion packets
       on success are NOT skipped: every poll must complete on the port. */
    SetFileCompletionNotificationModes(group->helper, FILE_SKIP_SET_EVENT_ON_HANDLE);
    afd__group_push_tail(ap, group);
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

/* A group with room for one more socket, opening one if all are full. */
static DWORD afd__group_acquire(afd_port_t *ap, afd_group_t **out) {
    afd_group_t *group = ap->groups_tail;
    DWORD error;

    if (group == NULL || group->users >= AFD_GROUP_SIZE) {
        if ((error = afd__group_open(ap, &group)) != 0)
            return error;
    }
    group->users++;
    if (group->users == AFD_GROUP_SIZE) {
        /* Full: out of the way of the next acquire. */
        afd__group_unlink(ap, group);
        afd__group_push_head(ap, group);
    }
    *out = group;
    return 0;
}

static void afd__group_release(afd_port_t *ap, afd_group_t *group) {
    /* Empty groups are kept (a helper is one handle) until the port closes. */
    if (group->users-- == AFD_GROUP_SIZE) {
        afd__group_unlink(ap, group);
        afd__group_push_tail(ap, group);
    }
}

/* ------------------------------------------------------- table and queue */

static uint32_t afd__hash(afd_port_t *ap, SOCKET socket) {
    /* Handle values are multiples of 4: mix them before masking. */
    uint64_t h = (uint64_t)socket * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & (ap->bucket_count - 1);
}

static afd_sock_t *afd__lookup(afd_port_t *ap, SOCKET socket) {
    afd_sock_t *sock;
    if (ap->bucket_count == 0)
        return NULL;
    for (sock = ap->buckets[afd__hash(ap, socket)]; sock; sock = sock->hash_next)
        if (sock->socket == socket)
            return sock;
    return NULL;
}

static DWORD afd__table_insert(afd_port_t *ap, afd_sock_t *sock) {
    uint32_t h;
    if (ap->sock_count >= ap->bucket_count) {
        uint32_t new_count = ap->bucket_count ? ap->bucket_count * 2 : 64;
        afd_sock_t **fresh = calloc(new_count, sizeof *fresh);
        afd_sock_t **old = ap->buckets;
        uint32_t old_count = ap->bucket_count, i;
        if (fresh == NULL)
            return ERROR_NOT_ENOUGH_MEMORY;
        ap->buckets = fresh;
        ap->bucket_count = new_count;
        for (i = 0; i < old_count; i++) {
            afd_sock_t *s = old[i], *next;
            for (; s; s = next) {
                next = s->hash_next;
                h = afd__hash(ap, s->socket);
                s->hash_next = fresh[h];
                fresh[h] = s;
            }
        }
        free(old);
    }
    h = afd__hash(ap, sock->socket);
    sock->hash_next = ap->buckets[h];
    ap->buckets[h] = sock;
    ap->sock_count++;
    return 0;
}

static void afd__table_remove(afd_port_t *ap, afd_sock_t *sock) {
    afd_sock_t **link;
    if (ap->bucket_count == 0)
        return;
    for (link = &ap->buckets[afd__hash(ap, sock->socket)]; *link;
         link = &(*link)->hash_next) {
        if (*link == sock) {
            *link = sock->hash_next;
            sock->hash_next = NULL;
            ap->sock_count--;
            return;
        }
    }
}

static void afd__queue_add(afd_port_t *ap, afd_sock_t *sock) {
    if (sock->queued)
        return;
    sock->queued = 1;
    sock->update_next = NULL;
    sock->update_prev = ap->update_tail;
    if (ap->update_tail) ap->update_tail->update_next = sock;
    else ap->update_head = sock;
    ap->update_tail = sock;
}

static void afd__queue_del(afd_port_t *ap, afd_sock_t *sock) {
    if (!sock->queued)
        return;
    if (sock->update_prev) sock->update_prev->update_next = sock->update_next;
    else ap->update_head = sock->update_next;
    if (sock->update_next) sock->update_next->update_prev = sock->update_prev;
    else ap->update_tail = sock->update_prev;
    sock->update_prev = sock->update_next = NULL;
    sock->queued = 0;
}

/* ------------------------------------------------------------ sock states */

static DWORD afd__sock_new(afd_port_t *ap, SOCKET socket, SOCKET base,
                           afd_sock_t **out) {
    afd_sock_t *sock;
    DWORD error;

    sock = calloc(1, sizeof *sock);
    if (sock == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    sock->socket = socket;
    sock->base = base;
    if ((error = afd__group_acquire(ap, &sock->group)) != 0)
        goto err1;
    if ((error = afd__table_insert(ap, sock)) != 0)
        goto err2;
    *out = sock;
    return 0;

err2:
    afd__group_release(ap, sock->group);
err1:
    free(sock);
    return error;
}

/* Free a state that is out of the table and has no poll in flight. */
static void afd__sock_free(afd_port_t *ap, afd_sock_t *sock) {
    afd__queue_del(ap, sock);
    afd__group_release(ap, sock->group);
    free(sock);
}

static void afd__sock_cancel(afd_port_t *ap, afd_sock_t *sock) {
    afd_iosb_t cancel_iosb;
    /* Whatever NtCancelIoFileEx says -- cancelled, or STATUS_NOT_FOUND
       because the poll already completed and its packet is queued -- the
       completion is still ahead of us, and the kernel owns iosb and
       poll_info until it arrives. */
    AFD_COUNT(ap, SN_COUNT_AFD_CANCELS);
    afd__NtCancelIoFileEx(sock->group->helper, &sock->iosb, &cancel_iosb);
    sock->poll_status = AFD_POLL_CANCELLED;
}

/* The state leaves the table for good: freed now if no poll is in flight,
   otherwise when the poll's completion arrives (fate tells what to emit). */
static void afd__sock_detach(afd_port_t *ap, afd_sock_t *sock, uint8_t fate) {
    if (sock->fate == AFD_FATE_LIVE)
        afd__table_remove(ap, sock);
    afd__queue_del(ap, sock);
    sock->fate = fate;
    switch (sock->poll_status) {
    case AFD_POLL_IDLE:
        /* Nothing in flight: nobody else references this memory. */
        afd__sock_free(ap, sock);
        break;
    case AFD_POLL_PENDING:
        /* In flight: ask for it back; afd__sock_feed finishes the job. */
        afd__sock_cancel(ap, sock);
        break;
    case AFD_POLL_CANCELLED:
        /* Already asked for back: afd__sock_feed finishes the job. */
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
    status = afd__NtDeviceIoControlFile(sock->group->helper, NULL, NULL,
                                        &sock->iosb, &sock->iosb, IOCTL_AFD_POLL,
                                        &sock->poll_info, sizeof sock->poll_info,
                                        &sock->poll_info, sizeof sock->poll_info);
    /* PENDING, or SUCCESS when a condition already held: either way a
       completion packet is queued on the port (the helper does not skip
       completion ports on success). */
    if (status == AFD_STATUS_PENDING || AFD_NT_SUCCESS(status)) {
        sock->poll_status = AFD_POLL_PENDING;
        sock->poll_events = events;
        sock->poll_base = sock->base;
        sock->enabled_since_submit = 0;
        ap->polls_in_flight++;
        return 0;
    }
    /* Failed at once: no packet will come, the memory is ours again. */
    return afd__status_to_error(status);
}

/* Make the poll in flight match what the registration wants. Lock held. */
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
            afd__sock_detach(ap, sock, AFD_FATE_ORPHAN);
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
           back through afd__sock_feed, which queues us again. */
        if ((wanted & ~sock->poll_events) == 0 && sock->poll_base == sock->base)
            return;
        afd__sock_cancel(ap, sock);
        return;
    case AFD_POLL_CANCELLED:
        /* Waiting for the cancelled poll to come back. */
        return;
    }
}

/* Submit, keep or cancel the polls of every queued state. Lock held. */
static void afd__flush(afd_port_t *ap) {
    while (ap->update_head != NULL) {
        afd_sock_t *sock = ap->update_head;
        afd__queue_del(ap, sock);
        afd__sock_update(ap, sock);
    }
}

/* A poll of ours completed: turn it into at most one notification entry.
   Returns 1 when *out was written. Lock held. */
static int afd__sock_feed(afd_port_t *ap, afd_sock_t *sock, OVERLAPPED_ENTRY *out) {
    afd_ntstatus_t status = sock->iosb.u.Status;
    UINT32 events = 0;

    /* The kernel has given iosb and poll_info back. */
    sock->poll_status = AFD_POLL_IDLE;
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
        afd__queue_add(ap, sock);
        return 0;
    }
    if (status == AFD_STATUS_INVALID_HANDLE) {
        /* The socket handle went away under the poll. */
        afd__sock_detach(ap, sock, AFD_FATE_ORPHAN);
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
                afd__socket_check(sock->socket) == 0 &&
                afd__base_socket(sock->socket, &base) == 0) {
                sock->base = base;
                afd__queue_add(ap, sock);
            } else {
                afd__sock_detach(ap, sock, AFD_FATE_ORPHAN);
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
        afd__queue_add(ap, sock);
        return 0;
    }
    if (sock->oneshot)
        sock->armed = 0;         /* until the next OP_ENABLE */
    else
        afd__queue_add(ap, sock); /* persistent: poll again before the next wait */
    out->lpCompletionKey = sock->key;
    out->lpOverlapped = NULL;
    out->Internal = 0;
    out->dwNumberOfBytesTransferred = events;
    return 1;
}

/* ---------------------------------------------------------- registrations */

static DWORD afd__check_trigger(UINT8 trigger) {
    UINT8 persistence = trigger & (SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_PERSISTENT);
    UINT8 kind = trigger & (SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE);
    if (trigger & ~(SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_PERSISTENT |
                    SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE))
        return ERROR_INVALID_PARAMETER;
    if (persistence == (SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_PERSISTENT) ||
        kind == (SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE))
        return ERROR_INVALID_PARAMETER;
    /* Level snapshots cannot make edges: see the essay at the top. */
    if (kind == SOCK_NOTIFY_TRIGGER_EDGE)
        return ERROR_NOT_SUPPORTED;
    return 0;
}

static DWORD afd__enable(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    afd_sock_t *sock;
    SOCKET base;
    DWORD error;

    if (reg->eventFilter & ~SN_NOTIFY_FILTER_ALL)
        return ERROR_INVALID_PARAMETER;
    if ((error = afd__check_trigger(reg->triggerFlags)) != 0)
        return error;

    sock = afd__lookup(ap, reg->socket);
    if (sock != NULL && sock->key != (ULONG_PTR)reg->completionKey) {
        /* Same socket value, new key: the old socket was closed and its
           value reused (the port layer gives a reused socket a new key).
           Nothing of the old registration may reach the new one. */
        afd__sock_detach(ap, sock, AFD_FATE_ORPHAN);
        sock = NULL;
    }
    if (sock == NULL) {
        /* A new registration: PSN refuses one for a handle that is not an
           open socket, and so do we. */
        if ((error = afd__socket_check(reg->socket)) != 0 ||
            (error = afd__base_socket(reg->socket, &base)) != 0)
            return error;
        if ((error = afd__sock_new(ap, reg->socket, base, &sock)) != 0)
            return error;
        sock->key = (ULONG_PTR)reg->completionKey;
    }
    sock->filter = reg->eventFilter;
    /* Neither ONESHOT nor PERSISTENT (the first scenario of Microsoft's article) means
       persistent. */
    sock->oneshot = (reg->triggerFlags & SOCK_NOTIFY_TRIGGER_ONESHOT) != 0;
    sock->armed = 1;
    sock->enabled_since_submit = 1;
    /* The poll is (re)made just before the wait. */
    afd__queue_add(ap, sock);
    return 0;
}

static DWORD afd__disable(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    afd_sock_t *sock = afd__lookup(ap, reg->socket);
    if (sock == NULL)
        return ERROR_NOT_FOUND;
    /* A poll in flight may stay: whatever it reports is ignored, and it is
       not resubmitted. The next ENABLE reuses it if it still fits. */
    sock->armed = 0;
    return 0;
}

static DWORD afd__remove(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    afd_sock_t *sock = afd__lookup(ap, reg->socket);
    DWORD error;

    if (sock == NULL)
        return ERROR_NOT_FOUND;
    if ((error = afd__socket_check(reg->socket)) != 0) {
        /* closesocket() already ended this registration (PSN would fail the
           REMOVE too, and send no REMOVE event). */
        afd__sock_detach(ap, sock, AFD_FATE_ORPHAN);
        return error;
    }
    if (sock->poll_status == AFD_POLL_IDLE) {
        /* Nothing in flight: the REMOVE can be queued now, as a packet on
           the port, so it reaches whichever thread dequeues next, after
           anything already queued for this key. */
        AFD_COUNT(ap, SN_COUNT_AFD_POSTS);
        if (!PostQueuedCompletionStatus(ap->iocp, SOCK_NOTIFY_EVENT_REMOVE,
                                        sock->key, NULL))
            return GetLastError();   /* still registered, as PSN promises */
    }
    /* In flight: the REMOVE is emitted when the poll comes back. */
    afd__sock_detach(ap, sock, AFD_FATE_REMOVING);
    return 0;
}

static DWORD afd__apply(afd_port_t *ap, const SOCK_NOTIFY_REGISTRATION *reg) {
    switch (reg->operation) {
    case SOCK_NOTIFY_OP_NONE:    return 0;
    case SOCK_NOTIFY_OP_ENABLE:  return afd__enable(ap, reg);
    case SOCK_NOTIFY_OP_DISABLE: return afd__disable(ap, reg);
    case SOCK_NOTIFY_OP_REMOVE:  return afd__remove(ap, reg);
    default:                     return ERROR_INVALID_PARAMETER;
    }
}

/* --------------------------------------------------------------- registry */

/* The polyfill's state for a port, created at first use. */
static DWORD afd__port_get(HANDLE iocp, afd_port_t **out) {
    afd_port_t *ap;
    DWORD error;

    if ((error = afd__ensure_init()) != 0)
        return error;
    AcquireSRWLockExclusive(&afd__registry_lock);
    for (ap = afd__registry; ap != NULL; ap = ap->registry_next)
        if (ap->iocp == iocp)
            break;
    if (ap == NULL) {
        ap = calloc(1, sizeof *ap);
        if (ap != NULL) {
            ap->iocp = iocp;
            InitializeSRWLock(&ap->lock);
            ap->registry_next = afd__registry;
            afd__registry = ap;
        }
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
    if (ap == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    *out = ap;
    return 0;
}

static afd_port_t *afd__port_take(HANDLE iocp) {
    afd_port_t **link, *ap = NULL;
    AcquireSRWLockExclusive(&afd__registry_lock);
    for (link = &afd__registry; *link != NULL; link = &(*link)->registry_next) {
        if ((*link)->iocp == iocp) {
            ap = *link;
            *link = ap->registry_next;
            break;
        }
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
    return ap;
}

/* Dequeue until every poll of ours has come back or `ms` have passed.
   Everything else dequeued is dropped: the port is closing. */
static void afd__drain(afd_port_t *ap, DWORD ms) {
    ULONGLONG deadline = GetTickCount64() + ms;
    OVERLAPPED_ENTRY entries[64];

    while (ap->polls_in_flight > 0) {
        ULONGLONG now = GetTickCount64();
        ULONG got = 0, i;
        if (now >= deadline)
            return;
        AFD_COUNT(ap, SN_COUNT_AFD_DEQUEUES);
        if (!GetQueuedCompletionStatusEx(ap->iocp, entries, 64, &got,
                                         (DWORD)(deadline - now), FALSE))
            return;
        for (i = 0; i < got; i++) {
            OVERLAPPED_ENTRY scratch;
            if (entries[i].lpCompletionKey == SN_AFD_COMPLETION_KEY)
                afd__sock_feed(ap, CONTAINING_RECORD(
                    (afd_iosb_t *)entries[i].lpOverlapped, afd_sock_t, iosb),
                    &scratch);
        }
    }
}

void sn_afd_port_closed(HANDLE iocp) {
    afd_port_t *ap = afd__port_take(iocp);
    afd_group_t *group;
    uint32_t i;

    if (ap == NULL)
        return;
    AcquireSRWLockExclusive(&ap->lock);
    /* Every live state is orphaned: freed now if idle, else cancelled and
       freed when its completion is drained below. States already REMOVING
       or ORPHAN are reachable only through their pending completions. */
    for (i = 0; i < ap->bucket_count; i++) {
        while (ap->buckets[i] != NULL)
            afd__sock_detach(ap, ap->buckets[i], AFD_FATE_ORPHAN);
    }
    /* Cancellation of an AFD poll completes promptly; a few seconds is
       a generous bound for a kernel under load. */
    afd__drain(ap, 5000);
    /* Closing a helper cancels whatever it still carries; drain again. */
    for (group = ap->groups_head; group != NULL; group = group->next) {
        CloseHandle(group->helper);
        group->helper = NULL;
    }
    afd__drain(ap, 1000);
    ReleaseSRWLockExclusive(&ap->lock);
    if (ap->polls_in_flight > 0) {
        /* Some poll never came back. The kernel may still write into its
           state: leaking it (and the groups those states point at) is the
           only safe choice. */
        return;
    }
    while ((group = ap->groups_head) != NULL) {
        ap->groups_head = group->next;
        free(group);
    }
    free(ap->buckets);
    free(ap);
}

void sn_afd_counters(HANDLE iocp, uint64_t *counters) {
    afd_port_t *ap;
    int i;
    AcquireSRWLockExclusive(&afd__registry_lock);
    for (ap = afd__registry; ap != NULL; ap = ap->registry_next) {
        if (ap->iocp == iocp) {
            for (i = SN_COUNT_AFD_POLLS; i <= SN_COUNT_AFD_POSTS; i++)
                counters[i] += sn_atomic_load64(&ap->counters[i]);
            break;
        }
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
}

DWORD sn_afd_statistics(HANDLE iocp, UINT32 *registered, UINT32 *polls_in_flight) {
    afd_port_t *ap;
    DWORD error = ERROR_NOT_FOUND;
    AcquireSRWLockExclusive(&afd__registry_lock);
    for (ap = afd__registry; ap != NULL; ap = ap->registry_next) {
        if (ap->iocp == iocp) {
            AcquireSRWLockExclusive(&ap->lock);
            *registered = ap->sock_count;
            *polls_in_flight = ap->polls_in_flight;
            ReleaseSRWLockExclusive(&ap->lock);
            error = 0;
            break;
        }
    }
    ReleaseSRWLockExclusive(&afd__registry_lock);
    return error;
}

/* ------------------------------------------------------------ the process */

/* Waits of a zero-timeout call that dequeued only internal packets. */
#define AFD_POLL_ONLY_ROUNDS 4

DWORD WINAPI sn_afd_process_socket_notifications(
    HANDLE completionPort,
    UINT32 registrationCount,
    SOCK_NOTIFY_REGISTRATION *registrationInfos,
    UINT32 timeoutMs,
    ULONG completionCount,
    OVERLAPPED_ENTRY *completionPortEntries,
    UINT32 *receivedEntryCount) {
    afd_port_t *ap;
    ULONGLONG deadline = 0;
    DWORD wait_ms = timeoutMs;
    DWORD error;
    UINT32 i, rounds = 0;

    if (receivedEntryCount != NULL)
        *receivedEntryCount = 0;
    if (completionPort == NULL || completionPort == INVALID_HANDLE_VALUE)
        return ERROR_INVALID_HANDLE;
    /* PSN's argument rules: no entries means no wait and no outputs. */
    if ((registrationCount != 0 && registrationInfos == NULL) ||
        (completionCount == 0 && (timeoutMs != 0 || completionPortEntries != NULL ||
                                  receivedEntryCount != NULL)) ||
        (completionCount != 0 && (completionPortEntries == NULL ||
                                  receivedEntryCount == NULL)))
        return ERROR_INVALID_PARAMETER;
    if ((error = afd__port_get(completionPort, &ap)) != 0)
        return error;

    AcquireSRWLockExclusive(&ap->lock);
    for (i = 0; i < registrationCount; i++) {
        registrationInfos[i].registrationResult = afd__apply(ap, &registrationInfos[i]);
        /* Unlike PSN, which applies and waits in one kernel transition, we
           know of a refused ENABLE before waiting: the caller hears of it
           now instead of whenever another event ends the wait. */
        if (registrationInfos[i].registrationResult != 0 &&
            registrationInfos[i].operation == SOCK_NOTIFY_OP_ENABLE)
            timeoutMs = 0;
    }
    wait_ms = timeoutMs;
    if (completionCount == 0) {
        /* Register-only call: the polls go out now, since no wait follows. */
        afd__flush(ap);
        ReleaseSRWLockExclusive(&ap->lock);
        return ERROR_SUCCESS;
    }
    ReleaseSRWLockExclusive(&ap->lock);

    if (timeoutMs != INFINITE)
        deadline = GetTickCount64() + timeoutMs;
    for (;;) {
        ULONG got = 0, n = 0, j;

        /* Polls are made to match the registrations just before each wait,
           including the waits resumed after a batch of internal packets
           (a cancellation that came back needs its replacement out). */
        AcquireSRWLockExclusive(&ap->lock);
        afd__flush(ap);
        ReleaseSRWLockExclusive(&ap->lock);

        /* No lock held here: other threads register and wait meanwhile. */
        AFD_COUNT(ap, SN_COUNT_AFD_DEQUEUES);
        if (!GetQueuedCompletionStatusEx(completionPort, completionPortEntries,
                                         completionCount, &got, wait_ms, FALSE)) {
            error = GetLastError();
            return error == WAIT_TIMEOUT ? WAIT_TIMEOUT : error;
        }

        /* Translate in place: entry j yields at most one entry n <= j. */
        AcquireSRWLockExclusive(&ap->lock);
        for (j = 0; j < got; j++) {
            OVERLAPPED_ENTRY *entry = &completionPortEntries[j];
            if (entry->lpCompletionKey == SN_AFD_COMPLETION_KEY) {
                afd_sock_t *sock = CONTAINING_RECORD(
                    (afd_iosb_t *)entry->lpOverlapped, afd_sock_t, iosb);
                n += (ULONG)afd__sock_feed(ap, sock, &completionPortEntries[n]);
            } else {
                /* Not ours (posted packets, other I/O): unchanged. */
                if (n != j)
                    completionPortEntries[n] = *entry;
                n++;
            }
        }
        ReleaseSRWLockExclusive(&ap->lock);

        if (n > 0) {
            *receivedEntryCount = (UINT32)n;
            return ERROR_SUCCESS;
        }
        /* Only internal packets: wait again for the time that is left. A
           zero timeout still finishes what is immediately at hand: the
           packet may have been a cancellation whose replacement poll
           completes at once (a socket switched from IN to OUT that is
           writable now), and PSN would report that in this very call. The
           bound only guards against a loop nobody foresaw. */
        if (timeoutMs == 0) {
            if (++rounds >= AFD_POLL_ONLY_ROUNDS)
                return WAIT_TIMEOUT;
            continue;
        }
        if (timeoutMs != INFINITE) {
            ULONGLONG now = GetTickCount64();
            if (now >= deadline)
                return WAIT_TIMEOUT;
            wait_ms = (DWORD)(deadline - now);
        }
    }
}

#endif /* _WIN32 */
