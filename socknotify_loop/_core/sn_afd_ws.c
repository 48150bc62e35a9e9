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

/* One base-handle question: 0 and *answer, or a Winsock error. */
static DWORD ws__query(SOCKET socket, DWORD ioctl, SOCKET *answer) {
    SOCKET found = INVALID_SOCKET;
    DWORD bytes = 0;
    if (WSAIoctl(socket, ioctl, NULL, 0, &found, sizeof found, &bytes,
                 NULL, NULL) == SOCKET_ERROR)
        return (DWORD)WSAGetLastError();
    *answer = found;
    return 0;
}

sn_afd_ws_query_fn sn_afd_ws_query = ws__query;

/* A protocol chain holds at most MAX_PROTOCOL_CHAIN (7) entries, so at most
   that many layers can sit above the base provider; one more step catches
   a provider whose answers go round in a circle. */
#define WS_MAX_LAYERS 8

/* The lookup. SIO_BASE_HANDLE is the documented question, and layered
   providers must pass it down untouched; some intercept it anyway (wepoll
   names Komodia's redirector), and then the SIO_BSP_HANDLE_POLL/_SELECT
   answers are what is left. Those name the socket of the NEXT provider
   down, not necessarily the base: so an answer is only a step, and
   SIO_BASE_HANDLE is asked again of the socket it names, until a layer
   answers it. An answer equal to the socket asked is no step at all: a
   layered provider that wants select()/WSAPoll() to go through itself
   answers with its own socket, and AFD, given that handle, fails the poll
   with STATUS_INVALID_HANDLE. Such an answer is never taken for the base. */
DWORD sn_afd_ws_base_socket(SOCKET socket, SOCKET *base) {
    static const DWORD bsp_ioctls[] = { SIO_BSP_HANDLE_POLL, SIO_BSP_HANDLE_SELECT };
    SOCKET current = socket;
    DWORD first_error = 0;
    int depth;

    for (depth = 0; depth < WS_MAX_LAYERS; depth++) {
        SOCKET found = INVALID_SOCKET, next = INVALID_SOCKET;
        DWORD error = sn_afd_ws_query(current, SIO_BASE_HANDLE, &found);
        size_t i;
        if (error == 0 && found != INVALID_SOCKET) {
            *base = found;
            return 0;
        }
        if (error == 0)
            error = WSAEINVAL;    /* "succeeded" with no socket: no answer */
        /* Not a socket (closed, or never was): no other ioctl will help. */
        if (error == WSAENOTSOCK)
            return error;
        if (depth == 0)
            first_error = error;
        for (i = 0; i < sizeof bsp_ioctls / sizeof bsp_ioctls[0]; i++) {
            SOCKET step = INVALID_SOCKET;
            if (sn_afd_ws_query(current, bsp_ioctls[i], &step) == 0 &&
                step != INVALID_SOCKET && step != current) {
                next = step;
                break;
            }
        }
        if (next == INVALID_SOCKET)
            break;       /* no layer to peel */
        current = next;  /* one layer down: ask SIO_BASE_HANDLE again */
    }
    if (current == socket && first_error == WSAEOPNOTSUPP) {
        /* Wine builds without SIO_BASE_HANDLE (and BSP answers naming the
           socket itself, or none): no LSPs there, the socket is its own
           base. */
        *base = socket;
        return 0;
    }
    /* Layers that hide the base: refused with the documented question's
       error, never guessed (a wrong guess is a poll that fails later and
       a registration that dies without a word). */
    return first_error;
}

/* The base-handle ioctls cannot tell whether a socket is still open: Wine
   8 answers SIO_BASE_HANDLE for a closed handle as for an open one. */
static DWORD ws__check(SOCKET socket) {
    int type = 0, len = sizeof type;
    if (getsockopt(socket, SOL_SOCKET, SO_TYPE, (char *)&type, &len) != 0)
        return (DWORD)WSAGetLastError();
    return 0;
}

sn_afd_ws_check_fn sn_afd_ws_check_socket = ws__check;

DWORD sn_afd_ws_check(SOCKET socket) {
    return sn_afd_ws_check_socket(socket);
}

#endif /* _WIN32 */
