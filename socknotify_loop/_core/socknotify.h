/*
 * socknotify.h -- the one C interface of the notification port.
 *
 * This header is the only thing cffi's cdef sees (socknotify_loop/_build.py
 * reads it, strips the preprocessor lines and feeds the rest to ffi.cdef), so
 * it must stay inside the C subset cffi parses: no macros with arguments, no
 * #if blocks between the CDEF markers, plain integer types only.
 *
 * A port is the Winsock "socket state notifications" model made portable:
 * registrations (socket, key, event filter, op, trigger flags) are applied and
 * notifications are dequeued in ONE call, sn_port_process(), exactly like
 * ProcessSocketNotifications. Three backends implement it:
 *   epoll  (sn_epoll.c)  Linux
 *   psn    (sn_iocp.c)   Windows 11 / Server 2022: the OS's own function
 *   afd    (sn_iocp.c + sn_afd.c) Windows 10, Server 2019, Wine: the same
 *                        port code calling a polyfill built on IOCTL_AFD_POLL
 *
 * Keys: the caller's 64-bit key travels with every notification, but the
 * kernel never sees it. The kernel sees a private key made of a table slot and
 * a generation (see sn_internal.h), so a notification still queued for a
 * socket that was closed, and whose handle value was reused by a new
 * registration, is recognised as stale and dropped.
 *
 * Errors: functions return 0 or an OS error code (errno on POSIX, a Win32 or
 * Winsock error on Windows). Per-registration errors go to .result and do not
 * fail the call.
 */
#ifndef SOCKNOTIFY_H
#define SOCKNOTIFY_H

#include <stdint.h>

/* CDEF-BEGIN */

/* Event bits: the values of SOCK_NOTIFY_EVENT_* / SOCK_NOTIFY_REGISTER_EVENT_*. */
#define SN_EVENT_IN      0x01
#define SN_EVENT_OUT     0x02
#define SN_EVENT_HANGUP  0x04
#define SN_EVENT_ERR     0x40
#define SN_EVENT_REMOVE  0x80
/* Not a socket event: an overlapped I/O completion (Windows) for a handle
   associated with the port under sn_io_completion_key(), or under key 0 as
   RegisterWaitWithQueue posts them. The notification's key is then the
   address of the OVERLAPPED that completed. */
#define SN_EVENT_IO      0x100

/* Operations: the values of SOCK_NOTIFY_OP_*. */
#define SN_OP_NONE       0
#define SN_OP_ENABLE     1
#define SN_OP_DISABLE    2
#define SN_OP_REMOVE     4

/* Trigger flags: the values of SOCK_NOTIFY_TRIGGER_*. */
#define SN_TRIGGER_ONESHOT     1
#define SN_TRIGGER_PERSISTENT  2
#define SN_TRIGGER_LEVEL       4
#define SN_TRIGGER_EDGE        8

/* Backends, for sn_port_open()'s request and sn_port_backend()'s answer. */
#define SN_BACKEND_AUTO   0
#define SN_BACKEND_EPOLL  1
#define SN_BACKEND_PSN    2
#define SN_BACKEND_AFD    3

/* sn_port_process() flag: before the caller's registrations, re-enable
   (same filter and trigger) every one-shot registration that an earlier
   call delivered and that nobody re-enabled or removed since. This is the
   selector's steady state -- re-arm what was reported last time -- done
   without handing each re-arm across the FFI; the re-arms still reach the
   kernel in the same call that waits. Meant for a port with one waiting
   thread: with several, a re-arm may be made by a sibling's call. */
#define SN_PROCESS_REARM  1

/* sn_port_process()'s timeout value that means "wait forever". */
#define SN_INFINITE  -1

/* Error code for a backend that was asked for but is not available here
   (ENOSYS on POSIX, ERROR_NOT_SUPPORTED on Windows, see sn_internal.h). */
int sn_error_not_supported(void);
/* Error code for DISABLE/REMOVE of a socket that has no registration
   (ENOENT on POSIX, ERROR_NOT_FOUND on Windows). */
int sn_error_not_registered(void);
/* Error code for an invalid argument (EINVAL / ERROR_INVALID_PARAMETER). */
int sn_error_invalid(void);

/* One registration change, in SOCK_NOTIFY_REGISTRATION's order. */
typedef struct sn_registration {
    uint64_t socket;      /* fd on POSIX, SOCKET on Windows */
    uint64_t key;         /* the caller's key, returned with notifications */
    uint16_t events;      /* SN_EVENT_IN | OUT | HANGUP */
    uint8_t  op;          /* one SN_OP_* */
    uint8_t  trigger;     /* SN_TRIGGER_* flags; used by SN_OP_ENABLE */
    uint32_t result;      /* out: 0 or the OS error code for this change */
} sn_registration_t;

/* One dequeued notification. For a packet posted with sn_port_post(),
   events is 0 and key is the posted key. */
typedef struct sn_notification {
    uint64_t key;
    uint32_t events;
} sn_notification_t;

typedef struct sn_port sn_port_t;

/* Open a port on the requested backend (SN_BACKEND_AUTO picks the best one
   available). On failure returns NULL and stores an OS error code in *error;
   an unavailable backend gives sn_error_not_supported(). */
sn_port_t *sn_port_open(int backend, int *error);

/* Which backend the port runs on (SN_BACKEND_*). */
int sn_port_backend(sn_port_t *port);

/* Whether a backend can be opened on this machine (1 or 0), and a short
   human-readable sentence saying why, written into buf (NUL-terminated). */
int sn_backend_available(int backend, char *buf, uint32_t buf_size);

/* Which trigger flags the backend honours faithfully (a mask of SN_TRIGGER_*).
   A registration asking for a flag outside it fails with sn_error_not_supported(). */
int sn_backend_triggers(int backend);

/* Apply `count` registration changes in order (after the port's own
   re-arms if flags has SN_PROCESS_REARM), then wait up to timeout_ms
   (SN_INFINITE = forever, 0 = poll) for notifications and store at most
   max_notifications of them. *received is the number stored (0 on timeout).
   Returns 0, or an error code when the wait itself failed; the registration
   results are valid in both cases. Safe to call from several threads at once
   on one port. Stale notifications are dropped and the wait resumes with
   the remaining time. */
int sn_port_process(sn_port_t *port, uint32_t flags,
                    sn_registration_t *registrations, uint32_t count,
                    int64_t timeout_ms,
                    sn_notification_t *notifications, uint32_t max_notifications,
                    uint32_t *received);

/* Queue a packet with this key; one waiter receives it with events == 0. */
int sn_port_post(sn_port_t *port, uint64_t key);

/* The OS object behind the port: the completion port HANDLE on Windows
   (to associate pipes and other overlapped handles with it), the epoll fd
   on Linux. */
uint64_t sn_port_os_handle(sn_port_t *port);

/* The completion key under which overlapped handles are associated with a
   port (CreateIoCompletionPort) so that their completions come out of
   sn_port_process() as SN_EVENT_IO notifications. */
uint64_t sn_io_completion_key(void);

/* Number of live registrations (for tests and statistics). */
uint32_t sn_port_registered(sn_port_t *port);

/* Close the port and free it. Registrations are dropped. The caller must make
   sure no other thread is inside sn_port_process() on this port. */
int sn_port_close(sn_port_t *port);

/* CDEF-END */

#endif /* SOCKNOTIFY_H */
