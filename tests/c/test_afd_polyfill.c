/*
 * test_afd_polyfill.c -- the IOCTL_AFD_POLL polyfill of
 * ProcessSocketNotifications, driven directly, on loopback sockets.
 *
 * Runs on Windows and under Wine (tests/c/run_wine.sh builds it with
 * mingw-w64). Each test states the PSN behaviour it checks; the last ones go
 * through the sn_afd_ops vtable the port layer uses, so the translation in
 * sn_iocp.c is exercised too. The psn backend itself can only be
 * compile-checked here (Wine 8 lacks the function); when the OS has it, the
 * vtable test also runs against sn_psn_ops.
 *
 * Exit status: 0 when every check passed.
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

#include "check.h"
#include "win_sockets.h"

/* The polyfill asserts its poll-state transitions (sn_afd_sock.c); this
   test is where a wrong one must abort, so it is built with them on. */
#ifdef NDEBUG
#  error "build the AFD polyfill test without NDEBUG: its asserts are part of the test"
#endif

#define ONESHOT (SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_LEVEL)
#define PERSIST (SOCK_NOTIFY_TRIGGER_PERSISTENT | SOCK_NOTIFY_TRIGGER_LEVEL)
#define EV_IN   SOCK_NOTIFY_EVENT_IN
#define EV_OUT  SOCK_NOTIFY_EVENT_OUT
#define HUP     SOCK_NOTIFY_EVENT_HANGUP
#define ERR     SOCK_NOTIFY_EVENT_ERR
#define REMOVE  SOCK_NOTIFY_EVENT_REMOVE

/* ------------------------------------------------------------- plumbing */

static SOCK_NOTIFY_REGISTRATION reg(SOCKET s, ULONG_PTR key, UINT16 filter, UINT8 op,
                                    UINT8 trigger) {
    SOCK_NOTIFY_REGISTRATION r;
    memset(&r, 0, sizeof r);
    r.socket = s;
    r.completionKey = (PVOID)key;
    r.eventFilter = filter;
    r.operation = op;
    r.triggerFlags = trigger;
    r.registrationResult = 0xdeadbeef;
    return r;
}

/* Apply registrations only (no wait), PSN style. Returns the first result. */
static DWORD apply(HANDLE port, SOCK_NOTIFY_REGISTRATION *regs, UINT32 n) {
    DWORD rc = sn_afd_process_socket_notifications(port, n, regs, 0, 0, NULL, NULL);
    CHECK_EQ(rc, ERROR_SUCCESS);
    return regs[0].registrationResult;
}

static DWORD apply1(HANDLE port, SOCKET s, ULONG_PTR key, UINT16 filter, UINT8 op,
                    UINT8 trigger) {
    SOCK_NOTIFY_REGISTRATION r = reg(s, key, filter, op, trigger);
    return apply(port, &r, 1);
}

static DWORD enable1(HANDLE port, SOCKET s, ULONG_PTR key, UINT16 filter, UINT8 trigger) {
    return apply1(port, s, key, filter, SOCK_NOTIFY_OP_ENABLE, trigger);
}

/* Wait; returns the number of entries (0 on timeout). */
static UINT32 wait_entries(HANDLE port, UINT32 timeout, OVERLAPPED_ENTRY *out, ULONG max) {
    UINT32 got = 0xffffffff;
    DWORD rc = sn_afd_process_socket_notifications(port, 0, NULL, timeout, max, out, &got);
    if (rc == WAIT_TIMEOUT) {
        CHECK_EQ(got, 0);
        return 0;
    }
    CHECK_EQ(rc, ERROR_SUCCESS);
    return rc == ERROR_SUCCESS ? got : 0;
}

/* Wait for exactly one notification and return its events (0 on none). */
static UINT32 wait_one(HANDLE port, UINT32 timeout, ULONG_PTR expect_key) {
    OVERLAPPED_ENTRY e[4];
    UINT32 got = wait_entries(port, timeout, e, 4);
    if (got != 1) {
        fprintf(stderr, "  expected 1 entry, got %u\n", got);
        CHECK_EQ(got, 1);
        return 0;
    }
    CHECK_EQ(e[0].lpCompletionKey, expect_key);
    CHECK(e[0].lpOverlapped == NULL);
    return e[0].dwNumberOfBytesTransferred;
}

static void expect_nothing(HANDLE port, UINT32 timeout) {
    OVERLAPPED_ENTRY e[4];
    UINT32 got = wait_entries(port, timeout, e, 4);
    if (got != 0)
        fprintf(stderr, "  unexpected: key=%llu events=0x%lx\n",
                (unsigned long long)e[0].lpCompletionKey, e[0].dwNumberOfBytesTransferred);
    CHECK_EQ(got, 0);
}

static HANDLE port_open(void) {
    HANDLE port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    if (port == NULL) {
        fprintf(stderr, "CreateIoCompletionPort: %lu\n", GetLastError());
        exit(2);
    }
    return port;
}

static void port_close(HANDLE port) {
    sn_afd_port_closed(port);
    CloseHandle(port);
}

/* The polyfill's own count of registrations and kernel-owned polls. */
static void expect_stats_at(int line, HANDLE port, UINT32 registered, UINT32 polls) {
    UINT32 r = 0xffffffff, p = 0xffffffff;
    int before = failures;
    CHECK_EQ(sn_afd_statistics(port, &r, &p), 0);
    CHECK_EQ(r, registered);
    CHECK_EQ(p, polls);
    if (failures != before)
        fprintf(stderr, "  (expect_stats at line %d)\n", line);
}
#define expect_stats(port, registered, polls) \
    expect_stats_at(__LINE__, port, registered, polls)

static void drain(SOCKET s) {
    char buf[4096];
    while (recv(s, buf, sizeof buf, 0) > 0) {
    }
}

/* ---------------------------------------------------------------- tests */

/* LEVEL|ONESHOT: one delivery, then disarmed; a re-ENABLE on a socket that
   is still readable fires again (level); after draining it does not. */
static void test_oneshot_level(void) {
    HANDLE port = port_open();
    SOCKET a, b;
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 1, EV_IN, ONESHOT), 0);
    expect_nothing(port, 50);
    CHECK_EQ(send(b, "x", 1, 0), 1);
    CHECK_EQ(wait_one(port, 2000, 1), EV_IN);
    expect_nothing(port, 100);                       /* disarmed */
    CHECK_EQ(enable1(port, a, 1, EV_IN, ONESHOT), 0);    /* re-arm, not drained */
    CHECK_EQ(wait_one(port, 2000, 1), EV_IN);
    drain(a);
    CHECK_EQ(enable1(port, a, 1, EV_IN, ONESHOT), 0);
    expect_nothing(port, 100);
    closesocket(a);
    closesocket(b);
    port_close(port);
}

/* The first scenario of Microsoft's article: LEVEL only means persistent. Each wait reports
   the level again until it is drained; the peer's close is EV_IN|HANGUP. */
static void test_persistent_level(void) {
    HANDLE port = port_open();
    SOCKET a, b;
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 2, EV_IN | HUP, SOCK_NOTIFY_TRIGGER_LEVEL), 0);
    expect_nothing(port, 50);
    CHECK_EQ(send(b, "xy", 2, 0), 2);
    CHECK_EQ(wait_one(port, 2000, 2), EV_IN);
    CHECK_EQ(wait_one(port, 2000, 2), EV_IN);           /* still readable */
    drain(a);
    expect_nothing(port, 100);
    closesocket(b);
    CHECK_EQ(wait_one(port, 2000, 2), EV_IN | HUP);
    CHECK_EQ(apply1(port, a, 2, 0, SOCK_NOTIFY_OP_REMOVE, 0), 0);
    CHECK_EQ(wait_one(port, 2000, 2), REMOVE);
    closesocket(a);
    port_close(port);
}

/* EV_OUT fires at once on a connected socket; growing the filter while a poll
   is in flight (EV_IN only, nothing to read) takes effect at once. */
static void test_out_and_interest_change(void) {
    HANDLE port = port_open();
    SOCKET a, b;
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 3, EV_OUT, ONESHOT), 0);
    CHECK_EQ(wait_one(port, 2000, 3), EV_OUT);
    CHECK_EQ(enable1(port, a, 3, EV_IN, ONESHOT), 0);
    expect_nothing(port, 50);                        /* EV_IN poll in flight */
    CHECK_EQ(enable1(port, a, 3, EV_IN | EV_OUT, ONESHOT), 0);
    CHECK_EQ(wait_one(port, 2000, 3), EV_OUT);          /* cancelled, resubmitted */
    /* The same with a zero timeout: the cancellation and the replacement
       poll are both finished inside the one call, as PSN reports a
       writable socket at once. */
    CHECK_EQ(enable1(port, a, 3, EV_IN, ONESHOT), 0);
    expect_nothing(port, 30);
    {
        SOCK_NOTIFY_REGISTRATION r = reg(a, 3, EV_OUT, SOCK_NOTIFY_OP_ENABLE, ONESHOT);
        OVERLAPPED_ENTRY e[4];
        UINT32 got = 0;
        CHECK_EQ(sn_afd_process_socket_notifications(port, 1, &r, 0, 4, e, &got), 0);
        CHECK_EQ(r.registrationResult, 0);
        CHECK_EQ(got, 1);
        CHECK_EQ(e[0].lpCompletionKey, 3);
        CHECK_EQ(e[0].dwNumberOfBytesTransferred, EV_OUT);
    }
    closesocket(a);
    closesocket(b);
    port_close(port);
}

/* OP_REMOVE: exactly one REMOVE, whether a poll was in flight (it comes
   after the cancellation) or not (one-shot already delivered); a second
   REMOVE fails; DISABLE of an unknown socket fails. */
static void test_remove(void) {
    HANDLE port = port_open();
    OVERLAPPED_ENTRY e[8];
    SOCKET a, b;
    make_pair(&a, &b);

    /* Poll in flight. */
    CHECK_EQ(enable1(port, a, 4, EV_IN, ONESHOT), 0);
    expect_nothing(port, 30);
    CHECK_EQ(apply1(port, a, 4, 0, SOCK_NOTIFY_OP_REMOVE, 0), 0);
    CHECK_EQ(wait_one(port, 2000, 4), REMOVE);
    expect_nothing(port, 50);
    CHECK_EQ(apply1(port, a, 4, 0, SOCK_NOTIFY_OP_REMOVE, 0), ERROR_NOT_FOUND);
    CHECK_EQ(apply1(port, a, 4, 0, SOCK_NOTIFY_OP_DISABLE, 0), ERROR_NOT_FOUND);

    /* Idle (one-shot delivered): the REMOVE is queued as a packet. */
    CHECK_EQ(enable1(port, a, 5, EV_OUT, ONESHOT), 0);
    CHECK_EQ(wait_one(port, 2000, 5), EV_OUT);
    CHECK_EQ(apply1(port, a, 5, 0, SOCK_NOTIFY_OP_REMOVE, 0), 0);
    CHECK_EQ(wait_one(port, 2000, 5), REMOVE);
    expect_nothing(port, 50);

    /* ENABLE and REMOVE in one batch, then the wait in the same call. */
    {
        SOCK_NOTIFY_REGISTRATION r[2];
        UINT32 got = 0;
        DWORD rc;
        r[0] = reg(a, 6, EV_IN, SOCK_NOTIFY_OP_ENABLE, ONESHOT);
        r[1] = reg(a, 6, 0, SOCK_NOTIFY_OP_REMOVE, 0);
        rc = sn_afd_process_socket_notifications(port, 2, r, 2000, 8, e, &got);
        CHECK_EQ(rc, ERROR_SUCCESS);
        CHECK_EQ(r[0].registrationResult, 0);
        CHECK_EQ(r[1].registrationResult, 0);
        CHECK_EQ(got, 1);
        CHECK_EQ(e[0].lpCompletionKey, 6);
        CHECK_EQ(e[0].dwNumberOfBytesTransferred, REMOVE);
    }
    expect_stats(port, 0, 0);
    closesocket(a);
    closesocket(b);
    port_close(port);
}

/* DISABLE silences a registration; ENABLE brings it back. */
static void test_disable(void) {
    HANDLE port = port_open();
    SOCKET a, b;
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 7, EV_IN, PERSIST), 0);
    CHECK_EQ(apply1(port, a, 7, EV_IN, SOCK_NOTIFY_OP_DISABLE, 0), 0);
    CHECK_EQ(send(b, "x", 1, 0), 1);
    expect_nothing(port, 100);
    CHECK_EQ(apply1(port, a, 7, EV_IN, SOCK_NOTIFY_OP_ENABLE, PERSIST), 0);
    CHECK_EQ(wait_one(port, 2000, 7), EV_IN);
    closesocket(a);
    closesocket(b);
    port_close(port);
}

/* Argument checks, per registration, without failing the call. */
static void test_invalid(void) {
    HANDLE port = port_open();
    SOCK_NOTIFY_REGISTRATION r[8];
    SOCKET a, b;
    make_pair(&a, &b);
    /* ENABLE needs LEVEL or EDGE: ONESHOT or PERSISTENT alone is invalid. */
    r[6] = reg(a, 8, EV_IN, SOCK_NOTIFY_OP_ENABLE, SOCK_NOTIFY_TRIGGER_ONESHOT);
    r[7] = reg(a, 8, EV_IN, SOCK_NOTIFY_OP_ENABLE, SOCK_NOTIFY_TRIGGER_PERSISTENT);
    CHECK_EQ(sn_afd_process_socket_notifications(port, 2, r + 6, 0, 0, NULL, NULL), 0);
    CHECK_EQ(r[6].registrationResult, ERROR_INVALID_PARAMETER);
    CHECK_EQ(r[7].registrationResult, ERROR_INVALID_PARAMETER);
    r[0] = reg(a, 8, EV_IN, SOCK_NOTIFY_OP_ENABLE, SOCK_NOTIFY_TRIGGER_EDGE);
    r[1] = reg(a, 8, EV_IN, SOCK_NOTIFY_OP_ENABLE,
               SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_PERSISTENT);
    r[2] = reg(a, 8, EV_IN, SOCK_NOTIFY_OP_ENABLE,
               SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE);
    r[3] = reg(a, 8, 0x100, SOCK_NOTIFY_OP_ENABLE, ONESHOT);
    r[4] = reg(a, 8, EV_IN, 3, ONESHOT);
    r[5] = reg(INVALID_SOCKET, 9, EV_IN, SOCK_NOTIFY_OP_ENABLE, ONESHOT);
    CHECK_EQ(sn_afd_process_socket_notifications(port, 6, r, 0, 0, NULL, NULL), 0);
    CHECK_EQ(r[0].registrationResult, ERROR_NOT_SUPPORTED);
    CHECK_EQ(r[1].registrationResult, ERROR_INVALID_PARAMETER);
    CHECK_EQ(r[2].registrationResult, ERROR_INVALID_PARAMETER);
    CHECK_EQ(r[3].registrationResult, ERROR_INVALID_PARAMETER);
    CHECK_EQ(r[4].registrationResult, ERROR_INVALID_PARAMETER);
    CHECK_EQ(r[5].registrationResult, WSAENOTSOCK);
    /* PSN's argument rules. */
    {
        OVERLAPPED_ENTRY e[1];
        UINT32 got;
        CHECK_EQ(sn_afd_process_socket_notifications(port, 0, NULL, 10, 0, NULL, NULL),
                 ERROR_INVALID_PARAMETER);
        CHECK_EQ(sn_afd_process_socket_notifications(port, 1, NULL, 0, 0, NULL, NULL),
                 ERROR_INVALID_PARAMETER);
        CHECK_EQ(sn_afd_process_socket_notifications(port, 0, NULL, 0, 1, e, NULL),
                 ERROR_INVALID_PARAMETER);
        CHECK_EQ(sn_afd_process_socket_notifications(port, 0, NULL, 0, 1, e, &got),
                 WAIT_TIMEOUT);
    }
    expect_nothing(port, 30);
    closesocket(a);
    closesocket(b);
    port_close(port);
}

/* closesocket() of a registered socket: no REMOVE, no notification; a
   REMOVE afterwards fails. The handle value may be reused at once by a new
   socket, whose registration must work. */
static void test_closesocket_and_reuse(void) {
    HANDLE port = port_open();
    SOCKET a, b, a2, b2;
    SOCKET old;
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 10, EV_IN, PERSIST), 0);
    expect_nothing(port, 30);                        /* poll in flight */
    expect_stats(port, 1, 1);
    old = a;
    closesocket(a);
    expect_nothing(port, 150);                       /* LOCAL_CLOSE: silent */
    expect_stats(port, 0, 0);                        /* ... and dropped */
    CHECK(apply1(port, old, 10, 0, SOCK_NOTIFY_OP_REMOVE, 0) != 0);
    closesocket(b);

    /* Closed while idle (one-shot delivered), then REMOVE: fails. */
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 11, EV_OUT, ONESHOT), 0);
    CHECK_EQ(wait_one(port, 2000, 11), EV_OUT);
    old = a;
    closesocket(a);
    CHECK(apply1(port, old, 11, 0, SOCK_NOTIFY_OP_REMOVE, 0) != 0);
    expect_nothing(port, 50);
    closesocket(b);

    /* Reuse: a new socket (perhaps with the same value) and a new key. */
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 12, EV_IN, PERSIST), 0);
    expect_nothing(port, 30);
    old = a;
    closesocket(a);
    make_pair(&a2, &b2);
    printf("[handle %s] ", a2 == old ? "reused" : "not reused");
    CHECK_EQ(enable1(port, a2, 13, EV_IN, ONESHOT), 0);
    CHECK_EQ(send(b2, "x", 1, 0), 1);
    CHECK_EQ(wait_one(port, 2000, 13), EV_IN);
    expect_nothing(port, 50);
    closesocket(a2);
    closesocket(b2);
    closesocket(b);
    expect_nothing(port, 100);
    /* a2 was closed while its one-shot was disarmed (no poll in flight):
       nothing tells the polyfill, so its state stays until the value is
       registered again or removed (a REMOVE then fails, as above). */
    expect_stats(port, 1, 0);

    /* Reuse under the SAME key, re-enabled before the old socket's
       LOCAL_CLOSE was dequeued: the close belongs to the old socket, the
       registration carries on with the new one. */
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 18, EV_IN, PERSIST), 0);
    expect_nothing(port, 30);
    old = a;
    closesocket(a);
    make_pair(&a2, &b2);
    printf("[handle %s] ", a2 == old ? "reused" : "not reused");
    CHECK_EQ(enable1(port, a2, 18, EV_IN, PERSIST), 0);
    expect_nothing(port, 100);
    CHECK_EQ(send(b2, "x", 1, 0), 1);
    CHECK_EQ(wait_one(port, 2000, 18), EV_IN);
    CHECK_EQ(apply1(port, a2, 18, 0, SOCK_NOTIFY_OP_REMOVE, 0), 0);
    CHECK_EQ(wait_one(port, 2000, 18), REMOVE);
    expect_stats(port, 0, 0);
    closesocket(a2);
    closesocket(b2);
    closesocket(b);
    port_close(port);
}

/* Packets posted by anyone pass through unchanged. */
static void test_post_passthrough(void) {
    HANDLE port = port_open();
    OVERLAPPED_ENTRY e[4];
    UINT32 got;
    CHECK(PostQueuedCompletionStatus(port, 77, 0x1234, (LPOVERLAPPED)(ULONG_PTR)0x5678));
    CHECK(PostQueuedCompletionStatus(port, 0, SN_POST_COMPLETION_KEY, (LPOVERLAPPED)42));
    got = wait_entries(port, 1000, e, 4);
    CHECK_EQ(got, 2);
    CHECK_EQ(e[0].lpCompletionKey, 0x1234);
    CHECK_EQ(e[0].dwNumberOfBytesTransferred, 77);
    CHECK_EQ((ULONG_PTR)e[0].lpOverlapped, 0x5678);
    CHECK_EQ(e[1].lpCompletionKey, SN_POST_COMPLETION_KEY);
    CHECK_EQ((ULONG_PTR)e[1].lpOverlapped, 42);
    port_close(port);
}

/* A listening socket is readable when a connection waits to be accepted. */
static void test_accept(void) {
    HANDLE port = port_open();
    SOCKET l = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP), c, s;
    struct sockaddr_in addr;
    int len = sizeof addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(l, (struct sockaddr *)&addr, sizeof addr) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&addr, &len) == 0);
    CHECK(listen(l, 8) == 0);
    CHECK_EQ(enable1(port, l, 14, EV_IN, ONESHOT), 0);
    expect_nothing(port, 30);
    c = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    CHECK(connect(c, (struct sockaddr *)&addr, sizeof addr) == 0);
    CHECK_EQ(wait_one(port, 2000, 14), EV_IN);
    s = accept(l, NULL, NULL);
    CHECK(s != INVALID_SOCKET);
    closesocket(s);
    closesocket(c);
    closesocket(l);
    port_close(port);
}

/* A refused non-blocking connect reports ERR, whatever the filter. */
static void test_connect_fail(void) {
    HANDLE port = port_open();
    SOCKET l = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP), c;
    struct sockaddr_in addr;
    int len = sizeof addr, rc;
    UINT32 ev;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* A port nobody listens on: bind, read the number, close. */
    bind(l, (struct sockaddr *)&addr, sizeof addr);
    getsockname(l, (struct sockaddr *)&addr, &len);
    closesocket(l);
    c = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    set_nonblocking(c);
    rc = connect(c, (struct sockaddr *)&addr, sizeof addr);
    CHECK(rc == SOCKET_ERROR && WSAGetLastError() == WSAEWOULDBLOCK);
    CHECK_EQ(enable1(port, c, 15, EV_OUT, ONESHOT), 0);
    ev = wait_one(port, 5000, 15);
    printf("[events 0x%x] ", ev);
    CHECK(ev & ERR);
    CHECK(!(ev & EV_OUT));
    closesocket(c);
    port_close(port);
}

/* The timeout is honoured when only internal packets arrive (here: the
   cancellation of an interest change) -- no early, spurious return. */
static void test_timeout_resumes(void) {
    HANDLE port = port_open();
    SOCKET a, b;
    ULONGLONG t0, dt;
    make_pair(&a, &b);
    CHECK_EQ(enable1(port, a, 16, EV_IN, PERSIST), 0);
    expect_nothing(port, 30);
    CHECK_EQ(enable1(port, a, 16, EV_IN | HUP, PERSIST), 0); /* cancel + resubmit */
    t0 = GetTickCount64();
    expect_nothing(port, 300);
    dt = GetTickCount64() - t0;
    printf("[waited %llu ms] ", dt);
    CHECK(dt >= 250);
    closesocket(a);
    closesocket(b);
    port_close(port);
}

/* Many sockets: more than several helper groups; every one delivers once,
   every one is removed once. */
#define MANY 300
static void test_many(void) {
    HANDLE port = port_open();
    static SOCKET a[MANY], b[MANY];
    static SOCK_NOTIFY_REGISTRATION r[MANY];
    static OVERLAPPED_ENTRY e[64];
    static int seen[MANY];
    int i, total = 0, removed = 0;
    ULONGLONG deadline;

    for (i = 0; i < MANY; i++) {
        make_pair(&a[i], &b[i]);
        r[i] = reg(a[i], 1000 + i, EV_IN, SOCK_NOTIFY_OP_ENABLE, ONESHOT);
    }
    CHECK_EQ(sn_afd_process_socket_notifications(port, MANY, r, 0, 0, NULL, NULL), 0);
    for (i = 0; i < MANY; i++)
        CHECK_EQ(r[i].registrationResult, 0);
    expect_nothing(port, 50);
    for (i = 0; i < MANY; i++)
        send(b[i], "x", 1, 0);
    deadline = GetTickCount64() + 10000;
    while (total < MANY && GetTickCount64() < deadline) {
        UINT32 got = wait_entries(port, 1000, e, 64), j;
        for (j = 0; j < got; j++) {
            int k = (int)(e[j].lpCompletionKey - 1000);
            CHECK(k >= 0 && k < MANY);
            CHECK_EQ(e[j].dwNumberOfBytesTransferred, EV_IN);
            if (k >= 0 && k < MANY) {
                CHECK_EQ(seen[k], 0);
                seen[k]++;
            }
            total++;
        }
    }
    CHECK_EQ(total, MANY);
    expect_nothing(port, 50);
    for (i = 0; i < MANY; i++)
        r[i] = reg(a[i], 1000 + i, 0, SOCK_NOTIFY_OP_REMOVE, 0);
    /* Half of them armed again first, so REMOVE meets both idle states and
       polls in flight. */
    for (i = 0; i < MANY; i += 2) {
        drain(a[i]);
        CHECK_EQ(enable1(port, a[i], 1000 + i, EV_IN, ONESHOT), 0);
    }
    CHECK_EQ(sn_afd_process_socket_notifications(port, MANY, r, 0, 0, NULL, NULL), 0);
    deadline = GetTickCount64() + 10000;
    while (removed < MANY && GetTickCount64() < deadline) {
        UINT32 got = wait_entries(port, 1000, e, 64), j;
        for (j = 0; j < got; j++) {
            int k = (int)(e[j].lpCompletionKey - 1000);
            CHECK_EQ(e[j].dwNumberOfBytesTransferred, REMOVE);
            if (k >= 0 && k < MANY) {
                CHECK_EQ(seen[k], 1);
                seen[k]++;
            }
            removed++;
        }
    }
    CHECK_EQ(removed, MANY);
    expect_nothing(port, 50);
    expect_stats(port, 0, 0);
    for (i = 0; i < MANY; i++) {
        closesocket(a[i]);
        closesocket(b[i]);
    }
    port_close(port);
}

/* Several threads waiting on one port: a packet reaches exactly one. */
static HANDLE mt_port;
static volatile LONG mt_received;
static DWORD WINAPI mt_waiter(LPVOID arg) {
    OVERLAPPED_ENTRY e[4];
    UINT32 got = 0;
    (void)arg;
    if (sn_afd_process_socket_notifications(mt_port, 0, NULL, 3000, 1, e, &got) == 0)
        InterlockedAdd(&mt_received, (LONG)got);
    return 0;
}

static void test_threads(void) {
    HANDLE threads[3];
    SOCKET a, b;
    int i;
    mt_port = port_open();
    mt_received = 0;
    make_pair(&a, &b);
    for (i = 0; i < 3; i++)
        threads[i] = CreateThread(NULL, 0, mt_waiter, NULL, 0, NULL);
    Sleep(100);
    /* Registered from this thread while the others block in the wait. */
    CHECK_EQ(enable1(mt_port, a, 17, EV_IN, ONESHOT), 0);
    CHECK_EQ(send(b, "x", 1, 0), 1);
    CHECK(PostQueuedCompletionStatus(mt_port, 0, 99, NULL));
    WaitForMultipleObjects(3, threads, TRUE, 10000);
    for (i = 0; i < 3; i++)
        CloseHandle(threads[i]);
    /* The EV_IN (one-shot) and the post: two deliveries, to two threads. */
    CHECK_EQ(mt_received, 2);
    closesocket(a);
    closesocket(b);
    port_close(mt_port);
}

/* Closing a port with polls in flight: cancelled, drained, freed. */
static void test_close_with_polls(void) {
    HANDLE port = port_open();
    SOCKET a[5], b[5];
    int i;
    for (i = 0; i < 5; i++) {
        make_pair(&a[i], &b[i]);
        CHECK_EQ(enable1(port, a[i], 20 + i, EV_IN, PERSIST), 0);
    }
    expect_nothing(port, 30);
    port_close(port);
    for (i = 0; i < 5; i++) {
        closesocket(a[i]);
        closesocket(b[i]);
    }
}

/* The port layer's vtable: sn_registration_t in, sn_kevent_t out, posted
   packets told apart by the reserved key. */
static void vtable_round(const sn_backend_ops_t *ops) {
    sn_port_t port;
    sn_registration_t r;
    sn_kevent_t ev[8];
    uint32_t dropped = 0;
    uint32_t got = 0;
    SOCKET a, b;
    int64_t t0;

    memset(&port, 0, sizeof port);
    CHECK_EQ(ops->open(&port), 0);
    make_pair(&a, &b);
    memset(&r, 0, sizeof r);
    r.socket = (uint64_t)a;
    r.key = 0x7000000100000002ull;        /* a kernel key: generation + record number */
    r.events = SN_EVENT_IN;
    r.op = SN_OP_ENABLE;
    r.trigger = SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL;
    r.result = 12345;
    CHECK_EQ(ops->process(&port, &r, 1, 50, ev, 8, &got, &dropped), 0);
    CHECK_EQ(r.result, 0);
    CHECK_EQ(got, 0);
    CHECK_EQ(send(b, "x", 1, 0), 1);
    CHECK_EQ(ops->process(&port, NULL, 0, SN_INFINITE, ev, 8, &got, &dropped), 0);
    CHECK_EQ(got, 1);
    CHECK_EQ(ev[0].key, 0x7000000100000002ull);
    CHECK_EQ(ev[0].events, SN_EVENT_IN);
    CHECK_EQ(ev[0].posted, 0);
    CHECK_EQ(ops->post(&port, 0xFFFFFFFFFFFFFFF0ull), 0);
    CHECK_EQ(ops->process(&port, NULL, 0, 1000, ev, 8, &got, &dropped), 0);
    CHECK_EQ(got, 1);
    CHECK_EQ(ev[0].key, 0xFFFFFFFFFFFFFFF0ull);
    CHECK_EQ(ev[0].posted, 1);
    CHECK_EQ(ev[0].events, 0);
    r.op = SN_OP_REMOVE;
    r.events = 0;
    r.trigger = 0;
    CHECK_EQ(ops->process(&port, &r, 1, 1000, ev, 8, &got, &dropped), 0);
    CHECK_EQ(r.result, 0);
    CHECK_EQ(got, 1);
    CHECK_EQ(ev[0].events, SN_EVENT_REMOVE);
    CHECK_EQ(ev[0].key, 0x7000000100000002ull);
    /* Register-only call with no room for events, and a failed REMOVE. */
    CHECK_EQ(ops->process(&port, &r, 1, 1000, ev, 0, &got, &dropped), 0);
    CHECK_EQ(got, 0);
    CHECK(r.result != 0);
    /* A huge finite timeout stays finite (no hang): something is queued. */
    CHECK_EQ(ops->post(&port, 5), 0);
    t0 = sn_now_ms();
    CHECK_EQ(ops->process(&port, NULL, 0, (int64_t)1 << 40, ev, 8, &got, &dropped), 0);
    CHECK_EQ(got, 1);
    CHECK(sn_now_ms() - t0 < 1000);
    /* The timeout path: 0 returned, nothing received. */
    got = 99;
    CHECK_EQ(ops->process(&port, NULL, 0, 0, ev, 8, &got, &dropped), 0);
    CHECK_EQ(got, 0);
    closesocket(a);
    closesocket(b);
    ops->close(&port, 0);
    CHECK(port.impl == NULL);
}

static void test_vtable_afd(void) {
    CHECK(sn_afd_ops.id == SN_BACKEND_AFD);
    vtable_round(&sn_afd_ops);
}

static void test_vtable_psn(void) {
    sn_port_t port;
    memset(&port, 0, sizeof port);
    const char *why;
    if (!sn_psn_ops.available(&why)) {
        printf("[ProcessSocketNotifications absent: open refused] ");
        CHECK_EQ(sn_psn_ops.open(&port), ERROR_NOT_SUPPORTED);
        return;
    }
    printf("[ProcessSocketNotifications present] ");
    vtable_round(&sn_psn_ops);
}

int main(void) {
    WSADATA wsa;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) {
        fprintf(stderr, "WSAStartup failed\n");
        return 2;
    }
    setup_listener(512);
    RUN(test_oneshot_level);
    RUN(test_persistent_level);
    RUN(test_out_and_interest_change);
    RUN(test_remove);
    RUN(test_disable);
    RUN(test_invalid);
    RUN(test_closesocket_and_reuse);
    RUN(test_post_passthrough);
    RUN(test_accept);
    RUN(test_connect_fail);
    RUN(test_timeout_resumes);
    RUN(test_many);
    RUN(test_threads);
    RUN(test_close_with_polls);
    RUN(test_vtable_afd);
    RUN(test_vtable_psn);
    closesocket(listener);
    WSACleanup();
    printf("%d checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
