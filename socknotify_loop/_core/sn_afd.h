/*
 * sn_afd.h -- the AFD polyfill as the rest of the core sees it: the
 * ProcessSocketNotifications-shaped entry point and the calls a port makes
 * about the polyfill's state for it, all defined in sn_afd.c. The port
 * code (sn_iocp*.c), the strict model (sn_model.c) and the C tests include
 * this header and nothing else of the polyfill; the polyfill's own
 * headers (sn_afd_port.h, sn_afd_sock.h, ...) stay inside sn_afd*.c.
 * cffi never sees this file.
 */
#ifndef SN_AFD_H
#define SN_AFD_H

#ifdef _WIN32

#include "sn_win.h"

/* ProcessSocketNotifications on IOCTL_AFD_POLL (sn_afd.c). Same
   arguments, same return values (ERROR_SUCCESS, WAIT_TIMEOUT, or an error
   for the whole call), same per-registration results. */
DWORD WINAPI sn_afd_process_socket_notifications(SN_PSN_PARAMETERS);

/* The polyfill serving a port whose own function (the OS's, or the model)
   refused a socket: turns the polyfill's packets among `got` dequeued
   entries into notifications in place (others untouched) and resubmits
   what their completions asked for; returns the entries left. */
ULONG sn_afd_translate(HANDLE port, OVERLAPPED_ENTRY *entries, ULONG got);

/* The same two for an instance of the polyfill's state other than the
   callers' (SN_AFD_COMPLETION_KEY): the strict model's own
   (SN_AFD_MODEL_COMPLETION_KEY), whose registrations are not the
   fallback's, and whose packets come under that key. */
DWORD sn_afd_process_as(ULONG_PTR instance, SN_PSN_PARAMETERS);
ULONG sn_afd_translate_as(ULONG_PTR instance, HANDLE port, OVERLAPPED_ENTRY *entries,
                          ULONG got);

/* Release the polyfill's state for a port (every instance's): cancel outstanding polls, wait
   for their completions (the kernel writes into our memory until then),
   close the helper handles, free everything. Call it BEFORE closing the
   port handle, with no other thread inside the polyfill for that port.
   Packets still queued on the port are dequeued and dropped. A port the
   polyfill never saw is left alone. */
void sn_afd_port_closed(HANDLE port);

/* The polyfill's bookkeeping for a port, for tests and statistics: live
   registrations, and polls the kernel still owns (in flight, including
   cancelled ones not yet come back). Returns ERROR_NOT_FOUND for a port
   the polyfill has not seen. */
DWORD sn_afd_statistics(HANDLE port, UINT32 *registered, UINT32 *polls_in_flight);

/* Add the polyfill's kernel-call counts for a port (SN_COUNT_AFD_*) into
   counters[]; nothing for a port the polyfill has not seen. */
void sn_afd_counters(HANDLE port, uint64_t *counters);

#endif /* _WIN32 */
#endif /* SN_AFD_H */
