/*
 * check_merge: the ordered merge of spec §11 and its read-only twin. Merge
 * refuses an incomplete job (with the reference's message), an existing
 * output without overwrite (leaving it untouched), a result whose rows or
 * SHA-256 differ from its done record, an invalid result line (named by
 * file:line), a malformed done record and a result path outside the job
 * directory; on every failure no output and no temporary file is left. A
 * good merge is the byte concatenation of the results in manifest order,
 * with a newline added where a result lacks its last one, recorded in
 * merge.json. Verify repeats the checks, counts the owners and notices a
 * merged output changed after the merge.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
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
#include "merge.h"
#include "prepare.h"
#include "sha256.h"
#include "testutil.h"
#include "util.h"

/* The job of every test: 5 records in two files, 3 shards of 2, 2, 1 rows;
 * merges go to OUT inside the (existing, empty) directory OUT_DIR. */
static char *tmp, *OUT_DIR, *OUT;
static struct manifest M;

static void
job_setup(void)
{
    tmp = tu_tmpdir();
    tu_job(tmp, &M);
    OUT_DIR = fs_join(tmp, "out");
    ck_assert_int_eq(fs_mkdir_p(OUT_DIR, 0755, NULL), 0);
    OUT = fs_join(OUT_DIR, "merged.jsonl");
}

static void
job_teardown(void)
{
    fs_rm_rf(tmp);
    manifest_free(&M);
    free(tmp);
    free(OUT_DIR);
    free(OUT);
}

/* The manifest's normalized_sha256 (the struct keeps only what esd uses). */
static const char *
normalized_sha(void)
{
    static char hex[65];
    char *path = fs_join(M.job_dir, "manifest.json");
    cJSON *doc = NULL;

    ck_assert_int_eq(json_load_object(path, 1 << 24, &doc, NULL), 0);
    snprintf(hex, sizeof(hex), "%s", json_get_str(doc, "normalized_sha256"));
    cJSON_Delete(doc);
    free(path);
    return hex;
}

static const char *
id(size_t i)
{
    return M.shards[i].id;
}

/* Where the accepted result of shard i lives, relative to the job. */
static char *
result_rel(size_t i)
{
    return xasprintf("attempts/%s/0001-0123456789abcdef0123456789abcdef/processed.jsonl", id(i));
}

static char *
job_read(const char *rel)
{
    char *path = fs_join(M.job_dir, rel), *data = tu_read(path, NULL);

    ck_assert_msg(data != NULL, "cannot read %s", path);
    free(path);
    return data;
}

static char *
shard_bytes(size_t i)
{
    return job_read(M.shards[i].path);
}

static void
put_result(size_t i, const char *content)
{
    char *rel = result_rel(i);

    free(tu_write(M.job_dir, rel, content, (size_t)-1));
    free(rel);
}

/* Records split on "\n"; the last may lack its newline. */
static long long
count_rows(const char *s)
{
    long long n = 0;

    for (const char *p = s; *p; p++)
        n += *p == '\n';
    return n + (*s && s[strlen(s) - 1] != '\n');
}

/* A done record for shard i describing content as its result. */
static cJSON *
done_json(size_t i, const char *host, const char *content)
{
    cJSON *j = cJSON_CreateObject();
    char hex[SHA256_HEX_LEN + 1], *rel = result_rel(i);

    sha256_buf(content, strlen(content), hex);
    json_add_str(j, "shard_id", id(i));
    json_add_str(j, "status", "done");
    if (host)
        json_add_str(j, "hostname", host);
    json_add_str(j, "output_path", rel);
    json_add_int(j, "rows", count_rows(content));
    json_add_int(j, "size_bytes", (long long)strlen(content));
    json_add_str(j, "sha256", hex);
    json_add_str(j, "executor_type", "ray");
    cJSON_AddItemToObject(j, "ray_output_files", cJSON_CreateArray());
    free(rel);
    return j;
}

/* Publishes j as shard i's done record and deletes it. */
static void
publish(size_t i, cJSON *j)
{
    char *path = manifest_state_path(&M, "done", id(i), ".json");
    struct esd_err err;

    ck_assert_msg(json_publish_excl(path, j, JSON_PRETTY, &err) == 0, "%s", err.msg);
    cJSON_Delete(j);
    free(path);
}

/* A finished shard: its result (NULL: a copy of the shard) and record. */
static void
put_done(size_t i, const char *host, const char *content)
{
    char *copy = content ? NULL : shard_bytes(i);

    put_result(i, content ? content : copy);
    publish(i, done_json(i, host, content ? content : copy));
    free(copy);
}

static void
put_raw_done(size_t i, const char *text)
{
    char *rel = xasprintf("state/done/%s.json", id(i));

    free(tu_write(M.job_dir, rel, text, (size_t)-1));
    free(rel);
}

static int
do_merge(bool overwrite, struct merge_result *res, struct esd_err *err)
{
    struct merge_opts o = { 0 };

    o.output = OUT;
    o.overwrite = overwrite;
    return merge_run(&M, &o, res, err);
}

static int
do_verify(struct merge_result *res, struct esd_err *err)
{
    struct merge_opts o = { 0 };

    return merge_verify(&M, &o, res, err);
}

static bool
merge_json_exists(void)
{
    char *path = fs_join(M.job_dir, "merge.json");
    bool r = tu_exists(path);

    free(path);
    return r;
}

/* The failure left nothing: no output, no temp file, no merge.json. */
static void
assert_nothing_left(void)
{
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 0);
    ck_assert(!merge_json_exists());
}

static bool
starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- refusals ---- */

START_TEST(test_refuses_incomplete)
{
    struct merge_result res;
    struct esd_err err;

    put_done(0, "a", NULL);
    put_done(2, "a", NULL);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_str_eq(err.msg,
                     "Cannot merge an incomplete job: pending=1 running=0 stale=0 failed=0 done=2");
    assert_nothing_left();
}
END_TEST

START_TEST(test_refusal_creates_no_output_dir)
{
    struct merge_result res;
    struct esd_err err;
    struct merge_opts o = { 0 };
    char *out = fs_join(tmp, "new/merged.jsonl"), *dir = fs_join(tmp, "new");

    put_done(0, "a", NULL);
    o.output = out;
    ck_assert_int_eq(merge_run(&M, &o, &res, &err), -EAGAIN);
    ck_assert(!tu_exists(dir));
    free(out);
    free(dir);
}
END_TEST

START_TEST(test_refuses_incomplete_every_count)
{
    struct merge_result res;
    struct esd_err err;
    struct timespec ts[2];
    char *lock;

    put_done(0, "a", NULL);
    free(tu_write(M.job_dir, "state/failed/part-00001-of-00003.json",
                  "{\"last_error\": \"boom\"}\n", (size_t)-1));
    lock = tu_write(M.job_dir, "state/locks/part-00002-of-00003.lock",
                    "{\"hostname\": \"gone\", \"pid\": 1}\n", (size_t)-1);
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= POLICY_LOCK_TIMEOUT_DEFAULT + 10;
    ts[1] = ts[0];
    ck_assert_int_eq(utimensat(AT_FDCWD, lock, ts, 0), 0);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_str_eq(err.msg,
                     "Cannot merge an incomplete job: pending=0 running=0 stale=1 failed=1 done=1");
    assert_nothing_left();
    free(lock);
}
END_TEST

START_TEST(test_incomplete_reported_before_existing_output)
{
    struct merge_result res;
    struct esd_err err;
    char *data;

    /* Spec §11: completeness is step 1, the existing output step 2. */
    free(tu_write(OUT_DIR, "merged.jsonl", "precious\n", (size_t)-1));
    put_done(0, "a", NULL);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_str_eq(err.msg,
                     "Cannot merge an incomplete job: pending=2 running=0 stale=0 failed=0 done=1");
    data = tu_read(OUT, NULL);
    ck_assert_str_eq(data, "precious\n");
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 1);
    free(data);
}
END_TEST

START_TEST(test_existing_output_untouched)
{
    struct merge_result res;
    struct esd_err err;
    char *expect, *data;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    free(tu_write(OUT_DIR, "merged.jsonl", "precious\n", (size_t)-1));
    ck_assert_int_eq(do_merge(false, &res, &err), -EEXIST);
    expect = xasprintf("Output already exists: %s; pass --overwrite to replace it", OUT);
    ck_assert_str_eq(err.msg, expect);
    data = tu_read(OUT, NULL);
    ck_assert_str_eq(data, "precious\n");
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 1);
    ck_assert(!merge_json_exists());
    free(expect);
    free(data);
}
END_TEST

START_TEST(test_overwrite_replaces)
{
    struct merge_result res;
    struct esd_err err;
    char *data;

    put_done(0, "a", "{\"r\":0}\n");
    put_done(1, "a", "{\"r\":1}\n");
    put_done(2, "a", "{\"r\":2}\n");
    free(tu_write(OUT_DIR, "merged.jsonl", "precious\n", (size_t)-1));
    ck_assert_msg(do_merge(true, &res, &err) == 0, "%s", err.msg);
    data = tu_read(OUT, NULL);
    ck_assert_str_eq(data, "{\"r\":0}\n{\"r\":1}\n{\"r\":2}\n");
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 1);
    free(data);
    merge_result_free(&res);
    /* And again, over its own output. */
    ck_assert_msg(do_merge(true, &res, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(res.rows, 3);
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 1);
    merge_result_free(&res);
}
END_TEST

/* ---- the merged bytes ---- */

START_TEST(test_manifest_order)
{
    static const char *const r[3] = { "{\"s\":0,\"k\":1}\n{\"s\":0,\"k\":2}\n",
                                      "{\"s\":1,\"k\":1}\n",
                                      "{\"s\":2,\"k\":1}\n{\"s\":2,\"k\":2}\n{\"s\":2,\"k\":3}\n" };
    struct merge_result res;
    struct esd_err err;
    char *data, *expect, hex[SHA256_HEX_LEN + 1];
    size_t len;

    /* Published backwards, so no directory order can pass for the
     * manifest's. */
    put_done(2, "a", r[2]);
    put_done(1, "b", r[1]);
    put_done(0, "a", r[0]);
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    expect = xasprintf("%s%s%s", r[0], r[1], r[2]);
    data = tu_read(OUT, &len);
    ck_assert_str_eq(data, expect);
    sha256_buf(expect, strlen(expect), hex);
    ck_assert_uint_eq(res.nshards, 3);
    ck_assert_uint_eq(res.rows, 6);
    ck_assert_uint_eq(res.bytes, strlen(expect));
    ck_assert_str_eq(res.sha256, hex);
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 1);
    free(data);
    free(expect);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_results_equal_to_shards_give_the_normalized_stream)
{
    struct merge_result res;
    struct esd_err err;
    char *data;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    data = tu_read(OUT, NULL);
    ck_assert_str_eq(data, "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"text\":\"c\"}\n"
                           "{\"text\":\"d\"}\n{\"text\":\"e\"}\n");
    ck_assert_uint_eq(res.rows, (uint64_t)M.total_rows);
    ck_assert_str_eq(res.sha256, normalized_sha());
    free(data);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_merge_json_fields)
{
    struct merge_result res;
    struct esd_err err;
    char *path = fs_join(M.job_dir, "merge.json"), hex[SHA256_HEX_LEN + 1];
    cJSON *j = NULL;
    long long v;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    ck_assert_msg(json_load_object(path, 1 << 20, &j, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(cJSON_GetArraySize(j), 6);
    ck_assert_str_eq(json_get_str(j, "job_id"), "job");
    ck_assert_str_eq(json_get_str(j, "output_path"), OUT);
    ck_assert_ptr_nonnull(json_get_str(j, "merged_at"));
    ck_assert_int_eq(json_get_int(j, "rows", &v), 0);
    ck_assert_int_eq(v, 5);
    ck_assert_int_eq(json_get_int(j, "num_shards", &v), 0);
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(sha256_file(OUT, hex, &err), 0);
    ck_assert_str_eq(json_get_str(j, "sha256"), hex);
    ck_assert_str_eq(res.sha256, hex);
    cJSON_Delete(j);
    free(path);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_missing_final_newline_added)
{
    struct merge_result res;
    struct esd_err err;
    char *data, *path = fs_join(M.job_dir, "merge.json"), hex[SHA256_HEX_LEN + 1];
    const char *expect = "{\"r\":0}\n{\"r\":1}\n{\"r\":2}\n{\"r\":3}\n";
    cJSON *j = NULL;

    /* The done records hash the bytes as they are, without the newline. */
    put_done(0, "a", "{\"r\":0}\n");
    put_done(1, "a", "{\"r\":1}\n{\"r\":2}");
    put_done(2, "a", "{\"r\":3}");
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    data = tu_read(OUT, NULL);
    ck_assert_str_eq(data, expect);
    ck_assert_uint_eq(res.rows, 4);
    ck_assert_uint_eq(res.bytes, strlen(expect));
    sha256_buf(expect, strlen(expect), hex);
    ck_assert_str_eq(res.sha256, hex);
    ck_assert_int_eq(json_load_object(path, 1 << 20, &j, &err), 0);
    ck_assert_str_eq(json_get_str(j, "sha256"), hex);
    cJSON_Delete(j);
    free(data);
    free(path);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_output_parent_created)
{
    struct merge_result res;
    struct esd_err err;
    struct merge_opts o = { 0 };
    char *out = fs_join(tmp, "new/deeper/merged.jsonl");

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    o.output = out;
    ck_assert_msg(merge_run(&M, &o, &res, &err) == 0, "%s", err.msg);
    ck_assert(tu_exists(out));
    merge_result_free(&res);
    free(out);
}
END_TEST

/* ---- changed or broken results ---- */

START_TEST(test_changed_rows_detected)
{
    struct merge_result res;
    struct esd_err err;
    cJSON *j;
    char *shard = shard_bytes(1);

    put_done(0, "a", NULL);
    put_done(2, "a", NULL);
    put_result(1, shard);
    j = done_json(1, "a", shard);
    json_set(j, "rows", json_int(3));
    publish(1, j);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "Result checksum or row count mismatch for "
                                       "part-00001-of-00003"),
                  "%s", err.msg);
    assert_nothing_left();
    free(shard);
}
END_TEST

START_TEST(test_changed_bytes_same_rows_detected)
{
    struct merge_result res;
    struct esd_err err;

    put_done(0, "a", NULL);
    put_done(1, "a", "{\"r\":\"x\"}\n{\"r\":\"y\"}\n");
    put_done(2, "a", NULL);
    put_result(1, "{\"r\":\"x\"}\n{\"r\":\"z\"}\n");
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "Result checksum or row count mismatch for "
                                       "part-00001-of-00003"),
                  "%s", err.msg);
    assert_nothing_left();
}
END_TEST

START_TEST(test_appended_record_detected)
{
    struct merge_result res;
    struct esd_err err;
    char *shard = shard_bytes(2), *grown;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    grown = xasprintf("%s{\"text\": \"changed after publication\"}\n", shard);
    put_result(2, grown);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "Result checksum or row count mismatch for "
                                       "part-00002-of-00003"),
                  "%s", err.msg);
    assert_nothing_left();
    free(shard);
    free(grown);
}
END_TEST

START_TEST(test_invalid_line_named)
{
    struct merge_result res;
    struct esd_err err;
    char *rel = result_rel(1), *where = xasprintf("%s:2", rel);

    put_done(0, "a", NULL);
    /* The done record matches the bad bytes: only validation can object. */
    put_done(1, "a", "{\"a\":1}\n{bad json\n{\"a\":3}\n");
    put_done(2, "a", NULL);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_msg(strstr(err.msg, where) != NULL, "%s", err.msg);
    ck_assert_msg(starts_with(err.msg, "Invalid JSON at "), "%s", err.msg);
    assert_nothing_left();
    free(rel);
    free(where);
}
END_TEST

START_TEST(test_invalid_line_keeps_overwritten_output)
{
    struct merge_result res;
    struct esd_err err;
    char *data;

    put_done(0, "a", NULL);
    put_done(1, "a", NULL);
    put_done(2, "a", "[1, 2]\n");
    free(tu_write(OUT_DIR, "merged.jsonl", "precious\n", (size_t)-1));
    ck_assert_int_lt(do_merge(true, &res, &err), 0);
    ck_assert_msg(strstr(err.msg, "processed.jsonl:1") != NULL, "%s", err.msg);
    data = tu_read(OUT, NULL);
    ck_assert_str_eq(data, "precious\n");
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 1);
    ck_assert(!merge_json_exists());
    free(data);
}
END_TEST

START_TEST(test_done_record_without_output_path)
{
    struct merge_result res;
    struct esd_err err;
    cJSON *j;
    char *shard = shard_bytes(0);

    put_result(0, shard);
    j = done_json(0, "a", shard);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "output_path");
    publish(0, j);
    put_done(1, "a", NULL);
    put_done(2, "a", NULL);
    ck_assert_int_eq(do_merge(false, &res, &err), -EINVAL);
    ck_assert_msg(starts_with(err.msg, "malformed done record ") &&
                      strstr(err.msg, "part-00000-of-00003.json") && strstr(err.msg, "output_path"),
                  "%s", err.msg);
    assert_nothing_left();
    free(shard);
}
END_TEST

START_TEST(test_done_record_malformed)
{
    struct merge_result res;
    struct esd_err err;
    cJSON *j;
    char *shard = shard_bytes(0);

    put_result(0, shard);
    j = done_json(0, "a", shard);
    json_set(j, "sha256", cJSON_CreateString("abc"));
    publish(0, j);
    put_done(1, "a", NULL);
    put_done(2, "a", NULL);
    ck_assert_int_eq(do_merge(false, &res, &err), -EINVAL);
    ck_assert_msg(starts_with(err.msg, "malformed done record "), "%s", err.msg);
    assert_nothing_left();
    free(shard);
}
END_TEST

START_TEST(test_done_record_unparsable)
{
    struct merge_result res;
    struct esd_err err;

    put_done(0, "a", NULL);
    put_raw_done(1, "{\"output_path\": \"x\", \"rows\": ");
    put_done(2, "a", NULL);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "Unable to read JSON file ") &&
                      strstr(err.msg, "part-00001-of-00003.json"),
                  "%s", err.msg);
    assert_nothing_left();
}
END_TEST

static void
assert_escape_refused(const char *output_path)
{
    struct merge_result res;
    struct esd_err err;
    char *expect = xasprintf("Manifest path escapes job directory: %s", output_path);
    char *shard = shard_bytes(1);
    cJSON *j = done_json(1, "a", shard);

    json_set(j, "output_path", cJSON_CreateString(output_path));
    publish(1, j);
    ck_assert_int_eq(do_merge(false, &res, &err), -EINVAL);
    ck_assert_str_eq(err.msg, expect);
    assert_nothing_left();
    free(expect);
    free(shard);
}

START_TEST(test_output_path_escape_dotdot)
{
    char *shard = shard_bytes(1);

    /* A perfectly good result just outside the job directory. */
    free(tu_write(tmp, "x", shard, (size_t)-1));
    put_done(0, "a", NULL);
    put_done(2, "a", NULL);
    assert_escape_refused("../x");
    free(shard);
}
END_TEST

START_TEST(test_output_path_escape_absolute)
{
    char *shard = shard_bytes(1), *abs = fs_join(tmp, "x");

    free(tu_write(tmp, "x", shard, (size_t)-1));
    put_done(0, "a", NULL);
    put_done(2, "a", NULL);
    assert_escape_refused(abs);
    free(shard);
    free(abs);
}
END_TEST

START_TEST(test_output_path_escape_symlink)
{
    char *shard = shard_bytes(1), *outside = fs_join(tmp, "elsewhere"), *link;

    free(tu_write(tmp, "elsewhere/processed.jsonl", shard, (size_t)-1));
    link = fs_join(M.job_dir, "attempts/sneaky");
    ck_assert_int_eq(symlink(outside, link), 0);
    put_done(0, "a", NULL);
    put_done(2, "a", NULL);
    assert_escape_refused("attempts/sneaky/processed.jsonl");
    free(shard);
    free(outside);
    free(link);
}
END_TEST

START_TEST(test_missing_result_file)
{
    struct merge_result res;
    struct esd_err err;
    char *shard = shard_bytes(1);

    put_done(0, "a", NULL);
    publish(1, done_json(1, "a", shard)); /* no result written */
    put_done(2, "a", NULL);
    ck_assert_int_lt(do_merge(false, &res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "cannot read result of part-00001-of-00003"), "%s", err.msg);
    assert_nothing_left();
    free(shard);
}
END_TEST

/* ---- progress ---- */

struct seen {
    int calls;
    struct merge_progress last;
};

static void
on_progress(void *ctx, const struct merge_progress *p)
{
    struct seen *s = ctx;

    s->calls++;
    s->last = *p;
}

START_TEST(test_progress_reaches_the_end)
{
    struct merge_result res;
    struct esd_err err;
    struct merge_opts o = { 0 };
    struct seen seen = { 0 };

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    o.output = OUT;
    o.progress = on_progress;
    o.progress_ctx = &seen;
    ck_assert_msg(merge_run(&M, &o, &res, &err) == 0, "%s", err.msg);
    ck_assert_int_gt(seen.calls, 0);
    ck_assert_uint_eq(seen.last.shards_done, 3);
    ck_assert_uint_eq(seen.last.shards_total, 3);
    ck_assert_uint_eq(seen.last.rows, 5);
    ck_assert_uint_eq(seen.last.bytes_done, seen.last.bytes_total);
    merge_result_free(&res);
}
END_TEST

/* ---- verify ---- */

START_TEST(test_verify_good_job_and_owners)
{
    struct merge_result res;
    struct esd_err err;

    put_done(0, "node-b", NULL);
    put_done(1, "node-a", NULL);
    put_done(2, "node-b", NULL);
    ck_assert_msg(do_verify(&res, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(res.nshards, 3);
    ck_assert_uint_eq(res.rows, 5);
    ck_assert_str_eq(res.sha256, normalized_sha());
    ck_assert(!res.checked_output);
    ck_assert_uint_eq(res.nowners, 2);
    ck_assert_str_eq(res.owners[0].hostname, "node-a");
    ck_assert_uint_eq(res.owners[0].shards, 1);
    ck_assert_str_eq(res.owners[1].hostname, "node-b");
    ck_assert_uint_eq(res.owners[1].shards, 2);
    /* Verify writes nothing. */
    ck_assert(!merge_json_exists());
    ck_assert_int_eq(tu_count_entries(OUT_DIR), 0);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_verify_owner_without_hostname_not_counted)
{
    struct merge_result res;
    struct esd_err err;

    put_done(0, "node-a", NULL);
    put_done(1, NULL, NULL);
    put_done(2, "node-a", NULL);
    ck_assert_msg(do_verify(&res, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(res.nowners, 1);
    ck_assert_uint_eq(res.owners[0].shards, 2);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_verify_after_merge_checks_output)
{
    struct merge_result res;
    struct esd_err err;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    merge_result_free(&res);
    ck_assert_msg(do_verify(&res, &err) == 0, "%s", err.msg);
    ck_assert(res.checked_output);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_verify_detects_changed_merged_output)
{
    struct merge_result res;
    struct esd_err err;
    char *data;
    size_t len;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    merge_result_free(&res);
    /* Same size, one byte different. */
    data = tu_read(OUT, &len);
    data[len - 3] = 'z';
    free(tu_write(OUT_DIR, "merged.jsonl", data, len));
    ck_assert_int_lt(do_verify(&res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "merged output ") && strstr(err.msg, OUT) &&
                      strstr(err.msg, "does not match"),
                  "%s", err.msg);
    free(data);
}
END_TEST

START_TEST(test_verify_detects_results_changed_after_merge)
{
    struct merge_result res;
    struct esd_err err;
    char *path = fs_join(M.job_dir, "merge.json");
    cJSON *j = NULL;

    for (size_t i = 0; i < 3; i++)
        put_done(i, "a", NULL);
    ck_assert_msg(do_merge(false, &res, &err) == 0, "%s", err.msg);
    merge_result_free(&res);
    /* merge.json no longer describes what the results give. */
    ck_assert_int_eq(json_load_object(path, 1 << 20, &j, &err), 0);
    json_set(j, "rows", json_int(4));
    ck_assert_int_eq(json_write_atomic(path, j, JSON_PRETTY, &err), 0);
    ck_assert_int_lt(do_verify(&res, &err), 0);
    ck_assert_msg(strstr(err.msg, "merge.json does not match the shard results"), "%s", err.msg);
    cJSON_Delete(j);
    free(path);
}
END_TEST

START_TEST(test_verify_refuses_incomplete_and_bad_results)
{
    struct merge_result res;
    struct esd_err err;

    put_done(0, "a", NULL);
    ck_assert_int_lt(do_verify(&res, &err), 0);
    ck_assert_str_eq(err.msg,
                     "Cannot merge an incomplete job: pending=2 running=0 stale=0 failed=0 done=1");
    put_done(1, "a", NULL);
    put_done(2, "a", "{\"r\":1}\n");
    put_result(2, "{\"r\":2}\n");
    ck_assert_int_lt(do_verify(&res, &err), 0);
    ck_assert_msg(starts_with(err.msg, "Result checksum or row count mismatch for "
                                       "part-00002-of-00003"),
                  "%s", err.msg);
}
END_TEST

START_TEST(test_output_inside_job_refused)
{
    static const char *bad[] = { "shards/part-00000-of-00003.jsonl", "state/x.jsonl",
                                 "attempts/new.jsonl", "manifest.json", "merge.json" };
    struct merge_opts o = { 0 };
    struct merge_result res;
    struct esd_err err;

    for (size_t i = 0; i < M.nshards; i++)
        put_done(i, "h", NULL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *out = fs_join(M.job_dir, bad[i]), *before = tu_read(out, NULL);
        char *after;

        o.output = out;
        o.overwrite = true;
        ck_assert_int_eq(merge_run(&M, &o, &res, &err), -EINVAL);
        ck_assert_msg(strstr(err.msg, "would overwrite part of the job directory"), "%s", err.msg);
        after = tu_read(out, NULL);
        ck_assert((before == NULL) == (after == NULL));
        ck_assert(!before || strcmp(before, after) == 0);
        free(before);
        free(after);
        free(out);
    }
    /* the default, <job>/merged.jsonl, is fine */
    {
        char *dflt = fs_join(M.job_dir, "merged.jsonl");

        o.output = dflt;
        ck_assert_msg(merge_run(&M, &o, &res, &err) == 0, "%s", err.msg);
        merge_result_free(&res);
        free(dflt);
    }
}
END_TEST

START_TEST(test_cancel)
{
    static volatile sig_atomic_t stop = 1;
    struct merge_opts o = { 0 };
    struct merge_result res;
    struct esd_err err;

    for (size_t i = 0; i < M.nshards; i++)
        put_done(i, "h", NULL);
    o.output = OUT;
    o.cancel = &stop;
    ck_assert_int_eq(merge_run(&M, &o, &res, &err), -ECANCELED);
    ck_assert_str_eq(err.msg, "interrupted; nothing was written");
    assert_nothing_left();
}
END_TEST

/* ---- verify of a job with a global stage (issue 17) ---- */

#define GLOBAL_OUT_REL "attempts/_global/0001-0123456789abcdef0123456789abcdef/processed.jsonl"

static const char *const G_SHARDS[] = { "{\"t\":\"a\"}\n{\"t\":\"b\"}\n", "{\"t\":\"c\"}\n",
                                        "{\"t\":\"d\"}" /* no final newline */ };
static const char *G_INPUT = "{\"t\":\"a\"}\n{\"t\":\"b\"}\n{\"t\":\"c\"}\n{\"t\":\"d\"}\n";
static const char *G_FINAL = "{\"t\":\"a\"}\n{\"t\":\"d\"}\n";

static void
put_job_text(const char *rel, const char *text)
{
    free(tu_write(M.job_dir, rel, text, (size_t)-1));
}

/* A record {rows, sha256 of text, more...} as JSON text (caller frees). */
static char *
rows_sha(const char *text, const char *more)
{
    char hex[SHA256_HEX_LEN + 1];

    sha256_buf(text, strlen(text), hex);
    return xasprintf("{\"rows\": %lld, \"sha256\": \"%s\"%s}", count_rows(text), hex, more);
}

/* A job whose global stage is finished and merged, by hand, as the
 * runtime writes it (prefix.json, input.jsonl, _global's done record and
 * output, the final output and merge.json with its stages). */
static void
global_job(bool final)
{
    char *t, *shards, *glob, *more;

    M.global_snapshot = "recipe.global.yaml";
    M.global_sha256 = "cc";
    M.global_executor = "default";
    M.global_ops_json = "[\"document_deduplicator\"]";
    M.global_shard_ops = 1;
    for (size_t i = 0; i < 3; i++)
        put_done(i, "h", G_SHARDS[i]);
    put_job_text("state/esd/global/input.jsonl", G_INPUT);
    t = rows_sha(G_INPUT, ", \"status\": \"complete\", \"num_shards\": 3, \"input_path\": "
                          "\"state/esd/global/input.jsonl\"");
    put_job_text("state/esd/global/prefix.json", t);
    free(t);
    put_job_text(GLOBAL_OUT_REL, G_FINAL);
    t = rows_sha(G_FINAL, ", \"shard_id\": \"_global\", \"status\": \"done\", \"hostname\": "
                          "\"h\", \"output_path\": \"" GLOBAL_OUT_REL "\"");
    put_job_text("state/done/_global.json", t);
    free(t);
    if (!final)
        return;
    free(tu_write(OUT_DIR, "merged.jsonl", G_FINAL, (size_t)-1));
    shards = rows_sha(G_INPUT, ", \"num_shards\": 3, \"operators\": 1");
    glob = rows_sha(G_FINAL, ", \"operators\": [\"document_deduplicator\"]");
    more = xasprintf(", \"output_path\": \"%s\", \"num_shards\": 3, \"stages\": {\"shards\": %s, "
                     "\"global\": %s}",
                     OUT, shards, glob);
    t = rows_sha(G_FINAL, more);
    put_job_text("merge.json", t);
    free(t);
    free(more);
    free(shards);
    free(glob);
}

START_TEST(test_verify_global_both_stages)
{
    struct merge_result res;
    struct esd_err err;
    char hex[SHA256_HEX_LEN + 1];

    global_job(true);
    ck_assert_msg(do_verify(&res, &err) == 0, "%s", err.msg);
    ck_assert(res.global);
    ck_assert(res.checked_output);
    ck_assert_uint_eq(res.rows, 4);
    ck_assert_uint_eq(res.global_rows, 2);
    sha256_buf(G_FINAL, strlen(G_FINAL), hex);
    ck_assert_str_eq(res.global_sha256, hex);
    sha256_buf(G_INPUT, strlen(G_INPUT), hex);
    ck_assert_str_eq(res.sha256, hex);
    merge_result_free(&res);
}
END_TEST

/* Before the final merge: both stages, no merge.json to check yet. */
START_TEST(test_verify_global_before_final)
{
    struct merge_result res;
    struct esd_err err;

    global_job(false);
    ck_assert_msg(do_verify(&res, &err) == 0, "%s", err.msg);
    ck_assert(res.global);
    ck_assert(!res.checked_output);
    merge_result_free(&res);
}
END_TEST

START_TEST(test_verify_global_tampered_input)
{
    struct merge_result res;
    struct esd_err err;

    global_job(true);
    /* shard 1's record changed in the global stage's input */
    put_job_text("state/esd/global/input.jsonl",
                 "{\"t\":\"a\"}\n{\"t\":\"b\"}\n{\"t\":\"X\"}\n{\"t\":\"d\"}\n");
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "state/esd/global/input.jsonl does not hold the result of") &&
                      strstr(err.msg, id(1)) && strstr(err.msg, "at line 3"),
                  "%s", err.msg);
    /* a row too many */
    put_job_text("state/esd/global/input.jsonl",
                 "{\"t\":\"a\"}\n{\"t\":\"b\"}\n{\"t\":\"c\"}\n{\"t\":\"d\"}\n{\"t\":\"e\"}\n");
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "more rows than the shards' results, from line 5"), "%s",
                  err.msg);
    /* prefix.json that records other rows */
    put_job_text("state/esd/global/input.jsonl", G_INPUT);
    put_job_text("state/esd/global/prefix.json", "{\"rows\": 3, \"sha256\": \"00\"}");
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "prefix.json does not match the shard results"), "%s", err.msg);
}
END_TEST

START_TEST(test_verify_global_tampered_final)
{
    struct merge_result res;
    struct esd_err err;

    global_job(true);
    free(tu_write(OUT_DIR, "merged.jsonl", "{\"t\":\"a\"}\n{\"t\":\"Z\"}\n", (size_t)-1));
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "merged output") && strstr(err.msg, "merge.json"), "%s", err.msg);
    /* the global stage's own output changed */
    free(tu_write(OUT_DIR, "merged.jsonl", G_FINAL, (size_t)-1));
    put_job_text(GLOBAL_OUT_REL, "{\"t\":\"a\"}\n");
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "mismatch for _global") && strstr(err.msg, "_global.json"), "%s",
                  err.msg);
    /* a merge.json whose stages disagree with _global's done record */
    put_job_text(GLOBAL_OUT_REL, G_FINAL);
    {
        char *t = rows_sha(G_FINAL, ", \"output_path\": \"/nonexistent\", \"stages\": {\"shards\": "
                                    "{\"rows\": 4, \"sha256\": \"00\"}, \"global\": {}}");

        put_job_text("merge.json", t);
        free(t);
    }
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "merge.json does not match the shard results"), "%s", err.msg);
}
END_TEST

START_TEST(test_verify_global_unfinished_or_failed)
{
    struct merge_result res;
    struct esd_err err;
    char *path;

    global_job(true);
    path = fs_join(M.job_dir, "state/done/_global.json");
    ck_assert_int_eq(unlink(path), 0);
    free(path);
    ck_assert_int_eq(do_verify(&res, &err), -EAGAIN);
    ck_assert_msg(strstr(err.msg, "state/done/_global.json is missing"), "%s", err.msg);
    put_job_text("state/failed/_global.json", "{\"status\": \"failed\", \"last_error\": \"oom\"}");
    ck_assert_int_eq(do_verify(&res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "the global stage failed") && strstr(err.msg, "oom") &&
                      strstr(err.msg, "state/failed/_global.json"),
                  "%s", err.msg);
    path = fs_join(M.job_dir, "state/esd/global/prefix.json");
    ck_assert_int_eq(unlink(path), 0);
    free(path);
    ck_assert_int_eq(do_verify(&res, &err), -EAGAIN);
    ck_assert_msg(strstr(err.msg, "state/esd/global/prefix.json is missing"), "%s", err.msg);
}
END_TEST

static Suite *
merge_suite(void)
{
    Suite *s = suite_create("merge");
    TCase *tc = tcase_create("merge");

    tcase_add_checked_fixture(tc, job_setup, job_teardown);
    tcase_add_test(tc, test_refuses_incomplete);
    tcase_add_test(tc, test_output_inside_job_refused);
    tcase_add_test(tc, test_cancel);
    tcase_add_test(tc, test_refuses_incomplete_every_count);
    tcase_add_test(tc, test_refusal_creates_no_output_dir);
    tcase_add_test(tc, test_incomplete_reported_before_existing_output);
    tcase_add_test(tc, test_existing_output_untouched);
    tcase_add_test(tc, test_overwrite_replaces);
    tcase_add_test(tc, test_manifest_order);
    tcase_add_test(tc, test_results_equal_to_shards_give_the_normalized_stream);
    tcase_add_test(tc, test_merge_json_fields);
    tcase_add_test(tc, test_missing_final_newline_added);
    tcase_add_test(tc, test_output_parent_created);
    tcase_add_test(tc, test_changed_rows_detected);
    tcase_add_test(tc, test_changed_bytes_same_rows_detected);
    tcase_add_test(tc, test_appended_record_detected);
    tcase_add_test(tc, test_invalid_line_named);
    tcase_add_test(tc, test_invalid_line_keeps_overwritten_output);
    tcase_add_test(tc, test_done_record_without_output_path);
    tcase_add_test(tc, test_done_record_malformed);
    tcase_add_test(tc, test_done_record_unparsable);
    tcase_add_test(tc, test_output_path_escape_dotdot);
    tcase_add_test(tc, test_output_path_escape_absolute);
    tcase_add_test(tc, test_output_path_escape_symlink);
    tcase_add_test(tc, test_missing_result_file);
    tcase_add_test(tc, test_progress_reaches_the_end);
    tcase_add_test(tc, test_verify_good_job_and_owners);
    tcase_add_test(tc, test_verify_owner_without_hostname_not_counted);
    tcase_add_test(tc, test_verify_after_merge_checks_output);
    tcase_add_test(tc, test_verify_detects_changed_merged_output);
    tcase_add_test(tc, test_verify_detects_results_changed_after_merge);
    tcase_add_test(tc, test_verify_refuses_incomplete_and_bad_results);
    tcase_add_test(tc, test_verify_global_both_stages);
    tcase_add_test(tc, test_verify_global_before_final);
    tcase_add_test(tc, test_verify_global_tampered_input);
    tcase_add_test(tc, test_verify_global_tampered_final);
    tcase_add_test(tc, test_verify_global_unfinished_or_failed);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    json_init();
    return tu_run(merge_suite());
}
