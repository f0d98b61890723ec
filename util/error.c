/* util/error.c - filling and printing Error (see error.h for the contract). */
#include "util/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int error_vset(Error *err, int status, const char *where, const char *fmt, va_list ap)
{
    if (!err)
        return -1;
    err->status = status;
    int n = snprintf(err->msg, sizeof err->msg, "%s: ", where ? where : "wlbtrain");
    if (n < 0 || (size_t)n >= sizeof err->msg)
        n = 0;
    vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    /* One line: a newline inside a message (from a file name, say) would break the format. */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    return -1;
}

int error_set(Error *err, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, ERROR_INPUT, where, fmt, ap);
    va_end(ap);
    return -1;
}

int error_runtime(Error *err, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, ERROR_RUNTIME, where, fmt, ap);
    va_end(ap);
    return -1;
}

int error_errno(Error *err, const char *where, const char *what)
{
    int e = errno;
    int input = e == ENOENT || e == EACCES || e == EISDIR || e == ENOTDIR || e == ENAMETOOLONG;
    if (input)
        return error_set(err, where, "%s: %s", what, strerror(e));
    return error_runtime(err, where, "%s: %s", what, strerror(e));
}

noreturn void error_exit(const Error *err)
{
    fflush(stdout);
    fprintf(stderr, "wlbtrain: error: %s\n", err && err->status ? err->msg : "unknown error");
    exit(err && err->status ? err->status : ERROR_RUNTIME);
}
