/* engine/train/optim.c - see optim.h. */
#include "engine/train/optim.h"

#include <math.h>
#include <string.h>

int optim_init(Optim *o, const ConfigTrain *cfg, const Model *model, int64_t begin, int64_t end, Error *err)
{
    memset(o, 0, sizeof *o);
    o->cfg = cfg;
    o->begin = begin;
    o->end = end;
    o->m = model->ops->alloc((size_t)(end - begin) * sizeof(float));
    o->v = model->ops->alloc((size_t)(end - begin) * sizeof(float));
    if (!o->m || !o->v) {
        optim_free(o, model);
        return error_runtime(err, "optimizer", "out of memory for %lld moments", (long long)(end - begin));
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

/* The part of tensor t inside [o->begin, o->end): [*from, *to) in parameter offsets; 0 if none. */
static int overlap(const Optim *o, const ModelTensor *t, int64_t *from, int64_t *to)
{
    int64_t a = t->offset, b = t->offset + t->rows * t->cols;
    *from = a > o->begin ? a : o->begin;
    *to = b < o->end ? b : o->end;
    return *from < *to;
}

double optim_grad_sumsq(const Optim *o, const Model *model, const float *g)
{
    double sum = 0;
    int64_t from, to;
    for (int i = 0; i < model->n_tensors; i++)
        if (model->tensors[i].counts && overlap(o, &model->tensors[i], &from, &to))
            sum += model->ops->sum_squares(g + (from - o->begin), to - from);
    return sum;
}

double optim_update(Optim *o, Model *model, float *g, double norm)
{
    const Ops *ops = model->ops;
    const ConfigTrain *c = o->cfg;
    if (c->grad_clip > 0 && norm > c->grad_clip)
        ops->scale(g, (float)(c->grad_clip / norm), o->end - o->begin);
    o->step++;
    double lr = optim_lr(c, o->step);
    AdamWStep s = {(float)lr, (float)c->beta1, (float)c->beta2, (float)c->eps, 0,
                   (float)(1 - pow(c->beta1, (double)o->step)), (float)(1 - pow(c->beta2, (double)o->step))};
    int64_t from, to;
    for (int i = 0; i < model->n_tensors; i++) {
        const ModelTensor *t = &model->tensors[i];
        if (!overlap(o, t, &from, &to))
            continue;
        s.weight_decay = t->decay || c->decay_norms_and_embeddings ? (float)c->weight_decay : 0.0f;
        int64_t k = from - o->begin;
        ops->adamw(model->params + from, g + k, o->m + k, o->v + k, to - from, s);
    }
    return lr;
}
