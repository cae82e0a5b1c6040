/*
 * check_retry: requeueing terminally failed shards (spec §10): the selection
 * (unknown ids refused by name, sorted; valid ids that are not failed
 * ignored; nothing selected is not an error), the refusals checked for
 * every target before anything moves (a lock, a done record), and the move
 * of the failed record and the attempts directory into state/history under
 * one shared "<epoch>.<uuid32hex>" suffix, after which the shard is pending.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "prepare.h"
#include "retry.h"
#include "status.h"
#include "testutil.h"
#include "util.h"

/* The job of every test: 5 records in two files, 3 shards. */
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

/* "<job>/<dir>/<id of shard i><suffix>" (caller frees). */
static char *
job_path(const char *dir, size_t i, const char *suffix)
{
    return xasprintf("%s/%s/%s%s", M.job_dir, dir, id(i), suffix);
}

/* A failed shard as a worker leaves it: a failed record and one attempt
 * directory holding attempt.json (without_attempts: the record only). */
static void
put_failed(size_t i, bool without_attempts)
{
    char *path = manifest_state_path(&M, "failed", id(i), ".json");
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;

    json_add_str(j, "shard_id", id(i));
    json_add_str(j, "status", "failed");
    json_add_int(j, "failures", 4);
    json_add_str(j, "last_error", "Data-Juicer returned exit code 1");
    ck_assert_msg(json_publish_excl(path, j, JSON_PRETTY, &err) == 0, "%s", err.msg);
    cJSON_Delete(j);
    free(path);
    if (!without_attempts) {
        char *rel = xasprintf("attempts/%s/0004-feedface/attempt.json", id(i));
        free(tu_write(M.job_dir, rel, "{\"status\": \"failed\"}\n", (size_t)-1));
        free(rel);
    }
}

static void
put_file(const char *dir, size_t i, const char *suffix, const char *content)
{
    char *rel = xasprintf("%s/%s%s", dir, id(i), suffix);

    free(tu_write(M.job_dir, rel, content, (size_t)-1));
    free(rel);
}

/* Entries of a directory of the job. */
static int
count_in(const char *rel)
{
    char *dir = fs_join(M.job_dir, rel);
    int n = tu_count_entries(dir);

    free(dir);
    return n;
}

static int
retry(bool all_failed, const char *const *ids, struct strv *ret, struct esd_err *err)
{
    struct strv v;
    int r;

    strv_init(&v);
    for (size_t i = 0; ids && ids[i]; i++)
        strv_push(&v, ids[i]);
    strv_init(ret);
    r = retry_run(&M, all_failed, ids ? &v : NULL, ret, err);
    strv_free(&v);
    return r;
}

static enum shard_state
state_of(size_t i)
{
    struct job_status st;
    struct esd_err err;
    enum shard_state s;

    ck_assert_msg(status_compute(&M, 0, false, &st, &err) == 0, "%s", err.msg);
    s = st.shards[i].state;
    status_free(&st);
    return s;
}

static bool
exists_at(const char *dir, size_t i, const char *suffix)
{
    char *path = job_path(dir, i, suffix);
    bool r = tu_exists(path);

    free(path);
    return r;
}

/* The names in dir, sorted. */
static void
list_names(const char *rel, struct strv *ret)
{
    char *dir = fs_join(M.job_dir, rel);
    DIR *d = opendir(dir);
    struct dirent *e;

    ck_assert_ptr_nonnull(d);
    strv_init(ret);
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            strv_push(ret, e->d_name);
    closedir(d);
    strv_sort(ret);
    free(dir);
}

/* If name is "<id>.<epoch digits>.<32 hex><ext>", returns the suffix
 * "<epoch>.<hex>" (caller frees); NULL otherwise. */
static char *
history_suffix(const char *name, const char *shard, const char *ext)
{
    size_t n = strlen(name), sl = strlen(shard), el = strlen(ext), k = 0;
    const char *p;

    if (n < sl + 1 + 1 + 1 + 32 + el || strncmp(name, shard, sl) || name[sl] != '.' ||
        strcmp(name + n - el, ext))
        return NULL;
    p = name + sl + 1;
    while (isdigit((unsigned char)p[k]))
        k++;
    if (k == 0 || p[k] != '.' || (size_t)(name + n - el - (p + k + 1)) != 32)
        return NULL;
    for (const char *h = p + k + 1; h < name + n - el; h++)
        if (!isxdigit((unsigned char)*h) || isupper((unsigned char)*h))
            return NULL;
    return xstrndup(p, (size_t)(name + n - el - p));
}

START_TEST(test_unknown_ids_named_sorted)
{
    static const char *const ids[] = { "b", "part-00000-of-00003", "a", "b", NULL };
    struct strv out;
    struct esd_err err;

    put_failed(0, false);
    ck_assert_int_eq(retry(false, ids, &out, &err), -EINVAL);
    ck_assert_str_eq(err.msg, "Unknown shard IDs: a, b");
    ck_assert_uint_eq(out.n, 0);
    /* Nothing moved. */
    ck_assert(exists_at("state/failed", 0, ".json"));
    ck_assert(exists_at("attempts", 0, ""));
    ck_assert_int_eq(state_of(0), ST_FAILED);
    strv_free(&out);
}
END_TEST

START_TEST(test_all_failed_ignores_ids)
{
    static const char *const ids[] = { "no-such-shard", NULL };
    struct strv out;
    struct esd_err err;

    put_failed(1, false);
    ck_assert_int_eq(retry(true, ids, &out, &err), 0);
    ck_assert_uint_eq(out.n, 1);
    ck_assert_str_eq(out.v[0], id(1));
    strv_free(&out);
}
END_TEST

START_TEST(test_nothing_selected)
{
    static const char *const ids[] = { "part-00000-of-00003", "part-00002-of-00003", NULL };
    struct strv out;
    struct esd_err err;

    /* No failed shard at all. */
    ck_assert_int_eq(retry(true, NULL, &out, &err), 0);
    ck_assert_uint_eq(out.n, 0);
    strv_free(&out);
    /* No ids and not --all-failed: nothing. */
    put_failed(1, false);
    ck_assert_int_eq(retry(false, NULL, &out, &err), 0);
    ck_assert_uint_eq(out.n, 0);
    strv_free(&out);
    /* Valid ids that are not failed are silently ignored. */
    ck_assert_int_eq(retry(false, ids, &out, &err), 0);
    ck_assert_uint_eq(out.n, 0);
    strv_free(&out);
    ck_assert_int_eq(state_of(1), ST_FAILED);
    ck_assert_int_eq(count_in("state/history/failed"), 0);
}
END_TEST

START_TEST(test_lock_refuses_before_anything_moves)
{
    static const char *const ids[] = { "part-00002-of-00003", "part-00000-of-00003", NULL };
    struct strv out;
    struct esd_err err;

    put_failed(0, false);
    put_failed(2, false);
    put_file("state/locks", 2, ".lock", "{\"hostname\": \"h\"}\n");
    ck_assert_int_eq(retry(false, ids, &out, &err), -EBUSY);
    ck_assert_str_eq(err.msg, "Cannot retry part-00002-of-00003: a lock still exists");
    ck_assert_uint_eq(out.n, 0);
    /* Shard 0 came first and was fine, yet it did not move either. */
    ck_assert(exists_at("state/failed", 0, ".json"));
    ck_assert(exists_at("attempts", 0, ""));
    ck_assert(exists_at("state/failed", 2, ".json"));
    ck_assert_int_eq(count_in("state/history/failed"), 0);
    strv_free(&out);

    ck_assert_int_eq(retry(true, NULL, &out, &err), -EBUSY);
    ck_assert_str_eq(err.msg, "Cannot retry part-00002-of-00003: a lock still exists");
    ck_assert_int_eq(count_in("state/history/failed"), 0);
    strv_free(&out);
}
END_TEST

START_TEST(test_done_refuses)
{
    struct strv out;
    struct esd_err err;

    put_failed(1, false);
    put_file("state/done", 1, ".json", "{\"hostname\": \"h\"}\n");
    ck_assert_int_eq(retry(true, NULL, &out, &err), -EEXIST);
    ck_assert_str_eq(err.msg, "Cannot retry part-00001-of-00003: it is already complete");
    ck_assert_uint_eq(out.n, 0);
    ck_assert(exists_at("state/failed", 1, ".json"));
    ck_assert(exists_at("attempts", 1, ""));
    strv_free(&out);
}
END_TEST

START_TEST(test_moves_into_history)
{
    static const char *const ids[] = { "part-00001-of-00003", NULL };
    struct strv out, hf, ha;
    struct esd_err err;
    char *sf, *sa, *name, *path, *data;
    time_t t0 = time(NULL), t1;
    long long epoch = -1;

    put_failed(1, false);
    ck_assert_int_eq(retry(false, ids, &out, &err), 0);
    t1 = time(NULL);
    ck_assert_uint_eq(out.n, 1);
    ck_assert_str_eq(out.v[0], id(1));
    ck_assert(!exists_at("state/failed", 1, ".json"));
    ck_assert(!exists_at("attempts", 1, ""));
    ck_assert_int_eq(state_of(1), ST_PENDING);

    list_names("state/history/failed", &hf);
    list_names("state/history/attempts", &ha);
    ck_assert_uint_eq(hf.n, 1);
    ck_assert_uint_eq(ha.n, 1);
    sf = history_suffix(hf.v[0], id(1), ".json");
    sa = history_suffix(ha.v[0], id(1), "");
    ck_assert_msg(sf != NULL, "history name %s", hf.v[0]);
    ck_assert_msg(sa != NULL, "history name %s", ha.v[0]);
    ck_assert_str_eq(sf, sa);
    sscanf(sf, "%lld.", &epoch);
    ck_assert(epoch >= t0 && epoch <= t1);

    /* Contents moved unchanged. */
    name = xasprintf("state/history/failed/%s", hf.v[0]);
    path = fs_join(M.job_dir, name);
    data = tu_read(path, NULL);
    ck_assert_ptr_nonnull(strstr(data, "\"last_error\": \"Data-Juicer returned exit code 1\""));
    free(data);
    free(path);
    free(name);
    name = xasprintf("state/history/attempts/%s/0004-feedface/attempt.json", ha.v[0]);
    path = fs_join(M.job_dir, name);
    data = tu_read(path, NULL);
    ck_assert_str_eq(data, "{\"status\": \"failed\"}\n");
    free(data);
    free(path);
    free(name);

    free(sf);
    free(sa);
    strv_free(&hf);
    strv_free(&ha);
    strv_free(&out);
}
END_TEST

START_TEST(test_several_sorted_own_suffixes)
{
    static const char *const ids[] = { "part-00002-of-00003", "part-00000-of-00003",
                                       "part-00001-of-00003", NULL };
    struct strv out, hf, ha;
    struct esd_err err;
    char *s0, *s2, *sa;

    put_failed(2, false);
    put_failed(0, true); /* a failed record without any attempt left */
    ck_assert_int_eq(retry(false, ids, &out, &err), 0);
    ck_assert_uint_eq(out.n, 2);
    ck_assert_str_eq(out.v[0], id(0));
    ck_assert_str_eq(out.v[1], id(2));
    ck_assert_int_eq(state_of(0), ST_PENDING);
    ck_assert_int_eq(state_of(1), ST_PENDING);
    ck_assert_int_eq(state_of(2), ST_PENDING);

    list_names("state/history/failed", &hf);
    list_names("state/history/attempts", &ha);
    ck_assert_uint_eq(hf.n, 2);
    ck_assert_uint_eq(ha.n, 1);
    s0 = history_suffix(hf.v[0], id(0), ".json");
    s2 = history_suffix(hf.v[1], id(2), ".json");
    ck_assert_ptr_nonnull(s0);
    ck_assert_ptr_nonnull(s2);
    ck_assert_str_ne(s0, s2);
    /* Shard 2's record and attempts share a suffix; shard 0 had none. */
    sa = history_suffix(ha.v[0], id(2), "");
    ck_assert_ptr_nonnull(sa);
    ck_assert_str_eq(sa, s2);
    free(s0);
    free(s2);
    free(sa);
    strv_free(&hf);
    strv_free(&ha);
    strv_free(&out);
}
END_TEST

START_TEST(test_retry_again_after_new_failure)
{
    struct strv out, hf;
    struct esd_err err;

    put_failed(0, false);
    ck_assert_int_eq(retry(true, NULL, &out, &err), 0);
    strv_free(&out);
    put_failed(0, false);
    ck_assert_int_eq(retry(true, NULL, &out, &err), 0);
    ck_assert_uint_eq(out.n, 1);
    strv_free(&out);
    list_names("state/history/failed", &hf);
    ck_assert_uint_eq(hf.n, 2);
    ck_assert_int_eq(count_in("state/history/attempts"), 2);
    ck_assert_int_eq(state_of(0), ST_PENDING);
    strv_free(&hf);
}
END_TEST

static Suite *
retry_suite(void)
{
    Suite *s = suite_create("retry");
    TCase *tc = tcase_create("retry");

    tcase_add_checked_fixture(tc, job_setup, job_teardown);
    tcase_add_test(tc, test_unknown_ids_named_sorted);
    tcase_add_test(tc, test_all_failed_ignores_ids);
    tcase_add_test(tc, test_nothing_selected);
    tcase_add_test(tc, test_lock_refuses_before_anything_moves);
    tcase_add_test(tc, test_done_refuses);
    tcase_add_test(tc, test_moves_into_history);
    tcase_add_test(tc, test_several_sorted_own_suffixes);
    tcase_add_test(tc, test_retry_again_after_new_failure);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    json_init();
    return tu_run(retry_suite());
}
