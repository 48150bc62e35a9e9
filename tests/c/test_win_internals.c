/*
 * test_win_internals.c -- two pieces of the Windows core that no socket
 * test can reach from outside, checked through seams:
 *
 *   1. The AFD polyfill's base-socket lookup (sn_afd_ws.c) under a layered
 *      service provider. No LSP can be installed under Wine or on a CI
 *      runner, so the provider's answers to SIO_BASE_HANDLE and
 *      SIO_BSP_HANDLE_POLL/_SELECT are played through the lookup's query
 *      seam (sn_afd_ws_query): an LSP that intercepts SIO_BASE_HANDLE and
 *      answers SIO_BSP_HANDLE_POLL with its own socket must not be taken
 *      for the base; a BSP answer naming another socket is one layer down,
 *      where SIO_BASE_HANDLE is asked again.
 *   2. The port's memory traffic per wait (sn_iocp_buf.c): a wait with room for
 *      more than 128 completion entries must not allocate once the port
 *      has served one, on one thread or several. Counted by wrapping the
 *      C allocator at link time (tests/c/run_wine.sh links this program
 *      with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc), so the core
 *      is compiled exactly as it ships; the wrapper can also refuse
 *      memory, for the out-of-memory path.
 *
 *   3. What OP_REMOVE asks of the caller's socket: nothing (counted through
 *      both Winsock seams, sn_afd_ws_query and sn_afd_ws_check_socket). A
 *      REMOVE is applied by the selecting thread just as the application
 *      closes the socket in its own (unregister, then close: asyncio's
 *      order), and under Wine 8.0 an ioctl on a socket that another
 *      thread closes meanwhile is a use-after-free in the wineserver
 *      (see sn_afd.c, afd__remove), which kills it. A REMOVE of a closed
 *      socket must still fail.
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
#include "sn_afd_ws.h"

#ifndef SN_TESTING
#  error "build this test with -DSN_TESTING: it drives the strict model of a test build"
#endif

#include "check.h"
#include "win_sockets.h"

/* ------------------------------------------------------- the allocator */

void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);

static volatile LONG allocations;   /* every malloc/calloc/realloc */
static volatile LONG refuse_memory; /* nonzero: every allocation fails */
/* >= 0: that many more allocations succeed, then every one fails (memory
   running out part way through a call); -1: no limit. */
static volatile LONG allow_more = -1;
/* Blocks the core holds: allocated through the wrappers, not yet freed.
   The core frees only what it allocated (nothing of a Windows API goes to
   free()), so after a port is freed this is back where it started. */
static volatile LONG live;

static int memory_refused(void) {
    if (refuse_memory)
        return 1;
    if (allow_more < 0)
        return 0;
    if (InterlockedDecrement(&allow_more) < 0) {
        allow_more = 0;    /* stays at "none left" until the test resets it */
        return 1;
    }
    return 0;
}

static void *counted(void *p) {
    if (p != NULL)
        InterlockedIncrement(&live);
    return p;
}

void *__wrap_malloc(size_t size) {
    InterlockedIncrement(&allocations);
    return memory_refused() ? NULL : counted(__real_malloc(size));
}

void *__wrap_calloc(size_t count, size_t size) {
    InterlockedIncrement(&allocations);
    return memory_refused() ? NULL : counted(__real_calloc(count, size));
}

void *__wrap_realloc(void *p, size_t size) {
    void *q;
    InterlockedIncrement(&allocations);
    if (memory_refused())
        return NULL;
    q = __real_realloc(p, size);
    if (p == NULL)
        counted(q);    /* realloc(NULL, n) is a malloc; a move keeps the count */
    return q;
}

void __wrap_free(void *p) {
    if (p != NULL)
        InterlockedDecrement(&live);
    __real_free(p);
}

/* ---------------------------------------------- a played layered provider */

/* One socket value as a provider would answer for it: per ioctl, an error
   (0 = success) and the socket named. */
typedef struct fake_answer {
    DWORD error;
    SOCKET socket;
} fake_answer_t;

typedef struct fake_socket {
    SOCKET socket;
    fake_answer_t base, bsp_poll, bsp_select;
} fake_socket_t;

#define FAKE_MAX 8
static fake_socket_t fakes[FAKE_MAX];
static int fake_count;
static int fake_queries;
static sn_afd_ws_query_fn real_query;

static void fake_reset(void) {
    memset(fakes, 0, sizeof fakes);
    fake_count = 0;
    fake_queries = 0;
}

static void fake_add(SOCKET s, fake_answer_t base, fake_answer_t poll, fake_answer_t select) {
    fakes[fake_count].socket = s;
    fakes[fake_count].base = base;
    fakes[fake_count].bsp_poll = poll;
    fakes[fake_count].bsp_select = select;
    fake_count++;
}

static fake_answer_t ok(SOCKET s) { fake_answer_t a = {0, s}; return a; }
static fake_answer_t fails(DWORD e) { fake_answer_t a = {e, INVALID_SOCKET}; return a; }

/* Sockets the table does not list get the real Winsock's answers. */
static DWORD fake_query(SOCKET socket, DWORD ioctl, SOCKET *answer) {
    int i;
    fake_queries++;
    for (i = 0; i < fake_count; i++) {
        const fake_answer_t *a;
        if (fakes[i].socket != socket)
            continue;
        a = ioctl == SIO_BASE_HANDLE ? &fakes[i].base
          : ioctl == SIO_BSP_HANDLE_POLL ? &fakes[i].bsp_poll
          : &fakes[i].bsp_select;
        if (a->error == 0)
            *answer = a->socket;
        return a->error;
    }
    return real_query(socket, ioctl, answer);
}

static DWORD lookup(SOCKET s, SOCKET *base) {
    DWORD error;
    *base = INVALID_SOCKET;
    sn_afd_ws_query = fake_query;
    error = sn_afd_ws_base_socket(s, base);
    sn_afd_ws_query = real_query;
    return error;
}

/* Values no real socket has here (handles are multiples of 4 and small). */
#define LSP1  ((SOCKET)0x7ff00010)
#define LSP2  ((SOCKET)0x7ff00020)
#define BASE  ((SOCKET)0x7ff00030)

static void test_base_plain(void) {
    SOCKET base;
    fake_reset();
    fake_add(LSP1, ok(BASE), ok(LSP1), ok(LSP1));
    CHECK_EQ(lookup(LSP1, &base), 0);
    CHECK_EQ(base, BASE);
    /* The documented answer is taken as it is: no further question. */
    CHECK_EQ(fake_queries, 1);
}

/* An LSP that intercepts SIO_BASE_HANDLE and answers SIO_BSP_HANDLE_POLL
   with its own socket (so that WSAPoll goes through it), while
   SIO_BSP_HANDLE_SELECT names the next socket down. */
static void test_base_lsp_answers_itself(void) {
    SOCKET base;
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), ok(LSP1), ok(BASE));
    fake_add(BASE, ok(BASE), ok(BASE), ok(BASE));
    CHECK_EQ(lookup(LSP1, &base), 0);
    CHECK_EQ(base, BASE);
}

/* Two layers: the first BSP answer is only one layer down; SIO_BASE_HANDLE
   must be asked again there (the second layer intercepts it too). */
static void test_base_two_layers(void) {
    SOCKET base;
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), ok(LSP2), ok(LSP2));
    fake_add(LSP2, fails(WSAEINVAL), ok(LSP2), ok(BASE));
    fake_add(BASE, ok(BASE), ok(BASE), ok(BASE));
    CHECK_EQ(lookup(LSP1, &base), 0);
    CHECK_EQ(base, BASE);
    /* The lower layer lets SIO_BASE_HANDLE through: one BSP step, then the
       documented answer from below. */
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), ok(LSP2), ok(LSP2));
    fake_add(LSP2, ok(BASE), ok(LSP2), ok(LSP2));
    CHECK_EQ(lookup(LSP1, &base), 0);
    CHECK_EQ(base, BASE);
}

/* Nothing gives the base away: a clear error (SIO_BASE_HANDLE's), never
   the socket itself, whose AFD poll would fail later, silently. */
static void test_base_hidden(void) {
    SOCKET base;
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), ok(LSP1), ok(LSP1));
    CHECK_EQ(lookup(LSP1, &base), WSAEINVAL);
    CHECK_EQ(base, INVALID_SOCKET);
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), fails(WSAEINVAL), fails(WSAEINVAL));
    CHECK_EQ(lookup(LSP1, &base), WSAEINVAL);
    /* A layer below that hides its base as well. */
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), ok(LSP2), ok(LSP2));
    fake_add(LSP2, fails(WSAEINVAL), ok(LSP2), fails(WSAEINVAL));
    CHECK_EQ(lookup(LSP1, &base), WSAEINVAL);
    /* "Success" naming no socket is no answer either. */
    fake_reset();
    fake_add(LSP1, ok(INVALID_SOCKET), ok(INVALID_SOCKET), ok(INVALID_SOCKET));
    CHECK(lookup(LSP1, &base) != 0);
    CHECK_EQ(base, INVALID_SOCKET);
}

/* Providers whose BSP answers go round in a circle: the walk stops. */
static void test_base_cycle(void) {
    SOCKET base;
    fake_reset();
    fake_add(LSP1, fails(WSAEINVAL), ok(LSP2), ok(LSP2));
    fake_add(LSP2, fails(WSAEINVAL), ok(LSP1), ok(LSP1));
    CHECK_EQ(lookup(LSP1, &base), WSAEINVAL);
    CHECK(fake_queries < 64);
}

/* Wine without SIO_BASE_HANDLE: WSAEOPNOTSUPP, BSP answers naming the
   socket itself (or none): no LSPs there, the socket is its own base. */
static void test_base_wine(void) {
    SOCKET base;
    fake_reset();
    fake_add(LSP1, fails(WSAEOPNOTSUPP), ok(LSP1), ok(LSP1));
    CHECK_EQ(lookup(LSP1, &base), 0);
    CHECK_EQ(base, LSP1);
    fake_reset();
    fake_add(LSP1, fails(WSAEOPNOTSUPP), fails(WSAEOPNOTSUPP), fails(WSAEOPNOTSUPP));
    CHECK_EQ(lookup(LSP1, &base), 0);
    CHECK_EQ(base, LSP1);
    /* A closed socket stops the walk at once. */
    fake_reset();
    fake_add(LSP1, fails(WSAENOTSOCK), ok(BASE), ok(BASE));
    CHECK_EQ(lookup(LSP1, &base), WSAENOTSOCK);
    CHECK_EQ(fake_queries, 1);
}

/* ------------------------------------------------------------- sockets */


/* The whole polyfill under a played LSP: the caller registers the layered
   socket (here a real socket `lsp`, whose readiness nobody touches), AFD
   must poll the base socket (`base`, the one that becomes readable), and
   the notification carries the caller's key. Taking the LSP's own answer
   for the base would poll the wrong socket: nothing would ever arrive. */
static void test_polyfill_through_lsp(void) {
    SOCKET lsp, lsp_peer, base, base_peer;
    SOCK_NOTIFY_REGISTRATION r;
    OVERLAPPED_ENTRY e[4];
    UINT32 got = 0;
    DWORD rc;
    HANDLE port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);

    make_pair(&lsp, &lsp_peer);
    make_pair(&base, &base_peer);
    fake_reset();
    fake_add(lsp, fails(WSAEINVAL), ok(lsp), ok(base));
    sn_afd_ws_query = fake_query;

    memset(&r, 0, sizeof r);
    r.socket = lsp;
    r.completionKey = (PVOID)(ULONG_PTR)0x1234;
    r.eventFilter = SOCK_NOTIFY_REGISTER_EVENT_IN;
    r.operation = SOCK_NOTIFY_OP_ENABLE;
    r.triggerFlags = SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_LEVEL;
    rc = sn_afd_process_socket_notifications(port, 1, &r, 0, 0, NULL, NULL);
    CHECK_EQ(rc, ERROR_SUCCESS);
    CHECK_EQ(r.registrationResult, 0);
    CHECK_EQ(send(base_peer, "x", 1, 0), 1);
    rc = sn_afd_process_socket_notifications(port, 0, NULL, 2000, 4, e, &got);
    CHECK_EQ(rc, ERROR_SUCCESS);
    CHECK_EQ(got, 1);
    if (got == 1) {
        CHECK_EQ(e[0].lpCompletionKey, 0x1234);
        CHECK(e[0].dwNumberOfBytesTransferred & SOCK_NOTIFY_EVENT_IN);
    }

    /* A layered socket that hides its base is refused at ENABLE with the
       lookup's error: the caller hears of it, nothing is polled. */
    fake_add(lsp_peer, fails(WSAEINVAL), ok(lsp_peer), ok(lsp_peer));
    r.socket = lsp_peer;
    r.completionKey = (PVOID)(ULONG_PTR)0x5678;
    r.registrationResult = 0;
    rc = sn_afd_process_socket_notifications(port, 1, &r, 0, 0, NULL, NULL);
    CHECK_EQ(rc, ERROR_SUCCESS);
    CHECK_EQ(r.registrationResult, WSAEINVAL);

    sn_afd_ws_query = real_query;
    sn_afd_port_closed(port);
    CloseHandle(port);
    closesocket(lsp);
    closesocket(lsp_peer);
    closesocket(base);
    closesocket(base_peer);
}

/* ------------------------------------------- what OP_REMOVE asks */

static int socket_questions;
static sn_afd_ws_check_fn real_check;

static DWORD counting_query(SOCKET socket, DWORD ioctl, SOCKET *answer) {
    socket_questions++;
    return real_query(socket, ioctl, answer);
}

static DWORD counting_check(SOCKET socket) {
    socket_questions++;
    return real_check(socket);
}

/* One registration change through the polyfill, register-only; the
   questions it put to Winsock about sockets are counted. */
static DWORD change_counted(HANDLE port, SOCKET s, ULONG_PTR key, UINT16 filter,
                            UINT8 op, int *questions) {
    SOCK_NOTIFY_REGISTRATION r;
    DWORD rc;
    memset(&r, 0, sizeof r);
    r.socket = s;
    r.completionKey = (PVOID)key;
    r.eventFilter = filter;
    r.operation = op;
    r.triggerFlags = op == SOCK_NOTIFY_OP_ENABLE
        ? SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_LEVEL : 0;
    socket_questions = 0;
    sn_afd_ws_query = counting_query;
    sn_afd_ws_check_socket = counting_check;
    rc = sn_afd_process_socket_notifications(port, 1, &r, 0, 0, NULL, NULL);
    sn_afd_ws_query = real_query;
    sn_afd_ws_check_socket = real_check;
    *questions = socket_questions;
    return rc == ERROR_SUCCESS ? r.registrationResult : rc;
}

/* The next notification's events for `key` within `ms`, or 0. */
static UINT32 next_event(HANDLE port, ULONG_PTR key, DWORD ms) {
    OVERLAPPED_ENTRY e[4];
    UINT32 got = 0;
    if (sn_afd_process_socket_notifications(port, 0, NULL, ms, 4, e, &got) != ERROR_SUCCESS ||
        got != 1 || e[0].lpCompletionKey != key)
        return 0;
    return e[0].dwNumberOfBytesTransferred;
}

static void test_remove_asks_the_socket_nothing(void) {
    SOCKET a, b;
    int questions = -1;
    HANDLE port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0);
    make_pair(&a, &b);

    /* A poll in flight (nothing to read): REMOVE, then its event. */
    CHECK_EQ(change_counted(port, a, 7, SOCK_NOTIFY_REGISTER_EVENT_IN,
                            SOCK_NOTIFY_OP_ENABLE, &questions), 0);
    CHECK(questions > 0);   /* a new registration is checked, and its base found */
    CHECK_EQ(next_event(port, 7, 30), 0);
    CHECK_EQ(change_counted(port, a, 7, 0, SOCK_NOTIFY_OP_REMOVE, &questions), 0);
    CHECK_EQ(questions, 0);
    CHECK_EQ(next_event(port, 7, 2000), SOCK_NOTIFY_EVENT_REMOVE);

    /* Idle (the one-shot delivered): REMOVE, then its event. */
    CHECK_EQ(change_counted(port, a, 8, SOCK_NOTIFY_REGISTER_EVENT_OUT,
                            SOCK_NOTIFY_OP_ENABLE, &questions), 0);
    CHECK_EQ(next_event(port, 8, 2000), SOCK_NOTIFY_EVENT_OUT);
    CHECK_EQ(change_counted(port, a, 8, 0, SOCK_NOTIFY_OP_REMOVE, &questions), 0);
    CHECK_EQ(questions, 0);
    CHECK_EQ(next_event(port, 8, 2000), SOCK_NOTIFY_EVENT_REMOVE);

    /* Closed first: the REMOVE still fails, and no REMOVE event comes. */
    CHECK_EQ(change_counted(port, a, 9, SOCK_NOTIFY_REGISTER_EVENT_OUT,
                            SOCK_NOTIFY_OP_ENABLE, &questions), 0);
    CHECK_EQ(next_event(port, 9, 2000), SOCK_NOTIFY_EVENT_OUT);
    closesocket(a);
    CHECK(change_counted(port, a, 9, 0, SOCK_NOTIFY_OP_REMOVE, &questions) != 0);
    CHECK_EQ(questions, 0);
    CHECK_EQ(next_event(port, 9, 50), 0);

    sn_afd_port_closed(port);
    CloseHandle(port);
    closesocket(b);
}

/* ----------------------------------------------------- memory per wait */

/* More than the 128 entries the port translates on the stack, fewer than
   the 256 events the port layer keeps on its own stack: what is counted
   is the backend's buffer alone. */
#define BIG_WAIT 200

static void test_select_allocates_once(void) {
    int error = 0, i;
    LONG before;
    sn_port_t *port = sn_port_open(SN_BACKEND_AFD, &error);
    static sn_registration_t changes[8];
    static uint64_t out[2 * 400];
    static sn_notification_t notes[BIG_WAIT];
    uint32_t got;

    CHECK(port != NULL);
    if (port == NULL)
        return;
    CHECK_EQ(sn_port_bind(port, changes, 8, out, 2 * 400), 0);
    /* The first waits may allocate: the port's buffer, the polyfill's
       per-port state. */
    CHECK(sn_port_select(port, 0, 0.0) >= 0);
    CHECK_EQ(sn_port_process(port, 0, NULL, 0, 0, notes, BIG_WAIT, &got), 0);
    before = allocations;
    for (i = 0; i < 100; i++) {
        CHECK(sn_port_select(port, 0, 0.0) >= 0);
        CHECK_EQ(sn_port_process(port, 0, NULL, 0, 0, notes, BIG_WAIT, &got), 0);
    }
    if (allocations != before)
        fprintf(stderr, "  %ld allocations in 200 waits\n", (long)(allocations - before));
    CHECK_EQ(allocations - before, 0);
    /* And a wait that receives something, through the same buffer. */
    CHECK_EQ(sn_port_post(port, 77), 0);
    CHECK_EQ(sn_port_process(port, 0, NULL, 0, 1000, notes, BIG_WAIT, &got), 0);
    CHECK_EQ(got, 1);
    CHECK_EQ(notes[0].key, 77);
    CHECK_EQ(allocations - before, 0);
    sn_port_close(port);
    sn_port_free(port);
}

/* A busy selector: more registrations in one select (its changes and the
   re-arms of what the last select delivered) than the port layer's stack
   holds. The select path keeps those buffers in the port too. */
#define BUSY 24
static void test_busy_select_allocates_once(void) {
    int error = 0, i;
    LONG before;
    sn_port_t *port = sn_port_open(SN_BACKEND_AFD, &error);
    static sn_registration_t changes[BUSY];
    static uint64_t out[2 * 400];
    SOCKET a[BUSY], b[BUSY];
    int64_t answer;

    CHECK(port != NULL);
    if (port == NULL)
        return;
    CHECK_EQ(sn_port_bind(port, changes, BUSY, out, 2 * 400), 0);
    for (i = 0; i < BUSY; i++) {
        make_pair(&a[i], &b[i]);
        memset(&changes[i], 0, sizeof changes[i]);
        changes[i].socket = (uint64_t)a[i];
        changes[i].key = (uint64_t)i + 1;
        changes[i].events = SN_EVENT_OUT;          /* ready at once, every time */
        changes[i].op = SN_OP_ENABLE;
        changes[i].trigger = SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL;
    }
    /* All 24 changes in one select, then the re-arms of 24 one-shot
       deliveries in each select after it. */
    answer = sn_port_select(port, BUSY, 2000.0);
    CHECK(answer > 0);
    for (i = 0; i < 3; i++)
        CHECK(sn_port_select(port, 0, 2000.0) > 0);   /* warm-up */
    before = allocations;
    for (i = 0; i < 50; i++) {
        answer = sn_port_select(port, 0, 2000.0);
        CHECK(answer > 0);
    }
    if (allocations != before)
        fprintf(stderr, "  %ld allocations in 50 busy selects\n",
                (long)(allocations - before));
    CHECK_EQ(allocations - before, 0);
    sn_port_close(port);
    sn_port_free(port);
    for (i = 0; i < BUSY; i++) {
        closesocket(a[i]);
        closesocket(b[i]);
    }
}

/* Several threads waiting at once each need a buffer of their own: the
   port ends up with at most one per thread, and every posted packet still
   reaches exactly one waiter. */
#define MT_THREADS 4
#define MT_POSTS 400
static sn_port_t *mt_port;
static volatile LONG mt_received;
static volatile LONG mt_errors;

static DWORD WINAPI mt_waiter(LPVOID arg) {
    sn_notification_t notes[BIG_WAIT];
    (void)arg;
    while (mt_received < MT_POSTS) {
        uint32_t got = 0, i;
        if (sn_port_process(mt_port, 0, NULL, 0, 20, notes, BIG_WAIT, &got) != 0) {
            InterlockedIncrement(&mt_errors);
            break;
        }
        for (i = 0; i < got; i++)
            if (notes[i].key == 5)
                InterlockedIncrement(&mt_received);
    }
    return 0;
}

static void test_threads_share_buffers(void) {
    HANDLE threads[MT_THREADS];
    int error = 0, i;
    LONG before;

    mt_port = sn_port_open(SN_BACKEND_AFD, &error);
    CHECK(mt_port != NULL);
    if (mt_port == NULL)
        return;
    mt_received = 0;
    mt_errors = 0;
    before = allocations;
    for (i = 0; i < MT_THREADS; i++)
        threads[i] = CreateThread(NULL, 0, mt_waiter, NULL, 0, NULL);
    for (i = 0; i < MT_POSTS; i++) {
        CHECK_EQ(sn_port_post(mt_port, 5), 0);
        if (i % 16 == 0)
            Sleep(1);
    }
    WaitForMultipleObjects(MT_THREADS, threads, TRUE, 30000);
    for (i = 0; i < MT_THREADS; i++)
        CloseHandle(threads[i]);
    CHECK_EQ(mt_errors, 0);
    CHECK_EQ(mt_received, MT_POSTS);
    /* Per buffer: its header and its entries, plus the polyfill's state
       for the port and whatever thread start-up costs; never one per wait
       (there were hundreds). */
    if (allocations - before > 4 * MT_THREADS + 8)
        fprintf(stderr, "  %ld allocations for %d waiters\n",
                (long)(allocations - before), MT_THREADS);
    CHECK(allocations - before <= 4 * MT_THREADS + 8);
    sn_port_close(mt_port);
    sn_port_free(mt_port);
}

/* Out of memory for the buffer: the wait fails with the port's
   no-memory error and the port stays usable. */
static void test_buffer_out_of_memory(void) {
    int error = 0;
    sn_port_t *port = sn_port_open(SN_BACKEND_AFD, &error);
    sn_notification_t notes[BIG_WAIT];
    uint32_t got = 99;

    CHECK(port != NULL);
    if (port == NULL)
        return;
    refuse_memory = 1;
    CHECK_EQ(sn_port_process(port, 0, NULL, 0, 0, notes, BIG_WAIT, &got),
             ERROR_NOT_ENOUGH_MEMORY);
    refuse_memory = 0;
    CHECK_EQ(got, 0);
    CHECK_EQ(sn_port_post(port, 9), 0);
    CHECK_EQ(sn_port_process(port, 0, NULL, 0, 1000, notes, BIG_WAIT, &got), 0);
    CHECK_EQ(got, 1);
    CHECK_EQ(notes[0].key, 9);
    sn_port_close(port);
    sn_port_free(port);
}

/* ------------------------------------ memory running out in a takeover */

/* Sockets the strict model refuses (as the OS refuses a layered
   provider's), readable, registered one-shot in one call while memory
   runs out after `k` allocations, for every k until the call needs no
   more than k. Whatever k, the call ends with each registration taken
   over by the polyfill (result 0) or failed with the port's no-memory
   error (ERROR_NOT_ENOUGH_MEMORY, as in test_buffer_out_of_memory), never
   with the OS's refusal the polyfill was there to make good; once memory
   is back, the failed ones sent again (as their owner would) are taken,
   every socket is heard exactly once, and nothing is left allocated when
   the port is freed. With `lift`, the refusals are lifted before the
   failed ones are sent again (the OS takes them the second time): each is
   then the OS's alone, not also served by a polyfill registration the
   failed takeover left behind (which would report it a second time). */
#define OOM_MAX 8

/* Notifications into the `heard` bitmask; a socket heard twice fails. */
static void oom_hear(int k, const sn_notification_t *notes, uint32_t got, int n,
                     unsigned *heard) {
    uint32_t j;
    for (j = 0; j < got; j++) {
        unsigned bit;
        if (notes[j].key < 1 || notes[j].key > (uint64_t)n || !(notes[j].events & SN_EVENT_IN))
            continue;
        bit = 1u << (notes[j].key - 1);
        if (*heard & bit) {
            fprintf(stderr, "  k=%d: socket %d heard twice\n", k, (int)notes[j].key - 1);
            CHECK(0);
        }
        *heard |= bit;
    }
}

/* The strict model keeps process-wide tables of its registrations
   (sn_model.c), made at its first registration and kept for the process:
   made here first, with room for OOM_MAX, so that what oom_takeover counts
   as left behind is a port's. */
/* The i-th socket's first ENABLE for reading, one-shot and level, under
   key i + 1. */
static void oom_enable(sn_registration_t *reg, SOCKET s, int i) {
    memset(reg, 0, sizeof *reg);
    reg->socket = (uint64_t)s;
    reg->key = (uint64_t)i + 1;
    reg->events = SN_EVENT_IN;
    reg->op = SN_OP_ENABLE;
    reg->trigger = SN_TRIGGER_LEVEL | SN_TRIGGER_ONESHOT;
}

static void oom_warm_model(void) {
    SOCKET a[OOM_MAX], b[OOM_MAX];
    sn_registration_t regs[OOM_MAX];
    sn_notification_t notes[BIG_WAIT];
    uint32_t got = 0;
    int error = 0, i;
    sn_port_t *port = sn_port_open(SN_BACKEND_STRICT, &error);

    CHECK(port != NULL);
    if (port == NULL)
        return;
    for (i = 0; i < OOM_MAX; i++) {
        make_pair(&a[i], &b[i]);
        oom_enable(&regs[i], a[i], i);
    }
    CHECK_EQ(sn_port_process(port, 0, regs, OOM_MAX, 0, notes, BIG_WAIT, &got), 0);
    for (i = 0; i < OOM_MAX; i++)
        regs[i].op = SN_OP_REMOVE;
    CHECK_EQ(sn_port_process(port, 0, regs, OOM_MAX, 0, notes, BIG_WAIT, &got), 0);
    sn_port_close(port);
    sn_port_free(port);
    for (i = 0; i < OOM_MAX; i++) {
        closesocket(a[i]);
        closesocket(b[i]);
    }
}

static void oom_takeover(int n, int lift) {
    SOCKET a[OOM_MAX], b[OOM_MAX];
    sn_registration_t regs[OOM_MAX], again[OOM_MAX];
    sn_notification_t notes[BIG_WAIT];
    int error = 0, i, k, done = 0, short_runs = 0;
    const unsigned all = (1u << n) - 1;

    oom_warm_model();
    for (k = 0; !done && k < 400; k++) {
        sn_port_t *port;
        uint32_t got = 0, failed = 0;
        unsigned heard = 0;
        uint64_t counts[SN_COUNT_FALLBACKS + 1] = {0};
        LONG before;
        DWORD start, quiet = 0;
        int rc, short_of_memory;

        for (i = 0; i < n; i++) {
            make_pair(&a[i], &b[i]);
            send(b[i], "x", 1, 0);
        }
        before = live;
        port = sn_port_open(SN_BACKEND_STRICT, &error);
        CHECK(port != NULL);
        if (port == NULL)
            return;
        /* The port's own first allocations (its buffers) come first. */
        CHECK_EQ(sn_port_process(port, 0, NULL, 0, 0, notes, BIG_WAIT, &got), 0);
        for (i = 0; i < n; i++) {
            CHECK_EQ(sn_model_control(port, SN_MODEL_REFUSE, (uint64_t)a[i], 1), 0);
            oom_enable(&regs[i], a[i], i);
        }
        allow_more = k;
        rc = sn_port_process(port, 0, regs, (uint32_t)n, 0, notes, BIG_WAIT, &got);
        short_of_memory = allow_more == 0;
        allow_more = -1;
        if (rc != 0) {
            if (rc != ERROR_NOT_ENOUGH_MEMORY)
                fprintf(stderr, "  k=%d: the call failed with %d\n", k, rc);
            CHECK_EQ(rc, ERROR_NOT_ENOUGH_MEMORY);
            got = 0;
        }
        oom_hear(k, notes, got, n, &heard);
        for (i = 0; i < n; i++) {
            if (regs[i].result == 0)
                continue;
            if (regs[i].result != ERROR_NOT_ENOUGH_MEMORY &&
                regs[i].result != SN_RESULT_UNAPPLIED) {
                fprintf(stderr, "  k=%d: registration %d ended with %u\n", k, i,
                        (unsigned)regs[i].result);
                CHECK(0);
            }
            if (lift)
                sn_model_control(port, SN_MODEL_REFUSE, (uint64_t)a[i], 0);
            again[failed] = regs[i];
            again[failed].result = 0;
            failed++;
        }
        short_runs += failed != 0;
        if (!short_of_memory && rc == 0)
            done = 1;    /* the call had all the memory it wanted */
        /* Memory is back: the failed ones again, then every socket heard
           within 2 s, and nothing more for 150 ms after that. */
        if (failed != 0) {
            CHECK_EQ(sn_port_process(port, 0, again, failed, 0, notes, BIG_WAIT, &got), 0);
            for (i = 0; i < (int)failed; i++) {
                if (again[i].result != 0)
                    fprintf(stderr, "  k=%d: registration %d sent again ended with %u\n", k,
                            (int)again[i].key - 1, (unsigned)again[i].result);
                CHECK_EQ(again[i].result, 0);
            }
            oom_hear(k, notes, got, n, &heard);
        }
        start = GetTickCount();
        while (GetTickCount() - start < 2000) {
            CHECK_EQ(sn_port_process(port, 0, NULL, 0, 50, notes, BIG_WAIT, &got), 0);
            oom_hear(k, notes, got, n, &heard);
            if (heard != all || got != 0)
                quiet = GetTickCount();
            else if (GetTickCount() - quiet >= 150)
                break;
        }
        if (heard != all)
            fprintf(stderr, "  k=%d: heard %#x of %#x\n", k, heard, all);
        CHECK_EQ(heard, all);
        sn_port_counters(port, counts, SN_COUNT_FALLBACKS + 1);
        CHECK_EQ(counts[SN_COUNT_FALLBACKS], (uint64_t)(lift ? n - (int)failed : n));
        for (i = 0; i < n; i++) {
            regs[i].op = SN_OP_REMOVE;
            regs[i].result = 0;
        }
        CHECK_EQ(sn_port_process(port, 0, regs, (uint32_t)n, 0, notes, BIG_WAIT, &got), 0);
        for (i = 0; i < n; i++)
            CHECK_EQ(regs[i].result, 0);
        for (i = 0; i < n; i++)
            sn_model_control(port, SN_MODEL_REFUSE, (uint64_t)a[i], 0);
        sn_port_close(port);
        sn_port_free(port);
        if (live != before)
            fprintf(stderr, "  k=%d: %ld blocks left after the port was freed\n", k,
                    (long)(live - before));
        CHECK_EQ(live - before, 0);
        for (i = 0; i < n; i++) {
            closesocket(a[i]);
            closesocket(b[i]);
        }
    }
    CHECK(done);
    CHECK(short_runs > 0);     /* memory did run out in some takeover */
}

static void test_takeover_out_of_memory_one(void) { oom_takeover(1, 0); }
static void test_takeover_out_of_memory_several(void) { oom_takeover(OOM_MAX, 0); }
static void test_takeover_out_of_memory_then_accepted(void) { oom_takeover(1, 1); }
static void test_takeovers_out_of_memory_then_accepted(void) { oom_takeover(OOM_MAX, 1); }

int main(void) {
    WSADATA wsa;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) {
        fprintf(stderr, "WSAStartup failed\n");
        return 2;
    }
    real_query = sn_afd_ws_query;
    real_check = sn_afd_ws_check_socket;
    setup_listener(64);
    RUN(test_base_plain);
    RUN(test_base_lsp_answers_itself);
    RUN(test_base_two_layers);
    RUN(test_base_hidden);
    RUN(test_base_cycle);
    RUN(test_base_wine);
    RUN(test_polyfill_through_lsp);
    RUN(test_remove_asks_the_socket_nothing);
    RUN(test_select_allocates_once);
    RUN(test_busy_select_allocates_once);
    RUN(test_threads_share_buffers);
    RUN(test_buffer_out_of_memory);
    RUN(test_takeover_out_of_memory_one);
    RUN(test_takeover_out_of_memory_several);
    RUN(test_takeover_out_of_memory_then_accepted);
    RUN(test_takeovers_out_of_memory_then_accepted);
    closesocket(listener);
    WSACleanup();
    printf("%d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
