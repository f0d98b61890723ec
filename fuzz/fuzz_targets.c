/* fuzz/fuzz_targets.c - the fuzz targets (see fuzz_targets.h). */
#include "fuzz/fuzz_targets.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "config/config.h"
#include "cpu/cpu_ops.h"
#include "data/data_idx.h"
#include "data/data_lengths.h"
#include "data/data_sources.h"
#include "data/data_stream.h"
#include "data/data_tokenizer.h"
#include "engine/plan/cost.h"
#include "engine/model/model.h"
#include "engine/plan/plan.h"
#include "util/ckpt_index.h"
#include "util/fileio.h"
#include "util/safetensors.h"
#include "util/statefile.h"

/* The model whose weights mode 2 loads (test/fuzz/checkpoint's seeds are of this shape). */
#define FUZZ_MODEL                                                                                  \
    "model: {n_layers: 1, d_model: 16, n_heads: 2, n_kv_heads: 1, d_ffn: 32, vocab_size: 260, rope_theta: " \
    "10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 64}\n"

/* A folder of this process for the files a target writes, removed at exit. */
static char scratch_dir[64];

static void remove_scratch(void)
{
    Error err = {0};
    file_remove_tree(scratch_dir, &err);
}

static const char *scratch(void)
{
    if (!scratch_dir[0]) {
        snprintf(scratch_dir, sizeof scratch_dir, "/tmp/wlbfuzz-%d-XXXXXX", (int)getpid());
        if (!mkdtemp(scratch_dir) || atexit(remove_scratch) != 0)
            abort();
    }
    return scratch_dir;
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        abort();
}

/* The input as the scratch folder's file `name`; its path (until the next call). */
static const char *scratch_input(const char *name, const uint8_t *data, size_t size)
{
    static char path[160];
    snprintf(path, sizeof path, "%s/%s", scratch(), name);
    write_file(path, data, size);
    return path;
}

int fuzz_config(const uint8_t *data, size_t size)
{
    char *yaml = malloc(size + 1);
    if (!yaml)
        abort();
    memcpy(yaml, data, size);
    yaml[size] = '\0';
    Config a, b;
    Error err = {0};
    config_init(&a);
    config_init(&b);
    if (config_load_string(&a, yaml, "fuzz.yaml", &err) == 0 && config_resolve(&a, 0, &err) == 0) {
        /* Printed, it loads back to the same config. */
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f || config_print(&a, f, &err) != 0 || fclose(f) != 0)
            abort();
        if (config_load_string(&b, text, "printed.yaml", &err) != 0 || config_resolve(&b, 0, &err) != 0 ||
            !config_equal(&a, &b)) {
            fprintf(stderr, "fuzz_config: the printed config does not load back equal: %s\n%s\n", err.msg, text);
            abort();
        }
        free(text);
    }
    config_free(&a);
    config_free(&b);
    free(yaml);
    return 0;
}

int fuzz_idx(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t n_idx = (size_t)(data[0] | data[1] << 8);
    if (n_idx > size - 2)
        n_idx = size - 2;
    char prefix[128], path[160];
    snprintf(prefix, sizeof prefix, "%s/set", scratch());
    snprintf(path, sizeof path, "%s.idx", prefix);
    write_file(path, data + 2, n_idx);
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_file(path, data + 2 + n_idx, size - 2 - n_idx);
    DataIdx d;
    Error err = {0};
    if (data_idx_open(&d, prefix, &err) != 0)
        return 0;
    static int32_t tokens[4096];
    for (uint64_t doc = 0; doc < d.n_docs && doc < 64; doc++) {
        uint64_t len = data_idx_doc_len(&d, doc), n = len < 4096 ? len : 4096;
        if (data_idx_read_tokens(&d, doc, len - n, n, tokens, &err) != 0) {
            fprintf(stderr, "fuzz_idx: an opened set fails to read document %llu: %s\n", (unsigned long long)doc,
                    err.msg);
            abort();
        }
    }
    data_idx_close(&d);
    return 0;
}

/* The planner and the data stream of a tiny dry-run config, over a list of lengths. */
typedef struct PlanSetup {
    Config cfg;
    DataSources data;
    DataStream stream;
    CostModel cost;
    Planner planner;
} PlanSetup;

/* lengths: a length list, or NULL for a small fixed one. Returns -1 (err set) where the list is
 * refused; any other failure aborts. */
static int plan_setup(PlanSetup *s, const char *lengths, Error *err)
{
    char fixed[128];
    if (!lengths) {
        snprintf(fixed, sizeof fixed, "%s/lengths.txt", scratch());
        if (access(fixed, F_OK) != 0) {
            static const uint8_t list[] = "5\n300\n17\n64\n1\n128\n40\n90\n250\n33\n8\n";
            write_file(fixed, list, sizeof list - 1);
        }
        lengths = fixed;
    }
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "model: {preset: tiny}\nparallel: {tp: 1, cp: 2, pp: 1, dp: 2, stage_layers: even}\n"
             "data: {lengths_file: %s, context_window: 128, global_batch_tokens: 512}\n"
             "balance: {packer: wlb, cp_sharding: hybrid, hardware: cpu}\n",
             lengths);
    config_init(&s->cfg);
    if (config_load_string(&s->cfg, yaml, "fuzz", err) != 0 || config_resolve(&s->cfg, 0, err) != 0) {
        fprintf(stderr, "fuzz: plan setup: %s\n", err->msg);
        abort();
    }
    if (data_sources_open(&s->data, NULL, NULL, 0, lengths, NULL, err) != 0) {
        config_free(&s->cfg);
        return -1;
    }
    if (data_stream_init(&s->stream, s->data.src, NULL, s->data.n, 1, 128, err) != 0) {
        data_sources_close(&s->data);
        config_free(&s->cfg);
        return -1;
    }
    if (cost_model_init(&s->cost, &s->cfg, err) != 0 ||
        plan_init(&s->planner, &s->cfg, &s->cost, &s->stream, PACKER_WLB, CP_HYBRID, err) != 0) {
        fprintf(stderr, "fuzz: plan setup: %s\n", err->msg);
        abort();
    }
    return 0;
}

static void plan_teardown(PlanSetup *s)
{
    plan_destroy(&s->planner);
    data_stream_free(&s->stream);
    data_sources_close(&s->data);
    config_free(&s->cfg);
}

/* Restores planner and stream from words and plans two steps: errors are fine, crashes are not. */
static void restore_and_plan(const uint64_t *planner, size_t n_planner, const uint64_t *stream, size_t n_stream)
{
    PlanSetup setup;
    Error err = {0};
    if (plan_setup(&setup, NULL, &err) != 0)
        abort();
    int ok = plan_state_restore(&setup.planner, planner, n_planner, &err) == 0 &&
             data_stream_restore(&setup.stream, stream, n_stream, &err) == 0;
    StepPlan plan = {0};
    for (int i = 0; ok && i < 2; i++)
        ok = plan_step(&setup.planner, &plan, &err) == 0;
    plan_free(&plan);
    plan_teardown(&setup);
}

/* A genuine planner and stream state after `steps` planned steps, edited by the input: records of
 * a u16 word index (modulo the words of both states) and a u64 value. */
static void edited_state(const uint8_t *data, size_t size)
{
    PlanSetup setup;
    Error err = {0};
    if (plan_setup(&setup, NULL, &err) != 0)
        abort();
    StepPlan plan = {0};
    int steps = size ? data[0] % 4 : 0;
    for (int i = 0; i < steps; i++)
        if (plan_step(&setup.planner, &plan, &err) != 0)
            abort();
    plan_free(&plan);
    size_t np = plan_state_words(&setup.planner), ns = data_stream_state_words(&setup.stream);
    uint64_t *w = malloc((np + ns + 1) * sizeof *w);
    if (!w)
        abort();
    plan_state_save(&setup.planner, w);
    data_stream_save(&setup.stream, w + np);
    plan_teardown(&setup);
    for (size_t at = size ? 1 : 0; at + 10 <= size; at += 10) {
        size_t k = (size_t)(data[at] | data[at + 1] << 8) % (np + ns);
        memcpy(&w[k], data + at + 2, 8);
    }
    restore_and_plan(w, np, w + np, ns);
    free(w);
}

/* The tiny model of FUZZ_MODEL, made once (kept to the end: the targets' leaks are off). */
static Model *fuzz_model(void)
{
    static Model m;
    static int ready;
    if (!ready) {
        Config cfg;
        Error err = {0};
        config_init(&cfg);
        if (config_load_string(&cfg, FUZZ_MODEL, "fuzz", &err) != 0 || config_resolve(&cfg, 0, &err) != 0 ||
            model_init(&m, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err) != 0)
            abort();
        config_free(&cfg);
        ready = 1;
    }
    return &m;
}

int fuzz_checkpoint(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 3;
    data++;
    size--;
    Error err = {0};
    if (mode == 2) {
        model_load(fuzz_model(), scratch_input("model.safetensors", data, size), &err);
        return 0;
    }
    if (mode == 1) {
        edited_state(data, size);
        return 0;
    }
    StateFile f;
    if (statefile_open(&f, scratch_input("state.bin", data, size), &err) != 0)
        return 0;
    const StateSection *p = statefile_find(&f, "planner"), *s = statefile_find(&f, "stream");
    if (p && s) {
        uint64_t *words = malloc((size_t)(p->size + s->size) + 16);
        if (!words)
            abort();
        memcpy(words, p->data, (size_t)p->size);
        memcpy(words + p->size / 8 + 1, s->data, (size_t)s->size);
        restore_and_plan(words, (size_t)(p->size / 8), words + p->size / 8 + 1, (size_t)(s->size / 8));
        free(words);
    }
    statefile_close(&f);
    return 0;
}

/* What ckpt_index_open promises of an index it accepts (fuzz_targets.h). */
static void check_index(const CkptIndex *ix)
{
    for (int i = 0; i < ix->n_chunks; i++) {
        const CkptChunk *c = &ix->chunks[i];
        int64_t at = 0;
        for (int k = 0; k < c->n_shards; k++) {
            if (c->shards[k].begin != at || c->shards[k].end < at || c->shards[k].file < 0 ||
                c->shards[k].file >= ix->n_files)
                abort();
            at = c->shards[k].end;
        }
        if (at != c->n || c->file < 0 || c->file >= ix->n_files)
            abort();
    }
    for (int i = 0; i < ix->n_tensors; i++) {
        const CkptTensor *t = &ix->tensors[i];
        int64_t area = 0;
        for (int k = 0; k < t->n_blocks; k++) {
            const CkptBlock *b = &t->blocks[k];
            if (b->chunk < 0 || b->chunk >= ix->n_chunks || b->row0 < 0 || b->rows <= 0 || b->col0 < 0 ||
                b->cols <= 0 || b->row0 + b->rows > t->rows || b->col0 + b->cols > t->cols || b->offset < 0 ||
                b->offset + b->rows * b->cols > ix->chunks[b->chunk].n)
                abort();
            area += b->rows * b->cols;
            for (int j = 0; j < k; j++) {
                const CkptBlock *o = &t->blocks[j];
                if (b->row0 < o->row0 + o->rows && o->row0 < b->row0 + b->rows && b->col0 < o->col0 + o->cols &&
                    o->col0 < b->col0 + b->cols)
                    abort();
            }
        }
        if (area != t->rows * t->cols)
            abort();
    }
}

int fuzz_ckpt_index(const uint8_t *data, size_t size)
{
    scratch_input("index.json", data, size);
    CkptIndex ix;
    Error err = {0};
    if (ckpt_index_open(&ix, scratch(), &err) != 0)
        return 0;
    check_index(&ix);
    /* The shard files are not there: reading a (small) tensor is an Error, whatever the index says. */
    for (int i = 0; i < ix.n_tensors; i++) {
        const CkptTensor *t = &ix.tensors[i];
        if (t->rows * t->cols > (1 << 20) || t->n_blocks == 0)
            continue;
        float *full = malloc((size_t)(t->rows * t->cols) * sizeof *full);
        float *tmp = malloc((size_t)(t->rows * t->cols) * sizeof *tmp);
        if (!full || !tmp)
            abort();
        for (int what = 0; what < 3; what++)
            if (ckpt_index_full(&ix, t, what, full, tmp, &err) == 0)
                abort();
        free(full);
        free(tmp);
    }
    ckpt_index_close(&ix);
    return 0;
}

/* What st_open promises of a file it opens (fuzz_targets.h). */
static void check_safetensors(const StFile *f)
{
    static const uint64_t bytes[] = {[ST_F32] = 4, [ST_F16] = 2, [ST_BF16] = 2, [ST_F64] = 8, [ST_I32] = 4, [ST_I64] = 8};
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)f->map.data[i] << (8 * i);
    if (n > f->map.size - 8)
        abort();
    const unsigned char *data = f->map.data + 8 + n;
    uint64_t data_size = f->map.size - 8 - n, covered = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const StTensor *t = &f->tensors[i];
        int64_t numel = 1;
        for (int d = 0; d < t->n_dims; d++)
            numel *= t->shape[d];
        if (t->numel != numel || t->data < data || (uint64_t)(t->data - data) > data_size ||
            (uint64_t)t->numel * bytes[t->dtype] > data_size - (uint64_t)(t->data - data))
            abort();
        for (int j = 0; j < i; j++) { /* no two tensors share a byte */
            const StTensor *o = &f->tensors[j];
            uint64_t a = (uint64_t)(t->data - data), b = a + (uint64_t)t->numel * bytes[t->dtype];
            uint64_t c = (uint64_t)(o->data - data), d = c + (uint64_t)o->numel * bytes[o->dtype];
            if (a < d && c < b)
                abort();
        }
        covered += (uint64_t)t->numel * bytes[t->dtype];
    }
    if (covered != data_size) /* and so, disjoint and inside, they fill it */
        abort();
}

int fuzz_safetensors(const uint8_t *data, size_t size)
{
    const char *path = scratch_input("weights.safetensors", data, size);
    StFile f;
    Error err = {0};
    if (st_open(&f, path, &err) == 0) {
        check_safetensors(&f);
        for (int i = 0; i < f.n_tensors; i++) { /* read whole: ASan sees any byte outside the mapping */
            const StTensor *t = &f.tensors[i];
            void *out = malloc((size_t)t->numel * sizeof(float) + 1);
            if (!out)
                abort();
            if (t->dtype == ST_I32 || t->dtype == ST_I64)
                st_read_i32(t, out);
            else
                st_read_f32(t, out);
            free(out);
        }
        st_close(&f);
    }
    model_load(fuzz_model(), path, &err);
    model_load(fuzz_model(), scratch_input("weights.bin", data, size), &err);
    return 0;
}

/* The input as a length list: byte 0 says how (bit 0: gzip-compressed, named .gz; bit 1: the CSV
 * column "tokens" rather than the last), the rest is the file. */
int fuzz_lengths(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int gz = data[0] & 1;
    const char *column = data[0] & 2 ? "tokens" : NULL;
    char path[160];
    snprintf(path, sizeof path, "%s/list%s", scratch(), gz ? ".txt.gz" : ".txt");
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f || (size > 1 && gzwrite(f, data + 1, (unsigned)(size - 1)) != (int)(size - 1)) || gzclose(f) != Z_OK)
            abort();
    } else {
        write_file(path, data + 1, size - 1);
    }
    DataLengths l;
    Error err = {0};
    if (data_lengths_load(&l, path, column, &err) != 0)
        return 0;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < l.n; i++) {
        if (l.len[i] == 0)
            abort();
        sum += l.len[i];
    }
    if (sum != l.n_tokens || l.skipped_negative > l.skipped)
        abort();
    char note[256]; /* formatted for ASan's sake (a write past the buffer), not read */
    if (l.skipped)
        data_lengths_skipped_note(&l, path, note, sizeof note);
    data_lengths_free(&l);
    /* The dry run over it: two steps planned, or an Error (an empty list, say). */
    PlanSetup setup;
    if (plan_setup(&setup, path, &err) != 0)
        return 0;
    StepPlan plan = {0};
    for (int i = 0; i < 2 && plan_step(&setup.planner, &plan, &err) == 0; i++)
        ;
    plan_free(&plan);
    plan_teardown(&setup);
    return 0;
}

/* Byte 0: bit 0 - byte-level (no ranks file), bit 1 - the gpt2 pattern forced (a ranks file),
 * bit 2 - special tokens matched in the text (a tokenizer.json); then a u16 length L, L bytes of
 * ranks file or tokenizer.json, and the rest is the text to encode. */
int fuzz_tokenizer(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    size_t n_ranks = (size_t)(data[1] | data[2] << 8);
    if (n_ranks > size - 3)
        n_ranks = size - 3;
    const char *ranks = data[0] & 1 ? NULL : scratch_input("ranks.tiktoken", data + 3, n_ranks);
    int json = ranks && n_ranks > 0 && data[3] == '{';
    Error err = {0};
    DataTokenizer *t = data_tokenizer_open(ranks, ranks && !json && data[0] & 2 ? "gpt2" : NULL, &err);
    if (!t)
        return 0;
    int specials = json && data[0] & 4;
    if (specials && data_tokenizer_match_specials(t, &err) != 0) {
        data_tokenizer_close(t);
        return 0;
    }
    const char *text = (const char *)data + 3 + n_ranks;
    size_t len = size - 3 - n_ranks;
    DataTokens ids = {0};
    if (data_tokenizer_encode(t, text, len, &ids, &err) != 0) {
        /* Only a tokenizer.json's own regex may fail on text (one that matches empty text). */
        if (!json || err.status != ERROR_INPUT) {
            fprintf(stderr, "fuzz_tokenizer: encoding failed: %s\n", err.msg);
            abort();
        }
        data_tokens_free(&ids);
        data_tokenizer_close(t);
        return 0;
    }
    /* Every id in the vocabulary; without specials matched the ids decode to the text, byte for
     * byte (specials give ids that have no bytes). */
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= data_tokenizer_vocab_size(t))
            abort();
    size_t back_len;
    char *back = specials ? NULL : data_tokenizer_decode(t, ids.ids, ids.n, &back_len, &err);
    if (!specials && (!back || back_len != len || (len && memcmp(back, text, len) != 0))) {
        fprintf(stderr, "fuzz_tokenizer: %zu bytes encode to %zu ids that decode to %zu bytes\n", len, ids.n,
                back ? back_len : 0);
        abort();
    }
    free(back);
    data_tokens_free(&ids);
    data_tokenizer_close(t);
    return 0;
}

/* The input as a calibration file (balance.calibration); one that loads must give a cost model
 * whose times are finite and not negative at every length. */
int fuzz_calibration(const uint8_t *data, size_t size)
{
    const char *path = scratch_input("profile.json", data, size);
    CostHardware hw = {0};
    CostAttnTable table = {0};
    Error err = {0};
    if (calibration_load(path, 0, &hw, &table, NULL, &err) != 0)
        return 0;
    if (table.n < 0 || table.n > COST_TABLE_MAX)
        abort();
    for (int i = 0; i < table.n; i++)
        if (!(table.fwd_tflops[i] > 0) || !(table.bwd_tflops[i] > 0) || !isfinite(table.fwd_tflops[i]) ||
            !isfinite(table.bwd_tflops[i]) || (i && !(table.q[i] > table.q[i - 1])))
            abort();
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "model: {preset: tiny}\nparallel: {tp: 2, cp: 2, pp: 2, dp: 1}\n"
             "data: {lengths_file: x, context_window: 4096, global_batch_tokens: 16384}\n"
             "balance: {hardware: h100, calibration: %s}\n",
             path);
    Config cfg;
    CostModel m;
    config_init(&cfg);
    if (config_load_string(&cfg, yaml, "fuzz", &err) != 0 || config_resolve(&cfg, 0, &err) != 0 ||
        cost_model_init(&m, &cfg, &err) != 0) {
        fprintf(stderr, "fuzz_calibration: a profile that loads is refused by the cost model: %s\n", err.msg);
        abort();
    }
    for (int64_t n = 1; n <= (int64_t)1 << 22; n *= 3) {
        double t[] = {cost_attn_fwd_s(&m, n, n), cost_attn_bwd_s(&m, n, n), cost_doc_s(&m, n), cost_tp_comm_s(&m, n),
                      cost_cp_comm_s(&m, n)};
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
            if (!isfinite(t[k]) || t[k] < 0) {
                fprintf(stderr, "fuzz_calibration: cost %zu at %lld tokens is %g\n", k, (long long)n, t[k]);
                abort();
            }
    }
    config_free(&cfg);
    return 0;
}
