/*
 * check_fscheck: the shared file system's verdict and the publication rule
 * that does not trust a link()'s EEXIST. One participant gets the
 * single-node subset and leaves nothing behind; two processes meet, race
 * and agree on one verdict; a run whose partners never come ends after its
 * wait; a run that started without us says so; a job dir gets its verdict
 * recorded and esd's check refuses a recorded non-exclusive verdict. The
 * publication tests interpose link(2): a link that succeeds and then
 * reports EEXIST (a retransmitted NFS LINK), or that puts a copy of our
 * bytes under another inode (a FUSE layer), is our publication; someone
 * else's file under the name is not.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fscheck.h"
#include "fsutil.h"
#include "json.h"
#include "testutil.h"
#include "util.h"

/* ---- link(2), interposed for fs_publish_excl ------------------------- */

enum { LINK_REAL, LINK_THEN_EEXIST, LINK_COPY_THEN_EEXIST };
static int link_mode = LINK_REAL;
static int link_calls;

int link(const char *from, const char *to);

int
link(const char *from, const char *to)
{
    link_calls++;
    if (link_mode == LINK_COPY_THEN_EEXIST) {
        /* another inode holding the same bytes (a layer that copies) */
        size_t len;
        char *data = tu_read(from, &len);
        int fd = open(to, O_WRONLY | O_CREAT | O_EXCL, 0644);

        if (!data || fd < 0 || write(fd, data, len) != (ssize_t)len)
            abort();
        close(fd);
        free(data);
        errno = EEXIST;
        return -1;
    }
    if (syscall(SYS_linkat, AT_FDCWD, from, AT_FDCWD, to, 0) < 0)
        return -1;
    if (link_mode == LINK_THEN_EEXIST) {
        /* the first LINK did it, the retransmitted one says EEXIST */
        errno = EEXIST;
        return -1;
    }
    return 0;
}

START_TEST(test_publish_retransmitted_link)
{
    char *dir = tu_tmpdir(), *path = fs_join(dir, "done.json"), *got;
    struct esd_err err;

    link_mode = LINK_THEN_EEXIST;
    link_calls = 0;
    ck_assert_int_eq(fs_publish_excl(path, "{\"token\":\"a\"}\n", 14, 0644, &err), 0);
    ck_assert_int_eq(link_calls, 1);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "{\"token\":\"a\"}\n");
    /* and no temp file left */
    ck_assert_int_eq(tu_count_entries(dir), 1);
    free(got);
    /* a second publication under the name is refused: not our bytes */
    ck_assert_int_eq(fs_publish_excl(path, "{\"token\":\"b\"}\n", 14, 0644, &err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err.msg, "already exists"));
    link_mode = LINK_REAL;
    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_publish_copy_same_bytes)
{
    char *dir = tu_tmpdir(), *path = fs_join(dir, "done.json");
    struct esd_err err;

    link_mode = LINK_COPY_THEN_EEXIST;
    ck_assert_int_eq(fs_publish_excl(path, "{\"token\":\"c\"}\n", 14, 0644, &err), 0);
    ck_assert_int_eq(tu_count_entries(dir), 1);
    link_mode = LINK_REAL;
    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_publish_other_winner)
{
    char *dir = tu_tmpdir(), *path = tu_write(dir, "done.json", "{\"token\":\"x\"}\n", (size_t)-1);
    char *got;
    struct esd_err err;

    /* the same length, other bytes: another node won */
    ck_assert_int_eq(fs_publish_excl(path, "{\"token\":\"y\"}\n", 14, 0644, &err), -EEXIST);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "{\"token\":\"x\"}\n");
    ck_assert_int_eq(tu_count_entries(dir), 1);
    free(got);
    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

/* ---- fscheck --------------------------------------------------------- */

static void
assert_clean(const char *dir)
{
    char *base = fs_join(dir, ".esd-fscheck");

    ck_assert_msg(!tu_exists(base), "%s left behind", base);
    free(base);
}

START_TEST(test_single)
{
    char *dir = tu_tmpdir();
    struct fscheck_opts o = { .dir = dir };
    struct esd_err err;
    const char *reason = "unset";
    cJSON *v = NULL;
    char *text;

    ck_assert_int_eq(fscheck_run(&o, &v, &err), 0);
    ck_assert(fscheck_exclusive(v, &reason));
    ck_assert_ptr_null(reason);
    ck_assert_str_eq(json_get_str(v, "o_excl"), "ok (one participant: refuses an existing name)");
    ck_assert_str_eq(json_get_str(v, "link"), "ok (one participant: refuses an existing name)");
    ck_assert_str_eq(json_get_str(v, "rename"), "ok");
    ck_assert_str_eq(json_get_str(v, "flock_same_process"), "blocks");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(v, "create_lag_secs")));
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v, "participants")), 1);
    text = fscheck_text(v);
    ck_assert_ptr_nonnull(strstr(text, "verdict: claims can be exclusive here"));
    free(text);
    assert_clean(dir);
    /* not a job dir: nothing recorded */
    ck_assert_int_eq(tu_count_entries(dir), 0);
    cJSON_Delete(v);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_bad_run_name)
{
    struct fscheck_opts o = { .dir = "/tmp", .run = "../x" };
    struct esd_err err;
    cJSON *v = NULL;

    ck_assert_int_eq(fscheck_run(&o, &v, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "invalid run name"));
    o.run = ".hidden";
    ck_assert_int_eq(fscheck_run(&o, &v, &err), -EINVAL);
    ck_assert_ptr_null(v);
}
END_TEST

START_TEST(test_missing_dir)
{
    struct fscheck_opts o = { .dir = "/nonexistent/esd-fscheck" };
    struct esd_err err;
    cJSON *v = NULL;

    ck_assert_int_eq(fscheck_run(&o, &v, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/esd-fscheck"));
}
END_TEST

/* Two participants: a child and this process, on one directory. */
START_TEST(test_two_participants)
{
    char *dir = tu_tmpdir(), *out = fs_join(dir, "child.json"), *text;
    struct fscheck_opts o = { .dir = dir, .run = "t2", .nodes = 2, .wait_secs = 20 };
    struct esd_err err;
    cJSON *v = NULL, *cv = NULL;
    double lag;
    int status;
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct buf b;

        if (fscheck_run(&o, &v, &err) < 0)
            _exit(3);
        buf_init(&b);
        json_dump(v, JSON_COMPACT, &b);
        free(tu_write(dir, "child.json", b.p, b.len));
        buf_free(&b);
        cJSON_Delete(v);
        free(out);
        free(dir);
        _exit(0);
    }
    ck_assert_int_eq(fscheck_run(&o, &v, &err), 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert(fscheck_exclusive(v, NULL));
    ck_assert_str_eq(json_get_str(v, "o_excl"), "ok");
    ck_assert_str_eq(json_get_str(v, "link"), "ok");
    ck_assert_str_eq(json_get_str(v, "rename"), "ok");
    ck_assert_str_eq(json_get_str(v, "flock"),
                     "blocks across processes of one host (run on two nodes for a cluster "
                     "verdict)");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v, "participants")), 2);
    /* one directory on one host: no lag to speak of */
    ck_assert_int_eq(json_get_num(v, "create_lag_secs", &lag), 0);
    ck_assert(lag < 1.0);
    ck_assert_int_eq(json_get_num(v, "unlink_lag_secs", &lag), 0);
    ck_assert(lag < 1.0);
    /* the same verdict in both */
    ck_assert_int_eq(json_load_object(out, 1 << 20, &cv, &err), 0);
    ck_assert_str_eq(json_get_str(cv, "flock"), json_get_str(v, "flock"));
    ck_assert_str_eq(json_get_str(cv, "o_excl"), "ok");
    text = fscheck_text(v);
    ck_assert_ptr_nonnull(strstr(text, "real verdicts need two nodes"));
    free(text);
    assert_clean(dir);
    cJSON_Delete(v);
    cJSON_Delete(cv);
    fs_rm_rf(dir);
    free(out);
    free(dir);
}
END_TEST

/* Partners that never come: the run goes on alone after its wait. */
START_TEST(test_wait_ends)
{
    char *dir = tu_tmpdir();
    struct fscheck_opts o = { .dir = dir, .nodes = 3, .wait_secs = 1 };
    struct esd_err err;
    double t0 = time_mono();
    cJSON *v = NULL;

    ck_assert_int_eq(fscheck_run(&o, &v, &err), 0);
    ck_assert(time_mono() - t0 >= 1.0);
    ck_assert(time_mono() - t0 < 10.0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v, "participants")), 1);
    assert_clean(dir);
    cJSON_Delete(v);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

/* A run that started without us (or a crashed one's leftovers). */
START_TEST(test_started_without_us)
{
    char *dir = tu_tmpdir(), *start;
    struct fscheck_opts o = { .dir = dir, .run = "late", .nodes = 2, .wait_secs = 5 };
    struct esd_err err;
    cJSON *v = NULL;

    start = tu_write(dir, ".esd-fscheck/late/start", "other.1\nother.2\nend\n", (size_t)-1);
    ck_assert_int_eq(fscheck_run(&o, &v, &err), -EAGAIN);
    ck_assert_ptr_nonnull(strstr(err.msg, "had started without this process"));
    /* the others' run is left alone */
    ck_assert(tu_exists(start));
    fs_rm_rf(dir);
    free(start);
    free(dir);
}
END_TEST

START_TEST(test_job_dir_recorded_and_refusal)
{
    char *dir = tu_tmpdir(), *m = tu_write(dir, "manifest.json", "{}", (size_t)-1);
    char *rec = fs_join(dir, "state/esd/fscheck.json"), *why;
    struct fscheck_opts o = { .dir = dir };
    struct esd_err err;
    cJSON *v = NULL, *got = NULL;

    ck_assert(fscheck_is_job(dir));
    ck_assert_int_eq(fscheck_run(&o, &v, &err), 0);
    ck_assert_int_eq(json_load_object(rec, 1 << 20, &got, &err), 0);
    ck_assert(fscheck_exclusive(got, NULL));
    cJSON_Delete(got);
    /* esd's check: a good verdict recorded, and this node agrees */
    why = fscheck_refusal(dir, "n1");
    ck_assert_ptr_null(why);
    /* a recorded verdict that claims cannot be exclusive refuses */
    json_set(v, "exclusive", cJSON_CreateBool(0));
    json_set(v, "reason", cJSON_CreateString("link(): FAILED: 2 participants won k.3"));
    ck_assert_int_eq(fscheck_record(dir, v, &err), 0);
    why = fscheck_refusal(dir, "n1");
    ck_assert_ptr_nonnull(why);
    ck_assert_ptr_nonnull(strstr(why, "2 participants won k.3"));
    ck_assert_ptr_nonnull(strstr(why, "esctl fscheck"));
    free(why);
    /* no verdict yet: esd records its own */
    unlink(rec);
    ck_assert_ptr_null(fscheck_refusal(dir, "n1"));
    ck_assert(tu_exists(rec));
    assert_clean(dir);
    cJSON_Delete(v);
    fs_rm_rf(dir);
    free(rec);
    free(m);
    free(dir);
}
END_TEST

static Suite *
fscheck_suite(void)
{
    Suite *s = suite_create("fscheck");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_publish_retransmitted_link);
    tcase_add_test(tc, test_publish_copy_same_bytes);
    tcase_add_test(tc, test_publish_other_winner);
    tcase_add_test(tc, test_single);
    tcase_add_test(tc, test_bad_run_name);
    tcase_add_test(tc, test_missing_dir);
    tcase_add_test(tc, test_two_participants);
    tcase_add_test(tc, test_wait_ends);
    tcase_add_test(tc, test_started_without_us);
    tcase_add_test(tc, test_job_dir_recorded_and_refusal);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(fscheck_suite());
}
