/*
 * check_suggest: the edit distance (each kind of edit, swaps of adjacent
 * characters as one, empty and overlong words) and the choice of a
 * suggestion: the closest name within the length's limit, the first of
 * equals, none for an exact match, a far word or a name all edits.
 */
#include <check.h>
#include <limits.h>
#include <string.h>

#include "suggest.h"
#include "testutil.h"

static int
dist(const char *a, const char *b)
{
    return suggest_distance(a, strlen(a), b, strlen(b));
}

START_TEST(test_distance)
{
    ck_assert_int_eq(dist("status", "status"), 0);
    ck_assert_int_eq(dist("stauts", "status"), 1); /* swap */
    ck_assert_int_eq(dist("wath", "watch"), 1);    /* insertion */
    ck_assert_int_eq(dist("watchh", "watch"), 1);  /* deletion */
    ck_assert_int_eq(dist("merje", "merge"), 1);   /* substitution */
    ck_assert_int_eq(dist("", "abc"), 3);
    ck_assert_int_eq(dist("abc", ""), 3);
    ck_assert_int_eq(dist("", ""), 0);
    ck_assert_int_eq(dist("ca", "abc"), 3); /* optimal string alignment, not full DL (2) */
    ck_assert_int_eq(dist("kitten", "sitting"), 3);
    ck_assert_int_eq(dist("Status", "status"), 1); /* case matters */
    /* a word given by length, not NUL-ended */
    ck_assert_int_eq(suggest_distance("wath=x", 4, "watch", 5), 1);
}
END_TEST

START_TEST(test_distance_overlong)
{
    char longw[SUGGEST_MAX_LEN + 2];

    memset(longw, 'a', sizeof(longw) - 1);
    longw[sizeof(longw) - 1] = '\0';
    ck_assert_int_eq(dist(longw, "a"), INT_MAX);
    ck_assert_int_eq(dist("a", longw), INT_MAX);
    longw[SUGGEST_MAX_LEN] = '\0';
    ck_assert_int_eq(dist(longw, longw), 0);
}
END_TEST

static const char *
best(const char *word, const char *const *names)
{
    struct suggest s;

    suggest_init(&s, word, strlen(word));
    for (; *names; names++)
        suggest_add(&s, *names);
    return suggest_result(&s);
}

static const char *const cmds[] = { "ping",  "version", "submit", "list",   "status", "prepare",
                                    "retry", "merge",   "verify", "cancel", "logs",   NULL };

START_TEST(test_suggest_closest)
{
    ck_assert_str_eq(best("stauts", cmds), "status");
    ck_assert_str_eq(best("sttus", cmds), "status");
    ck_assert_str_eq(best("mrege", cmds), "merge");
    ck_assert_str_eq(best("log", cmds), "logs");
    ck_assert_str_eq(best("prepair", cmds), "prepare");
    ck_assert_str_eq(best("verison", cmds), "version");
}
END_TEST

START_TEST(test_suggest_none)
{
    static const char *const none[] = { NULL };
    struct suggest s;

    ck_assert_ptr_null(best("status", cmds)); /* exact: not a typo */
    ck_assert_ptr_null(best("frobnicate", cmds));
    ck_assert_ptr_null(best("xyz", cmds));
    ck_assert_ptr_null(best("lxyz", cmds)); /* 3 edits from "list": too many for 4 */
    ck_assert_ptr_null(best("stat", none));
    ck_assert_ptr_null(best("", cmds));
    /* a name whose every character is an edit is no suggestion */
    static const char *const tiny[] = { "a", NULL };
    ck_assert_ptr_null(best("b", tiny));
    suggest_init(&s, "x", 1);
    suggest_add(&s, NULL); /* ignored */
    ck_assert_ptr_null(suggest_result(&s));
}
END_TEST

START_TEST(test_suggest_limit_by_length)
{
    static const char *const opts[] = { "watch", "all", "job-dir", "lock-timeout-secs", NULL };

    ck_assert_str_eq(best("wath", opts), "watch");
    ck_assert_str_eq(best("al", opts), "all");
    ck_assert_str_eq(best("jobdir", opts), "job-dir");
    ck_assert_str_eq(best("job_dri", opts), "job-dir"); /* 2 edits, 7 characters */
    ck_assert_str_eq(best("lock-timeout-sec", opts), "lock-timeout-secs");
    ck_assert_str_eq(best("lok-timeot-secss", opts), "lock-timeout-secs"); /* 3 edits */
    ck_assert_ptr_null(best("wtc", opts)); /* 2 edits for 3 characters */
}
END_TEST

START_TEST(test_suggest_first_of_equals)
{
    static const char *const two[] = { "shard", "share", NULL };

    ck_assert_str_eq(best("shar", two), "shard");
}
END_TEST

static Suite *
suggest_suite(void)
{
    Suite *s = suite_create("suggest");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_distance);
    tcase_add_test(tc, test_distance_overlong);
    tcase_add_test(tc, test_suggest_closest);
    tcase_add_test(tc, test_suggest_none);
    tcase_add_test(tc, test_suggest_limit_by_length);
    tcase_add_test(tc, test_suggest_first_of_equals);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(suggest_suite());
}
