/*
 * check_status: shard states as spec §9 computes them from the job directory
 * alone: done record, then failed record, then lock (running, or stale by
 * its mtime against the timeout or by the lease it records), else pending;
 * unreadable metadata flagged without changing the state; stray names in
 * the state directories ignored; the complete/terminal flags; and the
 * field names of status --json (spec §5.9). Every fixture is a real job
 * made by prepare_run, with records and locks written here in C.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "prepare.h"
#include "status.h"
#include "testutil.h"
#include "util.h"

/* The job of every test: 5 records in two files, 3 shards of 2, 2, 1 rows. */
static char *tmp;
static struct manifest M;

static void
job_setup(void)
{
    tmp = tu_tmpdir();
    tu_job(tmp, &M);
}

static void
job_teardown(void)
{
    fs_rm_rf(tmp);
    manifest_free(&M);
    free(tmp);
}

static const char *
id(size_t i)
{
    return M.shards[i].id;
}

/* Writes state/<kind>/<id of shard i><suffix> with raw content. */
static void
put_raw(const char *kind, size_t i, const char *suffix, const char *content)
{
    char *path = manifest_state_path(&M, kind, id(i), suffix);
    struct esd_err err;

    ck_assert_msg(fs_write_atomic(path, content, strlen(content), 0644, &err) == 0, "%s", err.msg);
    free(path);
}

/* Publishes a done record owned by host (NULL: no hostname field). */
static void
put_done(size_t i, const char *host)
{
    char *path = manifest_state_path(&M, "done", id(i), ".json");
    char *out = xasprintf("attempts/%s/0001-x/processed.jsonl", id(i));
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;

    json_add_str(j, "shard_id", id(i));
    json_add_str(j, "status", "done");
    if (host)
        json_add_str(j, "hostname", host);
    json_add_str(j, "output_path", out);
    json_add_int(j, "rows", M.shards[i].rows);
    json_add_str(j, "sha256", M.shards[i].sha256);
    ck_assert_msg(json_publish_excl(path, j, JSON_PRETTY, &err) == 0, "%s", err.msg);
    cJSON_Delete(j);
    free(out);
    free(path);
}

/* Publishes a failed record; error NULL gives the "retry limit reached
 * before claim" form, which has no last_error. */
static void
put_failed(size_t i, const char *error)
{
    char *path = manifest_state_path(&M, "failed", id(i), ".json");
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;

    json_add_str(j, "shard_id", id(i));
    json_add_str(j, "status", "failed");
    json_add_int(j, "failures", 4);
    if (error)
        json_add_str(j, "last_error", error);
    else
        json_add_str(j, "reason", "retry limit reached before claim");
    ck_assert_msg(json_publish_excl(path, j, JSON_PRETTY, &err) == 0, "%s", err.msg);
    cJSON_Delete(j);
    free(path);
}

/* Sets path's mtime age seconds in the past (negative: in the future). */
static void
set_age(const char *path, double age)
{
    struct timespec ts[2];

    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= (time_t)age;
    ts[1] = ts[0];
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* Creates a claim file (one line of JSON, O_EXCL); lease <= 0: none. */
static void
put_lock(size_t i, const char *host, long long pid, long long lease, double age)
{
    char *path = manifest_state_path(&M, "locks", id(i), ".lock");
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;
    struct buf b;

    json_add_str(j, "shard_id", id(i));
    json_add_str(j, "token", "0123456789abcdef0123456789abcdef");
    json_add_str(j, "hostname", host);
    json_add_int(j, "pid", pid);
    json_add_int(j, "attempt_number", 1);
    if (lease > 0)
        json_add_int(j, "lease_secs", lease);
    buf_init(&b);
    json_dump(j, JSON_LINE, &b);
    ck_assert_msg(fs_create_excl(path, b.p, b.len, 0644, NULL, &err) == 0, "%s", err.msg);
    set_age(path, age);
    buf_free(&b);
    cJSON_Delete(j);
    free(path);
}

static struct job_status
compute(long long timeout, bool details)
{
    struct job_status st;
    struct esd_err err;

    ck_assert_msg(status_compute(&M, timeout, details, &st, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(st.total, 3);
    return st;
}

static char *
counts_text(const struct job_status *st)
{
    struct buf b;

    buf_init(&b);
    status_counts_text(st, &b);
    return buf_steal(&b);
}

START_TEST(test_fresh_job_is_pending)
{
    struct job_status st = compute(0, true);
    char *txt = counts_text(&st);

    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_eq(st.shards[i].state, ST_PENDING);
        ck_assert_ptr_null(st.shards[i].owner);
        ck_assert(!st.shards[i].has_pid && !st.shards[i].has_age);
        ck_assert(!st.shards[i].metadata_error);
    }
    ck_assert_uint_eq(st.counts[ST_PENDING], 3);
    ck_assert(!st.complete && !st.terminal);
    ck_assert_str_eq(txt, "pending=3 running=0 stale=0 done=0 failed=0");
    free(txt);
    status_free(&st);
}
END_TEST

START_TEST(test_states_and_details)
{
    struct job_status st;
    char *txt;

    put_done(0, "node-a");
    put_failed(1, "Data-Juicer returned exit code 1");
    put_lock(2, "node-b", 4242, 0, 60);
    st = compute(0, true);
    ck_assert_int_eq(st.shards[0].state, ST_DONE);
    ck_assert_str_eq(st.shards[0].owner, "node-a");
    ck_assert(!st.shards[0].has_pid && !st.shards[0].has_age);
    ck_assert_int_eq(st.shards[1].state, ST_FAILED);
    ck_assert_str_eq(st.shards[1].error, "Data-Juicer returned exit code 1");
    ck_assert_ptr_null(st.shards[1].owner);
    ck_assert_int_eq(st.shards[2].state, ST_RUNNING);
    ck_assert_str_eq(st.shards[2].owner, "node-b");
    ck_assert(st.shards[2].has_pid);
    ck_assert_int_eq(st.shards[2].pid, 4242);
    ck_assert(st.shards[2].has_age);
    ck_assert_msg(st.shards[2].lock_age >= 59.0 && st.shards[2].lock_age < 120.0, "lock age %f",
                  st.shards[2].lock_age);
    txt = counts_text(&st);
    ck_assert_str_eq(txt, "pending=0 running=1 stale=0 done=1 failed=1");
    ck_assert(!st.complete && !st.terminal);
    free(txt);
    status_free(&st);
}
END_TEST

START_TEST(test_without_details_reads_no_records)
{
    struct job_status st;

    put_done(0, "node-a");
    put_failed(1, "boom");
    put_lock(2, "node-b", 7, 0, 60);
    st = compute(0, false);
    ck_assert_int_eq(st.shards[0].state, ST_DONE);
    ck_assert_ptr_null(st.shards[0].owner);
    ck_assert_int_eq(st.shards[1].state, ST_FAILED);
    ck_assert_ptr_null(st.shards[1].error);
    /* The lock's age decides running or stale, so it is still read. */
    ck_assert_int_eq(st.shards[2].state, ST_RUNNING);
    ck_assert(st.shards[2].has_age);
    status_free(&st);
}
END_TEST

START_TEST(test_stale_by_mtime)
{
    struct job_status st;

    /* The manifest's timeout is the default 126000 s. */
    put_lock(0, "old", 1, 0, POLICY_LOCK_TIMEOUT_DEFAULT + 100);
    put_lock(1, "young", 2, 0, POLICY_LOCK_TIMEOUT_DEFAULT - 100);
    put_lock(2, "mid", 3, 0, 7200);
    st = compute(0, true);
    ck_assert_int_eq(st.shards[0].state, ST_STALE);
    ck_assert_str_eq(st.shards[0].owner, "old");
    ck_assert(st.shards[0].lock_age > POLICY_LOCK_TIMEOUT_DEFAULT);
    ck_assert_int_eq(st.shards[1].state, ST_RUNNING);
    ck_assert_int_eq(st.shards[2].state, ST_RUNNING);
    ck_assert_uint_eq(st.counts[ST_STALE], 1);
    ck_assert_uint_eq(st.counts[ST_RUNNING], 2);
    status_free(&st);

    /* An explicit timeout replaces the manifest's. */
    st = compute(3600, true);
    ck_assert_int_eq(st.shards[0].state, ST_STALE);
    ck_assert_int_eq(st.shards[1].state, ST_STALE);
    ck_assert_int_eq(st.shards[2].state, ST_STALE);
    ck_assert(!st.terminal);
    status_free(&st);
}
END_TEST

START_TEST(test_stale_by_lease)
{
    struct job_status st;

    put_lock(0, "short-lease", 1, 30, 60);
    put_lock(1, "long-lease", 2, 300, 60);
    put_lock(2, "no-lease", 3, 0, 60);
    st = compute(0, true);
    ck_assert_int_eq(st.shards[0].state, ST_STALE);
    ck_assert_int_eq(st.shards[1].state, ST_RUNNING);
    ck_assert_int_eq(st.shards[2].state, ST_RUNNING);
    status_free(&st);

    /* The lease wins over the timeout too. */
    st = compute(10, true);
    ck_assert_int_eq(st.shards[0].state, ST_STALE);
    ck_assert_int_eq(st.shards[1].state, ST_RUNNING);
    ck_assert_int_eq(st.shards[2].state, ST_STALE);
    status_free(&st);
}
END_TEST

START_TEST(test_future_mtime_age_is_zero)
{
    struct job_status st;

    put_lock(0, "skewed", 1, 0, -1000);
    st = compute(0, true);
    ck_assert_int_eq(st.shards[0].state, ST_RUNNING);
    ck_assert(st.shards[0].has_age);
    ck_assert(st.shards[0].lock_age == 0.0);
    status_free(&st);
}
END_TEST

START_TEST(test_first_match_wins)
{
    struct job_status st;

    /* done beats failed and a lock; failed beats a lock. */
    put_done(0, "winner");
    put_failed(0, "older failure");
    put_lock(0, "leftover", 1, 0, POLICY_LOCK_TIMEOUT_DEFAULT + 1);
    put_failed(1, "failure");
    put_lock(1, "leftover", 2, 0, 5);
    st = compute(0, true);
    ck_assert_int_eq(st.shards[0].state, ST_DONE);
    ck_assert_str_eq(st.shards[0].owner, "winner");
    ck_assert(!st.shards[0].has_age);
    ck_assert_int_eq(st.shards[1].state, ST_FAILED);
    ck_assert_str_eq(st.shards[1].error, "failure");
    ck_assert_int_eq(st.shards[2].state, ST_PENDING);
    status_free(&st);
}
END_TEST

START_TEST(test_metadata_error_keeps_state)
{
    struct job_status st;

    put_raw("done", 0, ".json", "{\"hostname\": \"half-writ");
    put_raw("failed", 1, ".json", "[\"not\", \"an object\"]\n");
    /* An O_EXCL claim file is briefly empty before its content is written. */
    put_raw("locks", 2, ".lock", "");
    st = compute(0, true);
    ck_assert_int_eq(st.shards[0].state, ST_DONE);
    ck_assert(st.shards[0].metadata_error);
    ck_assert_ptr_null(st.shards[0].owner);
    ck_assert_int_eq(st.shards[1].state, ST_FAILED);
    ck_assert(st.shards[1].metadata_error);
    ck_assert_ptr_null(st.shards[1].error);
    ck_assert_int_eq(st.shards[2].state, ST_RUNNING);
    ck_assert(st.shards[2].metadata_error);
    ck_assert(st.shards[2].has_age);
    ck_assert(!st.shards[2].has_pid);
    ck_assert_uint_eq(st.counts[ST_DONE], 1);
    ck_assert_uint_eq(st.counts[ST_FAILED], 1);
    ck_assert_uint_eq(st.counts[ST_RUNNING], 1);
    status_free(&st);
}
END_TEST

START_TEST(test_stray_names_ignored)
{
    struct job_status st;
    char *rel;

    /* A publication in progress, a shard of another job, wrong suffixes. */
    rel = xasprintf("state/done/.%s.json.0123456789abcdef0123456789abcdef.tmp", id(0));
    free(tu_write(M.job_dir, rel, "{}", (size_t)-1));
    free(rel);
    free(tu_write(M.job_dir, "state/done/part-00009-of-00010.json", "{}", (size_t)-1));
    put_raw("done", 1, ".lock", "{}");
    put_raw("locks", 2, ".json", "{}");
    put_raw("failed", 2, ".json.bak", "{}");
    st = compute(0, true);
    for (size_t i = 0; i < 3; i++)
        ck_assert_int_eq(st.shards[i].state, ST_PENDING);
    status_free(&st);
}
END_TEST

START_TEST(test_missing_state_dirs)
{
    struct job_status st;
    char *dir = fs_join(M.job_dir, "state");

    fs_rm_rf(dir);
    st = compute(0, true);
    ck_assert_uint_eq(st.counts[ST_PENDING], 3);
    status_free(&st);
    free(dir);
}
END_TEST

START_TEST(test_unreadable_state_dir_is_error)
{
    struct job_status st;
    struct esd_err err;
    char *dir = fs_join(M.job_dir, "state/done");

    /* A file where the directory should be: not ENOENT, so an error. */
    fs_rm_rf(dir);
    free(tu_write(M.job_dir, "state/done", "x", (size_t)-1));
    ck_assert_int_lt(status_compute(&M, 0, true, &st, &err), 0);
    ck_assert_msg(strstr(err.msg, "state/done") != NULL, "%s", err.msg);
    free(dir);
}
END_TEST

START_TEST(test_complete_and_terminal)
{
    struct job_status st;

    put_done(0, "a");
    put_done(1, "b");
    put_failed(2, "boom");
    st = compute(0, false);
    ck_assert(!st.complete);
    ck_assert(st.terminal);
    status_free(&st);

    put_done(2, "c");
    st = compute(0, false);
    ck_assert(st.complete);
    ck_assert(st.terminal);
    ck_assert_uint_eq(st.counts[ST_DONE], 3);
    status_free(&st);
}
END_TEST

START_TEST(test_stale_is_not_terminal)
{
    struct job_status st;

    put_done(0, "a");
    put_failed(1, "boom");
    put_lock(2, "gone", 1, 0, POLICY_LOCK_TIMEOUT_DEFAULT + 1);
    st = compute(0, false);
    ck_assert_int_eq(st.shards[2].state, ST_STALE);
    ck_assert(!st.complete && !st.terminal);
    status_free(&st);
}
END_TEST

/* status_json serialised and parsed back, so raw number nodes count too. */
static cJSON *
json_roundtrip(const struct job_status *st)
{
    cJSON *j = status_json(&M, st), *back;
    struct buf b;

    buf_init(&b);
    json_dump(j, JSON_COMPACT, &b);
    back = cJSON_Parse(b.p);
    ck_assert_msg(back != NULL, "status_json is not JSON: %s", b.p);
    buf_free(&b);
    cJSON_Delete(j);
    return back;
}

static void
assert_keys(const cJSON *o, const char *const *keys)
{
    int n = 0;

    for (; keys[n]; n++)
        ck_assert_msg(cJSON_GetObjectItemCaseSensitive(o, keys[n]) != NULL, "missing key %s",
                      keys[n]);
    ck_assert_int_eq(cJSON_GetArraySize(o), n);
}

START_TEST(test_status_json_fields)
{
    static const char *const top[] = { "complete", "counts",   "execution", "job_dir", "job_id",
                                       "shards",   "terminal", "total",     NULL };
    static const char *const counts[] = { "done", "failed", "pending", "running", "stale", NULL };
    static const char *const done[] = { "owner", "rows", "shard_id", "status", NULL };
    static const char *const failed[] = { "error", "rows", "shard_id", "status", NULL };
    static const char *const running[] = { "lock_age_secs", "owner",  "pid", "rows",
                                           "shard_id",      "status", NULL };
    struct job_status st;
    cJSON *j, *c, *sh, *x;

    put_done(0, "node-a");
    put_failed(1, "Data-Juicer returned exit code 1");
    put_lock(2, "node-b", 99, 0, 30);
    st = compute(0, true);
    j = json_roundtrip(&st);
    assert_keys(j, top);
    ck_assert_str_eq(json_get_str(j, "job_id"), "job");
    ck_assert_str_eq(json_get_str(j, "job_dir"), M.job_dir);
    x = cJSON_GetObjectItemCaseSensitive(j, "execution");
    ck_assert_str_eq(json_get_str(x, "executor_type"), "ray");
    ck_assert_str_eq(json_get_str(x, "ray_address"), "local");
    ck_assert_str_eq(json_get_str(x, "recipe_executor_type"), "default");
    ck_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "total")));
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "total")->valueint, 3);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "complete")));
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "terminal")));
    c = cJSON_GetObjectItemCaseSensitive(j, "counts");
    assert_keys(c, counts);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(c, "done")->valueint, 1);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(c, "failed")->valueint, 1);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(c, "running")->valueint, 1);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(c, "pending")->valueint, 0);
    sh = cJSON_GetObjectItemCaseSensitive(j, "shards");
    ck_assert_int_eq(cJSON_GetArraySize(sh), 3);

    x = cJSON_GetArrayItem(sh, 0);
    assert_keys(x, done);
    ck_assert_str_eq(json_get_str(x, "shard_id"), id(0));
    ck_assert_str_eq(json_get_str(x, "status"), "done");
    ck_assert_str_eq(json_get_str(x, "owner"), "node-a");
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(x, "rows")->valueint, 2);

    x = cJSON_GetArrayItem(sh, 1);
    assert_keys(x, failed);
    ck_assert_str_eq(json_get_str(x, "status"), "failed");
    ck_assert_str_eq(json_get_str(x, "error"), "Data-Juicer returned exit code 1");

    x = cJSON_GetArrayItem(sh, 2);
    assert_keys(x, running);
    ck_assert_str_eq(json_get_str(x, "status"), "running");
    ck_assert_str_eq(json_get_str(x, "owner"), "node-b");
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(x, "pid")->valueint, 99);
    ck_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(x, "lock_age_secs")));
    ck_assert(cJSON_GetObjectItemCaseSensitive(x, "lock_age_secs")->valuedouble >= 29.0);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(x, "rows")->valueint, 1);
    cJSON_Delete(j);
    status_free(&st);
}
END_TEST

/* As the reference: owner and pid are shown whenever the record parses,
 * null when missing and as written when odd. */
START_TEST(test_status_json_owner_and_pid_as_written)
{
    struct job_status st;
    cJSON *j, *sh, *x;

    put_raw("done", 0, ".json", "{\"status\": \"done\", \"rows\": 2}\n");
    put_raw("locks", 1, ".lock", "{\"pid\": \"x\", \"token\": \"t\"}\n");
    put_raw("locks", 2, ".lock", "{\"hostname\": \"h\"}\n");
    st = compute(0, true);
    j = json_roundtrip(&st);
    sh = cJSON_GetObjectItemCaseSensitive(j, "shards");
    x = cJSON_GetArrayItem(sh, 0);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(x, "owner")));
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(x, "pid"));
    x = cJSON_GetArrayItem(sh, 1);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(x, "owner")));
    ck_assert_str_eq(json_get_str(x, "pid"), "x");
    x = cJSON_GetArrayItem(sh, 2);
    ck_assert_str_eq(json_get_str(x, "owner"), "h");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(x, "pid")));
    /* the typed views stay empty */
    ck_assert_ptr_null(st.shards[0].owner);
    ck_assert(!st.shards[1].has_pid);
    cJSON_Delete(j);
    status_free(&st);
}
END_TEST

START_TEST(test_status_json_pending_null_error_and_metadata_error)
{
    static const char *const pending[] = { "rows", "shard_id", "status", NULL };
    static const char *const failed[] = { "error", "rows", "shard_id", "status", NULL };
    static const char *const broken[] = { "metadata_error", "rows", "shard_id", "status", NULL };
    struct job_status st;
    cJSON *j, *sh, *x;

    put_raw("done", 0, ".json", "{\"hostname\": \"h\", \"rows\": ");
    put_failed(1, NULL);
    st = compute(0, true);
    j = json_roundtrip(&st);
    sh = cJSON_GetObjectItemCaseSensitive(j, "shards");

    x = cJSON_GetArrayItem(sh, 0);
    assert_keys(x, broken);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "metadata_error")));

    /* The "retry limit reached before claim" form: error is null. */
    x = cJSON_GetArrayItem(sh, 1);
    assert_keys(x, failed);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(x, "error")));

    x = cJSON_GetArrayItem(sh, 2);
    assert_keys(x, pending);
    ck_assert_str_eq(json_get_str(x, "status"), "pending");
    cJSON_Delete(j);
    status_free(&st);
}
END_TEST

START_TEST(test_status_json_complete)
{
    struct job_status st;
    cJSON *j;

    put_done(0, "a");
    put_done(1, "a");
    put_done(2, "b");
    st = compute(0, true);
    j = json_roundtrip(&st);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "complete")));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "terminal")));
    cJSON_Delete(j);
    status_free(&st);
}
END_TEST

START_TEST(test_job_id_defaults_to_dir_name)
{
    struct manifest m2;
    struct job_status st;
    struct esd_err err;
    char *path = fs_join(M.job_dir, "manifest.json"), *dir = xstrdup(M.job_dir);
    cJSON *j = NULL, *sj;

    /* A manifest without job_id: the job directory's name stands in, and
     * must outlive the caller's copy of that path. */
    ck_assert_int_eq(json_load_object(path, 1 << 20, &j, &err), 0);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "job_id");
    ck_assert_int_eq(json_write_atomic(path, j, JSON_PRETTY, &err), 0);
    ck_assert_msg(manifest_load(dir, &m2, &err) == 0, "%s", err.msg);
    memset(dir, 'X', strlen(dir));
    free(dir);
    ck_assert_str_eq(m2.job_id, "job");
    ck_assert_int_eq(status_compute(&m2, 0, true, &st, &err), 0);
    sj = status_json(&m2, &st);
    ck_assert_str_eq(json_get_str(sj, "job_id"), "job");
    cJSON_Delete(sj);
    status_free(&st);
    manifest_free(&m2);
    cJSON_Delete(j);
    free(path);
}
END_TEST

/* ---- views ---- */

/* Runs a reading of V to its end in steps of budget; returns the steps. */
static int
view_read(struct status_view *v, size_t budget)
{
    struct esd_err err;
    int r, steps = 0;

    while ((r = status_view_step(v, &M, 0, budget, &err)) == 0)
        steps++;
    ck_assert_msg(r == 1, "%s", err.msg);
    return steps + 1;
}

/* A done record with esd's fields: node, completed_at, duration_secs. */
static void
put_done_timed(size_t i, const char *node, const char *at, double secs)
{
    char *text = xasprintf("{\"shard_id\": \"%s\", \"status\": \"done\", \"hostname\": \"h\", "
                           "\"node\": \"%s\", \"completed_at\": \"%s\", \"duration_secs\": %g}",
                           id(i), node, at, secs);

    put_raw("done", i, ".json", text);
    free(text);
}

START_TEST(test_view_counts_match_status_compute)
{
    struct status_view v;
    struct job_status st;

    put_done(0, "a");
    put_failed(1, "boom");
    put_lock(2, "c", 7, 60, 1);
    status_view_init(&v, &M);
    ck_assert(!v.valid);
    /* a budget of 1: many steps, the same result */
    ck_assert_int_gt(view_read(&v, 1), 3);
    st = compute(0, false);
    ck_assert(v.valid);
    for (int k = 0; k < ST__COUNT; k++)
        ck_assert_uint_eq(v.counts[k], st.counts[k]);
    ck_assert_uint_eq(v.counts[ST_RUNNING], 1);
    ck_assert_int_eq(v.rows_done, M.shards[0].rows);
    ck_assert_uint_eq(v.ndetails, 2); /* the failure and the lock */
    ck_assert_str_eq(v.details[0].error, "boom");
    ck_assert_int_eq(v.details[1].pid, 7);
    status_free(&st);
    status_view_free(&v);
}
END_TEST

START_TEST(test_view_reads_done_records_once)
{
    struct status_view v;

    put_done_timed(0, "n1", "2026-12-01T10:00:10.000000+00:00", 10);
    status_view_init(&v, &M);
    view_read(&v, 1000);
    ck_assert_uint_eq(v.summarised, 1);
    ck_assert_uint_eq(v.nnodes, 1);
    ck_assert_uint_eq(v.nodes[0].done, 1);
    /* a record that changed under the same name is not read again (done
     * records are terminal), a new one is */
    put_raw("done", 0, ".json", "not json");
    put_done_timed(1, "n2", "2026-12-01T10:00:30Z", 10);
    view_read(&v, 1000);
    ck_assert_uint_eq(v.summarised, 2);
    ck_assert_uint_eq(v.unreadable, 0);
    ck_assert_uint_eq(v.counts[ST_DONE], 2);
    ck_assert_uint_eq(v.nnodes, 2);
    /* the span: from 10:00:00 (the first start) to 10:00:30 */
    ck_assert(v.first_start + 30 == v.last_end);
    status_view_free(&v);
}
END_TEST

START_TEST(test_view_pace_from_durations)
{
    struct status_view v;
    double rate, eta;

    status_view_init(&v, &M);
    view_read(&v, 1000);
    status_view_pace(&v, &rate, &eta);
    ck_assert(rate < 0 && eta < 0); /* nothing done: unknown */
    /* one shard done in 100 s, one running: 1/100 shards a second, two
     * shards left (the running one and the pending one) */
    put_done_timed(0, "n1", "2026-12-01T10:00:00Z", 100);
    put_lock(1, "h", 1, 60, 0);
    view_read(&v, 1000);
    status_view_pace(&v, &rate, &eta);
    ck_assert_double_eq_tol(rate, 0.01, 1e-9);
    ck_assert_double_eq_tol(eta, 200, 1e-6);
    status_view_free(&v);
}
END_TEST

START_TEST(test_view_keeps_last_reading_while_reading)
{
    struct status_view v;
    struct esd_err err;

    put_done(0, "a");
    status_view_init(&v, &M);
    view_read(&v, 1000);
    put_done(1, "a");
    /* a reading in progress does not change what is shown */
    ck_assert_int_eq(status_view_step(&v, &M, 0, 1, &err), 0);
    ck_assert_uint_eq(v.counts[ST_DONE], 1);
    view_read(&v, 1000);
    ck_assert_uint_eq(v.counts[ST_DONE], 2);
    status_view_free(&v);
}
END_TEST

START_TEST(test_view_refuses_another_directory)
{
    struct status_view v;
    struct esd_err err;

    status_view_init(&v, &M);
    v.ino = 1; /* not the job directory's */
    ck_assert_int_eq(status_view_step(&v, &M, 0, 1000, &err), -ESTALE);
    ck_assert(!v.valid);
    status_view_free(&v);
}
END_TEST

START_TEST(test_view_json_bounded_and_dated)
{
    struct status_view v;
    cJSON *j, *all;
    long long n;

    put_done(0, "host-a");
    put_failed(1, "boom");
    status_view_init(&v, &M);
    view_read(&v, 1000);
    j = status_view_json(&v, &M, false);
    /* a job this small: every shard, even without all */
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "shards")), 3);
    ck_assert_str_eq(json_get_str(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "shards"), 1), "error"),
                     "boom");
    ck_assert_ptr_nonnull(json_get_str(j, "read_at"));
    ck_assert_ptr_nonnull(cJSON_GetObjectItem(j, "read_age_secs"));
    ck_assert_int_eq(json_get_int(cJSON_GetObjectItem(j, "counts"), "failed", &n), 0);
    ck_assert_int_eq(n, 1);
    all = status_view_json(&v, &M, true);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(all, "shards")), 3);
    /* a done shard's owner comes from its record, read once */
    ck_assert_str_eq(
        json_get_str(cJSON_GetArrayItem(cJSON_GetObjectItem(all, "shards"), 0), "owner"), "host-a");
    cJSON_Delete(j);
    cJSON_Delete(all);
    status_view_free(&v);
}
END_TEST

START_TEST(test_json_bound_keeps_attention_first)
{
    struct job_status st;
    cJSON *j;
    long long n;

    put_done(0, "a");
    put_failed(2, "boom");
    st = compute(0, true);
    j = status_json(&M, &st);
    status_json_bound(j, 1);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "shards")), 1);
    ck_assert_str_eq(
        json_get_str(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "shards"), 0), "status"), "failed");
    ck_assert_int_eq(json_get_int(j, "shards_omitted", &n), 0);
    ck_assert_int_eq(n, 2);
    cJSON_Delete(j);
    status_free(&st);
}
END_TEST

START_TEST(test_parse_time)
{
    ck_assert(status_parse_time("1970-01-01T00:01:00+00:00") == 60);
    ck_assert(status_parse_time("1970-01-01T01:00:00.5+01:00") == 0.5);
    ck_assert(status_parse_time("1970-01-01T00:00:02Z") == 2);
    ck_assert(status_parse_time("1970-01-01T00:00:02") == 2);
    ck_assert(status_parse_time("yesterday") < 0);
    ck_assert(status_parse_time("1970-13-01T00:00:02") < 0);
    ck_assert(status_parse_time("1970-01-01T00:00:02 junk") < 0);
    ck_assert(status_parse_time(NULL) < 0);
}
END_TEST

/* ---- the global stage (issue 17) ---- */

/* M made a job with a global stage (the fields manifest_load would set). */
static void
make_global(void)
{
    M.global_snapshot = "recipe.global.yaml";
    M.global_sha256 = "cc";
    M.global_executor = "default";
    M.global_ops_json = "[\"document_deduplicator\"]";
    M.global_shard_ops = 1;
}

static long long
gint(const cJSON *o, const char *key)
{
    double v = -1;

    json_get_num(o, key, &v);
    return (long long)v;
}

static void
put_job_file(const char *rel, const char *text)
{
    free(tu_write(M.job_dir, rel, text, (size_t)-1));
}

/* The status object of M now, and its "phase". */
static cJSON *
global_json(const char **ret_phase)
{
    struct job_status st = compute(0, true);
    cJSON *j = status_json(&M, &st);

    status_free(&st);
    *ret_phase = json_get_str(j, "phase");
    return j;
}

START_TEST(test_global_phases)
{
    const char *phase;
    const cJSON *g;
    cJSON *j;
    char *lock;
    struct job_status st;

    /* a job without a global stage: no new key */
    j = global_json(&phase);
    ck_assert_ptr_null(phase);
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "global"));
    cJSON_Delete(j);

    make_global();
    j = global_json(&phase);
    ck_assert_str_eq(phase, "shards");
    g = cJSON_GetObjectItemCaseSensitive(j, "global");
    ck_assert_str_eq(json_get_str(g, "shard_id"), "_global");
    ck_assert_str_eq(json_get_str(g, "status"), "pending");
    ck_assert_str_eq(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "operators"), 0)->valuestring,
        "document_deduplicator");
    ck_assert_str_eq(json_get_str(g, "executor_type"), "default");
    cJSON_Delete(j);

    for (size_t i = 0; i < 3; i++)
        put_done(i, "h");
    j = global_json(&phase);
    ck_assert_str_eq(phase, "merging");
    cJSON_Delete(j);

    put_job_file("state/esd/global/prefix.json",
                 "{\"status\": \"complete\", \"rows\": 5, \"sha256\": \"ab\", \"num_shards\": 3}");
    j = global_json(&phase);
    ck_assert_str_eq(phase, "global");
    g = cJSON_GetObjectItemCaseSensitive(j, "global");
    ck_assert_str_eq(json_get_str(g, "status"), "pending");
    ck_assert_int_eq(gint(g, "input_rows"), 5);
    cJSON_Delete(j);

    /* its lock, an attempt directory: running on node-b, then stale */
    put_job_file("state/locks/_global.lock",
                 "{\"shard_id\": \"_global\", \"hostname\": \"hb\", \"node\": \"node-b\", "
                 "\"pid\": 42, \"lease_secs\": 60}\n");
    tu_mkdir_at(M.job_dir, "attempts/_global/0002-0123456789abcdef0123456789abcdef");
    lock = fs_join(M.job_dir, "state/locks/_global.lock");
    set_age(lock, 30);
    j = global_json(&phase);
    ck_assert_str_eq(phase, "global");
    g = cJSON_GetObjectItemCaseSensitive(j, "global");
    ck_assert_str_eq(json_get_str(g, "status"), "running");
    ck_assert_str_eq(json_get_str(g, "owner"), "hb");
    ck_assert_str_eq(json_get_str(g, "node"), "node-b");
    ck_assert_int_eq(gint(g, "pid"), 42);
    ck_assert_int_eq(gint(g, "last_attempt"), 2);
    ck_assert(gint(g, "lock_age_secs") >= 29);
    cJSON_Delete(j);
    set_age(lock, 120);
    j = global_json(&phase);
    ck_assert_str_eq(json_get_str(cJSON_GetObjectItemCaseSensitive(j, "global"), "status"),
                     "stale");
    cJSON_Delete(j);
    /* the counts stay the manifest shards' */
    st = compute(0, false);
    ck_assert_uint_eq(st.counts[ST_DONE], 3);
    ck_assert_uint_eq(st.counts[ST_RUNNING] + st.counts[ST_STALE], 0);
    ck_assert_int_eq(st.global->phase, PHASE_GLOBAL);
    status_free(&st);

    /* done: the final merge, then complete with merge.json's stages */
    unlink(lock);
    put_job_file("state/done/_global.json",
                 "{\"shard_id\": \"_global\", \"status\": \"done\", \"hostname\": \"hb\", "
                 "\"rows\": 4, \"sha256\": \"cd\", \"duration_secs\": 180.5}");
    j = global_json(&phase);
    ck_assert_str_eq(phase, "final merge");
    g = cJSON_GetObjectItemCaseSensitive(j, "global");
    ck_assert_int_eq(gint(g, "rows"), 4);
    ck_assert_str_eq(json_get_str(g, "sha256"), "cd");
    cJSON_Delete(j);
    put_job_file("merge.json", "{\"rows\": 4, \"sha256\": \"cd\", \"stages\": {}}");
    j = global_json(&phase);
    ck_assert_str_eq(phase, "complete");
    cJSON_Delete(j);
    free(lock);
}
END_TEST

START_TEST(test_global_failed)
{
    const char *phase;
    cJSON *j;

    make_global();
    for (size_t i = 0; i < 3; i++)
        put_done(i, "h");
    put_job_file("state/esd/global/prefix.json", "{\"rows\": 5}");
    put_job_file("state/failed/_global.json",
                 "{\"shard_id\": \"_global\", \"status\": \"failed\", \"last_error\": \"oom\"}");
    j = global_json(&phase);
    ck_assert_str_eq(phase, "failed");
    ck_assert_str_eq(json_get_str(cJSON_GetObjectItemCaseSensitive(j, "global"), "error"), "oom");
    cJSON_Delete(j);
}
END_TEST

/* A daemon's view shows the same phase and "_global" state. */
START_TEST(test_global_view)
{
    struct status_view v;
    struct esd_err err;
    cJSON *j;
    int r;

    make_global();
    for (size_t i = 0; i < 3; i++)
        put_done(i, "h");
    put_job_file("state/esd/global/prefix.json", "{\"rows\": 5}");
    put_job_file("state/locks/_global.lock", "{\"hostname\": \"hb\", \"pid\": 7}\n");
    status_view_init(&v, &M);
    while ((r = status_view_step(&v, &M, 0, 1000, &err)) == 0)
        ;
    ck_assert_msg(r == 1, "%s", err.msg);
    j = status_view_json(&v, &M, false);
    ck_assert_str_eq(json_get_str(j, "phase"), "global");
    ck_assert_str_eq(json_get_str(cJSON_GetObjectItemCaseSensitive(j, "global"), "status"),
                     "running");
    ck_assert_int_eq(gint(j, "total"), 3);
    cJSON_Delete(j);
    status_view_free(&v);
}
END_TEST

static Suite *
status_suite(void)
{
    Suite *s = suite_create("status");
    TCase *tc = tcase_create("status");

    tcase_add_checked_fixture(tc, job_setup, job_teardown);
    tcase_add_test(tc, test_fresh_job_is_pending);
    tcase_add_test(tc, test_states_and_details);
    tcase_add_test(tc, test_without_details_reads_no_records);
    tcase_add_test(tc, test_stale_by_mtime);
    tcase_add_test(tc, test_stale_by_lease);
    tcase_add_test(tc, test_future_mtime_age_is_zero);
    tcase_add_test(tc, test_first_match_wins);
    tcase_add_test(tc, test_metadata_error_keeps_state);
    tcase_add_test(tc, test_stray_names_ignored);
    tcase_add_test(tc, test_missing_state_dirs);
    tcase_add_test(tc, test_unreadable_state_dir_is_error);
    tcase_add_test(tc, test_complete_and_terminal);
    tcase_add_test(tc, test_stale_is_not_terminal);
    tcase_add_test(tc, test_status_json_fields);
    tcase_add_test(tc, test_status_json_owner_and_pid_as_written);
    tcase_add_test(tc, test_status_json_pending_null_error_and_metadata_error);
    tcase_add_test(tc, test_status_json_complete);
    tcase_add_test(tc, test_job_id_defaults_to_dir_name);
    tcase_add_test(tc, test_view_counts_match_status_compute);
    tcase_add_test(tc, test_view_reads_done_records_once);
    tcase_add_test(tc, test_view_pace_from_durations);
    tcase_add_test(tc, test_view_keeps_last_reading_while_reading);
    tcase_add_test(tc, test_view_refuses_another_directory);
    tcase_add_test(tc, test_view_json_bounded_and_dated);
    tcase_add_test(tc, test_json_bound_keeps_attention_first);
    tcase_add_test(tc, test_parse_time);
    tcase_add_test(tc, test_global_phases);
    tcase_add_test(tc, test_global_failed);
    tcase_add_test(tc, test_global_view);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    json_init();
    return tu_run(status_suite());
}
