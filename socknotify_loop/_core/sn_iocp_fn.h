/*
 * sn_iocp_fn.h -- the port on a completion port as its backends share it:
 * which ProcessSocketNotifications-shaped function serves each one
 * (sn_iocp_fn.c), and the port code's entries (sn_iocp.c) for a backend
 * whose ops table lives elsewhere (the strict model's, sn_model.c, in a
 * test build). Internal to the port code; cffi never sees this file.
 */
#ifndef SN_IOCP_FN_H
#define SN_IOCP_FN_H

#ifdef _WIN32

#include "sn_internal.h"
#include "sn_win.h"

/* A function with ProcessSocketNotifications' signature and contract, and
   what the port code must know of it. */
typedef struct iocp_function {
    sn_process_socket_notifications_fn process;
    /* The AFD polyfill itself: it applies a call's changes before its
       wait (so it can shorten the wait for a refusal itself), and there is
       nothing to fall back to. */
    int polyfill;
    /* One of ours (the polyfill, the strict model), whose notifications
       never carry an OVERLAPPED (see sn_iocp.c, iocp__kevent). */
    int emulated;
    /* It keeps state in the polyfill for the port, released at close. */
    int on_polyfill;
    /* Forget what it keeps for a port that closes, before the polyfill
       does (NULL: nothing). */
    void (*closed)(HANDLE iocp);
} iocp_function_t;

/* The function of SN_BACKEND_PSN or _AFD (and _STRICT in a test build);
   NULL for psn where the OS lacks it, and for any other backend. */
const iocp_function_t *sn_iocp_function(int backend);

/* The backends' `available` entries: whether the function is there, and
   a sentence saying so. */
int sn_iocp_available_psn(const char **why);
int sn_iocp_available_afd(const char **why);

/* The port code (sn_iocp.c): a port opened on `fn`, and the entries of
   every completion-port backend's ops table. */
int sn_iocp_open(sn_port_t *port, const iocp_function_t *fn);
int sn_iocp_process(sn_port_t *port, sn_registration_t *regs, uint32_t count,
                    int64_t timeout_ms, sn_kevent_t *events, uint32_t max_events,
                    uint32_t *received, uint32_t *dropped);
int sn_iocp_post(sn_port_t *port, uint64_t key);
void sn_iocp_wake_all(sn_port_t *port);
void sn_iocp_close(sn_port_t *port, int inherited);
uint64_t sn_iocp_os_handle(sn_port_t *port);
int sn_iocp_check(sn_port_t *port, uint64_t socket);
int sn_iocp_identify(sn_port_t *port, uint64_t socket, sn_identity_t *out);
void sn_iocp_add_afd_counters(sn_port_t *port, uint64_t *out);

/* What the socket under `s` is (sn_identity_t): its type from SO_TYPE
   and, from SO_BSP_STATE when `bsp_state` is 1 and the option answers,
   its addresses. 0, or the error that says it is no socket. (The strict
   model's identify passes 0 for a socket a test says the option fails
   for.) */
int sn_iocp_identify_socket(SOCKET s, int bsp_state, sn_identity_t *out);

/* The completion-port backends share the port code; they differ in their
   id, the triggers they honour, how a port opens (which function it
   calls), how a socket is identified (the strict model plays failures of
   SO_BSP_STATE) and whether they add the polyfill's kernel-call counts to
   the port's (afd and strict, which run on the polyfill; NULL for psn).
   One shape, one line each. A registration survives its DISABLE
   (SN_CAP_DISABLE_KEEPS): it is disarmed, not removed. */
#define IOCP_OPS(backend, honoured, is_available, open_port, identify_socket, counters) { \
    .id = (backend),                                                     \
    .triggers = (honoured),                                              \
    .caps = SN_CAP_KEY_FIXED | SN_CAP_DISABLE_KEEPS,                     \
    .available = (is_available),                                         \
    .open = (open_port),                                                 \
    .process = sn_iocp_process,                                          \
    .post = sn_iocp_post,                                                \
    .wake_all = sn_iocp_wake_all,                                        \
    .close = sn_iocp_close,                                              \
    .os_handle = sn_iocp_os_handle,                                      \
    .check = sn_iocp_check,                                              \
    .identify = (identify_socket),                                       \
    .add_counters = (counters),                                          \
}

#ifdef SN_TESTING
/* The strict model's function (sn_model.c, test builds only). */
extern const iocp_function_t sn_model_function;
#endif

#endif /* _WIN32 */

#endif /* SN_IOCP_FN_H */
