/*
 * ops: prepare, status, retry, merge, verify and logs on a job directory,
 * arguments and results in JSON (ops.h).
 */
#include "ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attempt.h"
#include "djversion.h"
#include "fsutil.h"
#include "gstage.h"
#include "history.h"
#include "json.h"
#include "jsonl.h"
#include "manifest.h"
#include "merge.h"
#include "prepare.h"
#include "pypath.h"
#include "recipe.h"
#include "retry.h"
#include "status.h"

#define LOG_CHUNK 65536 /* bytes of a log in one event */
#define FOLLOW_POLL_NS 250000000L

static void
emit(const struct op_env *env, cJSON *ev)
{
    if (env->event)
        env->event(env->ctx, ev);
    else
        cJSON_Delete(ev);
}

/* A path argument: absolute when confined, resolved as the CLI resolves.
 * Confined means the request came from another process over esd's socket:
 * its working directory is not ours, so a relative path would silently name
 * a different file here. Both modes then resolve as spec §3 does (realpath,
 * non-existent tails allowed) so that esctl --local and esd agree. */
static int
path_arg(const struct op_env *env, const cJSON *args, enum opt_id o, char **ret,
         struct esd_err *err)
{
    const char *p = cmd_arg_str(args, o);

    *ret = NULL;
    if (!p)
        return 0;
    if (env->confined && p[0] != '/')
        return err_set(err, -EINVAL, "--%s must be an absolute path through esd, got %s",
                       cmd_opts[o].name, p);
    return pypath_resolve_cli(p, ret, err);
}

static void
limits_from(const cJSON *args, struct jsonl_limits *lim)
{
    long long d = cmd_arg_num(args, O_MAX_DEPTH, 0);

    *lim = jsonl_default_limits;
    if (cmd_arg_has(args, O_MAX_LINE_BYTES))
        lim->max_line = (size_t)cmd_arg_num(args, O_MAX_LINE_BYTES, 0);
    /* 4096 is the most levels jsonl's scanner can track (its container
     * stack is one bit a level in 512 bytes); asking for more would only
     * be cut there without saying so. */
    if (d > 0)
        lim->max_depth = (unsigned)(d > 4096 ? 4096 : d);
}

/* --threads, else esd's configuration (env), else 0: the CPUs available. */
static unsigned
threads_from(const cJSON *args, const struct op_env *env)
{
    long long n = cmd_arg_num(args, O_THREADS, 0);

    if (n <= 0)
        return env->threads;
    return (unsigned)(n > OPS_MAX_THREADS ? OPS_MAX_THREADS : n);
}

static int
load_job(const struct op_env *env, const cJSON *args, struct manifest *m, struct esd_err *err)
{
    char *dir;
    int r;

    if ((r = path_arg(env, args, O_JOB_DIR, &dir, err)) < 0)
        return r;
    if (!dir)
        return err_set(err, -EINVAL, "no job directory given");
    r = manifest_load(dir, m, err);
    free(dir);
    return r;
}

static cJSON *
progress_event(const char *phase, uint64_t done, uint64_t total, uint64_t rows, double elapsed)
{
    cJSON *ev = cJSON_CreateObject();

    json_add_str(ev, "phase", phase);
    json_add_int(ev, "bytes_done", (long long)done);
    json_add_int(ev, "bytes_total", (long long)total);
    json_add_int(ev, "rows", (long long)rows);
    json_add_float(ev, "elapsed", elapsed);
    return ev;
}

/* Progress events at most 10 a second, and the last one of a phase. Every
 * event is a line on the control socket (or a render on esctl's terminal);
 * prepare reports every 8 MiB and merge once a shard, which on a fast file
 * system or a job of many small shards is hundreds a second. The last event
 * of a phase always goes so that the figures left on screen are the totals. */
struct pace {
    const struct op_env *env;
    double last;
    int phase;
};

static bool
pace_due(struct pace *p, int phase, bool last)
{
    double now = time_mono();

    if (!last && phase == p->phase && now - p->last < 0.1)
        return false;
    p->last = now;
    p->phase = phase;
    return true;
}

static void
prepare_progress(void *ctx, const struct prepare_progress *pr)
{
    struct pace *p = ctx;

    if (pace_due(p, pr->phase, pr->bytes_done == pr->bytes_total))
        emit(p->env, progress_event(pr->phase == 1 ? "scan" : "write", pr->bytes_done,
                                    pr->bytes_total, pr->rows, pr->elapsed));
}

static int
op_prepare(const cJSON *args, const struct op_env *env, cJSON **ret, struct esd_err *err)
{
    struct prepare_opts o;
    struct prepare_result res;
    struct recipe_policy pol = { 0 };
    struct attempt_opts ao = { 0 };
    struct strv processor, allow, deny;
    struct jsonl_limits lim;
    struct pace pace = { env, 0, 0 };
    char *config = NULL, *dataset = NULL, *job_dir = NULL, *dj_root = NULL;
    struct djversion djv = { 0 };
    struct strv registry = { 0 };
    char *registry_why = NULL, *registry_source = NULL;
    cJSON *j, *w;
    int r;

    strv_init(&processor);
    strv_init(&allow);
    strv_init(&deny);
    if ((r = path_arg(env, args, O_CONFIG, &config, err)) < 0 ||
        (r = path_arg(env, args, O_DATASET_PATH, &dataset, err)) < 0 ||
        (r = path_arg(env, args, O_JOB_DIR, &job_dir, err)) < 0 ||
        (r = path_arg(env, args, O_DJ_ROOT, &dj_root, err)) < 0)
        goto out;
    if (!config || !job_dir || !cmd_arg_has(args, O_NUM_SHARDS)) {
        r = err_set(err, -EINVAL, "prepare needs --config, --job-dir and --num-shards");
        goto out;
    }
    prepare_opts_init(&o);
    limits_from(args, &lim);
    cmd_arg_strv(args, O_ALLOW_OP, &allow);
    cmd_arg_strv(args, O_DENY_OP, &deny);
    pol.allow = &allow;
    pol.deny = &deny;
    o.no_global_stage = cmd_arg_flag(args, O_NO_GLOBAL_STAGE);
    o.config = config;
    o.dataset_path = dataset;
    o.job_dir = job_dir;
    o.num_shards = cmd_arg_num(args, O_NUM_SHARDS, 0);
    o.lock_timeout_secs = cmd_arg_num(args, O_LOCK_TIMEOUT, o.lock_timeout_secs);
    o.max_retries = cmd_arg_num(args, O_MAX_RETRIES, o.max_retries);
    o.poll_interval_secs = cmd_arg_num(args, O_POLL_INTERVAL, o.poll_interval_secs);
    if (cmd_arg_str(args, O_RAY_ADDRESS))
        o.ray_address = cmd_arg_str(args, O_RAY_ADDRESS);
    o.dj_root = dj_root ? dj_root : env->dj_root;
    /* The Data-Juicer that this node's workers would run: its commit goes
     * into the manifest's data_juicer block (spec §5.2), which workers
     * compare with their own at start-up (spec §8.1), so it must be the
     * processor the workers of this node run, not whatever python is first
     * on this process's PATH. */
    if (cmd_arg_str(args, O_PROCESSOR))
        strv_split(&processor, cmd_arg_str(args, O_PROCESSOR));
    ao.processor = processor.n ? (const char *const *)processor.v : env->processor;
    ao.dj_root = o.dj_root;
    djversion_read(&ao, &djv);
    o.dj_commit = djv.version;
    o.dj_dirty = djv.dirty;
    /* The operators that Data-Juicer registers: a name it does not know
     * is refused (with the closest one), however shard-safe it sounds
     * (spec §7: "Unknown operator ...; cannot prove it is shard-safe").
     * When the registry cannot be read (no Data-Juicer here) prepare still
     * runs on esd's own classification, and the result says so below
     * rather than claiming a check that did not happen. */
    if (djversion_registry(djv.python, o.dj_root, &registry, &registry_why) == 0) {
        registry_source =
            xasprintf("%zu operators of data_juicer.ops in %s", registry.n, djv.python);
        o.registry = &registry;
        o.registry_source = registry_source;
    }
    o.policy = &pol;
    o.limits = &lim;
    o.threads = threads_from(args, env);
    o.progress = prepare_progress;
    o.progress_ctx = &pace;
    o.cancel = env->cancel;
    if ((r = prepare_run(&o, &res, err)) < 0)
        goto out;
    j = cJSON_CreateObject();
    json_add_bool(j, "ok", true);
    json_add_str(j, "job_dir", res.job_dir);
    json_add_bool(j, "unchanged", res.unchanged);
    json_add_int(j, "num_shards", res.num_shards);
    if (!res.unchanged) {
        json_add_int(j, "rows", (long long)res.rows);
        json_add_int(j, "normalized_bytes", (long long)res.bytes);
    }
    /* the split: the items each shard runs, then those run once after
     * every shard (none: no global stage) */
    json_add_int(j, "shard_operators", (long long)res.split);
    w = cJSON_AddArrayToObject(j, "global_operators");
    for (size_t i = 0; i < res.global_ops.n; i++)
        cJSON_AddItemToArray(w, cJSON_CreateString(res.global_ops.v[i]));
    /* what the operator names were checked against */
    if (registry_source)
        json_add_str(j, "operators_checked", registry_source);
    else
        json_add_str(j, "operators_unchecked",
                     registry_why ? registry_why : "the operator registry was not read");
    w = cJSON_AddArrayToObject(j, "warnings");
    for (size_t i = 0; i < res.warnings.n; i++)
        cJSON_AddItemToArray(w, cJSON_CreateString(res.warnings.v[i]));
    prepare_result_free(&res);
    *ret = j;
out:
    free(config);
    free(dataset);
    free(job_dir);
    free(dj_root);
    djversion_free(&djv);
    strv_free(&registry);
    free(registry_why);
    free(registry_source);
    strv_free(&processor);
    strv_free(&allow);
    strv_free(&deny);
    return r;
}

/* ---- status with the shards' history (--all, --state, --sort) ---- */

/* Shards listed with their attempts, and the bytes of attempt records a
 * listing may hold: a reply stays well inside the protocol's 1 MiB
 * (PROTO_MAX_MESSAGE). The budget covers the attempts only; the summary,
 * the shard entries and their last_error (clipped to HISTORY_ERROR_MAX)
 * share the other 384 KiB. */
#define HISTORY_LIST_MAX STATUS_VIEW_DETAILS
#define HISTORY_LIST_BYTES (640 << 10)
#define HISTORY_SHARD_ATTEMPTS 8 /* attempts listed per shard, the latest */
#define HISTORY_ERROR_MAX 400    /* bytes of an error listed */

enum sort_key { SORT_NONE, SORT_ELAPSED, SORT_START, SORT_SHARD, SORT_NODE, SORT_ATTEMPTS };
static const char *const sort_names[] = { "", "elapsed", "start", "shard", "node", "attempts" };

/* What sorting needs of a shard, from its history. */
struct shard_key {
    cJSON *item; /* its entry of "shards" (detached) */
    const char *id;
    double elapsed, start;
    char *node;
    long long attempts;
};

static int
cmp_key(const void *x, const void *y, void *ctx)
{
    const struct shard_key *a = x, *b = y;
    enum sort_key sort_by = *(const enum sort_key *)ctx;
    int c = 0;

    switch (sort_by) {
    case SORT_ELAPSED:
        c = (a->elapsed < b->elapsed) - (a->elapsed > b->elapsed);
        break;
    case SORT_START:
        /* unknown starts (never tried) last */
        c = (a->start <= 0) - (b->start <= 0);
        if (!c)
            c = (a->start > b->start) - (a->start < b->start);
        break;
    case SORT_NODE:
        c = strcmp(a->node ? a->node : "\x7f", b->node ? b->node : "\x7f");
        break;
    case SORT_ATTEMPTS:
        c = (a->attempts < b->attempts) - (a->attempts > b->attempts);
        break;
    case SORT_SHARD:
    case SORT_NONE:
        break;
    }
    /* Ties broken by shard id: qsort_r is not stable, and the same job
     * must list in the same order each time. Ids of one job are zero-padded
     * to one width (spec §6.5), so strcmp is manifest order. */
    return c ? c : sort_by == SORT_NONE ? 0 : strcmp(a->id, b->id);
}

/* The error of the latest attempt that recorded one, or NULL. */
static const char *
last_error(const struct history_shard *h)
{
    for (size_t k = h->n; k-- > 0;)
        if (h->v[k].error)
            return h->v[k].error;
    return NULL;
}

static void
add_clipped(cJSON *o, const char *key, const char *s)
{
    size_t n = strlen(s);

    if (n <= HISTORY_ERROR_MAX) {
        json_add_str(o, key, s);
    } else {
        char *c = xasprintf("%.*s...", HISTORY_ERROR_MAX, s);

        json_add_str(o, key, c);
        free(c);
    }
}

/* Adds the attempts of h to the shard entry x, within *budget bytes. */
static void
attach_attempts(cJSON *x, const struct history_shard *h, size_t *budget)
{
    cJSON *list = cJSON_AddArrayToObject(x, "attempts");
    size_t from = h->n > HISTORY_SHARD_ATTEMPTS ? h->n - HISTORY_SHARD_ATTEMPTS : 0;
    size_t omitted = h->omitted + from;

    for (size_t k = from; k < h->n; k++) {
        cJSON *a = history_attempt_json(&h->v[k]);
        char *text;
        size_t len;

        cJSON_DeleteItemFromObjectCaseSensitive(a, "error");
        if (h->v[k].error)
            add_clipped(a, "error", h->v[k].error);
        /* The budget is spent in printed bytes, the measure the
         * protocol's limit is in; once one attempt does not fit, the rest
         * of this shard are counted as omitted, not skipped silently, and a
         * smaller later one is not let in, so that the listed attempts of
         * a shard stay a contiguous run. */
        text = cJSON_PrintUnformatted(a);
        len = text ? strlen(text) : 0;
        free(text);
        if (len > *budget) {
            cJSON_Delete(a);
            omitted += h->n - k;
            break;
        }
        *budget -= len;
        cJSON_AddItemToArray(list, a);
    }
    json_add_int(x, "attempts_total", (long long)(h->n + h->omitted));
    if (omitted)
        json_add_int(x, "attempts_omitted", (long long)omitted);
}

/*
 * Rewrites the "shards" of status j: only those in state (NULL: all),
 * ordered by sort, each of the first HISTORY_LIST_MAX with its attempts
 * and, for a shard not done that failed before, "last_error"; the rest
 * counted in "shards_omitted". Each shard's attempts are read twice (once
 * for the order, once for the listing) so that a job of any size is held
 * as one small key a shard.
 */
static int
status_history(const struct manifest *m, cJSON *j, const char *state, const char *sort,
               struct esd_err *err)
{
    cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards"), *x;
    size_t n = 0, cap = (size_t)cJSON_GetArraySize(shards), budget = HISTORY_LIST_BYTES;
    struct shard_key *keys;
    double now = time_wall();
    enum sort_key sort_by = SORT_NONE;
    int r = 0, k;

    if (state) {
        for (k = 0; k < ST__COUNT && strcmp(status_state_name[k], state); k++)
            ;
        if (k == ST__COUNT)
            return err_set(err, -EINVAL,
                           "--state %s: not a state (pending, running, stale, "
                           "done, failed)",
                           state);
    }
    if (sort) {
        for (k = 1; k <= SORT_ATTEMPTS && strcmp(sort_names[k], sort); k++)
            ;
        if (k > SORT_ATTEMPTS)
            return err_set(err, -EINVAL,
                           "--sort %s: not a sort key (elapsed, start, shard, "
                           "node, attempts)",
                           sort);
        sort_by = (enum sort_key)k;
    }
    keys = xcalloc(cap + 1, sizeof(*keys));
    while ((x = cJSON_DetachItemFromArray(shards, 0))) {
        const char *id = json_get_str(x, "shard_id");
        struct history_shard h;

        if (!id ||
            (state && strcmp(json_get_str(x, "status") ? json_get_str(x, "status") : "", state))) {
            cJSON_Delete(x);
            continue;
        }
        keys[n].item = x;
        keys[n].id = id;
        keys[n].elapsed = -1;
        if (sort_by != SORT_NONE && sort_by != SORT_SHARD) {
            if ((r = history_read(m, id, &h, err)) < 0) {
                history_shard_free(&h);
                cJSON_Delete(x);
                break;
            }
            if (h.n) {
                const struct history_attempt *last = &h.v[h.n - 1];

                /* A running attempt has no elapsed yet: its age so far
                 * (wall clock, as its start was recorded by another node's
                 * wall clock; a start in our future counts as unknown). */
                keys[n].start = h.v[0].start;
                keys[n].elapsed = last->elapsed >= 0 ? last->elapsed
                                  : last->start > 0 && !last->end && now > last->start
                                      ? now - last->start
                                      : -1;
                keys[n].node = last->node ? xstrdup(last->node) : NULL;
            }
            keys[n].attempts = (long long)(h.n + h.omitted);
            history_shard_free(&h);
        }
        n++;
    }
    if (r == 0 && sort_by != SORT_NONE)
        qsort_r(keys, n, sizeof(*keys), cmp_key, &sort_by);
    for (size_t i = 0; i < n; i++) {
        struct history_shard h;

        if (r == 0 && i < HISTORY_LIST_MAX) {
            if ((r = history_read(m, keys[i].id, &h, err)) == 0) {
                const char *e = last_error(&h);
                const char *st = json_get_str(keys[i].item, "status");

                attach_attempts(keys[i].item, &h, &budget);
                /* A failed shard already carries its failed record's
                 * "error" (spec §5.9); last_error is for a shard that is
                 * pending or running again after failures, whose cause a
                 * reader would otherwise have to dig out of attempts. */
                if (e && st && strcmp(st, "done") && !json_get_str(keys[i].item, "error"))
                    add_clipped(keys[i].item, "last_error", e);
            }
            history_shard_free(&h);
            cJSON_AddItemToArray(shards, keys[i].item);
        } else {
            cJSON_Delete(keys[i].item);
        }
        free(keys[i].node);
    }
    free(keys);
    if (r < 0)
        return r;
    json_add_int(j, "shards_listed", (long long)(n < HISTORY_LIST_MAX ? n : HISTORY_LIST_MAX));
    json_set(j, "shards_omitted",
             json_int((long long)(n > HISTORY_LIST_MAX ? n - HISTORY_LIST_MAX : 0)));
    return 0;
}

/* status --all of a job with a global stage: the attempts of "_global",
 * read as a shard's, in its "global" object. */
static int
global_history(const struct manifest *m, cJSON *j, struct esd_err *err)
{
    cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "global");
    size_t budget = HISTORY_LIST_BYTES;
    struct history_shard h;
    int r;

    if (!cJSON_IsObject(g))
        return 0;
    if ((r = history_read(m, STATUS_GLOBAL_ID, &h, err)) == 0)
        attach_attempts(g, &h, &budget);
    history_shard_free(&h);
    return r;
}

static int
op_status(const cJSON *args, const struct op_env *env, cJSON **ret, struct esd_err *err)
{
    struct manifest m;
    struct job_status st;
    long long rows_done = 0;
    cJSON *j, *owners;
    int r;

    if ((r = load_job(env, args, &m, err)) < 0)
        return r;
    if ((r = status_compute(&m, cmd_arg_num(args, O_LOCK_TIMEOUT, 0), true, &st, err)) < 0) {
        manifest_free(&m);
        return r;
    }
    j = status_json(&m, &st);
    /* Per node (esd's node name, else the host name the reference
     * records): shards done there, and shards its locks hold now. The
     * names point into st, which outlives the loop; a job has few nodes,
     * so a linear search per shard is cheaper than a table. */
    struct node_count {
        const char *name;
        long long n[3]; /* done, running, stale */
    } *nodes = NULL;
    size_t nnodes = 0;

    for (size_t i = 0; i < st.total; i++) {
        const struct shard_status *s = &st.shards[i];
        int k = s->state == ST_DONE      ? 0
                : s->state == ST_RUNNING ? 1
                : s->state == ST_STALE   ? 2
                                         : -1;
        size_t x;

        if (s->state == ST_DONE)
            rows_done += m.shards[i].rows;
        const char *who = s->node ? s->node : s->owner;

        if (k < 0 || !who)
            continue;
        for (x = 0; x < nnodes && strcmp(nodes[x].name, who); x++)
            ;
        if (x == nnodes) {
            nodes = xrealloc(nodes, (nnodes + 1) * sizeof(*nodes));
            memset(&nodes[nnodes], 0, sizeof(*nodes));
            nodes[nnodes++].name = who;
        }
        nodes[x].n[k]++;
    }
    owners = cJSON_AddObjectToObject(j, "nodes");
    for (size_t x = 0; x < nnodes; x++) {
        cJSON *node = cJSON_AddObjectToObject(owners, nodes[x].name);

        json_add_int(node, "done", nodes[x].n[0]);
        json_add_int(node, "running", nodes[x].n[1]);
        json_add_int(node, "stale", nodes[x].n[2]);
    }
    free(nodes);
    json_add_int(j, "total_rows", m.total_rows);
    json_add_int(j, "rows_done", rows_done);
    json_add_str(j, "ray_address", m.ray_address);
    if (cmd_arg_flag(args, O_ALL) || cmd_arg_has(args, O_STATE) || cmd_arg_has(args, O_SORT)) {
        /* bounded whatever the mode: the attempts of 100,000 shards are
         * more than anyone reads */
        if ((r = status_history(&m, j, cmd_arg_str(args, O_STATE), cmd_arg_str(args, O_SORT),
                                err)) < 0 ||
            (r = global_history(&m, j, err)) < 0) {
            cJSON_Delete(j);
            status_free(&st);
            manifest_free(&m);
            return r;
        }
    } else if (env->confined) {
        /* through esd: a reply within the protocol's line limit; esctl
         * --local prints to a terminal or a pipe and has no such limit, so
         * it keeps every shard, as the reference's status --json does */
        status_json_bound(j, STATUS_VIEW_DETAILS);
    }
    status_free(&st);
    manifest_free(&m);
    *ret = j;
    return 0;
}

/*
 * The global stage's failed record, requeued as a shard's is: with
 * --all-failed once the shards are merged, or named by its id, which is
 * taken out of ids. 0 or a negative errno.
 */
static int
retry_global(const struct manifest *m, bool all, struct strv *ids, struct strv *done,
             struct esd_err *err)
{
    struct gstage_prefix p;
    struct manifest gm;
    struct strv one;
    bool named = false;
    int r;

    for (size_t i = 0; i < ids->n; i++)
        if (gstage_is(ids->v[i])) {
            named = true;
            free(ids->v[i]);
            ids->v[i--] = ids->v[--ids->n];
        }
    if (!named && !all)
        return 0;
    if (!gstage_has(m)) {
        if (named)
            return err_set(err, -EINVAL, "%s: the job's recipe has no global stage", GSTAGE_ID);
        return 0;
    }
    if ((r = gstage_prefix_load(m, &p, err)) < 0)
        return r;
    if (r == 0) {
        if (named)
            return err_set(err, -EINVAL,
                           "%s: the shards are not merged yet, so the global stage has not run",
                           GSTAGE_ID);
        return 0;
    }
    gstage_manifest(m, &p, &gm);
    strv_init(&one);
    if (named)
        strv_push(&one, GSTAGE_ID);
    r = retry_run(&gm, all, &one, done, err);
    strv_free(&one);
    manifest_free(&gm);
    return r;
}

static int
op_retry(const cJSON *args, const struct op_env *env, cJSON **ret, struct esd_err *err)
{
    struct manifest m;
    struct strv ids, done;
    bool all = cmd_arg_flag(args, O_ALL_FAILED);
    cJSON *j, *a;
    int r;

    strv_init(&ids);
    cmd_arg_strv(args, O_SHARD_ID, &ids);
    if (all == (ids.n > 0)) {
        strv_free(&ids);
        return err_set(err, -EINVAL, "retry: give exactly one of --all-failed or --shard-id");
    }
    if ((r = load_job(env, args, &m, err)) < 0) {
        strv_free(&ids);
        return r;
    }
    strv_init(&done);
    r = retry_global(&m, all, &ids, &done, err);
    if (r == 0 && (all || ids.n))
        r = retry_run(&m, all, &ids, &done, err);
    manifest_free(&m);
    strv_free(&ids);
    if (r < 0) {
        strv_free(&done);
        return r;
    }
    j = cJSON_CreateObject();
    json_add_bool(j, "ok", true);
    a = cJSON_AddArrayToObject(j, "requeued");
    for (size_t i = 0; i < done.n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(done.v[i]));
    strv_free(&done);
    *ret = j;
    return 0;
}

static void
merge_progress(void *ctx, const struct merge_progress *pr)
{
    struct pace *p = ctx;
    int phase = p->phase; /* 3 merge, 4 verify (op_merge); pace_due keeps it */

    if (pace_due(p, phase, pr->shards_done == pr->shards_total))
        emit(p->env, progress_event(phase == 4 ? "verify" : "merge", pr->bytes_done,
                                    pr->bytes_total, pr->rows, pr->elapsed));
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

static int
op_merge(enum cmd_id id, const cJSON *args, const struct op_env *env, cJSON **ret,
         struct esd_err *err)
{
    struct manifest m;
    struct merge_opts o = { 0 };
    struct merge_result res;
    struct jsonl_limits lim;
    struct pace pace = { env, 0, id == CMD_VERIFY ? 4 : 3 };
    char *output = NULL;
    int r;

    if ((r = load_job(env, args, &m, err)) < 0)
        return r;
    limits_from(args, &lim);
    o.lock_timeout = cmd_arg_num(args, O_LOCK_TIMEOUT, 0);
    o.limits = &lim;
    o.threads = threads_from(args, env);
    o.progress = merge_progress;
    o.progress_ctx = &pace;
    o.cancel = env->cancel;
    if (id == CMD_VERIFY) {
        long long want = cmd_arg_num(args, O_EXPECT_NODES, 0);

        r = merge_verify(&m, &o, &res, err);
        manifest_free(&m);
        if (r < 0)
            return r;
        /* spec §13.9: fewer distinct hostnames than expected fails verify
         * (exit 2), with the reference's wording. */
        if (want > 0 && res.nowners < (size_t)want) {
            r = err_set(err, -EINVAL, "only %zu node(s) completed shards; expected at least %lld",
                        res.nowners, want);
            merge_result_free(&res);
            return r;
        }
        *ret = merge_json(&res, NULL);
        json_add_bool(*ret, "merged_output_checked", res.checked_output);
        if (res.global) {
            cJSON *g = cJSON_AddObjectToObject(*ret, "global");

            json_add_int(g, "rows", (long long)res.global_rows);
            json_add_str(g, "sha256", res.global_sha256);
        }
        merge_result_free(&res);
        return 0;
    }
    if (cmd_arg_str(args, O_OUTPUT)) {
        r = path_arg(env, args, O_OUTPUT, &output, err);
    } else {
        char *dflt = fs_join(m.job_dir, "merged.jsonl");

        r = pypath_resolve_cli(dflt, &output, err);
        free(dflt);
    }
    /* Through esd the merge runs in esd's mount namespace (esd.service:
     * PrivateTmp=yes, ProtectSystem=strict): an output elsewhere could land
     * in esd's private /tmp, invisible to the caller, or hit a read-only
     * mount. The job directory is the one place esd must be able to write
     * and that both see alike. fs_is_inside compares resolved paths. */
    if (r == 0 && env->confined && !fs_is_inside(m.job_dir, output))
        r = err_set(err, -EACCES,
                    "output %s is outside the job directory %s; through esd a "
                    "merge writes only inside it (esctl merge --local writes anywhere you may)",
                    output, m.job_dir);
    if (r < 0) {
        free(output);
        manifest_free(&m);
        return r;
    }
    o.output = output;
    o.overwrite = cmd_arg_flag(args, O_OVERWRITE);
    r = merge_run(&m, &o, &res, err);
    manifest_free(&m);
    if (r == 0) {
        *ret = merge_json(&res, output);
        merge_result_free(&res);
    }
    free(output);
    return r;
}

/* The attempt number of an attempt directory's name "NNNN-<uuid>", or -1.
 * Numbers are not unique (spec §16.3: two claimers may count the same
 * directories), so this only orders; the token keeps names distinct. */
static long
attempt_number(const char *name)
{
    char *end;
    long n;

    if (name[0] < '0' || name[0] > '9')
        return -1;
    n = strtol(name, &end, 10);
    return *end == '-' && n >= 0 && n < LONG_MAX ? n : -1;
}

int
op_latest_log(const char *job_dir, const char *shard, char **ret_path, struct esd_err *err)
{
    char *rel, *dir = NULL, *best = NULL;
    long best_n = -1;
    struct dirent *de;
    DIR *d;
    int r;

    *ret_path = NULL;
    /* The shard comes from the request and becomes a path component; a
     * slash or a dot name would leave attempts/ before pypath_join_inside
     * could say so in terms of shards. */
    if (!*shard || strchr(shard, '/') || !strcmp(shard, ".") || !strcmp(shard, ".."))
        return err_set(err, -EINVAL, "not a shard id: %s", shard);
    rel = xasprintf("attempts/%s", shard);
    r = pypath_join_inside(job_dir, rel, &dir, err);
    free(rel);
    if (r < 0)
        return r;
    if (!(d = opendir(dir))) {
        r = errno == ENOENT
                ? err_set(err, -ENOENT, "shard %s of %s has no attempt yet", shard, job_dir)
                : err_sys(err, -errno, "cannot read %s", dir);
        free(dir);
        return r;
    }
    while ((de = readdir(d))) {
        long n = attempt_number(de->d_name);

        if (n > best_n) {
            best_n = n;
            free(best);
            best = xstrdup(de->d_name);
        }
    }
    closedir(d);
    if (!best) {
        r = err_set(err, -ENOENT, "shard %s of %s has no attempt yet", shard, job_dir);
        free(dir);
        return r;
    }
    *ret_path = xasprintf("%s/%s/process.log", dir, best);
    free(best);
    free(dir);
    return 0;
}

static void
emit_data(const struct op_env *env, const char *p, size_t n)
{
    struct buf b;
    cJSON *ev;

    buf_init(&b);
    jsonl_utf8_clean(p, n, &b);
    ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "data", cJSON_CreateString(b.p ? b.p : ""));
    buf_free(&b);
    emit(env, ev);
}

/* Sends fd's bytes from *pos on, whole lines (a line longer than a chunk
 * in pieces); an unterminated last line only when flush_partial. Cutting at
 * newlines keeps a UTF-8 sequence in one event (jsonl_utf8_clean would turn
 * the halves of a split one into replacement characters); while following,
 * the last line is held back because the child may still be writing it. */
static int
send_from(const struct op_env *env, int fd, off_t *pos, bool flush_partial)
{
    char *buf = xmalloc(LOG_CHUNK);
    int r = 0;

    while (!(env->cancel && *env->cancel)) {
        ssize_t n = pread(fd, buf, LOG_CHUNK, *pos);
        size_t cut;
        char *nl;

        if (n < 0) {
            if (errno == EINTR)
                continue;
            r = -errno;
            break;
        }
        if (n == 0)
            break;
        nl = memrchr(buf, '\n', (size_t)n);
        if (nl)
            cut = (size_t)(nl - buf) + 1;
        else if (n == LOG_CHUNK || flush_partial)
            cut = (size_t)n;
        else
            break;
        emit_data(env, buf, cut);
        *pos += (off_t)cut;
    }
    free(buf);
    return r;
}

/* The offset where the last `lines` lines of fd (size bytes) begin. */
static off_t
tail_offset(int fd, off_t size, long long lines)
{
    char buf[65536];
    off_t end = size;
    long long seen = 0;

    while (end > 0) {
        off_t start = end > (off_t)sizeof(buf) ? end - (off_t)sizeof(buf) : 0;
        ssize_t n = pread(fd, buf, (size_t)(end - start), start);

        if (n <= 0)
            return 0;
        for (ssize_t i = n - 1; i >= 0; i--) {
            /* The newline ending the file does not begin a line. */
            if (buf[i] == '\n' && start + i != size - 1 && ++seen == lines)
                return start + i + 1;
        }
        end = start;
    }
    return 0;
}

/* logs --attempt: the process.log of attempt number of shard, after a
 * header naming the node, the attempt and the file. */
static int
attempt_log(const struct manifest *m, const char *shard, long long number, const struct op_env *env,
            char **ret_path, struct esd_err *err)
{
    const struct history_attempt *a;
    struct history_shard h;
    struct buf b;
    int r;

    if ((r = history_read(m, shard, &h, err)) < 0) {
        history_shard_free(&h);
        return r;
    }
    if (!(a = history_find(&h, number))) {
        r = err_set(err, -ENOENT, "shard %s of %s has no attempt %lld (%zu recorded)", shard,
                    m->job_dir, number, h.n + h.omitted);
        history_shard_free(&h);
        return r;
    }
    buf_init(&b);
    buf_printf(&b, "==> shard %s, attempt %lld on node %s (%s): %s/process.log <==\n", shard,
               number, a->node ? a->node : "unknown", history_outcome(a), a->dir);
    emit_data(env, b.p, b.len);
    buf_free(&b);
    *ret_path = xasprintf("%s/%s/process.log", m->job_dir, a->dir);
    history_shard_free(&h);
    return 0;
}

static int
op_logs(const cJSON *args, const struct op_env *env, cJSON **ret, struct esd_err *err)
{
    const char *shard = cmd_arg_str(args, O_SHARD);
    struct manifest m;
    char *path = NULL;
    struct stat st;
    off_t pos = 0;
    int fd, r;

    if (!shard)
        return err_set(err, -EINVAL, "logs reads a shard's process.log: give --shard ID");
    if ((r = load_job(env, args, &m, err)) < 0)
        return r;
    if (manifest_find(&m, shard) < 0) {
        r = err_set(err, -ENOENT, "job %s has no shard %s", m.job_dir, shard);
        manifest_free(&m);
        return r;
    }
    if (cmd_arg_has(args, O_ATTEMPT))
        r = attempt_log(&m, shard, cmd_arg_num(args, O_ATTEMPT, 0), env, &path, err);
    else
        r = op_latest_log(m.job_dir, shard, &path, err);
    manifest_free(&m);
    if (r < 0)
        return r;
    /* process.log lives in a directory the job's own child writes: a
     * symlink planted there must not make us read another file, and a FIFO
     * must not block the open (O_NONBLOCK; S_ISREG refuses it next). */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        r = err_sys(err, -errno, "cannot open %s", path);
        free(path);
        return r;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        r = err_set(err, -EINVAL, "%s is not a regular file", path);
        goto out;
    }
    if (cmd_arg_has(args, O_LINES))
        pos = tail_offset(fd, st.st_size, cmd_arg_num(args, O_LINES, 0));
    if ((r = send_from(env, fd, &pos, !cmd_arg_flag(args, O_FOLLOW))) < 0) {
        err_sys(err, r, "cannot read %s", path);
        goto out;
    }
    /* Following polls: the writer is usually on another node, and inotify
     * sees no writes made through another NFS client. */
    while (cmd_arg_flag(args, O_FOLLOW) && !(env->cancel && *env->cancel)) {
        struct timespec ts = { 0, FOLLOW_POLL_NS };

        nanosleep(&ts, NULL);
        if ((r = send_from(env, fd, &pos, false)) < 0) {
            err_sys(err, r, "cannot read %s", path);
            goto out;
        }
    }
    *ret = cJSON_CreateObject();
    json_add_str(*ret, "path", path);
    json_add_int(*ret, "offset", (long long)pos);
    r = 0;
out:
    close(fd);
    free(path);
    return r;
}

int
op_run(enum cmd_id id, const cJSON *args, const struct op_env *env, cJSON **ret,
       struct esd_err *err)
{
    *ret = NULL;
    switch (id) {
    case CMD_PREPARE:
        return op_prepare(args, env, ret, err);
    case CMD_STATUS:
        return op_status(args, env, ret, err);
    case CMD_RETRY:
        return op_retry(args, env, ret, err);
    case CMD_MERGE:
    case CMD_VERIFY:
        return op_merge(id, args, env, ret, err);
    case CMD_LOGS:
        return op_logs(args, env, ret, err);
    default:
        return err_set(err, -EINVAL, "%s is not a job-directory operation", cmd_table[id].name);
    }
}

int
op_status_exit(const cJSON *result)
{
    const cJSON *counts = cJSON_GetObjectItemCaseSensitive(result, "counts");
    long long failed = 0;

    const char *phase = json_get_str(result, "phase");

    /* A job with a global stage is complete when its final output is:
     * 0 then, 2 failed, 1 otherwise, as below. */
    if (phase)
        return !strcmp(phase, "complete") ? 0 : !strcmp(phase, "failed") ? 2 : 1;
    /* spec §12: the reference's status exits 0 complete, 2 with a failed
     * shard, 1 otherwise; scripts written for it test exactly these. */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(result, "complete")))
        return 0;
    json_get_int(counts, "failed", &failed);
    return failed ? 2 : 1;
}
