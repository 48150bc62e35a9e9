/*
 * sn_afd_ws.h -- the two Winsock questions the AFD polyfill asks about a
 * caller's socket (sn_afd_ws.c). Internal to the polyfill's files
 * (sn_afd*.c); cffi never sees it.
 */
#ifndef SN_AFD_WS_H
#define SN_AFD_WS_H

#ifdef _WIN32

#include "sn_win.h"

#ifndef SIO_BASE_HANDLE
#  define SIO_BASE_HANDLE 0x48000022
#endif
#ifndef SIO_BSP_HANDLE_SELECT
#  define SIO_BSP_HANDLE_SELECT 0x4800001C
#endif
#ifndef SIO_BSP_HANDLE_POLL
#  define SIO_BSP_HANDLE_POLL 0x4800001D
#endif

/* The socket AFD must be asked about: the base socket below any layered
   service provider. Returns 0 or a Winsock error (the SIO_BASE_HANDLE
   error when no layer gives the base away). */
DWORD sn_afd_ws_base_socket(SOCKET socket, SOCKET *base);

/* How the lookup asks one base-handle ioctl (SIO_BASE_HANDLE,
   SIO_BSP_HANDLE_POLL, SIO_BSP_HANDLE_SELECT) of a socket: 0 and *answer,
   or a Winsock error. WSAIoctl by default; the seam through which
   tests/c/ plays a layered service provider (no LSP can be installed under
   Wine or on CI). Set only while no other thread is inside the polyfill. */
typedef DWORD (*sn_afd_ws_query_fn)(SOCKET socket, DWORD ioctl, SOCKET *answer);
extern sn_afd_ws_query_fn sn_afd_ws_query;

/* Whether `socket` still names an open socket: 0 or a Winsock error
   (WSAENOTSOCK once it was closed). */
DWORD sn_afd_ws_check(SOCKET socket);

/* How sn_afd_ws_check asks: getsockopt(SO_TYPE) by default; the seam
   through which tests/c/ counts the questions put to a caller's socket.
   Set only while no other thread is inside the polyfill. */
typedef DWORD (*sn_afd_ws_check_fn)(SOCKET socket);
extern sn_afd_ws_check_fn sn_afd_ws_check_socket;

#endif /* _WIN32 */
#endif /* SN_AFD_WS_H */
