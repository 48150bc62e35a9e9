/*
 * sn_iocp_fn.h -- which ProcessSocketNotifications-shaped function serves
 * a backend (sn_iocp_fn.c), for the port code in sn_iocp.c. Internal to
 * the port code; cffi never sees this file.
 */
#ifndef SN_IOCP_FN_H
#define SN_IOCP_FN_H

#ifdef _WIN32

#include "sn_win.h"

/* The function of SN_BACKEND_PSN, _AFD or _STRICT; NULL for psn where the
   OS lacks it, and for any other backend. */
sn_process_socket_notifications_fn sn_iocp_function(int backend);

/* The backends' `available` entries: whether the function is there, and
   a sentence saying so. */
int sn_iocp_available_psn(const char **why);
int sn_iocp_available_afd(const char **why);
int sn_iocp_available_strict(const char **why);

#endif /* _WIN32 */

#endif /* SN_IOCP_FN_H */
