/*
 * test_core_posix.c -- the C core driven directly, for the sanitizer run.
 *
 * Built with -fsanitize=address,undefined and LeakSanitizer on (see
 * tests/c/run_sanitizers.sh), so every allocation the port makes must be
 * freed and every access in bounds. Exercises the table under churn: many
 * registrations, removals, re-keyed sockets, reused descriptors, posts from
 * another thread, growth past the stack buffers.
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

static int failures;

#define CHECK(cond) do { \
    if (!(cond)) { fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); failures++; } \
} while (0)

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
    sn_port_close(port);
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
    sn_port_close(port);
}

int main(void) {
    test_basic();
    test_churn();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_core_posix: all checks passed\n");
    return 0;
}
