/*
 * sn_afd_ws.h -- the two Winsock questions the AFD polyfill asks about a
 * caller's socket (sn_afd_ws.c). Internal to the polyfill's files
 * (sn_afd*.c); cffi never sees it.
 */
#ifndef SN_AFD_WS_H
#define SN_AFD_WS_H

#ifdef _WIN32

#include "sn_win.h"

/* The socket AFD must be asked about: the base socket below any layered
   service provider. Returns 0 or a Winsock error. */
DWORD sn_afd_ws_base_socket(SOCKET socket, SOCKET *base);

/* Whether `socket` still names an open socket: 0 or a Winsock error
   (WSAENOTSOCK once it was closed). */
DWORD sn_afd_ws_check(SOCKET socket);

#endif /* _WIN32 */
#endif /* SN_AFD_WS_H */
