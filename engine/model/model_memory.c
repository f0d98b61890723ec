/*
 * engine/model/model_memory.c - the activation memory of a model chunk (see model.h): what each
 * slot keeps per layer under train.recompute, the scratch the slots share, their sizes, growth on
 * demand, and the out-of-memory message.
 *
 * One table per kind of array drives both the allocation (model_reserve) and the accounting
 * (model_memory), so the bytes the message and the dry run report are the bytes allocated.
 *
 * What a layer keeps (x is the slot's h[l], kept in every mode: it is the previous layer's output):
 *   none       everything its backward reads: a, rstd1, qkv, (k_mb, v_mb), att, lse, y, b, rstd2, gu, s
 *   selective  qkv, (k_mb, v_mb), att, lse, y, gu: the products' outputs and attention's; the norms
 *              (a, b and their rstd) and silu(g) u are recomputed in the backward - element-wise work
 *   full       nothing: the backward runs the layer's forward again from x (its collectives too)
 * What is not kept lives once, in the model's scratch m->rc, and is overwritten layer after layer.
 * With sequence parallelism the residual stream and the norms' arrays (x, a, rstd1, y, b, rstd2)
 * have R = ceil(T / tp) rows instead of T, so `full` keeps only x on R rows per layer; the products'
 * and attention's arrays keep T rows (their columns are the rank's heads and FFN columns already).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model_impl.h"

enum { KEEP_NONE = 1, KEEP_SELECTIVE = 2 };
enum { EL_ACT = 0, EL_F32 = 4, EL_F64 = 8 }; /* element kinds: the compute dtype, float, double */

/* The rows an array has: this CP rank's T, the micro-batch's T_mb (CP), the residual stream's R on
 * this TP rank (T, or ceil(T / tp) with SP), T padded to Tp = R tp (the rows of an SP exchange), or
 * none (a fixed size: width elements). */
typedef enum RowKind { ROWS_T, ROWS_MB, ROWS_R, ROWS_TP, ROWS_FIXED } RowKind;

typedef struct Rows {
    int64_t T, mb, R, Tp;
} Rows;

static Rows rows_of(const ModelDims *d, int64_t T, int64_t mb)
{
    int64_t R = model_rows(d, T);
    return (Rows){T, mb, R, d->sp ? R * d->tp : T};
}

/* An array at byte offset `field` of its struct: elements of `kind`, `width` per row of `rows`;
 * `keep`: the modes in which each layer keeps its own. */
typedef struct ArraySpec {
    size_t field;
    int kind;
    int64_t width;
    RowKind rows;
    int keep;
} ArraySpec;

static size_t elem_bytes(int kind, size_t act_bytes) { return kind == EL_ACT ? act_bytes : (size_t)kind; }

static int64_t qkv_width(const ModelDims *d)
{
    return (int64_t)(d->local_heads + 2 * d->local_kv_heads) * d->head_dim;
}

enum { N_LAYER_ARRAYS = 12 };

static void layer_arrays(const ModelDims *d, ArraySpec *a)
{
    int64_t D = d->d, H = d->local_heads, lhd = H * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t F = d->local_ffn, cp = d->cp > 1;
    const int all = KEEP_NONE | KEEP_SELECTIVE;
    ArraySpec t[N_LAYER_ARRAYS] = {
        {offsetof(LayerActs, a), EL_ACT, D, ROWS_R, KEEP_NONE},
        {offsetof(LayerActs, rstd1), EL_F32, 1, ROWS_R, KEEP_NONE},
        {offsetof(LayerActs, qkv), EL_ACT, qkv_width(d), ROWS_T, all},
        {offsetof(LayerActs, k_mb), EL_ACT, cp ? lkv : 0, ROWS_MB, all},
        {offsetof(LayerActs, v_mb), EL_ACT, cp ? lkv : 0, ROWS_MB, all},
        {offsetof(LayerActs, att), EL_ACT, lhd, ROWS_T, all},
        {offsetof(LayerActs, lse), EL_F32, H, ROWS_T, all},
        {offsetof(LayerActs, y), EL_F32, D, ROWS_R, all},
        {offsetof(LayerActs, b), EL_ACT, D, ROWS_R, KEEP_NONE},
        {offsetof(LayerActs, rstd2), EL_F32, 1, ROWS_R, KEEP_NONE},
        {offsetof(LayerActs, gu), EL_ACT, 2 * F, ROWS_T, all},
        {offsetof(LayerActs, s), EL_ACT, F, ROWS_T, KEEP_NONE},
    };
    memcpy(a, t, sizeof t);
}

static int kept(const ArraySpec *a, Recompute r)
{
    return r == RECOMPUTE_NONE ? (a->keep & KEEP_NONE) != 0 : r == RECOMPUTE_SELECTIVE ? (a->keep & KEEP_SELECTIVE) != 0 : 0;
}

enum { N_SLOT_ARRAYS = 4 };

/* A slot's arrays besides the residual buffers h[] and the layers' (width 0: none on this chunk). */
static void slot_arrays(const ModelDims *d, ArraySpec *a)
{
    int64_t D = d->d;
    ArraySpec t[N_SLOT_ARRAYS] = {
        {offsetof(ModelSlot, hn), EL_ACT, d->has_head ? D : 0, ROWS_R, 0},
        {offsetof(ModelSlot, rstd_f), EL_F32, d->has_head ? 1 : 0, ROWS_R, 0},
        {offsetof(ModelSlot, dhn), EL_F32, d->has_head ? D : 0, ROWS_R, 0},
        {offsetof(ModelSlot, dx), EL_F32, d->has_embed ? 0 : D, ROWS_R, 0},
    };
    memcpy(a, t, sizeof t);
}

enum { N_SCRATCH_ARRAYS = 21 };

/* The scratch the slots share; the head's logits block is a fixed size (model_head_tiles). */
static void scratch_arrays(const ModelDims *d, HeadTiles head, ArraySpec *a)
{
    int64_t D = d->d, lhd = (int64_t)d->local_heads * d->head_dim, lkv = (int64_t)d->local_kv_heads * d->head_dim;
    int64_t F = d->local_ffn, Q = qkv_width(d), cp = d->cp > 1, sp = d->sp;
    int64_t block = d->has_head ? head.rows * head.cols : 0, head_rows = d->has_head ? head.rows : 0;
    int64_t H = d->local_heads;
    ArraySpec t[N_SCRATCH_ARRAYS] = {
        {offsetof(Model, dh), EL_F32, D, ROWS_R, 0},
        {offsetof(Model, dh_act), EL_ACT, D, ROWS_R, 0},
        {offsetof(Model, tmp), EL_F32, D, ROWS_TP, 0},
        {offsetof(Model, g32), EL_F32, F > Q ? F : Q, ROWS_T, 0},
        {offsetof(Model, dgu), EL_ACT, 2 * F, ROWS_T, 0},
        {offsetof(Model, datt), EL_ACT, lhd, ROWS_T, 0},
        {offsetof(Model, dqkv), EL_ACT, Q, ROWS_T, 0},
        {offsetof(Model, sp_full), EL_ACT, sp ? D : 0, ROWS_TP, 0},
        {offsetof(Model, sp_part), EL_F32, sp ? D : 0, ROWS_R, 0},
        {offsetof(Model, dk_mb), EL_F32, cp ? lkv : 0, ROWS_MB, 0},
        {offsetof(Model, dv_mb), EL_F32, cp ? lkv : 0, ROWS_MB, 0},
        {offsetof(Model, xfer), EL_F32, cp ? 2 * lkv : 0, ROWS_MB, 0},
        {offsetof(Model, xfer2), EL_F32, cp ? 2 * lkv : 0, ROWS_MB, 0},
        /* the sharded documents' attention block by block (model_cp.c) */
        {offsetof(Model, att_acc), EL_F32, cp ? lhd : 0, ROWS_T, 0},
        {offsetof(Model, att_acc_lse), EL_F32, cp ? H : 0, ROWS_T, 0},
        {offsetof(Model, att_part), EL_ACT, cp ? lhd : 0, ROWS_T, 0},
        {offsetof(Model, att_part_lse), EL_F32, cp ? H : 0, ROWS_T, 0},
        /* the head's block of logits, rows x a tile of columns, and its gradient; per row of it the
         * softmax statistics and lse (stored as "width" so that T does not scale them) */
        {offsetof(Model, logits), EL_F32, block, ROWS_FIXED, 0},
        {offsetof(Model, dlogits), EL_ACT, block, ROWS_FIXED, 0},
        {offsetof(Model, stats), EL_F64, 3 * head_rows, ROWS_FIXED, 0},
        {offsetof(Model, lse), EL_F64, head_rows, ROWS_FIXED, 0},
    };
    memcpy(a, t, sizeof t);
}

/* Elements of array a for the rows r. */
static int64_t elems(const ArraySpec *a, const Rows *r)
{
    switch (a->rows) {
    case ROWS_T: return a->width * r->T;
    case ROWS_MB: return a->width * r->mb;
    case ROWS_R: return a->width * r->R;
    case ROWS_TP: return a->width * r->Tp;
    case ROWS_FIXED: break;
    }
    return a->width;
}

HeadTiles model_head_tiles(const ModelDims *d, int64_t logits_floats, int64_t T)
{
    int64_t V = d->local_vocab > 0 ? d->local_vocab : 1, floats = logits_floats > 1 ? logits_floats : 1;
    int64_t T1 = T > 0 ? T : 1, whole = floats / V; /* rows of whole slices a block holds */
    HeadTiles t;
    if (whole >= MODEL_HEAD_MIN_ROWS || whole >= T1) {
        t.rows = whole < T1 ? whole : T1;
        t.cols = V;
    } else {
        t.rows = T1 < MODEL_HEAD_MIN_ROWS ? T1 : MODEL_HEAD_MIN_ROWS;
        t.rows = t.rows < floats ? t.rows : floats;
        t.cols = floats / t.rows;
    }
    return t;
}

ModelMemory model_memory(const ModelDims *d, int64_t T, int64_t T_mb, Recompute r, size_t act_bytes,
                         int64_t logits_floats)
{
    ModelMemory mem = {0, 0};
    int64_t layers = d->layer_end - d->layer_begin;
    Rows rows = rows_of(d, T, d->cp > 1 ? T_mb : 0);
    ArraySpec la[N_LAYER_ARRAYS], sa[N_SLOT_ARRAYS], xa[N_SCRATCH_ARRAYS];
    layer_arrays(d, la);
    slot_arrays(d, sa);
    scratch_arrays(d, model_head_tiles(d, logits_floats, T), xa);
    mem.slot_bytes = (layers + 1) * rows.R * d->d * 4; /* h[0 .. layers] */
    for (int i = 0; i < N_LAYER_ARRAYS; i++) {
        int64_t b = elems(&la[i], &rows) * (int64_t)elem_bytes(la[i].kind, act_bytes);
        if (kept(&la[i], r))
            mem.slot_bytes += layers * b;
        else if (layers > 0)
            mem.scratch_bytes += b;
    }
    for (int i = 0; i < N_SLOT_ARRAYS; i++)
        mem.slot_bytes += elems(&sa[i], &rows) * (int64_t)elem_bytes(sa[i].kind, act_bytes);
    for (int i = 0; i < N_SCRATCH_ARRAYS; i++)
        mem.scratch_bytes += elems(&xa[i], &rows) * (int64_t)elem_bytes(xa[i].kind, act_bytes);
    return mem;
}

/* ---------------------------------------------------------------------------------------------- */
/* Allocation                                                                                      */

/* The pointer at byte offset `field` of base. */
static void *get_ptr(const void *base, size_t field)
{
    void *p;
    memcpy(&p, (const char *)base + field, sizeof p);
    return p;
}

static void set_ptr(void *base, size_t field, void *p) { memcpy((char *)base + field, &p, sizeof p); }

/* Allocates array a of base for T, mb rows (nothing for none); 0, or -1 when memory ran out. */
static int alloc_array(const Model *m, void *base, const ArraySpec *a, int64_t T, int64_t mb)
{
    Rows rows = rows_of(&m->dims, T, mb);
    int64_t n = elems(a, &rows);
    if (n <= 0) {
        set_ptr(base, a->field, NULL);
        return 0;
    }
    void *p = m->ops->alloc((size_t)n * elem_bytes(a->kind, m->ops->act_bytes));
    set_ptr(base, a->field, p);
    return p ? 0 : -1;
}

static void free_array(const Model *m, void *base, const ArraySpec *a)
{
    m->ops->free(get_ptr(base, a->field));
    set_ptr(base, a->field, NULL);
}

static int n_layers(const Model *m) { return m->dims.layer_end - m->dims.layer_begin; }

static void free_slot(const Model *m, ModelSlot *s)
{
    ArraySpec la[N_LAYER_ARRAYS], sa[N_SLOT_ARRAYS];
    layer_arrays(&m->dims, la);
    slot_arrays(&m->dims, sa);
    for (int l = 0; s->layers && l < n_layers(m); l++)
        for (int i = 0; i < N_LAYER_ARRAYS; i++)
            if (kept(&la[i], m->recompute))
                free_array(m, &s->layers[l], &la[i]);
    for (int l = 0; s->h && l <= n_layers(m); l++)
        m->ops->free(s->h[l]);
    for (int i = 0; i < N_SLOT_ARRAYS; i++)
        free_array(m, s, &sa[i]);
    free(s->layers);
    free(s->h);
    memset(s, 0, sizeof *s);
}

static void free_scratch(Model *m)
{
    ArraySpec la[N_LAYER_ARRAYS], xa[N_SCRATCH_ARRAYS];
    layer_arrays(&m->dims, la);
    scratch_arrays(&m->dims, (HeadTiles){1, 1}, xa);
    for (int i = 0; i < N_LAYER_ARRAYS; i++)
        if (!kept(&la[i], m->recompute))
            free_array(m, &m->rc, &la[i]);
    for (int i = 0; i < N_SCRATCH_ARRAYS; i++)
        free_array(m, m, &xa[i]);
    free(m->h_stats);
    free(m->h_lse);
    free(m->h_targets);
    m->h_stats = m->h_lse = NULL;
    m->h_targets = NULL;
    m->cap = m->cap_mb = 0;
}

/* The layers of slot s read what they do not keep from the model's scratch (which may have moved). */
static void link_scratch(Model *m, ModelSlot *s)
{
    ArraySpec la[N_LAYER_ARRAYS];
    layer_arrays(&m->dims, la);
    for (int l = 0; s->layers && l < n_layers(m); l++)
        for (int i = 0; i < N_LAYER_ARRAYS; i++)
            if (!kept(&la[i], m->recompute))
                set_ptr(&s->layers[l], la[i].field, get_ptr(&m->rc, la[i].field));
}

static int alloc_slot(Model *m, ModelSlot *s, int64_t T, int64_t mb)
{
    ArraySpec la[N_LAYER_ARRAYS], sa[N_SLOT_ARRAYS];
    layer_arrays(&m->dims, la);
    slot_arrays(&m->dims, sa);
    int L = n_layers(m), ok = 1;
    s->layers = calloc((size_t)L + 1, sizeof *s->layers);
    s->h = calloc((size_t)L + 1, sizeof *s->h);
    if (!s->layers || !s->h)
        return -1;
    for (int l = 0; l <= L; l++)
        ok &= (s->h[l] = m->ops->alloc((size_t)(model_rows(&m->dims, T) * m->dims.d) * sizeof(float))) != NULL;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < N_LAYER_ARRAYS; i++)
            if (kept(&la[i], m->recompute))
                ok &= alloc_array(m, &s->layers[l], &la[i], T, mb) == 0;
    for (int i = 0; i < N_SLOT_ARRAYS; i++)
        ok &= alloc_array(m, s, &sa[i], T, mb) == 0;
    s->cap = T;
    s->cap_mb = mb;
    return ok ? 0 : -1;
}

static int alloc_scratch(Model *m, int64_t T, int64_t mb)
{
    ArraySpec la[N_LAYER_ARRAYS], xa[N_SCRATCH_ARRAYS];
    layer_arrays(&m->dims, la);
    HeadTiles head = model_head_tiles(&m->dims, m->logits_floats, T);
    int64_t rows = head.rows;
    scratch_arrays(&m->dims, head, xa);
    int ok = 1;
    for (int i = 0; i < N_LAYER_ARRAYS; i++)
        if (!kept(&la[i], m->recompute) && n_layers(m) > 0)
            ok &= alloc_array(m, &m->rc, &la[i], T, mb) == 0;
    for (int i = 0; i < N_SCRATCH_ARRAYS; i++)
        ok &= alloc_array(m, m, &xa[i], T, mb) == 0;
    ok &= (m->h_stats = malloc((size_t)(3 * rows) * sizeof(double))) != NULL;
    ok &= (m->h_lse = malloc((size_t)rows * sizeof(double))) != NULL;
    ok &= (m->h_targets = malloc((size_t)rows * sizeof(int32_t))) != NULL;
    m->cap = T;
    m->cap_mb = mb;
    return ok ? 0 : -1;
}

void model_free_activations(Model *m)
{
    for (int i = 0; m->slots && i < m->n_slots; i++)
        free_slot(m, &m->slots[i]);
    free_scratch(m);
}

int model_set_slots(Model *m, int n, Error *err)
{
    for (int i = 0; i < m->n_slots; i++)
        free_slot(m, &m->slots[i]);
    free(m->slots);
    m->slots = calloc((size_t)n, sizeof *m->slots);
    m->n_slots = m->slots ? n : 0;
    return m->slots ? 0 : error_runtime(err, "model", "out of memory");
}

/* bytes as "12.3 GiB", or in MiB below a GiB. */
static const char *human(double bytes, char *buf, size_t size)
{
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, size, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
    else
        snprintf(buf, size, "%.1f MiB", bytes / (1024.0 * 1024));
    return buf;
}

/* The out-of-memory Error: what T rows need (kept per slot x slots in flight + scratch), what the
 * device has free, and what the other recompute modes would need. */
static int memory_error(Model *m, int64_t T, int64_t mb, Error *err)
{
    const Ops *o = m->ops;
    size_t free_b = 0, total_b = 0;
    o->memory(&free_b, &total_b);
    ModelMemory need = model_memory(&m->dims, T, mb, m->recompute, o->act_bytes, m->logits_floats);
    double all = (double)need.slot_bytes * m->n_slots + (double)need.scratch_bytes;
    char other[256] = "", b[6][32];
    for (int r = m->recompute + 1; r <= RECOMPUTE_FULL; r++) {
        ModelMemory x = model_memory(&m->dims, T, mb, (Recompute)r, o->act_bytes, m->logits_floats);
        size_t len = strlen(other);
        snprintf(other + len, sizeof other - len, "%strain.recompute: %s would need %s", len ? ", " : "",
                 config_recompute_name(r),
                 human((double)x.slot_bytes * m->n_slots + (double)x.scratch_bytes, b[5], sizeof b[5]));
    }
    return error_runtime(err, "model", "out of memory for the activations of %lld tokens: they need %s (%s kept per "
                         "micro-batch x %d in flight + %s of scratch, train.recompute: %s) and the device has %s free "
                         "of %s beside the weights; %s%sfewer tokens per rank help too "
                         "(balance.max_tokens_per_micro_batch, data.context_window, more parallel.cp, parallel.tp or "
                         "parallel.pp)",
                         (long long)T, human(all, b[0], sizeof b[0]), human((double)need.slot_bytes, b[1], sizeof b[1]),
                         m->n_slots, human((double)need.scratch_bytes, b[2], sizeof b[2]),
                         config_recompute_name(m->recompute),
                         human((double)free_b, b[3], sizeof b[3]), human((double)total_b, b[4], sizeof b[4]), other,
                         other[0] ? "; " : "");
}

int64_t model_largest_sum(const ModelDims *d, int64_t rank_rows, int64_t mb_tokens)
{
    int64_t rows = model_rows(d, rank_rows);
    int64_t tp_sum = d->tp > 1 ? (d->sp ? rows * d->tp : rows) * d->d : 0;
    int64_t cp_sum = d->cp > 1 ? 2 * (int64_t)d->local_kv_heads * d->head_dim * mb_tokens : 0;
    return tp_sum > cp_sum ? tp_sum : cp_sum;
}

int model_reserve(Model *m, int slot, int64_t T, int64_t T_mb, Error *err)
{
    int64_t mb = m->dims.cp > 1 ? T_mb : 0;
    ModelSlot *s = &m->slots[slot];
    int ok = 1, moved = 0;
    if (T > s->cap || mb > s->cap_mb) {
        /* Grow to cover what the slot held before as well: shapes vary from micro-batch to
         * micro-batch. */
        T = T > s->cap ? T : s->cap;
        mb = mb > s->cap_mb ? mb : s->cap_mb;
        free_slot(m, s);
        ok = alloc_slot(m, s, T, mb) == 0;
    }
    if (ok && (T > m->cap || mb > m->cap_mb)) {
        T = T > m->cap ? T : m->cap;
        mb = mb > m->cap_mb ? mb : m->cap_mb;
        free_scratch(m);
        ok = alloc_scratch(m, T, mb) == 0;
        moved = 1;
        /* the attention's own buffers (cuDNN's, on a GPU) for calls over these rows */
        const ModelDims *d = &m->dims;
        const int64_t rows = T > mb ? T : mb;
        if (ok && m->ops->attention_reserve &&
            m->ops->attention_reserve(d->local_heads, d->local_kv_heads, d->head_dim, rows) != 0) {
            free_slot(m, s);
            free_scratch(m);
            return error_runtime(err, "model", "out of memory for cuDNN's attention buffers of %lld rows beside the "
                                 "activations (the dry run's memory table counts them under other; train.attention: "
                                 "own needs none; fewer tokens per rank help too)",
                                 (long long)rows);
        }
    }
    if (!ok) {
        free_slot(m, s);
        free_scratch(m);
        return memory_error(m, T, mb, err);
    }
    for (int i = 0; i < m->n_slots; i++)
        if (moved || i == slot)
            link_scratch(m, &m->slots[i]);
    return 0;
}
