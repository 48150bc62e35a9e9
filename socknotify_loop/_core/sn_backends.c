/*
 * sn_backends.c -- which backends this build has, which one is preferred,
 * what each can do (sn_backend_*), the error codes the Python layer
 * compares against (sn_error_*), and the raw calls of the OS functions
 * where the operating system has none (sn_raw_*; sn_model_control in a
 * test build).
 *
 * Why a registry: the port never asks which backend it runs on, it reads
 * the backend's ops table (sn_internal.h), and sn_backends[] below is the
 * one place that says which tables exist here and in which order of
 * preference: on Windows the OS's own ProcessSocketNotifications where it
 * exists (Windows 11, Server 2022), else the IOCTL_AFD_POLL polyfill
 * (Windows 10, Server 2019, Wine), with the strict model never chosen by
 * default, and compiled into test builds only (SN_TESTING); on Linux
 * epoll. A backend the build lacks is answered with a sentence saying why
 * (and for the strict model, how to build it), so that the Python layer
 * can skip or refuse with the reason rather than with a bare error code.
 *
 * The hazard is a silent substitute: asking for a backend that is not
 * available fails (sn_error_not_supported) instead of opening another.
 *
 * Sources read: Microsoft's ProcessSocketNotifications reference page
 * (its minimum versions: Windows 11, Server 2022); Wine's source
 * (ws2_32 has no ProcessSocketNotifications, ntdll and afd serve
 * IOCTL_AFD_POLL), which is why the polyfill is the default there.
 */
#include "sn_internal.h"

#include <string.h>

const sn_backend_ops_t *const sn_backends[] = {
#ifdef _WIN32
    &sn_psn_ops,    /* the OS's own function, where it exists */
    &sn_afd_ops,    /* the polyfill, everywhere else on Windows */
#ifdef SN_TESTING
    &sn_strict_ops, /* the strict model: never the default (afd always is) */
#endif
#endif
#ifdef __linux__
    &sn_epoll_ops,
#endif
    NULL,
};

const sn_backend_ops_t *sn__ops_for(int backend) {
    int i;
    for (i = 0; sn_backends[i] != NULL; i++) {
        if (sn_backends[i]->id == backend)
            return sn_backends[i];
    }
    return NULL;
}

int sn_backend_default(void) {
    int i;
    const char *why;
    for (i = 0; sn_backends[i] != NULL; i++) {
        if (sn_backends[i]->available(&why))
            return sn_backends[i]->id;
    }
    return -1;
}

int sn_backend_available(int backend, char *buf, uint32_t buf_size) {
    const sn_backend_ops_t *ops;
    const char *why = "no backend for this operating system";
    int available = 0;

    if (backend == SN_BACKEND_AUTO)
        backend = sn_backend_default();
    ops = sn__ops_for(backend);
    if (ops != NULL) {
        available = ops->available(&why);
    } else if (backend >= SN_BACKEND_EPOLL && backend <= SN_BACKEND_STRICT_NUMBER) {
        /* Not compiled for this operating system, or into this build. */
        why = backend == SN_BACKEND_EPOLL ? "epoll exists only on Linux"
            : backend == SN_BACKEND_PSN ? "ProcessSocketNotifications exists only on Windows"
            : backend == SN_BACKEND_AFD ? "IOCTL_AFD_POLL exists only on Windows"
#if defined(_WIN32) && !defined(SN_TESTING)
            : "the strict model of ProcessSocketNotifications is compiled into test "
              "builds only: build the core with SOCKNOTIFY_TESTING=1 in the environment "
              "(SOCKNOTIFY_TESTING=1 pip install -e .; python -m tools.wine test does so)";
#else
            : "the strict model of ProcessSocketNotifications runs only on Windows, "
              "in a test build of the core (SOCKNOTIFY_TESTING=1)";
#endif
    }
    if (buf != NULL && buf_size > 0) {
        strncpy(buf, why, buf_size - 1);
        buf[buf_size - 1] = '\0';
    }
    return available;
}

int sn_backend_triggers(int backend) {
    const sn_backend_ops_t *ops = sn__ops_for(backend);
    return ops != NULL ? ops->triggers : 0;
}

int sn_backend_caps(int backend) {
    const sn_backend_ops_t *ops = sn__ops_for(backend);
    return ops != NULL ? ops->caps : 0;
}

int sn_error_not_supported(void) { return SN_ERROR_NOT_SUPPORTED; }
int sn_error_not_registered(void) { return SN_ERROR_NOT_REGISTERED; }
int sn_error_invalid(void) { return SN_ERROR_INVALID; }
int sn_error_closed(void) { return SN_ERROR_CLOSED; }
int sn_error_busy(void) { return SN_ERROR_BUSY; }
int sn_error_interrupted(void) { return SN_ERROR_INTERRUPTED; }

#ifdef SN_TESTING
/* The header's number and the one the production build answers for agree. */
typedef char sn_strict_number_agrees[SN_BACKEND_STRICT == SN_BACKEND_STRICT_NUMBER ? 1 : -1];
#endif

#ifndef _WIN32
#ifdef SN_TESTING
/* Windows only: the strict model's controls (sn_model.c), declared in a
   test build's interface on every system. */
int64_t sn_model_control(sn_port_t *port, int what, uint64_t socket, int64_t value) {
    (void)port; (void)what; (void)socket; (void)value;
    return -(int64_t)SN_ERROR_NOT_SUPPORTED;
}
#endif
/* Windows only: the bare functions (sn_iocp_fn.c). */
int sn_raw_open(int backend, uint64_t *handle) {
    (void)backend; (void)handle;
    return SN_ERROR_NOT_SUPPORTED;
}
int sn_raw_process(int backend, uint64_t handle, sn_registration_t *registrations,
                   uint32_t count, uint32_t timeout_ms,
                   sn_notification_t *notifications, uint32_t max_notifications,
                   uint32_t *received) {
    (void)backend; (void)handle; (void)registrations; (void)count; (void)timeout_ms;
    (void)notifications; (void)max_notifications;
    *received = 0;
    return SN_ERROR_NOT_SUPPORTED;
}
int sn_raw_close(int backend, uint64_t handle) {
    (void)backend; (void)handle;
    return SN_ERROR_NOT_SUPPORTED;
}
#endif
