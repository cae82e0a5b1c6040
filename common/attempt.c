/*
 * attempt: the child's command, output materialisation and validation,
 * publication and the final attempt.json (the counting is tries.c's).
 */
#include "attempt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "pypath.h"
#include "tries.h"

extern char **environ;

static const char *const class_names[] = {
    [FC_NONE] = NULL,
    [FC_PROCESSOR] = "processor",
    [FC_OUTPUT] = "output",
    [FC_INFRASTRUCTURE] = "infrastructure",
};

const char *
attempt_class_name(enum failure_class fc)
{
    return class_names[fc];
}

static char *
attempt_json_path(const struct claim *cl)
{
    return fs_join(cl->attempt_dir, "attempt.json");
}

/* Reads attempt.json (tries_json_load's rules), or a fresh object if it is
 * unreadable. Caller frees. An unreadable attempt.json never keeps an
 * attempt from going on: what is written next replaces it whole (atomic
 * replace), and readers skip an attempt whose file they cannot read. */
static cJSON *
load_meta(const char *path)
{
    cJSON *j = tries_json_load(path);

    return j ? j : cJSON_CreateObject();
}

/* ---- the command ---- */

static void
argv_push(struct strv *v, const char *flag, const char *value)
{
    strv_push(v, flag);
    if (value)
        strv_push(v, value);
}

/* Sets NAME=value in env (a strv of "NAME=value"), replacing the first
 * entry of that name. */
static void
env_set(struct strv *env, const char *name, const char *value)
{
    size_t n = strlen(name);

    for (size_t i = 0; i < env->n; i++)
        if (!strncmp(env->v[i], name, n) && env->v[i][n] == '=') {
            free(env->v[i]);
            env->v[i] = xasprintf("%s=%s", name, value);
            return;
        }
    strv_push_owned(env, xasprintf("%s=%s", name, value));
}

static const char *
env_get(const struct strv *env, const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; i < env->n; i++)
        if (!strncmp(env->v[i], name, n) && env->v[i][n] == '=')
            return env->v[i] + n + 1;
    return NULL;
}

int
attempt_prepare(const struct manifest *m, const struct claim *cl, const struct attempt_opts *o,
                struct attempt_cmd *ret, struct esd_err *err)
{
    static const struct attempt_opts none = { 0 };
    const char *snapshot = m->recipe_snapshot;
    struct strv argv, env;
    char *config = NULL, *dataset = NULL, *job_id, *work, *resolved_work, *tmp;
    char *meta_path = NULL, *export_rel;
    cJSON *meta = NULL, *cmd;
    char *const *base;
    struct attempt_cmd res = { 0 };
    int r;

    if (!o)
        o = &none;
    strv_init(&argv);
    strv_init(&env);
    /* The manifest is shared input any node may have written: its recipe
     * snapshot and shard paths are joined the safe way (spec §3), so the
     * child never reads a recipe or a dataset outside the job directory. */
    if ((r = pypath_join_inside(m->job_dir, snapshot ? snapshot : "recipe.yaml", &config, err)) <
            0 ||
        (r = pypath_join_inside(m->job_dir, m->shards[cl->index].path, &dataset, err)) < 0) {
        free(config);
        return r;
    }
    /* The processor prefix, most specific first: esd-dj (Data-Juicer with
     * the input order kept, see order_key), a configured command, the
     * reference's "<python> <REPO_ROOT>/tools/process_data.py" (§8.4), or
     * an installed dj-process. */
    if (o->dj_python && o->dj_runner) {
        strv_push(&argv, o->dj_python);
        strv_push(&argv, o->dj_runner);
    } else if (o->processor) {
        for (const char *const *p = o->processor; *p; p++)
            strv_push(&argv, *p);
    } else if (o->dj_root) {
        strv_push(&argv, o->python ? o->python : "python3");
        strv_push_owned(&argv, fs_join(o->dj_root, "tools/process_data.py"));
    } else {
        strv_push(&argv, "dj-process");
    }
    if (argv.n == 0) {
        r = err_set(err, -EINVAL, "the processor command is empty");
        goto out;
    }
    /* <job_id>_<shard_id>_<token[:12]> as the reference: the token part
     * gives every attempt of a shard its own Data-Juicer job name, so two
     * attempts of one shard on one Ray cluster are never confused. */
    job_id = xasprintf("%s_%s_%.12s", m->job_id, cl->shard_id, cl->token);
    work = fs_join(cl->attempt_dir, "work");
    resolved_work = fs_join(work, job_id);
    res.export_path = fs_join(cl->attempt_dir, "ray-output.jsonl");
    res.log_path = fs_join(cl->attempt_dir, "process.log");
    argv_push(&argv, "--config", config);
    argv_push(&argv, "--dataset_path", dataset);
    argv_push(&argv, "--export_path", res.export_path);
    argv_push(&argv, "--executor_type", m->executor_type ? m->executor_type : "ray");
    argv_push(&argv, "--ray_address", o->ray_address ? o->ray_address : m->ray_address);
    argv_push(&argv, "--work_dir", work);
    argv_push(&argv, "--job_id", job_id);
    tmp = fs_join(cl->attempt_dir, "logs");
    argv_push(&argv, "--event_log_dir", tmp);
    free(tmp);
    tmp = fs_join(cl->attempt_dir, "checkpoints");
    argv_push(&argv, "--checkpoint_dir", tmp);
    free(tmp);
    tmp = fs_join(cl->attempt_dir, "partitions");
    argv_push(&argv, "--partition_dir", tmp);
    free(tmp);
    /* The environment of spec §8.4: the base environment, then
     * DJ_PRODUCED_DATA_DIR always (each attempt's produced files stay in
     * its own directory), the caches only where unset (an operator's
     * choice wins). */
    for (base = o->env ? o->env : environ; base && *base; base++)
        strv_push(&env, *base);
    tmp = fs_join(cl->attempt_dir, "produced");
    env_set(&env, "DJ_PRODUCED_DATA_DIR", tmp);
    free(tmp);
    if (!env_get(&env, "XDG_CACHE_HOME")) {
        tmp = fs_join(m->job_dir, "cache");
        env_set(&env, "XDG_CACHE_HOME", tmp);
        free(tmp);
    }
    /* After XDG_CACHE_HOME on purpose: HF_HOME follows the effective
     * cache directory, inherited or the job's. */
    if (!env_get(&env, "HF_HOME")) {
        tmp = fs_join(env_get(&env, "XDG_CACHE_HOME"), "huggingface");
        env_set(&env, "HF_HOME", tmp);
        free(tmp);
    }
    if (o->dj_root) {
        const char *pp = env_get(&env, "PYTHONPATH");
        tmp = pp && *pp ? xasprintf("%s:%s", o->dj_root, pp) : xstrdup(o->dj_root);
        env_set(&env, "PYTHONPATH", tmp);
        free(tmp);
    }
    /* REPO_ROOT as the reference (relative paths inside a recipe are the
     * checkout's); without a checkout, the job directory. */
    res.cwd = xstrdup(o->dj_root ? o->dj_root : m->job_dir);
    /* Data-Juicer backs up the recipe into the resolved work directory
     * before it makes sure that exists. */
    r = fs_mkdir_p(resolved_work, 0755, err);
    free(job_id);
    free(work);
    free(resolved_work);
    if (r < 0)
        goto out;
    /* Recorded before the child starts (§8.4): whoever reads attempt.json,
     * even after this node dies mid-run, sees the exact argv. */
    meta_path = attempt_json_path(cl);
    meta = load_meta(meta_path);
    cmd = cJSON_CreateArray();
    for (size_t i = 0; i < argv.n; i++)
        cJSON_AddItemToArray(cmd, cJSON_CreateString(argv.v[i]));
    json_set(meta, "command", cmd);
    export_rel = xasprintf("%s/ray-output.jsonl", cl->attempt_rel);
    json_set(meta, "ray_export_path", cJSON_CreateString(export_rel));
    free(export_rel);
    if ((r = json_write_atomic(meta_path, meta, JSON_PRETTY, err)) < 0)
        goto out;
    res.argv = argv.v;
    res.envp = env.v;
    strv_init(&argv);
    strv_init(&env);
out:
    /* *ret is written only on success. */
    if (r < 0)
        attempt_cmd_free(&res);
    else
        *ret = res;
    cJSON_Delete(meta);
    free(meta_path);
    free(config);
    free(dataset);
    strv_free(&argv);
    strv_free(&env);
    return r;
}

#ifndef ESD_LIBEXECDIR
#define ESD_LIBEXECDIR "/usr/local/lib/esd"
#endif

char *
attempt_dj_runner(void)
{
    char self[4096], *p;
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

    if (n > 0) {
        self[n] = '\0';
        char *dir = fs_dirname(self);

        /* beside it (a build tree), or <prefix>/lib/esd for <prefix>/sbin
         * or <prefix>/bin whatever PREFIX the build had */
        p = fs_join(dir, "esd-dj");
        if (access(p, R_OK) != 0) {
            free(p);
            p = fs_join(dir, "../lib/esd/esd-dj");
        }
        free(dir);
        if (access(p, R_OK) == 0)
            return p;
        free(p);
    }
    p = xstrdup(ESD_LIBEXECDIR "/esd-dj");
    if (access(p, R_OK) == 0)
        return p;
    free(p);
    return NULL;
}

static void
free_vec(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

void
attempt_cmd_free(struct attempt_cmd *cmd)
{
    free_vec(cmd->argv);
    free_vec(cmd->envp);
    free(cmd->cwd);
    free(cmd->log_path);
    free(cmd->export_path);
    memset(cmd, 0, sizeof(*cmd));
}

/* ---- materialising the output ---- */

/* Ray's bookkeeping files (_SUCCESS, .crc, …) are not output. */
static bool
is_output_name(const char *name)
{
    return name[0] != '.' && name[0] != '_';
}

/*
 * The order of an export directory's files (spec 8.5 sorts relative paths
 * as code points). Ray names a write task's file
 * <dataset uuid>_<write uuid>_<task index, %06d>.<format>, and with
 * preserve_order (esd-dj) task i holds the rows after those of task i-1,
 * so code point order is the rows' order while every index has six
 * digits, and wrong from task 1,000,000 on ("..._1000000.json" sorts before
 * "..._999999.json"). Sorting by a key that differs from the relative path
 * only in a name whose stem ends in a run of more than six digits keeps
 * the reference's order wherever it is right, and puts a longer index
 * after every shorter one: leading zeros past six digits are dropped and
 * one '~' (after every digit) is put before the run for each digit left
 * over six. Ties (the same key) fall back to the relative path, so the
 * order is total. Names with at most six trailing digits keep exactly the
 * reference's order.
 */
#define ORDER_DIGITS 6

/* Caller frees. */
static char *
order_key(const char *rel)
{
    const char *base = strrchr(rel, '/'), *dot, *run, *d, *end;
    size_t n, head;
    char *k;

    base = base ? base + 1 : rel;
    dot = strrchr(base, '.');
    end = dot && dot > base ? dot : base + strlen(base);
    for (run = end; run > base && run[-1] >= '0' && run[-1] <= '9'; run--)
        ;
    for (d = run; end - d > ORDER_DIGITS && *d == '0'; d++)
        ;
    if (end - run <= ORDER_DIGITS)
        return xstrdup(rel);
    /* rel up to the run, a '~' per digit over six, the run without its
     * leading zeros over six, and the rest */
    n = (size_t)(end - d) - ORDER_DIGITS;
    head = (size_t)(run - rel);
    k = xmalloc(head + n + strlen(d) + 1);
    memcpy(k, rel, head);
    memset(k + head, '~', n);
    strcpy(k + head + n, d);
    return k;
}

struct keyed_entry {
    char *key;
    struct pypath_entry e;
};

static int
cmp_keyed(const void *a, const void *b)
{
    const struct keyed_entry *x = a, *y = b;
    int c = strcmp(x->key, y->key);

    return c ? c : strcmp(x->e.rel, y->e.rel);
}

/* Sorts the files of an export directory (pypath_rglob's code point order) in
 * the order of order_key(). */
static void
order_sources(struct pypath_entries *src)
{
    struct keyed_entry *k;

    if (src->n < 2)
        return;
    k = xcalloc(src->n, sizeof(*k));
    for (size_t i = 0; i < src->n; i++) {
        k[i].key = order_key(src->v[i].rel);
        k[i].e = src->v[i];
    }
    qsort(k, src->n, sizeof(*k), cmp_keyed);
    for (size_t i = 0; i < src->n; i++) {
        src->v[i] = k[i].e;
        free(k[i].key);
    }
    free(k);
}

struct src_sink {
    struct sha256 sha;
    uint64_t bytes;
};

static void
src_data(void *ctx, const char *p, size_t n)
{
    struct src_sink *k = ctx;

    sha256_update(&k->sha, p, n);
    k->bytes += n;
}

int
attempt_materialize(const struct manifest *m, const struct claim *cl,
                    const struct jsonl_limits *lim, struct attempt_result *ret, struct esd_err *err)
{
    struct attempt_result res = { 0 };
    struct pypath_entries src = { 0 };
    struct jsonl_record rec;
    struct sha256 out_sha;
    struct stat st;
    char *export = fs_join(cl->attempt_dir, "ray-output.jsonl");
    char *output = fs_join(cl->attempt_dir, "processed.jsonl");
    char *tmp = fs_tmp_path(output), *export_rel;
    int fd = -1, r = 0;

    jsonl_record_init(&rec, false);
    sha256_init(&out_sha);
    if (!lim)
        lim = &jsonl_default_limits;
    /* stat, not lstat: an export path that is a link is judged by what it
     * names, as Python's is_file()/is_dir() judge it. */
    if (stat(export, &st) < 0) {
        r = errno == ENOENT
                ? err_set(err, -ENOENT, "Data-Juicer returned 0 but did not create %s", export)
                : err_sys(err, -errno, "cannot stat %s", export);
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        if ((r = pypath_rglob(export, is_output_name, &src, err)) < 0)
            goto out;
        order_sources(&src);
    } else if (!S_ISREG(st.st_mode)) {
        /* (a FIFO would block the reader's open) */
        r = err_set(err, -EINVAL, "%s is neither a regular file nor a directory", export);
        goto out;
    } else {
        src.v = xcalloc(1, sizeof(*src.v));
        src.v[0].path = xstrdup(export);
        src.v[0].rel = xstrdup("");
        src.n = 1;
    }
    /* O_EXCL on a fresh random name: never written through a file or link
     * that is already there. */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        r = err_sys(err, -errno, "cannot create %s", tmp);
        goto out;
    }
    res.ray_output_files = cJSON_CreateArray();
    export_rel = xasprintf("%s/ray-output.jsonl", cl->attempt_rel);
    for (size_t i = 0; i < src.n && r == 0; i++) {
        struct src_sink sink = { .bytes = 0 };
        struct jsonl_reader rd;
        const char *line;
        size_t len;
        bool nl;
        uint64_t rows = 0;
        char hex[SHA256_HEX_LEN + 1], *rel;
        cJSON *f;

        /* Two digests per source: the raw bytes as read (ray_output_files,
         * through on_data, so a missing final newline or a "\r" shows), and
         * the bytes written to processed.jsonl (below). */
        if ((r = jsonl_reader_open(&rd, src.v[i].path, lim->max_line, err)) < 0)
            break;
        sha256_init(&sink.sha);
        rd.on_data = src_data;
        rd.on_data_ctx = &sink;
        while ((r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1) {
            if (jsonl_check(&rec, line, len, lim) < 0) {
                r = jsonl_error(&rec, lim, src.v[i].path, rd.lineno, err);
                break;
            }
            /* The line byte for byte plus "\n", also where the source's last
             * line had none: sources concatenate into whole records. */
            if ((r = fs_write_all(fd, line, len)) < 0 || (r = fs_write_all(fd, "\n", 1)) < 0) {
                err_sys(err, r, "cannot write %s", tmp);
                break;
            }
            sha256_update(&out_sha, line, len);
            sha256_update(&out_sha, "\n", 1);
            res.size_bytes += len + 1;
            rows++;
        }
        jsonl_reader_close(&rd);
        if (r < 0) {
            sha256_abort(&sink.sha);
            break;
        }
        sha256_final(&sink.sha, hex);
        res.rows += rows;
        /* A single-file export has rel "": its path is the export path. */
        rel = *src.v[i].rel ? xasprintf("%s/%s", export_rel, src.v[i].rel) : xstrdup(export_rel);
        f = cJSON_CreateObject();
        json_add_str(f, "path", rel);
        json_add_int(f, "rows", (long long)rows);
        json_add_int(f, "size_bytes", (long long)sink.bytes);
        json_add_str(f, "sha256", hex);
        cJSON_AddItemToArray(res.ray_output_files, f);
        free(rel);
    }
    free(export_rel);
    if (r < 0)
        goto out;
    /* Data, rename, directory, in that order: the done record that will
     * name processed.jsonl must never outlive it in a crash. */
    if (fsync(fd) < 0 || close(fd) < 0) {
        r = err_sys(err, -errno, "cannot write %s", tmp);
        fd = -1;
        goto out;
    }
    fd = -1;
    if (rename(tmp, output) < 0) {
        r = err_sys(err, -errno, "cannot rename %s to %s", tmp, output);
        goto out;
    }
    if ((r = fs_fsync_parent(output, err)) < 0) {
        /* the contract: no processed.jsonl after a failure (a later
         * attempt's, or a reader's, would take it for a result) */
        unlink(output);
        goto out;
    }
    /* The reference re-reads processed.jsonl here (§8.5); its rows, size
     * and digest are those counted while writing, since every byte
     * written was a validated line or its "\n", so the second pass is not
     * made. */
    sha256_final(&out_sha, res.sha256);
    *ret = res;
    memset(&res, 0, sizeof(res));
out:
    if (fd >= 0)
        close(fd);
    if (r < 0)
        unlink(tmp);
    sha256_abort(&out_sha);
    attempt_result_free(&res);
    jsonl_record_free(&rec);
    pypath_entries_free(&src);
    free(export);
    free(output);
    free(tmp);
    return r;
}

void
attempt_result_free(struct attempt_result *r)
{
    cJSON_Delete(r->ray_output_files);
    memset(r, 0, sizeof(*r));
}

/* ---- finishing ---- */

/* Decided by an open, not a stat: on NFS an open revalidates the name
 * with the server where a stat may answer from cached attributes. */
static bool
exists(const char *path)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

    /* Any other error (EACCES, ELOOP of a link, EIO) counts as present:
     * the callers then refuse to publish the opposite record, the safe
     * side when unsure. */
    if (fd < 0)
        return errno != ENOENT && errno != ENOTDIR;
    close(fd);
    return true;
}

static cJSON *
result_json(const struct attempt_result *res)
{
    cJSON *j = cJSON_CreateObject();

    json_add_int(j, "rows", (long long)res->rows);
    json_add_int(j, "size_bytes", (long long)res->size_bytes);
    json_add_str(j, "sha256", res->sha256);
    cJSON_AddItemToObject(j, "ray_output_files", cJSON_Duplicate(res->ray_output_files, true));
    return j;
}

/* Spec §5.5 plus "node" and "duration_secs". The token makes the bytes
 * unique to this attempt, which fs_publish_excl needs to tell a
 * retransmitted NFS link of ours from another publisher's record. */
static cJSON *
done_record(const struct claimer *c, const struct claim *cl, const struct attempt_outcome *out,
            const struct attempt_result *res, const char *output_rel)
{
    cJSON *j = result_json(res);
    char now[40];

    time_iso_now(now, NULL);
    json_add_str(j, "shard_id", cl->shard_id);
    json_add_str(j, "status", "done");
    json_add_str(j, "completed_at", now);
    json_add_str(j, "hostname", c->hostname);
    json_add_int(j, "pid", (long long)getpid());
    json_add_str(j, "token", cl->token);
    json_add_int(j, "attempt_number", cl->attempt_number);
    json_add_str(j, "output_path", output_rel);
    json_add_str(j, "executor_type", "ray");
    json_add_str(j, "ray_address", out->ray_address ? out->ray_address : c->m->ray_address);
    json_add_str(j, "data_juicer_commit", out->dj_commit ? out->dj_commit : "unknown");
    json_add_str(j, "node", c->node);
    /* the pace of a job (status_view_pace) comes from its done records */
    json_add_float(j, "duration_secs", out->duration);
    return j;
}

/* Spec §5.6 (the after-a-failed-attempt producer) plus the infrastructure
 * count, the class and "node"; last_log lets an operator go straight to
 * the log of the attempt that made the shard terminal. */
static cJSON *
failed_record(const struct claimer *c, const struct claim *cl, const struct attempt_outcome *out,
              const struct tries_counts *n)
{
    cJSON *j = cJSON_CreateObject();
    char now[40], *log = xasprintf("%s/process.log", cl->attempt_rel);

    time_iso_now(now, NULL);
    json_add_str(j, "shard_id", cl->shard_id);
    json_add_str(j, "status", "failed");
    json_add_str(j, "failed_at", now);
    json_add_int(j, "failures", n->counted);
    json_add_int(j, "infrastructure_failures", n->infra);
    json_add_str(j, "last_error", out->error ? out->error : "unknown error");
    json_add_int(j, "last_attempt", cl->attempt_number);
    json_add_str(j, "last_log", log);
    json_add_str(j, "failure_class", attempt_class_name(out->fc));
    json_add_str(j, "node", c->node);
    free(log);
    return j;
}

int
attempt_finish(struct claimer *c, const struct claim *cl, const struct attempt_outcome *out,
               const struct attempt_result *res, struct attempt_final *ret, struct esd_err *err)
{
    const struct manifest *m = c->m;
    struct attempt_final fin = { 0 };
    struct tries_counts n = { 0 };
    char now[40], *meta_path = attempt_json_path(cl);
    char *done = manifest_state_path(m, "done", cl->shard_id, ".json");
    char *failed = manifest_state_path(m, "failed", cl->shard_id, ".json");
    char *output_rel = xasprintf("%s/processed.jsonl", cl->attempt_rel);
    const char *status, *seen, *jstatus = NULL;
    cJSON *meta, *latest = NULL, *rec = NULL;
    bool owned;
    int fd, r = 0;

    meta = load_meta(meta_path);
    time_iso_now(now, NULL);
    json_set(meta, "finished_at", cJSON_CreateString(now));
    json_set(meta, "duration_secs", json_float(out->duration));
    if (out->started_epoch > 0)
        json_set(meta, "started_at_epoch", json_float(out->started_epoch));
    if (out->ended_epoch > 0)
        json_set(meta, "processor_ended_at_epoch", json_float(out->ended_epoch));
    json_set(meta, "return_code", json_int(out->return_code));
    json_set(meta, "output_path", cJSON_CreateString(output_rel));
    /* Everything below happens under the fence of our own lock, or not at
     * all: a claim that lost its lock can never publish. */
    /* -ESTALE: the lock is not ours any more (gone, replaced, another
     * token, another inode). Any other error leaves ownership unknown, so
     * nothing is published, removed or recorded: the lock's lease decides. */
    fd = claim_fence_own(cl, NULL);
    if (fd < 0 && fd != -ESTALE) {
        r = err_sys(err, fd, "cannot lock %s", cl->lock_path);
        goto out;
    }
    owned = fd >= 0;
    if (!owned) {
        /* Taken over (the taker marked it stale) or removed under us. */
        latest = load_meta(meta_path);
        seen = json_get_str(latest, "status");
        status = seen && !strcmp(seen, "stale") ? "stale" : "lost";
        if (json_get_str(latest, "stale_at"))
            json_set(meta, "stale_at", cJSON_CreateString(json_get_str(latest, "stale_at")));
        json_set(meta, "failure_class", cJSON_CreateString("infrastructure"));
        json_set(meta, "error",
                 cJSON_CreateString(out->error && out->fc == FC_INFRASTRUCTURE
                                        ? out->error
                                        : "the lease was lost before the attempt ended"));
        /* kept for diagnosis; it was never published */
        if (res)
            json_set(meta, "result", result_json(res));
    } else if (res) {
        bool published = false;

        /* An existing failed record wins (§8.6): done is published only
         * where none exists, and link() refuses a second done record, so
         * a shard never has both, nor two done records. */
        if (!exists(failed)) {
            rec = done_record(c, cl, out, res, output_rel);
            r = json_publish_excl(done, rec, JSON_PRETTY, err);
            if (r == -EEXIST)
                r = 0;
            else if (r == 0)
                published = true;
        }
        /* Removed while the fence is held: a takeover fences before it
         * renames, and no claim can create a lock while ours exists, so
         * this unlink removes our file and never another claim's. Removed
         * also when superseded: the shard is terminal either way. */
        if (r == 0 && unlink(cl->lock_path) < 0)
            r = err_sys(err, -errno, "cannot remove lock %s", cl->lock_path);
        status = published ? "done" : "superseded";
        fin.shard_done = published || exists(done);
        fin.shard_failed = !fin.shard_done && exists(failed);
        json_set(meta, "result", result_json(res));
    } else if (out->released) {
        /* A stop on purpose (drain, shutdown): the lock goes at once, so
         * another node need not wait out the lease, and nothing counts. */
        status = "released";
        json_set(meta, "failure_class", cJSON_CreateString("infrastructure"));
        json_set(meta, "error", cJSON_CreateString(out->error ? out->error : "stopped"));
        if (unlink(cl->lock_path) < 0)
            r = err_sys(err, -errno, "cannot remove lock %s", cl->lock_path);
    } else {
        struct tries_rule rule = claimer_rule(c);
        enum tries_limit lim = TL_OPEN;

        status = "failed";
        /* (an infrastructure failure under a status the reference's
         * workers do not count toward max_retries) */
        if (out->fc == FC_INFRASTRUCTURE)
            jstatus = ATTEMPT_STATUS_INFRA;
        json_set(meta, "failure_class", cJSON_CreateString(attempt_class_name(out->fc)));
        json_set(meta, "error", cJSON_CreateString(out->error ? out->error : "unknown error"));
        json_set(meta, "status", cJSON_CreateString(jstatus));
        /* Recorded before counting, so the count includes this attempt. */
        r = json_write_atomic(meta_path, meta, JSON_PRETTY, err);
        if (r == 0)
            r = tries_count_by(m, cl->shard_id, c->node, &n, err);
        /* An over-full attempts directory cannot be counted: release the
         * shard; its next claim reports the directory. */
        if (r == -E2BIG) {
            memset(&n, 0, sizeof(n));
            r = 0;
        }
        if (r == 0)
            lim = tries_limit(&rule, &n);
        /* The mirror of the done side: never a failed record beside a done
         * one. An existing failed record (EEXIST) still leaves the shard
         * failed. */
        if (r == 0 && lim == TL_TERMINAL && !exists(done)) {
            rec = failed_record(c, cl, out, &n);
            r = json_publish_excl(failed, rec, JSON_PRETTY, err);
            if (r == -EEXIST)
                r = 0;
            fin.shard_failed = true;
        }
        fin.shard_left = lim == TL_LEFT;
        /* The lock goes in every case: terminal, left to the other nodes
         * or open for the next claim (which counts this attempt). */
        if (r == 0 && unlink(cl->lock_path) < 0)
            r = err_sys(err, -errno, "cannot remove lock %s", cl->lock_path);
    }
    /* The unlink is made durable after the unfence: every fence waits for
     * this flock (claim_fence bounds that wait), and syncing the
     * directory needs no fence. */
    if (owned) {
        claim_unfence(fd);
        if (r == 0)
            r = fs_fsync_parent(cl->lock_path, err);
    }
    if (r < 0)
        goto out;
    /* attempt.json says "infra_failed" where the caller is told "failed":
     * the file is read by the reference's counting too (ATTEMPT_STATUS_INFRA). */
    json_set(meta, "status", cJSON_CreateString(jstatus ? jstatus : status));
    r = json_write_atomic(meta_path, meta, JSON_PRETTY, err);
    snprintf(fin.status, sizeof(fin.status), "%s", status);
    fin.index = cl->index;
    fin.counted = out->fc == FC_PROCESSOR || out->fc == FC_OUTPUT;
    claimer_forget(c, cl, fin.shard_done, fin.shard_failed);
    if (r == 0)
        *ret = fin;
out:
    cJSON_Delete(meta);
    cJSON_Delete(latest);
    cJSON_Delete(rec);
    free(meta_path);
    free(done);
    free(failed);
    free(output_rel);
    return r;
}

enum failure_class
attempt_result_class(int r)
{
    return err_transient(r) ? FC_INFRASTRUCTURE : FC_OUTPUT;
}
