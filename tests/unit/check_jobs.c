/*
 * check_jobs: the job registry. A registration is persisted under
 * <state_dir>/jobs and read back by the next jobs_init; its state and
 * error too. Registration refuses what is not the directory it names (a
 * relative path, a missing directory, a symbolic link on the path) and an
 * output outside the job. A registered job is bound to its directory:
 * replaced by another directory, by a symbolic link, removed, or given to
 * another owner, it is refused (jobs_check_bound, and so at every rescan)
 * until the very directory is back, and a refused job is not worked; a
 * directory made again before the job was ever loaded is bound anew.
 * Loading reads the manifest in a helper, and says why it cannot.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "jobs.h"
#include "json.h"
#include "manifest.h"
#include "testbed.h"
#include "testutil.h"
#include "util.h"

#define DEADLINE 10.0 /* seconds any single wait may take */

static void
start(void)
{
    struct esd_err err;

    ck_assert_msg(jobs_init(tb.loop, &tb.conf, &err) == 0, "jobs_init: %s", err.msg);
}

static void
setup(void)
{
    tb_setup();
    start();
}

static void
teardown(void)
{
    jobs_fini();
    tb_teardown();
}

static bool
load_failed(void *arg)
{
    struct job *j = arg;

    (void)jobs_load(j);
    return j->load_error != NULL && !j->load;
}

/* The job's registry file (caller deletes). */
static cJSON *
registry(const struct job *j)
{
    cJSON *o = NULL;

    ck_assert_msg(json_load_object(j->reg_path, 1 << 20, &o, NULL) == 0, "cannot read %s",
                  j->reg_path);
    return o;
}

static char *
tmp_path(const char *rel)
{
    return fs_join(tb.tmp, rel);
}

START_TEST(test_register_persists)
{
    struct job *j = tb_register();
    char key[17], *want;
    long long ino;
    struct stat st;
    cJSON *o;

    manifest_dir_key(tb.job_dir, key);
    ck_assert_str_eq(j->key, key);
    ck_assert_str_eq(j->job_dir, tb.job_dir);
    want = fs_join(tb.job_dir, "merged.jsonl");
    ck_assert_str_eq(j->output, want);
    ck_assert_int_eq(j->state, JOB_ACTIVE);
    ck_assert_ptr_eq(jobs_find(tb.job_dir), j);
    ck_assert_uint_eq(jobs_count(), 1);
    /* bound to the inode and owner it was submitted with */
    ck_assert_int_eq(stat(tb.job_dir, &st), 0);
    o = registry(j);
    ck_assert_str_eq(json_get_str(o, "job_dir"), tb.job_dir);
    ck_assert_int_eq(json_get_int(o, "ino", &ino), 0);
    ck_assert_uint_eq((unsigned long long)ino, (unsigned long long)st.st_ino);
    cJSON_Delete(o);
    /* read back by the next start, with its state and error */
    jobs_set_state(j, JOB_FAILED, "shard x failed: because");
    jobs_fini();
    start();
    ck_assert_uint_eq(jobs_count(), 1);
    j = jobs_find(tb.job_dir);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(j->state, JOB_FAILED);
    ck_assert_str_eq(j->error ? j->error : "(none)", "shard x failed: because");
    ck_assert_uint_eq((unsigned long long)j->ino, (unsigned long long)st.st_ino);
    /* submitted again: it works again */
    ck_assert_ptr_eq(tb_register(), j);
    ck_assert_int_eq(j->state, JOB_ACTIVE);
    free(want);
}
END_TEST

/* Registrations refused: the path given (made by make(), relative to tb.tmp,
 * or absolute when it starts with '/'), the output, and what err says. */
static void
make_link(void)
{
    char *link = tmp_path("link");

    ck_assert_int_eq(symlink(tb.job_dir, link), 0);
    free(link);
}

static void
make_parent_link(void)
{
    char *link = tmp_path("parent");

    ck_assert_int_eq(symlink(tb.tmp, link), 0);
    free(link);
}

static const struct {
    const char *dir;
    void (*make)(void);
    const char *output; /* relative to tb.tmp; NULL: the default */
    const char *error;
} hostile[] = {
    { "job", NULL, NULL, "absolute path" },
    { "/none", NULL, NULL, "No such file" },
    { "/link", make_link, NULL, "symbolic link" },
    { "/parent/job", make_parent_link, NULL, "symbolic link" },
    { "/job", NULL, "merged.jsonl", "not a path inside the job directory" },
    { "/job", NULL, "job/manifest.json", "would overwrite part of the job" },
};

START_TEST(test_register_refuses)
{
    char *dir, *reg, *out = hostile[_i].output ? tmp_path(hostile[_i].output) : NULL;
    struct esd_err err;
    struct stat st;

    if (hostile[_i].make)
        hostile[_i].make();
    dir = hostile[_i].dir[0] == '/' ? xasprintf("%s%s", tb.tmp, hostile[_i].dir)
                                    : xstrdup(hostile[_i].dir);
    /* (the owner's stat of what the path leads to) */
    ck_assert_int_eq(stat(tb.job_dir, &st), 0);
    err_clear(&err);
    ck_assert_ptr_null(jobs_register(dir, &st, out, false, getuid(), &err));
    ck_assert_msg(strstr(err.msg, hostile[_i].error), "registering %s: \"%s\", expected \"%s\"",
                  dir, err.msg, hostile[_i].error);
    ck_assert_uint_eq(jobs_count(), 0);
    reg = fs_join(tb.conf.state_dir, "jobs");
    ck_assert_int_eq(tu_count_entries(reg), 0);
    free(reg);
    free(dir);
    free(out);
}
END_TEST

/* Renames tb.tmp/from to tb.tmp/to. */
static void
mv(const char *from, const char *to)
{
    char *a = tmp_path(from), *b = tmp_path(to);

    ck_assert_msg(rename(a, b) == 0, "rename %s %s", a, b);
    free(a);
    free(b);
}

/* Changes to a registered job's directory, and how to undo them (the very
 * directory back). */
static void
replace_dir(void)
{
    mv("job", "job.old");
    ck_assert_int_eq(mkdir(tb.job_dir, 0755), 0);
}

static void
undo_replace(void)
{
    ck_assert_int_eq(rmdir(tb.job_dir), 0);
    mv("job.old", "job");
}

static void
swap_in_link(void)
{
    mv("job", "job.real");
    ck_assert_int_eq(symlink("job.real", tb.job_dir), 0);
}

static void
undo_link(void)
{
    ck_assert_int_eq(unlink(tb.job_dir), 0);
    mv("job.real", "job");
}

static void
remove_dir(void)
{
    mv("job", "job.away");
}

static void
undo_remove(void)
{
    mv("job.away", "job");
}

static void
give_away(void)
{
    ck_assert_int_eq(chown(tb.job_dir, 4242, 4242), 0);
}

static void
undo_give_away(void)
{
    ck_assert_int_eq(chown(tb.job_dir, getuid(), getgid()), 0);
}

static const struct {
    void (*change)(void);
    void (*undo)(void);
    int code;
    const char *error;
    bool root_only;
} moved[] = {
    { replace_dir, undo_replace, -ESTALE, "is another directory than the one submitted", false },
    { swap_in_link, undo_link, -ELOOP, "symbolic link", false },
    { remove_dir, undo_remove, -ENOENT, "No such file", false },
    { give_away, undo_give_away, -EPERM, "now belongs to uid 4242", true },
};

START_TEST(test_bound_refuses)
{
    struct job *j = tb_register();
    struct esd_err err;

    if (moved[_i].root_only && geteuid() != 0)
        return; /* (chown needs root) */
    tb_load(j);
    ck_assert_int_eq(jobs_check_bound(j, &err), 0);
    ck_assert_ptr_null(j->refused);
    moved[_i].change();
    err_clear(&err);
    ck_assert_int_eq(jobs_check_bound(j, &err), moved[_i].code);
    ck_assert_msg(strstr(err.msg, moved[_i].error), "\"%s\", expected \"%s\"", err.msg,
                  moved[_i].error);
    ck_assert_ptr_nonnull(j->refused);
    /* a rescan sees it too, and the job is not worked meanwhile */
    free(j->refused);
    j->refused = NULL;
    jobs_rescan();
    ck_assert_ptr_nonnull(j->refused);
    ck_assert_msg(!jobs_load(j), "a refused job is worked");
    /* the very directory back: worked again */
    moved[_i].undo();
    jobs_rescan();
    ck_assert_ptr_null(j->refused);
    ck_assert(jobs_load(j));
}
END_TEST

/* Made again (rm -rf, prepare) before this node ever loaded the job: the
 * new directory of the same owner is bound instead. */
START_TEST(test_remade_before_load_rebinds)
{
    struct job *j = tb_register();
    struct esd_err err;
    struct stat st;
    ino_t before = j->ino;

    replace_dir();
    ck_assert_int_eq(stat(tb.job_dir, &st), 0);
    ck_assert_int_eq(jobs_check_bound(j, &err), 0);
    ck_assert_uint_ne((unsigned long long)before, (unsigned long long)st.st_ino);
    ck_assert_uint_eq((unsigned long long)j->ino, (unsigned long long)st.st_ino);
    ck_assert_ptr_null(j->refused);
}
END_TEST

START_TEST(test_load_reads_manifest)
{
    struct job *j = tb_register();

    ck_assert(!j->loaded);
    tb_load(j);
    ck_assert(j->loaded);
    ck_assert_ptr_null(j->load_error);
    ck_assert_uint_eq(j->m.nshards, tb.m.nshards);
    ck_assert_str_eq(j->m.job_id, tb.m.job_id);
    for (size_t i = 0; i < j->m.nshards; i++)
        ck_assert_str_eq(j->m.shards[i].id, tb.m.shards[i].id);
}
END_TEST

START_TEST(test_load_says_why_not)
{
    struct job *j;

    free(tu_write(tb.job_dir, "manifest.json", "{\"not\": \"a manifest\"", (size_t)-1));
    j = tb_register();
    ck_assert_msg(tb_run_until(load_failed, j, DEADLINE), "the load did not fail");
    ck_assert(!j->loaded);
    ck_assert_msg(strstr(j->load_error, "manifest.json"), "load error: %s", j->load_error);
}
END_TEST

static Suite *
jobs_suite(void)
{
    Suite *s = suite_create("jobs");
    TCase *tc = tcase_create("registry");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_register_persists);
    tcase_add_loop_test(tc, test_register_refuses, 0, (int)(sizeof(hostile) / sizeof(hostile[0])));
    tcase_add_loop_test(tc, test_bound_refuses, 0, (int)(sizeof(moved) / sizeof(moved[0])));
    tcase_add_test(tc, test_remade_before_load_rebinds);
    tcase_add_test(tc, test_load_reads_manifest);
    tcase_add_test(tc, test_load_says_why_not);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(jobs_suite());
}
