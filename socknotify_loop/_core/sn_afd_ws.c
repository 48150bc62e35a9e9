/*
 * sn_afd_ws.c -- what the AFD polyfill asks Winsock about a caller's
 * socket: which base socket AFD must poll, and whether the handle is
 * still an open socket at all.
 *
 * Why a file of its own: both answers depend on the Winsock in use, not on
 * AFD -- layered service providers hide the base socket, some Wine builds
 * refuse SIO_BASE_HANDLE, others answer it even for a closed handle (the
 * essay in sn_afd.c tells the story) -- and these workarounds belong in
 * one place, away from the poll state machine that relies on them.
 */
#ifdef _WIN32

#include "sn_afd_ws.h"

#ifndef SIO_BASE_HANDLE
#  define SIO_BASE_HANDLE 0x48000022
#endif
#ifndef SIO_BSP_HANDLE_SELECT
#  define SIO_BSP_HANDLE_SELECT 0x4800001C
#endif
#ifndef SIO_BSP_HANDLE_POLL
#  define SIO_BSP_HANDLE_POLL 0x4800001D
#endif

DWORD sn_afd_ws_base_socket(SOCKET socket, SOCKET *base) {
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

/* The base-handle ioctls cannot tell whether a socket is still open: Wine
   8 answers SIO_BASE_HANDLE for a closed handle as for an open one. */
DWORD sn_afd_ws_check(SOCKET socket) {
    int type = 0, len = sizeof type;
    if (getsockopt(socket, SOL_SOCKET, SO_TYPE, (char *)&type, &len) != 0)
        return (DWORD)WSAGetLastError();
    return 0;
}

#endif /* _WIN32 */
