/*
 * cuda/cuda_timer.cu - the ops' device timer (engine/ops.h: timer_mark, timer_seconds): one CUDA
 * event per mark, recorded on the default stream (every op of the backend runs there, in order), so
 * the time between two marks is the device's time for the ops issued between them. Recording does
 * not wait; reading waits for the later mark only. Events are created when a mark is first used
 * (the trainer uses two per pass of its schedule) and kept for the next steps.
 */
#include "cuda/cuda_ops.h"

#include <stdlib.h>

#include "cuda/cuda_common.cuh"

static cudaEvent_t *events;
static int n_events;

void cuda_timer_mark(int i)
{
    if (i < 0)
        cuda_fatal("cuda_timer_mark", "negative mark");
    if (i >= n_events) {
        int n = i + 1 > 2 * n_events ? i + 1 : 2 * n_events;
        cudaEvent_t *grown = (cudaEvent_t *)realloc(events, (size_t)n * sizeof *grown);
        if (!grown)
            cuda_fatal("cuda_timer_mark", "out of host memory");
        events = grown;
        for (int k = n_events; k < n; k++)
            CUDA_CHECK(cudaEventCreate(&events[k]));
        n_events = n;
    }
    CUDA_CHECK(cudaEventRecord(events[i], 0));
}

double cuda_timer_seconds(int a, int b)
{
    if (a < 0 || b < 0 || a >= n_events || b >= n_events)
        cuda_fatal("cuda_timer_seconds", "mark never recorded");
    float ms = 0;
    CUDA_CHECK(cudaEventSynchronize(events[b]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, events[a], events[b]));
    return ms / 1e3;
}

void cuda_timer_release(void)
{
    for (int k = 0; k < n_events; k++)
        CUDA_CHECK(cudaEventDestroy(events[k]));
    free(events);
    events = NULL;
    n_events = 0;
}
