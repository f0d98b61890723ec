/*
 * config/config_presets.c - named model shapes (model.preset).
 *
 * Sources: the Llama 2 and Llama 3 papers and the released Hugging Face config.json of each model
 * (Llama 3.0 - llama3-8b, llama3-70b - has no RoPE scaling and an 8K context; Llama 3.1 and 3.2 scale
 * RoPE frequencies: factor 8 for 3.1, 32 for 3.2, low 1, high 4, original context 8192, 128K; the
 * 405B model exists only as 3.1); stories260k is the llama2.c model in ../shared/real-data/models. A preset is a YAML
 * mapping of model keys, read by the config loader itself; it fills only the model keys the config
 * does not set.
 */
#include <string.h>

#include "config/config_keys.h"

typedef struct Preset {
    const char *name;
    const char *yaml; /* keys of the model section */
} Preset;

#define LLAMA3 "vocab_size: 128256, rope_theta: 500000, norm_eps: 1.0e-5, "
/* A preset names its RoPE scaling, none included, so that a model folder whose config.json has
 * another is refused (config_folder.c) rather than taken. */
#define UNSCALED "rope_scaling: none, "
#define SCALED(f) "rope_scaling: llama3, rope_scaling_factor: " #f ", rope_low_freq_factor: 1, " \
                  "rope_high_freq_factor: 4, rope_original_max_seq_len: 8192, "

static const Preset presets[] = {
    {"llama2-7b", "{n_layers: 32, d_model: 4096, n_heads: 32, n_kv_heads: 32, d_ffn: 11008, vocab_size: 32000, "
                  "rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 4096, " UNSCALED "}"},
    {"llama3-8b", "{n_layers: 32, d_model: 4096, n_heads: 32, n_kv_heads: 8, d_ffn: 14336, " LLAMA3 UNSCALED
                  "tie_embeddings: false, max_seq_len: 8192}"},
    {"llama3-70b", "{n_layers: 80, d_model: 8192, n_heads: 64, n_kv_heads: 8, d_ffn: 28672, " LLAMA3 UNSCALED
                   "tie_embeddings: false, max_seq_len: 8192}"},
    {"llama3.1-8b", "{n_layers: 32, d_model: 4096, n_heads: 32, n_kv_heads: 8, d_ffn: 14336, " LLAMA3
                    SCALED(8) "tie_embeddings: false, max_seq_len: 131072}"},
    {"llama3.1-70b", "{n_layers: 80, d_model: 8192, n_heads: 64, n_kv_heads: 8, d_ffn: 28672, " LLAMA3
                     SCALED(8) "tie_embeddings: false, max_seq_len: 131072}"},
    {"llama3-405b", "{n_layers: 126, d_model: 16384, n_heads: 128, n_kv_heads: 8, d_ffn: 53248, " LLAMA3
                    SCALED(8) "tie_embeddings: false, max_seq_len: 131072}"},
    {"llama3.2-1b", "{n_layers: 16, d_model: 2048, n_heads: 32, n_kv_heads: 8, d_ffn: 8192, " LLAMA3
                    SCALED(32) "tie_embeddings: true, max_seq_len: 131072}"},
    {"llama3.2-3b", "{n_layers: 28, d_model: 3072, n_heads: 24, n_kv_heads: 8, d_ffn: 8192, " LLAMA3
                    SCALED(32) "tie_embeddings: true, max_seq_len: 131072}"},
    {"stories260k", "{n_layers: 5, d_model: 64, n_heads: 8, n_kv_heads: 4, d_ffn: 172, vocab_size: 512, "
                    "rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: true, max_seq_len: 512, " UNSCALED "}"},
    {"tiny", "{n_layers: 4, d_model: 128, n_heads: 4, n_kv_heads: 2, d_ffn: 384, vocab_size: 512, "
             "rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 4096, " UNSCALED "}"},
};

int config_apply_preset(Config *cfg, Error *err)
{
    const char *name = cfg->model.preset;
    if (!name)
        return 0;
    int kp = config_key_find("model.preset");
    const Preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name))
            p = &presets[i];
    if (!p) {
        char where[1200], names[512] = "";
        config_where(cfg, kp, where, sizeof where);
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
            strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
            strncat(names, presets[i].name, sizeof names - strlen(names) - 1);
        }
        return error_set(err, where, "model.preset: unknown preset '%s' (presets: %s)", name, names);
    }
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "model: %s\n", p->yaml);
    Config shape;
    config_init(&shape);
    int rc = config_load_string(&shape, yaml, "model.preset", err);
    for (int k = 0; rc == 0 && k < config_n_keys; k++) {
        /* Keys the preset sets and the config does not: the explicit value wins. */
        if (shape.origin[k].kind != ORIGIN_FILE || cfg->origin[k].kind != ORIGIN_DEFAULT)
            continue;
        rc = config_key_copy(cfg, &shape, k, err);
        cfg->origin[k].kind = ORIGIN_PRESET;
    }
    config_free(&shape);
    return rc;
}
