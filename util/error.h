/*
 * util/error.h - how wlbtrain reports failure.
 *
 * A function that can fail takes an `Error *err` as its last argument. On failure it fills err with
 * one line "WHERE: WHAT" (WHERE is a file:line:column, a path or a flag) and an exit status, and
 * returns -1 (or NULL); nothing is printed below main. main() prints "wlbtrain: error: " + msg and
 * exits with the status:
 *   2  bad input: a config, flag, data file or checkpoint is wrong; nothing was overwritten.
 *   1  a failure at run time: a rank died, the loss is NaN, memory ran out, a write failed.
 * Tests call the same functions and assert on err->msg and err->status.
 *
 * Where there is no error path - out of memory inside an op, a state that cannot happen - the one
 * fatal path is wlb_fatal: "wlbtrain: error: [rank R: ]FILE:LINE: MESSAGE" and exit status 1 (under
 * MPI the whole job ends: the comm layer installs MPI_Abort as the exit). WLB_ASSERT checks an
 * invariant through it and stays on in release builds.
 */
#ifndef WLB_UTIL_ERROR_H
#define WLB_UTIL_ERROR_H

#ifdef __cplusplus
#define WLB_NORETURN [[noreturn]]
extern "C" {
#else
#include <stdnoreturn.h>
#define WLB_NORETURN noreturn
#endif

enum { ERROR_RUNTIME = 1, ERROR_INPUT = 2 };

typedef struct Error {
    int status;     /* 0 while no error is set, else ERROR_INPUT or ERROR_RUNTIME */
    char msg[1024]; /* "WHERE: WHAT", one line, no trailing newline */
} Error;

/* Sets a bad-input error (status 2) "where: what". Always returns -1. */
int error_set(Error *err, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sets a run-time error (status 1). Always returns -1. */
int error_runtime(Error *err, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sets an error from errno: "where: what: strerror(errno)"; status 2 for a missing or unreadable
 * input (ENOENT, EACCES, EISDIR, ENOTDIR), else 1. Always returns -1. */
int error_errno(Error *err, const char *where, const char *what);

/* Adds to the message of an error already set (how to fix it, say); nothing when none is set. */
void error_append(Error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "wlbtrain: error: MSG" on stderr and exits with err->status (1 if none was set). */
WLB_NORETURN void error_exit(const Error *err);

/* The fatal path (see above); call it through wlb_fatal(...) for the file and line. */
WLB_NORETURN void wlb_fatal_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define wlb_fatal(...) wlb_fatal_at(__FILE__, __LINE__, __VA_ARGS__)
#define WLB_ASSERT(cond) ((cond) ? (void)0 : wlb_fatal_at(__FILE__, __LINE__, "invariant broken: %s", #cond))
/* From now on wlb_fatal names this rank (-1: none) and ends the process with end(status) instead
 * of exit(status) (the comm layer passes one that aborts the MPI job; exit follows if it returns). */
void error_set_fatal_context(int rank, void (*end)(int status));

#ifdef __cplusplus
}
#endif

#endif
