/*
 * sn_record.h -- a port record and its state machine: the one place that
 * writes a record's state and the facts beside it. Internal to the port
 * layer's files (backends never see a record); cffi never sees it.
 * Everything here is called with the port's lock held.
 *
 * A record is what the port keeps about one registered socket: the
 * caller's key, the filter and trigger of its last ENABLE, the generation
 * that stamps its kernel keys, and its state. Every change of state is
 * one of the functions below, and each checks the state it starts from in
 * every build (a bit test against the set of states it may start from,
 * as mio's state machines check theirs): a transition from a state it
 * does not start from is refused -- the record is left as it was, the
 * function returns 0, the port's SN_COUNT_REFUSED counter counts it
 * (Port.counters()["refused"]) and the caller turns it into an error code
 * for the change that asked for it. In the checked build
 * (SN_CHECK_TRANSITIONS: the sanitizer run, tools/wine --check-transitions)
 * a refusal also aborts with its name, the state and the line, or goes to
 * a test's hook.
 *
 * Where the input comes from outside -- a caller's change, a kernel
 * event -- the callers check the state first and answer with an error code
 * (sn_translate.c: SN_ERROR_NOT_REGISTERED for a REMOVE of a record that
 * is not live) or drop the event (sn_run.c: a REMOVE event for a record
 * that is not removing is not ours to end). A refused transition is
 * therefore always a fault of the port's own code, never of its input.
 *
 * The states and their transitions are tabulated in docs/design.md ("The
 * record in the C core"); tests/c/test_record_states.c walks that table,
 * every legal transition taken and every illegal one refused. The model
 * is the one the AFD polyfill's sockets follow (sn_afd_sock.c), as do
 * wepoll's sockets (SOCK__POLL_IDLE, _PENDING, _CANCELLED) and mio's
 * (SockPollStatus): named states, every transition checked.
 *
 * Five facts about a record are not states, because they are orthogonal
 * to them; each is written here only, by the functions named:
 *   in_kernel  the kernel holds a registration for the record (its last
 *              ENABLE succeeded and no DISABLE has taken it away since:
 *              sn__rec_held). The next ENABLE renews it, and must fail if
 *              the socket it was made for is gone; without it the ENABLE
 *              makes one;
 *   quiet      how a removal ends: its REMOVE event is not reported
 *              (sn__rec_remove, sn__rec_rekey);
 *   unheard    a FIRED record's delivery reported nothing to the caller
 *              (sn__rec_fire, sn__rec_heard: see sn_run.c, sn__deliver);
 *   batch      the batch being translated carries an ENABLE of the record,
 *              at batch_slot (sn__rec_enable): at most one ENABLE per
 *              registration goes to the kernel per call, a second one in
 *              the batch merging into it (sn__rec_merge), since a kernel
 *              may refuse an ENABLE of a registration it holds armed;
 *              a DISABLE, REMOVE or re-key of it in the batch ends the
 *              mark, so an ENABLE after one goes to the kernel on its own;
 *   ident      what the socket was when its registration was made
 *              (sn__rec_identify; the backends whose kernel cannot refuse
 *              to renew a registration for a socket that took a closed
 *              one's handle value: see sn_rearm.h, sn__socket_gone).
 */
#ifndef SN_RECORD_H
#define SN_RECORD_H

#include "sn_layer.h"

#include <string.h>

/* The states of a record. The first three are "live": the registration is
   the caller's, and changes to it are accepted. */
typedef enum sn_rstate {
    /* The record number is free; `generation` is the one its next record
       will carry, so no key issued before matches it. */
    SN_REC_FREE = 0,
    /* Live, its last change an ENABLE (accepted, or on its way to the
       kernel): what the kernel reports is passed on. */
    SN_REC_ENABLED = 1,
    /* Live, a one-shot registration that was delivered: the kernel has
       disarmed it, and it is on the re-arm list, so that the next
       SN_PROCESS_REARM call enables it again (and it turns ENABLED). */
    SN_REC_FIRED = 2,
    /* Live, its last change a DISABLE (applied, or on its way): nothing is
       reported until the next ENABLE, not even what the kernel queued
       before ("notifications that have already been queued might still
       be delivered"). */
    SN_REC_DISABLED = 3,
    /* A REMOVE was accepted; the record waits for its REMOVE event (loud:
       reported to the caller; quiet: not), after which it is retired.
       Nothing else is reported for it. On epoll a quiet REMOVE retires the
       record as soon as it succeeds, and the record is never seen here. */
    SN_REC_REMOVING = 4,
    /* Removing, and an ENABLE waits in the record (next_key, next_events,
       next_trigger) for the REMOVE event: one kernel key per socket
       (SN_CAP_KEY_FIXED), so the ENABLE may only go to the kernel under a
       new key once the old one is done. At the REMOVE event (or at once,
       if the REMOVE failed: the socket was closed) the record is reborn
       under a new generation and turns ENABLED, its ENABLE on the
       deferred list. */
    SN_REC_REKEYING = 5,
} sn_rstate_t;

#define SN_REC_STATES 6

/* Sets of states, for the preconditions (bit i: state i). */
#define SN_REC_BIT(state)   (1u << (state))
#define SN_REC_ANY_LIVE \
    (SN_REC_BIT(SN_REC_ENABLED) | SN_REC_BIT(SN_REC_FIRED) | SN_REC_BIT(SN_REC_DISABLED))
#define SN_REC_ANY_REMOVING (SN_REC_BIT(SN_REC_REMOVING) | SN_REC_BIT(SN_REC_REKEYING))
#define SN_REC_ANY_USED     (SN_REC_ANY_LIVE | SN_REC_ANY_REMOVING)

/* A registration record: one per registered socket. */
typedef struct sn_record {
    uint64_t socket;
    uint64_t user_key;
    uint32_t generation;  /* bumped each time the record number is freed */
    uint16_t events;      /* the event filter of the last ENABLE */
    uint8_t  trigger;     /* the trigger flags of the last ENABLE */
    uint8_t  state;       /* sn_rstate_t */
    uint8_t  in_kernel;   /* the kernel holds its registration (see above) */
    uint8_t  quiet;       /* REMOVING/REKEYING: the REMOVE event is not reported */
    uint8_t  unheard;     /* FIRED by a notification none of whose events
                             were reported (sn_run.c, sn__deliver) */
    uint8_t  next_trigger;  /* REKEYING: the ENABLE that waits */
    uint16_t next_events;
    /* The batch being translated that carries an ENABLE of this record
       (the port's batch_serial then; 0: none), and that ENABLE's index in
       it: a second ENABLE in the batch merges into it (sn__rec_merge). */
    uint32_t batch;
    uint32_t batch_slot;
    uint64_t next_key;
    sn_identity_t ident;  /* what the socket was when armed (the backends
                             with an identify op: sn_translate.c) */
} sn_record_t;

/* Readers of the state, for the decisions outside this file. */
SN_INLINE int sn__rec_live(const sn_record_t *r) {
    return (unsigned)r->state - SN_REC_ENABLED < 3u;
}
SN_INLINE int sn__rec_removing(const sn_record_t *r) {
    return r->state >= SN_REC_REMOVING;
}

/* The names of the states, for the reports of a refusal and for tests
   (sn_table.c). */
const char *sn__rec_state_name(unsigned state);

/* A transition asked of a record in a state it does not start from
   (sn_table.c): counted in the port's SN_COUNT_REFUSED; in the checked
   build also printed with what and where, and the process aborted --
   unless a test has set the hook, which is then called instead. Returns
   0, what a refused transition returns. */
int sn__transition_refused(sn_layer_t *port, const char *transition, unsigned state,
                           const char *file, int line);
#ifdef SN_CHECK_TRANSITIONS
extern void (*sn__transition_hook)(const char *transition, unsigned state);
#endif

/* Whether record `r` may take `transition` from its state (1), or the
   refusal (0), counted and reported. */
#define SN_REC_EXPECT(port, r, allowed, transition) \
    ((SN_REC_BIT((r)->state) & (allowed)) != 0 || \
     sn__transition_refused((port), (transition), (r)->state, __FILE__, __LINE__))

/* Every transition below returns 1 when taken, 0 when refused (the record
   then as it was). */

SN_INLINE void sn__rec_bump_generation(sn_record_t *r) {
    r->generation = (r->generation + 1) & 0x7fffffffu;
    if (r->generation == 0)
        r->generation = 1;   /* no kernel key is ever 0 */
}

/* FREE -> ENABLED: a new registration, its ENABLE about to go to the
   kernel (the kernel holds nothing yet). */
SN_INLINE int sn__rec_open(sn_layer_t *port, sn_record_t *r, uint64_t socket,
                           uint64_t user_key) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_FREE), "open"))
        return 0;
    r->socket = socket;
    r->user_key = user_key;
    r->state = SN_REC_ENABLED;
    r->in_kernel = 0;
    r->quiet = 0;
    r->unheard = 0;
    r->batch = 0;
    memset(&r->ident, 0, sizeof r->ident);
    return 1;
}

/* live -> ENABLED: the caller's ENABLE accepted, with its filter, at
   index `slot` of the batch being translated (the port's batch_serial). */
SN_INLINE int sn__rec_enable(sn_layer_t *port, sn_record_t *r, uint16_t events,
                             uint8_t trigger, uint32_t slot) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_LIVE, "enable"))
        return 0;
    r->events = events;
    r->trigger = trigger;
    r->state = SN_REC_ENABLED;
    r->batch = port->batch_serial;
    r->batch_slot = slot;
    return 1;
}

/* ENABLED, enabled in this batch already: a second ENABLE of it in the
   same batch becomes the first's filter and trigger (the caller merges
   the kernel registration). From any other state, or with no ENABLE of
   it in this batch, refused. */
SN_INLINE int sn__rec_merge(sn_layer_t *port, sn_record_t *r, uint16_t events,
                            uint8_t trigger) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_ENABLED), "merge"))
        return 0;
    if (r->batch != port->batch_serial || r->batch == 0)
        return sn__transition_refused(port, "merge", r->state, __FILE__, __LINE__);
    r->events = events;
    r->trigger = trigger;
    return 1;
}

/* ENABLED -> FIRED: a one-shot delivery disarmed the kernel's
   registration; the caller has put the record number on the re-arm list.
   `unheard`: nothing of the delivery was reported (sn_run.c). */
SN_INLINE int sn__rec_fire(sn_layer_t *port, sn_record_t *r, int unheard) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_ENABLED), "fire"))
        return 0;
    r->state = SN_REC_FIRED;
    r->unheard = (uint8_t)(unheard != 0);
    return 1;
}

/* FIRED, the fact `unheard` cleared: a later notification under its key
   was reported for it (sn_run.c). */
SN_INLINE int sn__rec_heard(sn_layer_t *port, sn_record_t *r) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_FIRED), "heard"))
        return 0;
    r->unheard = 0;
    return 1;
}

/* FIRED -> ENABLED: the port's own re-arm is on its way. */
SN_INLINE int sn__rec_rearm(sn_layer_t *port, sn_record_t *r) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_FIRED), "rearm"))
        return 0;
    r->state = SN_REC_ENABLED;
    return 1;
}

/* live -> DISABLED: the caller's DISABLE accepted. */
SN_INLINE int sn__rec_disable(sn_layer_t *port, sn_record_t *r) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_LIVE, "disable"))
        return 0;
    r->state = SN_REC_DISABLED;
    r->batch = 0;
    return 1;
}

/* live -> REMOVING: the caller's REMOVE accepted; `quiet`: its REMOVE
   event is not reported. */
SN_INLINE int sn__rec_remove(sn_layer_t *port, sn_record_t *r, int quiet) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_LIVE, "remove"))
        return 0;
    r->state = SN_REC_REMOVING;
    r->quiet = (uint8_t)(quiet != 0);
    r->batch = 0;
    return 1;
}

/* live -> REKEYING: an ENABLE under another caller key for a live record,
   where the kernel keeps a socket's key: a quiet REMOVE of the port's own
   goes to the kernel, and the ENABLE waits for its REMOVE event. */
SN_INLINE int sn__rec_rekey(sn_layer_t *port, sn_record_t *r, uint64_t key,
                            uint16_t events, uint8_t trigger) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_LIVE, "rekey"))
        return 0;
    r->state = SN_REC_REKEYING;
    r->quiet = 1;
    r->next_key = key;
    r->next_events = events;
    r->next_trigger = trigger;
    r->batch = 0;
    return 1;
}

/* REMOVING or REKEYING -> REKEYING: an ENABLE for a record whose REMOVE
   is on its way waits in it for the REMOVE event (replacing one that
   waited already). */
SN_INLINE int sn__rec_wait(sn_layer_t *port, sn_record_t *r, uint64_t key,
                           uint16_t events, uint8_t trigger) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_REMOVING, "wait"))
        return 0;
    r->state = SN_REC_REKEYING;
    r->next_key = key;
    r->next_events = events;
    r->next_trigger = trigger;
    return 1;
}

/* REKEYING -> REMOVING: the ENABLE that waited is taken back (its owner
   removed it, or the call that brought it failed as a whole); the kernel
   never heard of it. */
SN_INLINE int sn__rec_take_back(sn_layer_t *port, sn_record_t *r) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_REKEYING), "take_back"))
        return 0;
    r->state = SN_REC_REMOVING;
    return 1;
}

/* used -> `before` (a live state): a change that was not applied ("no
   changes occurred") puts the record back as it was before it. A REMOVE
   undone ends the removal; an ENABLE that waited in the record meanwhile
   goes with it (its owner hears of the error). Back to FIRED only with
   the record number on the re-arm list again (the caller's part), else
   to ENABLED. */
SN_INLINE int sn__rec_restore(sn_layer_t *port, sn_record_t *r, uint8_t before) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_USED, "restore"))
        return 0;
    r->state = (SN_REC_BIT(before) & SN_REC_ANY_LIVE) ? before : SN_REC_ENABLED;
    r->quiet = 0;
    return 1;
}

/* The fact "the kernel holds a registration" (not a state: see above),
   set when an ENABLE succeeded, cleared when a DISABLE took the
   registration away. Any used record: the verdict may come back after
   another thread changed the record. */
SN_INLINE int sn__rec_held(sn_layer_t *port, sn_record_t *r, int held) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_USED, "held"))
        return 0;
    r->in_kernel = (uint8_t)(held != 0);
    return 1;
}

/* Whether `now` is another socket than the one `was` describes: a fact
   known in both that differs, or a bound socket that is bound no more (a
   socket never unbinds) -- where `now` could read its addresses at all:
   what the OS would not say is unknown, never "another socket". A peer
   counts for stream sockets only (a datagram socket may connect
   elsewhere), and only where both know it (a reset connection may forget
   its peer). The local address is left out: a wildcard bind reads as the
   interface chosen once connected. */
SN_INLINE int sn__identity_differs(const sn_identity_t *was, const sn_identity_t *now) {
    if (was->kind != 0 && now->kind != 0 && was->kind != now->kind)
        return 1;
    if (now->addressed && was->local_port != 0 && was->local_port != now->local_port)
        return 1;
    return was->peer != 0 && now->peer != 0 && was->peer != now->peer;
}

/* The fact "what the socket is" (not a state), read when an ENABLE that
   adds a registration is prepared (`merge` 0: replaced), and again at
   each renewal that found the same socket (`merge` 1: what is known now
   added to what was, so a socket that connected since is told by its
   peer from then on). Any used record. */
SN_INLINE int sn__rec_identify(sn_layer_t *port, sn_record_t *r, const sn_identity_t *now,
                               int merge) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_USED, "identify"))
        return 0;
    if (!merge) {
        r->ident = *now;
        return 1;
    }
    if (now->kind != 0)
        r->ident.kind = now->kind;
    if (now->local_port != 0)
        r->ident.local_port = now->local_port;
    if (now->peer != 0)
        r->ident.peer = now->peer;
    r->ident.addressed |= now->addressed;
    return 1;
}

/* used -> FREE: the record number is freed (the caller updates the table),
   and the generation moves on, so every kernel key the record issued is
   stale from now on. */
SN_INLINE int sn__rec_free(sn_layer_t *port, sn_record_t *r) {
    if (!SN_REC_EXPECT(port, r, SN_REC_ANY_USED, "retire"))
        return 0;
    r->state = SN_REC_FREE;
    r->in_kernel = 0;
    r->quiet = 0;
    r->batch = 0;
    sn__rec_bump_generation(r);
    return 1;
}

/* REKEYING -> ENABLED: the REMOVE event came (or the REMOVE failed: the
   socket is gone), so the ENABLE that waited becomes the registration,
   under a new generation; the kernel holds nothing for it yet, and the
   caller puts the record number on the deferred list. */
SN_INLINE int sn__rec_reborn(sn_layer_t *port, sn_record_t *r) {
    if (!SN_REC_EXPECT(port, r, SN_REC_BIT(SN_REC_REKEYING), "reborn"))
        return 0;
    sn__rec_bump_generation(r);
    r->state = SN_REC_ENABLED;
    r->user_key = r->next_key;
    r->events = r->next_events;
    r->trigger = r->next_trigger;
    r->in_kernel = 0;
    r->quiet = 0;
    r->batch = 0;
    /* Perhaps another socket (a value reused after closesocket()): read
       again when its ENABLE is prepared. */
    memset(&r->ident, 0, sizeof r->ident);
    return 1;
}

#endif /* SN_RECORD_H */
