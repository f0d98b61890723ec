/*
 * engine/train/train_pipeline.c - one rank's share of a step: plan, check the plan against the other
 * ranks, run the replica's micro-batches through this pipeline stage, and measure (see train.h).
 *
 * Pipeline messages. Global chunk g = c * pp + s (local chunk c on stage s) takes its input from
 * chunk g - 1 on stage (s - 1) mod pp and sends its output to chunk g + 1 on stage (s + 1) mod pp;
 * gradients go the opposite way. A message is tagged (micro-batch, receiving chunk, direction), so
 * with interleaving - where two stages exchange activations and gradients of several chunks - every
 * receive matches its own send. Sends do not block: a slot's output stays untouched until its send
 * completed, which is waited for before the slot takes its next micro-batch. A stage receives in
 * the order of its schedule, and the schedule's passes only wait for passes that come earlier in
 * the dependency order (sched.c runs the same order), so no rank waits forever. With
 * parallel.overlap (and a path that can post receives: MPI's) the receive of the next pass is
 * posted before the current pass runs, so that its message arrives during the current pass instead
 * of after it (on a rendezvous protocol the sender's message moves only once the receive is
 * posted); a posted receive never blocks, so the order above still holds.
 *
 * A micro-batch without a token (the wlb packer leaves some empty when a step has fewer documents
 * than micro-batches) is skipped by every rank of its replica: no input, no activation slot, no
 * message, no pass. Its forward and backward would add nothing to the loss and the gradients, and
 * every rank of the replica executes the same plan, so the sends and receives it leaves out are left
 * out on both sides. (Run through the model instead, an empty micro-batch first on a fresh slot
 * found no activations there: a crash.) A CP rank that holds no token of a non-empty micro-batch
 * still runs it: it takes part in the K/V exchange.
 *
 * Evaluation (trainer_forward_only, for train_eval.c) runs the same forward passes on another plan
 * and data, with no backward and no 1F1B: each micro-batch through the stage's chunks in turn.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/train/train.h"
#include "engine/train/train_trace.h"
#include "util/clock.h"

static int message_tag(const Trainer *tr, int k, int g, int backward)
{
    return ((k * tr->n_chunks) + g) * 2 + backward;
}

/* The replica's micro-batches of plan p in pipeline order: mb_index[k] = plan index of the k-th. */
static int replica_order(Trainer *tr, const StepPlan *p, Error *err)
{
    for (int k = 0; k < tr->m; k++)
        tr->mb_index[k] = -1;
    for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++) {
        const PlanMicroBatch *mb = &p->mbs[i];
        if (mb->replica == tr->lay.dp_rank && mb->order >= 0 && mb->order < tr->m)
            tr->mb_index[mb->order] = i;
    }
    for (int k = 0; k < tr->m; k++)
        if (tr->mb_index[k] < 0)
            return error_runtime(err, "train", "step %lld: replica %d has no micro-batch at pipeline place %d",
                                 (long long)p->step + 1, tr->lay.dp_rank, k);
    return 0;
}

int trainer_check_plan(Trainer *tr, const StepPlan *p, uint32_t perturb, Error *err)
{
    double d[2];
    d[0] = (double)(plan_digest(p) ^ perturb);
    d[1] = -d[0];
    if (comm_allreduce_max_f64(tr->comm, GROUP_WORLD, d, 2, err) != 0)
        return -1;
    if (d[0] != -d[1])
        return error_runtime(err, "train", "step %lld: the ranks planned different steps (plan CRCs %08x .. %08x); "
                             "every rank must read the same data with the same config",
                             (long long)p->step + 1, (unsigned)-d[1], (unsigned)d[0]);
    return 0;
}

/* Room for n floats in *buf (capacity *cap). */
static int reserve(Trainer *tr, float **buf, int64_t *cap_now, int64_t n, Error *err)
{
    if (*buf && n <= *cap_now)
        return 0;
    int64_t cap = n > 2 * *cap_now ? n : 2 * *cap_now;
    cap = cap > 0 ? cap : 1;
    tr->ops->free(*buf);
    *cap_now = 0;
    if (!(*buf = tr->ops->alloc((size_t)cap * sizeof **buf)))
        return error_runtime(err, "train", "out of memory");
    *cap_now = cap;
    return 0;
}

/* Room for n floats to receive into. Also for n = 0 (a CP rank holding no token of a micro-batch
 * still gets an input, of no rows): a stage's input must not be NULL. */
int trainer_reserve_recv(Trainer *tr, int64_t n, Error *err)
{
    return reserve(tr, &tr->recv, &tr->recv_cap, n, err);
}

int trainer_reserve_ahead(Trainer *tr, int a, int64_t n, Error *err)
{
    return reserve(tr, &tr->recv_ahead[a], &tr->recv_ahead_cap[a], n, err);
}

/* The message of pass i (n floats from group rank peer, tag) into tr->recv: the receive posted
 * ahead for it, or one now. */
static int take_message(Trainer *tr, int i, int peer, CommLane lane, int tag, int64_t n, const float **out,
                        Error *err)
{
    int a = i & 1;
    if (i >= 0 && tr->ahead_req[a].active && tr->ahead_pass[a] == i) {
        if (comm_wait(tr->comm, &tr->ahead_req[a], err) != 0)
            return -1;
        float *b = tr->recv;
        int64_t cap = tr->recv_cap;
        tr->recv = tr->recv_ahead[a];
        tr->recv_cap = tr->recv_ahead_cap[a];
        tr->recv_ahead[a] = b;
        tr->recv_ahead_cap[a] = cap;
        *out = tr->recv;
        return 0;
    }
    if (trainer_reserve_recv(tr, n, err) != 0 || comm_recv(tr->comm, GROUP_PP, peer, lane, tag, tr->recv, n, err) != 0)
        return -1;
    *out = tr->recv;
    return 0;
}

/* A free activation slot of chunk c for micro-batch k (its earlier sends finished first). */
static int take_slot(Trainer *tr, TrainChunk *ch, int k, Error *err)
{
    for (int s = 0; s < ch->model.n_slots; s++) {
        if (ch->slot_busy[s])
            continue;
        if (comm_wait(tr->comm, &ch->send_h[s], err) != 0 || comm_wait(tr->comm, &ch->send_dx[s], err) != 0)
            return -1;
        ch->slot_busy[s] = 1;
        ch->slot_of[k] = s;
        return s;
    }
    return error_runtime(err, "train", "no free activation slot for micro-batch %d (%d slots)", k, ch->model.n_slots);
}

/* The replica's k-th micro-batch of p has no token: every rank of the replica skips it. */
static int empty_micro_batch(const Trainer *tr, const StepPlan *p, int k)
{
    return p->mbs[tr->mb_index[k]].tokens == 0;
}

/* What the forward passes run on: a plan, the data sets of its documents, and what happens to the
 * loss - train: the activations stay for the backward and the head's gradients are dloss times the
 * loss's derivative (timed pass by pass); else forward only (evaluation), the slot free again as soon
 * as its output is sent. The sum of the token losses goes to *loss_sum. */
typedef struct PassRun {
    const StepPlan *plan;
    const DataSources *data;
    int train;
    float dloss;
    double *loss_sum;
    PositionSums *pos; /* evaluation: the loss by position too (NULL: not wanted) */
    unsigned char *built;   /* m: the micro-batch's inputs were built (by its first pass, or ahead) */
} PassRun;

/* The inputs of micro-batch k of run, built once. */
static int build_inputs(Trainer *tr, const PassRun *run, int k, Error *err)
{
    if (run->built[k])
        return 0;
    run->built[k] = 1;
    double t0 = train_trace_host_begin(tr);
    int rc = batch_build(&tr->batches[k], run->plan, tr->mb_index[k], tr->lay.cp_rank, run->data,
                         tr->chunks[0].model.dims.vocab, &tr->inputs[k], err);
    train_trace_host_end(tr, "data", t0);
    return rc;
}

/* The compute time of pass i of the schedule (its micro-batch k), communication excluded. A backend
 * with a device timer (CUDA: events) gets marks 2 i and 2 i + 1 around the pass, read once at the
 * step's end (read_pass_timers), so no pass waits for the device; otherwise (the CPU) the host clock
 * between two syncs. Either way the host time spent in the model's exchanges (m->comm_s) is taken
 * off: in that time the device waits for the messages (on a GPU an approximation: the host may still
 * be ahead of the device when an exchange starts; with one rank there is none). */
static double pass_begin(Trainer *tr, const Model *m, int i)
{
    if (m->ops->timer_mark) {
        m->ops->timer_mark(2 * i);
        tr->pass_waits[2 * i] = comm_wait_mark(tr->comm);
        return 0;
    }
    m->ops->sync();
    return clock_seconds();
}

static void pass_end(Trainer *tr, const Model *m, int i, int k, double t0, double comm0)
{
    if (m->ops->timer_mark) {
        m->ops->timer_mark(2 * i + 1);
        tr->pass_timed[i] = 1;
        tr->pass_comm[i] = m->comm_s - comm0;
        tr->pass_waits[2 * i + 1] = comm_wait_mark(tr->comm);
        return;
    }
    if (tr->fault_sleep_s > 0) { /* WLBTRAIN_FAULT slow: a rank that computes slower (train.c) */
        struct timespec ts = {(time_t)tr->fault_sleep_s,
                              (long)((tr->fault_sleep_s - (double)(time_t)tr->fault_sleep_s) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        tr->fault_sleep_s = 0;
    }
    m->ops->sync();
    tr->mb_compute[k] += clock_seconds() - t0 - (m->comm_s - comm0);
}

/* The device timer's marks of the step's passes, into mb_compute (waits for the last pass only). The
 * communication taken off a pass: the device seconds its waits held the compute stream where the path
 * times them (NCCL's), else the host seconds of its exchanges. */
static void read_pass_timers(Trainer *tr)
{
    for (int i = 0; i < tr->n_sched; i++)
        if (tr->pass_timed[i]) {
            double waited = comm_waited_s(tr->comm, tr->pass_waits[2 * i], tr->pass_waits[2 * i + 1]);
            double t = tr->ops->timer_seconds(2 * i, 2 * i + 1) - (waited >= 0 ? waited : tr->pass_comm[i]);
            tr->mb_compute[tr->sched[i].mb] += t > 0 ? t : 0;
        }
}

/* Room for n rows of losses in pos's scratch. */
static int reserve_row_loss(PositionSums *pos, int64_t n, Error *err)
{
    if (n <= pos->cap)
        return 0;
    double *grown = realloc(pos->row_loss, (size_t)n * sizeof *grown);
    if (!grown)
        return error_runtime(err, "valid", "out of memory");
    pos->row_loss = grown;
    pos->cap = n;
    return 0;
}

/* After the head's forward of the replica's k-th micro-batch: each of this CP rank's rows with a
 * target adds its loss to the bucket of its position. The rank's rows are its ranges of the
 * micro-batch in order (as batch_build laid them out); the micro-batch's host rows still hold their
 * targets and positions. */
static void add_by_position(Trainer *tr, const PassRun *run, int k)
{
    const PlanMicroBatch *mb = &run->plan->mbs[tr->mb_index[k]];
    const PlanRank *pr = &run->plan->ranks[mb->first_rank + tr->lay.cp_rank];
    const BatchBuffers *bb = &tr->batches[k];
    PositionSums *pos = run->pos;
    int64_t row = 0;
    for (int64_t r = 0; r < pr->n_ranges; r++) {
        const PlanRange *g = &run->plan->ranges[pr->first_range + r];
        for (int64_t t = g->start; t < g->start + g->len; t++, row++) {
            if (bb->targets[t] < 0)
                continue;
            int j = pos->n - 1;
            while (j > 0 && bb->positions[t] < pos->from[j])
                j--;
            pos->loss[j] += pos->row_loss[row];
            pos->targets[j] += 1;
        }
    }
}

static int run_forward(Trainer *tr, const PassRun *run, int i, int k, int c, Error *err)
{
    if (empty_micro_batch(tr, run->plan, k))
        return 0;
    TrainChunk *ch = &tr->chunks[c];
    Model *m = &ch->model;
    int s = tr->lay.pp_rank, g = c * tr->pp + s, prev = (s - 1 + tr->pp) % tr->pp, next = (s + 1) % tr->pp;
    ModelBatch *b = &tr->inputs[k];
    if (build_inputs(tr, run, k, err) != 0)
        return -1;
    int slot = take_slot(tr, ch, k, err);
    if (slot < 0)
        return -1;
    const float *h_in = NULL;
    int64_t n = model_rows(&m->dims, b->T) * m->dims.d; /* with SP this TP rank's rows only */
    if (g > 0 && take_message(tr, i, prev, COMM_LANE_ACT, message_tag(tr, k, g, 0), n, &h_in, err) != 0)
        return -1;
    double loss = 0, t0 = run->train ? pass_begin(tr, m, i) : 0, comm0 = m->comm_s;
    int by_position = run->pos && m->dims.has_head && tr->lay.tp_rank == 0;
    if (by_position && reserve_row_loss(run->pos, b->T, err) != 0)
        return -1;
    b->row_loss = by_position ? run->pos->row_loss : NULL;
    double traced = train_trace_compute_begin(tr);
    int rc = model_forward(m, slot, b, h_in, run->train, run->dloss, &loss, err);
    b->row_loss = NULL;
    if (rc != 0)
        return -1;
    train_trace_pass_end(tr, run->train ? "forward" : "eval_forward", run->plan, i, k, c, traced);
    if (by_position)
        add_by_position(tr, run, k);
    if (run->train) {
        pass_end(tr, m, i, k, t0, comm0);
    } else { /* nothing stays for a backward: the send below is all that still reads the slot */
        ch->slot_busy[slot] = 0;
        ch->slot_of[k] = -1;
    }
    if (m->dims.has_head && tr->lay.tp_rank == 0)
        *run->loss_sum += loss;
    if (g < tr->n_chunks - 1)
        return comm_isend(tr->comm, GROUP_PP, next, COMM_LANE_ACT, message_tag(tr, k, g + 1, 0), model_output(m, slot),
                          n, &ch->send_h[slot], err);
    return 0;
}

static int run_backward(Trainer *tr, int i, int k, int c, Error *err)
{
    if (empty_micro_batch(tr, &tr->plan, k))
        return 0;
    TrainChunk *ch = &tr->chunks[c];
    Model *m = &ch->model;
    int s = tr->lay.pp_rank, g = c * tr->pp + s, prev = (s - 1 + tr->pp) % tr->pp, next = (s + 1) % tr->pp;
    const ModelBatch *b = &tr->inputs[k];
    int slot = ch->slot_of[k];
    const float *dh_out = NULL;
    int64_t n = model_rows(&m->dims, b->T) * m->dims.d;
    if (g < tr->n_chunks - 1 &&
        take_message(tr, i, next, COMM_LANE_GRAD, message_tag(tr, k, g, 1), n, &dh_out, err) != 0)
        return -1;
    double t0 = pass_begin(tr, m, i), comm0 = m->comm_s;
    /* The chunk's last backward: each layer's gradients are final once it is done. */
    m->grads_ready = i == ch->last_backward ? trainer_layer_grads_ready : NULL;
    m->grads_ready_ctx = tr;
    double traced = train_trace_compute_begin(tr);
    int rc = model_backward(m, slot, b, dh_out, err);
    m->grads_ready = NULL;
    if (rc != 0)
        return -1;
    train_trace_pass_end(tr, "backward", &tr->plan, i, k, c, traced);
    pass_end(tr, m, i, k, t0, comm0);
    ch->slot_busy[slot] = 0;
    ch->slot_of[k] = -1;
    if (g > 0)
        return comm_isend(tr->comm, GROUP_PP, prev, COMM_LANE_GRAD, message_tag(tr, k, g - 1, 1),
                          model_input_grad(m, slot), n, &ch->send_dx[slot], err);
    return 0;
}

double trainer_measured_cp_rank_s(const Trainer *tr, int dp, int k, int cp)
{
    const Layout *l = &tr->lay;
    double t = 0;
    for (int pp = 0; pp < l->pp; pp++) {
        double slowest = 0;
        for (int tp = 0; tp < l->tp; tp++) {
            double x = tr->all_compute[(size_t)layout_rank_at(l, tp, cp, pp, dp) * tr->m + k];
            slowest = x > slowest ? x : slowest;
        }
        t += slowest;
    }
    return t;
}

/* Measured balance of the step from every rank's compute per micro-batch (tr->all_compute):
 * a micro-batch on CP rank r takes the sum over stages of the slowest TP rank; pp is the costliest
 * micro-batch (its slowest CP rank) over the mean, cp the worst micro-batch's slowest CP rank over
 * its CP mean - the definitions of plan_pp_imbalance and plan_cp_imbalance. */
static void measured_imbalance(const Trainer *tr, TrainStats *st)
{
    const Layout *l = &tr->lay;
    double worst_mb = 0, total = 0, worst_cp = 1;
    for (int dp = 0; dp < l->dp; dp++)
        for (int k = 0; k < tr->m; k++) {
            double mx = 0, sum = 0;
            for (int cp = 0; cp < l->cp; cp++) {
                double t = trainer_measured_cp_rank_s(tr, dp, k, cp);
                mx = t > mx ? t : mx;
                sum += t;
            }
            if (sum > 0 && mx * l->cp / sum > worst_cp)
                worst_cp = mx * l->cp / sum;
            worst_mb = mx > worst_mb ? mx : worst_mb;
            total += mx;
        }
    st->pp_imbalance_measured = total > 0 ? worst_mb * l->dp * tr->m / total : 1;
    st->cp_imbalance_measured = worst_cp;
}

/* Posts the receive of pass j of the schedule, if it has one (its micro-batch's inputs built ahead
 * when it is the first to need them: the message's size is its rows). */
static int post_receive(Trainer *tr, const PassRun *run, int j, Error *err)
{
    const SchedOp *op = &tr->sched[j];
    if (empty_micro_batch(tr, run->plan, op->mb))
        return 0;
    int s = tr->lay.pp_rank, g = op->chunk * tr->pp + s;
    int from = op->backward ? (s + 1) % tr->pp : (s - 1 + tr->pp) % tr->pp;
    if (op->backward ? g >= tr->n_chunks - 1 : g == 0)
        return 0;
    if (build_inputs(tr, run, op->mb, err) != 0)
        return -1;
    const ModelDims *d = &tr->chunks[op->chunk].model.dims;
    int64_t n = model_rows(d, tr->inputs[op->mb].T) * d->d;
    int a = j & 1;
    if (trainer_reserve_ahead(tr, a, n, err) != 0 ||
        comm_irecv(tr->comm, GROUP_PP, from, op->backward ? COMM_LANE_GRAD : COMM_LANE_ACT,
                   message_tag(tr, op->mb, g, op->backward), tr->recv_ahead[a], n, &tr->ahead_req[a], err) != 0)
        return -1;
    tr->ahead_pass[a] = j;
    return 0;
}

/* Every send of the pipeline's schedule finished (before the step's figures are read or the next
 * schedule reuses the slots' buffers). */
static int wait_sends(Trainer *tr, Error *err)
{
    for (int c = 0; c < tr->v; c++)
        for (int s = 0; s < tr->chunks[c].model.n_slots; s++)
            if (comm_wait(tr->comm, &tr->chunks[c].send_h[s], err) != 0 ||
                comm_wait(tr->comm, &tr->chunks[c].send_dx[s], err) != 0)
                return -1;
    return 0;
}

/* Forward only: micro-batch after micro-batch, each through this stage's chunks in order. Every
 * stage goes through the (micro-batch, global chunk) pairs in increasing order, and a pass waits
 * only for a smaller pair (its input) or, when its slot's previous output is still being sent, for
 * the next stage to receive a smaller pair: no stage waits forever. */
int trainer_forward_only(Trainer *tr, const StepPlan *plan, const DataSources *data, double *loss_sum, Error *err)
{
    return trainer_forward_eval(tr, plan, data, loss_sum, NULL, err);
}

int trainer_forward_eval(Trainer *tr, const StepPlan *plan, const DataSources *data, double *loss_sum,
                         PositionSums *pos, Error *err)
{
    if (replica_order(tr, plan, err) != 0)
        return -1;
    unsigned char *built = calloc((size_t)tr->m, 1);
    if (!built)
        return error_runtime(err, "train", "out of memory");
    PassRun run = {plan, data, 0, 0.0f, loss_sum, pos, built};
    int rc = 0;
    for (int k = 0; k < tr->m && rc == 0; k++)
        for (int c = 0; c < tr->v && rc == 0; c++)
            rc = run_forward(tr, &run, -1, k, c, err);
    free(built);
    return rc == 0 ? wait_sends(tr, err) : -1;
}

int trainer_forward_backward(Trainer *tr, TrainStats *st, Error *err)
{
    memset(st, 0, sizeof *st);
    double t0 = train_trace_host_begin(tr);
    if (plan_step(&tr->planner, &tr->plan, err) != 0)
        return -1;
    train_trace_host_end(tr, "plan", t0);
    if (trainer_check_plan(tr, &tr->plan, tr->fault_plan, err) != 0)
        return -1;
    return trainer_run_plan(tr, st, err);
}

int trainer_run_plan(Trainer *tr, TrainStats *st, Error *err)
{
    memset(st, 0, sizeof *st);
    if (replica_order(tr, &tr->plan, err) != 0)
        return -1;
    tr->n_targets = batch_step_targets(&tr->plan, &tr->data);
    tr->loss_sum = 0;
    unsigned char *built = calloc((size_t)tr->m, 1);
    if (!built)
        return error_runtime(err, "train", "out of memory");
    PassRun run = {&tr->plan, &tr->data, 1, tr->n_targets > 0 ? 1.0f / (float)tr->n_targets : 0.0f, &tr->loss_sum,
                   NULL, built};
    for (int c = 0; c < tr->v; c++) {
        Model *m = &tr->chunks[c].model;
        m->ops->zero(m->grads, m->n_params);
    }
    /* The NaN fault: a NaN in the first gradient of chunk 0 before the pipeline (the backward only
     * adds to it), so that this rank runs the same passes and collectives as the others. */
    if (tr->fault_nan) {
        float nan = NAN;
        Model *m = &tr->chunks[0].model;
        m->ops->to_device(m->grads, &nan, sizeof nan);
    }
    memset(tr->mb_compute, 0, (size_t)tr->m * sizeof *tr->mb_compute);
    memset(tr->pass_timed, 0, (size_t)tr->n_sched * sizeof *tr->pass_timed);
    comm_wait_reset(tr->comm);
    /* With parallel.overlap, each chunk's last backward pass starts its layers' gradient reductions. */
    for (int c = 0; c < tr->v; c++)
        tr->chunks[c].last_backward = -1;
    for (int i = 0; tr->cfg->parallel.overlap && i < tr->n_sched; i++)
        if (tr->sched[i].backward && !empty_micro_batch(tr, &tr->plan, tr->sched[i].mb))
            tr->chunks[tr->sched[i].chunk].last_backward = i;
    /* Receives posted one pass ahead, the first pass's before the loop: a lane's receives are then
     * issued in the order of the passes, the order the peer sends in (NCCL matches by order). */
    int ahead = tr->pp > 1 && comm_can_post_receives(tr->comm), rc = 0;
    if (ahead && tr->n_sched > 0)
        rc = post_receive(tr, &run, 0, err);
    for (int i = 0; i < tr->n_sched && rc == 0; i++) {
        const SchedOp *op = &tr->sched[i];
        if (ahead && i + 1 < tr->n_sched)
            rc = post_receive(tr, &run, i + 1, err);
        if (rc == 0)
            rc = op->backward ? run_backward(tr, i, op->mb, op->chunk, err)
                              : run_forward(tr, &run, i, op->mb, op->chunk, err);
    }
    free(built);
    if (rc != 0)
        return -1;
    read_pass_timers(tr);
    if (wait_sends(tr, err) != 0)
        return -1;
    /* The loss over the job: the head's TP rank 0 of every CP rank and replica holds a part. */
    double loss = tr->loss_sum;
    if (comm_allreduce_sum_f64(tr->comm, GROUP_WORLD, &loss, 1, err) != 0)
        return -1;
    st->loss = tr->n_targets > 0 ? loss / (double)tr->n_targets : 0;
    st->tokens = tr->plan.tokens;
    int64_t worst;
    st->pp_imbalance = plan_pp_imbalance(&tr->plan);
    st->cp_imbalance = plan_cp_imbalance(&tr->plan, &worst);
    if (comm_allgather_f64(tr->comm, GROUP_WORLD, tr->mb_compute, tr->all_compute, tr->m, err) != 0)
        return -1;
    measured_imbalance(tr, st);
    trainer_mb_balance(tr, st);
    st->queued = tr->plan.queued;
    st->token_delay_steps = tr->plan.tokens > 0 ? tr->plan.delay_token_steps / (double)tr->plan.tokens : 0;
    st->delayed_tokens = tr->plan.delayed_tokens;
    st->attn_pairs = (int64_t)plan_attn_pairs(&tr->plan); /* exact: far below 2^53 a step */
    double t0 = train_trace_host_begin(tr);
    rc = trainer_reduce_grads(tr, err);
    train_trace_host_end(tr, "grad_reduce", t0);
    return rc;
}
