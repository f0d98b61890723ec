/*
 * engine/train/train_memory.h - the memory model: the bytes of device memory every rank of a layout
 * holds, predicted from the config before anything is allocated, and the check of the worst rank
 * against the device's memory (train.gpu_memory_gb).
 *
 * The parts are the ones the trainer allocates (train_setup.c), from the same shapes: the model
 * chunks' parameters (model_param_count, each chunk with its layers of parallel.chunk_layers), AdamW's moments over the optimizer's range, the
 * activation slots (model_memory: the table model_reserve allocates from) times the micro-batches
 * each chunk holds at once under the pipeline schedule (sched_stage_ops), sized for the largest
 * micro-batch the planner can make (plan_largest: S_max for wlb, the window for the fixed packers),
 * and the buffers beside them. The dry run prints it; training checks it before the backend is
 * opened, so a layout that does not fit ends before any GPU memory is taken.
 */
#ifndef WLB_ENGINE_TRAIN_MEMORY_H
#define WLB_ENGINE_TRAIN_MEMORY_H

#include "config/config.h"
#include "engine/plan/dryrun.h"
#include "engine/plan/sched.h"
#include "util/error.h"

/* The CUDA context, cuBLASLt's handles and workspace and the attention kernels' work lists: an
 * allowance per GPU rank, not a measured figure (bench/gpu_throughput.sh puts the prediction beside
 * the device's measured peak on a GPU). NCCL's buffers are counted beside it, per communicator
 * (train_memory.c, nccl_buffer_bytes). */
#define TRAINER_GPU_RUNTIME_BYTES 1.0e9

/* Every pipeline stage's rank of cfg (resolved; dp a number). train.device decides the compute
 * dtype's size (train.precision) and the logits block (the GPU's or the CPU's). */
int trainer_memory_plan(const Config *cfg, DryRunMemoryPlan *out, Error *err);
/* *m: the micro-batches per replica, or an Error when dp is not a number yet or interleaving cannot
 * take them (a multiple of pp). */
int trainer_micro_batches(const Config *cfg, int64_t *m, Error *err);
/* The rank of stage s alone, its chunks holding the layers of chunk_layers (pp * virtual_stages
 * counts of at least 1, adding up to at most model.n_layers; the other stages' only place its
 * chunks' layers) instead of the config's split: what the auto split (train_stages.c) weighs each
 * candidate with. */
int trainer_stage_memory(const Config *cfg, const int64_t *chunk_layers, int s, DryRunMemory *out, Error *err);
void trainer_memory_free(DryRunMemoryPlan *mp);
/* Bytes a rank may use: train.gpu_memory_gb, else balance.hardware's memory (0: not checked, the
 * CPU profile). */
double trainer_memory_budget(const Config *cfg);
/* An Error (train.gpu_memory_gb, status 2) when the worst rank needs more than the budget: by how
 * much, and which single change would make it fit (a recompute mode, sequence parallelism, ZeRO-1,
 * a smaller S_max, twice the TP, PP or CP degree), each with the peak it would have. */
int trainer_memory_check(const Config *cfg, const DryRunMemoryPlan *mp, Error *err);
/* What training does before it starts MPI and opens the backend: *predicted gets the worst rank's
 * peak (bytes, for the metrics), and on the GPU - or on the CPU when train.gpu_memory_gb is set, the
 * host's memory not being a GPU's - a layout that does not fit is an Error (trainer_memory_check).
 * Every rank computes the same from the same config: each stops alone, as with a bad config. */
int trainer_memory_admit(const Config *cfg, double *predicted, Error *err);
/* The most micro-batches local chunk k holds activations for at once over a stage's passes (at
 * least 1): the activation slots it needs. */
int trainer_slots_in_flight(const SchedOp *ops, int n, int k);

#endif
