/*
 * config/config.h - the typed configuration of a wlbtrain run.
 *
 * A config is built in four steps, each of which may fail with an Error that names the place:
 *   config_init          every key at its constant default
 *   config_load_file     a YAML file (libyaml); unknown keys, wrong types, out-of-range values
 *   config_apply_set     one --set KEY=VALUE, parsed and checked like the file
 *   config_resolve       model preset expanded under the explicit keys, derived defaults filled in,
 *                        parallel.dp: auto taken from the launch, cross-field rules checked
 * Every key is described once, in the table of config_keys.c: its type, range, default and help.
 * The loader, --print-config, --help-config and docs/configuration.md's reference all come from it.
 */
#ifndef WLB_CONFIG_CONFIG_H
#define WLB_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

typedef enum CommKind { COMM_AUTO, COMM_MPI, COMM_NCCL } CommKind;
typedef enum PackerKind { PACKER_FIXED, PACKER_FIXED_GREEDY, PACKER_WLB } PackerKind;
typedef enum CpSharding { CP_PER_SEQ, CP_PER_DOC, CP_ADAPTIVE, CP_HYBRID, CP_GROUPS } CpSharding;
/* What the planner does to a document that straddles a window end of the stream (balance.long_documents):
 * cut it there (Plain-4D's loader), or keep it whole; auto: cut for fixed and fixed_greedy, keep for wlb. */
typedef enum LongDocuments { LONG_DOCS_AUTO, LONG_DOCS_CUT, LONG_DOCS_KEEP } LongDocuments;
/* h100, h200: with train.device cuda the engine's profile (engine/plan/profiles/), else the published
 * rates; h100-fa3, h200-fa3: always the published rates (FlashAttention-3, cuBLAS). */
typedef enum HardwareKind { HW_H100, HW_H200, HW_A100, HW_CPU, HW_H100_FA3, HW_H200_FA3 } HardwareKind;
typedef enum DeviceKind { DEVICE_CPU, DEVICE_CUDA } DeviceKind;
typedef enum Precision { PRECISION_FP32, PRECISION_BF16 } Precision;
/* train.attention: the GPU's attention kernels (engine/backend.h's BackendAttention, in the same order). */
typedef enum AttentionImpl { ATTENTION_AUTO, ATTENTION_CUDNN, ATTENTION_OWN } AttentionImpl;
/* parallel.reduce_dtype: the TP and CP partial sums in float32, or in the compute dtype (train.precision). */
typedef enum ReduceDtype { REDUCE_FP32, REDUCE_COMPUTE } ReduceDtype;
typedef enum Recompute { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } Recompute;
typedef enum LrSchedule { SCHEDULE_COSINE, SCHEDULE_LINEAR, SCHEDULE_CONSTANT } LrSchedule;
typedef enum NonfinitePolicy { NONFINITE_STOP, NONFINITE_SKIP } NonfinitePolicy;
/* checkpoint.continue_schedule: a continued run's steps and LR schedule start afresh, or go on. */
typedef enum ContinueSchedule { CONTINUE_RESTART, CONTINUE_GO_ON } ContinueSchedule;
/* model.rope_scaling: Hugging Face's rope_type of the same name (transformers' modeling_rope_utils). */
typedef enum RopeScaling { ROPE_SCALING_NONE, ROPE_SCALING_LLAMA3, ROPE_SCALING_LINEAR, ROPE_SCALING_YARN } RopeScaling;

/* Lists own their arrays; n == 0 is the empty list. */
typedef struct ConfigIntList {
    int n;
    int64_t *v;
} ConfigIntList;
typedef struct ConfigFloatList {
    int n;
    double *v;
} ConfigFloatList;
typedef struct ConfigStrList {
    int n;
    char **v;
} ConfigStrList;
/* A key that is one of a few words or a list of integers: choice indexes the key's words, or equals
 * their count for a list (then in list). */
typedef struct ConfigChoiceOrList {
    int choice;
    ConfigIntList list;
} ConfigChoiceOrList;

/* parallel.stage_layers as written: the words even and auto, or a list of counts (STAGE_LAYERS_LIST). */
typedef enum StageLayers { STAGE_LAYERS_EVEN, STAGE_LAYERS_AUTO, STAGE_LAYERS_LIST } StageLayers;

typedef struct ConfigModel {
    char *preset; /* NULL = none */
    int64_t n_layers, d_model, n_heads, n_kv_heads, d_ffn, vocab_size, max_seq_len;
    double rope_theta, norm_eps;
    bool tie_embeddings;
    RopeScaling rope_scaling; /* frequency scaling of RoPE (Llama 3.1's llama3, linear, yarn), or none */
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_seq_len;
    double rope_yarn_beta_fast, rope_yarn_beta_slow; /* yarn: the ramp's ends, in rotations */
    bool rope_yarn_truncate;                         /* yarn: the ramp's ends rounded to whole dimensions */
    double rope_attention_factor;                    /* yarn: cos and sin multiplied by it; 0 = 0.1 ln factor + 1 */
} ConfigModel;

typedef struct ConfigParallel {
    int64_t tp, cp, pp;
    int64_t dp; /* 0 = auto: world / (tp*cp*pp), known once the job is launched */
    int64_t virtual_stages; /* model chunks per pipeline rank: 1 = 1F1B, more = interleaved 1F1B */
    CommKind comm;
    int64_t zero;
    ConfigChoiceOrList stage_layers; /* how the layers are split over the model chunks, as written */
    /* The split as resolved: the layers of each model chunk g = 0 .. pp * virtual_stages - 1 (chunk
     * g on pipeline stage g % pp), adding up to model.n_layers. config_resolve fills it for even and
     * a list; for auto it stays empty (n 0) until the engine places the layers by their cost
     * (trainer_stage_layers, engine/train/train_stages.h). Every part that splits the model reads it
     * (config_chunk_layers). Not a key: derived, freed by config_free. */
    ConfigIntList chunk_layers;
    bool sequence_parallel; /* with tp > 1: the residual stream and the norms on T / tp rows per TP rank */
    bool overlap;           /* collectives started where their input is ready, waited where needed */
    ReduceDtype reduce_dtype; /* what the TP and CP partial sums travel and add in */
    int64_t tp_chunks;        /* pieces each TP product and its exchange split into */
    double timeout_s;         /* the collective watchdog: a job whose collectives stop finishing ends */
                              /* 0 (off) or at least CONFIG_TIMEOUT_FLOOR_S (config_resolve.c) */
} ConfigParallel;

typedef struct ConfigData {
    ConfigStrList path;        /* Megatron prefixes; empty when lengths_file is used */
    ConfigFloatList weights;   /* blending weights, one per path (empty = equal) */
    char *lengths_file;        /* NULL = none */
    char *lengths_column;      /* NULL = the last column */
    int64_t context_window;
    int64_t global_batch_tokens; /* 0 = auto (until dp is known) */
    int64_t seed;
    ConfigStrList valid_path;  /* Megatron prefixes of a validation set; empty = none */
    double valid_fraction;     /* share of data.path's documents held out for validation; 0 = none */
    char *tokenizer;           /* tokenizer.json the data was made with (export copies it); NULL = none */
} ConfigData;

typedef struct ConfigBalance {
    PackerKind packer;
    CpSharding cp_sharding;
    int64_t plan_threads; /* threads that shard a step's micro-batches; 0 = auto */
    LongDocuments long_documents;
    int64_t max_tokens_per_micro_batch;
    ConfigIntList outlier_thresholds;
    HardwareKind hardware;
    char *calibration; /* NULL = none */
    /* Cost-model overrides; 0 = from the hardware profile or the calibration file. */
    double peak_tflops, gemm_efficiency, attn_efficiency, attn_half_tokens;
    int64_t attn_tile;
    double hbm_gbps, intra_node_gbps, inter_node_gbps;
    int64_t gpus_per_node;
} ConfigBalance;

typedef struct ConfigTrain {
    DeviceKind device;
    Precision precision;
    int64_t steps;
    double lr, min_lr;
    int64_t warmup_steps;
    LrSchedule schedule;
    double weight_decay, beta1, beta2, eps, grad_clip;
    bool decay_norms_and_embeddings;
    int64_t seed;
    char *init_from; /* NULL = random init */
    NonfinitePolicy nonfinite;
    Recompute recompute;
    bool deterministic;
    AttentionImpl attention;
    int64_t logits_block; /* floats of the output head's block of logits (rows x vocabulary columns); 0 = the
                           * backend's (OPS_LOGITS_FLOATS_CPU, _GPU) */
    double gpu_memory_gb; /* the memory check's budget per device, 10^9 bytes; 0 = the hardware profile's */
    char *stop_after; /* NULL = none; a step count or a wall time (config_stop_after parses it) */
    int64_t eval_every;  /* validation loss every N steps; 0 = none */
    int64_t eval_tokens; /* tokens of the validation set an evaluation reads; 0 = auto (10 global batches) */
    ConfigChoiceOrList eval_position_buckets; /* choice 0: auto; else the list of bucket edges (at most
                                               * CONFIG_MAX_POSITION_EDGES, increasing) */
} ConfigTrain;

typedef struct ConfigCheckpoint {
    char *dir;      /* NULL = no checkpoints */
    int64_t every;  /* 0 = only at the end */
    char *resume;   /* NULL = none, "auto", or a path */
    int64_t keep;
    char *continue_from; /* NULL = none: another run's checkpoint this run starts from (a stage) */
    ContinueSchedule continue_schedule;
} ConfigCheckpoint;

typedef struct ConfigLog {
    int64_t every;
    char *metrics; /* NULL = no JSON-lines file */
} ConfigLog;

/* Measured timelines (docs/timelines.md): the steps traced, "3-5,10" (NULL: none), and the folder
 * (NULL: checkpoint.dir/traces, or traces without a checkpoint.dir). */
typedef struct ConfigTrace {
    char *steps;
    char *dir;
} ConfigTrace;

/* Where a key's value came from: reported in errors as file:line:column or the --set argument. */
typedef enum ConfigOriginKind {
    ORIGIN_DEFAULT, /* constant default, or not set (required keys) */
    ORIGIN_PRESET,  /* from model.preset */
    ORIGIN_DERIVED, /* computed from other keys by config_resolve */
    ORIGIN_FILE,    /* set in the YAML file at line:col */
    ORIGIN_SET,     /* set by --set (arg is the whole KEY=VALUE) */
    ORIGIN_MODEL_FOLDER, /* from the config.json of train.init_from's model folder (config_hf.c) */
} ConfigOriginKind;

typedef struct ConfigOrigin {
    ConfigOriginKind kind;
    int line, col;      /* 1-based, for ORIGIN_FILE */
    const char *arg;    /* for ORIGIN_SET; points into argv */
} ConfigOrigin;

enum { CONFIG_MAX_KEYS = 128 };
/* The least parallel.timeout_s other than 0 (config_resolve.c says why). */
#define CONFIG_TIMEOUT_FLOOR_S 10.0
/* train.eval_position_buckets: the most edges a list may have (buckets: one more). */
enum { CONFIG_MAX_POSITION_EDGES = 15 };

typedef struct Config {
    ConfigModel model;
    ConfigParallel parallel;
    ConfigData data;
    ConfigBalance balance;
    ConfigTrain train;
    ConfigCheckpoint checkpoint;
    ConfigLog log;
    ConfigTrace trace;
    char *source_path;                    /* the YAML file, NULL if none was loaded */
    ConfigOrigin origin[CONFIG_MAX_KEYS]; /* indexed like the key table */
} Config;

void config_init(Config *cfg);
void config_free(Config *cfg);
int config_load_file(Config *cfg, const char *path, Error *err);
/* Loads YAML text (for tests and --set); name is used in error locations. */
int config_load_string(Config *cfg, const char *yaml, const char *name, Error *err);
int config_apply_set(Config *cfg, const char *key_eq_value, Error *err);
/* world_size: ranks of the launched job, or 0 when there is none (dry run, --print-config). */
int config_resolve(Config *cfg, int world_size, Error *err);
/* The most micro-batches a replica's step may have (data.global_batch_tokens / (dp x window)). */
enum { CONFIG_MAX_MICRO_BATCHES = 1 << 20 };

/* The resolved config as YAML that config_load_file reads back to an equal config. */
int config_print(const Config *cfg, FILE *out, Error *err);
/* Every key as a Markdown table (the config reference of docs/configuration.md). */
void config_print_reference(FILE *out);
/* 1 when every key has the same value in a and b. */
int config_equal(const Config *a, const Config *b);

/* A key whose value differs between two configs: its name, and both values as YAML text (a list in
 * flow style, cut with "...]" where it would not fit). */
typedef struct ConfigChange {
    const char *key;
    char before[200], after[200];
} ConfigChange;
/* The keys whose values differ from a (before) to b (after), in the key table's order, into out (at
 * most max of them); returns how many differ, which may be more than max (config_changes.c). */
int config_changes(const Config *a, const Config *b, ConfigChange *out, int max);

/* Layers [*begin, *end) of model chunk g under the resolved split (parallel.chunk_layers, which
 * must be resolved: stage_layers auto is placed by the engine first). */
void config_chunk_layers(const Config *cfg, int g, int *begin, int *end);
/* The even split of n_layers over n_chunks chunks into out[0..n_chunks): n_layers / n_chunks each,
 * one more for the first n_layers % n_chunks. */
void config_even_layers(int64_t n_layers, int n_chunks, int64_t *out);

/* "[8, 9, 9, 6]": n counts as YAML's flow list, cut with "...]" where it would not fit in size. */
void config_int_list_text(const int64_t *v, int n, char *buf, size_t size);

/* Micro-batches per DP replica, M = global_batch_tokens / (dp * context_window); 0 if dp is auto. */
int64_t config_micro_batches(const Config *cfg);

/* train.stop_after: a step count ("500": *steps = 500, *seconds = 0) or a wall time ("90s", "45m",
 * "2h", "1h30m", "1h0m30s": *seconds, *steps = 0). Returns -1 for anything else (config_resolve
 * reports it as a bad value, so a resolved config's stop_after always parses). */
int config_stop_after(const char *s, int64_t *steps, double *seconds);

/* Names of the enum values (for logs). */
const char *config_packer_name(PackerKind k);
const char *config_cp_sharding_name(CpSharding k);
const char *config_hardware_name(HardwareKind k);
const char *config_recompute_name(Recompute k);
const char *config_stage_layers_name(StageLayers k); /* "even", "auto", "a list" */

#endif
