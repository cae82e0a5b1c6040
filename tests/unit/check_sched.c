/*
 * check_sched: the scheduler with every module of the daemon around it
 * (engine_init), a job registered as a submit does, and a shell script as
 * the processor. A job is claimed shard by shard, run, merged in order and
 * complete; a job whose shards are all done already is merged without a
 * claim; a shard failed terminally fails its job with its error. esctl
 * drain (sched_hold) stops claims, is kept in <state_dir>/drained across a
 * restart and undone by resume; with release it stops running attempts
 * without counting a failure. Failures in a row pause a job's claims on
 * this node. SIGTERM's drain lets a running attempt go on until
 * drain_timeout_secs, then releases it. A job cancelled everywhere stops
 * its attempts; one that is over can be forgotten.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fsutil.h"
#include "jobs.h"
#include "json.h"
#include "manifest.h"
#include "runner.h"
#include "sched.h"
#include "testbed.h"
#include "testutil.h"
#include "util.h"

#define DEADLINE 10.0 /* seconds any single wait may take */

static struct job *J;
static bool engine_up;

static void
start(void)
{
    struct esd_err err;

    ck_assert_msg(engine_init(tb.loop, &tb.conf, -1, &err) == 0, "engine_init: %s", err.msg);
    engine_up = true;
}

static void
stop(void)
{
    engine_fini();
    engine_up = false;
}

static bool
idle(void *arg)
{
    (void)arg;
    return runner_count() == 0;
}

static void
setup(void)
{
    tb_setup();
    J = NULL;
    start();
}

static void
teardown(void)
{
    if (engine_up) {
        /* (what still runs is stopped and waited for: nothing outlives the test) */
        runner_stop_all();
        ck_assert_msg(tb_run_until(idle, NULL, DEADLINE), "attempts outlive the test");
        stop();
    }
    tb_teardown();
}

static bool
job_in(void *arg)
{
    return J && J->state == *(enum job_state *)arg;
}

static void
wait_state(enum job_state st)
{
    ck_assert_msg(tb_run_until(job_in, &st, DEADLINE), "job %s, expected %s (error: %s)",
                  job_state_name[J->state], job_state_name[st], J->error ? J->error : "none");
}

static bool
busy(void *arg)
{
    (void)arg;
    return runner_busy() == 1;
}

static bool
streak(void *arg)
{
    return J->fail_streak >= *(unsigned *)arg;
}

static void
submit(void)
{
    J = tb_register();
    sched_kick();
}

/* Turns of the loop enough for a kick (a 0 s timer) to have run. */
static void
turn(void)
{
    for (int k = 0; k < 3; k++)
        ev_run(tb.loop, EVRUN_NOWAIT);
}

static long long
status_int(const char *key)
{
    cJSON *o = sched_status_json();
    long long v = -1;

    ck_assert_int_eq(json_get_int(o, key, &v), 0);
    cJSON_Delete(o);
    return v;
}

static char *
status_state(void)
{
    cJSON *o = sched_status_json();
    char *s = xstrdup(json_get_str(o, "state"));

    cJSON_Delete(o);
    return s;
}

static bool
state_file(const char *kind, size_t i)
{
    char *path = manifest_state_path(&tb.m, kind, tb.m.shards[i].id, ".json");
    bool there = tu_exists(path);

    free(path);
    return there;
}

/* The job's output holds every row in shard order. */
static void
expect_merged_at(const char *output)
{
    char *merged = tu_read(output, NULL);

    ck_assert_msg(merged, "no merged output %s", output);
    ck_assert_str_eq(merged, "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"text\":\"c\"}\n"
                             "{\"text\":\"d\"}\n{\"text\":\"e\"}\n");
    free(merged);
}

static void
expect_merged(void)
{
    expect_merged_at(J->output);
}

/* (the default output, of a job no longer registered) */
static void
expect_merged_dir(void)
{
    char *out = fs_join(tb.job_dir, "merged.jsonl");

    expect_merged_at(out);
    free(out);
}

START_TEST(test_job_completes)
{
    submit();
    wait_state(JOB_COMPLETE);
    ck_assert_uint_eq(J->done_here, 3);
    ck_assert_uint_eq(J->failed_here, 0);
    ck_assert_uint_eq(J->rows_here, 5);
    ck_assert_int_eq(status_int("claims"), 3);
    for (size_t i = 0; i < 3; i++)
        ck_assert(state_file("done", i));
    expect_merged();
}
END_TEST

START_TEST(test_all_done_merges_without_claims)
{
    for (size_t i = 0; i < tb.m.nshards; i++)
        tb_put_result(i);
    submit();
    wait_state(JOB_COMPLETE);
    ck_assert_int_eq(status_int("claims"), 0);
    expect_merged();
}
END_TEST

START_TEST(test_terminal_shard_fails_job)
{
    char *path = manifest_state_path(&tb.m, "failed", tb.m.shards[2].id, ".json"), *want;
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;

    json_add_str(o, "shard_id", tb.m.shards[2].id);
    json_add_str(o, "status", "failed");
    json_add_str(o, "last_error", "Data-Juicer returned exit code 1");
    ck_assert_msg(json_publish_excl(path, o, JSON_PRETTY, &err) == 0, "%s", err.msg);
    tu_put_done(&tb.m, 0);
    tu_put_done(&tb.m, 1);
    submit();
    wait_state(JOB_FAILED);
    want = xasprintf("shard %s failed: Data-Juicer returned exit code 1", tb.m.shards[2].id);
    ck_assert_str_eq(J->error ? J->error : "(none)", want);
    ck_assert_int_eq(status_int("claims"), 0);
    cJSON_Delete(o);
    free(want);
    free(path);
}
END_TEST

START_TEST(test_hold_and_resume)
{
    char *held = fs_join(tb.conf.state_dir, "drained"), *st;

    sched_hold(false);
    ck_assert(sched_held());
    ck_assert_msg(tu_exists(held), "no %s", held);
    submit();
    tb_load(J);
    sched_kick();
    turn();
    ck_assert_uint_eq(runner_count(), 0);
    ck_assert_int_eq(status_int("claims"), 0);
    st = status_state();
    ck_assert_str_eq(st, "drained");
    free(st);
    /* kept across a restart */
    stop();
    start();
    ck_assert(sched_held());
    J = jobs_find(tb.job_dir);
    ck_assert_ptr_nonnull(J);
    /* resumed: claims again, the mark gone */
    sched_resume();
    ck_assert(!sched_held());
    ck_assert_msg(!tu_exists(held), "%s stayed", held);
    wait_state(JOB_COMPLETE);
    ck_assert_int_eq(status_int("claims"), 3);
    free(held);
}
END_TEST

START_TEST(test_hold_release_stops_attempts)
{
    tb_processor("exec sleep 30");
    submit();
    ck_assert_msg(tb_run_until(busy, NULL, DEADLINE), "no attempt started");
    sched_hold(true);
    ck_assert_msg(tb_run_until(idle, NULL, DEADLINE), "the attempt was not stopped");
    ck_assert_uint_eq(J->failed_here, 0);
    ck_assert_uint_eq(J->fail_streak, 0);
    ck_assert_int_eq(J->state, JOB_ACTIVE);
    for (size_t i = 0; i < 3; i++)
        ck_assert(!state_file("done", i) && !state_file("failed", i));
    /* and no new claim while held */
    sched_kick();
    turn();
    ck_assert_uint_eq(runner_count(), 0);
    ck_assert_int_eq(status_int("claims"), 1);
}
END_TEST

/* The pause as it runs: a claim made while one was in force. A claim seen
 * after a turn of the loop was made before the check, so it came in a
 * pause if the pause known before that turn (pauses only grow) still
 * holds. */
struct pause_watch {
    long long claims;
    double until; /* the pause known before the last turn */
    bool early;   /* a claim came while paused */
};

static bool
pause_over(void *arg)
{
    struct pause_watch *w = arg;
    long long claims = status_int("claims");
    double now = time_mono();

    if (claims > w->claims && now < w->until)
        w->early = true;
    w->claims = claims;
    w->until = J->paused_until;
    return w->early || now >= J->paused_until;
}

static bool
claimed_more(void *arg)
{
    return status_int("claims") > *(long long *)arg;
}

/* Three failures in a row pause the node's claims of the job. The slot of
 * an attempt is free when its processor exits, before its failure is
 * recorded, so an attempt claimed in between may still be running: the
 * test asserts that no claim comes while paused, and that claims resume
 * after. */
START_TEST(test_failures_pause_claims)
{
    unsigned three = 3;
    struct pause_watch w = { 0 };
    double now;

    tb_processor("exit 1");
    submit();
    ck_assert_msg(tb_run_until(streak, &three, DEADLINE), "%u failures in a row, expected 3",
                  J->fail_streak);
    now = time_mono();
    ck_assert_uint_ge(J->failed_here, 3);
    /* paused: the first pause is 1 s, from the third failure on */
    ck_assert_msg(J->paused_until > now && J->paused_until <= now + 1.0,
                  "paused until %.3f, now %.3f", J->paused_until, now);
    ck_assert_int_eq(J->state, JOB_ACTIVE);
    w.claims = status_int("claims");
    w.until = J->paused_until;
    ck_assert_msg(tb_run_until(pause_over, &w, DEADLINE), "the pause did not end");
    ck_assert_msg(!w.early, "a claim came while the job was paused");
    ck_assert_msg(tb_run_until(claimed_more, &w.claims, DEADLINE), "no claim after the pause");
}
END_TEST

/* esctl cancel --everywhere: the marker every node's rescan sees; the
 * running attempt is stopped and released. */
START_TEST(test_cancel_everywhere_stops)
{
    struct esd_err err;

    tb_processor("exec sleep 30");
    submit();
    ck_assert_msg(tb_run_until(busy, NULL, DEADLINE), "no attempt started");
    ck_assert_msg(jobs_cancel_everywhere(tb.job_dir, getuid(), getgid(), getuid(), &err) == 0, "%s",
                  err.msg);
    ck_assert(jobs_cancelled_everywhere(J));
    sched_check_cancelled();
    ck_assert_int_eq(J->state, JOB_CANCELLED);
    ck_assert_msg(tb_run_until(idle, NULL, DEADLINE), "the attempt was not stopped");
    ck_assert_uint_eq(J->failed_here, 0);
    ck_assert_int_eq(J->state, JOB_CANCELLED);
    ck_assert(jobs_forgettable(J));
}
END_TEST

/* A job that is over leaves this node (esctl forget): its registry file
 * goes, and a restart does not bring it back. */
START_TEST(test_forget_complete_job)
{
    char *reg;

    submit();
    ck_assert(!jobs_forgettable(J));
    wait_state(JOB_COMPLETE);
    ck_assert(jobs_forgettable(J));
    reg = xstrdup(J->reg_path);
    ck_assert(tu_exists(reg));
    jobs_forget(J, FORGET_HERE, "forgotten by the test");
    J = NULL;
    ck_assert_uint_eq(jobs_count(), 0);
    ck_assert_ptr_null(jobs_find(tb.job_dir));
    ck_assert_msg(!tu_exists(reg), "%s stayed", reg);
    stop();
    start();
    ck_assert_uint_eq(jobs_count(), 0);
    /* (the job directory itself is left as it was) */
    expect_merged_dir();
    free(reg);
}
END_TEST

static int drained_calls;

static void
on_drained(void)
{
    drained_calls++;
}

static bool
drained(void *arg)
{
    (void)arg;
    return drained_calls > 0;
}

START_TEST(test_drain_releases_after_timeout)
{
    char *st;

    drained_calls = 0;
    tb.conf.drain_timeout_secs = 1;
    tb_processor("exec sleep 30");
    submit();
    ck_assert_msg(tb_run_until(busy, NULL, DEADLINE), "no attempt started");
    sched_drain(on_drained);
    ck_assert_int_eq(drained_calls, 0); /* (the attempt may finish first) */
    st = status_state();
    ck_assert_str_eq(st, "draining");
    free(st);
    ck_assert_msg(tb_run_until(drained, NULL, DEADLINE), "not drained");
    ck_assert_int_eq(drained_calls, 1);
    ck_assert_uint_eq(runner_count(), 0);
    ck_assert_uint_eq(J->failed_here, 0);
    ck_assert_int_eq(status_int("claims"), 1);
}
END_TEST

static Suite *
sched_suite(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("engine");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_job_completes);
    tcase_add_test(tc, test_all_done_merges_without_claims);
    tcase_add_test(tc, test_terminal_shard_fails_job);
    tcase_add_test(tc, test_hold_and_resume);
    tcase_add_test(tc, test_hold_release_stops_attempts);
    tcase_add_test(tc, test_failures_pause_claims);
    tcase_add_test(tc, test_drain_releases_after_timeout);
    tcase_add_test(tc, test_cancel_everywhere_stops);
    tcase_add_test(tc, test_forget_complete_job);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(sched_suite());
}
