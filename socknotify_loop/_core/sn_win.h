/*
 * sn_win.h -- what sn_iocp*.c (the port code), sn_model.c (the strict
 * model) and sn_afd*.c (the polyfill) share on Windows: the SDK's types
 * and the function signature they all have. cffi never sees this file.
 *
 * ProcessSocketNotifications and its types are missing from mingw-w64 10's
 * headers, so they are declared here, with the values and x64 layout of the
 * Windows SDK (checked by static assertions in sn_iocp.c). The polyfill
 * exports a function with exactly the OS function's signature and contract,
 * so the port code can call either through one pointer.
 */
#ifndef SN_WIN_H
#define SN_WIN_H

#ifdef _WIN32

/* 64-bit Windows only (x64 and ARM64). The port's kernel keys and its
   reserved keys (sn_keys.h) are 64-bit values that travel in a completion
   key and, for posted packets, in lpOverlapped; SOCK_NOTIFY_REGISTRATION's
   completionKey is a PVOID. On 32-bit Windows both are 32 bits wide: every
   key would be cut in half, the generation that tells a stale notification
   from a live one would be lost, and the reserved keys would collide with
   registrations (dropped wake-ups, pipe completions taken for sockets).
   Refuse the build rather than ship that. */
#if !defined(_WIN64)
#  error "socknotify_loop supports 64-bit Windows only (x64, ARM64): its completion keys are 64-bit, and a 32-bit PVOID/ULONG_PTR cannot carry them"
#endif

/* The core is C11 (_Static_assert, declarations after statements). MSVC
   speaks C11 only when asked: socknotify_loop/_build.py passes /std:c11. */
#if defined(_MSC_VER) && !defined(__clang__) && \
    (!defined(__STDC_VERSION__) || __STDC_VERSION__ < 201112L)
#  error "compile the socknotify_loop core as C11: MSVC needs /std:c11 (socknotify_loop/_build.py passes it)"
#endif

#ifndef WIN32_LEAN_AND_MEAN
#  define WIN32_LEAN_AND_MEAN
#endif
#include <winsock2.h>
#include <windows.h>
#include <stdint.h>

/* The SDK's SOCK_NOTIFY_REGISTRATION and constants (winsock2.h, Windows 11
   SDK). Skipped if a newer toolchain's headers already have them. */
#ifndef SOCK_NOTIFY_OP_ENABLE
typedef struct sn_sock_notify_registration {
    SOCKET socket;
    PVOID completionKey;
    UINT16 eventFilter;
    UINT8 operation;
    UINT8 triggerFlags;
    DWORD registrationResult;
} SOCK_NOTIFY_REGISTRATION;

#define SOCK_NOTIFY_REGISTER_EVENT_NONE    0x00
#define SOCK_NOTIFY_REGISTER_EVENT_IN      0x01
#define SOCK_NOTIFY_REGISTER_EVENT_OUT     0x02
#define SOCK_NOTIFY_REGISTER_EVENT_HANGUP  0x04

#define SOCK_NOTIFY_EVENT_IN      SOCK_NOTIFY_REGISTER_EVENT_IN
#define SOCK_NOTIFY_EVENT_OUT     SOCK_NOTIFY_REGISTER_EVENT_OUT
#define SOCK_NOTIFY_EVENT_HANGUP  SOCK_NOTIFY_REGISTER_EVENT_HANGUP
#define SOCK_NOTIFY_EVENT_ERR     0x40
#define SOCK_NOTIFY_EVENT_REMOVE  0x80

#define SOCK_NOTIFY_OP_NONE     0x00
#define SOCK_NOTIFY_OP_ENABLE   0x01
#define SOCK_NOTIFY_OP_DISABLE  0x02
#define SOCK_NOTIFY_OP_REMOVE   0x04

#define SOCK_NOTIFY_TRIGGER_ONESHOT     0x01
#define SOCK_NOTIFY_TRIGGER_PERSISTENT  0x02
#define SOCK_NOTIFY_TRIGGER_LEVEL       0x04
#define SOCK_NOTIFY_TRIGGER_EDGE        0x08
#endif /* SOCK_NOTIFY_OP_ENABLE */

/* Every bit an event filter may hold. */
#define SN_NOTIFY_FILTER_ALL \
    (SOCK_NOTIFY_REGISTER_EVENT_IN | SOCK_NOTIFY_REGISTER_EVENT_OUT | \
     SOCK_NOTIFY_REGISTER_EVENT_HANGUP)

/* The signature of ProcessSocketNotifications, written once: the OS's
   function (looked up at run time, sn_iocp_fn.c), the polyfill's
   (sn_afd.c) and the strict model's (sn_model.c) all have it, so the port
   code calls any of them through one pointer. SN_PSN_PARAMETERS is the
   parameter list with the reference page's names; the definitions in
   sn_afd.c and sn_model.c are written with it too, so the three can never
   drift apart (the compiler also checks each definition against the
   declaration here, and each use against the pointer type). */
#define SN_PSN_PARAMETERS                            \
    HANDLE completionPort,                           \
    UINT32 registrationCount,                        \
    SOCK_NOTIFY_REGISTRATION *registrationInfos,     \
    UINT32 timeoutMs,                                \
    ULONG completionCount,                           \
    OVERLAPPED_ENTRY *completionPortEntries,         \
    UINT32 *receivedEntryCount

typedef DWORD (WINAPI *sn_process_socket_notifications_fn)(SN_PSN_PARAMETERS);

/* The argument rules of ProcessSocketNotifications' reference page, checked
   first by both of our implementations of it (the polyfill's and the strict
   model's): the received count is zeroed before anything can fail, a port
   handle that cannot be one is ERROR_INVALID_HANDLE, registrationInfos is
   NULL exactly when registrationCount is 0, no entries means no wait and
   no outputs, and the registrations and the entries are two arrays that do
   not overlap (ERROR_INVALID_PARAMETER otherwise). SN_PSN_ARGUMENTS passes
   a definition's own parameters through. Returns 0 when the call may go
   on. */
#define SN_PSN_ARGUMENTS completionPort, registrationCount, registrationInfos, \
    timeoutMs, completionCount, completionPortEntries, receivedEntryCount

static inline DWORD sn_psn_check_arguments(SN_PSN_PARAMETERS) {
    if (receivedEntryCount != NULL)
        *receivedEntryCount = 0;
    if (completionPort == NULL || completionPort == INVALID_HANDLE_VALUE)
        return ERROR_INVALID_HANDLE;
    if ((registrationCount != 0) != (registrationInfos != NULL) ||
        (completionCount == 0 && (timeoutMs != 0 || completionPortEntries != NULL ||
                                  receivedEntryCount != NULL)) ||
        (completionCount != 0 && (completionPortEntries == NULL ||
                                  receivedEntryCount == NULL)))
        return ERROR_INVALID_PARAMETER;
    if (registrationCount != 0 && completionCount != 0) {
        uintptr_t regs = (uintptr_t)registrationInfos;
        uintptr_t regs_end = regs + (uintptr_t)registrationCount * sizeof *registrationInfos;
        uintptr_t entries = (uintptr_t)completionPortEntries;
        uintptr_t entries_end = entries + (uintptr_t)completionCount * sizeof *completionPortEntries;
        if (regs < entries_end && entries < regs_end)
            return ERROR_INVALID_PARAMETER;
    }
    return 0;
}

/* The reserved completion keys (SN_POST_COMPLETION_KEY, SN_AFD_COMPLETION_KEY,
   SN_IO_COMPLETION_KEY, SN_CLOSE_COMPLETION_KEY) live in sn_keys.h, the one
   table of them. */
#include "sn_keys.h"

/* The polyfill's entry points (sn_afd*.c) are declared in sn_afd.h. */

#ifdef SN_TESTING
/* The strict model (sn_model.c, test builds only): ProcessSocketNotifications
   on the polyfill, with the documented rules enforced. sn_model_port_closed():
   call before sn_afd_port_closed() when such a port closes. */
DWORD WINAPI sn_model_process_socket_notifications(SN_PSN_PARAMETERS);
void sn_model_port_closed(HANDLE port);
#endif

#endif /* _WIN32 */
#endif /* SN_WIN_H */
