/*
 * jobview: the job views of every loaded job (jobview.h).
 */
#include "jobview.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "log.h"
#include "util.h"

#define STEP_BUDGET 4096      /* units of status_view_step a loop turn */
#define SYNC_SECS 0.05        /* spent on a status request's reading */
#define SYNC_BEHIND_SECS 0.08 /* ... when this node knows more than the reading */
#define TICK_SECS 1.0

struct view {
    struct view *next;
    char key[17];
    const struct job *job; /* identity check: the registry may replace it */
    struct status_view v;
    double read_mono;          /* monotonic start of the last complete reading */
    double start_mono;         /* of the one in progress */
    bool busy;                 /* a reading is in progress */
    bool want;                 /* read again at once */
    bool failed_said;          /* its last failure was logged */
    enum job_state read_state; /* the job's state when its last reading started */
};

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    ev_timer tick_w;
    ev_idle work_w;
    struct view *head;
    void (*refreshed)(void); /* told when a reading changed (the status line) */
} V;

static void
view_free(struct view *w)
{
    status_view_free(&w->v);
    free(w);
}

static struct view *
find_view(const struct job *j)
{
    for (struct view *w = V.head; w; w = w->next)
        if (w->job == j && !strcmp(w->key, j->key) && w->v.nshards == j->m.nshards)
            return w;
    return NULL;
}

static bool
terminal(const struct job *j)
{
    return j->state == JOB_COMPLETE || j->state == JOB_FAILED || j->state == JOB_CANCELLED;
}

/* One bounded step of w's reading, as the job's owner; true when the
 * reading is over (complete or abandoned). */
static bool
step(struct view *w, struct job *j, size_t budget)
{
    struct fsid prev;
    struct esd_err err;
    int r;

    if (!w->busy) {
        w->busy = true;
        w->want = false;
        w->start_mono = time_mono();
        w->read_state = j->state;
    }
    err_clear(&err);
    prev = jobs_fs_owner(j);
    r = status_view_step(&w->v, &j->m, 0, budget, &err);
    jobs_fs_restore(prev);
    if (r == 0)
        return false;
    w->busy = false;
    if (r < 0) {
        if (!w->failed_said)
            log_warning(NULL, "job %s: cannot read its state (%s); trying again", j->m.job_id,
                        err.msg);
        w->failed_said = true;
        w->read_mono = w->start_mono; /* not again before the interval */
        return true;
    }
    w->failed_said = false;
    w->read_mono = w->start_mono;
    return true;
}

/* Does w need a reading now? */
static bool
due(const struct view *w, const struct job *j, double now)
{
    double every =
        V.conf && V.conf->poll_interval_secs > 0 ? (double)V.conf->poll_interval_secs : 20.0;

    if (w->busy || w->want)
        return true;
    if (!w->v.valid)
        return w->read_mono == 0 || now - w->read_mono >= every;
    if (j->state != w->read_state)
        return true; /* complete, failed, cancelled...: the counts now */
    if (terminal(j))
        return false; /* read once at its end: nothing changes any more */
    /* A node that waits (nothing of the job runs here) reads it a third as
     * often: its idle cost on the shared file system stays under one
     * operation a second; a status request still reads it at once. */
    if (!j->running)
        every *= 3;
    return now - w->read_mono >= every;
}

static void
work_cb(struct ev_loop *loop, ev_idle *iw, int revents)
{
    double now = time_mono();
    bool more = false, changed = false;

    for (struct job *j = jobs_first(); j; j = j->next) {
        struct view *w;

        double read = 0;

        if (!j->loaded || !(w = find_view(j)) || !due(w, j, now))
            continue;
        read = w->v.read_wall;
        if (!step(w, j, STEP_BUDGET))
            more = true;
        /* new counts once a reading's listings are over */
        if (w->v.read_wall != read)
            changed = true;
        break; /* one job's step a turn */
    }
    for (struct job *j = jobs_first(); !more && j; j = j->next) {
        struct view *w = j->loaded ? find_view(j) : NULL;

        if (w && due(w, j, now))
            more = true;
    }
    if (changed && V.refreshed)
        V.refreshed();
    if (!more)
        ev_idle_stop(loop, iw);
}

/* Views for the loaded jobs, none for the others; work started if due. */
static void
tick_cb(struct ev_loop *loop, ev_timer *tw, int revents)
{
    struct view **pp = &V.head;
    double now = time_mono();
    bool work = false, live = false;

    while (*pp) {
        struct view *w = *pp;
        struct job *j;

        for (j = jobs_first(); j && j != w->job; j = j->next)
            ;
        if (!j || !j->loaded || strcmp(j->key, w->key) || w->v.nshards != j->m.nshards) {
            *pp = w->next;
            view_free(w);
            continue;
        }
        pp = &w->next;
    }
    for (struct job *j = jobs_first(); j; j = j->next) {
        struct view *w;

        if (!j->loaded)
            continue;
        if (!(w = find_view(j))) {
            w = xcalloc(1, sizeof(*w));
            memcpy(w->key, j->key, sizeof(w->key));
            w->job = j;
            status_view_init(&w->v, &j->m);
            w->v.ino = j->ino;
            w->next = V.head;
            V.head = w;
        }
        if (due(w, j, now))
            work = true;
        if (!terminal(j) || j->state != w->read_state)
            live = true;
    }
    if (work && !ev_is_active(&V.work_w))
        ev_idle_start(loop, &V.work_w);
    /* Nothing can fall due by time (no job, or only jobs over and read at
     * their end): sleep until jobview_kick; an idle esd never wakes here. */
    if (!live)
        ev_timer_stop(loop, tw);
}

void
jobview_kick(void)
{
    if (V.loop && !ev_is_active(&V.tick_w)) {
        ev_timer_set(&V.tick_w, 0.0, TICK_SECS);
        ev_timer_start(V.loop, &V.tick_w);
    }
}

void
jobview_set_refreshed(void (*refreshed)(void))
{
    V.refreshed = refreshed;
}

void
jobview_init(struct ev_loop *loop, const struct esd_conf *c)
{
    V.loop = loop;
    V.conf = c;
    jobs_set_view_changed(jobview_kick);
    ev_timer_init(&V.tick_w, tick_cb, 0.0, TICK_SECS);
    ev_timer_start(loop, &V.tick_w);
    ev_idle_init(&V.work_w, work_cb);
}

void
jobview_reconfigure(const struct esd_conf *c)
{
    V.conf = c;
}

void
jobview_fini(void)
{
    if (!V.loop)
        return;
    ev_timer_stop(V.loop, &V.tick_w);
    ev_idle_stop(V.loop, &V.work_w);
    while (V.head) {
        struct view *w = V.head;

        V.head = w->next;
        view_free(w);
    }
    V.loop = NULL;
}

const struct status_view *
jobview_get(const struct job *j)
{
    struct view *w = j->loaded ? find_view(j) : NULL;

    return w && w->v.valid ? &w->v : NULL;
}

double
jobview_age(const struct status_view *v)
{
    struct timespec now;
    double wall;

    clock_gettime(CLOCK_REALTIME, &now);
    wall = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    return wall > v->read_wall ? wall - v->read_wall : 0;
}

void
jobview_age_text(const struct status_view *v, char out[48])
{
    double age = jobview_age(v);

    if (age < JOBVIEW_FRESH_SECS)
        out[0] = '\0';
    else
        snprintf(out, 48, " (as of %.0f s ago)", age);
}

cJSON *
jobview_status(struct job *j, bool all)
{
    struct view *w = j->loaded ? find_view(j) : NULL;
    double t0 = time_mono();
    size_t known, total;
    bool behind;

    if (!w)
        return NULL;
    /* (this node knows of more done shards than the reading: it is older
     * than what the request may show, whatever its age) */
    jobs_progress(j, &known, &total);
    behind = w->v.valid && known > w->v.counts[ST_DONE];
    /* a request wants the present: a short try at a new reading (one a
     * step at a time goes on in the background otherwise) */
    if (!w->v.valid || jobview_age(&w->v) >= JOBVIEW_FRESH_SECS || w->busy ||
        j->state != w->read_state || behind) {
        double limit = behind ? SYNC_BEHIND_SECS : SYNC_SECS;

        /* (a reading begun before this node's last publication may end
         * behind it still: then one more, within the limit) */
        while (time_mono() - t0 < limit)
            if (step(w, j, STEP_BUDGET) &&
                (!behind || !w->v.valid || known <= w->v.counts[ST_DONE]))
                break;
        if (w->busy && !ev_is_active(&V.work_w))
            ev_idle_start(V.loop, &V.work_w);
    }
    if (!w->v.valid)
        return NULL;
    return status_view_json(&w->v, &j->m, all);
}

cJSON *
jobview_jobs_json(void)
{
    cJSON *a = jobs_status_json(), *o;

    cJSON_ArrayForEach(o, a)
    {
        const char *key = json_get_str(o, "key");
        const struct status_view *v = NULL;
        struct job *j;
        double rate, eta;
        char when[40];

        for (j = jobs_first(); j && key && strcmp(j->key, key); j = j->next)
            ;
        if (j)
            v = jobview_get(j);
        if (!v) {
            json_set(o, "counts_from", cJSON_CreateString("node"));
            continue;
        }
        json_set(o, "counts_from", cJSON_CreateString("job_dir"));
        json_set(o, "done", json_int((long long)v->counts[ST_DONE]));
        json_set(o, "failed", json_int((long long)v->counts[ST_FAILED]));
        json_set(o, "running", json_int((long long)v->counts[ST_RUNNING]));
        json_set(o, "stale", json_int((long long)v->counts[ST_STALE]));
        json_set(o, "pending", json_int((long long)v->counts[ST_PENDING]));
        json_set(o, "rows_done", json_int(v->rows_done));
        if (v->global) {
            cJSON *g = cJSON_CreateObject();

            json_set(o, "phase", cJSON_CreateString(status_phase_name[v->global->phase]));
            json_add_str(g, "status", status_state_name[v->global->s.state]);
            if (v->global->s.node || v->global->s.owner)
                json_add_str(g, "node", v->global->s.node ? v->global->s.node : v->global->s.owner);
            if (v->global->s.has_age)
                json_add_float(g, "lock_age_secs", v->global->s.lock_age);
            json_set(o, "global", g);
        }
        {
            struct timespec ts = { .tv_sec = (time_t)v->read_wall };

            time_iso_format(&ts, when);
        }
        json_set(o, "read_at", cJSON_CreateString(when));
        json_set(o, "read_age_secs", json_float(jobview_age(v)));
        cJSON_DeleteItemFromObjectCaseSensitive(o, "shards_per_sec");
        cJSON_DeleteItemFromObjectCaseSensitive(o, "rows_per_sec");
        cJSON_DeleteItemFromObjectCaseSensitive(o, "eta_secs");
        status_view_pace(v, &rate, &eta);
        if (rate >= 0) {
            json_set(o, "shards_per_sec", json_float(rate));
            if (j->m.nshards)
                json_set(o, "rows_per_sec",
                         json_float(rate * (double)j->m.total_rows / (double)j->m.nshards));
        }
        if (eta >= 0 && (j->state == JOB_ACTIVE || j->state == JOB_DRAINING))
            json_set(o, "eta_secs", json_float(eta));
    }
    return a;
}
