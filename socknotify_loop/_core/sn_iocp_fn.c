/*
 * sn_iocp_fn.c -- which ProcessSocketNotifications-shaped function serves
 * a backend, and that function called bare, on a completion port of its
 * own, without the port layer.
 *
 * Three functions share one signature and one contract: the OS's own
 * ProcessSocketNotifications (psn), looked up in ws2_32 at run time
 * because it exists only from Windows 11 and Server 2022 and is missing
 * from mingw-w64's import libraries; the IOCTL_AFD_POLL polyfill (afd,
 * sn_afd.c); and, in a test build, the strict model of the documented
 * rules (strict, sn_model.c). sn_iocp.c drives a port through whichever
 * one its backend names, described by an iocp_function_t (sn_iocp_fn.h):
 * the function and what the port code must know of it. The bare calls
 * (sn_raw_open/process/close) exist so that `python -m socknotify_loop
 * --probe-os` and the strict-model tests can ask each function the
 * documented questions directly: what it answers, not what the port layer
 * makes of it.
 *
 * The hazards: the lookup runs once per process (InitOnceExecuteOnce, so
 * two threads opening their first ports race to nothing), and ws2_32 is
 * never unloaded once loaded, so the pointer stays valid. A bare port is
 * the caller's to close; closing it tells the polyfill and the model to
 * forget what they held for it, as closing a port does.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * and the reference pages of ProcessSocketNotifications,
 * SOCK_NOTIFY_REGISTRATION and InitOnceExecuteOnce.
 */
#ifdef _WIN32

#include "sn_afd.h"
#include "sn_iocp_fn.h"

/* The bare calls translate on the stack: the probe's batches are small. */
#define RAW_REGS 32
#define RAW_ENTRIES 128

/* --------------------------------------------------------------- PSN lookup */

/* The OS's function, filled in by the lookup (once). */
static iocp_function_t iocp__psn;
static INIT_ONCE iocp__psn_once = INIT_ONCE_STATIC_INIT;

/* The polyfill: applies before it waits, and is ours. */
static const iocp_function_t iocp__afd = {
    sn_afd_process_socket_notifications, 1, 1, 1, NULL,
};

static BOOL CALLBACK iocp__psn_lookup(PINIT_ONCE once, PVOID param, PVOID *context) {
    HMODULE ws2 = GetModuleHandleW(L"ws2_32.dll");
    (void)once;
    (void)param;
    (void)context;
    /* Normally loaded already (we link it); never unloaded once loaded. */
    if (ws2 == NULL)
        ws2 = LoadLibraryW(L"ws2_32.dll");
    if (ws2 != NULL)
        iocp__psn.process = (sn_process_socket_notifications_fn)(void (*)(void))
            GetProcAddress(ws2, "ProcessSocketNotifications");
    return TRUE;
}

static int iocp__psn_found(void) {
    InitOnceExecuteOnce(&iocp__psn_once, iocp__psn_lookup, NULL, NULL);
    return iocp__psn.process != NULL;
}

int sn_iocp_available_psn(const char **why) {
    int found = iocp__psn_found();
    *why = found ? "ProcessSocketNotifications exported by ws2_32"
                 : "ProcessSocketNotifications not exported by ws2_32 "
                   "(needs Windows 11 or Server 2022)";
    return found;
}

int sn_iocp_available_afd(const char **why) {
    *why = iocp__psn_found()
        ? "IOCTL_AFD_POLL polyfill (available; the OS's own "
          "ProcessSocketNotifications is preferred)"
        : "ProcessSocketNotifications not exported by ws2_32; "
          "AFD fallback (IOCTL_AFD_POLL polyfill)";
    return 1;
}

/* ---------------------------------------------------- the bare functions */

const iocp_function_t *sn_iocp_function(int backend) {
    switch (backend) {
    case SN_BACKEND_PSN:    return iocp__psn_found() ? &iocp__psn : NULL;
    case SN_BACKEND_AFD:    return &iocp__afd;
#ifdef SN_TESTING
    case SN_BACKEND_STRICT: return &sn_model_function;
#endif
    default:                return NULL;
    }
}

/* In a raw notification's events: the packet carried an lpOverlapped
   (socknotify_loop/probe.py reads this bit). */
#define SN_RAW_OVERLAPPED 0x80000000u

int sn_raw_open(int backend, uint64_t *handle) {
    HANDLE iocp;
    if (sn_iocp_function(backend) == NULL)
        return SN_ERROR_NOT_SUPPORTED;
    iocp = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    if (iocp == NULL)
        return (int)GetLastError();
    *handle = (uint64_t)(uintptr_t)iocp;
    return 0;
}

int sn_raw_process(int backend, uint64_t handle, sn_registration_t *registrations,
                   uint32_t count, uint32_t timeout_ms,
                   sn_notification_t *notifications, uint32_t max_notifications,
                   uint32_t *received) {
    const iocp_function_t *fn = sn_iocp_function(backend);
    SOCK_NOTIFY_REGISTRATION kregs[RAW_REGS];
    OVERLAPPED_ENTRY entries[RAW_ENTRIES];
    UINT32 got = 0, i;
    DWORD rc;
    *received = 0;
    if (fn == NULL)
        return SN_ERROR_NOT_SUPPORTED;
    if (count > RAW_REGS || max_notifications > RAW_ENTRIES)
        return SN_ERROR_INVALID;
    for (i = 0; i < count; i++) {
        kregs[i].socket = (SOCKET)registrations[i].socket;
        kregs[i].completionKey = (PVOID)(uintptr_t)registrations[i].key;
        kregs[i].eventFilter = registrations[i].events;
        kregs[i].operation = registrations[i].op;
        kregs[i].triggerFlags = registrations[i].trigger;
        kregs[i].registrationResult = ERROR_SUCCESS;
    }
    if (max_notifications == 0)
        rc = fn->process((HANDLE)(uintptr_t)handle, count, count ? kregs : NULL, 0, 0, NULL,
                         NULL);
    else
        rc = fn->process((HANDLE)(uintptr_t)handle, count, count ? kregs : NULL, timeout_ms,
                         max_notifications, entries, &got);
    for (i = 0; i < count; i++)
        registrations[i].result = (uint32_t)kregs[i].registrationResult;
    if (rc == ERROR_SUCCESS) {
        for (i = 0; i < got; i++) {
            notifications[i].key = (uint64_t)entries[i].lpCompletionKey;
            notifications[i].events = entries[i].dwNumberOfBytesTransferred;
            /* The probe asks what a notification's lpOverlapped (reserved)
               holds: the port drops a packet under a registration's key
               that carries one (sn_iocp.c, iocp__kevent). Events fit in a
               byte, so the top bit is free to say so. */
            if (entries[i].lpOverlapped != NULL)
                notifications[i].events |= SN_RAW_OVERLAPPED;
        }
        *received = got;
    }
    return (int)rc;
}

int sn_raw_close(int backend, uint64_t handle) {
    HANDLE iocp = (HANDLE)(uintptr_t)handle;
    const iocp_function_t *fn = sn_iocp_function(backend);
    if (fn == NULL)
        return SN_ERROR_NOT_SUPPORTED;
    if (fn->closed != NULL)
        fn->closed(iocp);
    /* The polyfill may serve any port (and the model's sockets): release
       what it holds for this one before the handle goes. */
    sn_afd_port_closed(iocp);
    if (!CloseHandle(iocp))
        return (int)GetLastError();
    return 0;
}

#endif /* _WIN32 */

/* ISO C wants a declaration in every translation unit, also where the
   #ifdef above leaves none (MSVC and -pedantic warn otherwise). */
typedef int sn_iocp_fn_c_is_windows_only;
