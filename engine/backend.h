/*
 * engine/backend.h - the devices and the communication paths a build has, as tables.
 *
 * The engine sees a device only through its Ops (engine/ops.h) and communication only through
 * engine/comm/comm.h. Which implementations exist is decided at link time by backends.c, the one
 * file that names cpu/ and cuda/: a backend registers a Backend (chosen by train.device), a
 * communication path a CommImpl (chosen by parallel.comm). Dependencies point one way:
 *     main -> cli, config -> engine -> data, util;   backends.c -> cpu, cuda -> engine/ops.h, engine/comm
 */
#ifndef WLB_ENGINE_BACKEND_H
#define WLB_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/ops.h"
#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which attention kernels a backend runs (train.attention): auto picks; cudnn is cuDNN's fused
 * attention (the CUDA backend with bf16; refused where the build or the machine has none); own is the
 * engine's kernels. A backend with one implementation (the CPU) takes every value but cudnn. */
typedef enum BackendAttention { BACKEND_ATTN_AUTO, BACKEND_ATTN_CUDNN, BACKEND_ATTN_OWN } BackendAttention;

/* What a backend is opened with. */
typedef struct BackendOpen {
    int local_rank;    /* this rank's place among the ranks of its machine: picks the GPU */
    int bf16;          /* train.precision: bf16 (products and the activations they read in bfloat16) */
    int deterministic; /* train.deterministic: the same bits run after run, even where that costs time */
    BackendAttention attention; /* train.attention */
} BackendOpen;

typedef struct Backend {
    const char *name; /* the value of train.device: cpu, cuda */
    /* One line for --version: what it was built with and what it finds now (or why it is absent). */
    void (*describe)(char *buf, size_t size);
    /* The ops of this process's device; NULL and an Error (train.device, status 2) when there is none
     * (no GPU visible, or a build without this backend). */
    const Ops *(*open)(const BackendOpen *opt, Error *err);
    /* The device this process opened, as an id that two processes of one machine share exactly when
     * they share the device (a GPU's PCI domain, bus and device: domain << 16 | bus << 8 | device);
     * -1 for none (the CPU, which shares cores instead). */
    int64_t (*device_id)(void);
    /* The job has ranks_here ranks on this machine (the CPU divides its cores among them); may be NULL. */
    void (*share_node)(int ranks_here);
    /* Frees what the backend holds for itself (scratch, handles) once nothing runs on it; may be NULL. */
    void (*close)(void);
} Backend;

/* The backend named `name` (train.device), or NULL when no backend has that name. */
const Backend *backend_find(const char *name);
/* The i-th backend of the build, NULL past the last (for --version). */
const Backend *backend_at(int i);
/* The communication path named `name` (parallel.comm: mpi, nccl), or NULL when this build has none
 * by that name. */
const CommImpl *backend_comm(const char *name);

#ifdef __cplusplus
}
#endif

#endif
