/*
 * check_prepare: prepare end to end on small fixtures: the balancing rule
 * (the spec's worked example), discovery and ordering, byte-preserving
 * normalisation of media paths and index keys, manifest fields, idempotent
 * re-prepare and its mismatch rules, and errors that leave nothing behind.
 * Then an attacker who can write the job's parent directory, played in
 * prepare_test_hook between prepare's steps: whatever name they swap, no
 * byte lands outside prepare's own staging directory, and no swap is
 * published as the job. Durability: fsync and syncfs are interposed here
 * (this binary's definitions win over the C library's), to count what is
 * synced and to fail a sync, which must leave nothing behind. Last, whose
 * identity a root prepare takes. Compressed inputs, mixed with plain
 * ones: their order, their text in the shards, their manifest entries,
 * no spool left behind, re-prepare unchanged, a fault leaving nothing.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "prepare.h"
#include "sha256.h"
#include "testutil.h"
#include "zsrc.h"

static const char *RECIPE_PLAIN = "process:\n  - whitespace_normalization_mapper:\n";
static const char *RECIPE_INDEX = "dataset_path: data.jsonl\n"
                                  "process:\n"
                                  "  - whitespace_normalization_mapper:\n"
                                  "  - text_length_filter:\n"
                                  "      index_key: global_index\n";

/* A record of exactly `size` bytes including its "\n". */
static void
add_record(struct buf *b, size_t size)
{
    buf_puts(b, "{\"t\":\"");
    for (size_t i = 0; i + 9 < size; i++)
        buf_putc(b, 'x');
    buf_puts(b, "\"}\n");
}

struct fixture {
    char *dir;
    char *recipe;
    char *job;
};

static void
fixture_init(struct fixture *f, const char *recipe)
{
    f->dir = tu_tmpdir();
    f->recipe = tu_write(f->dir, "recipe.yaml", recipe, (size_t)-1);
    f->job = fs_join(f->dir, "job");
}

static void
fixture_free(struct fixture *f)
{
    fs_rm_rf(f->dir);
    free(f->dir);
    free(f->recipe);
    free(f->job);
}

/* Counts of the interposed calls; the fsync numbered fsync_fail_at (from
 * 1) and every syncfs while syncfs_fail is set fail with EIO. */
static int fsync_calls, syncfs_calls, fsync_fail_at, syncfs_fail;

int
fsync(int fd)
{
    if (++fsync_calls == fsync_fail_at) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}

int
syncfs(int fd)
{
    syncfs_calls++;
    if (syncfs_fail) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_syncfs, fd);
}

static int
run_prepare_sync(struct fixture *f, const char *dataset, long long n, enum prepare_sync sync,
                 struct prepare_result *res, struct esd_err *err)
{
    struct prepare_opts o;

    prepare_opts_init(&o);
    o.config = f->recipe;
    o.dataset_path = dataset;
    o.job_dir = f->job;
    o.num_shards = n;
    o.dj_root = f->dir;
    o.sync = sync;
    fsync_calls = syncfs_calls = 0;
    return prepare_run(&o, res, err);
}

static int
run_prepare(struct fixture *f, const char *dataset, long long n, struct prepare_result *res,
            struct esd_err *err)
{
    return run_prepare_sync(f, dataset, n, PREPARE_SYNC_AUTO, res, err);
}

static void
shard_rows(const char *job, long long *rows, size_t n)
{
    struct manifest m;
    struct esd_err err;

    ck_assert_int_eq(manifest_load(job, &m, &err), 0);
    ck_assert_uint_eq(m.nshards, n);
    for (size_t i = 0; i < n; i++)
        rows[i] = m.shards[i].rows;
    manifest_free(&m);
}

START_TEST(test_worked_example)
{
    static const size_t sizes[] = { 85, 116, 37, 76, 77, 37 };
    static const struct {
        long long n;
        long long rows[6];
    } expect[] = {
        { 3, { 2, 2, 2 } },
        { 4, { 2, 1, 2, 1 } },
        { 6, { 1, 1, 1, 1, 1, 1 } },
        { 1, { 6 } },
    };
    struct fixture f;
    struct buf data;
    char *input;

    fixture_init(&f, RECIPE_PLAIN);
    buf_init(&data);
    for (size_t i = 0; i < 6; i++)
        add_record(&data, sizes[i]);
    ck_assert_uint_eq(data.len, 428);
    input = tu_write(f.dir, "in.jsonl", data.p, data.len);
    for (size_t k = 0; k < sizeof(expect) / sizeof(expect[0]); k++) {
        struct prepare_result res;
        struct esd_err err;
        long long rows[6];

        ck_assert_msg(run_prepare(&f, input, expect[k].n, &res, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(res.rows, 6);
        ck_assert_uint_eq(res.bytes, 428);
        shard_rows(f.job, rows, (size_t)expect[k].n);
        for (long long i = 0; i < expect[k].n; i++)
            ck_assert_msg(rows[i] == expect[k].rows[i], "N=%lld shard %lld: %lld rows", expect[k].n,
                          i, rows[i]);
        prepare_result_free(&res);
        fs_rm_rf(f.job);
    }
    buf_free(&data);
    free(input);
    fixture_free(&f);
}
END_TEST

START_TEST(test_manifest_and_bytes)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    struct manifest m;
    cJSON *doc = NULL;
    const char *data =
        "{\"n\": 12345678901234567890123, \"f\":0.1000000000000000055511151231257827}\n"
        "{\"text\" : \"caf\xc3\xa9\\u00e9\"}\r\n"
        "{\"x\":NaN}"; /* no final newline */
    char *input, *shard, *content, hex[SHA256_HEX_LEN + 1];
    const cJSON *files, *policy, *exec;
    long long v;

    fixture_init(&f, RECIPE_PLAIN);
    input = tu_write(f.dir, "in.jsonl", data, (size_t)-1);
    ck_assert_msg(run_prepare(&f, input, 1, &res, &err) == 0, "%s", err.msg);
    ck_assert(!res.unchanged);
    shard = fs_join(f.job, "shards/part-00000-of-00001.jsonl");
    content = tu_read(shard, NULL);
    /* every byte kept, the final newline added */
    ck_assert_int_eq(strncmp(content, data, strlen(data)), 0);
    ck_assert_str_eq(content + strlen(data), "\n");
    ck_assert_int_eq(manifest_load_doc(f.job, &m, &doc, &err), 0);
    ck_assert_str_eq(m.job_id, "job");
    ck_assert_str_eq(json_get_str(doc, "dataset_path"), input);
    ck_assert_str_eq(json_get_str(doc, "media_root"), f.dir);
    ck_assert_int_eq(json_get_int(doc, "total_rows", &v), 0);
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(json_get_int(doc, "total_size_bytes", &v), 0);
    ck_assert_int_eq(v, (long long)strlen(data) + 1);
    sha256_buf(content, strlen(content), hex);
    ck_assert_str_eq(json_get_str(doc, "normalized_sha256"), hex);
    ck_assert_str_eq(m.shards[0].sha256, hex);
    ck_assert_int_eq(m.shards[0].size_bytes, (long long)strlen(data) + 1);
    files = cJSON_GetObjectItemCaseSensitive(doc, "input_files");
    ck_assert_int_eq(cJSON_GetArraySize(files), 1);
    sha256_buf(data, strlen(data), hex);
    ck_assert_str_eq(json_get_str(cJSON_GetArrayItem(files, 0), "sha256"), hex);
    ck_assert_str_eq(json_get_str(cJSON_GetArrayItem(files, 0), "relative_path"), "in.jsonl");
    policy = cJSON_GetObjectItemCaseSensitive(doc, "policy");
    ck_assert_int_eq(json_get_int(policy, "lock_timeout_secs", &v), 0);
    ck_assert_int_eq(v, 126000);
    exec = cJSON_GetObjectItemCaseSensitive(doc, "execution");
    ck_assert_str_eq(json_get_str(exec, "recipe_executor_type"), "default");
    ck_assert_str_eq(json_get_str(exec, "ray_address"), "local");
    /* the executor warning, as the reference words it */
    ck_assert_uint_eq(res.warnings.n, 1);
    ck_assert_str_eq(res.warnings.v[0],
                     "recipe executor_type=default will be overridden with executor_type=ray for "
                     "shard workers");
    /* state directories of the layout, and the recipe copy */
    {
        static const char *dirs[] = { "state/locks",          "state/done",
                                      "state/failed",         "state/stale_locks",
                                      "state/history/failed", "state/history/attempts",
                                      "state/clock",          "attempts" };
        for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
            char *d = fs_join(f.job, dirs[i]);
            ck_assert_msg(tu_count_entries(d) == 0, "%s", dirs[i]);
            free(d);
        }
        char *copy = fs_join(f.job, "recipe.yaml"), *got = tu_read(copy, NULL);
        ck_assert_str_eq(got, RECIPE_PLAIN);
        free(got);
        free(copy);
    }
    /* no staging directory left next to the job */
    ck_assert_int_eq(tu_count_entries(f.dir), 3);
    manifest_free(&m);
    cJSON_Delete(doc);
    prepare_result_free(&res);
    free(content);
    free(shard);
    free(input);
    fixture_free(&f);
}
END_TEST

START_TEST(test_directory_discovery)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    struct manifest m;
    cJSON *doc = NULL;
    const cJSON *files;
    char *ds, *link_target, *link_path;
    static const char *order[] = { ".hid/a.jsonl", "B/x.jsonl", "B/y/z.JSONL",
                                   "a.jsonl",      "b/c.jsonl", "linked.jsonl" };

    fixture_init(&f, RECIPE_PLAIN);
    ds = fs_join(f.dir, "ds");
    free(tu_write(ds, "b/c.jsonl", "{\"i\":5}\n", (size_t)-1));
    free(tu_write(ds, "a.jsonl", "{\"i\":4}\n", (size_t)-1));
    free(tu_write(ds, "B/y/z.JSONL", "{\"i\":3}\n", (size_t)-1));
    free(tu_write(ds, "B/x.jsonl", "{\"i\":2}\n", (size_t)-1));
    free(tu_write(ds, ".hid/a.jsonl", "{\"i\":1}\n", (size_t)-1));
    free(tu_write(ds, "notes.txt", "not json", (size_t)-1));
    free(tu_write(ds, "b/.jsonl", "not a jsonl file by name", (size_t)-1));
    link_target = tu_write(f.dir, "outside/t.jsonl", "{\"i\":6}\n", (size_t)-1);
    link_path = fs_join(ds, "linked.jsonl");
    ck_assert_int_eq(symlink(link_target, link_path), 0);
    free(link_path);
    /* a symlinked directory is not descended */
    link_path = fs_join(ds, "zlinkdir");
    free(link_target);
    link_target = fs_join(f.dir, "outside");
    ck_assert_int_eq(symlink(link_target, link_path), 0);
    ck_assert_msg(run_prepare(&f, ds, 2, &res, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(manifest_load_doc(f.job, &m, &doc, &err), 0);
    files = cJSON_GetObjectItemCaseSensitive(doc, "input_files");
    ck_assert_int_eq(cJSON_GetArraySize(files), 6);
    for (int i = 0; i < 6; i++) {
        const cJSON *x = cJSON_GetArrayItem(files, i);
        char *expect_path = fs_join(ds, order[i]);
        ck_assert_str_eq(json_get_str(x, "relative_path"), order[i]);
        ck_assert_str_eq(json_get_str(x, "path"), expect_path);
        free(expect_path);
    }
    ck_assert_str_eq(json_get_str(doc, "media_root"), ds);
    /* contiguous shards in that order: records 1..6 */
    {
        char *s0 = fs_join(f.job, "shards/part-00000-of-00002.jsonl");
        char *s1 = fs_join(f.job, "shards/part-00001-of-00002.jsonl");
        char *a = tu_read(s0, NULL), *b = tu_read(s1, NULL);
        char all[256];
        snprintf(all, sizeof(all), "%s%s", a, b);
        ck_assert_str_eq(all, "{\"i\":1}\n{\"i\":2}\n{\"i\":3}\n{\"i\":4}\n{\"i\":5}\n{\"i\":6}\n");
        free(a), free(b), free(s0), free(s1);
    }
    manifest_free(&m);
    cJSON_Delete(doc);
    prepare_result_free(&res);
    free(link_target);
    free(link_path);
    free(ds);
    fixture_free(&f);
}
END_TEST

START_TEST(test_normalisation)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    char *input, *shard, *content, *expect, *img;
    const char *data =
        "{\"text\":\"a\",\"images\":[\"img/1.jpg\", \"http://h/x.png\",\"/abs/2.jpg\",\"\","
        "\"s3://b/k\",\"img/../img/3.jpg\"]}\n"
        "{\"text\":\"b\",\"images\":null,\"global_index\":null}\n"
        "{\"\\u0069mages\":[\"img\\/4.jpg\"], \"audios\":[]}\n"
        "{}\n";

    fixture_init(&f, RECIPE_INDEX);
    free(tu_write(f.dir, "img/1.jpg", "", 0));
    input = tu_write(f.dir, "data.jsonl", data, (size_t)-1);
    /* dataset_path from the recipe, relative to the Data-Juicer root */
    ck_assert_msg(run_prepare(&f, NULL, 1, &res, &err) == 0, "%s", err.msg);
    shard = fs_join(f.job, "shards/part-00000-of-00001.jsonl");
    content = tu_read(shard, NULL);
    img = fs_join(f.dir, "img");
    expect = xasprintf(
        "{\"text\":\"a\",\"images\":[\"%s/1.jpg\", \"http://h/x.png\",\"/abs/2.jpg\",\"\","
        "\"s3://b/k\",\"%s/3.jpg\"],\"global_index\":0}\n"
        "{\"text\":\"b\",\"images\":null,\"global_index\":null}\n"
        "{\"\\u0069mages\":[\"%s/4.jpg\"], \"audios\":[],\"global_index\":2}\n"
        "{\"global_index\":3}\n",
        img, img, img);
    ck_assert_str_eq(content, expect);
    prepare_result_free(&res);
    free(expect);
    free(img);
    free(content);
    free(shard);
    free(input);
    fixture_free(&f);
}
END_TEST

START_TEST(test_media_errors)
{
    static const struct {
        const char *data;
        const char *msg;
    } c[] = {
        { "{}\n{\"images\":\"a.jpg\"}\n", "Media field 'images' must be a list or null at " },
        { "{\"videos\":[\"a\",1]}\n", "Every item in media field 'videos' must be a string at " },
        { "{\"audios\":{\"a\":1}}\n", "Media field 'audios' must be a list or null at " },
    };
    static const char *lines[] = { ":2", ":1", ":1" };

    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct fixture f;
        struct prepare_result res;
        struct esd_err err;
        char *input;

        fixture_init(&f, RECIPE_PLAIN);
        input = tu_write(f.dir, "m.jsonl", c[i].data, (size_t)-1);
        ck_assert_int_eq(run_prepare(&f, input, 1, &res, &err), -EINVAL);
        ck_assert_msg(strstr(err.msg, c[i].msg) && strstr(err.msg, lines[i]), "%s", err.msg);
        ck_assert_ptr_nonnull(strstr(err.msg, "m.jsonl"));
        ck_assert(!tu_exists(f.job));
        ck_assert_int_eq(tu_count_entries(f.dir), 2);
        free(input);
        fixture_free(&f);
    }
}
END_TEST

START_TEST(test_reprepare)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    struct stat st;
    char *input;
    struct timespec ts[2];

    fixture_init(&f, RECIPE_PLAIN);
    input = tu_write(f.dir, "in.jsonl", "{\"a\":1}\n{\"a\":2}\n", (size_t)-1);
    ck_assert_int_eq(run_prepare(&f, input, 2, &res, &err), 0);
    prepare_result_free(&res);
    /* identical request: a no-op */
    ck_assert_msg(run_prepare(&f, input, 2, &res, &err) == 0, "%s", err.msg);
    ck_assert(res.unchanged);
    prepare_result_free(&res);
    /* a different shard count */
    ck_assert_int_eq(run_prepare(&f, input, 1, &res, &err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err.msg, "Job directory already exists and does not match this "
                                          "request"));
    ck_assert_ptr_nonnull(strstr(err.msg, "Choose a new --job-dir."));
    /* same size, restored mtime, different content */
    ck_assert_int_eq(stat(input, &st), 0);
    free(tu_write(f.dir, "in.jsonl", "{\"a\":3}\n{\"a\":4}\n", (size_t)-1));
    ts[0] = st.st_atim;
    ts[1] = st.st_mtim;
    ck_assert_int_eq(utimensat(AT_FDCWD, input, ts, 0), 0);
    ck_assert_int_eq(run_prepare(&f, input, 2, &res, &err), -EEXIST);
    /* a job directory without a manifest does not match either */
    fs_rm_rf(f.job);
    ck_assert_int_eq(mkdir(f.job, 0755), 0);
    ck_assert_int_eq(run_prepare(&f, input, 2, &res, &err), -EEXIST);
    free(input);
    fixture_free(&f);
}
END_TEST

START_TEST(test_errors_leave_nothing)
{
    static const struct {
        const char *data;
        long long n;
        const char *msg;
    } c[] = {
        { "", 1, "Input dataset contains no records" },
        { "{}\n{}\n", 3, "--num-shards (3) exceeds input records (2)" },
        { "{}\n\n{}\n", 1, "Blank JSONL record at " },
        { "{}\n{\"a\":\"\\ud800\"}\n", 1, "lone surrogate escape" },
    };

    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct fixture f;
        struct prepare_result res;
        struct esd_err err;
        char *input;

        fixture_init(&f, RECIPE_PLAIN);
        input = tu_write(f.dir, "e.jsonl", c[i].data, (size_t)-1);
        ck_assert_int_lt(run_prepare(&f, input, c[i].n, &res, &err), 0);
        ck_assert_msg(strstr(err.msg, c[i].msg), "%s", err.msg);
        ck_assert(!tu_exists(f.job));
        ck_assert_int_eq(tu_count_entries(f.dir), 2);
        free(input);
        fixture_free(&f);
    }
}
END_TEST

START_TEST(test_request_errors)
{
    struct fixture f;
    struct prepare_result res;
    struct prepare_opts o;
    struct esd_err err;
    char *missing, *txt;

    fixture_init(&f, RECIPE_PLAIN);
    missing = fs_join(f.dir, "nope");
    ck_assert_int_lt(run_prepare(&f, missing, 1, &res, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "Dataset path does not exist: "));
    txt = tu_write(f.dir, "data.txt", "{}\n", (size_t)-1);
    ck_assert_int_lt(run_prepare(&f, txt, 1, &res, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "No .jsonl files found under "));
    /* no dataset_path anywhere */
    ck_assert_int_lt(run_prepare(&f, NULL, 1, &res, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "no dataset path"));
    prepare_opts_init(&o);
    o.config = missing;
    o.dataset_path = txt;
    o.job_dir = f.job;
    o.num_shards = 1;
    ck_assert_int_lt(prepare_run(&o, &res, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "Recipe does not exist: "));
    o.config = f.recipe;
    o.ray_address = "  ";
    ck_assert_int_lt(prepare_run(&o, &res, &err), 0);
    ck_assert_str_eq(err.msg, "--ray-address must not be empty");
    ck_assert(!tu_exists(f.job));
    free(missing);
    free(txt);
    fixture_free(&f);
}
END_TEST

START_TEST(test_ray_address_warning)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    char *input;

    fixture_init(&f, "executor_type: ray\nray_address: auto\nprocess: []\n");
    input = tu_write(f.dir, "in.jsonl", "{}\n", (size_t)-1);
    ck_assert_msg(run_prepare(&f, input, 1, &res, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(res.warnings.n, 1);
    ck_assert_str_eq(res.warnings.v[0], "recipe ray_address='auto' will be overridden with "
                                        "'local'");
    prepare_result_free(&res);
    free(input);
    fixture_free(&f);
}
END_TEST

START_TEST(test_cancel)
{
    static volatile sig_atomic_t stop = 1;
    struct fixture f;
    struct prepare_result res;
    struct prepare_opts o;
    struct esd_err err;
    char *input;

    fixture_init(&f, RECIPE_PLAIN);
    input = tu_write(f.dir, "in.jsonl", "{}\n{}\n{}\n", (size_t)-1);
    prepare_opts_init(&o);
    o.config = f.recipe;
    o.dataset_path = input;
    o.job_dir = f.job;
    o.num_shards = 2;
    o.cancel = &stop;
    ck_assert_int_eq(prepare_run(&o, &res, &err), -ECANCELED);
    ck_assert_str_eq(err.msg, "interrupted; no job directory was published");
    ck_assert(!tu_exists(f.job));
    ck_assert_int_eq(tu_count_entries(f.dir), 2);
    free(input);
    fixture_free(&f);
}
END_TEST

/* ---- the attacker in the parent directory ---- */

enum attack_kind {
    ATTACK_NONE,
    ATTACK_SWAP_LINK,     /* staging moved aside, a link to the victim in its place */
    ATTACK_SWAP_DIR,      /* staging moved aside, a directory of another uid in its place */
    ATTACK_SWAP_FULL,     /* staging moved aside, another directory of prepare's uid in its place */
    ATTACK_PLANT_STAGING, /* a link to the victim at the staging name before it is made */
    ATTACK_PLANT_JOB,     /* a link to the victim at the job's name */
    ATTACK_SWAP_PARENT,   /* the parent swapped for a link to the victim */
};

static struct {
    enum attack_kind kind;
    enum prepare_step step;
    const char *victim; /* absolute */
    const char *parent; /* ATTACK_SWAP_PARENT: its path */
    int fired;
} attack;

/* Called by prepare between its steps (prepare.h); plays attack. */
void
prepare_test_hook(enum prepare_step step, int parent_fd, const char *staging, const char *job)
{
    char *aside;

    if (attack.kind == ATTACK_NONE || step != attack.step)
        return;
    attack.fired++;
    switch (attack.kind) {
    case ATTACK_SWAP_LINK:
    case ATTACK_SWAP_DIR:
    case ATTACK_SWAP_FULL:
        ck_assert_int_eq(renameat(parent_fd, staging, parent_fd, "aside"), 0);
        if (attack.kind == ATTACK_SWAP_LINK) {
            ck_assert_int_eq(symlinkat(attack.victim, parent_fd, staging), 0);
        } else if (attack.kind == ATTACK_SWAP_FULL) {
            ck_assert_int_eq(renameat(parent_fd, "older", parent_fd, staging), 0);
        } else {
            ck_assert_int_eq(mkdirat(parent_fd, staging, 0777), 0);
            ck_assert_int_eq(fchownat(parent_fd, staging, 4242, 4242, AT_SYMLINK_NOFOLLOW), 0);
        }
        break;
    case ATTACK_PLANT_STAGING:
        ck_assert_int_eq(symlinkat(attack.victim, parent_fd, staging), 0);
        break;
    case ATTACK_PLANT_JOB:
        ck_assert_int_eq(symlinkat(attack.victim, parent_fd, job), 0);
        break;
    case ATTACK_SWAP_PARENT:
        aside = xasprintf("%s.aside", attack.parent);
        ck_assert_int_eq(rename(attack.parent, aside), 0);
        ck_assert_int_eq(symlink(attack.victim, attack.parent), 0);
        free(aside);
        break;
    case ATTACK_NONE:
        break;
    }
}

static int
open_fds(void)
{
    return tu_count_entries("/proc/self/fd");
}

/*
 * Prepares f's job (in f->dir/p/job) with attack played at step; the
 * victim is another job's directory, f->dir/victim, holding one file.
 * Returns prepare's result, having checked that the victim is as it was.
 */
static int
attacked_prepare(enum attack_kind kind, enum prepare_step step, struct fixture *f,
                 struct esd_err *err)
{
    struct prepare_result res;
    char *input, *victim, *parent, *cwd_job;
    int r, fds;

    fixture_init(f, RECIPE_PLAIN);
    input = tu_write(f->dir, "in.jsonl", "{\"a\":1}\n{\"a\":2}\n", (size_t)-1);
    free(tu_write(f->dir, "victim/manifest.json", "{}\n", (size_t)-1));
    victim = fs_join(f->dir, "victim");
    parent = fs_join(f->dir, "p");
    ck_assert_int_eq(mkdir(parent, 0755), 0);
    if (kind == ATTACK_SWAP_FULL)
        free(tu_write(parent, "older/keep", "mine\n", (size_t)-1));
    cwd_job = f->job;
    f->job = fs_join(parent, "job");
    free(cwd_job);
    attack.kind = kind;
    attack.step = step;
    attack.victim = victim;
    attack.parent = parent;
    attack.fired = 0;
    fds = open_fds();
    r = run_prepare(f, input, 2, &res, err);
    attack.kind = ATTACK_NONE;
    ck_assert_int_eq(attack.fired, 1);
    ck_assert_int_eq(open_fds(), fds); /* every descriptor closed, whatever failed */
    if (r == 0)
        prepare_result_free(&res);
    /* nothing was written in the victim's job */
    ck_assert_int_eq(tu_count_entries(victim), 1);
    free(input);
    free(victim);
    free(parent);
    return r;
}

/* Entries in f->dir/p/<rel>; -1 if it is not a directory. */
static int
entries_in(const struct fixture *f, const char *rel)
{
    char *p = xasprintf("%s/p/%s", f->dir, rel);
    int n = tu_count_entries(p);

    free(p);
    return n;
}

START_TEST(test_race_staging_link)
{
    /* swapped for a link at once (not followed), once filled (not
     * published), and in the last window before the rename (published
     * under the job's name is the attacker's link, and prepare says so) */
    static const enum prepare_step steps[] = { PREPARE_STEP_OPEN, PREPARE_STEP_FILLED,
                                               PREPARE_STEP_RENAME };

    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        struct fixture f;
        struct esd_err err;
        struct stat st;
        int r = attacked_prepare(ATTACK_SWAP_LINK, steps[i], &f, &err);

        ck_assert_msg(r < 0, "step %d: prepare succeeded", (int)steps[i]);
        if (steps[i] == PREPARE_STEP_RENAME) {
            ck_assert_int_eq(r, -ESTALE);
            ck_assert_msg(strstr(err.msg, "is not the directory this prepare made"), "%s", err.msg);
            ck_assert_int_eq(lstat(f.job, &st), 0);
            ck_assert(S_ISLNK(st.st_mode));
        } else {
            ck_assert(!tu_exists(f.job));
        }
        if (steps[i] == PREPARE_STEP_FILLED)
            ck_assert_msg(strstr(err.msg, "was moved or replaced"), "%s", err.msg);
        /* what was ours, wherever the attacker moved it, was emptied */
        ck_assert_int_eq(entries_in(&f, "aside"), 0);
        fixture_free(&f);
    }
}
END_TEST

START_TEST(test_race_staging_dir)
{
    struct fixture f;
    struct esd_err err;

    if (geteuid() != 0)
        return; /* only root can make a directory that is another uid's */
    ck_assert_int_eq(attacked_prepare(ATTACK_SWAP_DIR, PREPARE_STEP_OPEN, &f, &err), -EPERM);
    ck_assert_msg(strstr(err.msg, "is owned by uid 4242, not by this prepare"), "%s", err.msg);
    /* the attacker's directory got nothing, and is still theirs */
    ck_assert_int_eq(entries_in(&f, "aside"), 0);
    ck_assert_int_eq(tu_count_entries(f.job), -1);
    {
        char *name = NULL;
        DIR *d;
        struct dirent *e;
        char *p = xasprintf("%s/p", f.dir);

        ck_assert_ptr_nonnull(d = opendir(p));
        while ((e = readdir(d)))
            if (strstr(e->d_name, ".preparing."))
                name = xasprintf("%s/%s", p, e->d_name);
        closedir(d);
        ck_assert_ptr_nonnull(name);
        ck_assert_int_eq(tu_count_entries(name), 0);
        free(name);
        free(p);
    }
    fixture_free(&f);
}
END_TEST

START_TEST(test_race_staging_full)
{
    struct fixture f;
    struct esd_err err;
    char *data;

    /* another directory of the same uid's (an older job, say) moved in:
     * neither written nor, on the failure, emptied */
    ck_assert_int_eq(attacked_prepare(ATTACK_SWAP_FULL, PREPARE_STEP_OPEN, &f, &err), -EPERM);
    ck_assert_msg(strstr(err.msg, "is not the empty directory this prepare made"), "%s", err.msg);
    {
        DIR *d;
        struct dirent *e;
        char *p = xasprintf("%s/p", f.dir);
        int found = 0;

        ck_assert_ptr_nonnull(d = opendir(p));
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, ".job.preparing.", 15)) {
                char *k = xasprintf("%s/%s/keep", p, e->d_name);

                ck_assert_ptr_nonnull(data = tu_read(k, NULL));
                ck_assert_str_eq(data, "mine\n");
                ck_assert_int_eq(entries_in(&f, e->d_name), 1);
                free(data);
                free(k);
                found++;
            }
        closedir(d);
        ck_assert_int_eq(found, 1);
        free(p);
    }
    fixture_free(&f);
}
END_TEST

START_TEST(test_race_planted_links)
{
    struct fixture f;
    struct esd_err err;
    struct stat st;

    /* at the staging name before it is made: mkdirat fails, no link followed */
    ck_assert_int_lt(attacked_prepare(ATTACK_PLANT_STAGING, PREPARE_STEP_MKDIR, &f, &err), 0);
    ck_assert_msg(strstr(err.msg, "cannot create staging directory"), "%s", err.msg);
    ck_assert(!tu_exists(f.job));
    fixture_free(&f);
    /* at the job's name while prepare runs: not renamed over, not followed */
    ck_assert_int_eq(attacked_prepare(ATTACK_PLANT_JOB, PREPARE_STEP_FILLED, &f, &err), -EEXIST);
    ck_assert_msg(strstr(err.msg, "appeared while this prepare ran"), "%s", err.msg);
    ck_assert_int_eq(lstat(f.job, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(entries_in(&f, ""), 1); /* the link; no staging left */
    fixture_free(&f);
    /* the parent itself swapped for a link after it was resolved */
    ck_assert_int_eq(attacked_prepare(ATTACK_SWAP_PARENT, PREPARE_STEP_PARENT, &f, &err), -ENOTDIR);
    ck_assert_msg(strstr(err.msg, "a symbolic link appeared there after the path was "
                                  "resolved"),
                  "%s", err.msg);
    fixture_free(&f);
}
END_TEST

START_TEST(test_reprepare_link_not_followed)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    char *input, *job, *link, *target;

    fixture_init(&f, RECIPE_PLAIN);
    input = tu_write(f.dir, "in.jsonl", "{\"a\":1}\n{\"a\":2}\n", (size_t)-1);
    ck_assert_int_eq(run_prepare(&f, input, 2, &res, &err), 0);
    prepare_result_free(&res);
    /* a job directory whose manifest is a link to a matching one */
    job = f.job;
    f.job = fs_join(f.dir, "other");
    ck_assert_int_eq(mkdir(f.job, 0755), 0);
    link = fs_join(f.job, "manifest.json");
    target = fs_join(job, "manifest.json");
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_int_eq(run_prepare(&f, input, 2, &res, &err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err.msg, "does not match this request"));
    free(link);
    free(target);
    free(job);
    free(input);
    fixture_free(&f);
}
END_TEST

START_TEST(test_owner)
{
    char *dir = tu_tmpdir(), *job = fs_join(dir, "a/b/job"), *where = NULL;
    struct esd_err err;
    uid_t uid = 1;

    /* the nearest existing ancestor of a job to be made */
    ck_assert_int_eq(prepare_owner(job, &uid, &where, &err), 0);
    ck_assert_uint_eq(uid, geteuid());
    ck_assert_str_eq(where, dir);
    free(where);
    if (geteuid() == 0) {
        ck_assert_int_eq(chown(dir, 4242, 4242), 0);
        ck_assert_int_eq(prepare_owner(job, &uid, NULL, &err), 0);
        ck_assert_uint_eq(uid, 4242);
        /* an existing job directory is its own owner's */
        free(tu_write(dir, "a/b/job/x", "", 0));
        ck_assert_int_eq(chown(job, 4343, 4343), 0);
        ck_assert_int_eq(prepare_owner(job, &uid, &where, &err), 0);
        ck_assert_uint_eq(uid, 4343);
        ck_assert_str_eq(where, job);
        free(where);
    }
    fs_rm_rf(dir);
    free(job);
    free(dir);
}
END_TEST

START_TEST(test_become)
{
    struct passwd *pw;
    struct esd_err err;
    gid_t groups[64];
    int n;

    if (geteuid() != 0)
        return; /* only root changes identity */
    /* no user database entry: refused, nothing changed */
    ck_assert_int_lt(prepare_become(3999999, &err), 0);
    ck_assert_msg(strstr(err.msg, "no entry in the user database"), "%s", err.msg);
    ck_assert_uint_eq(geteuid(), 0);
    ck_assert_ptr_nonnull(pw = getpwnam("nobody"));
    ck_assert_msg(prepare_become(pw->pw_uid, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(getuid(), pw->pw_uid);
    ck_assert_uint_eq(geteuid(), pw->pw_uid);
    ck_assert_uint_eq(getgid(), pw->pw_gid);
    ck_assert_uint_eq(getegid(), pw->pw_gid);
    /* root's groups are gone: only the user's own */
    n = getgroups(64, groups);
    ck_assert_int_ge(n, 0);
    for (int i = 0; i < n; i++)
        ck_assert_msg(groups[i] != 0 || pw->pw_gid == 0, "group 0 kept");
    ck_assert_int_lt(setuid(0), 0);
}
END_TEST

/* Every shard file's digest and size are the manifest's. */
static void
check_shard_digests(const char *job, size_t n)
{
    struct manifest m;
    struct esd_err err;

    ck_assert_int_eq(manifest_load(job, &m, &err), 0);
    ck_assert_uint_eq(m.nshards, n);
    for (size_t i = 0; i < n; i++) {
        char *path = fs_join(job, m.shards[i].path), hex[SHA256_HEX_LEN + 1];
        struct stat st;

        ck_assert_int_eq(sha256_file(path, hex, &err), 0);
        ck_assert_msg(!strcmp(hex, m.shards[i].sha256), "shard %zu", i);
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_int_eq(st.st_size, m.shards[i].size_bytes);
        free(path);
    }
    manifest_free(&m);
}

/*
 * The shard digests travel as one framed stream through 1 MiB slots: with
 * one record of 131039 bytes a shard, a shard is 131071 bytes of stream
 * (a 16-byte header, the data, a 16-byte end), and the first slot ends 8
 * bytes into the header of shard 8. Many small shards then share slots.
 */
START_TEST(test_shard_digests)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    struct buf data;
    char *input;

    fixture_init(&f, RECIPE_PLAIN);
    buf_init(&data);
    for (int i = 0; i < 12; i++)
        add_record(&data, 131039);
    input = tu_write(f.dir, "big.jsonl", data.p, data.len);
    ck_assert_msg(run_prepare(&f, input, 12, &res, &err) == 0, "%s", err.msg);
    check_shard_digests(f.job, 12);
    {
        /* the streamed "shards" array, laid out as json_dump lays out the rest */
        char *mpath = fs_join(f.job, "manifest.json"), *text = tu_read(mpath, NULL), *want;
        char hex[SHA256_HEX_LEN + 1];
        char *shard = fs_join(f.job, "shards/part-00011-of-00012.jsonl");

        ck_assert_int_eq(sha256_file(shard, hex, &err), 0);
        want = xasprintf("},\n    {\n      \"id\": \"part-00011-of-00012\",\n      \"index\": 11,"
                         "\n      \"path\": \"shards/part-00011-of-00012.jsonl\",\n      "
                         "\"rows\": 1,\n      \"sha256\": \"%s\",\n      \"size_bytes\": 131039\n"
                         "    }\n  ],\n  \"total_rows\": 12,\n",
                         hex);
        ck_assert_msg(strstr(text, want), "%s", text);
        ck_assert(strstr(text, "\n  \"shards\": [\n    {\n      \"id\": \"part-00000-of-00012\","));
        free(want);
        free(shard);
        free(text);
        free(mpath);
    }
    prepare_result_free(&res);
    fs_rm_rf(f.job);
    free(input);
    buf_free(&data);
    buf_init(&data);
    for (int i = 0; i < 3000; i++)
        add_record(&data, 20 + (size_t)(i * 7919 % 600));
    input = tu_write(f.dir, "small.jsonl", data.p, data.len);
    ck_assert_msg(run_prepare(&f, input, 2000, &res, &err) == 0, "%s", err.msg);
    check_shard_digests(f.job, 2000);
    prepare_result_free(&res);
    buf_free(&data);
    free(input);
    fixture_free(&f);
}
END_TEST

/*
 * No fsync a shard with one syncfs: five fsyncs (shards/, state/history/,
 * state/, the staging directory, the parent after the rename). With an
 * fsync of each file, all issued after the writes: the shards, the recipe
 * copy, the manifest and the same five. AUTO takes the fsyncs for few
 * shards. Both give the same job.
 */
START_TEST(test_sync_counts)
{
    enum { N = 300 };
    static const struct {
        enum prepare_sync sync;
        int fsyncs, syncfs;
    } c[] = {
        { PREPARE_SYNC_FS, 5, 1 },
        { PREPARE_SYNC_FILES, N + 2 + 5, 0 },
        { PREPARE_SYNC_AUTO, N + 2 + 5, 0 },
    };
    char first[SHA256_HEX_LEN + 1] = "";
    struct fixture f;
    struct buf data;
    char *input;

    fixture_init(&f, RECIPE_PLAIN);
    buf_init(&data);
    for (int i = 0; i < N; i++)
        add_record(&data, 40 + (size_t)i % 50);
    input = tu_write(f.dir, "in.jsonl", data.p, data.len);
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct prepare_result res;
        struct esd_err err;
        struct manifest m;

        ck_assert_msg(run_prepare_sync(&f, input, N, c[i].sync, &res, &err) == 0, "%s", err.msg);
        ck_assert_msg(fsync_calls == c[i].fsyncs, "case %zu: %d fsyncs", i, fsync_calls);
        ck_assert_int_eq(syncfs_calls, c[i].syncfs);
        check_shard_digests(f.job, N);
        ck_assert_int_eq(manifest_load(f.job, &m, &err), 0);
        if (!*first)
            memcpy(first, m.shards[N - 1].sha256, sizeof(first));
        ck_assert_str_eq(m.shards[N - 1].sha256, first);
        manifest_free(&m);
        prepare_result_free(&res);
        fs_rm_rf(f.job);
    }
    buf_free(&data);
    free(input);
    fixture_free(&f);
}
END_TEST

/* A sync that fails (the disk's write-back error) publishes nothing and
 * leaves no staging directory: syncfs, a shard's fsync, a directory's. */
START_TEST(test_sync_failure)
{
    static const struct {
        enum prepare_sync sync;
        int fail_fsync, fail_syncfs;
        const char *msg;
    } c[] = {
        { PREPARE_SYNC_FS, 0, 1, "syncfs of its file system" },
        { PREPARE_SYNC_FILES, 3, 0, "cannot fsync " }, /* recipe, manifest, shard 0 */
        { PREPARE_SYNC_FILES, 12, 0, "shards/part-00009-of-00020.jsonl" },
        { PREPARE_SYNC_FS, 2, 0, "state/history" },
    };
    struct fixture f;
    struct buf data;
    char *input;

    fixture_init(&f, RECIPE_PLAIN);
    buf_init(&data);
    for (int i = 0; i < 40; i++)
        add_record(&data, 64);
    input = tu_write(f.dir, "in.jsonl", data.p, data.len);
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct prepare_result res;
        struct esd_err err;
        int r;

        fsync_fail_at = c[i].fail_fsync;
        syncfs_fail = c[i].fail_syncfs;
        r = run_prepare_sync(&f, input, 20, c[i].sync, &res, &err);
        fsync_fail_at = syncfs_fail = 0;
        ck_assert_msg(r == -EIO, "case %zu: %d", i, r);
        ck_assert_msg(strstr(err.msg, c[i].msg), "case %zu: %s", i, err.msg);
        ck_assert(!tu_exists(f.job));
        ck_assert_int_eq(tu_count_entries(f.dir), 2); /* recipe and input only */
    }
    buf_free(&data);
    free(input);
    fixture_free(&f);
}
END_TEST

/* text as gzip members, cut at the offsets in cuts (ascending, then 0). */
static void
gzip_members(struct buf *out, const char *text, size_t n, const size_t *cuts)
{
    size_t at = 0;

    for (size_t k = 0;; k++) {
        size_t end = cuts[k] ? cuts[k] : n;
        z_stream zs = { 0 };
        size_t cap = compressBound((uLong)(end - at)) + 64;
        unsigned char *o = malloc(cap);

        ck_assert_int_eq(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
        zs.next_in = (unsigned char *)(uintptr_t)(text + at);
        zs.avail_in = (uInt)(end - at);
        zs.next_out = o;
        zs.avail_out = (uInt)cap;
        ck_assert_int_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
        buf_append(out, (char *)o, cap - zs.avail_out);
        deflateEnd(&zs);
        free(o);
        at = end;
        if (!cuts[k])
            break;
    }
}

/* text as zstd frames cut at cuts (as above), each recording its content
 * size or not. */
static void
zstd_frames(struct buf *out, const char *text, size_t n, const size_t *cuts, bool sized)
{
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    size_t at = 0;

    ck_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, sized)));
    for (size_t k = 0;; k++) {
        size_t end = cuts[k] ? cuts[k] : n, cap = ZSTD_compressBound(end - at);
        char *o = malloc(cap);
        ZSTD_inBuffer in = { text + at, end - at, 0 };
        ZSTD_outBuffer ob = { o, cap, 0 };

        if (sized)
            ck_assert(!ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(cc, end - at)));
        ck_assert_uint_eq(ZSTD_compressStream2(cc, &ob, &in, ZSTD_e_end), 0);
        buf_append(out, o, ob.pos);
        free(o);
        at = end;
        if (!cuts[k])
            break;
    }
    ZSTD_freeCCtx(cc);
}

/* dir/rel holding text as one gzip member or, for a name ending in .zst,
 * one zstd frame recording its size. */
static void
write_compressed(const char *dir, const char *rel, const char *text)
{
    const size_t one[1] = { 0 };
    struct buf b;

    buf_init(&b);
    if (zsrc_kind_of_name(rel) == ZSRC_ZSTD)
        zstd_frames(&b, text, strlen(text), one, true);
    else
        gzip_members(&b, text, strlen(text), one);
    free(tu_write(dir, rel, b.p, b.len));
    buf_free(&b);
}

START_TEST(test_compressed_inputs)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    struct manifest m;
    cJSON *doc = NULL;
    const cJSON *files;
    char *ds, *img, *all, *want;
    static const char *order[] = { "a.jsonl", "b.jsonl.gz", "c/d.json.zst", "e.JSONL.ZST" };
    static const char *kinds[] = { NULL, "gzip", "zstd", "zstd" };

    fixture_init(&f, RECIPE_PLAIN);
    ds = fs_join(f.dir, "ds");
    free(tu_write(ds, "a.jsonl", "{\"i\":1}\n", (size_t)-1));
    write_compressed(ds, "b.jsonl.gz", "{\"i\":2}\n{\"images\":[\"img/x.png\"]}\n");
    write_compressed(ds, "c/d.json.zst", "{\"i\":4}\n");
    write_compressed(ds, "e.JSONL.ZST", "{\"i\":5}\n{\"i\":6}");
    /* not inputs by name: plain .json, a bare .gz, a hidden ".jsonl.gz" */
    free(tu_write(ds, "f.json", "{}\n", (size_t)-1));
    free(tu_write(ds, "g.gz", "", 0));
    free(tu_write(ds, "h/.jsonl.gz", "", 0));
    ck_assert_msg(run_prepare(&f, ds, 2, &res, &err) == 0, "%s", err.msg);
    ck_assert(!res.unchanged);
    ck_assert_uint_eq(res.rows, 6);
    prepare_result_free(&res);
    ck_assert_int_eq(manifest_load_doc(f.job, &m, &doc, &err), 0);
    files = cJSON_GetObjectItemCaseSensitive(doc, "input_files");
    ck_assert_int_eq(cJSON_GetArraySize(files), 4);
    for (int i = 0; i < 4; i++) {
        const cJSON *x = cJSON_GetArrayItem(files, i);
        char *p = fs_join(ds, order[i]), hex[SHA256_HEX_LEN + 1];
        struct stat st;

        ck_assert_str_eq(json_get_str(x, "relative_path"), order[i]);
        /* the fingerprint is that of the raw, compressed bytes */
        ck_assert_int_eq(sha256_file(p, hex, &err), 0);
        ck_assert_str_eq(json_get_str(x, "sha256"), hex);
        ck_assert_int_eq(stat(p, &st), 0);
        ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(x, "size_bytes")->valuedouble,
                         (double)st.st_size);
        if (kinds[i])
            ck_assert_str_eq(json_get_str(x, "compression"), kinds[i]);
        else
            ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(x, "compression"));
        free(p);
    }
    manifest_free(&m);
    cJSON_Delete(doc);
    /* the shards hold the text in that order, media paths made absolute
     * against the dataset directory as for a plain file */
    {
        char *s0 = fs_join(f.job, "shards/part-00000-of-00002.jsonl");
        char *s1 = fs_join(f.job, "shards/part-00001-of-00002.jsonl");
        char *a = tu_read(s0, NULL), *b = tu_read(s1, NULL);

        all = xasprintf("%s%s", a, b);
        free(a), free(b), free(s0), free(s1);
    }
    img = fs_join(ds, "img/x.png");
    want = xasprintf(
        "{\"i\":1}\n{\"i\":2}\n{\"images\":[\"%s\"]}\n{\"i\":4}\n{\"i\":5}\n{\"i\":6}\n", img);
    ck_assert_str_eq(all, want);
    free(all), free(want), free(img);
    /* no spool left: the job holds what a plain one does */
    ck_assert_int_eq(tu_count_entries(f.job), 5);
    ck_assert_int_eq(tu_count_entries(f.dir), 3);
    /* the same request again: unchanged */
    ck_assert_msg(run_prepare(&f, ds, 2, &res, &err) == 0, "%s", err.msg);
    ck_assert(res.unchanged);
    prepare_result_free(&res);
    /* a truncated input fails, naming it, and leaves nothing, the staging
     * directory made before the scan and its spools included */
    fs_rm_rf(f.job);
    {
        char *p = fs_join(ds, "b.jsonl.gz");
        size_t len;
        char *raw = tu_read(p, &len);

        free(tu_write(ds, "b.jsonl.gz", raw, len - 5));
        free(raw);
        ck_assert_int_eq(run_prepare(&f, ds, 2, &res, &err), -EINVAL);
        ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "truncated gzip stream at byte"), "%s",
                      err.msg);
        free(p);
    }
    ck_assert(!tu_exists(f.job));
    ck_assert_int_eq(tu_count_entries(f.dir), 2);
    free(ds);
    fixture_free(&f);
}
END_TEST

/*
 * The three ways a compressed input is read give the same job as its
 * plain text: one pass, on the size its format records (one gzip member,
 * one zstd frame with its size); a second pass decompressing it again,
 * when the recorded size was wrong (the last of two members, the first of
 * two frames); its text spooled by the scan, when no size can be believed
 * (a member a record, as bgzip writes; frames without their size).
 */
START_TEST(test_compressed_paths)
{
    static const struct {
        const char *name;
        int form; /* 0 plain, 1 gzip, 2 zstd sized, 3 zstd unsized */
        int cut;  /* 0 one member or frame, 1 two (a short then a long one, or the
                     reverse for zstd), 2 a member or frame a record */
        int passes;
        bool spooled;
    } c[] = {
        { "d.jsonl", 0, 0, 1, false },     { "d.jsonl.gz", 1, 0, 1, false },
        { "d.jsonl.zst", 2, 0, 1, false }, { "d.json.gz", 1, 1, 2, false },
        { "d.json.zst", 2, 1, 2, false },  { "d.jsonl.gz", 1, 2, 2, true },
        { "d.jsonl.zst", 3, 0, 2, true },  { "d.jsonl.zst", 2, 2, 2, true },
    };
    struct fixture f;
    struct buf text, raw;
    char *want_shards = NULL, *want_sum = NULL, *want_text[3] = { NULL };

    fixture_init(&f, RECIPE_PLAIN);
    buf_init(&text);
    for (int i = 0; i < 3000; i++)
        buf_printf(&text, "{\"id\":%d,\"text\":\"%.*s\"}\n", i, 1 + (i * 37) % 200,
                   "the quick brown fox jumps over the lazy dog, again and again and again; "
                   "the quick brown fox jumps over the lazy dog, again and again and again; "
                   "the quick brown fox jumps over the lazy dog, again and again and again.");
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        size_t cuts[3001] = { 0 }, k = 0;
        struct prepare_result res;
        struct esd_err err;
        cJSON *doc = NULL;
        struct manifest m;
        char *ds = xasprintf("%s/ds%zu", f.dir, i), *sum, *shards;

        if (c[i].cut == 1)
            cuts[0] = c[i].form == 1 ? text.len / 10 : text.len * 9 / 10;
        for (const char *p = text.p;
             c[i].cut == 2 && (p = memchr(p, '\n', text.len - (size_t)(p - text.p)));)
            if ((size_t)(++p - text.p) < text.len)
                cuts[k++] = (size_t)(p - text.p);
        buf_init(&raw);
        if (c[i].form == 0)
            buf_append(&raw, text.p, text.len);
        else if (c[i].form == 1)
            gzip_members(&raw, text.p, text.len, cuts);
        else
            zstd_frames(&raw, text.p, text.len, cuts, c[i].form == 2);
        free(tu_write(ds, c[i].name, raw.p, raw.len));
        buf_free(&raw);
        ck_assert_msg(run_prepare(&f, ds, 3, &res, &err) == 0, "case %zu: %s", i, err.msg);
        ck_assert_msg(res.passes == c[i].passes && res.spooled == c[i].spooled,
                      "case %zu: %d passes, spooled %d", i, res.passes, res.spooled);
        ck_assert_uint_eq(res.rows, 3000);
        prepare_result_free(&res);
        /* nothing else in the job: no spool left */
        ck_assert_int_eq(tu_count_entries(f.job), 5);
        ck_assert_int_eq(manifest_load_doc(f.job, &m, &doc, &err), 0);
        sum = xasprintf("%s %.0f %.0f", json_get_str(doc, "normalized_sha256"),
                        cJSON_GetObjectItemCaseSensitive(doc, "total_rows")->valuedouble,
                        cJSON_GetObjectItemCaseSensitive(doc, "total_size_bytes")->valuedouble);
        shards = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(doc, "shards"));
        for (int s = 0; s < 3; s++) {
            char *p = xasprintf("%s/shards/part-%05d-of-00003.jsonl", f.job, s),
                 *got = tu_read(p, NULL);

            if (i == 0)
                want_text[s] = got;
            else
                ck_assert_msg(!strcmp(got, want_text[s]), "case %zu: shard %d differs", i, s),
                    free(got);
            free(p);
        }
        if (i == 0) {
            want_sum = sum, want_shards = shards;
        } else {
            ck_assert_str_eq(sum, want_sum);
            ck_assert_str_eq(shards, want_shards);
            free(sum), free(shards);
        }
        manifest_free(&m);
        cJSON_Delete(doc);
        fs_rm_rf(f.job);
        free(ds);
    }
    for (int s = 0; s < 3; s++)
        free(want_text[s]);
    free(want_sum), free(want_shards);
    buf_free(&text);
    fixture_free(&f);
}
END_TEST

/* A size recorded wrong on purpose (a gzip trailer's ISIZE made 4 GiB - 1):
 * one pass balances on it, and the stream's own check then fails the
 * prepare, naming the file; nothing is left. */
START_TEST(test_compressed_lying_size)
{
    struct fixture f;
    struct prepare_result res;
    struct esd_err err;
    struct buf text, raw;
    size_t cuts[1] = { 0 };
    char *ds, *p;

    fixture_init(&f, RECIPE_PLAIN);
    ds = fs_join(f.dir, "ds");
    buf_init(&text);
    buf_init(&raw);
    for (int i = 0; i < 500; i++)
        buf_printf(&text, "{\"id\":%d}\n", i);
    gzip_members(&raw, text.p, text.len, cuts);
    memset(raw.p + raw.len - 4, 0xff, 4);
    p = tu_write(ds, "d.jsonl.gz", raw.p, raw.len);
    ck_assert_int_eq(run_prepare(&f, ds, 3, &res, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "corrupt gzip data"), "%s", err.msg);
    ck_assert(!tu_exists(f.job));
    ck_assert_int_eq(tu_count_entries(f.dir), 2);
    free(p);
    free(ds);
    buf_free(&raw);
    buf_free(&text);
    fixture_free(&f);
}
END_TEST

static Suite *
prepare_suite(void)
{
    Suite *s = suite_create("prepare");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_worked_example);
    tcase_add_test(tc, test_manifest_and_bytes);
    tcase_add_test(tc, test_directory_discovery);
    tcase_add_test(tc, test_normalisation);
    tcase_add_test(tc, test_media_errors);
    tcase_add_test(tc, test_reprepare);
    tcase_add_test(tc, test_errors_leave_nothing);
    tcase_add_test(tc, test_compressed_inputs);
    tcase_add_test(tc, test_compressed_paths);
    tcase_add_test(tc, test_compressed_lying_size);
    tcase_add_test(tc, test_request_errors);
    tcase_add_test(tc, test_ray_address_warning);
    tcase_add_test(tc, test_cancel);
    tcase_add_test(tc, test_shard_digests);
    tcase_add_test(tc, test_sync_counts);
    tcase_add_test(tc, test_sync_failure);
    tcase_add_test(tc, test_race_staging_link);
    tcase_add_test(tc, test_race_staging_dir);
    tcase_add_test(tc, test_race_staging_full);
    tcase_add_test(tc, test_race_planted_links);
    tcase_add_test(tc, test_reprepare_link_not_followed);
    tcase_add_test(tc, test_owner);
    tcase_add_test(tc, test_become);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(prepare_suite());
}
