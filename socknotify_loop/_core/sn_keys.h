/*
 * sn_keys.h -- every completion key and reserved value the port uses, in
 * one table. cffi never sees this file.
 *
 * The kernel never sees a caller's key: it sees SN_KERNEL_KEY(recno,
 * generation) (sn_internal.h), whose bit 63 is always clear and which is
 * never 0. Everything below is therefore free for the port's own use and
 * can never be mistaken for a registration's key:
 *
 *   key                      where         what travels with it
 *   -----------------------  ------------  -------------------------------
 *   0                        Windows       a completion posted by
 *                                          RegisterWaitWithQueue (process
 *                                          exit): an SN_EVENT_IO, keyed by
 *                                          its OVERLAPPED's address
 *   SN_IO_COMPLETION_KEY     Windows       overlapped I/O of handles
 *                                          associated with the port (pipes,
 *                                          subprocesses): SN_EVENT_IO
 *   SN_AFD_COMPLETION_KEY    Windows/afd   the polyfill's own AFD polls;
 *                                          consumed inside the polyfill
 *   SN_AFD_MODEL_COMPLETION_KEY            the AFD polls of the strict
 *                            Windows       model's own instance of the
 *                            (tests)       polyfill (sn_model.c), apart
 *                                          from the one that serves the
 *                                          port's refused sockets
 *   SN_POST_COMPLETION_KEY   Windows       sn_port_post(): the caller's key
 *                                          rides in lpOverlapped
 *   SN_CLOSE_COMPLETION_KEY  Windows       sn_port_close() waking waiters;
 *                                          dropped, never reported
 *   SN_EPOLL_WAKE_KEY        Linux         the eventfd that makes REMOVE
 *                                          events, posted packets and close
 *                                          wake epoll_wait
 *
 * Keys the CALLER may use: any 64-bit value for registrations; for
 * sn_port_post(), any value but SN_QUIET_WAKE_KEY (2**64-1, socknotify.h),
 * the selector's own wake-up, which sn_port_select_posted() does not
 * count as the caller's (Port.post refuses it).
 */
#ifndef SN_KEYS_H
#define SN_KEYS_H

#define SN_RESERVED_KEY_BIT      (1ull << 63)
#define SN_POST_COMPLETION_KEY   0xFFFFFFFFFFFFFFFFull
#define SN_AFD_COMPLETION_KEY    0xFFFFFFFFFFFFFFFEull
#define SN_IO_COMPLETION_KEY     0xFFFFFFFFFFFFFFFDull
#define SN_CLOSE_COMPLETION_KEY  0xFFFFFFFFFFFFFFFCull
#define SN_AFD_MODEL_COMPLETION_KEY 0xFFFFFFFFFFFFFFFBull
#define SN_EPOLL_WAKE_KEY        0xFFFFFFFFFFFFFFFFull

#endif /* SN_KEYS_H */
