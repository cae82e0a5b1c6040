/*
 * check_finalize: the end of a job, with every shard's result in place
 * (written here as the workers would have left them). The node that wins
 * the election merges in shard order into the job's output and records
 * finalize.json; a result recorded by another node is applied without a
 * merge (complete, or failed with that node's reason, which esctl merge
 * moves aside); a result that changed since its done record fails the job
 * naming it; while another node holds a fresh election lock this node
 * only waits for its record, and a lock whose lease ran out is moved aside
 * and the election held again.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "finalize.h"
#include "fsutil.h"
#include "jobs.h"
#include "json.h"
#include "manifest.h"
#include "testbed.h"
#include "testutil.h"
#include "util.h"

#define DEADLINE 10.0 /* seconds any single wait may take */

static struct job *J;
static int ndone;

static void
on_done(struct job *j)
{
    ck_assert_ptr_eq(j, J);
    ndone++;
}

static bool
finished(void *arg)
{
    (void)arg;
    return ndone > 0;
}

static bool
job_over(void *arg)
{
    (void)arg;
    return J->state == JOB_COMPLETE || J->state == JOB_FAILED;
}

/* The path of rel in the job (caller frees). */
static char *
job_path(const char *rel)
{
    return fs_join(tb.job_dir, rel);
}

static void
setup(void)
{
    struct esd_err err;

    tb_setup();
    ndone = 0;
    ck_assert_msg(jobs_init(tb.loop, &tb.conf, &err) == 0, "jobs_init: %s", err.msg);
    finalize_init(tb.loop, &tb.conf);
    finalize_set_done(on_done);
    J = tb_register();
    tb_load(J);
    /* (published out of shard order: the merge follows the manifest) */
    for (size_t i = J->m.nshards; i-- > 0;)
        tb_put_result(i);
}

static void
teardown(void)
{
    finalize_fini();
    jobs_fini();
    tb_teardown();
}

/* finalize.json as another node writes it. */
static void
put_record(const char *status, const char *error)
{
    cJSON *o = cJSON_CreateObject();
    char *path = job_path("state/esd/finalize.json"), *dir = job_path("state/esd");
    struct esd_err err;

    json_add_str(o, "status", status);
    json_add_str(o, "node", "node-b");
    json_add_int(o, "rows", 5);
    if (error)
        json_add_str(o, "error", error);
    ck_assert_int_eq(fs_mkdir_p(dir, 0755, NULL), 0);
    ck_assert_msg(json_write_atomic(path, o, JSON_PRETTY, &err) == 0, "%s", err.msg);
    cJSON_Delete(o);
    free(dir);
    free(path);
}

/* The election lock of node-b, aged age seconds. */
static void
put_lock(double age)
{
    const char *rel = "state/esd/finalize.lock";
    char *path = job_path(rel);

    free(tu_write(tb.job_dir, rel,
                  "{\"node\":\"node-b\",\"token\":\"0123456789abcdef0123456789abcdef\","
                  "\"phase\":\"finalize\",\"lease_secs\":3}\n",
                  (size_t)-1));
    tu_set_age(path, age);
    free(path);
}

static const char *
record_status(void)
{
    static char status[32];
    char *path = job_path("state/esd/finalize.json");
    cJSON *o = NULL;

    ck_assert_msg(json_load_object(path, 1 << 20, &o, NULL) == 0, "no %s", path);
    snprintf(status, sizeof(status), "%s", json_get_str(o, "status"));
    cJSON_Delete(o);
    free(path);
    return status;
}

/* This node merged: the output holds every row in shard order. */
static void
expect_merged_here(void)
{
    char *merged = tu_read(J->output, NULL), *lock = job_path("state/esd/finalize.lock");

    ck_assert_msg(merged, "no merged output %s", J->output);
    ck_assert_str_eq(merged, "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"text\":\"c\"}\n"
                             "{\"text\":\"d\"}\n{\"text\":\"e\"}\n");
    ck_assert_str_eq(record_status(), "complete");
    ck_assert_msg(!tu_exists(lock), "the election lock stayed");
    free(lock);
    free(merged);
}

/* Entries of dir whose name starts with prefix. */
static int
count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

START_TEST(test_merges_in_order)
{
    finalize_start(J);
    ck_assert_int_eq(J->state, JOB_FINALIZING);
    ck_assert_uint_eq(finalize_running(), 1);
    finalize_start(J); /* (idempotent) */
    ck_assert_uint_eq(finalize_running(), 1);
    ck_assert_msg(tb_run_until(finished, NULL, DEADLINE), "the merge did not end");
    ck_assert_int_eq(ndone, 1);
    ck_assert_int_eq(J->state, JOB_COMPLETE);
    ck_assert_uint_eq(finalize_running(), 0);
    ck_assert_ptr_null(J->finalize);
    expect_merged_here();
}
END_TEST

START_TEST(test_applies_recorded_complete)
{
    put_record("complete", NULL);
    finalize_start(J);
    /* at once, without a merge of this node's */
    ck_assert_int_eq(ndone, 1);
    ck_assert_int_eq(J->state, JOB_COMPLETE);
    ck_assert_uint_eq(finalize_running(), 0);
    ck_assert_msg(!tu_exists(J->output), "merged here too");
}
END_TEST

START_TEST(test_applies_recorded_failure)
{
    char *dir = job_path("state/esd"), *record = job_path("state/esd/finalize.json");

    put_record("failed", "disk full");
    finalize_start(J);
    ck_assert_int_eq(ndone, 1);
    ck_assert_int_eq(J->state, JOB_FAILED);
    ck_assert_str_eq(J->error ? J->error : "(none)", "the merge failed on node node-b: disk full");
    ck_assert_msg(!tu_exists(J->output), "merged here");
    /* esctl merge: the record is moved aside and the job works again */
    ck_assert(finalize_retry(J));
    ck_assert_int_eq(J->state, JOB_ACTIVE);
    ck_assert_int_eq(count_prefixed(dir, "finalize.failed."), 1);
    ck_assert_msg(!tu_exists(record), "the failed record stayed");
    ck_assert_msg(!tu_exists(J->output), "merged by the retry itself");
    free(record);
    free(dir);
}
END_TEST

START_TEST(test_changed_result_fails)
{
    char *rel = xasprintf("attempts/%s/0001-x/processed.jsonl", J->m.shards[1].id);

    free(tu_write(tb.job_dir, rel, "{\"text\":\"changed\"}\n{\"text\":\"d\"}\n", (size_t)-1));
    finalize_start(J);
    ck_assert_msg(tb_run_until(finished, NULL, DEADLINE), "the merge did not end");
    ck_assert_int_eq(J->state, JOB_FAILED);
    ck_assert_msg(J->error && strstr(J->error, J->m.shards[1].id),
                  "error %s, expected it to "
                  "name shard %s",
                  J->error ? J->error : "(none)", J->m.shards[1].id);
    ck_assert_str_eq(record_status(), "failed");
    ck_assert_msg(!tu_exists(J->output), "a merged output was published");
    free(rel);
}
END_TEST

START_TEST(test_waits_for_other_node)
{
    put_lock(0);
    finalize_start(J);
    ck_assert_int_eq(J->state, JOB_FINALIZING);
    ck_assert_uint_eq(finalize_running(), 0);
    ck_assert_int_eq(ndone, 0);
    /* the other node records its result: this node's poll finds it */
    put_record("complete", NULL);
    ck_assert_msg(tb_run_until(finished, NULL, DEADLINE), "the record was not seen");
    ck_assert_int_eq(J->state, JOB_COMPLETE);
    ck_assert_msg(!tu_exists(J->output), "merged here too");
}
END_TEST

START_TEST(test_stale_lock_elects_again)
{
    put_lock(60); /* (its lease, 3 s, long over) */
    finalize_start(J);
    ck_assert_uint_eq(finalize_running(), 0);
    ck_assert_msg(tb_run_until(job_over, NULL, DEADLINE), "no merge after the stale lock");
    ck_assert_int_eq(J->state, JOB_COMPLETE);
    expect_merged_here();
}
END_TEST

static Suite *
finalize_suite(void)
{
    Suite *s = suite_create("finalize");
    TCase *tc = tcase_create("merge");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_merges_in_order);
    tcase_add_test(tc, test_applies_recorded_complete);
    tcase_add_test(tc, test_applies_recorded_failure);
    tcase_add_test(tc, test_changed_result_fails);
    tcase_add_test(tc, test_waits_for_other_node);
    tcase_add_test(tc, test_stale_lock_elects_again);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(finalize_suite());
}
