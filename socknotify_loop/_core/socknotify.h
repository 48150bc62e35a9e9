/*
 * socknotify.h -- the one C interface of the notification port.
 *
 * This header is the only thing cffi's cdef sees (socknotify_loop/_build.py
 * reads what lies between its CDEF markers and feeds it to ffi.cdef; a test
 * build adds what lies between the CDEF-TESTING markers), so it must stay
 * inside the C subset cffi parses: no macros with arguments, no #if blocks
 * between the markers, plain integer types only.
 *
 * A port is the Winsock "socket state notifications" model made portable:
 * registrations (socket, key, event filter, op, trigger flags) are applied and
 * notifications are dequeued in ONE call, sn_port_process(), exactly like
 * ProcessSocketNotifications. Three backends implement it in every build,
 * and a fourth in a test build (SN_TESTING, below):
 *   epoll  (sn_epoll.c)  Linux
 *   psn    (sn_iocp.c)   Windows 11 / Server 2022: the OS's own function
 *   afd    (sn_iocp.c + sn_afd.c) Windows 10, Server 2019, Wine: the same
 *                        port code calling a polyfill built on IOCTL_AFD_POLL
 *   strict (sn_iocp.c + sn_model.c) Windows, test builds only: the same port
 *                        code on the strict model of the documented rules
 *
 * Keys: the caller's 64-bit key travels with every notification, but the
 * kernel never sees it. The kernel sees a private key made of a record number and
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

/* Backends, for sn_port_open() and the sn_backend_*() queries. */
#define SN_BACKEND_AUTO   0
#define SN_BACKEND_EPOLL  1
#define SN_BACKEND_PSN    2
#define SN_BACKEND_AFD    3

/* Capabilities of a backend (sn_backend_caps). */
/* Each registration change costs a system call of its own, whenever it is
   made (epoll_ctl): nothing is saved by carrying changes to the next wait,
   so a selector applies them at once and reports errors where the stdlib
   selectors do (at register/modify). Without it (the completion-port
   backends) changes ride in the call that waits. */
#define SN_CAP_CHANGES_AT_ONCE  1
/* sn_port_process() flags. */
/* After the caller's registrations, re-enable (same filter and trigger)
   every one-shot registration that an earlier call delivered and that
   nobody re-enabled or removed since (this call's own changes included): the selector's steady state --
   re-arm what was reported last time -- without handing each re-arm
   across the FFI; the re-arms reach the kernel in the call that waits. */
#define SN_PROCESS_REARM         1
/* A successful SN_OP_REMOVE retires its registration at once and yields no
   SN_EVENT_REMOVE notification. Safe because kernel keys carry a
   generation: anything still queued for the removed registration is
   recognised as stale and dropped. */
#define SN_PROCESS_QUIET_REMOVE  2

/* sn_port_process()'s timeout value that means "wait forever". */
#define SN_INFINITE  -1

/* Selector masks written by sn_port_select(): the values of
   selectors.EVENT_READ and selectors.EVENT_WRITE. */
#define SN_SELECT_READ   1
#define SN_SELECT_WRITE  2

/* Kernel-call counters (sn_port_counters), by index, and one count of
   faults. Always on: one relaxed atomic increment per call. */
#define SN_COUNT_WAITS        0  /* epoll_wait / ProcessSocketNotifications (psn, afd: the
                                    function the port code calls) */
#define SN_COUNT_CHANGES      1  /* epoll_ctl */
#define SN_COUNT_WAKES        2  /* eventfd write / PostQueuedCompletionStatus */
#define SN_COUNT_DRAINS       3  /* eventfd read */
#define SN_COUNT_AFD_POLLS    4  /* NtDeviceIoControlFile(IOCTL_AFD_POLL) (afd) */
#define SN_COUNT_AFD_CANCELS  5  /* NtCancelIoFileEx (afd) */
#define SN_COUNT_AFD_DEQUEUES 6  /* GetQueuedCompletionStatusEx (afd) */
#define SN_COUNT_AFD_POSTS    7  /* PostQueuedCompletionStatus inside the polyfill (afd) */
#define SN_COUNT_FALLBACKS    8  /* registrations the OS function refused and the polyfill
                                    took over on the same port (psn, strict) */
#define SN_COUNT_REFUSED      9  /* not a kernel call: transitions of the port's records
                                    refused as starting from a wrong state (a fault of the
                                    core's own, answered with an error; sn_record.h) */
#define SN_COUNTERS          10

/* Error code for a backend that was asked for but is not available here
   (ENOSYS on POSIX, ERROR_NOT_SUPPORTED on Windows, see sn_internal.h). */
int sn_error_not_supported(void);
/* Error code for DISABLE/REMOVE of a socket that has no registration
   (ENOENT on POSIX, ERROR_NOT_FOUND on Windows). */
int sn_error_not_registered(void);
/* Error code for an invalid argument (EINVAL / ERROR_INVALID_PARAMETER). */
int sn_error_invalid(void);
/* Error code for a call on a closed port, or on a port inherited through
   fork() (EBADF / ERROR_INVALID_HANDLE). */
int sn_error_closed(void);
/* Error code for sn_port_select() entered while another thread is inside
   it, or sn_port_bind() while a select runs (EBUSY / ERROR_BUSY). */
int sn_error_busy(void);
/* Error code for a wait interrupted by a signal (EINTR; never on Windows). */
int sn_error_interrupted(void);

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

/* The backend SN_BACKEND_AUTO stands for on this machine: the first
   available one in the core's order of preference. */
int sn_backend_default(void);

/* Whether a backend can be opened on this machine (1 or 0), and a short
   human-readable sentence saying why, written into buf (NUL-terminated). */
int sn_backend_available(int backend, char *buf, uint32_t buf_size);

/* Which trigger flags the backend honours faithfully (a mask of SN_TRIGGER_*).
   A registration asking for a flag outside it fails with sn_error_not_supported(). */
int sn_backend_triggers(int backend);

/* The backend's SN_CAP_* flags. */
int sn_backend_caps(int backend);

/* Open a port on the requested backend (SN_BACKEND_AUTO picks the best one
   available). On failure returns NULL and stores an OS error code in *error;
   an unavailable backend gives sn_error_not_supported(). */
sn_port_t *sn_port_open(int backend, int *error);

/* Apply `count` registration changes in order (after the port's own
   re-arms if flags has SN_PROCESS_REARM), then wait up to timeout_ms
   (milliseconds as a double, as sn_port_select() takes them: any fraction
   rounds up, a negative value such as SN_INFINITE waits forever, 0 or NaN
   polls) for notifications and store at most
   max_notifications of them. *received is the number stored (0 on timeout).
   Returns 0, or an error code when the wait itself failed; the registration
   results are valid in both cases. If a caller's change failed, the call
   does not block (its failure is news the caller must hear now), unless
   it was a REMOVE with SN_PROCESS_QUIET_REMOVE: that caller asked to hear
   nothing of the removal.
   Safe to call from several threads at once on one port. Stale
   notifications are dropped and the wait resumes with the remaining time.
   A waiter woken by sn_port_close() returns 0 with what it has. */
int sn_port_process(sn_port_t *port, uint32_t flags,
                    sn_registration_t *registrations, uint32_t count,
                    double timeout_ms,
                    sn_notification_t *notifications, uint32_t max_notifications,
                    uint32_t *received);

/* The selector's fast path. sn_port_bind() lends the port two buffers owned
   by the caller: `changes` (room for changes_cap registration changes) and
   `out` (room for out_cap 64-bit words). sn_port_select(port, n, timeout)
   then behaves as sn_port_process(port, SN_PROCESS_REARM |
   SN_PROCESS_QUIET_REMOVE, changes, n, timeout, ...) and writes, from
   out[0], one (caller key, selector mask) pair per ready registration: the
   mask is SN_SELECT_READ/WRITE, computed as selectors.EpollSelector does
   (IN or HANGUP: READ; OUT: WRITE; ERR: both) and limited to what the
   registration's filter asked for. A change that failed is reported as one
   pair with the full mask of its filter (and the call does not block): the
   owner's next recv/send meets the error, as after EPOLLERR; its result
   field says which error. Packets posted to the port wake the call and are
   not reported; on Windows the keys of overlapped I/O completions
   (SN_EVENT_IO) follow the pairs. Returns, when exactly one pair was
   written, no I/O key came, its key is at most SN_SELECT_ONE_MAX_KEY and
   its mask is 1, 2 or 3: (key << 2) | mask (the low two bits are then
   never 0). Otherwise (pairs | (io_keys << 32)) << 2 (the low two bits
   are 0; the pairs are in `out` as described), or minus an error code
   (sn_error_busy() if another thread is inside).
   The timeout is in milliseconds as a double: any fraction rounds up,
   a negative value waits forever, NaN polls.
   Memory: the buffers are written only inside sn_port_select(); rebinding
   waits for none and fails with sn_error_busy() while a select runs. */
int sn_port_bind(sn_port_t *port, sn_registration_t *changes, uint32_t changes_cap,
                 uint64_t *out, uint32_t out_cap);
int64_t sn_port_select(sn_port_t *port, uint32_t count, double timeout_ms);
/* The same call with the port given by its address (sn_port_address()):
   the binding converts an integer argument for a fraction of what a
   pointer argument costs it, on the call a loop makes every iteration. The
   caller keeps the port's handle alive for as long as it uses the address. */
int64_t sn_port_select_at(uintptr_t port, uint32_t count, double timeout_ms);
/* sn_port_select_at(port, 0, 0) and sn_port_select_at(port, 0, -1): a loop's
   two usual waits (something is ready: poll; nothing is scheduled: block)
   with no queued change. With one argument the binding builds no argument
   tuple and converts one integer. */
int64_t sn_port_poll_at(uintptr_t port);
int64_t sn_port_block_at(uintptr_t port);
/* sn_port_select_at(port, 0, timeout_ms): a timed wait with no queued change. */
int64_t sn_port_wait_at(uintptr_t port, double timeout_ms);
uintptr_t sn_port_address(sn_port_t *port);
#define SN_SELECT_ONE_MAX_KEY  0x1FFFFFFFFFFFFFFF
/* A packet posted under this key (sn_port_post) ends a waiting
   sn_port_select() as any posted packet does, but is not a caller's:
   sn_port_select_posted() tells the two apart. The selector posts it to
   make a thread waiting in select() take a change made by another thread,
   after which that select waits again; a caller's post makes it return. */
#define SN_QUIET_WAKE_KEY      0xFFFFFFFFFFFFFFFF
/* 1 when the last sn_port_select() dequeued a packet posted under another
   key than SN_QUIET_WAKE_KEY, else 0. */
int sn_port_select_posted(sn_port_t *port);
/* How many bound changes the last sn_port_select() carried (0 if it
   failed before taking them): after a select that failed as a whole, its
   caller reads their results (each the call's error when it was not
   applied) to queue them again. */
uint32_t sn_port_select_changes(sn_port_t *port);

/* One change, applied at once, without waiting or dequeuing, with
   SN_PROCESS_QUIET_REMOVE's meaning of REMOVE: the selector's register,
   modify and unregister where changes are applied at once
   (SN_CAP_CHANGES_AT_ONCE), without packing a batch. Returns 0 or the
   change's error code (sn_error_closed() for a closed port). */
int sn_port_change(sn_port_t *port, uint64_t socket, uint64_t key, uint16_t events,
                   uint8_t op, uint8_t trigger);
/* The same with the port given by its address (see sn_port_select_at). */
int sn_port_change_at(uintptr_t port, uint64_t socket, uint64_t key, uint16_t events,
                      uint8_t op, uint8_t trigger);

/* Queue a packet with this key; one waiter receives it with events == 0. */
int sn_port_post(sn_port_t *port, uint64_t key);

/* 0 if `socket` can be registered with this port's backend as far as a
   cheap check tells (Windows: it is an open socket), else the error code a
   registration would fail with. For selectors whose changes wait for the
   next select: a bad descriptor is refused at register(). */
int sn_port_check(sn_port_t *port, uint64_t socket);

/* The OS object behind the port: the completion port HANDLE on Windows
   (to associate pipes and other overlapped handles with it), the epoll fd
   on Linux. Writes it to *handle; returns 0 or sn_error_closed(). */
int sn_port_os_handle(sn_port_t *port, uint64_t *handle);

/* The completion key under which overlapped handles are associated with a
   port (CreateIoCompletionPort) so that their completions come out of
   sn_port_process() as SN_EVENT_IO notifications. */
uint64_t sn_io_completion_key(void);

/* Number of live registrations (for tests and statistics); 0 once closed. */
uint32_t sn_port_registered(sn_port_t *port);

/* Copy up to n kernel-call counters (SN_COUNT_*) into out; returns how
   many were written. */
uint32_t sn_port_counters(sn_port_t *port, uint64_t *out, uint32_t n);

/* Close the port: wake every thread waiting in it, wait until each has
   left (they return within a few milliseconds), then release the OS
   resources. Safe against any concurrent call on the port: calls that
   come later fail with sn_error_closed(). Idempotent. In a process that
   inherited the port through fork(), it only closes that process's copies
   of the descriptors and leaves the parent's port alone. The memory of
   the port itself stays valid until sn_port_free(). */
int sn_port_close(sn_port_t *port);

/* Close the port if needed and free its memory. The caller guarantees no
   thread can call in any more (the owner of the last reference). */
void sn_port_free(sn_port_t *port);

/* The bare function of a Windows backend, for the OS probe
   (python -m socknotify_loop --probe-os): no table, no keys of ours, the
   caller's keys go to the function as they are. sn_raw_open() makes a
   completion port for `backend` (SN_BACKEND_PSN or _AFD; _STRICT in a
   test build);
   sn_raw_process() calls that backend's ProcessSocketNotifications-shaped
   function once (max_notifications 0: register only, no wait) and returns
   its DWORD (0, 258 for a timeout, or an error); sn_raw_close() releases
   the port as the backend does. -sn_error_not_supported() / the error
   elsewhere. */
int sn_raw_open(int backend, uint64_t *handle);
int sn_raw_process(int backend, uint64_t handle, sn_registration_t *registrations,
                   uint32_t count, uint32_t timeout_ms,
                   sn_notification_t *notifications, uint32_t max_notifications,
                   uint32_t *received);
int sn_raw_close(int backend, uint64_t handle);

/* CDEF-END */

#ifdef SN_TESTING
/*
 * What a TEST build of the core adds (SN_TESTING defined when the core is
 * compiled: socknotify_loop/_build.py does so for SOCKNOTIFY_TESTING=1 in
 * the build's environment, and cffi then reads the declarations between
 * the CDEF-TESTING markers too). A production build -- the wheels, `pip
 * install .` -- compiles none of it: no strict model, no controls.
 */
/* CDEF-TESTING-BEGIN */

/* Windows, tests only, never chosen by SN_BACKEND_AUTO: the strict model
   of ProcessSocketNotifications (sn_model.c) on the polyfill, enforcing
   the documented rules the polyfill forgives. */
#define SN_BACKEND_STRICT 4

/* The strict model's controls, for tests (sn_model_control; the port
   must be a "strict" one, else -sn_error_not_supported()). */
#define SN_MODEL_REFUSE      1  /* value 1: refuse ENABLEs of `socket` as for a layered
                                   provider (WSAEOPNOTSUPP); 0: accept it again */
#define SN_MODEL_FAIL_CALLS  2  /* the port's next `value` calls fail whole, applying nothing */
#define SN_MODEL_TIED        3  /* which port `socket` is tied to: SN_MODEL_UNTIED,
                                   _TIED_HERE, _TIED_REMOVING (REMOVE applied, its event
                                   not yet dequeued), _TIED_ELSEWHERE */
#define SN_MODEL_KEY         4  /* the completion key the model delivers for `socket` */
#define SN_MODEL_MODES       5  /* the port's modes become `value` (SN_MODEL_MODE_* flags);
                                   answers the modes before. A port starts with the modes
                                   in the environment variable SOCKNOTIFY_STRICT_MODES (a
                                   number, or "harshest") */
#define SN_MODEL_HOLD        6  /* value 1: the port's next call that carries an ENABLE
                                   waits, before it applies anything, until released;
                                   value 3: the same for a call that carries a REMOVE;
                                   value 2 asks whether a call waits (1); value 4
                                   releases the call that waits, value 0 releases it and
                                   cancels a hold set for a later call */
#define SN_MODEL_QUEUE       7  /* queue a notification with events `value` under
                                   `socket`'s key now, before whatever comes next */
#define SN_MODEL_HIDE_STATE  8  /* value 1: the port's reading of what `socket` is finds
                                   getsockopt(SO_BSP_STATE) failing (its type alone
                                   known), as Windows may answer; 0: answering again */
/* The model's modes (docs/strict-model.md gives each one's sentence of
   Microsoft's documentation). */
#define SN_MODEL_MODE_BAD_HANDLE_FAILS_CALL  0x01  /* a handle that is no socket fails the
                                                      whole call, applying nothing */
#define SN_MODEL_MODE_PLAIN_WAIT             0x02  /* the wait is a plain
                                                      GetQueuedCompletionStatusEx: other
                                                      packets (the polyfill's) reach the port
                                                      as they are */
#define SN_MODEL_MODE_ERROR_TIMEOUT          0x04  /* a wait that times out returns
                                                      ERROR_TIMEOUT (1460), not WAIT_TIMEOUT */
#define SN_MODEL_MODE_DISABLE_NEEDS_TRIGGER  0x08  /* DISABLE without LEVEL or EDGE refused */
#define SN_MODEL_MODE_STALE_AFTER_CLOSE      0x10  /* a registration ended by closesocket()
                                                      leaves a notification queued under its
                                                      key */
#define SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED  0x20  /* ENABLE of a registration that is
                                                      armed (enabled, not disabled, its
                                                      one-shot not delivered) refused */
#define SN_MODEL_MODE_TIES_SOCKET            0x40  /* a socket's first ENABLE associates
                                                      its handle with the port for good, as
                                                      CreateIoCompletionPort does: a handle
                                                      associated with another port already
                                                      is refused */
#define SN_MODEL_MODE_REMOVE_ANY_PORT        0x80  /* a REMOVE or DISABLE naming a socket
                                                      another port holds acts on that
                                                      registration (its REMOVE event goes
                                                      to that port) */
#define SN_MODEL_MODE_QUEUED_BEFORE_MODIFY   0x100  /* an ENABLE of an armed registration
                                                      whose socket is ready leaves the
                                                      notification of the filter it replaces
                                                      queued */
#define SN_MODEL_MODE_ENABLE_OVERWRITES      0x200  /* an ENABLE of a socket another port
                                                      holds takes the registration over
                                                      (the other port hears nothing more)
                                                      instead of being refused */
#define SN_MODEL_MODES_HARSHEST              0x3FF
#define SN_MODEL_UNTIED          0
#define SN_MODEL_TIED_HERE       1
#define SN_MODEL_TIED_REMOVING   2
#define SN_MODEL_TIED_ELSEWHERE  3
/* Returns the answer (>= 0) or minus an error code. */
int64_t sn_model_control(sn_port_t *port, int what, uint64_t socket, int64_t value);

/* CDEF-TESTING-END */
#endif /* SN_TESTING */

#endif /* SOCKNOTIFY_H */
