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

void error_append(Error *err, const char *fmt, ...)
{
    if (!err || !err->status)
        return;
    size_t n = strlen(err->msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - n, fmt, ap);
    va_end(ap);
    for (char *p = err->msg + n; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

noreturn void error_exit(const Error *err)
{
    fflush(stdout);
    fprintf(stderr, "wlbtrain: error: %s\n", err && err->status ? err->msg : "unknown error");
    exit(err && err->status ? err->status : ERROR_RUNTIME);
}

static int fatal_rank = -1;
static void (*fatal_end)(int status);

void error_set_fatal_context(int rank, void (*end)(int status))
{
    fatal_rank = rank;
    fatal_end = end;
}

noreturn void wlb_fatal_at(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (fatal_rank >= 0)
        fprintf(stderr, "wlbtrain: error: rank %d: %s:%d: %s\n", fatal_rank, file, line, msg);
    else
        fprintf(stderr, "wlbtrain: error: %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    if (fatal_end)
        fatal_end(ERROR_RUNTIME);
    exit(ERROR_RUNTIME);
}
