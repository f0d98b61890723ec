/*
 * engine/optim.h - AdamW over a model's parameters, the learning-rate schedule and gradient
 * clipping.
 *
 * Schedule (step s = 1, 2, ...): linear warmup lr * s / warmup_steps, then from lr to min_lr over
 * the remaining steps: cosine min_lr + (lr - min_lr) (1 + cos(pi x)) / 2, linear lr - (lr - min_lr) x,
 * or constant lr, with x the fraction of the decay done. Clipping: when the global gradient norm is
 * above grad_clip, every gradient is scaled by grad_clip / norm. AdamW is PyTorch's (bias correction,
 * decoupled weight decay), with no decay on RMSNorm weights and embeddings unless
 * train.decay_norms_and_embeddings.
 */
#ifndef WLB_ENGINE_OPTIM_H
#define WLB_ENGINE_OPTIM_H

#include "config/config.h"
#include "engine/model.h"

typedef struct Optim {
    const ConfigTrain *cfg;
    float *m, *v; /* backend memory, like the parameters */
    int64_t step; /* updates done */
} Optim;

int optim_init(Optim *o, const ConfigTrain *cfg, const Model *model, Error *err);
void optim_free(Optim *o, const Model *model);
double optim_lr(const ConfigTrain *cfg, int64_t step);
/* Global gradient norm (before clipping), clips, and updates every parameter with the lr of the
 * next step. Returns the norm. */
double optim_step(Optim *o, Model *model, double *lr_out);

#endif
