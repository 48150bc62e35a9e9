/*
 * test_win_port.c -- the port code of the completion-port backends
 * (sn_run.c, sn_translate.c, sn_iocp.c) against the strict model of
 * ProcessSocketNotifications (sn_model.c), where the fault is in memory or
 * in a sequence of calls that only C can drive exactly:
 *
 *   1. The answer buffers. An ENABLE that waited for its socket's REMOVE
 *      event and then failed is reported to its owner as an error entry;
 *      that entry and the events of the same call must fit in the room the
 *      caller gave, both for sn_port_process()'s notifications and for
 *      sn_port_select()'s pairs. Checked with guard entries after the
 *      buffer: a write past it changes them.
 *
 * Built with mingw-w64 and run under Wine by tests/c/run_wine.sh, next to
 * test_afd_polyfill.c. Exit status: 0 when every check passed.
 */
#define WIN32_LEAN_AND_MEAN
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sn_internal.h"
#include "sn_win.h"
#include "sn_afd.h"

#define RUN_WIDTH 40
#ifndef SN_TESTING
#  error "build this test with -DSN_TESTING: it drives the strict model of a test build"
#endif

#include "check.h"
#include "win_sockets.h"

#define PERSIST (SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL)
#define ONESHOT (SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL)

/* ------------------------------------------------------------- plumbing */

/* A connected pair (win_sockets.h), both ends non-blocking. */
static void make_nonblocking_pair(SOCKET *a, SOCKET *b) {
    make_pair(a, b);
    set_nonblocking(*b);
}

static sn_registration_t reg(SOCKET s, uint64_t key, uint16_t events, uint8_t op,
                             uint8_t trigger) {
    sn_registration_t r;
    r.socket = (uint64_t)s;
    r.key = key;
    r.events = events;
    r.op = op;
    r.trigger = trigger;
    r.result = 0;
    return r;
}

static sn_port_t *open_strict(void) {
    int error = 0;
    sn_port_t *port = sn_port_open(SN_BACKEND_STRICT, &error);
    if (port == NULL)
        fprintf(stderr, "strict port: error %d\n", error);
    CHECK(port != NULL);
    return port;
}

/* ----------------------------------------------------- the answer buffers */

#define READY 4          /* readable sockets: as many as the answer holds */
#define GUARD 8          /* guard entries after the answer */
#define GUARD_KEY 0x5a5a5a5a5a5a5a5aull

/* READY readable sockets, registered persistent level under keys 100.., and
   a socket `x`, registered under key 1, then given a new key in a call
   that only registers: a quiet REMOVE goes to the kernel, and the new
   ENABLE waits in the record for its REMOVE event. Then `x` is closed: the
   call that dequeues the event sends the ENABLE that waited, which fails
   (no socket). A later call's answer holds that failure and up to READY
   readiness entries. */
static void answer_setup(sn_port_t *port, SOCKET *a, SOCKET *b) {
    sn_registration_t regs[READY + 1];
    sn_notification_t notes[READY + 1];
    SOCKET x, xpeer;
    uint32_t got = 0;
    int i;

    for (i = 0; i < READY; i++) {
        make_nonblocking_pair(&a[i], &b[i]);
        send(b[i], "x", 1, 0);
        regs[i] = reg(a[i], 100 + (uint64_t)i, SN_EVENT_IN, SN_OP_ENABLE, PERSIST);
    }
    make_nonblocking_pair(&x, &xpeer);
    regs[READY] = reg(x, 1, SN_EVENT_IN, SN_OP_ENABLE, PERSIST);
    CHECK_EQ(sn_port_process(port, 0, regs, READY + 1, 0, notes, READY + 1, &got), 0);
    for (i = 0; i <= READY; i++)
        CHECK_EQ(regs[i].result, 0);
    /* A new key: a quiet REMOVE, and an ENABLE that waits for its event. */
    regs[0] = reg(x, 2, SN_EVENT_IN, SN_OP_ENABLE, PERSIST);
    CHECK_EQ(sn_port_process(port, 0, regs, 1, 0, notes, 0, &got), 0);
    CHECK_EQ(regs[0].result, 0);
    closesocket(x);
    closesocket(xpeer);
}

static void answer_teardown(sn_port_t *port, SOCKET *a, SOCKET *b) {
    int i;
    sn_port_close(port);
    sn_port_free(port);
    for (i = 0; i < READY; i++) {
        closesocket(a[i]);
        closesocket(b[i]);
    }
}

/* sn_port_process() with room for READY notifications: the deferred
   ENABLE's failure and READY readiness entries must not make READY + 1. */
static void test_process_answer_bounded(void) {
    sn_port_t *port = open_strict();
    SOCKET a[READY], b[READY];
    sn_notification_t notes[READY + GUARD];
    uint32_t got = 0, total = 0, i, err_seen = 0;
    int round;

    if (port == NULL)
        return;
    answer_setup(port, a, b);
    for (round = 0; round < 4; round++) {
        for (i = 0; i < READY + GUARD; i++) {
            notes[i].key = GUARD_KEY;
            notes[i].events = 0xdead;
        }
        CHECK_EQ(sn_port_process(port, 0, NULL, 0, 0, notes, READY, &got), 0);
        CHECK(got <= READY);
        for (i = READY; i < READY + GUARD; i++) {
            CHECK_EQ(notes[i].key, GUARD_KEY);
            CHECK_EQ(notes[i].events, 0xdead);
        }
        for (i = 0; i < got && i < READY; i++)
            if (notes[i].key == 2 && (notes[i].events & SN_EVENT_ERR))
                err_seen++;
        total += got;
    }
    /* The owner of the re-keyed socket hears of its failure, once. */
    CHECK_EQ(err_seen, 1);
    CHECK(total >= READY);
    answer_teardown(port, a, b);
}

/* sn_port_select() with room for READY pairs: the same, in words. */
static void test_select_answer_bounded(void) {
    sn_port_t *port = open_strict();
    SOCKET a[READY], b[READY];
    static sn_registration_t changes[4];
    uint64_t out[2 * READY + GUARD];
    uint32_t i, err_seen = 0;
    int round;
    int64_t answer;

    if (port == NULL)
        return;
    answer_setup(port, a, b);
    CHECK_EQ(sn_port_bind(port, changes, 4, out, 2 * READY), 0);
    for (round = 0; round < 4; round++) {
        uint64_t pairs;
        for (i = 0; i < 2 * READY + GUARD; i++)
            out[i] = GUARD_KEY;
        answer = sn_port_select(port, 0, 0.0);
        CHECK(answer >= 0);
        for (i = 2 * READY; i < 2 * READY + GUARD; i++)
            CHECK_EQ(out[i], GUARD_KEY);
        if (answer < 0 || (answer & 3) != 0)
            continue;   /* an error, or one pair in the answer itself */
        pairs = (uint64_t)answer >> 2 & 0xffffffffu;
        CHECK(pairs <= READY);
        for (i = 0; i < pairs && i < READY; i++)
            if (out[2 * i] == 2)
                err_seen++;
    }
    CHECK_EQ(err_seen, 1);
    answer_teardown(port, a, b);
}

/* ----------------------------------------------- the model's own ground */

/* Every key the entries of a 300 ms collection carry with `events`, as a
   bit mask of keys 1..31, from a bare function on `iocp`; the polyfill's
   packets among them translated as the port translates them. */
static uint32_t keys_heard(sn_process_socket_notifications_fn fn, HANDLE iocp,
                           UINT32 events) {
    OVERLAPPED_ENTRY entries[16];
    uint32_t heard = 0;
    DWORD start = GetTickCount();
    while (GetTickCount() - start < 300) {
        UINT32 got = 0, i;
        if (fn(iocp, 0, NULL, 50, 16, entries, &got) != ERROR_SUCCESS)
            continue;
        got = (UINT32)sn_afd_translate(iocp, entries, got);
        for (i = 0; i < got; i++)
            if (entries[i].lpCompletionKey < 32 &&
                (entries[i].dwNumberOfBytesTransferred & events))
                heard |= 1u << entries[i].lpCompletionKey;
    }
    return heard;
}

/* The model's registration of a socket and the polyfill's (what the port's
   fallback makes when the model refuses) are two, as the OS's and the
   polyfill's would be on Windows: each delivers under its own key. (They
   shared one AFD state: the second overwrote the first, and a port that
   kept both by mistake was never seen doing so.) */
static void test_model_registrations_apart_from_the_polyfill(void) {
    HANDLE iocp = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    SOCK_NOTIFY_REGISTRATION r;
    SOCKET a, b;
    uint32_t heard;
    make_nonblocking_pair(&a, &b);
    memset(&r, 0, sizeof r);
    r.socket = a;
    r.completionKey = (PVOID)1;
    r.eventFilter = SOCK_NOTIFY_REGISTER_EVENT_IN;
    r.operation = SOCK_NOTIFY_OP_ENABLE;
    r.triggerFlags = SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_PERSISTENT;
    CHECK_EQ(sn_model_process_socket_notifications(iocp, 1, &r, 0, 0, NULL, NULL), 0);
    CHECK_EQ(r.registrationResult, 0);
    r.completionKey = (PVOID)2;
    r.registrationResult = 0;
    CHECK_EQ(sn_afd_process_socket_notifications(iocp, 1, &r, 0, 0, NULL, NULL), 0);
    CHECK_EQ(r.registrationResult, 0);
    send(b, "x", 1, 0);
    /* The model's wait hands the polyfill's packets on untranslated (they
       are not its own), as the OS's would: the port translates them. */
    heard = keys_heard(sn_model_process_socket_notifications, iocp, SOCK_NOTIFY_EVENT_IN);
    CHECK_EQ(heard, (1u << 1) | (1u << 2));
    sn_model_port_closed(iocp);
    sn_afd_port_closed(iocp);
    CloseHandle(iocp);
    closesocket(a);
    closesocket(b);
}

/* The reference page's argument rules, in the polyfill and the model
   alike: "If registrationCount is 0, this parameter must be NULL", and
   the registrations and the entries are two buffers that do not overlap. */
static void test_argument_rules(void) {
    HANDLE iocp = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    union {
        SOCK_NOTIFY_REGISTRATION regs[4];
        OVERLAPPED_ENTRY entries[4];
    } shared;
    SOCK_NOTIFY_REGISTRATION one;
    OVERLAPPED_ENTRY entries[4];
    UINT32 got = 0;
    sn_process_socket_notifications_fn fns[2] = {
        sn_afd_process_socket_notifications, sn_model_process_socket_notifications,
    };
    int i;
    memset(&shared, 0, sizeof shared);
    memset(&one, 0, sizeof one);
    for (i = 0; i < 2; i++) {
        CHECK_EQ(fns[i](iocp, 0, &one, 0, 4, entries, &got), ERROR_INVALID_PARAMETER);
        CHECK_EQ(fns[i](iocp, 2, shared.regs, 0, 2, shared.entries, &got),
                 ERROR_INVALID_PARAMETER);
        CHECK_EQ(fns[i](iocp, 1, &shared.regs[2], 0, 2, shared.entries, &got),
                 ERROR_INVALID_PARAMETER);
        /* Apart, they are fine (an OP_NONE, and a poll). */
        CHECK(fns[i](iocp, 1, &one, 0, 4, entries, &got) == WAIT_TIMEOUT);
    }
    sn_model_port_closed(iocp);
    sn_afd_port_closed(iocp);
    CloseHandle(iocp);
}

int main(void) {
    WSADATA wsa;
    char why[200];
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) {
        fprintf(stderr, "WSAStartup failed\n");
        return 2;
    }
    if (!sn_backend_available(SN_BACKEND_STRICT, why, sizeof why)) {
        printf("strict backend unavailable: %s\n", why);
        return 0;
    }
    setup_listener(64);
    RUN(test_process_answer_bounded);
    RUN(test_select_answer_bounded);
    RUN(test_model_registrations_apart_from_the_polyfill);
    RUN(test_argument_rules);
    closesocket(listener);
    WSACleanup();
    printf("%d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
