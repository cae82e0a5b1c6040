/*
 * check_attempt: one run of the processor on a claimed shard (spec §5.4–5.6,
 * §8.4–8.7, ARCHITECTURE.md "What esd adds"): the command, environment and
 * working directory of the child and what attempt.json records of them;
 * materialising Ray's export into processed.jsonl (file order, skipped
 * names, per-source metadata, every kind of invalid output naming its file
 * and line, nothing left behind on failure); finishing an attempt (done,
 * superseded, lost, failed, released) and the failure accounting by class
 * against max_retries and the infrastructure limit, including attempts
 * written by the reference and the reset by retry.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attempt.h"
#include "claim.h"
#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "retry.h"
#include "sha256.h"
#include "spawn.h"
#include "testutil.h"
#include "tries.h"
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

static bool
state_exists(const char *kind, size_t i, const char *suffix)
{
    char *path = manifest_state_path(&M, kind, id(i), suffix);
    bool r = tu_exists(path);

    free(path);
    return r;
}

/* True if path holds exactly content. */
static bool
holds(const char *path, const char *content)
{
    char *text = tu_read(path, NULL);
    bool same = text && !strcmp(text, content);

    free(text);
    return same;
}

/* A claimer for node with the given limits (< 0 / 0: the defaults). */
static void
claimer_lim(struct claimer *c, const char *node, long long max_retries, long long max_infra)
{
    char *host = xasprintf("host-%s", node);
    struct claim_opts o = {
        .node = node,
        .hostname = host,
        .max_retries = max_retries,
        .max_infra = max_infra,
    };
    struct esd_err err;

    ck_assert_msg(claimer_init(c, &M, &o, &err) == 0, "%s", err.msg);
    free(host);
}

static int
acquire(struct claimer *c, struct claim *cl, struct claim_idle *idle)
{
    struct esd_err err;
    int r = claim_acquire(c, cl, idle, &err);

    ck_assert_msg(r >= 0, "claim_acquire: %s", err.msg);
    return r;
}

/* Claims shard keep, the only one left (the others are marked done). */
static void
claim_only(struct claimer *c, size_t keep, struct claim *cl)
{
    for (size_t i = 0; i < M.nshards; i++)
        if (i != keep && !state_exists("done", i, ".json"))
            tu_put_done(&M, i);
    ck_assert_int_eq(acquire(c, cl, NULL), 1);
    ck_assert_uint_eq(cl->index, keep);
}

static cJSON *
load(const char *path)
{
    struct esd_err err;
    cJSON *j = NULL;

    ck_assert_msg(json_load_object(path, 1 << 20, &j, &err) == 0, "%s", err.msg);
    return j;
}

static cJSON *
load_attempt(const struct claim *cl)
{
    char *path = fs_join(cl->attempt_dir, "attempt.json");
    cJSON *j = load(path);

    free(path);
    return j;
}

static cJSON *
load_state(const char *kind, size_t i)
{
    char *path = manifest_state_path(&M, kind, id(i), ".json");
    cJSON *j = load(path);

    free(path);
    return j;
}

static long long
get_int(const cJSON *j, const char *key)
{
    long long v = -12345;

    ck_assert_msg(json_get_int(j, key, &v) == 0, "%s is not an integer", key);
    return v;
}

static void
put_attempt(size_t i, const char *name, const char *json)
{
    char *rel = xasprintf("attempts/%s/%s/attempt.json", id(i), name);

    free(tu_write(M.job_dir, rel, json, (size_t)-1));
    free(rel);
}

static struct tries_counts
count(size_t i)
{
    struct tries_counts n;
    struct esd_err err;

    ck_assert_msg(tries_count(&M, id(i), &n, &err) == 0, "%s", err.msg);
    return n;
}

/* Writes rel under the attempt's export directory. */
static void
put_export(const struct claim *cl, const char *rel, const char *data, size_t len)
{
    char *path = xasprintf("ray-output.jsonl/%s", rel);

    free(tu_write(cl->attempt_dir, path, data, len));
    free(path);
}

static void
materialize(const struct claim *cl, struct attempt_result *res)
{
    struct esd_err err;

    free(tu_write(cl->attempt_dir, "ray-output.jsonl", "{\"text\":\"x\"}\n", (size_t)-1));
    ck_assert_msg(attempt_materialize(&M, cl, NULL, res, &err) == 0, "%s", err.msg);
}

static struct attempt_final
finish_out(struct claimer *c, const struct claim *cl, const struct attempt_outcome *out,
           const struct attempt_result *res)
{
    struct attempt_final fin;
    struct esd_err err;

    ck_assert_msg(attempt_finish(c, cl, out, res, &fin, &err) == 0, "%s", err.msg);
    return fin;
}

static struct attempt_final
finish_ok(struct claimer *c, const struct claim *cl, const struct attempt_result *res)
{
    struct attempt_outcome out = { .return_code = 0, .duration = 2.5 };

    return finish_out(c, cl, &out, res);
}

static struct attempt_final
finish_failed(struct claimer *c, const struct claim *cl, enum failure_class fc, const char *msg)
{
    struct attempt_outcome out = { .return_code = 1, .duration = 0.25, .fc = fc, .error = msg };

    return finish_out(c, cl, &out, NULL);
}

/* A NULL-terminated vector of copies of the arguments, which end with
 * NULL (strv_free). */
static struct strv
vec(const char *first, ...)
{
    struct strv v;
    va_list ap;

    strv_init(&v);
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *))
        strv_push(&v, s);
    va_end(ap);
    return v;
}

/* Entries of a NULL-terminated vector. */
static size_t
vec_len(char *const *v)
{
    size_t n = 0;

    while (v && v[n])
        n++;
    return n;
}

/* The value of NAME in a "NAME=value" vector, or NULL (and only once). */
static const char *
env_value(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;

    for (; envp && *envp; envp++)
        if (!strncmp(*envp, name, n) && (*envp)[n] == '=') {
            ck_assert_msg(!found, "%s set twice", name);
            found = *envp + n + 1;
        }
    return found;
}

/* ---- the command ---- */

/* Checks argv after the prefix of length k: the ten flags of spec §8.4. */
static void
check_flags(const struct claim *cl, const struct attempt_cmd *cmd, size_t k, const char *ray)
{
    char *job_id = xasprintf("%s_%s_%.12s", M.job_id, cl->shard_id, cl->token);
    char *want[20];
    size_t n = 0;

    want[n++] = xstrdup("--config");
    want[n++] = fs_join(M.job_dir, "recipe.yaml");
    want[n++] = xstrdup("--dataset_path");
    want[n++] = xasprintf("%s/shards/%s.jsonl", M.job_dir, cl->shard_id);
    want[n++] = xstrdup("--export_path");
    want[n++] = fs_join(cl->attempt_dir, "ray-output.jsonl");
    want[n++] = xstrdup("--executor_type");
    want[n++] = xstrdup("ray");
    want[n++] = xstrdup("--ray_address");
    want[n++] = xstrdup(ray);
    want[n++] = xstrdup("--work_dir");
    want[n++] = fs_join(cl->attempt_dir, "work");
    want[n++] = xstrdup("--job_id");
    want[n++] = xstrdup(job_id);
    want[n++] = xstrdup("--event_log_dir");
    want[n++] = fs_join(cl->attempt_dir, "logs");
    want[n++] = xstrdup("--checkpoint_dir");
    want[n++] = fs_join(cl->attempt_dir, "checkpoints");
    want[n++] = xstrdup("--partition_dir");
    want[n++] = fs_join(cl->attempt_dir, "partitions");
    ck_assert_uint_eq(vec_len(cmd->argv), k + n);
    for (size_t i = 0; i < n; i++) {
        ck_assert_str_eq(cmd->argv[k + i], want[i]);
        free(want[i]);
    }
    ck_assert_str_eq(cmd->export_path, cmd->argv[k + 5]);
    {
        char *log = fs_join(cl->attempt_dir, "process.log");
        char *work = xasprintf("%s/work/%s", cl->attempt_dir, job_id);
        struct stat st;

        ck_assert_str_eq(cmd->log_path, log);
        /* Data-Juicer needs the resolved work directory before it starts. */
        ck_assert_int_eq(stat(work, &st), 0);
        ck_assert(S_ISDIR(st.st_mode));
        free(log);
        free(work);
    }
    free(job_id);
}

/* attempt.json records the exact argv and the export path. */
static void
check_recorded(const struct claim *cl, const struct attempt_cmd *cmd)
{
    cJSON *j = load_attempt(cl), *c = cJSON_GetObjectItemCaseSensitive(j, "command"), *it;
    char *rel = xasprintf("%s/ray-output.jsonl", cl->attempt_rel);
    size_t k = 0;

    ck_assert(cJSON_IsArray(c));
    ck_assert_int_eq(cJSON_GetArraySize(c), (int)vec_len(cmd->argv));
    cJSON_ArrayForEach(it, c)
    {
        ck_assert(cJSON_IsString(it));
        ck_assert_str_eq(it->valuestring, cmd->argv[k]);
        k++;
    }
    ck_assert_str_eq(json_get_str(j, "ray_export_path"), rel);
    /* The claim's fields stay. */
    ck_assert_str_eq(json_get_str(j, "status"), "running");
    ck_assert_str_eq(json_get_str(j, "token"), cl->token);
    cJSON_Delete(j);
    free(rel);
}

START_TEST(test_prepare_default_processor)
{
    struct strv env = vec("PATH=/usr/bin:/bin", "FOO=bar", "PYTHONPATH=/x", NULL);
    struct attempt_opts o = { .env = env.v };
    struct attempt_cmd cmd = { 0 };
    struct claimer c;
    struct claim cl;
    struct esd_err err;
    char *v;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(cmd.argv[0], "dj-process");
    check_flags(&cl, &cmd, 1, M.ray_address);
    check_recorded(&cl, &cmd);
    ck_assert_str_eq(cmd.cwd, M.job_dir);

    /* The base environment, plus the three variables of spec §8.4. */
    ck_assert_uint_eq(vec_len(cmd.envp), 6);
    ck_assert_str_eq(env_value(cmd.envp, "PATH"), "/usr/bin:/bin");
    ck_assert_str_eq(env_value(cmd.envp, "FOO"), "bar");
    ck_assert_str_eq(env_value(cmd.envp, "PYTHONPATH"), "/x");
    v = fs_join(cl.attempt_dir, "produced");
    ck_assert_str_eq(env_value(cmd.envp, "DJ_PRODUCED_DATA_DIR"), v);
    free(v);
    v = fs_join(M.job_dir, "cache");
    ck_assert_str_eq(env_value(cmd.envp, "XDG_CACHE_HOME"), v);
    free(v);
    v = fs_join(M.job_dir, "cache/huggingface");
    ck_assert_str_eq(env_value(cmd.envp, "HF_HOME"), v);
    free(v);

    attempt_cmd_free(&cmd);
    ck_assert_ptr_null(cmd.argv);
    strv_free(&env);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_prepare_processor_and_address)
{
    const char *const proc[] = { "/opt/mini-dj", "--fail-after", "3", NULL };
    char *env[] = { NULL };
    struct attempt_opts o = { .processor = proc, .ray_address = "10.1.2.3:6379", .env = env };
    struct attempt_cmd cmd = { 0 };
    struct claimer c;
    struct claim cl;
    struct esd_err err;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(cmd.argv[0], "/opt/mini-dj");
    ck_assert_str_eq(cmd.argv[1], "--fail-after");
    ck_assert_str_eq(cmd.argv[2], "3");
    check_flags(&cl, &cmd, 3, "10.1.2.3:6379");
    check_recorded(&cl, &cmd);
    ck_assert_str_eq(cmd.cwd, M.job_dir);
    ck_assert_uint_eq(vec_len(cmd.envp), 3);
    ck_assert_ptr_null(env_value(cmd.envp, "PYTHONPATH"));
    attempt_cmd_free(&cmd);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_prepare_dj_root)
{
    struct strv with = vec("PYTHONPATH=/x:/y", "HOME=/root", NULL);
    struct strv without = vec("HOME=/root", NULL);
    struct strv blank = vec("PYTHONPATH=", NULL);
    struct attempt_opts o = { .dj_root = "/opt/data-juicer", .env = with.v };
    struct attempt_cmd cmd = { 0 };
    struct claimer c;
    struct claim cl;
    struct esd_err err;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(cmd.argv[0], "python3");
    ck_assert_str_eq(cmd.argv[1], "/opt/data-juicer/tools/process_data.py");
    check_flags(&cl, &cmd, 2, M.ray_address);
    check_recorded(&cl, &cmd);
    ck_assert_str_eq(cmd.cwd, "/opt/data-juicer");
    ck_assert_str_eq(env_value(cmd.envp, "PYTHONPATH"), "/opt/data-juicer:/x:/y");
    ck_assert_str_eq(env_value(cmd.envp, "HOME"), "/root");
    attempt_cmd_free(&cmd);

    o.python = "/usr/bin/python3.11";
    o.env = without.v;
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(cmd.argv[0], "/usr/bin/python3.11");
    ck_assert_str_eq(cmd.argv[1], "/opt/data-juicer/tools/process_data.py");
    check_flags(&cl, &cmd, 2, M.ray_address);
    ck_assert_str_eq(env_value(cmd.envp, "PYTHONPATH"), "/opt/data-juicer");
    attempt_cmd_free(&cmd);

    o.env = blank.v;
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(env_value(cmd.envp, "PYTHONPATH"), "/opt/data-juicer");
    attempt_cmd_free(&cmd);
    strv_free(&with);
    strv_free(&without);
    strv_free(&blank);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_prepare_keeps_cache_settings)
{
    struct strv xdg = vec("XDG_CACHE_HOME=/var/cache/me", "DJ_PRODUCED_DATA_DIR=/elsewhere", NULL);
    struct strv hf = vec("HF_HOME=/models/hf", NULL);
    struct attempt_opts o = { .env = xdg.v };
    struct attempt_cmd cmd = { 0 };
    struct claimer c;
    struct claim cl;
    struct esd_err err;
    char *v;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(vec_len(cmd.envp), 3);
    ck_assert_str_eq(env_value(cmd.envp, "XDG_CACHE_HOME"), "/var/cache/me");
    ck_assert_str_eq(env_value(cmd.envp, "HF_HOME"), "/var/cache/me/huggingface");
    /* DJ_PRODUCED_DATA_DIR is always the attempt's. */
    v = fs_join(cl.attempt_dir, "produced");
    ck_assert_str_eq(env_value(cmd.envp, "DJ_PRODUCED_DATA_DIR"), v);
    free(v);
    attempt_cmd_free(&cmd);

    o.env = hf.v;
    ck_assert_msg(attempt_prepare(&M, &cl, &o, &cmd, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(vec_len(cmd.envp), 3);
    ck_assert_str_eq(env_value(cmd.envp, "HF_HOME"), "/models/hf");
    v = fs_join(M.job_dir, "cache");
    ck_assert_str_eq(env_value(cmd.envp, "XDG_CACHE_HOME"), v);
    free(v);
    attempt_cmd_free(&cmd);
    strv_free(&xdg);
    strv_free(&hf);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_prepare_empty_processor)
{
    static const char *const empty[] = { NULL };
    static char sentinel[] = "untouched";
    char *env[] = { NULL };
    struct attempt_opts o = { .processor = empty, .env = env };
    struct attempt_cmd cmd = { .cwd = sentinel, .log_path = sentinel, .export_path = sentinel };
    struct claimer c;
    struct claim cl;
    struct esd_err err;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_int_eq(attempt_prepare(&M, &cl, &o, &cmd, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "processor command is empty"));
    /* ret_* is written only on success. */
    ck_assert_ptr_eq(cmd.cwd, sentinel);
    ck_assert_ptr_eq(cmd.log_path, sentinel);
    ck_assert_ptr_eq(cmd.export_path, sentinel);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* ---- materialising the output ---- */

static void
check_source(const cJSON *f, const struct claim *cl, const char *rel, long long rows,
             const char *raw, size_t len)
{
    char *path = *rel ? xasprintf("%s/ray-output.jsonl/%s", cl->attempt_rel, rel)
                      : xasprintf("%s/ray-output.jsonl", cl->attempt_rel);
    char hex[SHA256_HEX_LEN + 1];

    sha256_buf(raw, len, hex);
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(json_get_str(f, "path"), path);
    ck_assert_int_eq(get_int(f, "rows"), rows);
    ck_assert_int_eq(get_int(f, "size_bytes"), (long long)len);
    ck_assert_str_eq(json_get_str(f, "sha256"), hex);
    ck_assert_int_eq(cJSON_GetArraySize(f), 4);
    free(path);
}

START_TEST(test_materialize_directory)
{
    static const char *const processed = "{\"m\":1}\n"
                                         "{\"b\":10}\n{\"b\":11}\n"
                                         "{\"a\":2}\n"
                                         "{\"y\":1}\n"
                                         "{\"x\":1}\n"
                                         "{\"x\":1}\n";
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct esd_err err;
    char *out, *dir, hex[SHA256_HEX_LEN + 1];
    const cJSON *files;
    size_t len;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    put_export(&cl, "2_a.json", "{\"a\":2}\n", (size_t)-1);
    put_export(&cl, "10_b.json", "{\"b\":10}\n{\"b\":11}", (size_t)-1);
    put_export(&cl, "sub/x.json", "{\"x\":1}\n", (size_t)-1);
    put_export(&cl, "_tmp/y.json", "{\"y\":1}\n", (size_t)-1);
    put_export(&cl, ".meta/m.json", "{\"m\":1}\n", (size_t)-1);
    put_export(&cl, "empty.json", "", 0);
    /* Skipped by their own names, wherever they are. */
    put_export(&cl, "_SUCCESS", "not json", (size_t)-1);
    put_export(&cl, ".hidden.crc", "not json\n", (size_t)-1);
    put_export(&cl, "sub/_part.json", "not json\n", (size_t)-1);
    put_export(&cl, "sub/.x.json.crc", "not json\n", (size_t)-1);
    /* A symlink to a file counts; a symlinked directory is not walked. */
    dir = fs_join(cl.attempt_dir, "ray-output.jsonl");
    {
        char *ln = fs_join(dir, "ln.json"), *sl = fs_join(dir, "sublink");

        ck_assert_int_eq(symlink("sub/x.json", ln), 0);
        ck_assert_int_eq(symlink("sub", sl), 0);
        free(ln);
        free(sl);
    }

    ck_assert_msg(attempt_materialize(&M, &cl, NULL, &res, &err) == 0, "%s", err.msg);
    out = fs_join(cl.attempt_dir, "processed.jsonl");
    ck_assert(holds(out, processed));
    len = strlen(processed);
    sha256_buf(processed, len, hex);
    ck_assert_uint_eq(res.rows, 7);
    ck_assert_uint_eq(res.size_bytes, len);
    ck_assert_str_eq(res.sha256, hex);

    /* In code point order of relative paths: "10_b" before "2_a". */
    files = res.ray_output_files;
    ck_assert_int_eq(cJSON_GetArraySize(files), 7);
    check_source(cJSON_GetArrayItem(files, 0), &cl, ".meta/m.json", 1, "{\"m\":1}\n", 8);
    check_source(cJSON_GetArrayItem(files, 1), &cl, "10_b.json", 2, "{\"b\":10}\n{\"b\":11}", 17);
    check_source(cJSON_GetArrayItem(files, 2), &cl, "2_a.json", 1, "{\"a\":2}\n", 8);
    check_source(cJSON_GetArrayItem(files, 3), &cl, "_tmp/y.json", 1, "{\"y\":1}\n", 8);
    check_source(cJSON_GetArrayItem(files, 4), &cl, "empty.json", 0, "", 0);
    check_source(cJSON_GetArrayItem(files, 5), &cl, "ln.json", 1, "{\"x\":1}\n", 8);
    check_source(cJSON_GetArrayItem(files, 6), &cl, "sub/x.json", 1, "{\"x\":1}\n", 8);
    /* attempt.json, the export and processed.jsonl: no temp file left. */
    ck_assert_int_eq(tu_count_entries(cl.attempt_dir), 3);

    attempt_result_free(&res);
    free(out);
    free(dir);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* Ray's file names, <dataset uuid>_<write uuid>_<task index, %06d>.json:
 * code point order up to task 999,999, the task index after it. */
START_TEST(test_materialize_task_order)
{
    static const char *const names[] = {
        "d_w_000000.json",  "d_w_000009.json",  "d_w_000010.json",  "d_w_999999.json",
        "d_w_1000000.json", "d_w_1000001.json", "d_w_9999999.json", "d_w_10000000.json",
    };
    /* put in reverse, and each file's row names its rank */
    static const char *const other[] = { "p-10.json", "p-2.json", "x_00000001.json" };
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct esd_err err;
    const size_t n = sizeof(names) / sizeof(*names);
    const cJSON *files;
    char *want, *rel;
    size_t len = 0;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    for (size_t i = n; i-- > 0;) {
        char row[32];

        snprintf(row, sizeof(row), "{\"i\":%zu}\n", i);
        put_export(&cl, names[i], row, (size_t)-1);
    }
    for (size_t i = 0; i < 3; i++)
        put_export(&cl, other[i], "{\"o\":1}\n", (size_t)-1);
    ck_assert_msg(attempt_materialize(&M, &cl, NULL, &res, &err) == 0, "%s", err.msg);
    files = res.ray_output_files;
    ck_assert_int_eq(cJSON_GetArraySize(files), (int)n + 3);
    for (size_t i = 0; i < n; i++) {
        rel = xasprintf("%s/ray-output.jsonl/%s", cl.attempt_rel, names[i]);
        ck_assert_str_eq(json_get_str(cJSON_GetArrayItem(files, (int)i), "path"), rel);
        free(rel);
    }
    /* other names keep the reference's order: "p-10" before "p-2"; eight
     * digits that are a small number sort as their six-digit form */
    for (size_t i = 0; i < 3; i++) {
        rel = xasprintf("%s/ray-output.jsonl/%s", cl.attempt_rel, other[i]);
        ck_assert_str_eq(json_get_str(cJSON_GetArrayItem(files, (int)(n + i)), "path"), rel);
        free(rel);
    }
    want = xmalloc(n * 16 + 32);
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(want + len, "{\"i\":%zu}\n", i);
    for (size_t i = 0; i < 3; i++)
        len += (size_t)sprintf(want + len, "{\"o\":1}\n");
    rel = fs_join(cl.attempt_dir, "processed.jsonl");
    ck_assert(holds(rel, want));
    free(rel);
    free(want);
    attempt_result_free(&res);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_materialize_file_and_empty_dir)
{
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct esd_err err;
    char *out, *exp, hex[SHA256_HEX_LEN + 1];

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    out = fs_join(cl.attempt_dir, "processed.jsonl");
    exp = fs_join(cl.attempt_dir, "ray-output.jsonl");

    /* A file export is the only source; its missing newline is added. */
    free(tu_write(cl.attempt_dir, "ray-output.jsonl", "{\"t\": \"\xc3\xa9\"}\n{\"u\":[1,2]}",
                  (size_t)-1));
    ck_assert_msg(attempt_materialize(&M, &cl, NULL, &res, &err) == 0, "%s", err.msg);
    ck_assert(holds(out, "{\"t\": \"\xc3\xa9\"}\n{\"u\":[1,2]}\n"));
    ck_assert_uint_eq(res.rows, 2);
    ck_assert_uint_eq(res.size_bytes, strlen("{\"t\": \"\xc3\xa9\"}\n{\"u\":[1,2]}\n"));
    sha256_buf("{\"t\": \"\xc3\xa9\"}\n{\"u\":[1,2]}\n", res.size_bytes, hex);
    ck_assert_str_eq(res.sha256, hex);
    ck_assert_int_eq(cJSON_GetArraySize(res.ray_output_files), 1);
    check_source(cJSON_GetArrayItem(res.ray_output_files, 0), &cl, "", 2,
                 "{\"t\": \"\xc3\xa9\"}\n{\"u\":[1,2]}", res.size_bytes - 1);
    attempt_result_free(&res);

    /* An export directory without qualifying files: a valid empty result,
     * replacing the earlier one. */
    ck_assert_int_eq(unlink(exp), 0);
    put_export(&cl, "_SUCCESS", "", 0);
    ck_assert_msg(attempt_materialize(&M, &cl, NULL, &res, &err) == 0, "%s", err.msg);
    ck_assert(holds(out, ""));
    ck_assert_uint_eq(res.rows, 0);
    ck_assert_uint_eq(res.size_bytes, 0);
    sha256_buf("", 0, hex);
    ck_assert_str_eq(res.sha256, hex);
    ck_assert(cJSON_IsArray(res.ray_output_files));
    ck_assert_int_eq(cJSON_GetArraySize(res.ray_output_files), 0);
    attempt_result_free(&res);

    free(out);
    free(exp);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

static const struct {
    const char *data;
    const char *msg; /* after "<file>:2" */
} bad_output[] = {
    { "{\"a\":1}\n\n{\"a\":3}\n", "Blank JSONL record at " },
    { "{\"a\":1}\n   \n", "Blank JSONL record at " },
    { "{\"a\":1}\n{\"a\":}\n", "Invalid JSON at " },
    { "{\"a\":1}\n[1, 2]\n", "JSONL record must be an object at " },
    { "{\"a\":1}\n\"text\"", "JSONL record must be an object at " },
    { "{\"a\":1}\n{\"a\": \"\xff\"}\n", "Invalid UTF-8 at " },
};

START_TEST(test_materialize_invalid_output)
{
    struct claimer c;
    struct claim cl;
    struct attempt_result res = { .rows = 77 };
    struct esd_err err;
    char *file, *where;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    /* A valid file first, so the output was partly written. */
    put_export(&cl, "a.json", "{\"ok\":1}\n", (size_t)-1);
    put_export(&cl, "b.json", bad_output[_i].data, (size_t)-1);
    file = xasprintf("%s/ray-output.jsonl/b.json", cl.attempt_dir);
    ck_assert_int_eq(attempt_materialize(&M, &cl, NULL, &res, &err), -EINVAL);
    where = xasprintf("%s%s:2", bad_output[_i].msg, file);
    ck_assert_msg(!strncmp(err.msg, where, strlen(where)), "message: %s", err.msg);
    ck_assert_uint_eq(res.rows, 77);
    /* attempt.json and the export: neither processed.jsonl nor its temp
     * file is left. */
    ck_assert_int_eq(tu_count_entries(cl.attempt_dir), 2);
    {
        char *out = fs_join(cl.attempt_dir, "processed.jsonl");

        ck_assert(!tu_exists(out));
        free(out);
    }
    free(where);
    free(file);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_materialize_missing_export)
{
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct esd_err err;
    char *want;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_int_eq(attempt_materialize(&M, &cl, NULL, &res, &err), -ENOENT);
    want =
        xasprintf("Data-Juicer returned 0 but did not create %s/ray-output.jsonl", cl.attempt_dir);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(tu_count_entries(cl.attempt_dir), 1);
    free(want);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_materialize_line_limit)
{
    struct jsonl_limits lim = { .max_line = 16, .max_depth = 0 };
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct esd_err err;

    claimer_lim(&c, "node-a", -1, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    put_export(&cl, "a.json", "{\"ok\":1}\n{\"long\":\"0123456789\"}\n", (size_t)-1);
    ck_assert_int_lt(attempt_materialize(&M, &cl, &lim, &res, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "a.json:2"));
    ck_assert_int_eq(tu_count_entries(cl.attempt_dir), 2);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* ---- finishing ---- */

START_TEST(test_finish_done)
{
    struct attempt_outcome out = {
        .return_code = 0,
        .duration = 2.5,
        .dj_commit = "0123abcd",
        .ray_address = "127.0.0.1:7777",
    };
    struct claimer c;
    struct claim cl, next;
    struct claim_idle idle;
    struct attempt_result res;
    struct attempt_final fin;
    char *output;
    cJSON *d, *a, *r;

    claimer_lim(&c, "node-a", -1, 0);
    claim_only(&c, 1, &cl);
    materialize(&cl, &res);
    fin = finish_out(&c, &cl, &out, &res);
    ck_assert_str_eq(fin.status, "done");
    ck_assert(fin.shard_done && !fin.shard_failed);
    ck_assert(!tu_exists(cl.lock_path));

    output = xasprintf("%s/processed.jsonl", cl.attempt_rel);
    d = load_state("done", 1);
    ck_assert_str_eq(json_get_str(d, "shard_id"), id(1));
    ck_assert_str_eq(json_get_str(d, "status"), "done");
    ck_assert_ptr_nonnull(json_get_str(d, "completed_at"));
    ck_assert_str_eq(json_get_str(d, "hostname"), "host-node-a");
    ck_assert_str_eq(json_get_str(d, "node"), "node-a");
    ck_assert_int_eq(get_int(d, "pid"), getpid());
    ck_assert_str_eq(json_get_str(d, "token"), cl.token);
    ck_assert_int_eq(get_int(d, "attempt_number"), 1);
    ck_assert_str_eq(json_get_str(d, "output_path"), output);
    ck_assert_str_eq(json_get_str(d, "executor_type"), "ray");
    ck_assert_str_eq(json_get_str(d, "ray_address"), "127.0.0.1:7777");
    ck_assert_str_eq(json_get_str(d, "data_juicer_commit"), "0123abcd");
    ck_assert_int_eq(get_int(d, "rows"), 1);
    ck_assert_int_eq(get_int(d, "size_bytes"), 13);
    ck_assert_str_eq(json_get_str(d, "sha256"), res.sha256);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(d, "ray_output_files")),
                     1);

    a = load_attempt(&cl);
    ck_assert_str_eq(json_get_str(a, "status"), "done");
    ck_assert_int_eq(get_int(a, "return_code"), 0);
    ck_assert_ptr_nonnull(json_get_str(a, "finished_at"));
    ck_assert_str_eq(json_get_str(a, "output_path"), output);
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(a, "duration_secs"));
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(a, "error"));
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(a, "failure_class"));
    r = cJSON_GetObjectItemCaseSensitive(a, "result");
    ck_assert_int_eq(get_int(r, "rows"), 1);
    ck_assert_str_eq(json_get_str(r, "sha256"), res.sha256);

    /* The claimer knows: the job is complete. */
    ck_assert_int_eq(acquire(&c, &next, &idle), 0);
    ck_assert(idle.complete && idle.terminal);
    ck_assert_uint_eq(idle.done, 3);

    cJSON_Delete(a);
    cJSON_Delete(d);
    free(output);
    attempt_result_free(&res);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_finish_done_defaults)
{
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct attempt_final fin;
    cJSON *d;

    claimer_lim(&c, "node-a", -1, 0);
    claim_only(&c, 0, &cl);
    materialize(&cl, &res);
    fin = finish_ok(&c, &cl, &res);
    ck_assert_str_eq(fin.status, "done");
    d = load_state("done", 0);
    ck_assert_str_eq(json_get_str(d, "ray_address"), M.ray_address);
    ck_assert_str_eq(json_get_str(d, "data_juicer_commit"), "unknown");
    cJSON_Delete(d);
    attempt_result_free(&res);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_finish_superseded_by_done)
{
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct attempt_final fin;
    char *done = manifest_state_path(&M, "done", id(2), ".json"), *before;
    cJSON *a;

    claimer_lim(&c, "node-a", -1, 0);
    claim_only(&c, 2, &cl);
    materialize(&cl, &res);
    tu_put_done(&M, 2);
    before = tu_read(done, NULL);
    fin = finish_ok(&c, &cl, &res);
    ck_assert_str_eq(fin.status, "superseded");
    ck_assert(fin.shard_done && !fin.shard_failed);
    ck_assert(holds(done, before));
    ck_assert(!tu_exists(cl.lock_path));
    a = load_attempt(&cl);
    ck_assert_str_eq(json_get_str(a, "status"), "superseded");
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(a, "result"));
    cJSON_Delete(a);
    free(before);
    free(done);
    attempt_result_free(&res);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_finish_superseded_by_failed)
{
    struct claimer c;
    struct claim cl;
    struct attempt_result res;
    struct attempt_final fin;
    struct esd_err err;
    char *failed = manifest_state_path(&M, "failed", id(2), ".json");
    cJSON *j = cJSON_CreateObject();

    claimer_lim(&c, "node-a", -1, 0);
    claim_only(&c, 2, &cl);
    materialize(&cl, &res);
    json_add_str(j, "shard_id", id(2));
    json_add_str(j, "status", "failed");
    ck_assert_int_eq(json_publish_excl(failed, j, JSON_PRETTY, &err), 0);
    fin = finish_ok(&c, &cl, &res);
    ck_assert_str_eq(fin.status, "superseded");
    ck_assert(!fin.shard_done && fin.shard_failed);
    ck_assert(!state_exists("done", 2, ".json"));
    ck_assert(!tu_exists(cl.lock_path));
    cJSON_Delete(j);
    free(failed);
    attempt_result_free(&res);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_finish_lost)
{
    struct claimer c;
    struct claim cl, again;
    struct attempt_result res;
    struct attempt_final fin;
    cJSON *a;

    claimer_lim(&c, "node-a", -1, 0);
    claim_only(&c, 2, &cl);
    materialize(&cl, &res);
    ck_assert_int_eq(unlink(cl.lock_path), 0);
    fin = finish_ok(&c, &cl, &res);
    ck_assert_str_eq(fin.status, "lost");
    ck_assert(!fin.shard_done && !fin.shard_failed);
    ck_assert(!state_exists("done", 2, ".json"));
    a = load_attempt(&cl);
    ck_assert_str_eq(json_get_str(a, "status"), "lost");
    ck_assert_str_eq(json_get_str(a, "failure_class"), "infrastructure");
    ck_assert_str_eq(json_get_str(a, "error"), "the lease was lost before the attempt ended");
    cJSON_Delete(a);
    ck_assert_int_eq(count(2).infra, 1);
    ck_assert_int_eq(count(2).counted, 0);
    /* Claimable again, as the next attempt. */
    ck_assert_int_eq(acquire(&c, &again, NULL), 1);
    ck_assert_int_eq(again.attempt_number, 2);

    /* A failure reported after the lease was lost is lost too. */
    ck_assert_int_eq(unlink(again.lock_path), 0);
    fin = finish_failed(&c, &again, FC_PROCESSOR, "Data-Juicer returned exit code 1");
    ck_assert_str_eq(fin.status, "lost");
    ck_assert_int_eq(count(2).infra, 2);
    ck_assert_int_eq(count(2).counted, 0);
    attempt_result_free(&res);
    claim_free(&again);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

static const enum failure_class counted_classes[] = { FC_PROCESSOR, FC_OUTPUT };

START_TEST(test_failures_use_up_retries)
{
    enum failure_class fc = counted_classes[_i];
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    struct attempt_final fin;
    struct strv ids, req;
    struct esd_err err;
    char *log = NULL;
    cJSON *f, *a;

    claimer_lim(&c, "node-a", 3, 0);
    for (int k = 1; k <= 4; k++) {
        struct tries_counts n;

        if (k == 1)
            claim_only(&c, 2, &cl);
        else
            ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
        ck_assert_uint_eq(cl.index, 2);
        ck_assert_int_eq(cl.attempt_number, k);
        n = count(2);
        ck_assert_int_eq(n.attempts, k);
        ck_assert_int_eq(n.counted, k - 1);
        ck_assert_int_eq(n.infra, 0);
        fin = finish_failed(&c, &cl, fc, "Data-Juicer returned exit code 1");
        ck_assert_str_eq(fin.status, "failed");
        ck_assert(!fin.shard_done);
        ck_assert(!tu_exists(cl.lock_path));
        ck_assert_int_eq(count(2).counted, k);
        a = load_attempt(&cl);
        ck_assert_str_eq(json_get_str(a, "status"), "failed");
        ck_assert_str_eq(json_get_str(a, "failure_class"), attempt_class_name(fc));
        ck_assert_str_eq(json_get_str(a, "error"), "Data-Juicer returned exit code 1");
        ck_assert_int_eq(get_int(a, "return_code"), 1);
        ck_assert_ptr_nonnull(json_get_str(a, "finished_at"));
        ck_assert_ptr_nonnull(json_get_str(a, "output_path"));
        cJSON_Delete(a);
        if (k < 4) {
            ck_assert(!fin.shard_failed);
            ck_assert(!state_exists("failed", 2, ".json"));
            claim_free(&cl);
        }
    }
    /* The fourth counted failure exceeds max_retries 3. */
    ck_assert(fin.shard_failed);
    f = load_state("failed", 2);
    log = xasprintf("%s/process.log", cl.attempt_rel);
    ck_assert_str_eq(json_get_str(f, "shard_id"), id(2));
    ck_assert_str_eq(json_get_str(f, "status"), "failed");
    ck_assert_ptr_nonnull(json_get_str(f, "failed_at"));
    ck_assert_int_eq(get_int(f, "failures"), 4);
    ck_assert_str_eq(json_get_str(f, "last_error"), "Data-Juicer returned exit code 1");
    ck_assert_int_eq(get_int(f, "last_attempt"), 4);
    ck_assert_str_eq(json_get_str(f, "last_log"), log);
    ck_assert_str_eq(json_get_str(f, "failure_class"), attempt_class_name(fc));
    ck_assert_str_eq(json_get_str(f, "node"), "node-a");
    cJSON_Delete(f);
    claim_free(&cl);
    ck_assert(!state_exists("locks", 2, ".lock"));

    /* Terminal: no further claims. */
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.terminal && !idle.complete);
    ck_assert_uint_eq(idle.failed, 1);

    /* Retry moves the attempts away: the next claim is attempt 1 again,
     * with nothing counted. */
    strv_init(&ids);
    strv_init(&req);
    strv_push(&ids, id(2));
    ck_assert_msg(retry_run(&M, false, &ids, &req, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(req.n, 1);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0); /* the idle pass sees the requeue */
    ck_assert_int_eq(acquire(&c, &cl, &idle), 1);
    ck_assert_uint_eq(cl.index, 2);
    ck_assert_int_eq(cl.attempt_number, 1);
    ck_assert_int_eq(count(2).attempts, 1);
    ck_assert_int_eq(count(2).counted, 0);
    fin = finish_failed(&c, &cl, fc, "again");
    ck_assert(!fin.shard_failed);
    ck_assert(!state_exists("failed", 2, ".json"));

    strv_free(&ids);
    strv_free(&req);
    free(log);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_infra_failures_spare_retries)
{
    struct claimer c;
    struct claim cl;
    struct attempt_final fin;
    struct tries_counts n;

    claimer_lim(&c, "node-a", 3, 0);
    for (int k = 1; k <= 5; k++) {
        if (k == 1)
            claim_only(&c, 0, &cl);
        else
            ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
        ck_assert_int_eq(cl.attempt_number, k);
        fin = finish_failed(&c, &cl, FC_INFRASTRUCTURE, "the Ray head is down");
        ck_assert_str_eq(fin.status, "failed");
        ck_assert(!fin.shard_failed);
        claim_free(&cl);
    }
    n = count(0);
    ck_assert_int_eq(n.attempts, 5);
    ck_assert_int_eq(n.counted, 0);
    ck_assert_int_eq(n.infra, 5);
    ck_assert(!state_exists("failed", 0, ".json"));
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_int_eq(cl.attempt_number, 6);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_infra_limit)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    struct attempt_final fin;
    cJSON *f;

    claimer_lim(&c, "node-a", 3, 2);
    for (int k = 1; k <= 3; k++) {
        if (k == 1)
            claim_only(&c, 0, &cl);
        else
            ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
        fin = finish_failed(&c, &cl, FC_INFRASTRUCTURE, "the Ray head is down");
        ck_assert_str_eq(fin.status, "failed");
        ck_assert(fin.shard_failed == (k == 3));
        ck_assert(state_exists("failed", 0, ".json") == (k == 3));
        claim_free(&cl);
    }
    f = load_state("failed", 0);
    ck_assert_int_eq(get_int(f, "failures"), 0);
    ck_assert_int_eq(get_int(f, "infrastructure_failures"), 3);
    ck_assert_str_eq(json_get_str(f, "failure_class"), "infrastructure");
    ck_assert_str_eq(json_get_str(f, "last_error"), "the Ray head is down");
    ck_assert_int_eq(get_int(f, "last_attempt"), 3);
    cJSON_Delete(f);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.terminal);
    claimer_free(&c);
}
END_TEST

START_TEST(test_released_counts_nothing)
{
    struct attempt_outcome out = { .return_code = -15, .released = true, .error = "draining" };
    struct claimer c;
    struct claim cl;
    struct attempt_final fin;
    struct tries_counts n;
    cJSON *a;

    claimer_lim(&c, "node-a", 0, 1);
    for (int k = 1; k <= 3; k++) {
        if (k == 1)
            claim_only(&c, 1, &cl);
        else
            ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
        ck_assert_int_eq(cl.attempt_number, k);
        fin = finish_out(&c, &cl, &out, NULL);
        ck_assert_str_eq(fin.status, "released");
        ck_assert(!fin.shard_done && !fin.shard_failed);
        ck_assert(!tu_exists(cl.lock_path));
        a = load_attempt(&cl);
        ck_assert_str_eq(json_get_str(a, "status"), "released");
        ck_assert_str_eq(json_get_str(a, "error"), "draining");
        cJSON_Delete(a);
        claim_free(&cl);
    }
    n = count(1);
    ck_assert_int_eq(n.attempts, 3);
    ck_assert_int_eq(n.counted, 0);
    ck_assert_int_eq(n.infra, 0);
    ck_assert(!state_exists("failed", 1, ".json"));
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* A well-formed attempt name with number k (its token derived from k). */
static const char *
aname(int k)
{
    static char name[64];

    snprintf(name, sizeof(name), "%04d-%032x", k, (unsigned)k);
    return name;
}

static char *
attempts_dir(size_t i)
{
    return xasprintf("%s/attempts/%s", M.job_dir, id(i));
}

START_TEST(test_count_reference_attempts)
{
    struct tries_counts n = count(0);

    ck_assert_int_eq(n.attempts, 0);
    ck_assert_int_eq(n.counted, 0);
    ck_assert_int_eq(n.infra, 0);
    /* Written by the reference: no failure_class. */
    put_attempt(0, aname(1), "{\"status\": \"failed\"}\n");
    put_attempt(0, aname(2), "{\"status\": \"stale\", \"stale_at\": \"x\"}\n");
    put_attempt(0, aname(3), "{\"status\": \"running\"}\n");
    put_attempt(0, aname(4), "{\"status\": \"lost\"}\n");
    put_attempt(0, aname(5), "{\"status\": \"superseded\"}\n");
    put_attempt(0, aname(6), "{\"status\": \"failed\"");
    put_attempt(0, aname(7), "[\"failed\"]\n");
    /* Written by esd. */
    put_attempt(0, aname(8), "{\"status\": \"failed\", \"failure_class\": \"infrastructure\"}\n");
    put_attempt(0, aname(9), "{\"status\": \"released\", \"failure_class\": \"infrastructure\"}\n");
    put_attempt(0, aname(10), "{\"status\": \"failed\", \"failure_class\": \"output\"}\n");
    put_attempt(0, aname(11), "{\"status\": \"stale\", \"failure_class\": \"infrastructure\"}\n");
    put_attempt(0, aname(12), "{\"status\": \"failed\", \"failure_class\": \"processor\"}\n");
    {
        /* A directory without attempt.json is an attempt; a file is not. */
        char *rel = xasprintf("attempts/%s/%s/process.log", id(0), aname(13));
        char *f = xasprintf("attempts/%s/notes.txt", id(0));

        free(tu_write(M.job_dir, rel, "", 0));
        free(tu_write(M.job_dir, f, "{\"status\": \"failed\"}\n", (size_t)-1));
        free(rel);
        free(f);
    }
    n = count(0);
    ck_assert_int_eq(n.attempts, 13);
    ck_assert_int_eq(n.counted, 3);
    ck_assert_int_eq(n.infra, 3);
}
END_TEST

/* The reference's count (spec §8.3 step 4): attempt.json statuses "failed"
 * and "stale", nothing else, whatever else the record says. */
static long long
reference_count(size_t i)
{
    char *dir = attempts_dir(i), *cmd, line[64] = "";
    long long n = -1;
    FILE *p;

    cmd = xasprintf("cat '%s'/*/attempt.json 2>/dev/null | "
                    "grep -cE '\"status\": \"(failed|stale)\"' || true",
                    dir);
    ck_assert_ptr_nonnull(p = popen(cmd, "r"));
    if (fgets(line, sizeof(line), p))
        n = atoll(line);
    pclose(p);
    free(cmd);
    free(dir);
    return n;
}

START_TEST(test_infra_failures_skipped_by_the_reference)
{
    struct claimer c;
    struct claim cl;
    struct attempt_final fin;
    cJSON *a;

    claimer_lim(&c, "node-a", 3, 0);
    claim_only(&c, 0, &cl);
    fin = finish_failed(&c, &cl, FC_INFRASTRUCTURE, "No space left on device");
    /* esd's own view: a failure, of the infrastructure */
    ck_assert_str_eq(fin.status, "failed");
    ck_assert(!fin.counted);
    a = load_attempt(&cl);
    ck_assert_str_eq(json_get_str(a, "status"), ATTEMPT_STATUS_INFRA);
    ck_assert_str_eq(json_get_str(a, "failure_class"), "infrastructure");
    cJSON_Delete(a);
    claim_free(&cl);
    ck_assert_int_eq(count(0).infra, 1);
    ck_assert_int_eq(count(0).counted, 0);
    /* the reference's worker does not count it toward max_retries ... */
    ck_assert_int_eq(reference_count(0), 0);
    /* ... but does count a processor failure, as esd does */
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    fin = finish_failed(&c, &cl, FC_PROCESSOR, "Data-Juicer returned exit code 1");
    ck_assert(fin.counted);
    ck_assert_int_eq(reference_count(0), 1);
    ck_assert_int_eq(count(0).counted, 1);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

static struct tries_counts
count_by(size_t i, const char *node)
{
    struct tries_counts n;
    struct esd_err err;

    ck_assert_msg(tries_count_by(&M, id(i), node, &n, &err) == 0, "%s", err.msg);
    return n;
}

START_TEST(test_count_by_node)
{
    struct tries_counts n;

    ck_assert_int_eq(count_by(0, "a").nodes, 0);
    put_attempt(0, aname(1),
                "{\"status\": \"failed\", \"failure_class\": \"processor\", "
                "\"node\": \"a\", \"hostname\": \"h\"}\n");
    put_attempt(0, aname(2),
                "{\"status\": \"infra_failed\", \"failure_class\": "
                "\"infrastructure\", \"node\": \"b\"}\n");
    put_attempt(0, aname(3),
                "{\"status\": \"failed\", \"failure_class\": \"output\", "
                "\"node\": \"a\"}\n");
    n = count_by(0, "a");
    ck_assert_int_eq(n.counted, 2);
    ck_assert_int_eq(n.here, 2);
    ck_assert_int_eq(n.nodes, 1); /* b's infrastructure failure is not b's to answer for */
    ck_assert_int_eq(count_by(0, "b").here, 0);
    ck_assert_int_eq(count_by(0, NULL).here, 0);
    /* a reference worker: known by its hostname */
    put_attempt(0, aname(4), "{\"status\": \"failed\", \"hostname\": \"ref-host\"}\n");
    n = count_by(0, "ref-host");
    ck_assert_int_eq(n.counted, 3);
    ck_assert_int_eq(n.here, 1);
    ck_assert_int_eq(n.nodes, 2);
    /* a failure that names nobody is a node of its own */
    put_attempt(1, aname(1), "{\"status\": \"failed\", \"node\": \"a\"}\n");
    put_attempt(1, aname(2), "{\"status\": \"failed\"}\n");
    ck_assert_int_eq(count_by(1, "a").nodes, 2);
}
END_TEST

/* Fails shard 2's attempts on c until its max_retries (1) are used up. */
static struct attempt_final
fail_twice(struct claimer *c, bool first)
{
    struct attempt_final fin = { 0 };
    struct claim cl;

    for (int k = 0; k < 2; k++) {
        if (first && k == 0)
            claim_only(c, 2, &cl);
        else
            ck_assert_int_eq(acquire(c, &cl, NULL), 1);
        ck_assert_uint_eq(cl.index, 2);
        fin = finish_failed(c, &cl, FC_PROCESSOR, "Data-Juicer returned exit code 1");
        ck_assert_uint_eq(fin.index, 2);
        claim_free(&cl);
    }
    return fin;
}

START_TEST(test_one_node_cannot_fail_a_shard)
{
    struct claimer a, b;
    struct claim cl;
    struct attempt_final fin;
    struct claim_idle idle;
    struct tries_counts n;
    cJSON *f;

    claimer_lim(&a, "node-a", 1, 0);
    claimer_lim(&b, "node-b", 1, 0); /* (its state/clock/node-b: alive) */
    fin = fail_twice(&a, true);
    /* node-a used up max_retries alone while node-b lives: left to node-b */
    ck_assert(fin.shard_left && !fin.shard_failed);
    ck_assert(!state_exists("failed", 2, ".json"));
    ck_assert(!state_exists("locks", 2, ".lock"));
    ck_assert_int_eq(acquire(&a, &cl, &idle), 0);
    ck_assert(!idle.terminal);
    ck_assert(!state_exists("failed", 2, ".json"));
    /* node-b has not tried it: it may */
    ck_assert_int_eq(acquire(&b, &cl, NULL), 1);
    ck_assert_uint_eq(cl.index, 2);
    n = count_by(2, "node-b");
    ck_assert_int_eq(n.counted, 2);
    ck_assert_int_eq(n.here, 0);
    /* and once two nodes failed it, it is terminal */
    fin = finish_failed(&b, &cl, FC_PROCESSOR, "Data-Juicer returned exit code 1");
    ck_assert(fin.shard_failed && !fin.shard_left);
    f = load_state("failed", 2);
    ck_assert_int_eq(get_int(f, "failures"), 3);
    cJSON_Delete(f);
    claim_free(&cl);
    claimer_free(&a);
    claimer_free(&b);
}
END_TEST

START_TEST(test_one_node_fleet_still_fails_a_shard)
{
    struct claimer a, b;
    struct attempt_final fin;
    char *clock_b = fs_join(M.job_dir, "state/clock/node-b");
    char *lock = fs_join(M.job_dir, "state/locks/other.lock");

    claimer_lim(&a, "node-a", 1, 0);
    claimer_lim(&b, "node-b", 1, 0);
    claimer_free(&b);
    /* node-b went quiet long ago, but holds a lock it renews: alive */
    tu_set_age(clock_b, 10 * TRIES_PEER_ALIVE_SECS);
    free(tu_write(M.job_dir, "state/locks/other.lock", "{\"node\": \"node-b\"}\n", (size_t)-1));
    fin = fail_twice(&a, true);
    ck_assert(fin.shard_left);
    ck_assert(!state_exists("failed", 2, ".json"));
    /* its lock gone stale as well (a lock of node-a's own never counts):
     * no other node lives, and node-a's failures are terminal */
    tu_set_age(lock, 10 * TRIES_PEER_ALIVE_SECS);
    free(tu_write(M.job_dir, "state/locks/mine.lock", "{\"node\": \"node-a\"}\n", (size_t)-1));
    ck_assert_int_eq(acquire(&a, &(struct claim){ 0 }, NULL), 0);
    ck_assert(state_exists("failed", 2, ".json"));
    free(clock_b);
    free(lock);
    claimer_free(&a);
}
END_TEST

/* Junk in attempts/<shard>/ is neither counted nor numbered. */
START_TEST(test_count_ignores_junk)
{
    static const char *const junk[] = {
        "0004-x",                                  /* short token */
        "004-0123456789abcdef0123456789abcdef",    /* 3 digits */
        "0123456789-0123456789abcdef0123456789ab", /* 10 digits */
        "0004-0123456789ABCDEF0123456789abcdef",   /* upper case */
        "0004-0123456789abcdef0123456789abcdeg",   /* not hex */
        "0004-0123456789abcdef0123456789abcdef0",  /* 33 */
        "0004-0123456789abcdef0123456789abcde",    /* 31 */
        "0004_0123456789abcdef0123456789abcdef",
        "+004-0123456789abcdef0123456789abcdef",
        "9999-0123456789abcdef0123456789abcdef.tmp",
        "attempt",
    };
    const char *failed = "{\"status\": \"failed\", \"failure_class\": \"processor\"}\n";
    char *dir = attempts_dir(1), *target, *link;
    struct claimer c;
    struct claim cl;
    struct tries_counts n;

    for (int k = 1; k <= 3; k++)
        put_attempt(1, aname(k), failed);
    for (size_t k = 0; k < sizeof(junk) / sizeof(junk[0]); k++)
        put_attempt(1, junk[k], failed);
    /* A well-formed name that is a file, or a link to an attempt. */
    free(tu_write(dir, aname(90), failed, (size_t)-1));
    target = fs_join(dir, aname(1));
    link = fs_join(dir, aname(91));
    ck_assert_int_eq(symlink(target, link), 0);
    n = count(1);
    ck_assert_int_eq(n.attempts, 3);
    ck_assert_int_eq(n.counted, 3);
    ck_assert_int_eq(n.infra, 0);
    /* The next claim is attempt 4, not shifted by the junk. */
    claimer_lim(&c, "node-a", 5, 0);
    claim_only(&c, 1, &cl);
    ck_assert_int_eq(cl.attempt_number, 4);
    ck_assert_ptr_nonnull(strstr(cl.attempt_rel, "/0004-"));
    claim_free(&cl);
    claimer_free(&c);
    free(target);
    free(link);
    free(dir);
}
END_TEST

/* Numbers continue after the highest, and agree with the reference's
 * count + 1 where that does not repeat a number. */
START_TEST(test_count_numbering)
{
    const char *ok = "{\"status\": \"lost\"}\n";
    char name[64];

    /* a gap: 2..6 were removed by hand */
    put_attempt(0, aname(1), ok);
    put_attempt(0, aname(7), ok);
    ck_assert_int_eq(count(0).attempts, 7);
    /* concurrent reference claims repeated a number: the count wins */
    put_attempt(2, aname(1), ok);
    snprintf(name, sizeof(name), "0001-%032x", 0xbeefu);
    put_attempt(2, name, ok);
    put_attempt(2, aname(2), ok);
    ck_assert_int_eq(count(2).attempts, 3);
    /* five digits after 9999, as "%04d" writes them */
    put_attempt(1, "10000-0123456789abcdef0123456789abcdef", ok);
    ck_assert_int_eq(count(1).attempts, 10000);
}
END_TEST

/* A FIFO, a device or a link as attempt.json is not waited on, not
 * followed, and not modified. */
START_TEST(test_attempt_json_fifo_and_links)
{
    char *dir = attempts_dir(0), *sub, *fifo, *outside, *link, *rel;
    struct esd_err err;
    struct tries_counts n;
    double t0 = time_mono();

    /* The test must end promptly, never hang on the FIFO. */
    alarm(10);
    sub = fs_join(dir, aname(1));
    fifo = fs_join(sub, "attempt.json");
    ck_assert_int_eq(fs_mkdir_p(sub, 0755, NULL), 0);
    ck_assert_int_eq(mkfifo(fifo, 0644), 0);
    /* A file outside the job: a running attempt that fails, if followed. */
    outside = tu_write(tmp, "outside.json",
                       "{\"status\": \"failed\", \"failure_class\": \"processor\"}\n", (size_t)-1);
    free(sub);
    sub = fs_join(dir, aname(2));
    ck_assert_int_eq(fs_mkdir_p(sub, 0755, NULL), 0);
    link = fs_join(sub, "attempt.json");
    ck_assert_int_eq(symlink(outside, link), 0);
    free(link);
    free(sub);
    sub = fs_join(dir, aname(3));
    ck_assert_int_eq(fs_mkdir_p(sub, 0755, NULL), 0);
    link = fs_join(sub, "attempt.json");
    ck_assert_int_eq(symlink("/dev/zero", link), 0);
    n = count(0);
    ck_assert_int_eq(n.attempts, 3);
    ck_assert_int_eq(n.counted, 0);
    ck_assert_int_eq(n.infra, 0);
    /* Marking stale: nothing to mark, and nothing written through. */
    free(tu_write(tmp, "outside.json", "{\"status\": \"running\"}\n", (size_t)-1));
    for (int k = 1; k <= 3; k++) {
        rel = xasprintf("attempts/%s/%s", id(0), aname(k));
        ck_assert_int_eq(tries_mark_stale(&M, rel, &err), 0);
        free(rel);
    }
    ck_assert(holds(outside, "{\"status\": \"running\"}\n"));
    {
        struct stat st;

        ck_assert_int_eq(lstat(fifo, &st), 0);
        ck_assert(S_ISFIFO(st.st_mode));
        ck_assert_int_eq(lstat(link, &st), 0);
        ck_assert(S_ISLNK(st.st_mode));
    }
    ck_assert(time_mono() - t0 < 5.0);
    alarm(0);
    free(link);
    free(sub);
    free(outside);
    free(fifo);
    free(dir);
}
END_TEST

/* attempt.json replaced by a link to a file its owner cannot read: the
 * attempt's end does not copy that file into the attempt. */
START_TEST(test_finish_does_not_follow_link)
{
    struct claimer c;
    struct claim cl;
    struct attempt_final fin;
    char *meta, *secret;
    cJSON *j;

    claimer_lim(&c, "node-a", 5, 0);
    claim_only(&c, 0, &cl);
    secret = tu_write(tmp, "secret.json", "{\"secret\": \"s3cret\", \"status\": \"running\"}\n",
                      (size_t)-1);
    ck_assert_int_eq(chmod(secret, 0600), 0);
    meta = fs_join(cl.attempt_dir, "attempt.json");
    ck_assert_int_eq(unlink(meta), 0);
    ck_assert_int_eq(symlink(secret, meta), 0);
    fin = finish_failed(&c, &cl, FC_PROCESSOR, "boom");
    ck_assert_str_eq(fin.status, "failed");
    j = load(meta);
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "secret"));
    ck_assert_str_eq(json_get_str(j, "status"), "failed");
    ck_assert_str_eq(json_get_str(j, "error"), "boom");
    cJSON_Delete(j);
    ck_assert(holds(secret, "{\"secret\": \"s3cret\", \"status\": \"running\"}\n"));
    claim_free(&cl);
    claimer_free(&c);
    free(meta);
    free(secret);
}
END_TEST

/* Creates k empty files named junk-<n> in dir. */
static void
put_junk(const char *dir, int from, int k)
{
    for (int n = from; n < from + k; n++) {
        char *path = xasprintf("%s/junk-%d", dir, n);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);

        ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
        close(fd);
        free(path);
    }
}

/* The count looks at no more than 8192 entries (then counts what it saw)
 * and reads at most 1024 attempts: past that, this shard is not claimed
 * (the message names the directory), the others still are. */
START_TEST(test_count_cap)
{
    char *dir = attempts_dir(0);
    struct tries_counts n;
    struct esd_err err;
    struct claimer c;
    struct claim cl;
    int claimed = 0, errors = 0;

    put_attempt(0, aname(1), "{\"status\": \"failed\"}\n");
    put_junk(dir, 0, 8191);
    n = count(0); /* 8192 entries: all looked at */
    ck_assert_int_eq(n.attempts, 1);
    ck_assert_int_eq(n.counted, 1);
    ck_assert(!n.truncated);
    put_junk(dir, 8191, 1);
    n = count(0); /* more: a count of what was seen, no error */
    ck_assert(n.truncated);
    ck_assert_int_le(n.attempts, 1);
    fs_rm_rf(dir);
    for (int k = 1; k <= 1025; k++) {
        char *sub = xasprintf("%s/%s", dir, aname(k));

        ck_assert_int_eq(fs_mkdir_p(sub, 0755, NULL), 0);
        free(sub);
    }
    ck_assert_int_eq(tries_count(&M, id(0), &n, &err), -E2BIG);
    ck_assert_msg(strstr(err.msg, dir) && strstr(err.msg, "1024"), "%s", err.msg);

    /* A node whose passes start at shard 0, so that it is met first. */
    for (int k = 0;; k++) {
        char node[32];

        snprintf(node, sizeof(node), "node-%d", k);
        claimer_lim(&c, node, 5, 0);
        if (c.cursor == 0)
            break;
        claimer_free(&c);
    }
    for (int pass = 0; pass < 4 && claimed < 2; pass++) {
        int r = claim_acquire(&c, &cl, NULL, &err);

        if (r < 0) {
            ck_assert_msg(strstr(err.msg, dir), "%s", err.msg);
            errors++;
            continue;
        }
        ck_assert_int_eq(r, 1);
        ck_assert_uint_ne(cl.index, 0);
        claimed++;
        claim_free(&cl);
    }
    ck_assert_int_eq(claimed, 2);
    ck_assert_int_eq(errors, 1);
    ck_assert(!state_exists("locks", 0, ".lock"));
    ck_assert(!state_exists("failed", 0, ".json"));
    claimer_free(&c);
    free(dir);
}
END_TEST

/* At most 32 MiB of attempt.json is read in one count. */
START_TEST(test_count_byte_budget)
{
    struct tries_counts n;
    struct esd_err err;

    for (int k = 1; k <= 4; k++) {
        char *rel = xasprintf("attempts/%s/%s/attempt.json", id(0), aname(k));
        char *path = tu_write(M.job_dir, rel, "", 0);

        /* sparse: 12 MiB of zeros, costing no disk */
        ck_assert_int_eq(truncate(path, (off_t)12 << 20), 0);
        free(path);
        free(rel);
        if (k == 3) {
            n = count(0);
            ck_assert_int_eq(n.attempts, 3);
        }
    }
    ck_assert_int_eq(tries_count(&M, id(0), &n, &err), -E2BIG);
    ck_assert_ptr_nonnull(strstr(err.msg, "attempt.json"));
}
END_TEST

START_TEST(test_mark_stale)
{
    struct esd_err err;
    char *rel = xasprintf("attempts/%s/0001-a", id(0)), *path;
    cJSON *j;

    put_attempt(0, "0001-a", "{\"status\": \"failed\", \"error\": \"x\"}\n");
    path = xasprintf("%s/%s/attempt.json", M.job_dir, rel);
    /* Only a running attempt is marked. */
    ck_assert_int_eq(tries_mark_stale(&M, rel, &err), 0);
    ck_assert(holds(path, "{\"status\": \"failed\", \"error\": \"x\"}\n"));
    put_attempt(0, "0001-a", "{\"status\": \"running\", \"token\": \"t\"}\n");
    ck_assert_int_eq(tries_mark_stale(&M, rel, &err), 0);
    j = load(path);
    ck_assert_str_eq(json_get_str(j, "status"), "stale");
    ck_assert_str_eq(json_get_str(j, "token"), "t");
    ck_assert_ptr_nonnull(json_get_str(j, "stale_at"));
    ck_assert_str_eq(json_get_str(j, "failure_class"), "infrastructure");
    cJSON_Delete(j);
    /* Missing: nothing to mark. Outside the job: refused. */
    ck_assert_int_eq(tries_mark_stale(&M, "attempts/none/0001-x", &err), 0);
    ck_assert_int_lt(tries_mark_stale(&M, "../outside", &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "escapes"));
    free(path);
    free(rel);
}
END_TEST

START_TEST(test_class_names)
{
    ck_assert_ptr_null(attempt_class_name(FC_NONE));
    ck_assert_str_eq(attempt_class_name(FC_PROCESSOR), "processor");
    ck_assert_str_eq(attempt_class_name(FC_OUTPUT), "output");
    ck_assert_str_eq(attempt_class_name(FC_INFRASTRUCTURE), "infrastructure");
}
END_TEST

static Suite *
attempt_suite(void)
{
    Suite *s = suite_create("attempt");
    TCase *tc = tcase_create("attempt");

    tcase_add_checked_fixture(tc, job_setup, job_teardown);
    tcase_add_test(tc, test_prepare_default_processor);
    tcase_add_test(tc, test_prepare_processor_and_address);
    tcase_add_test(tc, test_prepare_dj_root);
    tcase_add_test(tc, test_prepare_keeps_cache_settings);
    tcase_add_test(tc, test_prepare_empty_processor);
    tcase_add_test(tc, test_materialize_directory);
    tcase_add_test(tc, test_materialize_task_order);
    tcase_add_test(tc, test_materialize_file_and_empty_dir);
    tcase_add_loop_test(tc, test_materialize_invalid_output, 0,
                        (int)(sizeof(bad_output) / sizeof(bad_output[0])));
    tcase_add_test(tc, test_materialize_missing_export);
    tcase_add_test(tc, test_materialize_line_limit);
    tcase_add_test(tc, test_finish_done);
    tcase_add_test(tc, test_finish_done_defaults);
    tcase_add_test(tc, test_finish_superseded_by_done);
    tcase_add_test(tc, test_finish_superseded_by_failed);
    tcase_add_test(tc, test_finish_lost);
    tcase_add_loop_test(tc, test_failures_use_up_retries, 0,
                        (int)(sizeof(counted_classes) / sizeof(counted_classes[0])));
    tcase_add_test(tc, test_infra_failures_spare_retries);
    tcase_add_test(tc, test_infra_limit);
    tcase_add_test(tc, test_released_counts_nothing);
    tcase_add_test(tc, test_count_reference_attempts);
    tcase_add_test(tc, test_count_ignores_junk);
    tcase_add_test(tc, test_infra_failures_skipped_by_the_reference);
    tcase_add_test(tc, test_count_by_node);
    tcase_add_test(tc, test_one_node_cannot_fail_a_shard);
    tcase_add_test(tc, test_one_node_fleet_still_fails_a_shard);
    tcase_add_test(tc, test_count_numbering);
    tcase_add_test(tc, test_attempt_json_fifo_and_links);
    tcase_add_test(tc, test_finish_does_not_follow_link);
    tcase_add_test(tc, test_count_cap);
    tcase_add_test(tc, test_count_byte_budget);
    tcase_add_test(tc, test_mark_stale);
    tcase_add_test(tc, test_class_names);
    suite_add_tcase(s, tc);

    return s;
}

int
main(void)
{
    json_init();
    return tu_run(attempt_suite());
}
