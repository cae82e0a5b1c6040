/*
 * check_runner: one attempt at a time through the runner alone (no
 * scheduler): the job loaded by jobs_load, a shard claimed by hand, the
 * attempt run by runner_start with a shell script as the processor, and
 * its end read from the done callback and the files it left. A processor
 * that succeeds publishes the shard; one that exits non-zero, is killed by a
 * signal or runs past attempt_timeout_secs fails as a processor failure,
 * one that exits 0 without a valid output as an output failure (both
 * counted toward max_retries), with the error recorded in attempt.json; a
 * processor that cannot start or loses its lease fails as infrastructure;
 * a stopped attempt is released without counting; the attempt's output
 * goes to its process.log.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attempt.h"
#include "claim.h"
#include "fsutil.h"
#include "jobs.h"
#include "json.h"
#include "manifest.h"
#include "ray.h"
#include "runner.h"
#include "testbed.h"
#include "testutil.h"
#include "util.h"

#define DEADLINE 10.0 /* seconds any single wait may take */

static struct attempt_final fin;
static int ndone;
static size_t claimed; /* the shard start_attempt claimed (the claimer picks which) */

static void
on_done(struct job *j, const struct attempt_final *f)
{
    (void)j;
    fin = *f;
    ndone++;
}

static bool
attempt_ended(void *arg)
{
    (void)arg;
    return ndone > 0;
}

static bool
processor_runs(void *arg)
{
    (void)arg;
    return runner_busy() == 1;
}

static void
setup(void)
{
    struct esd_err err;

    tb_setup();
    ndone = 0;
    memset(&fin, 0, sizeof(fin));
    ck_assert_msg(jobs_init(tb.loop, &tb.conf, &err) == 0, "jobs_init: %s", err.msg);
    ck_assert_msg(ray_init(tb.loop, &tb.conf, &err) == 0, "ray_init: %s", err.msg);
    runner_init(tb.loop, &tb.conf);
    runner_set_done(on_done);
}

static void
teardown(void)
{
    runner_fini();
    jobs_fini();
    ray_fini();
    tb_teardown();
}

/* Loads tb's job, claims its first shard and starts the attempt; returns
 * the job and the attempt's directory (caller frees it). */
static struct job *
start_attempt(char **ret_attempt_dir)
{
    struct job *j = tb_register();
    struct claim cl;
    struct esd_err err;

    tb_load(j);
    ck_assert_uint_eq(j->m.nshards, 3);
    ck_assert_msg(claim_acquire(&j->claimer, &cl, &j->idle, &err) == 1, "claim: %s", err.msg);
    *ret_attempt_dir = xstrdup(cl.attempt_dir);
    claimed = cl.index;
    runner_start(j, &cl);
    ck_assert_uint_eq(runner_count(), 1);
    return j;
}

static void
wait_end(void)
{
    ck_assert_msg(tb_run_until(attempt_ended, NULL, DEADLINE), "the attempt did not end");
    ck_assert_int_eq(ndone, 1);
    ck_assert_uint_eq(runner_count(), 0);
}

/* attempt.json of the attempt in dir (caller deletes). */
static cJSON *
attempt_json(const char *dir)
{
    char *path = fs_join(dir, "attempt.json");
    cJSON *o = NULL;

    ck_assert_msg(json_load_object(path, 1 << 20, &o, NULL) == 0, "cannot read %s", path);
    free(path);
    return o;
}

static bool
state_file(struct job *j, const char *kind, size_t i)
{
    char *path = manifest_state_path(&j->m, kind, j->m.shards[i].id, ".json");
    bool there = tu_exists(path);

    free(path);
    return there;
}

/* A failure of the shard's (class processor or output): counted, the
 * shard not failed yet, the class and the error (containing want)
 * recorded in attempt.json. */
static void
expect_counted_failure(struct job *j, const char *dir, const char *want_class, const char *want)
{
    cJSON *o = attempt_json(dir);
    const char *cls = json_get_str(o, "failure_class"), *error = json_get_str(o, "error");

    ck_assert_str_eq(fin.status, "failed");
    ck_assert_msg(fin.counted, "a processor failure counts toward max_retries");
    ck_assert(!fin.shard_done && !fin.shard_failed);
    ck_assert_uint_eq(fin.index, claimed);
    ck_assert_str_eq(cls ? cls : "(none)", want_class);
    ck_assert_msg(error && strstr(error, want), "error %s, expected it to say %s",
                  error ? error : "(none)", want);
    ck_assert_uint_eq(j->failed_here, 1);
    ck_assert_uint_eq(j->done_here, 0);
    ck_assert(!state_file(j, "done", claimed));
    ck_assert_uint_eq(j->running, 0);
    cJSON_Delete(o);
}

START_TEST(test_success_publishes)
{
    char *dir, *out, *in, *got, *want, *log, *claims;
    struct job *j;

    tb_processor("echo processing \"$in\"\ncp \"$in\" \"$out\"");
    j = start_attempt(&dir);
    wait_end();
    ck_assert_str_eq(fin.status, "done");
    ck_assert(fin.shard_done && !fin.shard_failed && !fin.counted);
    ck_assert_uint_eq(j->done_here, 1);
    ck_assert_uint_eq(j->failed_here, 0);
    ck_assert_uint_eq(fin.index, claimed);
    ck_assert_uint_eq(j->rows_here, j->m.shards[claimed].rows);
    ck_assert(state_file(j, "done", claimed));
    ck_assert(!state_file(j, "done", (claimed + 1) % 3));
    /* the accepted output is what the processor wrote */
    out = fs_join(dir, "processed.jsonl");
    in = fs_join(j->job_dir, j->m.shards[claimed].path);
    got = tu_read(out, NULL);
    want = tu_read(in, NULL);
    ck_assert_msg(got && want, "cannot read %s or %s", out, in);
    ck_assert_str_eq(got, want);
    free(got);
    /* what it printed is in its process.log */
    log = fs_join(dir, "process.log");
    got = tu_read(log, NULL);
    ck_assert_msg(got && strstr(got, "processing /"), "process.log: %s", got ? got : "(none)");
    /* the claim is no longer recorded in the state directory */
    claims = fs_join(tb.conf.state_dir, "claims");
    ck_assert_int_eq(tu_count_entries(claims), 0);
    ck_assert_uint_eq(j->running, 0);
    free(claims);
    free(got);
    free(want);
    free(log);
    free(in);
    free(out);
    free(dir);
}
END_TEST

/* Processors that fail, the class of the failure and what its error says. */
static const struct {
    const char *body;
    long timeout_secs;
    const char *class;
    const char *error;
} failing[] = {
    { "exit 3", 0, "processor", "returned exit code 3" },
    { "kill -9 $$", 0, "processor", "killed by signal 9" },
    /* killed at attempt_timeout_secs */
    { "exec sleep 30", 1, "processor", "timed out after 1 s" },
    /* exit status 0, but nothing to accept */
    { "true", 0, "output", "did not create" },
    { "echo '{\"text\": ' >\"$out\"", 0, "output", "Invalid JSON at" },
};

START_TEST(test_shard_fails)
{
    char *dir;
    struct job *j;

    tb.conf.attempt_timeout_secs = failing[_i].timeout_secs;
    tb_processor(failing[_i].body);
    j = start_attempt(&dir);
    wait_end();
    expect_counted_failure(j, dir, failing[_i].class, failing[_i].error);
    free(dir);
}
END_TEST

/* A processor that cannot be started is esd's or the node's failure, not
 * the shard's: it does not count toward max_retries. */
START_TEST(test_start_failure_is_infrastructure)
{
    char *dir;
    struct job *j;
    cJSON *o;

    strv_free(&tb.conf.processor);
    strv_init(&tb.conf.processor);
    strv_push_owned(&tb.conf.processor, fs_join(tb.tmp, "no-such-processor"));
    j = start_attempt(&dir);
    wait_end();
    ck_assert_str_eq(fin.status, "failed");
    ck_assert(!fin.counted && !fin.shard_done && !fin.shard_failed);
    o = attempt_json(dir);
    ck_assert_str_eq(json_get_str(o, "failure_class"), "infrastructure");
    ck_assert(!state_file(j, "done", claimed));
    cJSON_Delete(o);
    free(dir);
}
END_TEST

/* Stopped (a drain, a shutdown): released, nothing counted, and the shard
 * can be claimed again at once. */
START_TEST(test_stop_releases)
{
    struct claim cl;
    struct esd_err err;
    bool again = false;
    char *dir;
    struct job *j;
    cJSON *o;

    tb_processor("exec sleep 30");
    j = start_attempt(&dir);
    ck_assert_msg(tb_run_until(processor_runs, NULL, DEADLINE), "the processor did not start");
    runner_stop_all();
    wait_end();
    ck_assert_str_eq(fin.status, "released");
    ck_assert(!fin.counted && !fin.shard_done && !fin.shard_failed);
    ck_assert_uint_eq(j->failed_here, 0);
    o = attempt_json(dir);
    ck_assert_str_eq(json_get_str(o, "status"), "released");
    cJSON_Delete(o);
    /* every shard is claimable now, the released one too */
    for (int k = 0; k < 3; k++) {
        ck_assert_msg(claim_acquire(&j->claimer, &cl, &j->idle, &err) == 1, "claim %d: %s", k,
                      err.msg);
        again |= cl.index == claimed;
        claim_release(&cl, NULL);
        claim_free(&cl);
    }
    ck_assert_msg(again, "the released shard was not claimed again");
    free(dir);
}
END_TEST

/* The lease renewal finds its lock gone: the attempt is stopped and ends
 * as lost, an infrastructure failure that publishes nothing. */
START_TEST(test_lease_lost_stops)
{
    char *dir, *lock;
    struct job *j;

    tb_processor("exec sleep 30");
    j = start_attempt(&dir);
    ck_assert_msg(tb_run_until(processor_runs, NULL, DEADLINE), "the processor did not start");
    lock = manifest_state_path(&j->m, "locks", j->m.shards[claimed].id, ".lock");
    ck_assert_msg(unlink(lock) == 0, "cannot remove %s", lock);
    wait_end();
    ck_assert_str_eq(fin.status, "lost");
    ck_assert(!fin.counted && !fin.shard_done);
    ck_assert(!state_file(j, "done", claimed));
    free(lock);
    free(dir);
}
END_TEST

static Suite *
runner_suite(void)
{
    Suite *s = suite_create("runner");
    TCase *tc = tcase_create("attempt");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_success_publishes);
    tcase_add_loop_test(tc, test_shard_fails, 0, (int)(sizeof(failing) / sizeof(failing[0])));
    tcase_add_test(tc, test_start_failure_is_infrastructure);
    tcase_add_test(tc, test_stop_releases);
    tcase_add_test(tc, test_lease_lost_stops);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(runner_suite());
}
