/*
 * test/test_weight_files.c - the weight files a user hands wlbtrain (train.init_from), read safely.
 *
 * 1 safetensors round trip: what st_write writes, st_open reads back (dtypes, shapes, values,
 *   metadata), and every tensor's bytes lie inside the file's data section.
 * 2 crafted safetensors files, each refused with one error saying what is wrong: tensors whose
 *   bytes run past the end of the file - by one byte, and by exactly the JSON header's size (what a
 *   reader that counts the header in the data section accepts, reading past the mapping) -, an end
 *   before its begin, a negative or non-integer offset, a size that is not the shape's x the dtype's,
 *   a shape whose product overflows, two tensors sharing bytes, bytes that belong to no tensor, a
 *   name twice, a header length past the end or too short, a header that is not a JSON object, an
 *   unknown dtype; and a valid crafted file opens (the builder is right), as do files whose empty
 *   tensors start at the offset of the next tensor (first, between two, two at one offset).
 * 3 model_load tells the formats apart by content and says what the name promised: random bytes
 *   named .safetensors, .bin or neither; a truncated and an extended llama2.c model; a zip archive
 *   named .bin; JSON text named .safetensors; a 3-byte file; a llama2.c model named .safetensors and
 *   a safetensors file named .bin load (content decides). No message reports dimensions read from
 *   bytes that are not a header.
 */
#include "test/testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "cpu/cpu_ops.h"
#include "engine/model/model.h"
#include "util/safetensors.h"

/* A safetensors file: the 8-byte length of header (padded with spaces to header_len bytes), the
 * header, then data_len bytes 0, 1, 2, ... */
static char *craft(const char *dir, const char *name, const char *header, size_t header_len, size_t data_len)
{
    size_t n = strlen(header) > header_len ? strlen(header) : header_len, size = 8 + n + data_len;
    char *raw = malloc(size);
    assert_non_null(raw);
    for (int i = 0; i < 8; i++)
        raw[i] = (char)((uint64_t)n >> (8 * i));
    memset(raw + 8, ' ', n);
    memcpy(raw + 8, header, strlen(header));
    for (size_t i = 0; i < data_len; i++)
        raw[8 + n + i] = (char)i;
    char *path = test_write_file(dir, name, raw, size);
    free(raw);
    return path;
}

static void open_fails(const char *dir, const char *header, size_t header_len, size_t data_len, const char *expect)
{
    char *path = craft(dir, "bad.safetensors", header, header_len, data_len);
    StFile f;
    Error err = {0};
    int rc = st_open(&f, path, &err);
    if (rc == 0 || err.status != 2 || !strstr(err.msg, expect)) {
        print_error("header %s (+%zu data bytes): expected an error with '%s', got rc %d: %s\n", header, data_len,
                    expect, rc, err.msg);
        if (rc == 0)
            st_close(&f);
        fail();
    }
    free(path);
}

/* Every tensor of an opened file lies inside its data section. */
static void assert_inside(const StFile *f)
{
    static const int size[] = {[ST_F32] = 4, [ST_F16] = 2, [ST_BF16] = 2, [ST_F64] = 8, [ST_I32] = 4, [ST_I64] = 8};
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)f->map.data[i] << (8 * i);
    const unsigned char *data = f->map.data + 8 + n, *end = f->map.data + f->map.size;
    for (int i = 0; i < f->n_tensors; i++) {
        const StTensor *t = &f->tensors[i];
        assert_true(t->data >= data && t->data + (size_t)t->numel * (size_t)size[t->dtype] <= end);
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *path = test_format("%s/w.safetensors", dir);
    float a[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    uint16_t b[3] = {0x3f80, 0xc000, 0x0000}; /* bfloat16 1, -2, 0 */
    int32_t c[2] = {-5, 1 << 30};
    int64_t sa[2] = {2, 3}, sb[1] = {3}, sc[1] = {2}, s0[2] = {0, 4};
    StWriter w = {0};
    Error err = {0};
    assert_int_equal(st_writer_add(&w, "a", ST_F32, sa, 2, a, &err), 0);
    assert_int_equal(st_writer_add(&w, "b", ST_BF16, sb, 1, b, &err), 0);
    assert_int_equal(st_writer_add(&w, "c", ST_I32, sc, 1, c, &err), 0);
    assert_int_equal(st_writer_add(&w, "empty", ST_F32, s0, 2, a, &err), 0);
    assert_int_equal(st_writer_meta(&w, "format", "pt", &err), 0);
    assert_int_equal(st_write(&w, path, &err), 0);
    st_writer_free(&w);
    StFile f;
    assert_int_equal(st_open(&f, path, &err), 0);
    assert_int_equal(f.n_tensors, 4);
    assert_inside(&f);
    assert_string_equal(st_meta(&f, "format"), "pt");
    const StTensor *t = st_find(&f, "a");
    assert_non_null(t);
    assert_true(t->dtype == ST_F32 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6);
    float out[6];
    st_read_f32(t, out);
    assert_memory_equal(out, a, sizeof a);
    st_read_f32(st_find(&f, "b"), out);
    assert_true(out[0] == 1 && out[1] == -2 && out[2] == 0);
    int32_t ci[2];
    st_read_i32(st_find(&f, "c"), ci);
    assert_memory_equal(ci, c, sizeof c);
    assert_int_equal(st_find(&f, "empty")->numel, 0);
    assert_null(st_find(&f, "d"));
    st_close(&f);
    free(path);
    test_rm_rf(dir);
    free(dir);
}

static void test_crafted_files(void **state)
{
    (void)state;
    char *dir = test_tmpdir();
    /* The builder: two tensors filling 24 data bytes, in either order of the header. */
    const char *good = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}";
    char *path = craft(dir, "good.safetensors", good, 128, 24);
    StFile f;
    Error err = {0};
    if (st_open(&f, path, &err) != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(err.status, 0);
    assert_int_equal(f.n_tensors, 2);
    assert_inside(&f);
    assert_int_equal(st_find(&f, "b")->data[0], 8); /* the data section's byte 8 */
    st_close(&f);
    free(path);

    /* Empty tensors start where the next tensor starts (Hugging Face's writer makes such files): at
     * the first tensor's offset, between two, two at one place, last; listed before or after the
     * tensor they share their offset with. Each file opens, the tensors where their offsets say. */
    static const char *const empties[] = {
        "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]}}",
        "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[8,8]}}",
        "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
        "\"f\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
        "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[24,24]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
    };
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
        path = craft(dir, "empty.safetensors", empties[i], 256, 24);
        if (st_open(&f, path, &err) != 0) {
            print_error("header %s: %s\n", empties[i], err.msg);
            fail();
        }
        assert_inside(&f);
        assert_int_equal(st_find(&f, "e")->numel, 0);
        assert_int_equal(st_find(&f, "a")->data[0], 0);
        assert_int_equal(st_find(&f, "b")->data[0], 8);
        assert_int_equal(st_find(&f, "b")->numel, 4);
        st_close(&f);
        free(path);
    }

    /* header, its length with padding, data bytes, the error */
    static const struct {
        const char *header;
        size_t header_len, data_len;
        const char *expect;
    } bad[] = {
        /* Past the end of the file: by one byte, and by exactly the header's 128 bytes (a data
         * section that still counted the header would take it: [0, 152) of 24 + 128 bytes). */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[7],\"data_offsets\":[0,28]}}", 128, 24,
         "tensor a: data_offsets outside the file's 24 data bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[38],\"data_offsets\":[0,152]}}", 128, 24,
         "tensor a: data_offsets outside the file's 24 data bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 64, 1,
         "tensor a: dtype U8 is not one wlbtrain reads"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,16]}}", 64, 24, "tensor a: data_offsets outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 64, 24, "tensor a: data_offsets outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 64, 8, "tensor a: data_offsets outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 64, 8,
         "tensor a: needs dtype, shape and data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 64, 8,
         "tensor a: 8 bytes for 3 elements of F32"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", 64, 8,
         "tensor a: too large"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 64, 8, "tensor a: bad shape"},
        /* The format: tensors fill the data section one after another. */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 128, 12,
         "tensor b: bytes [4, 12) overlap tensor a's [0, 8)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 128, 8, "overlap tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 128, 20,
         "data bytes [8, 12) belong to no tensor (before b)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 64, 12,
         "data bytes [0, 4) belong to no tensor (before a)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 64, 12,
         "the tensors hold 8 of the file's 12 data bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 128, 8,
         "safetensors header is not a JSON object: duplicate object key"},
        {"[1, 2]", 64, 0, "not a safetensors file: its JSON header does not start with '{'"},
        {"{\"a\": [1, 2]}", 64, 0, "tensor a: needs dtype, shape and data_offsets"},
        {"{\"a\": ", 64, 0, "safetensors header is not a JSON object: "},
        {"{\"__metadata__\": {\"k\": 1}}", 64, 0, "__metadata__.k: values must be strings"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        open_fails(dir, bad[i].header, bad[i].header_len, bad[i].data_len, bad[i].expect);
    /* The header's length itself: past the end, too short. */
    char raw[16] = {(char)0xff, (char)0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    path = test_write_file(dir, "len.safetensors", raw, 10);
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, "not a safetensors file: its first 8 bytes, read as the length of a JSON header, "
                                    "point past the end of the file (10 bytes)"));
    raw[0] = 1, raw[1] = 0;
    free(path);
    path = test_write_file(dir, "len.safetensors", raw, 10);
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, "its first 8 bytes give a JSON header of 1 bytes, too short for one"));
    free(path);
    path = test_write_file(dir, "len.safetensors", raw, 0);
    assert_int_equal(st_open(&f, path, &err), -1);
    assert_non_null(strstr(err.msg, "not a safetensors file: 0 bytes, too few"));
    free(path);
    test_rm_rf(dir);
    free(dir);
}

/* The tiny model of these tests: llama2.c's shapes, untied. */
static const char model_yaml[] =
    "model: {n_layers: 1, d_model: 16, n_heads: 2, n_kv_heads: 1, d_ffn: 32, vocab_size: 260, rope_theta: 10000, "
    "norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 64}\nparallel: {dp: 1}\ntrain: {device: cpu}\n";

/* A llama2.c checkpoint of that model (seq_len 8), `extra` floats more or fewer than it needs. */
static char *llama2c_file(const char *dir, const char *name, int extra)
{
    int32_t h[7] = {16, 32, 1, 2, 1, -260, 8};
    int64_t floats = 260 * 16 + (2 * 16 + 16 * 16 + 2 * 8 * 16 + 16 * 16 + 3 * 32 * 16) + 16 + 8 * 8 + 260 * 16 + extra;
    size_t size = 28 + (size_t)floats * 4;
    char *raw = calloc(1, size);
    assert_non_null(raw);
    memcpy(raw, h, sizeof h);
    for (int64_t i = 0; i < floats; i++) {
        float v = (float)((i * 37) % 101) / 101.0f - 0.5f;
        memcpy(raw + 28 + 4 * i, &v, 4);
    }
    char *path = test_write_file(dir, name, raw, size);
    free(raw);
    return path;
}

static void load_fails(Model *m, const char *dir, const char *name, const char *content, size_t len,
                       const char *expect)
{
    char *path = content ? test_write_file(dir, name, content, len) : test_format("%s/%s", dir, name);
    Error err = {0};
    int rc = model_load(m, path, &err);
    printf("# %s: %s\n", name, err.msg);
    if (rc == 0 || err.status != 2 || !strstr(err.msg, expect)) {
        print_error("%s: expected an error with '%s', got rc %d: %s\n", name, expect, rc, err.msg);
        fail();
    }
    free(path);
}

static void test_model_formats(void **state)
{
    (void)state;
    Config cfg;
    config_init(&cfg);
    Error err = {0};
    assert_int_equal(config_load_string(&cfg, model_yaml, "t.yaml", &err), 0);
    assert_int_equal(config_resolve(&cfg, 0, &err), 0);
    Model m;
    assert_int_equal(model_init(&m, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
    char *dir = test_tmpdir();
    /* 1,000 random bytes (seeded), under three names. */
    char noise[1000];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof noise; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        noise[i] = (char)(x >> 24);
    }
    load_fails(&m, dir, "r.safetensors", noise, sizeof noise,
               "r.safetensors: not a safetensors file, which its name says it is: its first 8 bytes, read as the "
               "length of a JSON header, point past the end of the file (1000 bytes)");
    load_fails(&m, dir, "r.bin", noise, sizeof noise,
               "r.bin: not a llama2.c model, which its .bin name says it is: its first 28 bytes are no llama2.c header");
    load_fails(&m, dir, "r.weights", noise, sizeof noise,
               "r.weights: neither a safetensors file: its first 8 bytes, read as the length of a JSON header, point "
               "past the end of the file (1000 bytes); nor a llama2.c model: its first 28 bytes are no llama2.c header");
    /* A llama2.c model cut short, and one with bytes after its weights: the header's sizes are real. */
    free(llama2c_file(dir, "short.bin", -1));
    load_fails(&m, dir, "short.bin", NULL, 0,
               "short.bin: not a whole llama2.c model: its llama2.c header (dim 16, hidden_dim 32, 1 layers, 2 heads, "
               "1 kv heads, vocabulary 260, seq_len 8) needs a file of 42972 bytes, this one has 42968 (truncated?)");
    free(llama2c_file(dir, "long.bin", 1));
    load_fails(&m, dir, "long.bin", NULL, 0, "needs a file of 42972 bytes, this one has 42976 (more than the model)");
    free(llama2c_file(dir, "short.safetensors", -1));
    load_fails(&m, dir, "short.safetensors", NULL, 0,
               "short.safetensors: not a safetensors file, which its name says it is: its first 8 bytes, read as the "
               "length of a JSON header, point past the end of the file (42968 bytes); its llama2.c header (dim 16,");
    /* Well-known things that are not weights wlbtrain reads. */
    const char zip[32] = "PK\3\4\24"; /* a zip archive's local header, the rest zeros */
    load_fails(&m, dir, "pytorch_model.bin", zip, sizeof zip,
               "; it is a zip archive: a PyTorch checkpoint (torch.save)? Save it as safetensors");
    const char *index = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {}}";
    load_fails(&m, dir, "model.safetensors.index.json.safetensors", index, strlen(index),
               "; it is JSON text (the index of a sharded model?), not weights");
    load_fails(&m, dir, "tiny.safetensors", "abc", 3, "tiny.safetensors: not a safetensors file, which its name says "
                                                      "it is: 3 bytes, too few for a length and a JSON header");
    load_fails(&m, dir, "nothing.bin", NULL, 0, "nothing.bin: cannot open");
    /* Content decides: a whole llama2.c model named .safetensors loads, and a safetensors file named
     * .bin - the same weights either way. */
    char *l2 = llama2c_file(dir, "weights.safetensors", 0);
    assert_int_equal(model_load(&m, l2, &err), 0);
    float *first = malloc((size_t)m.n_params * sizeof *first);
    assert_non_null(first);
    memcpy(first, m.params, (size_t)m.n_params * sizeof *first);
    StWriter w = {0};
    for (int i = 0; i < m.n_tensors; i++) {
        const ModelTensor *t = &m.tensors[i];
        int64_t shape[2] = {t->rows, t->cols};
        int vec = t->is_vector;
        assert_int_equal(st_writer_add(&w, t->name, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2, m.params + t->offset,
                                       &err), 0);
    }
    char *st = test_format("%s/weights.bin", dir);
    assert_int_equal(st_write(&w, st, &err), 0);
    st_writer_free(&w);
    assert_int_equal(model_init_weights(&m, 3, &err), 0);
    assert_int_equal(model_load(&m, st, &err), 0);
    assert_memory_equal(m.params, first, (size_t)m.n_params * sizeof *first);
    free(first);
    free(st);
    free(l2);
    model_free(&m);
    config_free(&cfg);
    test_rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_crafted_files),
        cmocka_unit_test(test_model_formats),
    };
    return cmocka_run_group_tests_name("weight_files", tests, NULL, NULL);
}
