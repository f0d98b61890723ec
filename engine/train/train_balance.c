/*
 * engine/train/train_balance.c - the micro-batch balance of a step, predicted beside measured (see
 * train.h): what the wlb packer equalizes, the forward + backward time of each micro-batch of a
 * replica.
 *
 * Measured: the compute seconds of micro-batch k on every rank (tr->all_compute, communication
 * excluded, gathered over the job). A micro-batch's time on CP rank c is the sum over the pipeline
 * stages of the slowest TP rank's time (the stages run it one after another, the TP ranks side by
 * side); the micro-batch takes its slowest CP rank's time - the definition measured_imbalance
 * (train_pipeline.c) uses too.
 * Predicted, the same quantity from the cost model's per-layer figures of the plan: on CP rank c,
 *     n_layers x (attention + linear, forward + backward, of rank c)  +  output projection and loss
 *     (forward + backward) of rank c's tokens,
 * the slowest CP rank again. Communication is left out on both sides (the measurement takes the
 * host time spent in the exchanges off); the embedding is not predicted (a row gather: nothing
 * beside the rest).
 * Balance of a replica: max_k t_k / mean_k t_k over its M micro-batches (empty ones count as 0 on
 * both sides); a step reports its worst replica, mb_imbalance (predicted) and mb_imbalance_measured.
 */
#include "engine/train/train.h"

static double measured_mb_s(const Trainer *tr, int dp, int k)
{
    double worst = 0;
    for (int cp = 0; cp < tr->lay.cp; cp++) {
        double t = trainer_measured_cp_rank_s(tr, dp, k, cp);
        worst = t > worst ? t : worst;
    }
    return worst;
}

static double predicted_mb_s(const Trainer *tr, const PlanMicroBatch *mb)
{
    if (mb->tokens == 0)
        return 0;
    double worst = 0;
    for (int r = 0; r < tr->plan.cp; r++) {
        int64_t tokens = tr->plan.ranks[mb->first_rank + r].tokens;
        double t = tr->cost.n_layers * plan_rank_compute(&tr->plan, mb, r) + cost_head_fwd_s(&tr->cost, tokens) +
                   cost_head_bwd_s(&tr->cost, tokens);
        worst = t > worst ? t : worst;
    }
    return worst;
}

/* max / mean of n times; 1 when they are all 0. */
static double max_over_mean(const double *t, int n)
{
    double mx = 0, sum = 0;
    for (int k = 0; k < n; k++) {
        mx = t[k] > mx ? t[k] : mx;
        sum += t[k];
    }
    return sum > 0 ? mx * n / sum : 1;
}

void trainer_mb_balance(Trainer *tr, TrainStats *st)
{
    const StepPlan *p = &tr->plan;
    double *meas = tr->mb_s_measured, *pred = tr->mb_s_predicted;
    st->mb_imbalance = st->mb_imbalance_measured = 1;
    /* Replica 0 last, so that its times stay in the arrays. */
    for (int dp = tr->lay.dp - 1; dp >= 0; dp--) {
        for (int k = 0; k < tr->m; k++) {
            meas[k] = measured_mb_s(tr, dp, k);
            pred[k] = 0;
        }
        for (int64_t i = 0; i < (int64_t)p->dp * p->m; i++)
            if (p->mbs[i].replica == dp && p->mbs[i].order >= 0 && p->mbs[i].order < tr->m)
                pred[p->mbs[i].order] = predicted_mb_s(tr, &p->mbs[i]);
        double im = max_over_mean(meas, tr->m), ip = max_over_mean(pred, tr->m);
        st->mb_imbalance_measured = im > st->mb_imbalance_measured ? im : st->mb_imbalance_measured;
        st->mb_imbalance = ip > st->mb_imbalance ? ip : st->mb_imbalance;
    }
    st->mb_s_measured = meas;
    st->mb_s_predicted = pred;
    st->n_mb = tr->m;
}

static void write_ms_array(FILE *f, const char *key, const double *s, int n)
{
    fprintf(f, ",\"%s\":[", key);
    for (int k = 0; k < n; k++)
        fprintf(f, "%s%.4g", k ? "," : "", s[k] * 1e3);
    fputc(']', f);
}

void trainer_write_mb_metrics(FILE *f, const TrainStats *st)
{
    fprintf(f, ",\"mb_imbalance\":%.4f,\"mb_imbalance_measured\":%.4f", st->mb_imbalance, st->mb_imbalance_measured);
    if (st->busy_measured) /* the straggler figures beside slowest_rank (train_straggler.c) */
        fprintf(f, ",\"slowest_busy_s\":%.6g,\"median_busy_s\":%.6g", st->slowest_busy_s, st->median_busy_s);
    if (st->mb_s_predicted && st->mb_s_measured) {
        write_ms_array(f, "mb_ms_predicted", st->mb_s_predicted, st->n_mb);
        write_ms_array(f, "mb_ms_measured", st->mb_s_measured, st->n_mb);
    }
}
