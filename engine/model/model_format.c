/*
 * engine/model/model_format.c - which of the two weight formats model_load reads a file is: told
 * by its content, checked against its name, and when it is neither, said why (model_impl.h).
 *
 * By content:
 *   safetensors  an 8-byte little-endian length N (at least 2, inside the file), then '{'
 *                (util/safetensors.h's st_sniff; st_open checks the rest).
 *   llama2.c     seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size - negative
 *                when the classifier is not shared -, seq_len) of sane values (all positive and
 *                below the bounds of MAX_SIDE; heads dividing dim into even head sizes, kv heads
 *                dividing heads), and the file exactly the size those imply: 28 bytes of header,
 *                then the float32 weights, the RoPE tables and the classifier when it is not shared.
 * Safetensors is tried first: a llama2.c file could pass its test only at 4 GiB or more (dim and
 * hidden_dim, read as the header's length, are at least 2^32) with 123 layers ('{').
 * By name: .safetensors says safetensors, .bin llama2.c (any other name says nothing). Content
 * decides; the name only says what was expected when the content is neither, so the error says
 * what the file was supposed to be and what it is instead - never dimensions read from bytes that
 * are not a header.
 */
#include <stdio.h>
#include <string.h>

#include "engine/model/model_impl.h"
#include "util/safetensors.h"

/* Bounds on the llama2.c header's values: far above any llama2.c model, low enough that the size
 * they imply fits in 64 bits. */
#define MAX_SIDE (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_LAYERS 4096

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* 2: a llama2.c header of sane values and a file of the size it implies; 1: such a header, another
 * size (why says which); 0: no llama2.c header (why says why). */
static int llama2c_header(const MappedFile *map, Llama2cHeader *h, char *why, size_t why_size)
{
    if (map->size < 28) {
        snprintf(why, why_size, "%llu bytes, too few for a llama2.c header (28)", (unsigned long long)map->size);
        return 0;
    }
    int32_t v[7];
    memcpy(v, map->data, sizeof v);
    int64_t dim = v[0], hidden = v[1], L = v[2], H = v[3], Hkv = v[4], vocab = v[5] < 0 ? -(int64_t)v[5] : v[5];
    int64_t seq = v[6];
    if (dim <= 0 || dim > MAX_SIDE || hidden <= 0 || hidden > MAX_SIDE || L <= 0 || L > MAX_LAYERS || H <= 0 ||
        H > dim || dim % H || (dim / H) % 2 || Hkv <= 0 || Hkv > H || H % Hkv || vocab == 0 || vocab > MAX_VOCAB ||
        seq <= 0 || seq > MAX_SIDE * 16) {
        snprintf(why, why_size, "its first 28 bytes are no llama2.c header: dim, hidden_dim, n_layers, n_heads, "
                 "n_kv_heads, vocab_size and seq_len positive and in bounds, heads dividing dim, kv heads dividing "
                 "heads");
        return 0;
    }
    *h = (Llama2cHeader){(int32_t)dim, (int32_t)hidden, (int32_t)L, (int32_t)H, (int32_t)Hkv, (int32_t)vocab,
                         (int32_t)seq, v[5] > 0, 0};
    int64_t hd = dim / H, kvd = Hkv * hd;
    h->floats = vocab * dim + L * (2 * dim + dim * dim + 2 * kvd * dim + dim * dim + 3 * hidden * dim) + dim +
                seq * hd + (h->shared ? 0 : vocab * dim); /* the RoPE tables: 2 x seq x hd / 2 */
    uint64_t need = 28 + (uint64_t)h->floats * 4;
    if (map->size != need) {
        snprintf(why, why_size, "its llama2.c header (dim %d, hidden_dim %d, %d layers, %d heads, %d kv heads, "
                 "vocabulary %d, seq_len %d) needs a file of %llu bytes, this one has %llu (%s)", h->dim,
                 h->hidden_dim, h->n_layers, h->n_heads, h->n_kv_heads, h->vocab, h->seq_len, (unsigned long long)need,
                 (unsigned long long)map->size, map->size < need ? "truncated?" : "more than the model");
        return 1;
    }
    return 2;
}

/* What the first bytes are, when they are something well known (else ""). */
static const char *known_content(const MappedFile *map)
{
    const unsigned char *p = map->data;
    uint64_t n = map->size;
    if (n >= 4 && !memcmp(p, "PK\3\4", 4))
        return "; it is a zip archive: a PyTorch checkpoint (torch.save)? Save it as safetensors";
    if (n >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5)
        return "; it is a Python pickle: a PyTorch checkpoint (torch.save)? Save it as safetensors";
    if (n >= 4 && !memcmp(p, "24ka", 4)) /* llama2.c's magic 0x616b3432, little-endian */
        return "; it is a llama2.c export of a newer version (magic ak42): wlbtrain reads the legacy one "
               "(llama2.c's export.py --version 0)";
    if (n >= 4 && !memcmp(p, "GGUF", 4))
        return "; it is a GGUF file (llama.cpp), which wlbtrain does not read";
    if (n >= 8 && !memcmp(p, "WLBSTATE", 8))
        return "; it is a shard of a wlbtrain checkpoint: resume it (checkpoint.resume) or export it (wlbtrain "
               "export)";
    if (n >= 1 && p[0] == '{')
        return "; it is JSON text (the index of a sharded model?), not weights: give train.init_from the model "
               "folder, which reads config.json, the index and its shards";
    return "";
}

int model_weight_format(const char *path, const MappedFile *map, Llama2cHeader *h, Error *err)
{
    char st_why[160], l2_why[320];
    if (st_sniff(map->data, map->size, st_why, sizeof st_why))
        return WEIGHTS_SAFETENSORS;
    int l2 = llama2c_header(map, h, l2_why, sizeof l2_why);
    if (l2 == 2)
        return WEIGHTS_LLAMA2C;
    const char *found = known_content(map);
    if (ends_with(path, ".safetensors"))
        return error_set(err, path, "not a safetensors file, which its name says it is: %s%s%s", st_why,
                         l2 == 1 ? "; " : found, l2 == 1 ? l2_why : "");
    if (l2 == 1)
        return error_set(err, path, "not a whole llama2.c model: %s", l2_why);
    if (ends_with(path, ".bin"))
        return error_set(err, path, "not a llama2.c model, which its .bin name says it is: %s%s", l2_why, found);
    return error_set(err, path, "neither a safetensors file: %s; nor a llama2.c model: %s%s", st_why, l2_why, found);
}
