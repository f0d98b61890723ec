/*
 * engine/comm/runtime.h - how this process was launched.
 *
 * Before MPI is started (for --print-config, a dry run, or to resolve parallel.dp: auto early), the
 * launcher's environment says how many ranks the job has and which one this is: Open MPI's mpirun
 * (OMPI_COMM_WORLD_*), PMI launchers (PMI_SIZE, PMI_RANK) and Slurm's srun (SLURM_STEP_NUM_TASKS,
 * SLURM_PROCID). A process started by hand is a world of one.
 */
#ifndef WLB_ENGINE_RUNTIME_H
#define WLB_ENGINE_RUNTIME_H

#include <stddef.h>

typedef struct RuntimeLaunch {
    int world_size; /* 1 when not launched by a known launcher */
    int rank;
    int local_rank; /* rank on this node: picks the GPU */
    const char *launcher; /* "mpirun", "srun", "pmi" or "none" */
} RuntimeLaunch;

RuntimeLaunch runtime_launch_from_env(void);

/* This launch's attempt into buf: the same string on every rank of one launch, another one for the
 * next launch (a requeue, a second mpirun): "slurm-JOB.STEP-rRESTARTS" under Slurm, with Open MPI's
 * or PMIx's job namespace after it ("-ns-NAME") when there is one; "none" when the environment says
 * nothing. Only [A-Za-z0-9._-] (it names a folder: util/flight.h's records of other attempts). */
void runtime_attempt(char *buf, size_t size);

#endif
