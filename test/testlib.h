/*
 * test/testlib.h - helpers shared by the tests (cmocka).
 *
 * Each test_*.c is one program of cmocka unit tests, linked with libwlb.a. test/run.sh runs them all
 * for a build variant, with WLBTRAIN pointing at that variant's binary, and prints the summary.
 *
 * Linked with testlib.c, a program's failures read as failures (testlib.c's constructor): cmocka's
 * "ok N" / "not ok N" line always starts a line of stdout, even after a comment printed without its
 * newline, and wlb_fatal in the code under test fails the running test instead of ending the program.
 */
#ifndef WLB_TEST_TESTLIB_H
#define WLB_TEST_TESTLIB_H

/* cmocka needs these before its header. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* 1 in the ASan build, where the longest suites run a subset of their cases (each path still at
 * least once; the release build runs them all: docs/testing.md), else 0. */
#if defined(__SANITIZE_ADDRESS__)
enum { TEST_SANITIZED = 1 };
#else
enum { TEST_SANITIZED = 0 };
#endif

/* The output and exit status of one run of the wlbtrain binary. */
typedef struct CmdResult {
    int status;   /* exit status, or 128 + signal */
    char *out;    /* stdout, NUL-terminated */
    char *err;    /* stderr, NUL-terminated */
} CmdResult;

/* Runs $WLBTRAIN (default ./wlbtrain) with the NULL-terminated args (not including argv[0]). */
void test_run_wlbtrain(CmdResult *r, const char *const *args);
/* Runs any program (argv[0] is looked up in PATH). */
void test_run(CmdResult *r, const char *const *argv);
void test_cmd_free(CmdResult *r);

/* Asserts exit status 2 and exactly one stderr line "wlbtrain: error: <expect...>" where expect is
 * a substring of the line. A failure says what was expected and what came, and cmocka's location
 * line names the caller's file and line. */
void test_assert_error_at(const CmdResult *r, const char *expect, const char *file, int line);
#define test_assert_error(r, expect) test_assert_error_at((r), (expect), __FILE__, __LINE__)

/* Path of a file under ../shared/real-data (or $WLB_REAL_DATA), or NULL when it is absent: then
 * the caller skips with the message printed here. With CI set (test_in_ci) an absent file fails
 * the test instead: CI runs with ../shared beside the clone and must run every test.
 * A user's clone has no ../shared, so the skip path is the one users run. cmocka's skip() leaves the
 * test by longjmp: look the data up before the test allocates anything, or free what it holds
 * before skipping, else LeakSanitizer fails the test there. test/run.sh runs these tests a second
 * time without the real data to keep that path honest. */
const char *test_real_data(const char *rel);
#define SKIP_WITHOUT_REAL_DATA(var, rel)          \
    const char *var = test_real_data(rel);        \
    if (!var) {                                   \
        skip();                                   \
        return;                                   \
    }

/* 1 when this machine shows an NVIDIA GPU (a /dev/nvidiaN device file, not hidden by
 * CUDA_VISIBLE_DEVICES): known without asking the CUDA backend under test. */
int test_gpu_visible(void);

/* 1 when the environment variable CI is set to something other than "", 0, false or no. */
int test_in_ci(void);

/* A fresh temporary directory (removed by test_rm_rf). */
char *test_tmpdir(void);
void test_rm_rf(const char *dir);
/* Writes content to dir/name and returns the malloc'd path. */
char *test_write_file(const char *dir, const char *name, const char *content, size_t len);
/* A JSON length list dir/name of n documents, document i len(i) tokens; returns its path. */
char *test_write_lengths(const char *dir, const char *name, int n, int (*len)(int i));
/* Reads a whole file (NUL-terminated, malloc'd); NULL if it cannot. */
char *test_read_file(const char *path, size_t *len);
/* A Megatron data set DIR/NAME (uint16) of n_docs documents of 1..30 tokens - with long_every > 0,
 * one in long_every on average of 100..255 tokens instead - with ids below vocab; returns the
 * malloc'd prefix. */
char *test_write_docs(const char *dir, const char *name, uint64_t seed, int n_docs, int long_every, int vocab);
/* Appends to argv from *k: timeout SECONDS, then with ranks > 0 mpirun --oversubscribe --bind-to none
 * -np RANKS [-x VAR] (VAR: an environment variable the ranks get; NULL: none). np: 16 bytes that must
 * outlive argv. */
void test_launch_argv(const char **argv, int *k, int seconds, int ranks, const char *var, char *np);

/* Every tensor of the safetensors file ref whose name starts with prefix ("" for all) against the
 * same tensor of out: the worst max |out - ref| / max |ref| (infinity when a tensor is missing, or
 * "tokens" or "valid_tokens" differ at all), named in worst_name. */
double test_compare_tensors(const char *out, const char *ref, const char *prefix, char *worst_name, size_t size);

/* malloc'd snprintf. */
char *test_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
