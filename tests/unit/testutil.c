/*
 * testutil: shared helpers for the check suites.
 */
#include "testutil.h"

#include <dirent.h>
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
#include "util.h"

char *
tu_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = xasprintf("%s/esd-test.XXXXXX", base && *base ? base : "/tmp");

    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        abort();
    }
    return tmpl;
}

char *
tu_real_tmpdir(void)
{
    char *dir = tu_tmpdir();
    char *real = realpath(dir, NULL);

    ck_assert_ptr_nonnull(real);
    free(dir);
    return real;
}

void
tu_symlink_at(const char *target, const char *dir, const char *rel)
{
    char *path = fs_join(dir, rel);

    ck_assert_msg(symlink(target, path) == 0, "symlink %s: %s", path, strerror(errno));
    free(path);
}

void
tu_mkdir_at(const char *dir, const char *rel)
{
    char *path = fs_join(dir, rel);

    ck_assert_int_eq(fs_mkdir_p(path, 0755, NULL), 0);
    free(path);
}

char *
tu_write(const char *dir, const char *rel, const char *data, size_t len)
{
    char *path = fs_join(dir, rel);
    char *parent = fs_dirname(path);
    FILE *f;

    fs_mkdir_p(parent, 0755, NULL);
    free(parent);
    if (len == (size_t)-1)
        len = strlen(data);
    f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

char *
tu_read(const char *path, size_t *len)
{
    char *data = NULL;
    size_t n = 0;

    if (fs_read_file(path, (size_t)1 << 30, &data, &n, NULL) < 0)
        return NULL;
    if (len)
        *len = n;
    return data;
}

int
tu_exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

int
tu_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

char *
tu_data(const char *rel)
{
    const char *base = getenv("ESD_TEST_DATA");

    return fs_join(base && *base ? base : "tests/data", rel);
}

void
tu_job(const char *dir, struct manifest *ret)
{
    struct prepare_opts o;
    struct prepare_result res;
    struct esd_err err;
    char *recipe, *data, *job;

    free(tu_write(dir, "data/a.jsonl", "{\"text\":\"a\"}\n{\"text\":\"b\"}\n", (size_t)-1));
    free(tu_write(dir, "data/sub/b.jsonl", "{\"text\":\"c\"}\n{\"text\":\"d\"}\n{\"text\":\"e\"}\n",
                  (size_t)-1));
    recipe = tu_write(dir, "recipe.yaml", "process:\n  - whitespace_normalization_mapper:\n",
                      (size_t)-1);
    data = fs_join(dir, "data");
    job = fs_join(dir, "job");
    prepare_opts_init(&o);
    o.config = recipe;
    o.dataset_path = data;
    o.job_dir = job;
    o.num_shards = 3;
    ck_assert_msg(prepare_run(&o, &res, &err) == 0, "prepare: %s", err.msg);
    ck_assert_msg(manifest_load(res.job_dir, ret, &err) == 0, "manifest: %s", err.msg);
    ck_assert_uint_eq(ret->nshards, 3);
    prepare_result_free(&res);
    free(recipe);
    free(data);
    free(job);
}

void
tu_set_age(const char *path, double age)
{
    struct timespec ts[2];
    long long ns;

    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ns = (long long)ts[0].tv_sec * 1000000000LL + ts[0].tv_nsec - (long long)(age * 1e9);
    ts[0].tv_sec = (time_t)(ns / 1000000000LL);
    ts[0].tv_nsec = (long)(ns % 1000000000LL);
    ts[1] = ts[0];
    ck_assert_msg(utimensat(AT_FDCWD, path, ts, 0) == 0, "utimensat %s", path);
}

void
tu_put_done(const struct manifest *m, size_t i)
{
    char *path = manifest_state_path(m, "done", m->shards[i].id, ".json");
    char *out = xasprintf("attempts/%s/0001-x/processed.jsonl", m->shards[i].id);
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;

    json_add_str(j, "shard_id", m->shards[i].id);
    json_add_str(j, "status", "done");
    json_add_str(j, "hostname", "elsewhere");
    json_add_str(j, "output_path", out);
    json_add_int(j, "rows", m->shards[i].rows);
    json_add_str(j, "sha256", m->shards[i].sha256);
    ck_assert_msg(json_publish_excl(path, j, JSON_PRETTY, &err) == 0, "%s", err.msg);
    cJSON_Delete(j);
    free(out);
    free(path);
}

static void
tu_deadline_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    *(bool *)w->data = true;
}

bool
tu_run_until(struct ev_loop *loop, bool (*done)(void *), void *arg, double secs)
{
    bool expired = false;
    ev_timer t;

    ev_timer_init(&t, tu_deadline_cb, secs, 0.);
    t.data = &expired;
    ev_timer_start(loop, &t);
    while (!(done && done(arg)) && !expired)
        ev_run(loop, EVRUN_ONCE);
    ev_timer_stop(loop, &t);
    return done ? done(arg) : true;
}

int
tu_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;

    /* fork mode unless CK_FORK=no (valgrind, gdb) */
    srunner_set_fork_status(sr, CK_FORK_GETENV);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
