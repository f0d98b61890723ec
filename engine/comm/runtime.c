/* engine/comm/runtime.c - the launch as the environment describes it (see runtime.h). */
#include "engine/comm/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/parse.h"

/* Non-negative integer from the environment, or -1 if unset or malformed. */
static int env_int(const char *name)
{
    const char *s = getenv(name);
    int64_t v;
    if (!s || parse_int64(s, &v) != 0 || v < 0 || v > 1 << 30)
        return -1;
    return (int)v;
}

RuntimeLaunch runtime_launch_from_env(void)
{
    static const struct {
        const char *launcher, *size, *rank, *local;
    } vars[] = {
        {"mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"pmi", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"},
        {"srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"},
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int size = env_int(vars[i].size), rank = env_int(vars[i].rank), local = env_int(vars[i].local);
        if (size > 0 && rank >= 0 && rank < size)
            return (RuntimeLaunch){size, rank, local >= 0 ? local : 0, vars[i].launcher};
    }
    return (RuntimeLaunch){1, 0, 0, "none"};
}

void runtime_attempt(char *buf, size_t size)
{
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID"),
               *restart = getenv("SLURM_RESTART_COUNT"), *ns = getenv("PMIX_NAMESPACE");
    if (!ns || !*ns)
        ns = getenv("OMPI_MCA_ess_base_jobid");
    size_t at = 0;
    buf[0] = '\0';
    if (job && *job)
        at += (size_t)snprintf(buf, size, "slurm-%s.%s-r%s", job, step && *step ? step : "x",
                               restart && *restart ? restart : "0");
    if (ns && *ns && at < size)
        snprintf(buf + at, size - at, "%sns-%s", at ? "-" : "", ns);
    if (!buf[0])
        snprintf(buf, size, "none");
    for (char *p = buf; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == '.'))
            *p = '_';
}
