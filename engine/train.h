/*
 * engine/train.h - training: the loop of steps.
 *
 * Each step: the planner packs the step's documents (plan.h); every micro-batch is read (batch.h),
 * run forward and backward (model.h) with its gradients accumulated; the loss is the sum of token
 * losses over the step divided by its labeled tokens; then gradient clipping and AdamW (optim.h).
 * A line per log.every steps on stdout (step, loss, lr, grad norm, tokens, tokens/s, ms, time left)
 * and one JSON object per step in log.metrics.
 */
#ifndef WLB_ENGINE_TRAIN_H
#define WLB_ENGINE_TRAIN_H

#include "config/config.h"
#include "util/error.h"

int train_run(const Config *cfg, Error *err);

#endif
