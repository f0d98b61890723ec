/*
 * engine/comm/comm_strict.c - WLB_COMM_STRICT: the pipeline's messages on MPI's path behave as they
 * do on NCCL's, so that the CPU tests catch what would hang or mismatch on a GPU cluster (comm.h).
 *
 * What NCCL does, and how each is reproduced here:
 *   - No tags. NCCL matches a send with the receive posted by its peer on the same communicator in
 *     issue order. Here every message of a lane slot travels with the MPI tag of its slot
 *     (comm_lane_slot, slot_tag), which MPI also matches in order per peer; the caller's tag rides in the
 *     message's last float and the receive checks it: a message that arrives where another was
 *     expected is an Error naming both, where NCCL would hand over the wrong activations (or hang on
 *     a length mismatch).
 *   - Rendezvous. An NCCL send completes only once its peer has received it. Sends here are
 *     synchronous-mode (MPI_Issend): their wait returns only once the receive has matched.
 *   - One stream per communicator. A rank's operations on one communicator run one after another, so
 *     a receive queued behind a send that waits for that receive's sender would wait forever: no rank
 *     may both send and receive in one lane slot (one_way).
 *   - Connection at first use. NCCL connects a pair of ranks inside the first send (or receive)
 *     between them, and that call waits until the peer has posted its side. Here the first send of a
 *     pair that comm_connect_pipeline did not connect waits, at its start, for the receive to match;
 *     a first receive posted ahead waits for the message to be there.
 * Every wait has a deadline (WLB_COMM_STRICT's seconds): a message still waiting for its peer then is
 * an Error - the deadlock NCCL would sit in, reported with the lane, the peer and the tag. One such
 * deadlock is named at once instead: while a receive waits, a message from its peer in a slot that
 * peer never sends in (another colour's - the receiver's, say: NCCL would never match it) is an
 * Error naming that message (its tag, slot and lane), looked for every 20 ms.
 *
 * A message is copied through a host buffer of n + 1 floats (the tag in the last): strict mode is for
 * tests, where the copies cost nothing that matters.
 */
#include "engine/comm/comm_strict.h"

#include "util/clock.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const lane_names[COMM_LANES] = {"activations", "gradients"};

/* The MPI tag of a lane slot's messages: above the tags the other messages of the PP group use
 * (comm_exchange's 0, the tied embeddings' sum), so that a strict receive never matches one of them,
 * nor takes one for a message in the wrong slot (stray_message). Within MPI's least tag bound, 32767. */
enum { STRICT_TAG_BASE = 1000 };
static int slot_tag(int slot) { return STRICT_TAG_BASE + slot; }

/* The group's MPI_Comm (comm_mpi.c keeps one per group in c->groups). */
static MPI_Comm pp_comm(const Comm *c, LayoutGroup g) { return *(MPI_Comm *)c->groups[g]; }

/* c->connected: a byte per (lane slot, peer), 1 once the pair is connected; after them a byte per
 * slot with how this rank used it (1: sent, 2: received). */
static unsigned char *pair(const Comm *c, int slot, int peer)
{
    return c->connected ? &c->connected[(size_t)slot * (size_t)c->size[GROUP_PP] + (size_t)peer] : NULL;
}

/* NCCL runs a communicator's operations one after another on its stream: a rank that both sent and
 * received in one lane slot could hold a receive behind a send that waits for it. The lanes' colours
 * (comm_lane_slot) keep every slot one-way on a rank; this checks it. */
static int one_way(const Comm *c, int slot, int role, CommLane lane, Error *err)
{
    if (!c->connected)
        return 0;
    unsigned char *r = &c->connected[(size_t)COMM_LANE_SLOTS * (size_t)c->size[GROUP_PP] + (size_t)slot];
    *r |= (unsigned char)role;
    if (*r == 3)
        return error_runtime(err, "comm", "WLB_COMM_STRICT: PP rank %d both sends and receives in slot %d of the %s "
                             "lane: NCCL would queue them on one stream", c->rank[GROUP_PP], slot, lane_names[lane]);
    return 0;
}

void comm_strict_connected(Comm *c, CommLane lane, int to, int from)
{
    if (!c->strict_s || !c->mpi)
        return;
    if (!c->connected && !(c->connected = calloc((size_t)COMM_LANE_SLOTS * ((size_t)c->size[GROUP_PP] + 1), 1)))
        return; /* out of memory: every pair then counts as unconnected, the stricter reading */
    int pp = c->size[GROUP_PP], me = c->rank[GROUP_PP];
    if (to >= 0)
        *pair(c, comm_lane_slot(lane, me, pp), to) = 1;
    if (from >= 0)
        *pair(c, comm_lane_slot(lane, from, pp), from) = 1;
}

static int mpi_fail(int rc, const char *what, Error *err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        strcpy(msg, "MPI error");
    return error_runtime(err, "comm", "WLB_COMM_STRICT: %s: %s", what, msg);
}

/* A receive that waits: from PP rank peer, on lane, tag (what the stray check names). */
typedef struct Awaited {
    const Comm *c;
    LayoutGroup g;
    int peer, tag;
    CommLane lane;
} Awaited;

/* A message from the awaited peer in a slot where none of its messages may come: a rank sends only in
 * its own colour's slots (comm_lane_slot(lane, sender)), so one in another slot - the receiver's
 * colour, say - was sent in the wrong one, and NCCL, which matches per communicator, would never
 * deliver it: both ranks would wait for ever. Named at once (the message received and its tag read
 * from its last float) instead of after the deadline. -1 with err when there is one. */
static int stray_message(const Awaited *a, Error *err)
{
    const Comm *c = a->c;
    int pp = c->size[GROUP_PP];
    for (int s = 0; s < COMM_LANE_SLOTS; s++) {
        if (s == comm_lane_slot(COMM_LANE_ACT, a->peer, pp) || s == comm_lane_slot(COMM_LANE_GRAD, a->peer, pp))
            continue;
        int there = 0, count = 0, got = -1;
        MPI_Status st;
        if (MPI_Iprobe(a->peer, slot_tag(s), pp_comm(c, a->g), &there, &st) != MPI_SUCCESS || !there)
            continue;
        if (MPI_Get_count(&st, MPI_FLOAT, &count) == MPI_SUCCESS && count > 0) {
            float *h = malloc((size_t)count * sizeof *h);
            if (h && MPI_Recv(h, count, MPI_FLOAT, a->peer, slot_tag(s), pp_comm(c, a->g), MPI_STATUS_IGNORE) ==
                         MPI_SUCCESS)
                memcpy(&got, &h[count - 1], sizeof got);
            free(h);
        }
        int lane = s / COMM_LANE_COLORS;
        return error_runtime(err, "comm",
                             "WLB_COMM_STRICT: PP rank %d's message (tag %d, %d floats) came in slot %d of the %s lane "
                             "(colour %d), not in its own colour's slot %d: on NCCL no receive would ever match it; PP "
                             "rank %d waits for tag %d on the %s lane", a->peer, got, count - 1, s, lane_names[lane],
                             s % COMM_LANE_COLORS, comm_lane_slot((CommLane)lane, a->peer, pp), c->rank[GROUP_PP],
                             a->tag, lane_names[a->lane]);
    }
    return 0;
}

/* Waits for r until the deadline; *st its status. 1 when it completed, 0 at the deadline, -1 with err
 * on an MPI error or (a receive: awaited) a stray message from its peer, looked for every 20 ms. */
static int wait_until(MPI_Request *r, MPI_Status *st, double deadline, const char *what, const Awaited *awaited,
                      Error *err)
{
    double next_look = clock_seconds() + 0.02;
    for (;;) {
        int done = 0, rc = MPI_Test(r, &done, st);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, what, err);
        if (done)
            return 1;
        double now = clock_seconds();
        if (awaited && now > next_look) {
            if (stray_message(awaited, err) != 0)
                return -1;
            next_look = now + 0.02;
        }
        if (now > deadline)
            return 0;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static int deadlock(const Comm *c, const char *what, int peer, CommLane lane, int tag, Error *err)
{
    return error_runtime(err, "comm",
                         "WLB_COMM_STRICT: %s PP rank %d on the %s lane (tag %d) waited %.0f s for its peer: on NCCL "
                         "this rank would wait forever (PP rank %d)",
                         what, peer, lane_names[lane], tag, c->strict_s, c->rank[GROUP_PP]);
}

static int check_args(LayoutGroup g, int64_t n, Error *err)
{
    if (g != GROUP_PP)
        return error_runtime(err, "comm", "WLB_COMM_STRICT: messages are for the pipeline group only");
    if (n < 0 || n >= INT_MAX)
        return error_runtime(err, "comm", "WLB_COMM_STRICT: %lld floats in one message", (long long)n);
    return 0;
}

/* A host copy of the message with the tag in its last float. */
static float *pack(const Comm *c, const float *buf, int64_t n, int tag)
{
    float *h = malloc((size_t)(n + 1) * sizeof *h);
    if (!h)
        return NULL;
    if (n && c->stage)
        c->ops->to_host(h, buf, (size_t)n * sizeof *h);
    else if (n)
        memcpy(h, buf, (size_t)n * sizeof *h);
    memcpy(&h[n], &tag, sizeof tag);
    return h;
}

/* req is under way as r, through the host copy h, with what its wait checks. */
static void started(CommRequest *req, MPI_Request r, float *h, int peer, CommLane lane, int tag)
{
    memset(req, 0, sizeof *req);
    memcpy(req->handle, &r, sizeof r);
    req->staged = h;
    req->active = 1;
    req->peer = peer;
    req->lane = lane;
    req->tag = tag;
}

int comm_strict_isend(const Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, const float *buf, int64_t n,
                      CommRequest *req, Error *err)
{
    if (check_args(g, n, err) != 0)
        return -1;
    int slot = comm_lane_slot(lane, c->rank[GROUP_PP], c->size[GROUP_PP]);
    if (one_way(c, slot, 1, lane, err) != 0)
        return -1;
    float *h = pack(c, buf, n, tag);
    if (!h)
        return error_runtime(err, "comm", "out of memory for a message of %lld floats", (long long)n);
    MPI_Request r;
    int rc = MPI_Issend(h, (int)n + 1, MPI_FLOAT, peer, slot_tag(slot), pp_comm(c, g), &r);
    if (rc != MPI_SUCCESS) {
        free(h);
        return mpi_fail(rc, "MPI_Issend", err);
    }
    unsigned char *p = pair(c, slot, peer);
    if (!p || !*p) { /* NCCL connects here, and waits for the peer's receive */
        int done = wait_until(&r, MPI_STATUS_IGNORE, clock_seconds() + c->strict_s, "MPI_Test", NULL, err);
        if (done != 1) {
            if (done == 0)
                deadlock(c, "the first send (NCCL's connection) to", peer, lane, tag, err);
            free(h);
            return -1;
        }
        if (p)
            *p = 1;
    }
    started(req, r, h, peer, lane, tag);
    return 0;
}

/* The message now in h (n + 1 floats, status st) is the one expected: its length and its tag. */
static int check_message(const Comm *c, const MPI_Status *st, const float *h, int64_t n, int peer, CommLane lane,
                         int tag, Error *err)
{
    int count = 0, got;
    if (MPI_Get_count(st, MPI_FLOAT, &count) != MPI_SUCCESS)
        count = -1;
    if (count != n + 1)
        return error_runtime(err, "comm",
                             "WLB_COMM_STRICT: the message from PP rank %d on the %s lane has %d floats where tag %d "
                             "expects %lld: the two ranks issue this lane's messages in different orders (PP rank %d)",
                             peer, lane_names[lane], count - 1, tag, (long long)n, c->rank[GROUP_PP]);
    memcpy(&got, &h[n], sizeof got);
    if (got != tag)
        return error_runtime(err, "comm",
                             "WLB_COMM_STRICT: the message from PP rank %d on the %s lane is tag %d where tag %d was "
                             "expected: the two ranks issue this lane's messages in different orders (PP rank %d)",
                             peer, lane_names[lane], got, tag, c->rank[GROUP_PP]);
    return 0;
}

static void unpack(const Comm *c, float *buf, const float *h, int64_t n)
{
    if (n && c->stage)
        c->ops->to_device(buf, h, (size_t)n * sizeof *h);
    else if (n)
        memcpy(buf, h, (size_t)n * sizeof *h);
}

int comm_strict_recv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n, Error *err)
{
    if (check_args(g, n, err) != 0)
        return -1;
    int slot = comm_lane_slot(lane, peer, c->size[GROUP_PP]);
    if (one_way(c, slot, 2, lane, err) != 0)
        return -1;
    float *h = malloc((size_t)(n + 1) * sizeof *h);
    if (!h)
        return error_runtime(err, "comm", "out of memory for a message of %lld floats", (long long)n);
    MPI_Request r;
    MPI_Status st;
    int rc = MPI_Irecv(h, (int)n + 1, MPI_FLOAT, peer, slot_tag(slot), pp_comm(c, g), &r), done = -1;
    Awaited aw = {c, g, peer, tag, lane};
    if (rc != MPI_SUCCESS)
        mpi_fail(rc, "MPI_Irecv", err);
    else if ((done = wait_until(&r, &st, clock_seconds() + c->strict_s, "MPI_Irecv", &aw, err)) == 0)
        deadlock(c, "a receive from", peer, lane, tag, err);
    if (done == 1 && check_message(c, &st, h, n, peer, lane, tag, err) == 0) {
        unpack(c, buf, h, n);
        unsigned char *p = pair(c, slot, peer);
        if (p)
            *p = 1;
        free(h);
        return 0;
    }
    if (done <= 0 && rc == MPI_SUCCESS) { /* the receive is still posted: cancel it before its buffer goes */
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    free(h);
    return -1;
}

int comm_strict_irecv(Comm *c, LayoutGroup g, int peer, CommLane lane, int tag, float *buf, int64_t n,
                      CommRequest *req, Error *err)
{
    if (check_args(g, n, err) != 0)
        return -1;
    int slot = comm_lane_slot(lane, peer, c->size[GROUP_PP]);
    if (one_way(c, slot, 2, lane, err) != 0)
        return -1;
    unsigned char *p = pair(c, slot, peer);
    if (!p || !*p) { /* NCCL connects here: the post waits for the peer's send */
        double deadline = clock_seconds() + c->strict_s, next_look = clock_seconds() + 0.02;
        Awaited aw = {c, g, peer, tag, lane};
        for (int there = 0; !there;) {
            int rc = MPI_Iprobe(peer, slot_tag(slot), pp_comm(c, g), &there, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "MPI_Iprobe", err);
            if (!there && clock_seconds() > next_look) {
                if (stray_message(&aw, err) != 0)
                    return -1;
                next_look = clock_seconds() + 0.02;
            }
            if (!there && clock_seconds() > deadline)
                return deadlock(c, "the first receive (NCCL's connection) from", peer, lane, tag, err);
            if (!there)
                nanosleep(&(struct timespec){0, 50000}, NULL);
        }
        if (p)
            *p = 1;
    }
    float *h = malloc((size_t)(n + 1) * sizeof *h);
    if (!h)
        return error_runtime(err, "comm", "out of memory for a message of %lld floats", (long long)n);
    MPI_Request r;
    int rc = MPI_Irecv(h, (int)n + 1, MPI_FLOAT, peer, slot_tag(slot), pp_comm(c, g), &r);
    if (rc != MPI_SUCCESS) {
        free(h);
        return mpi_fail(rc, "MPI_Irecv", err);
    }
    started(req, r, h, peer, lane, tag);
    req->dest = buf;
    req->n = n;
    return 0;
}

int comm_strict_wait(const Comm *c, CommRequest *req, Error *err)
{
    MPI_Request r;
    MPI_Status st;
    memcpy(&r, req->handle, sizeof r);
    req->active = 0;
    Awaited aw = {c, GROUP_PP, req->peer, req->tag, (CommLane)req->lane};
    int done = wait_until(&r, &st, clock_seconds() + c->strict_s, "MPI_Test", req->dest ? &aw : NULL, err),
        rc = done == 1 ? 0 : -1;
    if (done == 0)
        deadlock(c, req->dest ? "a receive from" : "a send to", req->peer, (CommLane)req->lane, req->tag, err);
    if (done <= 0 && req->dest) { /* a posted receive: cancel it before its buffer goes */
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    if (done == 1 && req->dest && check_message(c, &st, req->staged, req->n, req->peer, (CommLane)req->lane,
                                                req->tag, err) == 0)
        unpack(c, req->dest, req->staged, req->n);
    else if (done == 1 && req->dest)
        rc = -1;
    free(req->staged);
    req->staged = NULL;
    req->dest = NULL;
    return rc;
}
