/*
 * win_sockets.h -- the loopback TCP pairs the Windows C test drivers
 * (test_afd_polyfill.c, test_win_internals.c, test_win_port.c) register:
 * one listener per program, set up once in main() before any test, and a
 * connected pair per make_pair(). A set-up that fails ends the program
 * with status 2 (no test can run without sockets), told apart from a
 * failed check (status 1). Include after winsock2.h.
 */
#ifndef SN_TEST_WIN_SOCKETS_H
#define SN_TEST_WIN_SOCKETS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static SOCKET listener;
static struct sockaddr_in listen_addr;

static void set_nonblocking(SOCKET s) {
    u_long one = 1;
    ioctlsocket(s, FIONBIO, &one);
}

/* The listener on an ephemeral loopback port, with room for `backlog`
   connections not yet accepted. */
static void setup_listener(int backlog) {
    int len = sizeof listen_addr;
    listener = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    memset(&listen_addr, 0, sizeof listen_addr);
    listen_addr.sin_family = AF_INET;
    listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&listen_addr, sizeof listen_addr) != 0 ||
        getsockname(listener, (struct sockaddr *)&listen_addr, &len) != 0 ||
        listen(listener, backlog) != 0) {
        fprintf(stderr, "listener setup failed: %d\n", WSAGetLastError());
        exit(2);
    }
}

/* A connected TCP pair on loopback; *a (the connecting end) is
   non-blocking, *b (the accepted end) as accept() made it. */
static void make_pair(SOCKET *a, SOCKET *b) {
    SOCKET c = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    if (connect(c, (struct sockaddr *)&listen_addr, sizeof listen_addr) != 0) {
        fprintf(stderr, "connect failed: %d\n", WSAGetLastError());
        exit(2);
    }
    *b = accept(listener, NULL, NULL);
    if (*b == INVALID_SOCKET) {
        fprintf(stderr, "accept failed: %d\n", WSAGetLastError());
        exit(2);
    }
    *a = c;
    set_nonblocking(*a);
}

#endif /* SN_TEST_WIN_SOCKETS_H */
