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

/* Prints "wlbtrain: error: MSG" on stderr and exits with err->status (1 if none was set). */
WLB_NORETURN void error_exit(const Error *err);

#ifdef __cplusplus
}
#endif

#endif
