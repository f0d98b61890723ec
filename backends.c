/*
 * backends.c - the link table: the backends (train.device) and communication paths (parallel.comm)
 * this build has. The one file that names cpu/ and cuda/; the engine finds them here by name
 * (engine/backend.h) and sees them only through their tables.
 */
#include <stdio.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "engine/backend.h"
#ifdef WLB_CUDA
#include "cuda/cuda_nccl.h"
#include "cuda/cuda_ops.h"
#else
/* A build without nvcc: train.device: cuda is known, and says why it cannot be had. */
static void cuda_absent_describe(char *buf, size_t size)
{
    snprintf(buf, size, "not compiled in (built without nvcc, or with make CUDA=0)");
}

static const Ops *cuda_absent_open(const BackendOpen *opt, Error *err)
{
    (void)opt;
    error_set(err, "train.device", "this wlbtrain was built without the CUDA backend (nvcc was not found at build "
              "time, or make CUDA=0); set train.device: cpu or rebuild with nvcc");
    return NULL;
}

static int64_t cuda_absent_device(void) { return -1; }

static const Backend cuda_backend = {"cuda", cuda_absent_describe, cuda_absent_open, cuda_absent_device, NULL, NULL};
#endif

static const Backend *const backends[] = {&cpu_backend, &cuda_backend};

static const CommImpl *const comms[] = {
    &comm_mpi,
#ifdef WLB_CUDA
    &cuda_nccl_comm,
#endif
};

const Backend *backend_at(int i)
{
    return i >= 0 && i < (int)(sizeof backends / sizeof backends[0]) ? backends[i] : NULL;
}

const Backend *backend_find(const char *name)
{
    for (int i = 0; backend_at(i); i++)
        if (!strcmp(backend_at(i)->name, name))
            return backend_at(i);
    return NULL;
}

const CommImpl *backend_comm(const char *name)
{
    for (size_t i = 0; i < sizeof comms / sizeof comms[0]; i++)
        if (!strcmp(comms[i]->name, name))
            return comms[i];
    return NULL;
}
