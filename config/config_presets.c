/*
 * config/config_presets.c - named model shapes (model.preset).
 *
 * Sources: Llama 2 and Llama 3 papers and the released configs (Hugging Face config.json of each
 * model); stories260K is the llama2.c model in ../shared/real-data/models. A preset fills only the
 * model keys that the config does not set itself.
 */
#include <string.h>

#include "config/config_keys.h"

/* The model keys a preset sets, in the order of the value columns below. */
static const char *const preset_keys[] = {
    "model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads", "model.d_ffn",
    "model.vocab_size", "model.rope_theta", "model.norm_eps", "model.tie_embeddings", "model.max_seq_len",
};
enum { N_PRESET_KEYS = sizeof preset_keys / sizeof preset_keys[0] };

typedef struct Preset {
    const char *name;
    const char *values[N_PRESET_KEYS];
} Preset;

static const Preset presets[] = {
    /*               layers  d_model heads kv  d_ffn    vocab     theta     eps    tied     max_seq */
    {"llama2-7b",   {"32",   "4096", "32", "32", "11008", "32000",  "10000",  "1e-5", "false", "4096"}},
    {"llama3-8b",   {"32",   "4096", "32", "8",  "14336", "128256", "500000", "1e-5", "false", "8192"}},
    {"llama3-70b",  {"80",   "8192", "64", "8",  "28672", "128256", "500000", "1e-5", "false", "8192"}},
    {"llama3-405b", {"126", "16384", "128", "8", "53248", "128256", "500000", "1e-5", "false", "131072"}},
    {"llama3.2-1b", {"16",   "2048", "32", "8",  "8192",  "128256", "500000", "1e-5", "true",  "131072"}},
    {"llama3.2-3b", {"28",   "3072", "24", "8",  "8192",  "128256", "500000", "1e-5", "true",  "131072"}},
    {"stories260k", {"5",    "64",   "8",  "4",  "172",   "512",    "10000",  "1e-5", "true",  "512"}},
    {"tiny",        {"4",    "128",  "4",  "2",  "384",   "512",    "10000",  "1e-5", "false", "4096"}},
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
    for (int i = 0; i < N_PRESET_KEYS; i++) {
        int k = config_key_find(preset_keys[i]);
        if (cfg->origin[k].kind != ORIGIN_DEFAULT)
            continue; /* set explicitly: the explicit value wins */
        int plain = 1;
        ConfigValue v = {0, 1, &p->values[i], &plain};
        if (config_key_assign(cfg, k, &v, "model.preset", err) != 0)
            return -1;
        cfg->origin[k].kind = ORIGIN_PRESET;
    }
    return 0;
}
