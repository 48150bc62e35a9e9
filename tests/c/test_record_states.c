/*
 * test_record_states.c -- the port record's state machine (sn_record.h),
 * walked table by table in the checked build (SN_CHECK_TRANSITIONS).
 *
 * Every transition is tried from every state. Where the table below says
 * the transition starts from that state, it must be taken: the record
 * ends in the table's state and nothing is refused. Everywhere else it
 * must be refused: the transition returns 0, the port's SN_COUNT_REFUSED
 * counter counts it (every build), the checked build reports it (here to a
 * hook that counts, instead of the abort the core's own builds get), and
 * the record is left byte for byte as it was. The table is this file's own, written
 * from docs/design.md ("The record in the C core"), not read from the
 * core: a transition that starts from a state the design does not give it,
 * or ends in another, fails here.
 *
 * Then the table's functions that manage the port's lists (sn__record_new,
 * sn__record_retire, sn__rebirth) on a real port, including the retire of
 * a free record, which would push its number twice on the free stack.
 *
 * Built and run by tests/c/run_sanitizers.sh (with ASan and UBSan).
 */
#include "sn_record.h"
#include "sn_table.h"
#include "sn_rearm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SN_CHECK_TRANSITIONS
#  error "build this test with -DSN_CHECK_TRANSITIONS: the refusals are what it checks"
#endif

#include "check.h"

static int refused;
static const char *refused_what;
/* The port whose counter counts the refusals (every transition takes one). */
static sn_layer_t *P;

static uint64_t refused_counted(void) {
    uint64_t counters[SN_COUNTERS];
    CHECK(sn_port_counters(&P->base, counters, SN_COUNTERS) == SN_COUNTERS);
    return counters[SN_COUNT_REFUSED];
}

static void count_refusal(const char *transition, unsigned state) {
    (void)state;
    refused++;
    refused_what = transition;
}

enum { F = SN_REC_FREE, E = SN_REC_ENABLED, FI = SN_REC_FIRED, D = SN_REC_DISABLED,
       RM = SN_REC_REMOVING, RK = SN_REC_REKEYING, NO = -1, SAME = -2 };

/* One transition: its name, how to take it, and where it leads from each
   state (NO: refused). */
typedef struct transition {
    const char *name;
    int (*take)(sn_record_t *r);
    int to[SN_REC_STATES];
} transition_t;

static int t_open(sn_record_t *r) { return sn__rec_open(P, r, 7, 70); }
static int t_enable(sn_record_t *r) {
    return sn__rec_enable(P, r, SN_EVENT_IN, SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL, 3);
}
static int t_merge(sn_record_t *r) {
    return sn__rec_merge(P, r, SN_EVENT_OUT, SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL);
}
static int t_fire(sn_record_t *r) { return sn__rec_fire(P, r, 1); }
static int t_heard(sn_record_t *r) { return sn__rec_heard(P, r); }
static int t_rearm(sn_record_t *r) { return sn__rec_rearm(P, r); }
static int t_disable(sn_record_t *r) { return sn__rec_disable(P, r); }
static int t_remove(sn_record_t *r) { return sn__rec_remove(P, r, 1); }
static int t_rekey(sn_record_t *r) {
    return sn__rec_rekey(P, r, 71, SN_EVENT_OUT, SN_TRIGGER_LEVEL);
}
static int t_wait(sn_record_t *r) { return sn__rec_wait(P, r, 72, SN_EVENT_IN, SN_TRIGGER_EDGE); }
static int t_take_back(sn_record_t *r) { return sn__rec_take_back(P, r); }
static int t_restore(sn_record_t *r) { return sn__rec_restore(P, r, SN_REC_DISABLED); }
static int t_held(sn_record_t *r) { return sn__rec_held(P, r, 1); }
static int t_identify(sn_record_t *r) {
    sn_identity_t now = {0x1234u, 4321u, 0x8001u, 1};
    return sn__rec_identify(P, r, &now, 1);
}
static int t_free(sn_record_t *r) { return sn__rec_free(P, r); }
static int t_reborn(sn_record_t *r) { return sn__rec_reborn(P, r); }

/*                                  FREE ENABLED FIRED DISABLED REMOVING REKEYING */
static const transition_t table[] = {
    {"open",      t_open,      {E,   NO,   NO,   NO,   NO,   NO}},
    {"enable",    t_enable,    {NO,  E,    E,    E,    NO,   NO}},
    {"merge",     t_merge,     {NO,  SAME, NO,   NO,   NO,   NO}},
    {"fire",      t_fire,      {NO,  FI,   NO,   NO,   NO,   NO}},
    {"heard",     t_heard,     {NO,  NO,   SAME, NO,   NO,   NO}},
    {"rearm",     t_rearm,     {NO,  NO,   E,    NO,   NO,   NO}},
    {"disable",   t_disable,   {NO,  D,    D,    D,    NO,   NO}},
    {"remove",    t_remove,    {NO,  RM,   RM,   RM,   NO,   NO}},
    {"rekey",     t_rekey,     {NO,  RK,   RK,   RK,   NO,   NO}},
    {"wait",      t_wait,      {NO,  NO,   NO,   NO,   RK,   RK}},
    {"take_back", t_take_back, {NO,  NO,   NO,   NO,   NO,   RM}},
    {"restore",   t_restore,   {NO,  D,    D,    D,    D,    D}},
    {"held",      t_held,      {NO,  SAME, SAME, SAME, SAME, SAME}},
    {"identify",  t_identify,  {NO,  SAME, SAME, SAME, SAME, SAME}},
    {"retire",    t_free,      {NO,  F,    F,    F,    F,    F}},
    {"reborn",    t_reborn,    {NO,  NO,   NO,   NO,   NO,   E}},
};

/* A record in `state`, with every field set to something recognisable. */
static void record_in(sn_record_t *r, int state) {
    memset(r, 0, sizeof *r);
    r->socket = 5;
    r->user_key = 50;
    r->generation = 9;
    r->events = SN_EVENT_IN;
    r->trigger = SN_TRIGGER_ONESHOT | SN_TRIGGER_LEVEL;
    r->state = (uint8_t)state;
    r->in_kernel = state == SN_REC_FREE ? 0 : 1;
    r->quiet = state >= SN_REC_REMOVING;
    /* Marked as enabled in the batch being translated (a merge needs it). */
    r->batch = P->batch_serial;
    r->batch_slot = 2;
    if (state == SN_REC_REKEYING) {
        r->next_key = 51;
        r->next_events = SN_EVENT_OUT;
        r->next_trigger = SN_TRIGGER_LEVEL;
    }
}

static void test_table(void) {
    size_t t;
    int s, taken = 0, caught = 0;
    for (t = 0; t < sizeof table / sizeof table[0]; t++) {
        for (s = 0; s < SN_REC_STATES; s++) {
            sn_record_t r, before;
            int to = table[t].to[s], taken_now;
            uint64_t counted = refused_counted();
            record_in(&r, s);
            before = r;
            refused = 0;
            taken_now = table[t].take(&r);
            if (to == NO) {
                if (refused != 1 || taken_now != 0 || refused_counted() != counted + 1 ||
                    memcmp(&r, &before, sizeof r) != 0) {
                    fprintf(stderr, "%s from %s: not refused, or the record changed\n",
                            table[t].name, sn__rec_state_name((unsigned)s));
                    failures++;
                }
                CHECK(refused_what != NULL && strcmp(refused_what, table[t].name) == 0);
                caught++;
                continue;
            }
            if (refused != 0 || taken_now != 1 || refused_counted() != counted ||
                r.state != (to == SAME ? s : to)) {
                fprintf(stderr, "%s from %s: refused, or ended in %s\n", table[t].name,
                        sn__rec_state_name((unsigned)s), sn__rec_state_name(r.state));
                failures++;
            }
            taken++;
        }
    }
    /* Every state is reached by some transition and left by some other. */
    for (s = 0; s < SN_REC_STATES; s++) {
        int reached = 0, left = 0;
        int u;
        for (t = 0; t < sizeof table / sizeof table[0]; t++)
            for (u = 0; u < SN_REC_STATES; u++) {
                reached |= table[t].to[u] == s && u != s;
                left |= u == s && table[t].to[u] >= 0 && table[t].to[u] != s;
            }
        CHECK(reached && left);
    }
    printf("record states: %d transitions taken, %d refused\n", taken, caught);
}

/* What each transition does to the fields beside the state. */
/* What the socket is (sn__rec_identify, sn__identity_differs): what a
   socket learns (bound, connected) keeps it the same socket; what it
   cannot lose (its port) or change (its type, a stream's peer) makes it
   another one. */
static void test_identity(void) {
    sn_record_t r;
    sn_identity_t unbound = {0, 0, 0x8001u, 1}, bound = {0, 5000, 0x8001u, 1};
    sn_identity_t connected = {0xabcdu, 5000, 0x8001u, 1}, reset = {0, 5000, 0x8001u, 1};
    sn_identity_t other_peer = {0xbcdeu, 5000, 0x8001u, 1};
    sn_identity_t other_port = {0xabcdu, 6000, 0x8001u, 1};
    sn_identity_t datagram = {0, 0, 0x8002u, 1};
    /* The type alone: the addresses could not be read (SO_BSP_STATE failed). */
    sn_identity_t unread = {0, 0, 0x8001u, 0}, unread_datagram = {0, 0, 0x8002u, 0};

    record_in(&r, SN_REC_ENABLED);
    sn__rec_identify(P, &r, &unbound, 0);
    CHECK(!sn__identity_differs(&r.ident, &bound));
    sn__rec_identify(P, &r, &bound, 1);
    CHECK(!sn__identity_differs(&r.ident, &connected));
    sn__rec_identify(P, &r, &connected, 1);
    CHECK(r.ident.peer == 0xabcdu && r.ident.local_port == 5000);
    /* A reset connection may read as not connected: the peer is kept. */
    CHECK(!sn__identity_differs(&r.ident, &reset));
    sn__rec_identify(P, &r, &reset, 1);
    CHECK(r.ident.peer == 0xabcdu);
    CHECK(sn__identity_differs(&r.ident, &other_peer));
    CHECK(sn__identity_differs(&r.ident, &other_port));
    CHECK(sn__identity_differs(&r.ident, &unbound));    /* a socket never unbinds */
    CHECK(sn__identity_differs(&r.ident, &datagram));
    /* What could not be read is unknown, not "unbound": the same socket,
       as far as the port can tell -- and what is known of it stays. */
    CHECK(!sn__identity_differs(&r.ident, &unread));
    CHECK(sn__identity_differs(&r.ident, &unread_datagram));
    sn__rec_identify(P, &r, &unread, 1);
    CHECK(r.ident.local_port == 5000 && r.ident.peer == 0xabcdu && r.ident.addressed == 1);
    /* Replaced (a new registration): what was known goes. */
    sn__rec_identify(P, &r, &datagram, 0);
    CHECK(r.ident.peer == 0 && r.ident.local_port == 0 && r.ident.kind == 0x8002u);
    /* A new record, and a reborn one, know nothing yet. */
    record_in(&r, SN_REC_FREE);
    r.ident = connected;
    sn__rec_open(P, &r, 3, 30);
    CHECK(r.ident.kind == 0 && r.ident.peer == 0);
    record_in(&r, SN_REC_REKEYING);
    r.ident = connected;
    sn__rec_reborn(P, &r);
    CHECK(r.ident.kind == 0 && r.ident.peer == 0);
}

static void test_fields(void) {
    sn_record_t r;
    uint32_t generation;

    record_in(&r, SN_REC_FREE);
    r.in_kernel = 1;
    sn__rec_open(P, &r, 11, 110);
    CHECK(r.socket == 11 && r.user_key == 110 && r.in_kernel == 0 && r.quiet == 0);
    CHECK(r.generation == 9);                    /* the generation the key carries */

    record_in(&r, SN_REC_DISABLED);
    r.batch = 0;
    CHECK(sn__rec_enable(P, &r, SN_EVENT_OUT, SN_TRIGGER_EDGE, 5) == 1);
    CHECK(r.events == SN_EVENT_OUT && r.trigger == SN_TRIGGER_EDGE);
    CHECK(r.batch == P->batch_serial && r.batch_slot == 5);

    /* One ENABLE per registration in a batch: a second merges into the
       first; after a DISABLE (or REMOVE, re-key) of it in the batch, or in
       another batch, there is nothing to merge into. */
    CHECK(sn__rec_merge(P, &r, SN_EVENT_IN, SN_TRIGGER_LEVEL) == 1);
    CHECK(r.events == SN_EVENT_IN && r.trigger == SN_TRIGGER_LEVEL && r.batch_slot == 5);
    CHECK(sn__rec_disable(P, &r) == 1 && r.batch == 0);
    CHECK(sn__rec_enable(P, &r, SN_EVENT_IN, SN_TRIGGER_LEVEL, 6) == 1);
    P->batch_serial++;
    refused = 0;
    CHECK(sn__rec_merge(P, &r, SN_EVENT_OUT, SN_TRIGGER_LEVEL) == 0 && refused == 1);
    CHECK(r.events == SN_EVENT_IN);
    refused = 0;
    CHECK(sn__rec_remove(P, &r, 1) == 1 && r.batch == 0);

    record_in(&r, SN_REC_FIRED);
    CHECK(sn__rec_remove(P, &r, 0) == 1 && r.quiet == 0);
    record_in(&r, SN_REC_ENABLED);
    CHECK(sn__rec_remove(P, &r, 1) == 1 && r.quiet == 1);

    record_in(&r, SN_REC_ENABLED);
    r.quiet = 0;
    CHECK(sn__rec_rekey(P, &r, 77, SN_EVENT_OUT, SN_TRIGGER_EDGE) == 1);
    CHECK(r.quiet == 1 && r.next_key == 77 && r.next_events == SN_EVENT_OUT &&
          r.next_trigger == SN_TRIGGER_EDGE && r.user_key == 50);

    /* Reborn: the waiting ENABLE becomes the registration, under a new
       generation, with nothing in the kernel yet. */
    generation = r.generation;
    sn__rec_reborn(P, &r);
    CHECK(r.state == SN_REC_ENABLED && r.user_key == 77 && r.events == SN_EVENT_OUT &&
          r.trigger == SN_TRIGGER_EDGE && r.in_kernel == 0 && r.quiet == 0 &&
          r.generation == generation + 1);

    /* Retired: a new generation, so every key issued before is stale; the
       generation skips 0 (no kernel key is 0) when it wraps. */
    record_in(&r, SN_REC_REMOVING);
    r.generation = 0x7fffffffu;
    sn__rec_free(P, &r);
    CHECK(r.state == SN_REC_FREE && r.generation == 1 && r.in_kernel == 0 && r.quiet == 0);

    /* Restore goes back to a live state only: anything else is ENABLED. */
    record_in(&r, SN_REC_REKEYING);
    sn__rec_restore(P, &r, SN_REC_FIRED);
    CHECK(r.state == SN_REC_FIRED && r.quiet == 0);
    record_in(&r, SN_REC_REMOVING);
    sn__rec_restore(P, &r, SN_REC_REMOVING);
    CHECK(r.state == SN_REC_ENABLED);

    record_in(&r, SN_REC_DISABLED);
    sn__rec_held(P, &r, 0);
    CHECK(r.in_kernel == 0 && r.state == SN_REC_DISABLED);
    CHECK(refused == 0);

    test_identity();
}

/* The table's own functions on a port: the record number and index
   bookkeeping around the transitions. */
static void test_table_functions(void) {
    int error = -1;
    sn_port_t *handle = sn_port_open(SN_BACKEND_AUTO, &error);
    sn_layer_t *port = sn__layer(handle);
    uint32_t recno = 0, again = 0, lookup = 0;
    sn_record_t *r;

    CHECK(handle != NULL);
    if (handle == NULL)
        return;
    sn_mutex_lock(&port->lock);
    refused = 0;
    CHECK(sn__record_new(port, 1000, 1, &recno) == 0);
    r = &port->records[recno];
    CHECK(r->state == SN_REC_ENABLED && port->live_count == 1);
    CHECK(sn__lookup(port, 1000, &lookup) == r && lookup == recno);

    /* Retired twice: the second is refused and frees nothing. */
    sn__record_retire(port, recno);
    CHECK(r->state == SN_REC_FREE && port->live_count == 0 && refused == 0);
    CHECK(sn__lookup(port, 1000, &lookup) == NULL);
    {
        uint32_t free_before = port->free_count;
        sn__record_retire(port, recno);
        CHECK(refused == 1 && port->free_count == free_before && port->live_count == 0);
    }

    /* The number comes back first, under the next generation. */
    refused = 0;
    CHECK(sn__record_new(port, 1001, 2, &again) == 0);
    CHECK(again == recno && port->records[again].generation == 2);

    /* Reborn through the table: on the deferred list, a new generation. */
    r = &port->records[again];
    CHECK(sn__rec_rekey(port, r, 3, SN_EVENT_IN, SN_TRIGGER_LEVEL) == 1);
    CHECK(sn__rebirth(port, again) == 1);
    CHECK(r->state == SN_REC_ENABLED && r->user_key == 3 && r->generation == 3);
    CHECK(port->deferred_count == 1 && port->deferred_recnos[0] == again);
    /* A rebirth of a live record is refused (it stays as it was, and is
       not put on the deferred list twice). */
    CHECK(sn__rebirth(port, again) == 0 && refused == 1);
    CHECK(r->state == SN_REC_ENABLED && r->generation == 3 && port->deferred_count == 1);
    refused = 0;
    sn__record_retire(port, again);
    CHECK(refused == 0 && port->live_count == 0);
    sn_mutex_unlock(&port->lock);
    CHECK(sn_port_close(handle) == 0);
    sn_port_free(handle);
}

int main(void) {
    int error = -1;
    sn_port_t *handle = sn_port_open(SN_BACKEND_AUTO, &error);
    CHECK(handle != NULL);
    if (handle == NULL)
        return 1;
    P = sn__layer(handle);
    P->batch_serial = 7;
    sn__transition_hook = count_refusal;
    test_table();
    test_fields();
    test_table_functions();
    sn_port_close(handle);
    sn_port_free(handle);
    if (failures != 0) {
        fprintf(stderr, "test_record_states: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_record_states: ok\n");
    return 0;
}
