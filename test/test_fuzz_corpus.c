/*
 * test/test_fuzz_corpus.c - replays every input kept in test/fuzz/TARGET/ (the seeds, and what the
 * fuzzers of scripts/fuzz.sh found) through its fuzz target (fuzz/fuzz_targets.h): in make test,
 * under ASan and UBSan too, each input must end without a crash, a sanitizer report or an abort.
 */
#include "test/testlib.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_targets.h"
#include "util/ckpt_index.h"

static void replay(const char *target, int (*fn)(const uint8_t *, size_t))
{
    char *dir = test_format("test/fuzz/%s", target);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md"))
            continue;
        char *path = test_format("%s/%s", dir, e->d_name);
        size_t len;
        char *data = test_read_file(path, &len);
        assert_non_null(data);
        fn((const uint8_t *)data, len);
        free(data);
        free(path);
        n++;
    }
    closedir(d);
    printf("# %s: %d inputs replayed\n", target, n);
    assert_true(n > 0);
    free(dir);
}

static void test_config(void **state)
{
    (void)state;
    replay("config", fuzz_config);
}

static void test_idx(void **state)
{
    (void)state;
    replay("idx", fuzz_idx);
}

static void test_checkpoint(void **state)
{
    (void)state;
    replay("checkpoint", fuzz_checkpoint);
}

/* The seeds are checkpoint indexes as wlbtrain wrote them, of each version (seed-vN-*: version N,
 * the others version 1): the reader accepts every one (docs/checkpoints.md, "Older checkpoints") and
 * reads the binding only from version 3. What the replay pins beyond "no crash". */
static void test_ckpt_index(void **state)
{
    (void)state;
    replay("ckpt_index", fuzz_ckpt_index);
    DIR *d = opendir("test/fuzz/ckpt_index");
    assert_non_null(d);
    char *tmp = test_tmpdir();
    int seen[4] = {0};
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "seed-", 5) != 0)
            continue;
        int version = !strncmp(e->d_name, "seed-v", 6) && e->d_name[6] >= '1' && e->d_name[6] <= '3' ? e->d_name[6] - '0' : 1;
        char *path = test_format("test/fuzz/ckpt_index/%s", e->d_name);
        size_t len;
        char *data = test_read_file(path, &len);
        char *index = test_write_file(tmp, "index.json", data, len);
        CkptIndex ix;
        Error err = {0};
        if (ckpt_index_open(&ix, tmp, &err) != 0)
            print_error("%s: %s\n", e->d_name, err.msg);
        assert_int_equal(err.msg[0], 0);
        assert_int_equal(ix.version, version);
        assert_true(version < 3 ? ix.run == 0 && !ix.sums : ix.run != 0 && ix.sums && ix.state_sum.bytes > 0);
        seen[version]++;
        ckpt_index_close(&ix);
        free(index);
        free(data);
        free(path);
    }
    closedir(d);
    printf("# ckpt_index seeds read: %d of version 1, %d of version 2, %d of version 3\n", seen[1], seen[2], seen[3]);
    assert_true(seen[1] > 0 && seen[2] > 0 && seen[3] > 0);
    test_rm_rf(tmp);
    free(tmp);
}

static void test_safetensors(void **state)
{
    (void)state;
    replay("safetensors", fuzz_safetensors);
}

static void test_lengths(void **state)
{
    (void)state;
    replay("lengths", fuzz_lengths);
}

static void test_tokenizer(void **state)
{
    (void)state;
    replay("tokenizer", fuzz_tokenizer);
}

static void test_calibration(void **state)
{
    (void)state;
    replay("calibration", fuzz_calibration);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_idx),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_ckpt_index),
        cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_lengths),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_calibration),
    };
    return cmocka_run_group_tests_name("fuzz_corpus", tests, NULL, NULL);
}
