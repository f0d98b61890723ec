/* engine/comm/runtime.c - the launch as the environment describes it (see runtime.h). */
#include "engine/comm/runtime.h"

#include <stdlib.h>

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
