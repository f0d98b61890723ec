/* util/clock.h - the one clock: monotonic seconds, for step times, measured compute and planning. */
#ifndef WLB_UTIL_CLOCK_H
#define WLB_UTIL_CLOCK_H

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC): only differences mean something. */
double clock_seconds(void);

#ifdef __cplusplus
}
#endif

#endif
