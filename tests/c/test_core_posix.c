/*
 * test_core_posix.c -- the C core driven directly, for the sanitizer run.
 *
 * Built with -fsanitize=address,undefined and LeakSanitizer on (see
 * tests/c/run_sanitizers.sh), so every allocation the port makes must be
 * freed and every access in bounds. Exercises the table under churn: many
 * registrations, removals, re-keyed sockets, reused descriptors, posts from
 * another thread, growth past the stack buffers; and the life cycle under
 * threads: close() racing waiters, posters and selects, every waiter
 * woken, nothing touched after release; and orphaned epoll items
 * (descriptors closed before their unregister while a dup keeps the file)
 * made while other threads select, wait and change registrations, after
 * which an idle wait must stay idle; and one port per thread, many
 * threads at once, each woken by posts from another (the shape of one
 * event loop per thread). The same driver is built with ThreadSanitizer
 * (run_sanitizers.sh) for the races.
 */
#define _GNU_SOURCE
#include "socknotify.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static sn_registration_t reg(int fd, uint64_t key, uint16_t events, uint8_t op, uint8_t trigger) {
    sn_registration_t r;
    memset(&r, 0, sizeof r);
    r.socket = (uint64_t)fd;
    r.key = key;
    r.events = events;
    r.op = op;
    r.trigger = trigger;
    return r;
}

static uint32_t process(sn_port_t *port, sn_registration_t *regs, uint32_t n,
                        int64_t timeout, sn_notification_t *out, uint32_t max) {
    uint32_t got = 0;
    CHECK(sn_port_process(port, 0, regs, n, timeout, out, max, &got) == 0);
    return got;
}

static void *poster(void *arg) {
    sn_port_t *port = arg;
    usleep(20000);
    sn_port_post(port, 4242);
    return NULL;
}

static void test_basic(void) {
    int error = -1;
    sn_port_t *port = sn_port_open(SN_BACKEND_AUTO, &error);
    sn_notification_t out[8];
    sn_registration_t r;
    int sv[2];
    pthread_t thread;

    CHECK(port != NULL && error == 0);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    r = reg(sv[0], 1, SN_EVENT_IN, SN_OP_ENABLE, SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL);
    CHECK(process(port, &r, 1, 0, out, 8) == 0 && r.result == 0);
    CHECK(write(sv[1], "x", 1) == 1);
    CHECK(process(port, NULL, 0, 1000, out, 8) == 1 && out[0].key == 1 && out[0].events == SN_EVENT_IN);
    CHECK(process(port, NULL, 0, 10, out, 8) == 0);           /* one-shot */
    r = reg(sv[0], 1, SN_EVENT_IN, SN_OP_REMOVE, 0);
    CHECK(process(port, &r, 1, 100, out, 8) == 1 && out[0].events == SN_EVENT_REMOVE);
    r = reg(sv[0], 1, SN_EVENT_IN, SN_OP_REMOVE, 0);
    CHECK(process(port, &r, 1, 0, out, 8) == 0 && r.result == (uint32_t)sn_error_not_registered());
    r = reg(sv[0], 1, 0x100, SN_OP_ENABLE, SN_TRIGGER_ONESHOT);
    CHECK(process(port, &r, 1, 0, out, 8) == 0 && r.result == (uint32_t)sn_error_invalid());
    CHECK(pthread_create(&thread, NULL, poster, port) == 0);
    CHECK(process(port, NULL, 0, SN_INFINITE, out, 8) == 1 && out[0].key == 4242 && out[0].events == 0);
    pthread_join(thread, NULL);
    close(sv[0]);
    close(sv[1]);
    CHECK(sn_port_registered(port) == 0);
    sn_port_free(port);
}

static void test_churn(void) {
    enum { PAIRS = 600 };
    int error;
    sn_port_t *port = sn_port_open(SN_BACKEND_AUTO, &error);
    static int sv[PAIRS][2];
    static sn_registration_t regs[PAIRS * 2];
    static sn_notification_t out[2048];
    uint32_t i, seen = 0;
    int round;

    CHECK(port != NULL);
    for (round = 0; round < 5; round++) {
        for (i = 0; i < PAIRS; i++) {
            CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]) == 0);
            regs[2 * i] = reg(sv[i][0], 100000u * round + 2 * i, SN_EVENT_OUT | SN_EVENT_IN, SN_OP_ENABLE,
                              SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL);
            regs[2 * i + 1] = reg(sv[i][1], 100000u * round + 2 * i + 1, SN_EVENT_OUT, SN_OP_ENABLE,
                                  SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL);
        }
        seen = process(port, regs, PAIRS * 2, 1000, out, 2048);
        CHECK(seen == PAIRS * 2);
        if (seen != PAIRS * 2) fprintf(stderr, "seen %u\n", seen);
        for (i = 0; i < PAIRS * 2; i++)
            CHECK(regs[i].result == 0);
        CHECK(sn_port_registered(port) == PAIRS * 2);
        /* Half removed properly, half closed without a word, then reused. */
        for (i = 0; i < PAIRS; i++)
            regs[i] = reg(sv[i][0], 100000u * round + 2 * i, 0, SN_OP_REMOVE, 0);
        seen = process(port, regs, PAIRS, 0, out, 2048);
        for (i = 0; i < PAIRS; i++) {
            close(sv[i][0]);
            close(sv[i][1]);
        }
        /* The persistent halves were closed while registered: their
           records are retired when their fds are re-registered with
           other keys next round, or by the REMOVE below failing. */
        for (i = 0; i < PAIRS; i++)
            regs[i] = reg(sv[i][1], 100000u * round + 2 * i + 1, 0, SN_OP_REMOVE, 0);
        seen += process(port, regs, PAIRS, 100, out, 2048);
        for (i = 0; i < PAIRS; i++)
            CHECK(regs[i].result != 0);   /* already closed */
        CHECK(sn_port_registered(port) == 0);
    }
    sn_port_free(port);
}

/* ---- the life cycle under threads ---------------------------------------- */

enum { WAITERS = 4, ROUNDS = 200 };

typedef struct racer {
    sn_port_t *port;
    int kind;          /* 0: blocking waiter, 1: polling loop, 2: poster, 3: selector */
    volatile int *stop;
    int returned;
} racer_t;

static void *racer_main(void *arg) {
    racer_t *r = arg;
    sn_notification_t out[4];
    uint32_t got;
    int err;
    for (;;) {
        switch (r->kind) {
        case 0:
            err = sn_port_process(r->port, 0, NULL, 0, SN_INFINITE, out, 4, &got);
            break;
        case 1:
            err = sn_port_process(r->port, 0, NULL, 0, 0, out, 4, &got);
            break;
        case 2:
            err = sn_port_post(r->port, 7);
            break;
        default:
            err = (int)-sn_port_select(r->port, 0, 1);
            if (err == sn_error_busy())
                err = 0;
            break;
        }
        /* A closed port answers every call with sn_error_closed(); a
           waiter woken by close() returns 0: both end the loop once the
           port is closing. */
        if (err == sn_error_closed() || __atomic_load_n(r->stop, __ATOMIC_SEQ_CST))
            break;
    }
    r->returned = 1;
    return NULL;
}

static void test_close_races(void) {
    int round;
    for (round = 0; round < ROUNDS; round++) {
        int error = -1;
        sn_port_t *port = sn_port_open(SN_BACKEND_AUTO, &error);
        pthread_t threads[WAITERS + 3];
        racer_t racers[WAITERS + 3];
        volatile int stop = 0;
        uint64_t out[64];
        sn_registration_t changes[4];
        int i, n = WAITERS + 3;

        CHECK(port != NULL);
        if (port == NULL)
            return;
        CHECK(sn_port_bind(port, changes, 4, out, 64) == 0);
        for (i = 0; i < n; i++) {
            racers[i].port = port;
            racers[i].kind = i < WAITERS ? 0 : i - WAITERS + 1;
            racers[i].stop = &stop;
            racers[i].returned = 0;
            pthread_create(&threads[i], NULL, racer_main, &racers[i]);
        }
        if (round % 2)
            usleep(200);
        /* close() returns once every thread inside has left. */
        CHECK(sn_port_close(port) == 0);
        __atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
        for (i = 0; i < n; i++)
            pthread_join(threads[i], NULL);
        for (i = 0; i < n; i++)
            CHECK(racers[i].returned);
        /* Late calls on a closed port fail cleanly. */
        CHECK(sn_port_post(port, 1) == sn_error_closed());
        CHECK(sn_port_close(port) == 0);
        sn_port_free(port);
    }
}

/* -- orphans made while other threads select, wait and change ------------- */

typedef struct orphan_race {
    sn_port_t *port;
    volatile int stop;
    int orphans;      /* rounds the orphan maker completed */
} orphan_race_t;

static void *orphan_selector(void *arg) {
    orphan_race_t *race = arg;
    while (!__atomic_load_n(&race->stop, __ATOMIC_ACQUIRE)) {
        int64_t got = sn_port_select(race->port, 0, 2);
        CHECK(got >= 0 || got == -(int64_t)sn_error_interrupted());
    }
    return NULL;
}

static void *orphan_waiter(void *arg) {
    orphan_race_t *race = arg;
    sn_notification_t out[8];
    while (!__atomic_load_n(&race->stop, __ATOMIC_ACQUIRE))
        process(race->port, NULL, 0, 2, out, 8);
    return NULL;
}

/* Close a descriptor the port may be using by number in another thread:
   the fault under test. ThreadSanitizer calls that a race on the number;
   tests/c/tsan.supp exempts this function, and only it. */
__attribute__((noinline)) static void close_under_port(int fd) {
    close(fd);
}

/* Sockets registered, made readable, then closed BEFORE their remove while
   a dup keeps the file: each leaves an orphan in epoll, which may fire
   once. */
static void *orphan_maker(void *arg) {
    orphan_race_t *race = arg;
    int round;
    for (round = 0; round < 150; round++) {
        int sv[2], kept;
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
        CHECK(sn_port_change(race->port, (uint64_t)sv[0], 1000 + (uint64_t)round,
                             SN_EVENT_IN, SN_OP_ENABLE,
                             SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL) == 0);
        CHECK(write(sv[1], "x", 1) == 1);
        usleep(300);
        kept = dup(sv[0]);
        close_under_port(sv[0]);
        /* Fails (the descriptor is closed) and retires the record. */
        (void)sn_port_change(race->port, (uint64_t)sv[0], 1000 + (uint64_t)round,
                             0, SN_OP_REMOVE, 0);
        usleep(300);
        close_under_port(kept);
        close(sv[1]);
        race->orphans++;
    }
    return NULL;
}

/* Healthy registrations coming and going meanwhile. */
static void *orphan_changer(void *arg) {
    orphan_race_t *race = arg;
    int round;
    for (round = 0; round < 300; round++) {
        int sv[2];
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
        CHECK(sn_port_change(race->port, (uint64_t)sv[0], 5000 + (uint64_t)round,
                             SN_EVENT_IN | SN_EVENT_OUT, SN_OP_ENABLE,
                             SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL) == 0);
        CHECK(write(sv[1], "y", 1) == 1);
        usleep(100);
        CHECK(sn_port_change(race->port, (uint64_t)sv[0], 5000 + (uint64_t)round,
                             0, SN_OP_REMOVE, 0) == 0);
        close(sv[0]);
        close(sv[1]);
    }
    return NULL;
}

static void test_orphan_races(void) {
    int error = -1, sv[2], i;
    sn_port_t *port = sn_port_open(SN_BACKEND_EPOLL, &error);
    sn_registration_t changes[4];
    uint64_t out[64], counters[SN_COUNTERS];
    pthread_t threads[4];
    orphan_race_t race;
    int64_t got = 0;
    uint64_t waits;

    CHECK(port != NULL);
    if (port == NULL)
        return;
    CHECK(sn_port_bind(port, changes, 4, out, 64) == 0);
    memset(&race, 0, sizeof race);
    race.port = port;
    CHECK(pthread_create(&threads[0], NULL, orphan_selector, &race) == 0);
    CHECK(pthread_create(&threads[1], NULL, orphan_waiter, &race) == 0);
    CHECK(pthread_create(&threads[2], NULL, orphan_maker, &race) == 0);
    CHECK(pthread_create(&threads[3], NULL, orphan_changer, &race) == 0);
    pthread_join(threads[2], NULL);
    pthread_join(threads[3], NULL);
    __atomic_store_n(&race.stop, 1, __ATOMIC_RELEASE);
    pthread_join(threads[0], NULL);
    pthread_join(threads[1], NULL);
    CHECK(race.orphans == 150);
    /* An idle wait stays idle: no orphan fires more than once. */
    CHECK(sn_port_counters(port, counters, SN_COUNTERS) == SN_COUNTERS);
    waits = counters[SN_COUNT_WAITS];
    CHECK(sn_port_select(port, 0, 300) >= 0);
    CHECK(sn_port_counters(port, counters, SN_COUNTERS) == SN_COUNTERS);
    CHECK(counters[SN_COUNT_WAITS] - waits <= 5);
    /* After it all, the port still works: a new registration is reported. */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK(sn_port_change(port, (uint64_t)sv[0], 77, SN_EVENT_IN, SN_OP_ENABLE,
                         SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL) == 0);
    CHECK(write(sv[1], "z", 1) == 1);
    for (i = 0; i < 50 && got <= 0; i++)
        got = sn_port_select(port, 0, 100);
    /* One pair: it comes in the answer itself, (key << 2) | mask. */
    CHECK(got == ((77 << 2) | SN_SELECT_READ));
    /* A quiet REMOVE under another key names another registration: it is
       refused, and this one stays. */
    CHECK(sn_port_change(port, (uint64_t)sv[0], 78, 0, SN_OP_REMOVE, 0) ==
          sn_error_not_registered());
    CHECK(sn_port_registered(port) == 1);
    CHECK(sn_port_change(port, (uint64_t)sv[0], 77, 0, SN_OP_REMOVE, 0) == 0);
    CHECK(sn_port_registered(port) == 0);
    close(sv[0]);
    close(sv[1]);
    CHECK(sn_port_close(port) == 0);
    sn_port_free(port);
}

/* -- one port per thread, all at once --------------------------------------

   What one event loop per thread makes of the core (free-threaded Python
   runs such loops truly in parallel): many threads each opening their own
   port at the same moment (the first ones race to install the fork
   watch), binding their own select buffers, registering, selecting,
   counting and closing, round after round; beside each, a thread waking
   it with posts while it selects, as another thread's
   call_soon_threadsafe() wakes a loop. Ports share nothing but the
   process-wide fork generation: ThreadSanitizer must see no race, and
   each port must report exactly its own keys and every post. */

enum { OWN_PORT_THREADS = 6, OWN_PORT_ROUNDS = 40, OWN_PORT_PAIRS = 4, OWN_PORT_POSTS = 20 };

typedef struct own_port {
    pthread_barrier_t *start;
    int wrong;
} own_port_t;

static void *own_port_poster(void *arg) {
    sn_port_t *port = arg;
    int i;
    for (i = 0; i < OWN_PORT_POSTS; i++)
        CHECK(sn_port_post(port, 1000 + (uint64_t)i) == 0);
    return NULL;
}

/* One select's pairs into `seen`, a bit per key from 10 on. A post only
   wakes a select (it comes back as no pair): any other key or mask here
   is another port's, or garbage. */
static void own_port_read(int64_t got, uint64_t *out, int *seen, int *wrong) {
    uint64_t pairs, k;
    if (got <= 0)
        return;
    if (got & 3) {              /* one pair, in the answer itself */
        out[0] = (uint64_t)got >> 2;
        out[1] = (uint64_t)got & 3;
        pairs = 1;
    } else {
        pairs = ((uint64_t)got >> 2) & 0xffffffffu;
    }
    for (k = 0; k < pairs; k++) {
        uint64_t key = out[2 * k];
        if (key < 10 || key >= 10 + OWN_PORT_PAIRS || out[2 * k + 1] != SN_SELECT_READ)
            (*wrong)++;
        else
            *seen |= 1 << (key - 10);
    }
}

static void *own_port_main(void *arg) {
    own_port_t *me = arg;
    int round;
    pthread_barrier_wait(me->start);
    for (round = 0; round < OWN_PORT_ROUNDS; round++) {
        int error = -1, sv[OWN_PORT_PAIRS][2], i, seen = 0, tries;
        sn_registration_t changes[OWN_PORT_PAIRS];
        uint64_t out[64], counters[SN_COUNTERS];
        pthread_t poster;
        sn_port_t *port = sn_port_open(SN_BACKEND_AUTO, &error);
        CHECK(port != NULL);
        if (port == NULL)
            return NULL;
        CHECK(sn_port_bind(port, changes, OWN_PORT_PAIRS, out, 64) == 0);
        CHECK(pthread_create(&poster, NULL, own_port_poster, port) == 0);
        for (i = 0; i < OWN_PORT_PAIRS; i++) {
            CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]) == 0);
            changes[i] = reg(sv[i][0], 10 + (uint64_t)i, SN_EVENT_IN, SN_OP_ENABLE,
                             SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL);
            CHECK(write(sv[i][1], "r", 1) == 1);
        }
        /* The changes go with the first select; every pair is readable and
           stays so (each select re-arms what it reported), so every key
           comes back, among the poster's wake-ups. */
        for (tries = 0; tries < 50 && seen != (1 << OWN_PORT_PAIRS) - 1; tries++) {
            int64_t got = sn_port_select(port, tries == 0 ? OWN_PORT_PAIRS : 0, 100);
            CHECK(got >= 0);
            own_port_read(got, out, &seen, &me->wrong);
        }
        CHECK(seen == (1 << OWN_PORT_PAIRS) - 1);
        pthread_join(poster, NULL);
        CHECK(sn_port_registered(port) == OWN_PORT_PAIRS);
        CHECK(sn_port_counters(port, counters, SN_COUNTERS) == SN_COUNTERS);
        CHECK(counters[SN_COUNT_WAITS] >= 1);
        CHECK(sn_port_close(port) == 0);
        for (i = 0; i < OWN_PORT_PAIRS; i++) {
            close(sv[i][0]);
            close(sv[i][1]);
        }
        sn_port_free(port);
    }
    return NULL;
}

static void test_one_port_per_thread(void) {
    pthread_t threads[OWN_PORT_THREADS];
    own_port_t ports[OWN_PORT_THREADS];
    pthread_barrier_t start;
    int i;
    CHECK(pthread_barrier_init(&start, NULL, OWN_PORT_THREADS) == 0);
    for (i = 0; i < OWN_PORT_THREADS; i++) {
        ports[i].start = &start;
        ports[i].wrong = 0;
        CHECK(pthread_create(&threads[i], NULL, own_port_main, &ports[i]) == 0);
    }
    for (i = 0; i < OWN_PORT_THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(ports[i].wrong == 0);
    }
    pthread_barrier_destroy(&start);
}

int main(void) {
    test_basic();
    test_churn();
    test_close_races();
    test_orphan_races();
    test_one_port_per_thread();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_core_posix: all checks passed\n");
    return 0;
}
