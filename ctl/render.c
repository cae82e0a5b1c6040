/*
 * render: one renderer per command turns its result into what a person
 * reads; the result is the same JSON whether esd or esctl itself ran the
 * command, so both look alike. --json prints the result object instead.
 * The texts of prepare, status, retry, merge and verify are the
 * reference's (shard_job.py), which scripts may read. Every string of a
 * result is escaped before it is shown (clean_copy).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "esctl.h"
#include "json.h"
#include "ops.h"
#include "proto.h"
#include "status.h"

static long long
num(const cJSON *o, const char *key)
{
    long long v = 0;

    json_get_int(o, key, &v);
    return v;
}

static const char *
str(const cJSON *o, const char *key)
{
    const char *s = json_get_str(o, key);

    return s ? s : "";
}

static bool
flag(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static int
cmp_member(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The named members of object o in byte order of their names; the caller
 * frees the array (not the members). */
static const cJSON **
sorted_members(const cJSON *o, size_t *ret_n)
{
    const cJSON **v = xcalloc((size_t)cJSON_GetArraySize(o) + 1, sizeof(*v));
    const cJSON *m;
    size_t n = 0;

    cJSON_ArrayForEach(m, o)
    {
        if (m->string)
            v[n++] = m;
    }
    qsort(v, n, sizeof(*v), cmp_member);
    *ret_n = n;
    return v;
}

/* Replaces the string *p, which cJSON frees unless borrowed, by its escape
 * if it needs one, and says whether it did (cJSON frees with free(),
 * json_init's hook and its own default alike, so a buf's storage may take
 * its place). */
static bool
clean_str(char **p, bool borrowed)
{
    struct buf b;

    if (!*p || str_clean(*p, strlen(*p)))
        return false;
    buf_init(&b);
    str_escape(*p, strlen(*p), &b);
    if (!borrowed)
        free(*p);
    *p = buf_steal(&b);
    return true;
}

static void
clean_node(cJSON *v)
{
    /* a borrowed name that was replaced is now the tree's own */
    if (clean_str(&v->string, v->type & cJSON_StringIsConst))
        v->type &= ~cJSON_StringIsConst;
    if (cJSON_IsString(v))
        clean_str(&v->valuestring, false); /* a copy: never a reference */
    for (cJSON *c = v->child; c; c = c->next)
        clean_node(c);
}

/*
 * A copy of result (caller frees) in which every string value and member
 * name is escaped (str_escape). Renderers print only from such a copy:
 * ids, paths, host names and errors come from job files, peer nodes and
 * esd, and none of their bytes may act on the terminal or break a line.
 */
static cJSON *
clean_copy(const cJSON *result)
{
    cJSON *c = result ? cJSON_Duplicate(result, true) : NULL;

    if (!c)
        c = cJSON_CreateObject();
    clean_node(c);
    return c;
}

/* ---- commands on a job directory ---- */

/* The recipe's split, when it has a global stage: "12 operators per shard,
 * then 2 once: a, b", the latter once after every shard, on their merged
 * output; with none per shard (the shards run an empty process list) the
 * whole recipe runs once, unsharded. */
static void
render_split(const cJSON *res)
{
    const cJSON *ops = cJSON_GetObjectItemCaseSensitive(res, "global_operators"), *op;
    long long per = num(res, "shard_operators");
    int n = cJSON_GetArraySize(ops);
    bool first = true;

    if (!cJSON_IsArray(ops) || n == 0)
        return;
    printf("%lld operator%s per shard, then %d once%s: ", per, per == 1 ? "" : "s", n,
           per == 0 ? " (the whole recipe, unsharded)" : "");
    cJSON_ArrayForEach(op, ops)
    {
        if (cJSON_IsString(op)) {
            printf("%s%s", first ? "" : ", ", op->valuestring);
            first = false;
        }
    }
    putchar('\n');
}

static int
render_prepare(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *w;

    if (flag(res, "unchanged")) {
        printf("Job is already prepared and unchanged: %s\n", str(res, "job_dir"));
        return EXIT_OK;
    }
    printf("Prepared %lld shards from %lld records (%lld normalized bytes) in %s\n",
           num(res, "num_shards"), num(res, "rows"), num(res, "normalized_bytes"),
           str(res, "job_dir"));
    render_split(res);
    if (str(res, "operators_unchecked")[0])
        printf("Operator names were judged by their names alone: the processor's operator "
               "registry could not be read (%s)\n",
               str(res, "operators_unchecked"));
    /* As the reference: the warnings of a fresh prepare only. */
    fflush(stdout);
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(res, "warnings"))
    {
        if (cJSON_IsString(w))
            out_warning("%s", w->valuestring);
    }
    return EXIT_OK;
}

static void
nodes_table(struct call *c, const cJSON *nodes)
{
    size_t n;
    const cJSON **v = sorted_members(nodes, &n);
    struct table t;

    table_init(&t, 4);
    table_add(&t, NULL, "NODE", "DONE", "RUNNING", "STALE");
    for (size_t i = 0; i < n; i++) {
        char d[24], r[24], s[24];

        snprintf(d, sizeof(d), "%lld", num(v[i], "done"));
        snprintf(r, sizeof(r), "%lld", num(v[i], "running"));
        snprintf(s, sizeof(s), "%lld", num(v[i], "stale"));
        table_add(&t, NULL, v[i]->string, d, r, s);
    }
    if (t.nrows > 1) {
        putchar('\n');
        table_print(c, &t);
    }
    table_free(&t);
    free(v);
}

/* A row of the shard table: x a shard's status (a done one has rows), or
 * the global stage's (id "_global", rows once it has them); without all
 * only one that needs attention. */
static void
shard_row(struct call *c, struct table *t, const cJSON *x, const char *id, bool global, bool all)
{
    const char *state = str(x, "status"), *owner = json_get_str(x, "owner");
    const char *error = json_get_str(x, "error"), *last = json_get_str(x, "last_error");
    bool bad_meta = flag(x, "metadata_error");
    char rows[32] = "", age[32] = "", who[320] = "";
    double secs;
    long long pid;

    if (!all && strcmp(state, "running") && strcmp(state, "stale") && strcmp(state, "failed") &&
        !bad_meta)
        return;
    if (cJSON_GetObjectItemCaseSensitive(x, "rows") || !global)
        snprintf(rows, sizeof(rows), "%lld", num(x, "rows"));
    if (json_get_num(x, "lock_age_secs", &secs) == 0)
        fmt_duration(secs, age);
    if (owner && json_get_int(x, "pid", &pid) == 0)
        snprintf(who, sizeof(who), "%s:%lld", owner, pid);
    else if (owner)
        snprintf(who, sizeof(who), "%s", owner);
    table_add(t, out_color(c, state), id, state, rows, who, age,
              bad_meta ? "unreadable metadata"
              : error  ? error
              : last   ? last
                       : "");
}

static void
shards_table(struct call *c, const cJSON *args, const cJSON *res)
{
    bool all = cmd_arg_flag(args, O_ALL) || cmd_arg_has(args, O_STATE) || cmd_arg_has(args, O_SORT);
    const cJSON *x;
    struct table t;

    table_init(&t, 6);
    table_add(&t, NULL, "SHARD", "STATE", "ROWS", "OWNER", "LOCK AGE", "ERROR");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "shards"))
    {
        shard_row(c, &t, x, str(x, "shard_id"), false, all);
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(res, "global")) && cJSON_IsObject(x))
        shard_row(c, &t, x, "_global", true, all);
    if (t.nrows > 1) {
        putchar('\n');
        table_print(c, &t);
    }
    table_free(&t);
}

/* An epoch time as local HH:MM:SS (with the date when not today), or "". */
static void
fmt_clock(double t, char out[32])
{
    time_t s = (time_t)t, now = time(NULL);
    struct tm tm, today;

    out[0] = '\0';
    if (t <= 0 || !localtime_r(&s, &tm) || !localtime_r(&now, &today))
        return;
    strftime(out, 32,
             tm.tm_yday == today.tm_yday && tm.tm_year == today.tm_year ? "%H:%M:%S"
                                                                        : "%Y-%m-%d %H:%M:%S",
             &tm);
}

/* The attempts of one shard entry x (a shard's or "_global"'s) into t. */
static void
attempt_rows(struct call *c, struct table *t, const cJSON *x)
{
    const cJSON *a;

    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(x, "attempts"))
    {
        const char *outcome = str(a, "outcome");
        char n[24], start[32], end[32], el[32] = "", rows[24] = "";
        double v;

        snprintf(n, sizeof(n), "%lld", num(a, "attempt"));
        fmt_clock(json_get_num(a, "start", &v) == 0 ? v : 0, start);
        fmt_clock(json_get_num(a, "end", &v) == 0 ? v : 0, end);
        if (json_get_num(a, "elapsed_secs", &v) == 0)
            fmt_duration(v, el);
        if (cJSON_GetObjectItemCaseSensitive(a, "rows"))
            snprintf(rows, sizeof(rows), "%lld", num(a, "rows"));
        table_add(t, out_color(c, !strcmp(outcome, "taken over") ? "stale" : outcome),
                  str(x, "shard_id"), n, str(a, "node"), start, end, el, outcome,
                  str(a, "failure_class"), rows, str(a, "error"));
    }
}

/* status --all: every listed shard's attempts, one line each (sacct's),
 * then those of the global stage's "_global". */
static void
attempts_table(struct call *c, const cJSON *res)
{
    const cJSON *x;
    struct table t;

    table_init(&t, 10);
    table_add(&t, NULL, "SHARD", "ATTEMPT", "NODE", "START", "END", "ELAPSED", "OUTCOME", "CLASS",
              "ROWS", "ERROR");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "shards")) attempt_rows(c, &t, x);
    attempt_rows(c, &t, cJSON_GetObjectItemCaseSensitive(res, "global"));
    if (t.nrows > 1) {
        putchar('\n');
        table_print(c, &t);
    }
    table_free(&t);
}

/* What the finalize election recorded of the merge, the same as --json. */
static void
merge_line(const cJSON *m)
{
    const char *status = json_get_str(m, "status");

    if (!status)
        return;
    if (!strcmp(status, "complete"))
        printf("  merged by node %s: %lld rows\n", str(m, "node"), num(m, "rows"));
    else if (!strcmp(status, "merging"))
        printf("  being merged by node %s\n", str(m, "node"));
    else
        printf("  the merge failed on node %s: %s\n", str(m, "node"), str(m, "error"));
}

/* " (as of N s ago)" for a reading esd took JOBVIEW_FRESH_SECS (2 s) or
 * more ago (its "read_age_secs"), else "". The text is static: one at a time. */
static const char *
age_note(const cJSON *x)
{
    static char out[48];
    double age;

    out[0] = '\0';
    if (json_get_num(x, "read_age_secs", &age) == 0 && age >= 2.0)
        snprintf(out, sizeof(out), " (as of %.0f s ago)", age);
    return out;
}

/* Rows a second and the time left, when esd's view of the job knows them. */
static void
pace_line(const cJSON *res)
{
    char rate[32], eta[32];
    double v;

    if (json_get_num(res, "rows_per_sec", &v) < 0)
        return;
    out_count(v, rate);
    printf("  %s rows/s", rate);
    if (json_get_num(res, "eta_secs", &v) == 0 && v > 0) {
        fmt_duration(v, eta);
        printf(", about %s left", eta);
    }
    printf(" (from the done shards' durations)\n");
}

/* The nodes that refuse the job (their record in the spool). */
static void
refusal_lines(const cJSON *res)
{
    const cJSON *x;

    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "refused_by"))
        printf("  node %s refuses the job: %s\n", str(x, "node"), str(x, "why"));
}

/* ", global running on node-b" for a job with a global stage in esctl
 * list (its phase, and the state of the stage while it is its phase),
 * else "". The text is static: one at a time. */
static const char *
phase_note(const cJSON *x)
{
    static char out[160];
    const char *phase = json_get_str(x, "phase");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(x, "global");

    out[0] = '\0';
    if (!phase)
        return out;
    if (!strcmp(phase, "global") && json_get_str(g, "node"))
        snprintf(out, sizeof(out), ", global %s on %s", str(g, "status"), str(g, "node"));
    else if (!strcmp(phase, "global"))
        snprintf(out, sizeof(out), ", global %s", str(g, "status"));
    else
        snprintf(out, sizeof(out), ", %s", phase);
    return out;
}

/* The phase of a job with a global stage and its progress: "  phase:
 * global (running on node-b, 3 m)", after the operators it runs once. */
static void
global_line(const cJSON *res)
{
    const char *phase = json_get_str(res, "phase");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(res, "global"), *op;
    const char *state = str(g, "status"), *who = json_get_str(g, "node");
    char age[32] = "", dur[32] = "", attempt[40] = "";
    struct buf ops;
    double v;
    size_t n = 0;

    if (!phase || !cJSON_IsObject(g))
        return;
    if (!who)
        who = json_get_str(g, "owner");
    buf_init(&ops);
    cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(g, "operators"))
    {
        if (cJSON_IsString(op))
            buf_printf(&ops, "%s%s", n++ ? ", " : "", op->valuestring);
    }
    printf("  global stage: %lld operators per shard, then %zu once (%s): %s\n",
           num(g, "shard_operators"), n, str(g, "executor_type"), ops.p ? ops.p : "");
    buf_free(&ops);
    if (json_get_num(g, "lock_age_secs", &v) == 0)
        fmt_duration(v, age);
    if (json_get_num(g, "duration_secs", &v) == 0)
        fmt_duration(v, dur);
    if (num(g, "last_attempt") > 0)
        snprintf(attempt, sizeof(attempt), ", attempt %lld", num(g, "last_attempt"));
    if (!strcmp(phase, "global") && (!strcmp(state, "running") || !strcmp(state, "stale")))
        printf("  phase: global (%s on %s, %s%s)\n", state, who ? who : "unknown node", age,
               attempt);
    else if (!strcmp(phase, "global"))
        printf("  phase: global (%s, %lld input rows)\n", state, num(g, "input_rows"));
    else if (!strcmp(phase, "failed") && !strcmp(state, "failed"))
        printf("  phase: failed (the global stage failed%s%s: %s)\n", who ? " on " : "",
               who ? who : "", str(g, "error"));
    else if (!strcmp(phase, "final merge") || !strcmp(phase, "complete"))
        printf("  phase: %s (the global stage gave %lld of %lld rows%s%s)\n", phase, num(g, "rows"),
               num(g, "input_rows"), *dur ? " in " : "", dur);
    else
        printf("  phase: %s\n", phase);
}

static int
render_job_status(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *counts = cJSON_GetObjectItemCaseSensitive(res, "counts");
    struct buf b;

    buf_init(&b);
    for (int k = 0; k < ST__COUNT; k++)
        buf_printf(&b, "%s%s=%lld", k ? " " : "", status_state_name[k],
                   num(counts, status_state_name[k]));
    printf("Job %s: executor=ray ray_address=%s total=%lld %s\n", str(res, "job_id"),
           str(res, "ray_address"), num(res, "total"), b.p);
    buf_free(&b);
    printf("  %lld of %lld shards done, %lld of %lld input rows%s%s\n", num(counts, "done"),
           num(res, "total"), num(res, "rows_done"), num(res, "total_rows"),
           flag(res, "complete") && json_get_str(res, "phase") ? "; all shards done"
           : flag(res, "complete")                             ? "; complete"
           : flag(res, "terminal")                             ? "; terminal with failures"
                                                               : "",
           age_note(res));
    pace_line(res);
    global_line(res);
    merge_line(cJSON_GetObjectItemCaseSensitive(res, "merge"));
    refusal_lines(res);
    nodes_table(c, cJSON_GetObjectItemCaseSensitive(res, "nodes"));
    shards_table(c, args, res);
    attempts_table(c, res);
    if (num(res, "shards_omitted") > 0)
        printf("  (%lld more shards not listed; esctl status --local --json lists every one)\n",
               num(res, "shards_omitted"));
    return op_status_exit(res);
}

static int
render_daemon_status(struct call *c, const cJSON *res)
{
    const cJSON *ray = cJSON_GetObjectItemCaseSensitive(res, "ray"), *x;
    const char *starting = json_get_str(ray, "starting"), *from = json_get_str(ray, "gpus_from");
    char gpus[128] = "";
    struct table t;

    if (from)
        snprintf(gpus, sizeof(gpus), ", %lld GPUs (%s)", num(ray, "num_gpus"), from);
    printf("esd %s on node %s (pid %lld): %s, %lld/%lld slots busy, ray %s%s%s%s%s%s\n",
           str(res, "version"), str(res, "node"), num(res, "pid"), str(res, "state"),
           num(res, "busy"), num(res, "slots"), str(ray, "state"),
           json_get_str(ray, "address") ? " at " : "", str(ray, "address"), gpus,
           starting ? ": " : "", starting ? starting : "");
    table_init(&t, 5);
    table_add(&t, NULL, "JOB", "STATE", "DONE", "HERE", "DIRECTORY / ERROR");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "jobs"))
    {
        const char *err = json_get_str(x, "error");
        const char *id = json_get_str(x, "job_id");
        char d[256], h[64];

        if (!err)
            err = json_get_str(x, "load_error");
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(x, "loaded")))
            snprintf(d, sizeof(d), "-");
        else
            snprintf(d, sizeof(d), "%lld/%lld%s%s", num(x, "done"), num(x, "shards"), phase_note(x),
                     age_note(x));
        snprintf(h, sizeof(h), "%lld done, %lld running", num(x, "done_here"),
                 num(x, "running_here"));
        table_add(&t, out_color(c, str(x, "state")), id ? id : str(x, "key"), str(x, "state"), d, h,
                  err ? err : str(x, "job_dir"));
    }
    if (t.nrows > 1) {
        putchar('\n');
        table_print(c, &t);
    }
    table_free(&t);
    return EXIT_OK;
}

static int
render_status(struct call *c, const cJSON *args, const cJSON *res)
{
    if (cmd_arg_has(args, O_JOB_DIR))
        return render_job_status(c, args, res);
    return render_daemon_status(c, res);
}

static int
render_retry(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(res, "requeued"), *id;

    if (cJSON_GetArraySize(ids) == 0)
        printf("No failed shards selected\n");
    cJSON_ArrayForEach(id, ids)
    {
        if (cJSON_IsString(id))
            printf("Requeued %s\n", id->valuestring);
    }
    return EXIT_OK;
}

static int
render_merge(struct call *c, const cJSON *args, const cJSON *res)
{
    /* through esd, a job it works is merged by its finalize election */
    if (flag(res, "held_again")) {
        printf("The merge of %s is held again now on every node that works it (state %s); "
               "follow it with esctl status\n",
               str(res, "job_dir"), str(res, "state"));
        return EXIT_OK;
    }
    printf("Merged %lld shards and %lld rows into %s\n", num(res, "num_shards"), num(res, "rows"),
           str(res, "output_path"));
    return EXIT_OK;
}

static int
render_verify(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(res, "owners");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(res, "global");
    size_t n;
    const cJSON **owners = sorted_members(o, &n);

    printf("Shard owners:\n");
    for (size_t i = 0; i < n; i++)
        printf("  %s: %lld shard(s)\n", owners[i]->string, num(o, owners[i]->string));
    printf("PASS: %lld shards were completed by %zu node(s); %lld rows, sha256 %s%s\n",
           num(res, "num_shards"), n, num(res, "rows"), str(res, "sha256"),
           g                                    ? ""
           : flag(res, "merged_output_checked") ? "; merged output matches merge.json"
                                                : "");
    if (g)
        printf("PASS: the global stage read them in order (state/esd/global/input.jsonl) and gave "
               "%lld rows, sha256 %s%s\n",
               num(g, "rows"), str(g, "sha256"),
               flag(res, "merged_output_checked") ? "; final output matches merge.json" : "");
    free(owners);
    return EXIT_OK;
}

/* ---- commands of the daemon ---- */

static int
render_ping(struct call *c, const cJSON *args, const cJSON *res)
{
    printf("esd %s on node %s (pid %lld) at %s\n", str(res, "version"), str(res, "node"),
           num(res, "pid"), client_socket_path(c));
    return EXIT_OK;
}

static int
render_submit(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *prepared = cJSON_GetObjectItemCaseSensitive(res, "prepared");

    if (cJSON_IsObject(prepared))
        render_prepare(c, args, prepared);
    printf("Submitted %s (key %s) \xe2\x86\x92 output %s\n", str(res, "job_dir"), str(res, "key"),
           str(res, "output"));
    refusal_lines(res);
    return EXIT_OK;
}

static int
render_list(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *x;
    struct table t;

    table_init(&t, 6);
    table_add(&t, NULL, "JOB", "STATE", "DONE/TOTAL", "ROWS/S", "ETA", "DIRECTORY");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "jobs"))
    {
        const char *id = json_get_str(x, "job_id");
        char done[256], rate[32] = "-", eta[32] = "-";
        double v;

        /* a job esd has not read since it started: its counts are unknown */
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(x, "loaded")))
            snprintf(done, sizeof(done), "-");
        else
            snprintf(done, sizeof(done), "%lld/%lld%s%s%s", num(x, "done"), num(x, "shards"),
                     num(x, "failed") ? " !" : "", phase_note(x), age_note(x));
        if (json_get_num(x, "rows_per_sec", &v) == 0)
            out_count(v, rate);
        if (json_get_num(x, "eta_secs", &v) == 0)
            fmt_duration(v, eta);
        table_add(&t, out_color(c, str(x, "state")), id ? id : str(x, "key"), str(x, "state"), done,
                  rate, eta, str(x, "job_dir"));
    }
    if (t.nrows > 1)
        table_print(c, &t);
    else
        printf("No jobs on this node%s\n", cmd_arg_has(args, O_STATE) ? " in that state" : "");
    table_free(&t);
    return EXIT_OK;
}

static int
render_cancel(struct call *c, const cJSON *args, const cJSON *res)
{
    printf("Cancelled %s %s (state %s)\n", str(res, "job_dir"),
           flag(res, "everywhere") ? "on every node" : "on this node", str(res, "state"));
    return EXIT_OK;
}

static int
render_forget(struct call *c, const cJSON *args, const cJSON *res)
{
    printf("Forgot %s %s (state %s; its files are kept)\n", str(res, "job_dir"),
           flag(res, "everywhere") ? "on every node" : "on this node", str(res, "state"));
    return EXIT_OK;
}

static int
render_drain(struct call *c, const cJSON *args, const cJSON *res)
{
    printf("draining: %lld attempt(s) running\n", num(res, "busy"));
    return EXIT_OK;
}

static int
render_resume(struct call *c, const cJSON *args, const cJSON *res)
{
    printf("resumed\n");
    return EXIT_OK;
}

/* ---- esctl nodes ---- */

/* "job shard#attempt" of attempt x into out. */
static void
attempt_text(const cJSON *x, char *out, size_t size)
{
    snprintf(out, size, "%s %s#%lld", str(x, "job_id"), str(x, "shard_id"), num(x, "attempt"));
}

/* What a node runs, for its table row: the first attempt and a count. */
static void
running_cell(const cJSON *node, char *out, size_t size)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(node, "attempts");
    int n = cJSON_GetArraySize(a) + (int)num(node, "attempts_omitted");

    if (!n) {
        snprintf(out, size, "-");
        return;
    }
    attempt_text(cJSON_GetArrayItem(a, 0), out, size);
    if (n > 1) {
        size_t k = strlen(out);

        snprintf(out + k, size - k, " (+%d)", n - 1);
    }
}

/* The details of a node under the table: why it is not up, what it runs
 * and what became of it, its paused jobs. */
static void
node_details(const cJSON *x)
{
    const char *node = str(x, "node"), *state = str(x, "state"), *why = json_get_str(x, "reason");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(x, "attempts"), *y;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(x, "locks");
    bool gone = !strcmp(state, "down") || !strcmp(state, "stopped");
    double secs = 0;
    char age[32];

    json_get_num(x, "age_secs", &secs);
    fmt_duration(secs, age);
    if (!strcmp(str(x, "source"), "jobs")) {
        printf("%s: no status file; named by the jobs' locks and done records here "
               "(%lld running, %lld stale lock(s))%s\n",
               node, num(l, "running"), num(l, "stale"),
               !strcmp(state, "down") ? ": its locks went stale" : "");
        return;
    }
    if (!strcmp(state, "down"))
        printf("%s: down: its status file is %s old (written every %llds; down after %d)\n", node,
               age, num(x, "interval_secs"), 3);
    else if (why)
        printf("%s: %s: %s\n", node, state, why);
    cJSON_ArrayForEach(y, a)
    {
        char what[512];

        attempt_text(y, what, sizeof(what));
        if (gone)
            printf("  %s was running %s: now %s%s%s%s\n", node, what,
                   json_get_str(y, "now") ? str(y, "now") : "unknown here (job not loaded)",
                   json_get_str(y, "by") ? " on " : "", str(y, "by"),
                   flag(y, "taken_over") ? " (taken over)" : "");
        else
            printf("  %s runs %s (%s, %s)\n", node, what, str(y, "phase"), str(y, "job_dir"));
    }
    if (gone && num(l, "stale"))
        printf("  %s holds %lld stale lock(s): another node takes them over once free\n", node,
               num(l, "stale"));
    cJSON_ArrayForEach(y, cJSON_GetObjectItemCaseSensitive(x, "paused"))
        printf("  %s does not claim from %s: %s\n", node, str(y, "job_id"), str(y, "why"));
    cJSON_ArrayForEach(y, cJSON_GetObjectItemCaseSensitive(x, "global_stage"))
    {
        char held[32] = "";

        if (json_get_num(y, "lock_age_secs", &secs) == 0)
            fmt_duration(secs, held);
        printf("  %s runs the global stage of %s (%s, %s)\n", node, str(y, "job_id"),
               str(y, "state"), held);
    }
}

static int
render_nodes(struct call *c, const cJSON *args, const cJSON *res)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(res, "nodes"), *x;
    const cJSON *bad = cJSON_GetObjectItemCaseSensitive(res, "invalid");
    struct table t;

    table_init(&t, 9);
    table_add(&t, NULL, "NODE", "STATE", "AGE", "SLOTS", "RUNNING", "ESD", "DATA-JUICER", "RAY",
              "HOST");
    cJSON_ArrayForEach(x, list)
    {
        const cJSON *dj = cJSON_GetObjectItemCaseSensitive(x, "data_juicer");
        const cJSON *ray = cJSON_GetObjectItemCaseSensitive(x, "ray");
        bool file = strcmp(str(x, "source"), "jobs") != 0;
        char node[256], age[32] = "-", slots[48] = "-", run[512];

        snprintf(node, sizeof(node), "%s%s", str(x, "node"), flag(x, "self") ? "*" : "");
        if (file) {
            double secs = 0;

            json_get_num(x, "age_secs", &secs);
            fmt_duration(secs, age);
            snprintf(slots, sizeof(slots), "%lld/%lld", num(x, "busy"), num(x, "slots"));
        }
        running_cell(x, run, sizeof(run));
        table_add(&t, out_color(c, !strcmp(str(x, "state"), "down") ? "failed" : NULL), node,
                  str(x, "state"), age, slots, run, file ? str(x, "esd_version") : "-",
                  file ? str(dj, "version") : "-", file ? str(ray, "state") : "-",
                  str(x, "hostname"));
    }
    table_print(c, &t);
    table_free(&t);
    cJSON_ArrayForEach(x, list)
    {
        /* the table shows one attempt of a node that runs */
        bool more = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(x, "attempts")) > 1;

        if (strcmp(str(x, "state"), "running") || more || json_get_str(x, "reason") ||
            cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(x, "paused")) ||
            cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(x, "global_stage")))
            node_details(x);
    }
    cJSON_ArrayForEach(x, bad) printf("invalid: %s: %s\n", str(x, "file"), str(x, "error"));
    if (num(res, "files_omitted"))
        printf("(%lld more node files not read)\n", num(res, "files_omitted"));
    if (!json_get_str(res, "dir"))
        printf("(* this node; no spool_dir here: only the nodes its jobs name)\n");
    else
        printf("(* this node; node files in %s, written every %llds)\n", str(res, "dir"),
               num(res, "interval_secs"));
    return EXIT_OK;
}

/* "key: value" lines, nested objects as "section.key: value". */
static void
config_lines(const char *prefix, const cJSON *o)
{
    size_t n;
    const cJSON **v = sorted_members(o, &n);

    for (size_t i = 0; i < n; i++) {
        const cJSON *m = v[i];
        char *name = *prefix ? xasprintf("%s.%s", prefix, m->string) : xstrdup(m->string);

        if (cJSON_IsObject(m)) {
            config_lines(name, m);
        } else if (cJSON_IsString(m)) {
            printf("%s: %s\n", name, m->valuestring);
        } else {
            struct buf b;

            buf_init(&b);
            json_dump(m, JSON_COMPACT, &b);
            printf("%s: %.*s\n", name, (int)b.len, b.p ? b.p : "");
            buf_free(&b);
        }
        free(name);
    }
    free(v);
}

static int
render_config(struct call *c, const cJSON *args, const cJSON *res)
{
    config_lines("", res);
    return EXIT_OK;
}

static int
render_reload(struct call *c, const cJSON *args, const cJSON *res)
{
    const char *path = json_get_str(res, "path");

    printf("reloaded %s\n", path ? path : "esd.yaml");
    return EXIT_OK;
}

static int
render_nothing(struct call *c, const cJSON *args, const cJSON *res)
{
    return EXIT_OK;
}

/* One renderer per command; version, worker and completion print for
 * themselves (render_version, ctl/worker.c, ctl/completion.c). */
static int (*const renderers[CMD__COUNT])(struct call *, const cJSON *, const cJSON *) = {
    [CMD_PING] = render_ping,          [CMD_VERSION] = render_nothing,
    [CMD_SUBMIT] = render_submit,      [CMD_LIST] = render_list,
    [CMD_STATUS] = render_status,      [CMD_PREPARE] = render_prepare,
    [CMD_RETRY] = render_retry,        [CMD_MERGE] = render_merge,
    [CMD_VERIFY] = render_verify,      [CMD_CANCEL] = render_cancel,
    [CMD_DRAIN] = render_drain,        [CMD_RESUME] = render_resume,
    [CMD_NODES] = render_nodes,        [CMD_LOGS] = render_nothing,
    [CMD_CONFIG] = render_config,      [CMD_WORKER] = render_nothing,
    [CMD_COMPLETION] = render_nothing, [CMD_FSCHECK] = render_nothing,
    [CMD_REPORT] = render_nothing,     [CMD_RELOAD] = render_reload,
    [CMD_FORGET] = render_forget,      [CMD_WAIT] = render_nothing,
};

int
render_result(struct call *c, enum cmd_id id, const cJSON *args, const cJSON *result)
{
    int rc;

    /* logs' text went out as its events; its result is only where it read */
    if (id == CMD_LOGS)
        return EXIT_OK;
    if (!c->json) {
        cJSON *clean = clean_copy(result);

        rc = renderers[id](c, args, clean);
        cJSON_Delete(clean);
        fflush(stdout);
        return rc;
    }
    out_json(result);
    fflush(stdout);
    return id == CMD_STATUS && cmd_arg_has(args, O_JOB_DIR) ? op_status_exit(result) : EXIT_OK;
}

int
render_error(const struct call *c, const char *code, const char *message, int exit_code)
{
    out_error("%s", message);
    if (c->json) {
        cJSON *j = cJSON_CreateObject();

        json_add_bool(j, "ok", false);
        json_add_str(j, "code", code);
        json_add_str(j, "error", message);
        out_json(j);
        cJSON_Delete(j);
        fflush(stdout);
    }
    return !strcmp(code, PROTO_E_DENIED) ? EXIT_DENIED : exit_code;
}

void
render_event(struct call *c, cJSON *ev)
{
    const char *data = json_get_str(ev, "data"), *phase = json_get_str(ev, "phase");
    double elapsed = 0;

    if (data && !c->tty_out) {
        fputs(data, stdout); /* piped: the bytes of the log as they are */
        fflush(stdout);
    } else if (data) {
        /* On a terminal only its lines and tabs act: see esctl(1) OUTPUT. */
        struct buf b;

        buf_init(&b);
        str_escape_lines(data, strlen(data), &b);
        fwrite(b.p, 1, b.len, stdout);
        fflush(stdout);
        buf_free(&b);
    } else if (phase) {
        json_get_num(ev, "elapsed", &elapsed);
        out_progress(c, phase, (uint64_t)num(ev, "bytes_done"), (uint64_t)num(ev, "bytes_total"),
                     (uint64_t)num(ev, "rows"), elapsed, false);
    }
    cJSON_Delete(ev);
}

int
render_version(struct call *c, const cJSON *result, const char *why)
{
    cJSON *clean = NULL;
    char *why_clean = NULL;

    if (c->json) {
        cJSON *j = cJSON_CreateObject(), *me = cJSON_AddObjectToObject(j, "esctl");

        json_add_str(me, "version", ESD_VERSION);
        json_add_int(me, "protocol", PROTO_VERSION);
        if (result)
            cJSON_AddItemToObject(j, "esd", cJSON_Duplicate(result, true));
        else
            cJSON_AddNullToObject(j, "esd");
        if (why) {
            char *msg = xasprintf("esd is not reachable at %s", why);

            json_add_str(j, "error", msg);
            free(msg);
        }
        out_json(j);
        cJSON_Delete(j);
    } else {
        printf("esctl %s (protocol %d)\n", ESD_VERSION, PROTO_VERSION);
        if (result) {
            clean = clean_copy(result);
            printf("esd %s (protocol %lld) on node %s at %s\n", str(clean, "version"),
                   num(clean, "protocol"), str(clean, "node"), client_socket_path(c));
        } else {
            why_clean = str_escape_dup(why ? why : "");
            printf("esd: not reachable at %s\n", why_clean);
        }
    }
    cJSON_Delete(clean);
    free(why_clean);
    fflush(stdout);
    return result ? EXIT_OK : EXIT_UNREACHABLE;
}

void
render_status_line(const struct call *c, const cJSON *result)
{
    cJSON *res = clean_copy(result);
    const cJSON *counts = cJSON_GetObjectItemCaseSensitive(res, "counts");
    long long total = num(res, "total"), done = num(counts, "done");
    char rows[32];

    out_count((double)num(res, "rows_done"), rows);
    if (c->tty_out) {
        int width = 40, fill = total > 0 ? (int)(done * width / total) : 0;

        printf("[%.*s%.*s] %lld/%lld shards, %s rows\n", fill,
               "########################################", width - fill,
               "........................................", done, total, rows);
    } else {
        char now[40];

        time_iso_now(now, NULL);
        printf("%s %s: %lld/%lld shards done, running=%lld stale=%lld failed=%lld, %s rows\n", now,
               str(res, "job_id"), done, total, num(counts, "running"), num(counts, "stale"),
               num(counts, "failed"), rows);
    }
    cJSON_Delete(res);
}

void
render_watch_nodes(struct call *c, const cJSON *result)
{
    cJSON *res = clean_copy(result);
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(res, "nodes"), *x;
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(res, "shards");
    const cJSON **v;
    size_t n;
    struct table t;
    long long failed = 0;

    v = sorted_members(nodes, &n);
    table_init(&t, 3);
    table_add(&t, NULL, "NODE", "DONE", "RUNNING NOW");
    for (size_t i = 0; i < n; i++) {
        struct buf now;
        char d[24];

        buf_init(&now);
        cJSON_ArrayForEach(x, shards)
        {
            const char *st = str(x, "status"), *who = json_get_str(x, "node");
            double age;
            char a[32] = "";

            if (!who)
                who = json_get_str(x, "owner");
            if (!who || strcmp(who, v[i]->string) || (strcmp(st, "running") && strcmp(st, "stale")))
                continue;
            if (json_get_num(x, "lock_age_secs", &age) == 0)
                fmt_duration(age, a);
            buf_printf(&now, "%s%s%s%s%s", now.len ? ", " : "", str(x, "shard_id"),
                       strcmp(st, "stale") ? "" : " (stale)", *a ? " lock " : "", a);
        }
        snprintf(d, sizeof(d), "%lld", num(v[i], "done"));
        table_add(&t, NULL, v[i]->string, d, now.p ? now.p : "-");
        buf_free(&now);
    }
    free(v);
    putchar('\n');
    if (t.nrows > 1)
        table_print(c, &t);
    else
        printf("no node has worked the job yet\n");
    table_free(&t);
    cJSON_ArrayForEach(x, shards) if (!strcmp(str(x, "status"), "failed")) failed++;
    if (failed)
        printf("\n%lld shards failed (esctl status --state failed DIR lists them)\n", failed);
    pace_line(res);
    cJSON_Delete(res);
}
