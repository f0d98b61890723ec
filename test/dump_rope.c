/*
 * test/dump_rope.c - the RoPE table of one setting of the model.rope_* keys, as the model builds it
 * (model_rope_table) and as the CPU backend applies it (rope_fwd), for test/test_rope_scaling.py to
 * check against a numpy port of transformers' formulas.
 *
 *   dump_rope OUT.safetensors KEY=VALUE... [positions=P,P,...]
 *
 * KEYs: head_dim, theta, scaling (none, llama3, linear, yarn), factor, low, high, original,
 * beta_fast, beta_slow, truncate (0 or 1), attention (0 = yarn's default). Writes inv_freq (F32,
 * head_dim / 2), scale (F32 [1]: what cos and sin are multiplied by), positions (I32) and cos, sin
 * (F32 [positions, head_dim / 2]): a head of ones then zeros rotated by rope_fwd at each position,
 * whose first half is then scale cos(angle) and second half scale sin(angle).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "engine/model/model.h"
#include "util/safetensors.h"

static void die(const char *what)
{
    fprintf(stderr, "dump_rope: %s\n", what);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: dump_rope OUT.safetensors KEY=VALUE... [positions=P,P,...]");
    ConfigModel c = {0};
    c.rope_theta = 10000;
    c.rope_scaling_factor = 8;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_original_max_seq_len = 8192;
    c.rope_yarn_beta_fast = 32;
    c.rope_yarn_beta_slow = 1;
    c.rope_yarn_truncate = true;
    int head_dim = 128;
    int32_t pos[4096];
    int n_pos = 0;
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq)
            die("arguments are KEY=VALUE");
        *eq = '\0';
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "head_dim"))
            head_dim = atoi(v);
        else if (!strcmp(k, "theta"))
            c.rope_theta = atof(v);
        else if (!strcmp(k, "scaling"))
            c.rope_scaling = !strcmp(v, "llama3") ? ROPE_SCALING_LLAMA3 : !strcmp(v, "linear") ? ROPE_SCALING_LINEAR
                             : !strcmp(v, "yarn")  ? ROPE_SCALING_YARN : ROPE_SCALING_NONE;
        else if (!strcmp(k, "factor"))
            c.rope_scaling_factor = atof(v);
        else if (!strcmp(k, "low"))
            c.rope_low_freq_factor = atof(v);
        else if (!strcmp(k, "high"))
            c.rope_high_freq_factor = atof(v);
        else if (!strcmp(k, "original"))
            c.rope_original_max_seq_len = atoll(v);
        else if (!strcmp(k, "beta_fast"))
            c.rope_yarn_beta_fast = atof(v);
        else if (!strcmp(k, "beta_slow"))
            c.rope_yarn_beta_slow = atof(v);
        else if (!strcmp(k, "truncate"))
            c.rope_yarn_truncate = atoi(v) != 0;
        else if (!strcmp(k, "attention"))
            c.rope_attention_factor = atof(v);
        else if (!strcmp(k, "positions"))
            for (char *p = strtok((char *)v, ","); p && n_pos < 4096; p = strtok(NULL, ","))
                pos[n_pos++] = (int32_t)atol(p);
        else
            die("unknown key");
    }
    if (head_dim < 2 || head_dim % 2 || head_dim > 1024 || n_pos == 0)
        die("head_dim even in [2, 1024] and at least one position");
    int half = head_dim / 2;
    float inv_freq[512], scale = model_rope_table(&c, head_dim, inv_freq);
    const Ops *o = cpu_ops();
    float *x = malloc((size_t)n_pos * head_dim * sizeof *x), *cs = malloc((size_t)n_pos * half * sizeof *cs);
    float *sn = malloc((size_t)n_pos * half * sizeof *sn);
    if (!x || !cs || !sn)
        die("out of memory");
    for (int t = 0; t < n_pos; t++)
        for (int i = 0; i < head_dim; i++)
            x[(size_t)t * head_dim + i] = i < half ? 1.0f : 0.0f;
    o->rope_fwd((Act *)x, head_dim, pos, n_pos, 1, head_dim, inv_freq, scale);
    for (int t = 0; t < n_pos; t++)
        for (int i = 0; i < half; i++) {
            cs[(size_t)t * half + i] = x[(size_t)t * head_dim + i];
            sn[(size_t)t * half + i] = x[(size_t)t * head_dim + half + i];
        }
    StWriter w = {0};
    Error err = {0};
    int64_t n_half = half, one = 1, n_p = n_pos, table[2] = {n_pos, half};
    if (st_writer_add(&w, "inv_freq", ST_F32, &n_half, 1, inv_freq, &err) != 0 ||
        st_writer_add(&w, "scale", ST_F32, &one, 1, &scale, &err) != 0 ||
        st_writer_add(&w, "positions", ST_I32, &n_p, 1, pos, &err) != 0 ||
        st_writer_add(&w, "cos", ST_F32, table, 2, cs, &err) != 0 ||
        st_writer_add(&w, "sin", ST_F32, table, 2, sn, &err) != 0 || st_write(&w, argv[1], &err) != 0)
        die(err.msg);
    st_writer_free(&w);
    free(x);
    free(cs);
    free(sn);
    return 0;
}
