/* engine/train/optim.c - see optim.h. */
#include "engine/train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The part of tensor t inside [o->begin, o->end): [*from, *to) in parameter offsets; 0 if none. */
static int overlap(const Optim *o, const ModelTensor *t, int64_t *from, int64_t *to)
{
    int64_t a = t->offset, b = t->offset + t->rows * t->cols;
    *from = a > o->begin ? a : o->begin;
    *to = b < o->end ? b : o->end;
    return *from < *to;
}

/* The range's runs of equal weight decay (matrices decay; norms and embeddings only with
 * train.decay_norms_and_embeddings), neighbours of equal decay merged. */
static int make_spans(Optim *o, const Model *model, Error *err)
{
    const ConfigTrain *c = o->cfg;
    o->spans = malloc((size_t)(model->n_tensors + 1) * sizeof *o->spans);
    if (!o->spans)
        return error_runtime(err, "optimizer", "out of memory");
    int64_t from, to;
    for (int i = 0; i < model->n_tensors; i++) {
        const ModelTensor *t = &model->tensors[i];
        if (!overlap(o, t, &from, &to))
            continue;
        float wd = t->decay || c->decay_norms_and_embeddings ? (float)c->weight_decay : 0.0f;
        AdamWSpan *last = o->n_spans ? &o->spans[o->n_spans - 1] : NULL;
        if (last && last->weight_decay == wd && last->end == from - o->begin)
            last->end = to - o->begin;
        else
            o->spans[o->n_spans++] = (AdamWSpan){from - o->begin, to - o->begin, wd};
    }
    return 0;
}

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
    return make_spans(o, model, err);
}

void optim_free(Optim *o, const Model *model)
{
    if (model->ops) {
        model->ops->free(o->m);
        model->ops->free(o->v);
    }
    free(o->spans);
    o->m = o->v = NULL;
    o->spans = NULL;
    o->n_spans = 0;
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

double optim_grad_sumsq(const Optim *o, const Model *model, const float *g)
{
    double sum = 0;
    int64_t from, to;
    for (int i = 0; i < model->n_tensors; i++)
        if (model->tensors[i].counts && overlap(o, &model->tensors[i], &from, &to))
            sum += model->ops->sum_squares(g + (from - o->begin), to - from);
    return sum;
}

double optim_update(Optim *o, Model *model, const float *g, double norm, int write_act)
{
    const ConfigTrain *c = o->cfg;
    o->step++;
    double lr = optim_lr(c, o->step - o->lr_step0);
    AdamWStep s = {(float)lr,
                   (float)c->beta1,
                   (float)c->beta2,
                   (float)c->eps,
                   (float)(1 - pow(c->beta1, (double)o->step)),
                   (float)(1 - pow(c->beta2, (double)o->step)),
                   c->grad_clip > 0 && norm > c->grad_clip ? (float)(c->grad_clip / norm) : 1.0f};
    Act *act = write_act && model->wact != (Act *)model->params ? ops_act(model->ops, model->wact, o->begin) : NULL;
    model->ops->adamw(model->params + o->begin, g, o->m, o->v, act, o->end - o->begin, o->spans, o->n_spans, s);
    return lr;
}
