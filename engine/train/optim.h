/*
 * engine/train/optim.h - AdamW over a range of a model's parameters, the learning-rate schedule and
 * gradient clipping.
 *
 * Schedule (step s = 1, 2, ... of the schedule: the update count less Optim.lr_step0): linear warmup lr * s / warmup_steps, then from lr to min_lr over
 * the remaining steps: cosine min_lr + (lr - min_lr) (1 + cos(pi x)) / 2, linear lr - (lr - min_lr) x,
 * or constant lr, with x the fraction of the decay done. Clipping: when the global gradient norm is
 * above grad_clip, every gradient is scaled by grad_clip / norm. AdamW is PyTorch's (bias correction,
 * decoupled weight decay), with no decay on RMSNorm weights and embeddings unless
 * train.decay_norms_and_embeddings.
 *
 * An Optim updates the parameters [begin, end) of a model (all of them, or with ZeRO-1 this rank's
 * shard) and keeps the two moments of just those. Gradients are passed as g, the gradients of
 * exactly that range (g[0] belongs to params[begin]).
 */
#ifndef WLB_ENGINE_OPTIM_H
#define WLB_ENGINE_OPTIM_H

#include "config/config.h"
#include "engine/model/model.h"

typedef struct Optim {
    const ConfigTrain *cfg;
    int64_t begin, end;
    float *m, *v;       /* backend memory, end - begin each */
    int64_t step;       /* updates done (AdamW's bias correction counts them) */
    int64_t lr_step0;   /* updates done before the LR schedule began: 0, or a continued run's
                         * (checkpoint.continue_schedule: restart); update n has the schedule's step
                         * n - lr_step0 */
    AdamWSpan *spans;   /* the range's runs of equal weight decay, relative to begin */
    int n_spans;
} Optim;

int optim_init(Optim *o, const ConfigTrain *cfg, const Model *model, int64_t begin, int64_t end, Error *err);
void optim_free(Optim *o, const Model *model);
double optim_lr(const ConfigTrain *cfg, int64_t step);
/* The sum of squares of g over the tensors that count (ModelTensor.counts): this rank's part of the
 * squared global norm. */
double optim_grad_sumsq(const Optim *o, const Model *model, const float *g);
/* Updates the range with the lr of the next step, which it returns: one AdamW over the range, its
 * gradients scaled by grad_clip / norm when norm > grad_clip (g itself is left as it is). With
 * write_act the compute-dtype copy of the range's weights is written in the same pass. */
double optim_update(Optim *o, Model *model, const float *g, double norm, int write_act);

#endif
