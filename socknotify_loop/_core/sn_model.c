/*
 * sn_model.c -- the "strict" backend: ProcessSocketNotifications as
 * Microsoft documents it, at its least forgiving, for tests.
 *
 * Why it exists. The psn backend calls the OS's own function, which no
 * machine here has (Wine does not export it); every Windows test runs on
 * the AFD polyfill, and the polyfill is kinder than the documented API.
 * A green suite on it says nothing about the rules below. This model sits
 * between the port code (sn_iocp.c, which calls it through the same
 * pointer as the OS's function) and the polyfill, with the same signature,
 * and makes each documented rule bite, choosing the harshest reading
 * wherever Microsoft's text allows more than one:
 *
 *   1. Keys. "A socket may be registered with an I/O completion port only
 *      once. To change completion keys, deregister the notification, wait
 *      for the SOCK_NOTIFY_EVENT_REMOVE message, and then re-register the
 *      socket." The model keeps the key of a socket's first ENABLE for
 *      every later ENABLE, until as many REMOVE events as REMOVEs applied
 *      have been dequeued. An ENABLE that comes before that (in the same
 *      batch as the REMOVE, or in a later call) re-enables the socket
 *      under the OLD key.
 *   2. Refusals. Only sockets of Microsoft's providers, and one completion
 *      port per socket: the model refuses an ENABLE of a socket still tied
 *      to another port (ERROR_INVALID_PARAMETER, what CreateIoCompletion-
 *      Port answers for a handle associated already), and of any socket a
 *      test names (sn_model_control SN_MODEL_REFUSE: WSAEOPNOTSUPP, as for
 *      a layered provider). A refusal, like every result, is known only
 *      after the call's wait: it never shortens it.
 *   3. "Notifications that have already been queued might still be
 *      delivered" after a DISABLE or REMOVE: the model queues one, for an
 *      armed registration whose socket is ready at that moment, before
 *      the operation takes effect.
 *   4. "The entire operation failed, and no changes occurred": a call a
 *      test told to fail (SN_MODEL_FAIL_CALLS) returns an error and applies
 *      nothing; so does a call with an invalid argument.
 *   5. ENABLE needs LEVEL or EDGE: ONESHOT or PERSISTENT alone is refused
 *      with ERROR_INVALID_PARAMETER.
 *   6. Edge: one notification per rising edge, and the state at ENABLE
 *      counts as already risen ("only changes after enabling"). A
 *      condition reported stays "high" until the model sees it false (it
 *      looks, with a zero-timeout WSAPoll, at the start of every call);
 *      until then nothing more is reported for it, however much data
 *      arrives. A reader that does not drain to WSAEWOULDBLOCK before its
 *      next call therefore hears nothing more: what the article warns of.
 *   7. Port close: registrations end with the port, but the socket stays
 *      tied to the dead port unless it was REMOVEd first; the next port
 *      is refused (rule 2). Closing the socket unties it.
 *
 * Modes (SN_MODEL_MODE_*, per port, from SOCKNOTIFY_STRICT_MODES or
 * sn_model_control SN_MODEL_MODES), each a reading the text allows and the
 * port must survive: a handle that is no socket fails the whole call
 * ("can fail ... due to invalid input such as a bad handle"); the wait is
 * a plain GetQueuedCompletionStatusEx, as the OS's is, so the polyfill's
 * packets for the sockets the port's fallback serves reach the port
 * untranslated; a timeout is ERROR_TIMEOUT, as one reference page says;
 * DISABLE, like ENABLE, wants LEVEL or EDGE; a registration ended by
 * closesocket() leaves a notification queued under its key ("already-
 * queued notifications might still be delivered"), seen when the model
 * meets the closed handle again; a socket's first ENABLE associates the
 * socket's handle with the port, as the reference page's "associates a set
 * of sockets with a completion port" may mean, with CreateIoCompletionPort
 * itself: a handle associated with another port already (overlapped I/O,
 * a ProactorEventLoop) is refused as CreateIoCompletionPort refuses it, and
 * the association outlives the REMOVE ("the handle remains associated with
 * that I/O completion port until it is closed"), so a later port is
 * refused too and the socket's own overlapped I/O completes on this port
 * under the registration's key. "harshest" is all of them.
 *
 * How. A process-wide table of model registrations (socket -> port serial,
 * first key, filter, trigger, edge state, REMOVEs outstanding), under one
 * lock. Registrations are applied to the polyfill in a register-only call
 * with that lock held, so the table and the polyfill change together and
 * other threads see either both or neither; the wait is a second polyfill
 * call, without the lock, and its entries are filtered on the way out
 * (REMOVE bookkeeping, edges). Edge registrations reach the polyfill as
 * LEVEL|ONESHOT with the filter minus what is high, re-enabled by the
 * model when a bit falls. A socket value reused after closesocket() is
 * told from the socket registered under it by its address (getsockname),
 * its peer's address (getpeername) and its type, and a handle that is no
 * longer a socket ends its model registration, as closesocket() ends the
 * OS's.
 *
 * The controls. A test steers the model through sn_model_control (rules 2
 * and 4 on demand, and what the model holds for a socket). It lives here,
 * with the state it reads and writes; it reaches the model's state for a
 * port from the port's completion port handle, the one thing the model
 * knows a port by (the backend's os_handle), so it needs nothing of the
 * port code's own structures (sn_iocp.c).
 *
 * The backend. The strict backend's ops table is this file's too: the
 * port code of sn_iocp.c (sn_iocp_fn.h's entries) on this function. So a
 * production build, which compiles this file to nothing (SN_TESTING
 * undefined), has no strict backend, no model and no controls, and the
 * port code has no branch of theirs.
 *
 * Waiting again. A wait whose every entry the model filtered out (edges
 * already high) is waited again for the time left, counted with the
 * core's one deadline arithmetic (sn_deadline, sn_time_left: sn_platform.h),
 * on the same clock as the port's retry and the polyfill's.
 *
 * What the model cannot know is what Windows really does where the text
 * is silent; `python -m socknotify_loop --probe-os` asks the OS on a
 * machine that has the function and prints its answers beside these.
 *
 * Sources read: Microsoft's article "Winsock socket state notifications"
 * with its C samples, and the reference pages of ProcessSocketNotifications,
 * SOCK_NOTIFY_REGISTRATION and CreateIoCompletionPort.
 */
#if defined(_WIN32) && defined(SN_TESTING)

#include "sn_internal.h"
#include "sn_win.h"
#include "sn_afd.h"
#include "sn_iocp_fn.h"

#include <stdlib.h>
#include <string.h>

#define MODEL_REFUSED_MAX 64
#define MODEL_STACK_REGS 64
/* Waits of a zero-timeout plain wait that dequeued only the model's own
   packets (the polyfill's AFD_POLL_ONLY_ROUNDS, for the same reason). */
#define MODEL_POLL_ROUNDS 4

/* In a notification the model queues itself ("queued before" an
   operation, SN_MODEL_QUEUE, a closed socket's): the model's wait hands it
   on as it was queued, without the bookkeeping of a delivery, and strips
   the bit. Event masks fit in a byte. */
#define MODEL_QUEUED 0x10000u

/* The errors the model answers with (see the essay). */
#define MODEL_ERR_TIED      ERROR_INVALID_PARAMETER
#define MODEL_ERR_PROVIDER  WSAEOPNOTSUPP
#define MODEL_ERR_CALL      ERROR_NO_SYSTEM_RESOURCES
#define MODEL_ERR_ARMED     ERROR_INVALID_PARAMETER

enum { MODEL_LIVE = 1, MODEL_REMOVING = 2 };

typedef struct model_port {
    HANDLE iocp;
    uint32_t serial;          /* a port HANDLE value is reused; this is not */
    uint32_t fail_calls;      /* SN_MODEL_FAIL_CALLS */
    uint32_t modes;           /* SN_MODEL_MODE_* */
    uint8_t hold;             /* SN_MODEL_HOLD: the next call carrying this operation
                                 (SOCK_NOTIFY_OP_ENABLE or _REMOVE) waits; 0: none */
    uint8_t holding;          /* ... and such a call is waiting now */
    struct model_port *next;
} model_port_t;

typedef struct model_reg {
    SOCKET socket;
    uint32_t serial;          /* the port it is tied to */
    int port_alive;           /* 0 once that port closed */
    ULONG_PTR key;            /* the key of the first ENABLE */
    uint16_t filter;
    uint8_t trigger;
    uint8_t state;            /* MODEL_* */
    uint8_t armed;            /* enabled, not disabled, not fired one-shot */
    uint8_t high;             /* edge: reported and not yet seen false */
    uint8_t edge_dirty;       /* edge: the polyfill's filter must change */
    uint32_t removes;         /* REMOVEs applied, REMOVE events not yet dequeued */
    struct sockaddr_storage name;   /* fingerprint: address, peer and type */
    int name_len;
    struct sockaddr_storage peer;
    int peer_len;
    int type;
} model_reg_t;

static SRWLOCK model__lock = SRWLOCK_INIT;
/* The model's registrations live in its own instance of the polyfill's
   state (SN_AFD_MODEL_COMPLETION_KEY), apart from the instance that serves
   the port's refused sockets: two registrations of one socket, the model's
   and the fallback's, are two, as the OS's and the polyfill's would be. */
static DWORD model__afd(SN_PSN_PARAMETERS) {
    return sn_afd_process_as(SN_AFD_MODEL_COMPLETION_KEY, SN_PSN_ARGUMENTS);
}

/* Where a call held by SN_MODEL_HOLD waits for its release. */
static CONDITION_VARIABLE model__released = CONDITION_VARIABLE_INIT;
/* socket -> its model_reg_t (the core's one hash table, sn_hash.h). */
static sn_hash_t model__table;
static model_port_t *model__ports;
static uint32_t model__serials;
/* SN_MODEL_MODE_TIES_SOCKET: socket -> the model_reg_t (fingerprint and
   port serial; nothing else used) of a socket the model associated with a
   port, which stays associated until the socket is closed. */
static sn_hash_t model__tied;
/* Sockets a test told the model to refuse, with their fingerprint: a
   value reused by another socket after closesocket() is not refused. */
static model_reg_t model__refused[MODEL_REFUSED_MAX];
static uint32_t model__refused_count;
/* Sockets whose SO_BSP_STATE a test says fails (SN_MODEL_HIDE_STATE). */
#define MODEL_HIDDEN_MAX 16
static SOCKET model__hidden[MODEL_HIDDEN_MAX];
static uint32_t model__hidden_count;

/* The modes a new port starts with: SOCKNOTIFY_STRICT_MODES, a number
   (C syntax: 0x1f) or "harshest"; none when unset. */
static uint32_t model__env_modes(void) {
    /* The process's environment block, not the C runtime's copy of it,
       which a mingw-w64 build does not see Python's os.environ change. */
    char text[64];
    DWORD n = GetEnvironmentVariableA("SOCKNOTIFY_STRICT_MODES", text, sizeof text);
    if (n == 0 || n >= sizeof text)
        return 0;
    if (strcmp(text, "harshest") == 0)
        return SN_MODEL_MODES_HARSHEST;
    return (uint32_t)strtoul(text, NULL, 0) & SN_MODEL_MODES_HARSHEST;
}

static model_port_t *model__port(HANDLE iocp, int create) {
    model_port_t *mp;
    for (mp = model__ports; mp != NULL; mp = mp->next)
        if (mp->iocp == iocp)
            return mp;
    if (!create)
        return NULL;
    mp = calloc(1, sizeof *mp);
    if (mp == NULL)
        return NULL;
    mp->iocp = iocp;
    mp->modes = model__env_modes();
    mp->serial = ++model__serials;
    mp->next = model__ports;
    model__ports = mp;
    return mp;
}

/* The live port with this serial, or NULL (model lock held). */
static model_port_t *model__port_of(uint32_t serial) {
    model_port_t *mp;
    for (mp = model__ports; mp != NULL; mp = mp->next)
        if (mp->serial == serial)
            return mp;
    return NULL;
}

static model_reg_t *model__find(SOCKET s) {
    return (model_reg_t *)(uintptr_t)sn_hash_get(&model__table, (uint64_t)s);
}

/* Every registration in turn: start with *pos = 0; NULL after the last.
   Dropping the one returned before the next call is allowed. */
static model_reg_t *model__next(uint32_t *pos) {
    return (model_reg_t *)(uintptr_t)sn_hash_next(&model__table, pos);
}

static model_reg_t *model__find_key(uint32_t serial, ULONG_PTR key) {
    uint32_t pos = 0;
    model_reg_t *r;
    while ((r = model__next(&pos)) != NULL)
        if (r->serial == serial && r->port_alive && r->key == key)
            return r;
    return NULL;
}

static void model__drop(model_reg_t *dead) {
    sn_hash_del(&model__table, (uint64_t)dead->socket, (uint64_t)(uintptr_t)dead);
    free(dead);
}

static int model__is_socket(SOCKET s, int *type) {
    int len = sizeof *type;
    *type = 0;
    return getsockopt(s, SOL_SOCKET, SO_TYPE, (char *)type, &len) == 0;
}

/* The socket's type, address and peer address. The address alone does not
   tell a reused handle value from the socket that had it: one end of a
   loopback pair has the listener's address, and a listener bound to port 0
   often gets the same port as the last one closed (Linux does, under
   Wine), so two pairs made one after the other can share handle values
   and addresses. The peer's address (the other end's ephemeral port)
   differs. */
static void model__fingerprint(SOCKET s, struct sockaddr_storage *name, int *name_len,
                               struct sockaddr_storage *peer, int *peer_len, int *type) {
    int len = (int)sizeof *name;
    memset(name, 0, sizeof *name);
    memset(peer, 0, sizeof *peer);
    model__is_socket(s, type);
    *name_len = getsockname(s, (struct sockaddr *)name, &len) == 0 ? len : 0;
    len = (int)sizeof *peer;
    *peer_len = getpeername(s, (struct sockaddr *)peer, &len) == 0 ? len : 0;
}

/* Whether the registration still names the socket it was made for: the
   handle is a socket, of the same type, at the same address (a socket
   unbound when registered cannot be told apart: the strict answer is yes). */
static int model__same_socket(const model_reg_t *r) {
    struct sockaddr_storage name, peer;
    int name_len, peer_len, type;
    model__fingerprint(r->socket, &name, &name_len, &peer, &peer_len, &type);
    if (type == 0 || type != r->type)
        return 0;
    if (r->name_len == 0)
        return 1;
    if (name_len != r->name_len || memcmp(&name, &r->name, (size_t)name_len) != 0)
        return 0;
    /* A peer known then and now must be the same one. A socket connected
       since its registration, or whose connection has ended, cannot be told
       apart by it: the strict answer is again yes. */
    if (r->peer_len == 0 || peer_len == 0)
        return 1;
    return peer_len == r->peer_len && memcmp(&peer, &r->peer, (size_t)peer_len) == 0;
}

static void model__unrefuse(SOCKET s) {
    uint32_t i;
    for (i = 0; i < model__refused_count; i++) {
        if (model__refused[i].socket == s) {
            model__refused[i] = model__refused[--model__refused_count];
            return;
        }
    }
}

static int model__is_refused(SOCKET s) {
    uint32_t i;
    for (i = 0; i < model__refused_count; i++) {
        if (model__refused[i].socket != s)
            continue;
        if (model__same_socket(&model__refused[i]))
            return 1;
        model__unrefuse(s);     /* closed, and the value reused */
        return 0;
    }
    return 0;
}

/* The SOCK_NOTIFY_EVENT_* conditions true now, among `filter`. */
static uint8_t model__ready(SOCKET s, uint16_t filter) {
    WSAPOLLFD fd;
    uint8_t bits = 0;
    fd.fd = s;
    fd.events = 0;
    if (filter & SOCK_NOTIFY_EVENT_IN)
        fd.events |= POLLRDNORM;
    if (filter & SOCK_NOTIFY_EVENT_OUT)
        fd.events |= POLLWRNORM;
    fd.revents = 0;
    if (WSAPoll(&fd, 1, 0) <= 0)
        return 0;
    if (fd.revents & POLLRDNORM)
        bits |= SOCK_NOTIFY_EVENT_IN;
    if (fd.revents & POLLWRNORM)
        bits |= SOCK_NOTIFY_EVENT_OUT;
    if ((fd.revents & POLLHUP) && (filter & SOCK_NOTIFY_EVENT_HANGUP))
        bits |= SOCK_NOTIFY_EVENT_HANGUP;
    return bits;
}

static int model__is_edge(const model_reg_t *r) {
    return (r->trigger & SOCK_NOTIFY_TRIGGER_EDGE) != 0;
}

/* What the polyfill is asked to watch for a registration. */
static void model__poly_enable(const model_reg_t *r, SOCK_NOTIFY_REGISTRATION *out) {
    out->socket = r->socket;
    out->completionKey = (PVOID)r->key;
    out->operation = SOCK_NOTIFY_OP_ENABLE;
    out->registrationResult = 0;
    if (model__is_edge(r)) {
        out->eventFilter = (UINT16)(r->filter & ~r->high);
        out->triggerFlags = SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_ONESHOT;
    } else {
        out->eventFilter = r->filter;
        out->triggerFlags = r->trigger;
    }
}

/* ENABLE's argument rules (rule 5 among them). */
static DWORD model__check_enable(const SOCK_NOTIFY_REGISTRATION *reg) {
    UINT8 t = reg->triggerFlags;
    if (reg->eventFilter & ~SN_NOTIFY_FILTER_ALL)
        return ERROR_INVALID_PARAMETER;
    if (t & ~(SOCK_NOTIFY_TRIGGER_ONESHOT | SOCK_NOTIFY_TRIGGER_PERSISTENT |
              SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE))
        return ERROR_INVALID_PARAMETER;
    if ((t & SOCK_NOTIFY_TRIGGER_ONESHOT) && (t & SOCK_NOTIFY_TRIGGER_PERSISTENT))
        return ERROR_INVALID_PARAMETER;
    if (!(t & (SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE)) ||
        ((t & SOCK_NOTIFY_TRIGGER_LEVEL) && (t & SOCK_NOTIFY_TRIGGER_EDGE)))
        return ERROR_INVALID_PARAMETER;
    return 0;
}

/* SN_MODEL_MODE_TIES_SOCKET, at a socket's first ENABLE (model lock
   held): associate its handle with the port under the registration's key,
   as CreateIoCompletionPort does, unless the model did so for this port
   already (the association outlives a REMOVE). Returns 0, or the error
   CreateIoCompletionPort gives for a handle associated with another port
   (ERROR_INVALID_PARAMETER under Wine, whose server refuses a second
   association with STATUS_INVALID_PARAMETER). */
static DWORD model__tie(HANDLE iocp, const model_port_t *mp,
                        const SOCK_NOTIFY_REGISTRATION *reg) {
    model_reg_t *t = (model_reg_t *)(uintptr_t)sn_hash_get(&model__tied,
                                                           (uint64_t)reg->socket);
    if (t != NULL && model__same_socket(t) && t->serial == mp->serial)
        return 0;
    if (CreateIoCompletionPort((HANDLE)reg->socket, iocp, (ULONG_PTR)reg->completionKey, 0) ==
        NULL) {
        DWORD error = GetLastError();
        return error != 0 ? error : MODEL_ERR_TIED;
    }
    /* Tied now: remember it (over a closed socket's entry for the value). */
    if (t == NULL) {
        if (sn_hash_reserve(&model__tied) != 0 || (t = calloc(1, sizeof *t)) == NULL)
            return 0;     /* tied, unremembered: a later ENABLE here is refused */
        sn_hash_put(&model__tied, (uint64_t)reg->socket, (uint64_t)(uintptr_t)t);
    }
    memset(t, 0, sizeof *t);
    t->socket = reg->socket;
    t->serial = mp->serial;
    model__fingerprint(t->socket, &t->name, &t->name_len, &t->peer, &t->peer_len, &t->type);
    return 0;
}

/* A registration closesocket() ended (model lock held). In
   SN_MODEL_MODE_STALE_AFTER_CLOSE an armed one leaves a notification
   queued under its key, as one queued just before the close would be:
   the port must not hand it to whoever registers the value next. */
static void model__closed(HANDLE iocp, model_port_t *mp, model_reg_t *r) {
    if ((mp->modes & SN_MODEL_MODE_STALE_AFTER_CLOSE) && r->serial == mp->serial &&
        r->port_alive && r->armed && r->state == MODEL_LIVE)
        PostQueuedCompletionStatus(iocp, MODEL_QUEUED | (r->filter & (SOCK_NOTIFY_EVENT_IN |
                                                                      SOCK_NOTIFY_EVENT_OUT)),
                                   r->key, NULL);
    model__drop(r);
}

/* A registration another port's ENABLE overwrote (model lock held): the
   polyfill forgets it at its port, if that port lives (quietly: its port
   drops a REMOVE event it did not ask for), and the model drops it. */
static void model__overwritten(model_reg_t *r) {
    model_port_t *holder = r->port_alive ? model__port_of(r->serial) : NULL;
    if (holder != NULL) {
        SOCK_NOTIFY_REGISTRATION gone;
        memset(&gone, 0, sizeof gone);
        gone.socket = r->socket;
        gone.completionKey = (PVOID)r->key;
        gone.operation = SOCK_NOTIFY_OP_REMOVE;
        model__afd(holder->iocp, 1, &gone, 0, 0, NULL, NULL);
    }
    model__drop(r);
}

/* ENABLE of a socket the model holds no registration of (model lock
   held): a new one, under the caller's key, once the polyfill has taken
   it. `high`: the edge bits already risen. Sets *out to the new
   registration; returns 0, or the error the ENABLE fails with. */
static DWORD model__enable_new(HANDLE iocp, const model_port_t *mp,
                               const SOCK_NOTIFY_REGISTRATION *reg, uint8_t high,
                               model_reg_t **out) {
    SOCK_NOTIFY_REGISTRATION poly = *reg;
    model_reg_t *r;
    DWORD error;
    r = calloc(1, sizeof *r);
    if (r == NULL)
        return ERROR_NOT_ENOUGH_MEMORY;
    r->socket = reg->socket;
    r->serial = mp->serial;
    r->port_alive = 1;
    r->key = (ULONG_PTR)reg->completionKey;
    model__fingerprint(reg->socket, &r->name, &r->name_len, &r->peer, &r->peer_len,
                       &r->type);
    poly.completionKey = (PVOID)r->key;
    {
        /* Filled in only if the polyfill accepts. */
        model_reg_t probe = *r;
        probe.filter = reg->eventFilter;
        probe.trigger = reg->triggerFlags;
        probe.high = high;
        model__poly_enable(&probe, &poly);
    }
    /* Room in the table first: nothing may fail once the
       polyfill has the registration. */
    if ((error = (DWORD)sn_hash_reserve(&model__table)) == 0 &&
        (error = model__afd(iocp, 1, &poly, 0, 0, NULL,
                                                     NULL)) == 0)
        error = poly.registrationResult;
    if (error != 0) {
        free(r);
        return error;
    }
    sn_hash_put(&model__table, (uint64_t)r->socket, (uint64_t)(uintptr_t)r);
    *out = r;
    return 0;
}

/* ENABLE of a socket the model holds registration `r` of, at this port
   (model lock held). `high`: the edge bits already risen. Returns 0, or
   the error the ENABLE fails with. */
static DWORD model__enable_again(HANDLE iocp, const model_port_t *mp,
                                 const SOCK_NOTIFY_REGISTRATION *reg, const model_reg_t *r,
                                 uint8_t high) {
    SOCK_NOTIFY_REGISTRATION poly = *reg;
    DWORD error;
    /* Rule 1: whatever key the caller gives, the first one stays. */
    model_reg_t probe = *r;
    if ((mp->modes & SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED) && r->armed &&
        r->state == MODEL_LIVE)
        return MODEL_ERR_ARMED;
    if ((mp->modes & SN_MODEL_MODE_QUEUED_BEFORE_MODIFY) && r->armed &&
        r->state == MODEL_LIVE) {
        /* What an armed registration whose socket is ready has
           queued already stays queued: delivered after this
           ENABLE, with the events of the filter it replaces (the
           polyfill would filter a completed poll with the new). */
        uint8_t ready = model__ready(r->socket, r->filter);
        if (model__is_edge(r))
            ready &= (uint8_t)~r->high;
        if (ready != 0)
            PostQueuedCompletionStatus(iocp, MODEL_QUEUED | ready, r->key, NULL);
    }
    probe.filter = reg->eventFilter;
    probe.trigger = reg->triggerFlags;
    probe.high = high;
    model__poly_enable(&probe, &poly);
    if ((error = model__afd(iocp, 1, &poly, 0, 0, NULL,
                                                     NULL)) == 0)
        error = poly.registrationResult;
    return error;
}

/* An ENABLE (model lock held; `r`: the socket's registration, if the
   model holds one). */
static DWORD model__enable(HANDLE iocp, model_port_t *mp, const SOCK_NOTIFY_REGISTRATION *reg,
                           model_reg_t *r) {
    uint8_t high = 0;
    DWORD error;
    int type;
    if ((error = model__check_enable(reg)) != 0)
        return error;
    if (!model__is_socket(reg->socket, &type))
        return WSAENOTSOCK;
    if (model__is_refused(reg->socket))
        return MODEL_ERR_PROVIDER;
    if (r != NULL && (r->serial != mp->serial || !r->port_alive)) {
        if (!(mp->modes & SN_MODEL_MODE_ENABLE_OVERWRITES))
            return MODEL_ERR_TIED;
        /* "Re-registering ... overwrites the existing registration":
           the other port's registration ends, silently (its port
           hears nothing more of the socket), and this one begins --
           unless the socket's handle is associated with that port
           (SN_MODEL_MODE_TIES_SOCKET), which CreateIoCompletionPort
           refuses to undo. */
        if ((mp->modes & SN_MODEL_MODE_TIES_SOCKET) &&
            (error = model__tie(iocp, mp, reg)) != 0)
            return error;
        model__overwritten(r);
        r = NULL;
    }
    if (reg->triggerFlags & SOCK_NOTIFY_TRIGGER_EDGE)
        high = model__ready(reg->socket, reg->eventFilter);
    if (r == NULL && (mp->modes & SN_MODEL_MODE_TIES_SOCKET) &&
        (error = model__tie(iocp, mp, reg)) != 0)
        return error;
    if (r == NULL)
        error = model__enable_new(iocp, mp, reg, high, &r);
    else
        error = model__enable_again(iocp, mp, reg, r, high);
    if (error != 0)
        return error;
    r->filter = reg->eventFilter;
    r->trigger = reg->triggerFlags;
    r->high = high;
    r->edge_dirty = 0;
    r->armed = 1;
    r->state = MODEL_LIVE;
    return 0;
}

/* A DISABLE or a REMOVE (model lock held; `r`: the socket's registration,
   if the model holds one). */
static DWORD model__disable(HANDLE iocp, model_port_t *mp, const SOCK_NOTIFY_REGISTRATION *reg,
                            model_reg_t *r) {
    SOCK_NOTIFY_REGISTRATION poly = *reg;
    DWORD error;
    int type;
    if (reg->operation == SOCK_NOTIFY_OP_DISABLE &&
        (mp->modes & SN_MODEL_MODE_DISABLE_NEEDS_TRIGGER) &&
        !(reg->triggerFlags & (SOCK_NOTIFY_TRIGGER_LEVEL | SOCK_NOTIFY_TRIGGER_EDGE)))
        return ERROR_INVALID_PARAMETER;
    if (r != NULL && r->serial != mp->serial && r->port_alive &&
        (mp->modes & SN_MODEL_MODE_REMOVE_ANY_PORT)) {
        /* Nothing in the reference pages says a REMOVE or DISABLE is
           checked against the port it is sent to: the registration is
           the socket's, whichever port holds it. So it acts there, and
           its REMOVE event goes to that port. */
        model_port_t *holder = model__port_of(r->serial);
        if (holder != NULL) {
            mp = holder;
            iocp = holder->iocp;
        }
    }
    if (r == NULL || r->serial != mp->serial || !r->port_alive ||
        (r->state == MODEL_REMOVING && reg->operation == SOCK_NOTIFY_OP_REMOVE))
        return ERROR_NOT_FOUND;
    if (!model__is_socket(reg->socket, &type)) {
        model__closed(iocp, mp, r);
        return WSAENOTSOCK;
    }
    if (r->armed && r->state == MODEL_LIVE) {
        /* Rule 3: a notification queued just before this operation. */
        uint8_t ready = model__ready(r->socket, r->filter);
        if (model__is_edge(r))
            ready &= (uint8_t)~r->high;
        if (ready != 0)
            PostQueuedCompletionStatus(iocp, MODEL_QUEUED | ready, r->key, NULL);
    }
    poly.completionKey = (PVOID)r->key;
    if ((error = model__afd(iocp, 1, &poly, 0, 0, NULL,
                                                     NULL)) == 0)
        error = poly.registrationResult;
    if (error != 0)
        return error;
    r->armed = 0;
    if (reg->operation == SOCK_NOTIFY_OP_REMOVE) {
        r->state = MODEL_REMOVING;
        r->removes++;
    }
    return 0;
}

/* Apply one caller registration (model lock held): the model's rules,
   then the polyfill, register-only. */
static DWORD model__apply(HANDLE iocp, model_port_t *mp, SOCK_NOTIFY_REGISTRATION *reg) {
    model_reg_t *r = model__find(reg->socket);

    if (r != NULL && !model__same_socket(r)) {
        /* closesocket() ended that registration; the value was reused. */
        model__closed(iocp, mp, r);
        r = NULL;
    }
    switch (reg->operation) {
    case SOCK_NOTIFY_OP_NONE:
        return 0;
    case SOCK_NOTIFY_OP_ENABLE:
        return model__enable(iocp, mp, reg, r);
    case SOCK_NOTIFY_OP_DISABLE:
    case SOCK_NOTIFY_OP_REMOVE:
        return model__disable(iocp, mp, reg, r);
    default:
        return ERROR_INVALID_PARAMETER;
    }
}

/* Rule 6, at the start of every call (model lock held): a high edge bit
   whose condition is false now has fallen; the polyfill watches it again. */
static void model__edges(HANDLE iocp, model_port_t *mp) {
    uint32_t pos = 0;
    model_reg_t *r;
    while ((r = model__next(&pos)) != NULL) {
        SOCK_NOTIFY_REGISTRATION poly;
        uint8_t now;
        if (r->serial != mp->serial || !r->port_alive || !model__is_edge(r) ||
            r->state != MODEL_LIVE || !r->armed)
            continue;
        if (r->high != 0) {
            now = model__ready(r->socket, r->high);
            if ((r->high & (uint8_t)~now & (SOCK_NOTIFY_EVENT_IN | SOCK_NOTIFY_EVENT_OUT)) != 0) {
                r->high = (uint8_t)((r->high & now) |
                                    (r->high & SOCK_NOTIFY_EVENT_HANGUP));
                r->edge_dirty = 1;
            }
        }
        if (!r->edge_dirty)
            continue;
        model__poly_enable(r, &poly);
        model__afd(iocp, 1, &poly, 0, 0, NULL, NULL);
        r->edge_dirty = 0;
    }
}

/* Filter what the polyfill dequeued (model lock held); returns how many
   entries are left, compacted at the front. */
static ULONG model__filter(model_port_t *mp, OVERLAPPED_ENTRY *entries, ULONG got) {
    ULONG j, n = 0;
    for (j = 0; j < got; j++) {
        OVERLAPPED_ENTRY *e = &entries[j];
        ULONG_PTR key = e->lpCompletionKey;
        uint32_t events = e->dwNumberOfBytesTransferred, queued;
        model_reg_t *r;
        if (((uint64_t)key & SN_RESERVED_KEY_BIT) || key == 0 || e->lpOverlapped != NULL) {
            /* Not a notification: untouched. Nor is the completion of
               overlapped I/O on a socket the model tied to the port
               (SN_MODEL_MODE_TIES_SOCKET), under a registration's key but
               with its OVERLAPPED: the model's notifications have none. */
            entries[n++] = *e;
            continue;
        }
        queued = events & MODEL_QUEUED;
        events &= ~MODEL_QUEUED;
        e->dwNumberOfBytesTransferred = events;
        if ((r = model__find_key(mp->serial, key)) == NULL || queued) {
            /* A registration the model no longer has (its packets, still
               queued, are delivered as the OS would), or a notification
               the model queued itself, delivered as it was queued. */
            entries[n++] = *e;
            continue;
        }
        if (events & SOCK_NOTIFY_EVENT_REMOVE) {
            if (r->removes > 0)
                r->removes--;
            if (r->removes == 0 && r->state == MODEL_REMOVING)
                model__drop(r);
            entries[n++] = *e;
            continue;
        }
        if (model__is_edge(r) && r->state == MODEL_LIVE) {
            uint8_t rising = (uint8_t)(events & r->filter & (uint8_t)~r->high);
            r->high |= rising;
            /* The polyfill's one-shot fired: it watches the rest again,
               unless the registration itself was one-shot. */
            if (r->trigger & SOCK_NOTIFY_TRIGGER_ONESHOT)
                r->armed = 0;
            else
                r->edge_dirty = 1;
            events = rising | (events & SOCK_NOTIFY_EVENT_ERR);
            if (events == 0)
                continue;
            e->dwNumberOfBytesTransferred = events;
        } else if (r->state == MODEL_LIVE && (r->trigger & SOCK_NOTIFY_TRIGGER_ONESHOT)) {
            r->armed = 0;
        }
        entries[n++] = *e;
    }
    return n;
}

/* "Nothing arrived in time", in the mode's words. */
static DWORD model__timeout(const model_port_t *mp, DWORD rc) {
    if (rc == WAIT_TIMEOUT && (mp->modes & SN_MODEL_MODE_ERROR_TIMEOUT))
        return ERROR_TIMEOUT;
    return rc;
}

/* SN_MODEL_MODE_PLAIN_WAIT: the OS's wait, a GetQueuedCompletionStatusEx,
   knows nothing of the polyfill. The model's own registrations live in
   the polyfill, so their packets are translated here; every other packet
   -- among them the polyfill's packets for the sockets the port's
   fallback serves -- is handed on as it came, for the port to turn into
   events (sn_iocp_fallback.c), as it must on Windows. */
static DWORD model__plain_wait(HANDLE iocp, model_port_t *mp, UINT32 timeoutMs, ULONG count,
                               OVERLAPPED_ENTRY *entries, UINT32 *got_out, ULONG *raw) {
    ULONG got = 0, j, n = 0;
    *raw = 0;
    if (!GetQueuedCompletionStatusEx(iocp, entries, count, &got, timeoutMs, FALSE)) {
        DWORD error = GetLastError();
        return error == WAIT_TIMEOUT ? WAIT_TIMEOUT : error;
    }
    (void)mp;
    for (j = 0; j < got; j++) {
        OVERLAPPED_ENTRY e = entries[j];
        if (e.lpCompletionKey == SN_AFD_MODEL_COMPLETION_KEY &&
            sn_afd_translate_as(SN_AFD_MODEL_COMPLETION_KEY, iocp, &e, 1) == 0)
            continue;     /* a poll of the model's with nothing to tell */
        entries[n++] = e;
    }
    *raw = got;
    *got_out = (UINT32)n;
    return ERROR_SUCCESS;
}

/* The parameters (completionPort ... receivedEntryCount) are those of
   SN_PSN_PARAMETERS, sn_win.h. */
DWORD WINAPI sn_model_process_socket_notifications(SN_PSN_PARAMETERS) {
    model_port_t *mp;
    int64_t deadline = 0;
    DWORD rc;
    UINT32 i, rounds = 0;

    if ((rc = sn_psn_check_arguments(SN_PSN_ARGUMENTS)) != 0)
        return rc;

    AcquireSRWLockExclusive(&model__lock);
    mp = model__port(completionPort, 1);
    if (mp == NULL) {
        ReleaseSRWLockExclusive(&model__lock);
        return ERROR_NOT_ENOUGH_MEMORY;
    }
    if (mp->fail_calls > 0) {
        /* Rule 4: the whole call fails and nothing changes. */
        mp->fail_calls--;
        ReleaseSRWLockExclusive(&model__lock);
        return MODEL_ERR_CALL;
    }
    if (mp->hold) {
        /* SN_MODEL_HOLD: a test's seam between a batch's translation (done)
           and its application (not yet), where another thread's batch may
           overtake it. */
        for (i = 0; i < registrationCount; i++)
            if (registrationInfos[i].operation == mp->hold)
                break;
        if (i < registrationCount) {
            mp->hold = 0;
            mp->holding = 1;
            while (mp->holding)
                SleepConditionVariableSRW(&model__released, &model__lock, INFINITE, 0);
        }
    }
    if (mp->modes & SN_MODEL_MODE_BAD_HANDLE_FAILS_CALL) {
        /* "Invalid input such as a bad handle": the whole call. */
        for (i = 0; i < registrationCount; i++) {
            int type;
            if (registrationInfos[i].operation != SOCK_NOTIFY_OP_NONE &&
                !model__is_socket(registrationInfos[i].socket, &type)) {
                ReleaseSRWLockExclusive(&model__lock);
                return WSAENOTSOCK;
            }
        }
    }
    model__edges(completionPort, mp);
    for (i = 0; i < registrationCount; i++)
        registrationInfos[i].registrationResult =
            model__apply(completionPort, mp, &registrationInfos[i]);
    ReleaseSRWLockExclusive(&model__lock);
    /* Rule 2: a refusal does not shorten the wait that follows. */
    if (completionCount == 0)
        return ERROR_SUCCESS;

    if (timeoutMs != INFINITE)
        deadline = sn_deadline(timeoutMs);
    for (;;) {
        UINT32 got = 0;
        ULONG n, raw = 0;
        if (mp->modes & SN_MODEL_MODE_PLAIN_WAIT) {
            rc = model__plain_wait(completionPort, mp, timeoutMs, completionCount,
                                   completionPortEntries, &got, &raw);
        } else {
            rc = model__afd(completionPort, 0, NULL, timeoutMs,
                                                     completionCount,
                                                     completionPortEntries, &got);
        }
        if (rc != ERROR_SUCCESS)
            return model__timeout(mp, rc);
        AcquireSRWLockExclusive(&model__lock);
        n = model__filter(mp, completionPortEntries, got);
        ReleaseSRWLockExclusive(&model__lock);
        if (n > 0) {
            *receivedEntryCount = (UINT32)n;
            return ERROR_SUCCESS;
        }
        /* Only edges already high, or the model's own poll packets: wait
           again for the time that is left. A poll finishes the model's own
           work at hand first, as the polyfill's wait does: a modify is a
           cancelled poll and its replacement in the polyfill, where the OS
           would report the new filter's readiness in this very call. */
        if (timeoutMs == 0) {
            if (raw != 0 && ++rounds < MODEL_POLL_ROUNDS)
                continue;
            return model__timeout(mp, WAIT_TIMEOUT);
        }
        if (timeoutMs != INFINITE) {
            int64_t left = sn_time_left(deadline);
            if (left == 0)
                return model__timeout(mp, WAIT_TIMEOUT);
            timeoutMs = (UINT32)left;
        }
    }
}

void sn_model_port_closed(HANDLE iocp) {
    model_port_t **link, *mp;
    uint32_t pos = 0;
    model_reg_t *r;
    AcquireSRWLockExclusive(&model__lock);
    for (link = &model__ports; (mp = *link) != NULL; link = &mp->next) {
        if (mp->iocp != iocp)
            continue;
        *link = mp->next;
        while ((r = model__next(&pos)) != NULL) {
            if (r->serial != mp->serial)
                continue;
            if (r->state == MODEL_REMOVING)
                model__drop(r);     /* its REMOVE was applied: untied */
            else
                r->port_alive = 0;  /* rule 7: tied to a dead port */
        }
        free(mp);
        break;
    }
    ReleaseSRWLockExclusive(&model__lock);
}

/* ------------------------------------------------------------ the controls */

static int64_t model__control(HANDLE iocp, int what, uint64_t socket, int64_t value) {
    int64_t answer = 0;
    model_port_t *mp;
    model_reg_t *r;
    AcquireSRWLockExclusive(&model__lock);
    switch (what) {
    case SN_MODEL_REFUSE:
        model__unrefuse((SOCKET)socket);
        if (value) {
            if (model__refused_count == MODEL_REFUSED_MAX) {
                answer = -(int64_t)ERROR_NOT_ENOUGH_MEMORY;
            } else {
                model_reg_t *r = &model__refused[model__refused_count++];
                memset(r, 0, sizeof *r);
                r->socket = (SOCKET)socket;
                model__fingerprint(r->socket, &r->name, &r->name_len, &r->peer, &r->peer_len,
                                   &r->type);
            }
        }
        break;
    case SN_MODEL_FAIL_CALLS:
        mp = model__port(iocp, 1);
        if (mp == NULL || value < 0)
            answer = -(int64_t)ERROR_INVALID_PARAMETER;
        else
            mp->fail_calls = (uint32_t)value;
        break;
    case SN_MODEL_TIED:
        r = model__find((SOCKET)socket);
        mp = model__port(iocp, 0);
        if (r == NULL || !model__same_socket(r))
            answer = SN_MODEL_UNTIED;
        else if (mp != NULL && r->serial == mp->serial && r->port_alive)
            answer = r->state == MODEL_REMOVING ? SN_MODEL_TIED_REMOVING : SN_MODEL_TIED_HERE;
        else
            answer = SN_MODEL_TIED_ELSEWHERE;
        break;
    case SN_MODEL_MODES:
        mp = model__port(iocp, 1);
        if (mp == NULL || value < 0 || (value & ~(int64_t)SN_MODEL_MODES_HARSHEST))
            answer = -(int64_t)ERROR_INVALID_PARAMETER;
        else {
            answer = mp->modes;
            mp->modes = (uint32_t)value;
        }
        break;
    case SN_MODEL_HOLD:
        mp = model__port(iocp, 1);
        answer = mp != NULL ? mp->holding : 0;
        if (mp == NULL || value < 0 || value > 4) {
            answer = -(int64_t)ERROR_INVALID_PARAMETER;
        } else if (value == 1 || value == 3) {
            mp->hold = value == 1 ? SOCK_NOTIFY_OP_ENABLE : SOCK_NOTIFY_OP_REMOVE;
        } else if (value == 0 || value == 4) {
            if (value == 0)
                mp->hold = 0;
            mp->holding = 0;
            WakeAllConditionVariable(&model__released);
        }
        break;
    case SN_MODEL_HIDE_STATE:
        /* The port's reading of what the socket is (model__identify) meets
           a SO_BSP_STATE that fails, as it may on Windows (the option's
           page leaves the unbound socket open; a reset connection may
           forget its addresses). */
        if (value != 0 && value != 1) {
            answer = -(int64_t)ERROR_INVALID_PARAMETER;
        } else {
            uint32_t k;
            for (k = 0; k < model__hidden_count && model__hidden[k] != (SOCKET)socket; k++)
                ;
            if (k < model__hidden_count && !value)
                model__hidden[k] = model__hidden[--model__hidden_count];
            else if (k == model__hidden_count && value) {
                if (model__hidden_count == MODEL_HIDDEN_MAX)
                    answer = -(int64_t)ERROR_NOT_ENOUGH_MEMORY;
                else
                    model__hidden[model__hidden_count++] = (SOCKET)socket;
            }
        }
        break;
    case SN_MODEL_QUEUE:
        /* A notification queued now under the socket's key, as the OS
           queues one for a ready socket: whatever the port applies next
           (a DISABLE, a REMOVE) comes after it ("notifications that have
           already been queued might still be delivered"). */
        r = model__find((SOCKET)socket);
        mp = model__port(iocp, 0);
        if (r == NULL || !model__same_socket(r) || mp == NULL || r->serial != mp->serial ||
            value <= 0 || value > 0xff)
            answer = -(int64_t)ERROR_NOT_FOUND;
        else if (!PostQueuedCompletionStatus(iocp, MODEL_QUEUED | (DWORD)value, r->key, NULL))
            answer = -(int64_t)GetLastError();
        break;
    case SN_MODEL_KEY:
        r = model__find((SOCKET)socket);
        if (r == NULL || !model__same_socket(r))
            answer = -(int64_t)ERROR_NOT_FOUND;
        else
            answer = (int64_t)(r->key & 0x7fffffffffffffffull);
        break;
    default:
        answer = -(int64_t)ERROR_INVALID_PARAMETER;
        break;
    }
    ReleaseSRWLockExclusive(&model__lock);
    return answer;
}

/* ---------------------------------------------------------- the backend */

/* Ours (no OVERLAPPED in its notifications), on the polyfill. */
const iocp_function_t sn_model_function = {
    sn_model_process_socket_notifications, 0, 1, 1, sn_model_port_closed,
};

static int model__available(const char **why) {
    *why = "the strict model of ProcessSocketNotifications (test build), "
           "on the IOCTL_AFD_POLL polyfill";
    return 1;
}

static int model__open(sn_port_t *port) {
    return sn_iocp_open(port, &sn_model_function);
}

/* What the socket under a handle value is, as the port code reads it
   (sn_iocp.c), with SO_BSP_STATE failing for a socket a test names
   (SN_MODEL_HIDE_STATE). */
static int model__identify(sn_port_t *port, uint64_t socket, sn_identity_t *out) {
    uint32_t k;
    int bsp_state = 1;
    (void)port;
    AcquireSRWLockShared(&model__lock);
    for (k = 0; k < model__hidden_count; k++)
        if (model__hidden[k] == (SOCKET)socket)
            bsp_state = 0;
    ReleaseSRWLockShared(&model__lock);
    return sn_iocp_identify_socket((SOCKET)socket, bsp_state, out);
}

/* The model makes edges from level snapshots plus a look at the socket at
   every call: the unforgiving reading of EDGE. */
const sn_backend_ops_t sn_strict_ops = IOCP_OPS(
    SN_BACKEND_STRICT,
    SN_TRIGGER_ONESHOT | SN_TRIGGER_PERSISTENT | SN_TRIGGER_LEVEL | SN_TRIGGER_EDGE,
    model__available, model__open, model__identify, sn_iocp_add_afd_counters);

/* ------------------------------------------------------- the controls' entry */

int64_t sn_model_control(sn_port_t *port, int what, uint64_t socket, int64_t value) {
    int64_t answer;
    if (port->ops != &sn_strict_ops)
        return -(int64_t)SN_ERROR_NOT_SUPPORTED;
    if ((answer = sn_port_enter(port)) != 0)
        return -answer;
    answer = model__control((HANDLE)(uintptr_t)port->ops->os_handle(port), what, socket,
                            value);
    sn_port_leave(port);
    return answer;
}

#endif /* _WIN32 && SN_TESTING */

/* ISO C wants a declaration in every translation unit, also where the
   #if above leaves none (MSVC and -pedantic warn otherwise). */
typedef int sn_model_c_is_for_windows_test_builds;
