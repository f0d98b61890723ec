/* test/testlib.c - see testlib.h. */
#include "test/testlib.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/data_idx.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/safetensors.h"

/* ---- a failure reads as a failure ------------------------------------------------------------ */

/* 1 when the last byte written to stdout ended a line (or nothing was written). */
static int stdout_at_line_start = 1;

/* cmocka's result lines: "ok N - name", "not ok N - name" (and "not ok N # SKIP name"). */
static int is_tap_result(const char *buf, size_t n)
{
    size_t at = n >= 7 && !memcmp(buf, "not ok ", 7) ? 7 : n >= 3 && !memcmp(buf, "ok ", 3) ? 3 : 0;
    return at && at < n && buf[at] >= '0' && buf[at] <= '9';
}

static int write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

static ssize_t tap_stdout_write(void *cookie, const char *buf, size_t n)
{
    (void)cookie;
    if (n == 0)
        return 0;
    if (!stdout_at_line_start && is_tap_result(buf, n) && write_all(1, "\n", 1) != 0)
        return -1;
    if (write_all(1, buf, n) != 0)
        return -1;
    stdout_at_line_start = buf[n - 1] == '\n';
    return (ssize_t)n;
}

/* wlb_fatal in the test program (a broken WLB_ASSERT of the planner, say) would exit(1) in the
 * middle of a test: no result line for it, none for the tests after it. wlb_fatal has printed its
 * line on stderr; on the test's own thread, outside a parallel region, the test fails instead
 * (cmocka leaves it by longjmp) and the next one runs. Elsewhere (an OpenMP worker, whose stack the
 * test's jmp_buf is not on) the program ends as wlb_fatal ends it, and says which way. */
static void fatal_fails_the_test(int status)
{
    if (syscall(SYS_gettid) == getpid() && !omp_in_parallel())
        fail_msg("wlb_fatal (its line is above, on stderr): the code under test ended with status %d", status);
    fprintf(stderr, "# wlb_fatal on a worker thread: the test program ends here, status %d\n", status);
}

/* Every program linked with testlib: stdout through tap_stdout_write, unbuffered, so that each
 * printf (and each line of cmocka's) arrives whole and a result line always starts a line. A test
 * that printed "# what: " and then a child's stderr - empty when the child unexpectedly succeeded,
 * so no newline - used to glue cmocka's "not ok N - test" onto that comment: test/run.sh and
 * scripts/mutate.sh, which read lines starting with "not ok", then saw a program that stopped after
 * N - 1 results with status 1 and no failure named (test_testlib checks both ways). And wlb_fatal
 * fails the running test (fatal_fails_the_test). */
__attribute__((constructor)) static void testlib_init(void)
{
    cookie_io_functions_t io = {.read = NULL, .write = tap_stdout_write, .seek = NULL, .close = NULL};
    FILE *f = fopencookie(NULL, "w", io);
    if (f) {
        fflush(stdout);
        setvbuf(f, NULL, _IONBF, 0);
        stdout = f;
    }
    error_set_fatal_context(-1, fatal_fails_the_test);
}

static char *slurp_fd(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

void test_run(CmdResult *r, const char *const *argv)
{
    /* Output goes to temporary files, not pipes: no deadlock however much a program prints. */
    char out_path[] = "/tmp/wlbtest-out-XXXXXX", err_path[] = "/tmp/wlbtest-err-XXXXXX";
    int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
    assert_true(out_fd >= 0 && err_fd >= 0);
    unlink(out_path);
    unlink(err_path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(out_fd, 1);
        dup2(err_fd, 2);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        assert_int_equal(errno, EINTR);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    lseek(out_fd, 0, SEEK_SET);
    lseek(err_fd, 0, SEEK_SET);
    r->out = slurp_fd(out_fd, NULL);
    r->err = slurp_fd(err_fd, NULL);
    close(out_fd);
    close(err_fd);
}

void test_run_wlbtrain(CmdResult *r, const char *const *args)
{
    const char *bin = getenv("WLBTRAIN");
    const char *argv[64];
    int n = 0;
    argv[n++] = bin && *bin ? bin : "./wlbtrain";
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    test_run(r, argv);
}

void test_cmd_free(CmdResult *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void test_assert_error_at(const CmdResult *r, const char *expect, const char *file, int line)
{
    if (r->status != 2 || strncmp(r->err, "wlbtrain: error: ", 17) || !strstr(r->err, expect) ||
        strchr(r->err, '\n') != r->err + strlen(r->err) - 1) {
        print_error("expected exit 2 and one line 'wlbtrain: error: ...%s...'\ngot exit %d, stderr:\n%s\n",
                    expect, r->status, r->err);
        _fail(file, line);
    }
}

const char *test_real_data(const char *rel)
{
    static char path[4096];
    const char *root = getenv("WLB_REAL_DATA");
    if (!root || !*root)
        root = "../shared/real-data";
    snprintf(path, sizeof path, "%s/%s", root, rel);
    if (access(path, R_OK) != 0) {
        if (test_in_ci()) {
            /* CI runs beside ../shared: every test must run there, none may skip for want of data. */
            print_error("%s is absent and CI is set (real data lives in ../shared/real-data beside the clone)\n", path);
            fail();
        }
        fprintf(stderr, "# skip: %s is absent (real data lives in ../shared/real-data beside the clone)\n", path);
        return NULL;
    }
    return path;
}

int test_gpu_visible(void)
{
    /* The NVIDIA driver makes a device file per GPU; CUDA_VISIBLE_DEVICES can hide them all. */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && (!*vis || !strcmp(vis, "-1") || !strcasecmp(vis, "none")))
        return 0;
    glob_t g;
    int n = glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    if (n)
        globfree(&g);
    return n > 0;
}

int test_in_ci(void)
{
    const char *ci = getenv("CI");
    return ci && *ci && strcmp(ci, "0") && strcasecmp(ci, "false") && strcasecmp(ci, "no");
}

char *test_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *path = test_format("%s/wlbtest-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(path));
    return path;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void test_rm_rf(const char *dir)
{
    if (dir)
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *test_write_file(const char *dir, const char *name, const char *content, size_t len)
{
    char *path = test_format("%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(content, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    return path;
}

char *test_write_lengths(const char *dir, const char *name, int n, int (*len)(int i))
{
    size_t cap = (size_t)n * 12 + 3, at = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    text[at++] = '[';
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(text + at, cap - at, "%s%d", i ? "," : "", len(i));
    text[at++] = ']';
    char *path = test_write_file(dir, name, text, at);
    free(text);
    return path;
}

char *test_read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    char *s = slurp_fd(fd, len);
    close(fd);
    return s;
}

char *test_format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    assert_true(vasprintf(&s, fmt, ap) >= 0);
    va_end(ap);
    return s;
}

char *test_write_docs(const char *dir, const char *name, uint64_t seed, int n_docs, int long_every, int vocab)
{
    char *prefix = test_format("%s/%s", dir, name);
    DataIdxWriter w;
    Error err = {0};
    Rng rng;
    rng_seed(&rng, seed);
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    for (int d = 0; d < n_docs; d++) {
        int32_t tok[256];
        int longer = long_every > 0 && rng_below(&rng, (uint64_t)long_every) == 0;
        int len = longer ? 100 + (int)rng_below(&rng, 156) : 1 + (int)rng_below(&rng, 30);
        /* Mostly a fixed successor, sometimes a random token: something to learn. */
        tok[0] = (int32_t)rng_below(&rng, (uint64_t)vocab);
        for (int i = 1; i < len; i++)
            tok[i] = rng_below(&rng, 4) ? (tok[i - 1] * 5 + 1) % vocab : (int32_t)rng_below(&rng, (uint64_t)vocab);
        assert_int_equal(data_idx_writer_add(&w, tok, (uint64_t)len, &err), 0);
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    return prefix;
}

void test_launch_argv(const char **argv, int *k, int seconds, int ranks, const char *var, char *np)
{
    static char secs[16];
    snprintf(secs, sizeof secs, "%d", seconds);
    argv[(*k)++] = "timeout";
    argv[(*k)++] = secs;
    if (ranks <= 0)
        return;
    snprintf(np, 16, "%d", ranks);
    const char *mpi[] = {"mpirun", "--oversubscribe", "--bind-to", "none", "-np", np};
    for (size_t i = 0; i < sizeof mpi / sizeof mpi[0]; i++)
        argv[(*k)++] = mpi[i];
    if (var) {
        argv[(*k)++] = "-x";
        argv[(*k)++] = var;
    }
}

/* max |a - b| / max |b| of one tensor (either dtype). */
static double tensor_error(const StTensor *a, const StTensor *b, int64_t n)
{
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    float *f = malloc((size_t)n * sizeof *f);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(f);
    const StTensor *t[2] = {a, b};
    double *out[2] = {x, y};
    for (int k = 0; k < 2; k++) {
        st_read_f32(t[k], f);
        for (int64_t i = 0; i < n; i++)
            out[k][i] = f[i];
        if (t[k]->dtype == ST_F64)
            memcpy(out[k], t[k]->data, (size_t)n * sizeof(double));
    }
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs(x[i] - y[i]));
        scale = fmax(scale, fabs(y[i]));
    }
    free(x);
    free(y);
    free(f);
    return scale > 0 ? diff / scale : diff;
}

double test_compare_tensors(const char *out, const char *ref, const char *prefix, char *worst_name, size_t size)
{
    StFile a, b;
    Error err = {0};
    if (st_open(&a, out, &err) != 0) {
        snprintf(worst_name, size, "%s", err.msg);
        return INFINITY;
    }
    assert_int_equal(st_open(&b, ref, &err), 0);
    double worst = 0;
    snprintf(worst_name, size, "-");
    for (int i = 0; i < b.n_tensors; i++) {
        const StTensor *r = &b.tensors[i], *x = st_find(&a, r->name);
        if (strncmp(r->name, prefix, strlen(prefix)) != 0)
            continue;
        int64_t n = 1;
        for (int d = 0; d < r->n_dims; d++)
            n *= r->shape[d];
        double e = INFINITY;
        if (x && x->n_dims == r->n_dims && x->shape[0] == r->shape[0] &&
            (r->n_dims == 1 || x->shape[1] == r->shape[1]))
            e = tensor_error(x, r, n);
        if ((!strcmp(r->name, "tokens") || !strcmp(r->name, "valid_tokens")) && e != 0)
            e = INFINITY;
        if (e > worst || (e == worst && worst == 0 && !strcmp(worst_name, "-"))) {
            worst = e;
            snprintf(worst_name, size, "%s", r->name);
        }
    }
    st_close(&a);
    st_close(&b);
    return worst;
}

