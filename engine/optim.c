/* engine/optim.c - see optim.h. */
#include "engine/optim.h"

#include <math.h>
#include <string.h>

int optim_init(Optim *o, const ConfigTrain *cfg, const Model *model, Error *err)
{
    memset(o, 0, sizeof *o);
    o->cfg = cfg;
    o->m = model->ops->alloc((size_t)model->n_params * sizeof(float));
    o->v = model->ops->alloc((size_t)model->n_params * sizeof(float));
    if (!o->m || !o->v) {
        optim_free(o, model);
        return error_runtime(err, "optimizer", "out of memory for %lld moments", (long long)model->n_params);
    }
    return 0;
}

void optim_free(Optim *o, const Model *model)
{
    if (model->ops) {
        model->ops->free(o->m);
        model->ops->free(o->v);
    }
    o->m = o->v = NULL;
}

double optim_lr(const ConfigTrain *c, int64_t step)
{
    if (c->warmup_steps > 0 && step <= c->warmup_steps)
        return c->lr * (double)step / (double)c->warmup_steps;
    int64_t decay = c->steps - c->warmup_steps;
    double x = decay > 0 ? (double)(step - c->warmup_steps) / (double)decay : 1.0;
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    switch (c->schedule) {
    case SCHEDULE_COSINE:
        return c->min_lr + (c->lr - c->min_lr) * 0.5 * (1 + cos(M_PI * x));
    case SCHEDULE_LINEAR:
        return c->lr - (c->lr - c->min_lr) * x;
    default:
        return c->lr;
    }
}

double optim_step(Optim *o, Model *model, double *lr_out)
{
    const Ops *ops = model->ops;
    const ConfigTrain *c = o->cfg;
    double norm = sqrt(ops->sum_squares(model->grads, model->n_params));
    if (c->grad_clip > 0 && norm > c->grad_clip)
        ops->scale(model->grads, (float)(c->grad_clip / norm), model->n_params);
    o->step++;
    double lr = optim_lr(c, o->step);
    AdamWStep s = {(float)lr, (float)c->beta1, (float)c->beta2, (float)c->eps, 0,
                   (float)(1 - pow(c->beta1, (double)o->step)), (float)(1 - pow(c->beta2, (double)o->step))};
    for (int i = 0; i < model->n_tensors; i++) {
        const ModelTensor *t = &model->tensors[i];
        s.weight_decay = t->decay || c->decay_norms_and_embeddings ? (float)c->weight_decay : 0.0f;
        int64_t n = t->rows * t->cols;
        ops->adamw(model->params + t->offset, model->grads + t->offset, o->m + t->offset, o->v + t->offset, n, s);
    }
    *lr_out = lr;
    return norm;
}
