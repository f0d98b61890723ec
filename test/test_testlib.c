/*
 * test/test_testlib.c - a failing test reads as a failure: its own "not ok N - name" line at the
 * start of a line, the tests after it still run. This program runs itself as a child with
 * --planted, where a group of tests fails in the two ways that used to read as a program dying
 * after N - 1 results with status 1 and no failure named:
 *   1. "# what: " printed, then a child's stderr that is empty (a wlbtrain that succeeded where it
 *      should have refused) - no newline - and then the failed assertion: cmocka's result line went
 *      onto the end of that comment, where test/run.sh and scripts/mutate.sh (lines starting with
 *      "not ok") did not see it (test_checkpoint, issue 59);
 *   2. a broken WLB_ASSERT in the code under test: wlb_fatal exited the program.
 * and the third test passes. testlib.c's constructor is what makes both read as failures.
 */
#include "test/testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

static void planted_glued(void **state)
{
    (void)state;
    CmdResult r = {0, "", ""}; /* exit 0, nothing on stderr: an unexpected success */
    printf("# a refusal that did not come: %s", r.err);
    test_assert_error(&r, "holds step-00000008, later than the resumed step-00000006");
}

static volatile int two = 2;

static void planted_fatal(void **state)
{
    (void)state;
    WLB_ASSERT(two == 3);
}

static void planted_passes(void **state)
{
    (void)state;
    assert_int_equal(two, 2);
}

static int run_planted(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(planted_glued),
        cmocka_unit_test(planted_fatal),
        cmocka_unit_test(planted_passes),
    };
    return cmocka_run_group_tests_name("planted", tests, NULL, NULL);
}

/* The line of text that starts with prefix, or NULL. */
static const char *line_starting(const char *text, const char *prefix)
{
    for (const char *at = text; at && *at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL)
        if (!strncmp(at, prefix, strlen(prefix)))
            return at;
    return NULL;
}

static void test_failures_read_as_failures(void **state)
{
    (void)state;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    setenv("CMOCKA_MESSAGE_OUTPUT", "TAP", 1);
    const char *argv[] = {self, "--planted", NULL};
    CmdResult r;
    test_run(&r, argv);
    printf("# the planted group's stdout:\n");
    for (const char *at = r.out; *at;) {
        size_t len = strcspn(at, "\n");
        printf("#   %.*s\n", (int)len, at);
        at += len + (at[len] == '\n');
    }
    const char *want[] = {"1..3", "not ok 1 - planted_glued", "not ok 2 - planted_fatal", "ok 3 - planted_passes"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!line_starting(r.out, want[i])) {
            print_error("no line starting with '%s' in the planted group's output (exit %d); stderr:\n%s\n", want[i],
                        r.status, r.err);
            fail();
        }
    /* The glued failure's location is the assertion's line in this file, not testlib.c's. */
    assert_non_null(strstr(r.out, "\n# test/test_testlib.c:"));
    /* cmocka's exit status is the number of failed tests; each failure said what was expected. */
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "expected exit 2 and one line 'wlbtrain: error: ...holds step-00000008"));
    assert_non_null(strstr(r.err, "invariant broken: two == 3"));
    test_cmd_free(&r);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--planted"))
        return run_planted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failures_read_as_failures),
    };
    return cmocka_run_group_tests_name("testlib", tests, NULL, NULL);
}
