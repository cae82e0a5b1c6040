/*
 * metrics: the textfile-collector file (metrics.h). Rendering walks the
 * registry (a few lines per job) and is done from a timer, never per event.
 */
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "jobs.h"
#include "jobview.h"
#include "log.h"
#include "proto.h"
#include "ray.h"

/* Upper bounds of the attempt duration buckets, in seconds. Counted per
 * bucket (hist[]) and summed into Prometheus' cumulative "le" counts only
 * when rendered. */
static const double buckets[] = { 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200 };
#define NBUCKETS (sizeof(buckets) / sizeof(buckets[0]))

/* Matched by name (attempt_class_name's), so this order alone decides the
 * index into struct job's failed_by_class[]. */
static const char *const classes[] = { "processor", "output", "infrastructure" };
#define NCLASSES (sizeof(classes) / sizeof(classes[0]))

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    ev_timer write_w;
    double started; /* wall clock, for esd_start_time_seconds */
    unsigned long long attempts_done, attempts_failed, attempts_released, attempts_other;
    unsigned long long failures[NCLASSES];
    unsigned long long takeovers;
    size_t running; /* attempts running, as the runner last told */
    unsigned long long rows, bytes;
    unsigned long long hist[NBUCKETS + 1]; /* the last: +Inf */
    double hist_sum;
    unsigned long long hist_count;
    char *failed_path; /* the path the last write failed for (said once) */
} M;

void
metrics_attempt(struct job *j, const char *status, const char *cls, double secs, uint64_t rows,
                uint64_t bytes)
{
    size_t b;

    if (!strcmp(status, "done")) {
        M.attempts_done++;
        M.rows += rows;
        M.bytes += bytes;
    } else if (!strcmp(status, "failed")) {
        M.attempts_failed++;
    } else if (!strcmp(status, "released")) {
        M.attempts_released++;
    } else {
        M.attempts_other++;
    }
    for (size_t i = 0; cls && i < NCLASSES; i++)
        if (!strcmp(cls, classes[i])) {
            M.failures[i]++;
            if (j)
                j->failed_by_class[i]++;
        }
    /* the first bucket with secs <= its bound: "le" is inclusive */
    for (b = 0; b < NBUCKETS && secs > buckets[b]; b++)
        ;
    M.hist[b]++;
    M.hist_sum += secs;
    M.hist_count++;
}

void
metrics_set_running(size_t n)
{
    M.running = n;
}

void
metrics_takeover(void)
{
    M.takeovers++;
}

/* The label of a job's series, esd_job="<key>" (not "job", which
 * Prometheus sets itself at scrape time): the registration key, the same
 * on every node and across restarts, loaded or not; esd_job_info joins it
 * to the job's id and directory. */
/* The key is 16 hex digits: it needs no escaping, unlike label(). */
static void
job_label(struct buf *b, const char *metric, const struct job *j)
{
    buf_printf(b, "%s{esd_job=\"%s\"", metric, j->key);
}

/* A label value: backslash, double quote and newline escaped, the three
 * the text format requires; a job id or directory may hold any of them. */
static void
label(struct buf *b, const char *s)
{
    buf_putc(b, '"');
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            buf_putc(b, '\\');
        if (*s == '\n')
            buf_puts(b, "\\n");
        else
            buf_putc(b, *s);
    }
    buf_putc(b, '"');
}

static void help(struct buf *b, const char *name, const char *type, const char *text);

/* The global stage of the jobs that have one (issue 17), from their
 * views: esd_job_phase{phase} 1 and esd_job_global_stage{state} 1, the
 * state of the pseudo-shard _global. Nothing (not even the help) while no
 * job has a global stage. */
static void
global_metrics(struct buf *b)
{
    bool any = false;

    for (struct job *j = jobs_first(); j && !any; j = j->next) {
        const struct status_view *v = jobview_get(j);

        any = v && v->global;
    }
    if (!any)
        return;
    help(b, "esd_job_phase", "gauge",
         "1 for the phase of each job with a global stage: shards, merging, global, "
         "final merge, complete or failed");
    for (struct job *j = jobs_first(); j; j = j->next) {
        const struct status_view *v = jobview_get(j);

        if (!v || !v->global)
            continue;
        job_label(b, "esd_job_phase", j);
        buf_puts(b, ",phase=");
        label(b, status_phase_name[v->global->phase]);
        buf_puts(b, "} 1\n");
    }
    help(b, "esd_job_global_stage", "gauge",
         "1 for the state of each job's global stage (its pseudo-shard _global): pending, "
         "running, stale, done or failed");
    for (struct job *j = jobs_first(); j; j = j->next) {
        const struct status_view *v = jobview_get(j);

        if (!v || !v->global)
            continue;
        job_label(b, "esd_job_global_stage", j);
        buf_puts(b, ",state=");
        label(b, status_state_name[v->global->s.state]);
        buf_puts(b, "} 1\n");
    }
}

static void
help(struct buf *b, const char *name, const char *type, const char *text)
{
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

char *
metrics_render(void)
{
    struct buf b;
    const char *node = M.conf && M.conf->node_name ? M.conf->node_name : "";
    unsigned long long cum = 0;

    buf_init(&b);
    help(&b, "esd_info", "gauge", "esd's version and node name (always 1)");
    buf_puts(&b, "esd_info{version=");
    label(&b, ESD_VERSION);
    buf_puts(&b, ",node=");
    label(&b, node);
    buf_puts(&b, "} 1\n");
    help(&b, "esd_start_time_seconds", "gauge", "when esd started (Unix time)");
    buf_printf(&b, "esd_start_time_seconds %.0f\n", M.started);
    help(&b, "esd_slots", "gauge", "attempts this node runs at once");
    buf_printf(&b, "esd_slots %ld\n", M.conf ? M.conf->slots : 0L);
    help(&b, "esd_attempts_running", "gauge", "attempts running on this node");
    buf_printf(&b, "esd_attempts_running %zu\n", M.running);

    help(&b, "esd_job_info", "gauge",
         "1 for each job registered and loaded on this node: its key (esd_job), id and "
         "directory");
    for (struct job *j = jobs_first(); j; j = j->next) {
        if (!j->loaded)
            continue;
        job_label(&b, "esd_job_info", j);
        buf_puts(&b, ",job_id=");
        label(&b, j->m.job_id);
        buf_puts(&b, ",job_dir=");
        label(&b, j->job_dir);
        buf_puts(&b, "} 1\n");
    }
    help(&b, "esd_job_shards", "gauge",
         "shards of each job by state, read from its job directory (the same on every node; "
         "remaining: neither done nor failed)");
    for (struct job *j = jobs_first(); j; j = j->next) {
        const struct status_view *v = jobview_get(j);
        size_t done, total, failed = j->loaded ? j->claimer.nfailed : 0;
        const char *st[] = { "done", "failed", "remaining", "running", "stale", "pending" };
        size_t val[6];
        int n = 3;

        /* The job's view when there is one (all six states); else the
         * claimer's counts, three states only. */
        jobs_progress(j, &done, &total);
        if (v) {
            done = v->counts[ST_DONE];
            failed = v->counts[ST_FAILED];
            val[3] = v->counts[ST_RUNNING];
            val[4] = v->counts[ST_STALE];
            val[5] = v->counts[ST_PENDING];
            n = 6;
        }
        val[0] = done;
        val[1] = failed;
        /* sizes are unsigned: should done and failed ever overlap, the
         * difference must not wrap to a huge count */
        val[2] = total >= done + failed ? total - done - failed : 0;
        for (int k = 0; k < n; k++) {
            job_label(&b, "esd_job_shards", j);
            buf_puts(&b, ",state=");
            label(&b, st[k]);
            buf_printf(&b, "} %zu\n", val[k]);
        }
    }
    help(&b, "esd_job_status_age_seconds", "gauge",
         "age of the reading of each job's directory that esd_job_shards shows");
    for (struct job *j = jobs_first(); j; j = j->next) {
        const struct status_view *v = jobview_get(j);

        if (!v)
            continue;
        job_label(&b, "esd_job_status_age_seconds", j);
        buf_printf(&b, "} %.1f\n", jobview_age(v));
    }
    help(&b, "esd_job_eta_seconds", "gauge",
         "estimated time to each active job's last shard, from its done records' durations");
    for (struct job *j = jobs_first(); j; j = j->next) {
        const struct status_view *v = jobview_get(j);
        double rate, eta;

        if (!v || (j->state != JOB_ACTIVE && j->state != JOB_DRAINING))
            continue;
        status_view_pace(v, &rate, &eta);
        if (eta < 0)
            continue;
        job_label(&b, "esd_job_eta_seconds", j);
        buf_printf(&b, "} %.0f\n", eta);
    }
    global_metrics(&b);
    help(&b, "esd_job_state", "gauge", "1 for each job's state on this node");
    for (struct job *j = jobs_first(); j; j = j->next) {
        job_label(&b, "esd_job_state", j);
        buf_puts(&b, ",state=");
        label(&b, job_state_name[j->state]);
        buf_puts(&b, "} 1\n");
    }
    help(&b, "esd_job_shards_done_here_total", "counter", "shards of each job done by this node");
    for (struct job *j = jobs_first(); j; j = j->next) {
        job_label(&b, "esd_job_shards_done_here_total", j);
        buf_printf(&b, "} %lu\n", j->done_here);
    }
    help(&b, "esd_job_rows_done_here_total", "counter",
         "output rows of each job done by this node");
    for (struct job *j = jobs_first(); j; j = j->next) {
        job_label(&b, "esd_job_rows_done_here_total", j);
        buf_printf(&b, "} %llu\n", j->rows_here);
    }
    help(&b, "esd_job_attempts_failed_total", "counter",
         "failed attempts of each job on this node, by failure class");
    for (struct job *j = jobs_first(); j; j = j->next)
        for (size_t i = 0; i < NCLASSES; i++) {
            job_label(&b, "esd_job_attempts_failed_total", j);
            buf_printf(&b, ",class=\"%s\"} %lu\n", classes[i], j->failed_by_class[i]);
        }

    help(&b, "esd_rows_done_total", "counter", "output rows of the attempts done by this node");
    buf_printf(&b, "esd_rows_done_total %llu\n", M.rows);
    help(&b, "esd_bytes_done_total", "counter", "output bytes of the attempts done by this node");
    buf_printf(&b, "esd_bytes_done_total %llu\n", M.bytes);
    help(&b, "esd_attempts_total", "counter", "attempts ended on this node, by outcome");
    buf_printf(&b, "esd_attempts_total{outcome=\"done\"} %llu\n", M.attempts_done);
    buf_printf(&b, "esd_attempts_total{outcome=\"failed\"} %llu\n", M.attempts_failed);
    buf_printf(&b, "esd_attempts_total{outcome=\"released\"} %llu\n", M.attempts_released);
    buf_printf(&b, "esd_attempts_total{outcome=\"other\"} %llu\n", M.attempts_other);
    help(&b, "esd_attempt_failures_total", "counter", "failed attempts on this node, by class");
    for (size_t i = 0; i < NCLASSES; i++)
        buf_printf(&b, "esd_attempt_failures_total{class=\"%s\"} %llu\n", classes[i],
                   M.failures[i]);
    help(&b, "esd_attempt_duration_seconds", "histogram", "wall time of attempts on this node");
    for (size_t i = 0; i <= NBUCKETS; i++) {
        cum += M.hist[i];
        if (i < NBUCKETS)
            buf_printf(&b, "esd_attempt_duration_seconds_bucket{le=\"%g\"} %llu\n", buckets[i],
                       cum);
        else
            buf_printf(&b, "esd_attempt_duration_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
    }
    buf_printf(&b, "esd_attempt_duration_seconds_sum %.3f\n", M.hist_sum);
    buf_printf(&b, "esd_attempt_duration_seconds_count %llu\n", M.hist_count);
    help(&b, "esd_lease_takeovers_total", "counter",
         "claims of this node that took over a lock whose lease had run out");
    buf_printf(&b, "esd_lease_takeovers_total %llu\n", M.takeovers);
    help(&b, "esd_ray_head_restarts_total", "counter", "restarts of the node-local Ray head");
    buf_printf(&b, "esd_ray_head_restarts_total %lu\n", (unsigned long)ray_restarts());
    help(&b, "esd_ray_head_up", "gauge", "1 while the Ray head is up (or not needed)");
    buf_printf(&b, "esd_ray_head_up %d\n", ray_ready() ? 1 : 0);
    return buf_steal(&b);
}

static void
write_now(void)
{
    const char *path = M.conf ? M.conf->metrics_path : NULL;
    struct esd_err err;
    char *text;
    int r;

    if (!path || !*path)
        return;
    /* Replaced atomically: the collector never reads half a file, and the
     * temporary name (".<name>.<hex>.tmp") does not end in ".prom", so it
     * is never collected either. */
    text = metrics_render();
    r = fs_write_atomic(path, text, strlen(text), 0644, &err);
    free(text);
    if (r < 0) {
        /* said once per path, not every few seconds */
        if (!M.failed_path || strcmp(M.failed_path, path)) {
            log_warning(NULL, "metrics: cannot write %s (%s); trying again every %ld s", path,
                        err.msg, M.conf->metrics_interval_secs);
            free(M.failed_path);
            M.failed_path = xstrdup(path);
        }
        return;
    }
    if (M.failed_path) {
        log_notice(NULL, "metrics: writing %s again", path);
        free(M.failed_path);
        M.failed_path = NULL;
    }
}

static void
write_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    write_now();
}

static void
arm(void)
{
    /* a write at once, then every interval: a new path or interval
     * (SIGHUP) shows without waiting out the old one */
    ev_timer_stop(M.loop, &M.write_w);
    if (M.conf->metrics_path && *M.conf->metrics_path) {
        ev_timer_set(&M.write_w, 0.0, (double)M.conf->metrics_interval_secs);
        ev_timer_start(M.loop, &M.write_w);
    }
}

void
metrics_init(struct ev_loop *loop, const struct esd_conf *c)
{
    M.loop = loop;
    M.conf = c;
    {
        char now[40];

        time_iso_now(now, &M.started);
    }
    ev_init(&M.write_w, write_cb);
    arm();
}

void
metrics_reconfigure(const struct esd_conf *c)
{
    M.conf = c;
    arm();
}

void
metrics_fini(void)
{
    if (!M.loop)
        return;
    /* the last figures, then the timer goes */
    write_now();
    ev_timer_stop(M.loop, &M.write_w);
    free(M.failed_path);
    M.failed_path = NULL;
}
