/*
 * local: esctl's local mode. Each handler calls the job-directory engine of
 * libesd in-process and prints the result as the reference prints it (so
 * scripts written for shard_job.py keep working), as aligned tables for
 * people, or as JSON with --json.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djversion.h"
#include "esctl.h"
#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "merge.h"
#include "prepare.h"
#include "recipe.h"
#include "retry.h"
#include "status.h"

/* Set by SIGINT, SIGTERM and SIGHUP: long operations stop cleanly. */
static volatile sig_atomic_t interrupted;

static void
on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Lets a long operation be interrupted without leaving partial files. */
static void
catch_signals(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

static void
print_json(cJSON *j)
{
    struct buf b;

    buf_init(&b);
    json_dump(j, JSON_PRETTY, &b);
    fwrite(b.p, 1, b.len, stdout);
    buf_free(&b);
    cJSON_Delete(j);
}

static int
fail(const struct call *c, const struct esd_err *err)
{
    if (c->json) {
        cJSON *j = cJSON_CreateObject();
        json_add_bool(j, "ok", false);
        json_add_str(j, "error", err->msg);
        print_json(j);
    }
    fprintf(stderr, "ERROR: %s\n", err->msg);
    return err->code == -EACCES || err->code == -EPERM ? EXIT_DENIED : EXIT_ERROR;
}

void
limits_from(const struct call *c, struct jsonl_limits *lim)
{
    *lim = jsonl_default_limits;
    if (c->set[O_MAX_LINE_BYTES])
        lim->max_line = (size_t)c->num[O_MAX_LINE_BYTES];
    if (c->set[O_MAX_DEPTH])
        lim->max_depth = (unsigned)(c->num[O_MAX_DEPTH] > 4096 ? 4096 : c->num[O_MAX_DEPTH]);
}

/* Resolves --job-dir and loads its manifest. */
static int
load_job(const struct call *c, struct manifest *m, struct esd_err *err)
{
    char *dir = NULL;
    int r;

    if ((r = fs_resolve_cli(c->str[O_JOB_DIR], &dir, err)) < 0)
        return r;
    r = manifest_load(dir, m, err);
    free(dir);
    return r;
}

static void
prepare_progress(void *ctx, const struct prepare_progress *p)
{
    out_progress(ctx, p->phase == 1 ? "scan" : "write", p->bytes_done, p->bytes_total, p->rows,
                 p->elapsed, false);
}

int
local_prepare(struct call *c)
{
    struct prepare_opts o;
    struct prepare_result res;
    struct recipe_policy pol = { 0 };
    struct attempt_opts ao = { 0 };
    struct strv processor;
    char *dj_version = NULL;
    struct jsonl_limits lim;
    struct esd_err err;
    int r;

    prepare_opts_init(&o);
    limits_from(c, &lim);
    pol.allow = &c->multi[O_ALLOW_OP];
    pol.deny = &c->multi[O_DENY_OP];
    o.config = c->str[O_CONFIG];
    o.dataset_path = c->str[O_DATASET_PATH];
    o.job_dir = c->str[O_JOB_DIR];
    o.num_shards = c->num[O_NUM_SHARDS];
    if (c->set[O_LOCK_TIMEOUT])
        o.lock_timeout_secs = c->num[O_LOCK_TIMEOUT];
    if (c->set[O_MAX_RETRIES])
        o.max_retries = c->num[O_MAX_RETRIES];
    if (c->set[O_POLL_INTERVAL])
        o.poll_interval_secs = c->num[O_POLL_INTERVAL];
    if (c->set[O_RAY_ADDRESS])
        o.ray_address = c->str[O_RAY_ADDRESS];
    o.dj_root = c->str[O_DJ_ROOT];
    /* The Data-Juicer that this node's workers would run. */
    strv_init(&processor);
    if (c->set[O_PROCESSOR])
        strv_split(&processor, c->str[O_PROCESSOR]);
    ao.processor = processor.n ? (const char *const *)processor.v : NULL;
    ao.dj_root = o.dj_root;
    djversion_detect(&ao, &dj_version, &o.dj_dirty);
    o.dj_commit = dj_version;
    o.policy = &pol;
    o.limits = &lim;
    o.progress = prepare_progress;
    o.progress_ctx = c;
    o.cancel = &interrupted;
    catch_signals();
    r = prepare_run(&o, &res, &err);
    out_progress_end(c);
    strv_free(&processor);
    free(dj_version);
    if (r < 0)
        return fail(c, &err);
    if (c->json) {
        cJSON *j = cJSON_CreateObject(), *w = cJSON_AddArrayToObject(j, "warnings");
        json_add_bool(j, "ok", true);
        json_add_str(j, "job_dir", res.job_dir);
        json_add_bool(j, "unchanged", res.unchanged);
        json_add_int(j, "num_shards", res.num_shards);
        if (!res.unchanged) {
            json_add_int(j, "rows", (long long)res.rows);
            json_add_int(j, "normalized_bytes", (long long)res.bytes);
        }
        for (size_t i = 0; i < res.warnings.n; i++)
            cJSON_AddItemToArray(w, cJSON_CreateString(res.warnings.v[i]));
        print_json(j);
    } else if (res.unchanged) {
        printf("Job is already prepared and unchanged: %s\n", res.job_dir);
    } else {
        printf("Prepared %lld shards from %llu records (%llu normalized bytes) in %s\n",
               res.num_shards, (unsigned long long)res.rows, (unsigned long long)res.bytes,
               res.job_dir);
    }
    /* As the reference: warnings of a fresh prepare only. */
    if (!c->json && !res.unchanged)
        for (size_t i = 0; i < res.warnings.n; i++)
            out_warning("%s", res.warnings.v[i]);
    prepare_result_free(&res);
    return EXIT_OK;
}

static int
status_exit(const struct job_status *st)
{
    if (st->complete)
        return EXIT_OK;
    return st->counts[ST_FAILED] ? EXIT_ERROR : EXIT_INCOMPLETE;
}

int
local_status(struct call *c)
{
    struct manifest m;
    struct job_status st;
    struct esd_err err;
    struct buf counts;
    struct table t;
    uint64_t rows_done = 0;
    int r;

    if (!c->set[O_JOB_DIR]) {
        out_error("status --local needs a job directory (without one, status asks esd)");
        return EXIT_ERROR;
    }
    if ((r = load_job(c, &m, &err)) < 0)
        return fail(c, &err);
    if ((r = status_compute(&m, c->set[O_LOCK_TIMEOUT] ? c->num[O_LOCK_TIMEOUT] : 0, true, &st,
                            &err)) < 0) {
        manifest_free(&m);
        return fail(c, &err);
    }
    r = status_exit(&st);
    if (c->json) {
        print_json(status_json(&m, &st));
        goto out;
    }
    buf_init(&counts);
    status_counts_text(&st, &counts);
    printf("Job %s: executor=ray ray_address=%s total=%zu %s\n", m.job_id, m.ray_address, st.total,
           counts.p);
    buf_free(&counts);
    for (size_t i = 0; i < st.total; i++)
        if (st.shards[i].state == ST_DONE)
            rows_done += (uint64_t)m.shards[i].rows;
    printf("  %zu of %zu shards done, %llu of %lld input rows%s\n", st.counts[ST_DONE], st.total,
           (unsigned long long)rows_done, m.total_rows,
           st.complete ? "; complete" : st.terminal ? "; terminal with failures" : "");
    table_init(&t, 6);
    table_add(&t, NULL, "SHARD", "STATE", "ROWS", "OWNER", "LOCK AGE", "ERROR");
    for (size_t i = 0; i < st.total; i++) {
        const struct shard_status *s = &st.shards[i];
        const char *name = status_state_name[s->state];
        char rows[32], age[32] = "", owner[300] = "";

        /* Without --all only the shards that need attention. */
        if (!c->set[O_ALL] && s->state != ST_RUNNING && s->state != ST_STALE &&
            s->state != ST_FAILED && !s->metadata_error)
            continue;
        snprintf(rows, sizeof(rows), "%lld", m.shards[i].rows);
        if (s->has_age)
            fmt_duration(s->lock_age, age);
        if (s->owner && s->has_pid)
            snprintf(owner, sizeof(owner), "%s:%lld", s->owner, s->pid);
        else if (s->owner)
            snprintf(owner, sizeof(owner), "%s", s->owner);
        table_add(&t, out_color(c, name), m.shards[i].id, name, rows, owner, age,
                  s->metadata_error ? "unreadable metadata" : s->error ? s->error : "");
    }
    if (t.nrows > 1) {
        putchar('\n');
        table_print(c, &t);
    }
    table_free(&t);
out:
    status_free(&st);
    manifest_free(&m);
    return r;
}

int
local_retry(struct call *c)
{
    struct manifest m;
    struct strv done;
    struct esd_err err;
    int r;

    if (c->set[O_ALL_FAILED] == c->set[O_SHARD_ID]) {
        out_error("retry: give exactly one of --all-failed or --shard-id");
        return EXIT_ERROR;
    }
    if ((r = load_job(c, &m, &err)) < 0)
        return fail(c, &err);
    strv_init(&done);
    r = retry_run(&m, c->set[O_ALL_FAILED], &c->multi[O_SHARD_ID], &done, &err);
    manifest_free(&m);
    if (r < 0) {
        strv_free(&done);
        return fail(c, &err);
    }
    if (c->json) {
        cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "requeued");
        json_add_bool(j, "ok", true);
        for (size_t i = 0; i < done.n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(done.v[i]));
        print_json(j);
    } else if (done.n == 0) {
        printf("No failed shards selected\n");
    } else {
        for (size_t i = 0; i < done.n; i++)
            printf("Requeued %s\n", done.v[i]);
    }
    strv_free(&done);
    return EXIT_OK;
}

static void
merge_progress(void *ctx, const struct merge_progress *p)
{
    out_progress(ctx, "merge", p->bytes_done, p->bytes_total, p->rows, p->elapsed, false);
}

static cJSON *
merge_json(const struct merge_result *res, const char *output)
{
    cJSON *j = cJSON_CreateObject(), *owners = cJSON_AddObjectToObject(j, "owners");

    json_add_bool(j, "ok", true);
    if (output)
        json_add_str(j, "output_path", output);
    json_add_int(j, "num_shards", (long long)res->nshards);
    json_add_int(j, "rows", (long long)res->rows);
    json_add_int(j, "bytes", (long long)res->bytes);
    json_add_str(j, "sha256", res->sha256);
    for (size_t i = 0; i < res->nowners; i++)
        json_add_int(owners, res->owners[i].hostname, (long long)res->owners[i].shards);
    return j;
}

/* What merge and verify share: limits, lock timeout, progress, Ctrl-C. */
static void
merge_opts_from(struct call *c, struct merge_opts *o, struct jsonl_limits *lim)
{
    limits_from(c, lim);
    o->lock_timeout = c->set[O_LOCK_TIMEOUT] ? c->num[O_LOCK_TIMEOUT] : 0;
    o->limits = lim;
    o->progress = merge_progress;
    o->progress_ctx = c;
    o->cancel = &interrupted;
    catch_signals();
}

int
local_merge(struct call *c)
{
    struct manifest m;
    struct merge_opts o = { 0 };
    struct merge_result res;
    struct jsonl_limits lim;
    struct esd_err err;
    char *output = NULL, *dflt = NULL;
    int r;

    if ((r = load_job(c, &m, &err)) < 0)
        return fail(c, &err);
    if (!c->set[O_OUTPUT])
        dflt = fs_join(m.job_dir, "merged.jsonl");
    r = fs_resolve_cli(dflt ? dflt : c->str[O_OUTPUT], &output, &err);
    free(dflt);
    if (r < 0) {
        manifest_free(&m);
        return fail(c, &err);
    }
    merge_opts_from(c, &o, &lim);
    o.output = output;
    o.overwrite = c->set[O_OVERWRITE];
    r = merge_run(&m, &o, &res, &err);
    out_progress_end(c);
    manifest_free(&m);
    if (r < 0) {
        free(output);
        return fail(c, &err);
    }
    if (c->json)
        print_json(merge_json(&res, output));
    else
        printf("Merged %zu shards and %llu rows into %s\n", res.nshards,
               (unsigned long long)res.rows, output);
    merge_result_free(&res);
    free(output);
    return EXIT_OK;
}

int
local_verify(struct call *c)
{
    struct manifest m;
    struct merge_opts o = { 0 };
    struct merge_result res;
    struct jsonl_limits lim;
    struct esd_err err;
    int r;

    if ((r = load_job(c, &m, &err)) < 0)
        return fail(c, &err);
    merge_opts_from(c, &o, &lim);
    r = merge_verify(&m, &o, &res, &err);
    out_progress_end(c);
    manifest_free(&m);
    if (r < 0)
        return fail(c, &err);
    if (c->set[O_EXPECT_NODES] && res.nowners < (size_t)c->num[O_EXPECT_NODES]) {
        err_set(&err, -EINVAL, "Only %zu node(s) completed shards; expected at least %lld",
                res.nowners, c->num[O_EXPECT_NODES]);
        merge_result_free(&res);
        return fail(c, &err);
    }
    if (c->json) {
        cJSON *j = merge_json(&res, NULL);
        json_add_bool(j, "merged_output_checked", res.checked_output);
        print_json(j);
    } else {
        printf("Shard owners:\n");
        for (size_t i = 0; i < res.nowners; i++)
            printf("  %s: %zu shard(s)\n", res.owners[i].hostname, res.owners[i].shards);
        printf("PASS: %zu shards were completed by %zu node(s); %llu rows, sha256 %s%s\n",
               res.nshards, res.nowners, (unsigned long long)res.rows, res.sha256,
               res.checked_output ? "; merged output matches merge.json" : "");
    }
    merge_result_free(&res);
    return EXIT_OK;
}
