/*
 * check_history: reading a shard's attempts (common/history.c): order by
 * number, the fields and their fallbacks, junk and links skipped, the
 * bound on attempts kept, a missing directory, a hostile shard id.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "history.h"
#include "json.h"
#include "manifest.h"
#include "testutil.h"

static char *dir;
static struct manifest m;

#define TOKEN "0123456789abcdef0123456789abcdef"

static void
setup(void)
{
    dir = tu_tmpdir();
    memset(&m, 0, sizeof(m));
    m.job_dir = dir; /* history reads only the job directory */
}

static void
teardown(void)
{
    fs_rm_rf(dir);
    free(dir);
}

static void
put(const char *shard, int n, const char *json)
{
    char *rel = xasprintf("attempts/%s/%04d-" TOKEN "/attempt.json", shard, n);

    free(tu_write(dir, rel, json, (size_t)-1));
    free(rel);
}

START_TEST(test_attempts_in_order_with_fields)
{
    struct history_shard h;
    struct esd_err err;
    const struct history_attempt *a;

    put("s", 2,
        "{\"status\":\"done\",\"node\":\"n2\",\"started_at_epoch\":100.5,"
        "\"finished_at\":\"1970-01-01T00:01:50+00:00\",\"duration_secs\":9.5,"
        "\"result\":{\"rows\":7}}");
    put("s", 1,
        "{\"status\":\"stale\",\"hostname\":\"h1\",\"claimed_at_epoch\":90,"
        "\"stale_at\":\"1970-01-01T00:01:40Z\",\"failure_class\":\"infrastructure\"}");
    put("s", 3, "not json");
    free(tu_write(dir, "attempts/s/junk/attempt.json", "{}", (size_t)-1));
    ck_assert_int_eq(history_read(&m, "s", &h, &err), 0);
    ck_assert_uint_eq(h.n, 3);
    a = &h.v[0];
    ck_assert_int_eq(a->number, 1);
    ck_assert_str_eq(a->node, "h1"); /* the reference's hostname, without a node */
    ck_assert_str_eq(history_outcome(a), "taken over");
    ck_assert_str_eq(a->fclass, "infrastructure");
    ck_assert_double_eq_tol(a->start, 90, 1e-6);
    ck_assert_double_eq_tol(a->end, 100, 1e-6);
    ck_assert_double_eq_tol(a->elapsed, 10, 1e-6); /* end - start */
    ck_assert_int_eq(a->rows, -1);
    a = &h.v[1];
    ck_assert_str_eq(a->node, "n2");
    ck_assert_double_eq_tol(a->start, 100.5, 1e-6);
    ck_assert_double_eq_tol(a->elapsed, 9.5, 1e-6);
    ck_assert_int_eq(a->rows, 7);
    ck_assert_str_eq(history_outcome(a), "done");
    ck_assert_str_eq(history_outcome(&h.v[2]), "unreadable");
    ck_assert_ptr_eq(history_find(&h, 2), &h.v[1]);
    ck_assert_ptr_null(history_find(&h, 4));
    history_shard_free(&h);
}
END_TEST

START_TEST(test_missing_dir_and_bad_ids)
{
    struct history_shard h;
    struct esd_err err;

    ck_assert_int_eq(history_read(&m, "none", &h, &err), 0);
    ck_assert_uint_eq(h.n, 0);
    history_shard_free(&h);
    ck_assert_int_eq(history_read(&m, "..", &h, &err), -EINVAL);
    history_shard_free(&h);
    ck_assert_int_eq(history_read(&m, "a/b", &h, &err), -EINVAL);
    history_shard_free(&h);
}
END_TEST

START_TEST(test_link_not_followed)
{
    struct history_shard h;
    struct esd_err err;
    char *target, *link;

    put("real", 1, "{\"status\":\"done\"}");
    free(tu_write(dir, "attempts/.keep", "", 0));
    target = xasprintf("%s/attempts/real", dir);
    link = xasprintf("%s/attempts/evil", dir);
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_int_lt(history_read(&m, "evil", &h, &err), 0);
    history_shard_free(&h);
    free(target);
    free(link);
}
END_TEST

START_TEST(test_bounded)
{
    struct history_shard h;
    struct esd_err err;

    for (int i = 1; i <= HISTORY_MAX_ATTEMPTS + 5; i++)
        put("many", i, "{\"status\":\"failed\",\"error\":\"<b>x</b>\"}");
    ck_assert_int_eq(history_read(&m, "many", &h, &err), 0);
    ck_assert_uint_eq(h.n, HISTORY_MAX_ATTEMPTS);
    ck_assert_uint_eq(h.omitted, 5);
    ck_assert_int_eq(h.v[0].number, 6); /* the latest are kept */
    ck_assert_str_eq(h.v[0].error, "<b>x</b>");
    history_shard_free(&h);
}
END_TEST

static Suite *
history_suite(void)
{
    Suite *s = suite_create("history");
    TCase *tc = tcase_create("history");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_attempts_in_order_with_fields);
    tcase_add_test(tc, test_missing_dir_and_bad_ids);
    tcase_add_test(tc, test_link_not_followed);
    tcase_add_test(tc, test_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    json_init();
    return tu_run(history_suite());
}
