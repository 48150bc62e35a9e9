/*
 * sn_testing.h -- the strict model's controls (sn_model_control), for the
 * tests alone: not part of the production interface. cffi sees the
 * declarations between the CDEF markers only in a test build
 * (SOCKNOTIFY_TESTING=1 when the extension is built: socknotify_loop/_build.py;
 * tools/wine builds its test wheels so); everywhere else the function is
 * compiled (sn_model.c, a stub in sn_backends.c) but not reachable from
 * Python. tests/test_strict_model.py steers the model through it.
 */
#ifndef SN_TESTING_H
#define SN_TESTING_H

#include "socknotify.h"

/* CDEF-BEGIN */

/* The strict model's controls, for tests (sn_model_control; the port
   must be a "strict" one, else -sn_error_not_supported()). */
#define SN_MODEL_REFUSE      1  /* value 1: refuse ENABLEs of `socket` as for a layered
                                   provider (WSAEOPNOTSUPP); 0: accept it again */
#define SN_MODEL_FAIL_CALLS  2  /* the port's next `value` calls fail whole, applying nothing */
#define SN_MODEL_TIED        3  /* which port `socket` is tied to: SN_MODEL_UNTIED,
                                   _TIED_HERE, _TIED_REMOVING (REMOVE applied, its event
                                   not yet dequeued), _TIED_ELSEWHERE */
#define SN_MODEL_KEY         4  /* the completion key the model delivers for `socket` */
#define SN_MODEL_MODES       5  /* the port's modes become `value` (SN_MODEL_MODE_* flags);
                                   answers the modes before. A port starts with the modes
                                   in the environment variable SOCKNOTIFY_STRICT_MODES (a
                                   number, or "harshest") */
#define SN_MODEL_HOLD        6  /* value 1: the port's next call that carries an ENABLE
                                   waits, before it applies anything, until value 0
                                   releases it; value 2 asks whether a call waits (1) */
#define SN_MODEL_QUEUE       7  /* queue a notification with events `value` under
                                   `socket`'s key now, before whatever comes next */
/* The model's modes (docs/strict-model.md gives each one's sentence of
   Microsoft's documentation). */
#define SN_MODEL_MODE_BAD_HANDLE_FAILS_CALL  0x01  /* a handle that is no socket fails the
                                                      whole call, applying nothing */
#define SN_MODEL_MODE_PLAIN_WAIT             0x02  /* the wait is a plain
                                                      GetQueuedCompletionStatusEx: other
                                                      packets (the polyfill's) reach the port
                                                      as they are */
#define SN_MODEL_MODE_ERROR_TIMEOUT          0x04  /* a wait that times out returns
                                                      ERROR_TIMEOUT (1460), not WAIT_TIMEOUT */
#define SN_MODEL_MODE_DISABLE_NEEDS_TRIGGER  0x08  /* DISABLE without LEVEL or EDGE refused */
#define SN_MODEL_MODE_STALE_AFTER_CLOSE      0x10  /* a registration ended by closesocket()
                                                      leaves a notification queued under its
                                                      key */
#define SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED  0x20  /* ENABLE of a registration that is
                                                      armed (enabled, not disabled, its
                                                      one-shot not delivered) refused */
#define SN_MODEL_MODE_TIES_SOCKET            0x40  /* a socket's first ENABLE associates
                                                      its handle with the port for good, as
                                                      CreateIoCompletionPort does: a handle
                                                      associated with another port already
                                                      is refused */
#define SN_MODEL_MODES_HARSHEST              0x7F
#define SN_MODEL_UNTIED          0
#define SN_MODEL_TIED_HERE       1
#define SN_MODEL_TIED_REMOVING   2
#define SN_MODEL_TIED_ELSEWHERE  3
/* Returns the answer (>= 0) or minus an error code. */
int64_t sn_model_control(sn_port_t *port, int what, uint64_t socket, int64_t value);

/* CDEF-END */

#endif /* SN_TESTING_H */
