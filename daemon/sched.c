/*
 * sched: slots, the round robin over jobs, the poll and rescan timers, the
 * end of jobs and the drain.
 */
#include "sched.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "finalize.h"
#include "fsutil.h"
#include "jobs.h"
#include "jobview.h"
#include "json.h"
#include "log.h"
#include "msgid.h"
#include "metrics.h"
#include "nodes.h"
#include "notify.h"
#include "proto.h"
#include "ray.h"
#include "runner.h"
#include "warm.h"

/* Attempts of one job failed in a row on this node before it pauses its
 * claims of that job, and the longest pause: a node where everything fails
 * (a processor that cannot start, a broken disk) must not burn the retry
 * budgets of the whole fleet's shards in seconds. Per job, so that one
 * owner's failing attempts pause nobody else's work. */
#define FAIL_STREAK 3
/* Claim-ahead: a busy slot's next shard is claimed this long before the
 * slot's attempt is expected to end (this node's mean for its job), time
 * enough for Data-Juicer to read its configuration, connect to Ray and
 * have Ray start its workers and import Data-Juicer in them, on a loaded
 * node too (5-10 s on a busy 2-core machine), and to spare when the mean
 * still counts a first attempt's cold workers. */
#define CLAIM_AHEAD_LEAD 30.0
#define PAUSE_MAX 60.0

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    ev_timer kick_w;   /* "fill now", coalesced */
    ev_timer poll_w;   /* the next claim pass */
    ev_timer rescan_w; /* the registry */
    ev_timer drain_w;  /* drain_timeout_secs */
    struct job *rr;    /* the job that got the last claim */
    bool draining;     /* SIGTERM: stopping */
    bool held;         /* esctl drain: no new claims until resume */
    char *held_path;   /* <state_dir>/drained: the hold survives restarts */
    void (*drained)(void);
    double started;
    unsigned long claims;
    bool (*complete)(struct job *j); /* esd run's hooks (sched_set_hooks) */
    bool (*may_claim)(struct job *j);
} S;

/* ±20 %, so that a fleet does not poll in step. */
static double
jitter(double secs)
{
    return secs * (0.8 + 0.4 * ((double)random() / (double)RAND_MAX));
}

static void status_line(void);
static char *failed_reason_as_owner(struct job *j);

/* The error of the first terminally failed shard of j, read as its owner
 * (a record may be a link to a file only root may read). */
static char *
failed_reason(struct job *j)
{
    struct fsid prev = jobs_fs_owner(j);
    char *why = failed_reason_as_owner(j);

    jobs_fs_restore(prev);
    return why;
}

static char *
failed_reason_as_owner(struct job *j)
{
    const struct manifest *m = jobs_manifest(j);

    for (size_t i = 0; i < m->nshards; i++) {
        char *path = manifest_state_path(m, "failed", m->shards[i].id, ".json");
        cJSON *o = NULL;
        struct stat st;

        if (lstat(path, &st) == 0 && json_load_object(path, 1 << 20, &o, NULL) == 0) {
            const char *e = json_get_str(o, "last_error");
            char *why = xasprintf("%s%s failed: %s", j->gstage ? "the global stage" : "shard ",
                                  j->gstage ? "" : m->shards[i].id,
                                  e                           ? e
                                  : json_get_str(o, "reason") ? json_get_str(o, "reason")
                                                              : "no error recorded");
            cJSON_Delete(o);
            free(path);
            return why;
        }
        free(path);
    }
    return xstrdup(j->gstage ? "the global stage failed" : "a shard failed");
}

void
sched_forget_job(const struct job *j)
{
    if (S.rr == j)
        S.rr = NULL;
}

/* The next job after S.rr that may be asked for a claim now. Starting
 * after the job that got the last claim, not at the first job, is what
 * makes the slots go round: a big job listed first cannot take every slot
 * while a later one waits. */
static struct job *
next_job(double now)
{
    struct job *start = S.rr && S.rr->next ? S.rr->next : jobs_first(), *j = start;

    if (!j)
        return NULL;
    do {
        if (j->state == JOB_ACTIVE && j->next_claim <= now && j->paused_until <= now) {
            if (S.may_claim && !S.may_claim(j)) {
                /* esd run's strict cap or walltime: not from this node now */
                j->next_claim = now + jitter((double)S.conf->poll_interval_secs);
            } else if (jobs_load(j))
                return j;
            /* not workable here (logged once): look again at the next poll */
            j->next_claim = now + jitter((double)S.conf->poll_interval_secs);
        }
        j = j->next ? j->next : jobs_first();
    } while (j != start);
    return NULL;
}

/* One job's answer to a pass that claimed nothing. */
static void
job_idle(struct job *j, double now)
{
    double wait = (double)S.conf->poll_interval_secs;

    if (j->idle.complete) {
        if (!S.complete || !S.complete(j))
            finalize_start(j);
        return;
    }
    /* every shard done or failed, at least one failed: nothing any node
     * can do without esctl retry (spec §8.2 step 4: the reference's
     * worker exits 2 here) */
    if (j->idle.terminal) {
        char *why = failed_reason(j);

        jobs_set_state(j, JOB_FAILED, why);
        free(why);
        return;
    }
    if (j->idle.more) {
        /* The pass stopped at its budget: resume after one turn of the
         * loop, so that the control socket is answered in between. */
        j->next_claim = now + 0.001;
        return;
    }
    /* wake when a lock seen fresh could have run out, if that is sooner,
     * but not before the claimer's idle rate allows; the 50 ms land the
     * look just after the lease's end rather than just before it. The
     * idle rate bounds what idle nodes cost the file server (spec §16.4:
     * the reference's idle workers stat every shard every poll). */
    if (j->idle.next_secs >= 0 && j->idle.next_secs + 0.05 < wait)
        wait = j->idle.next_secs + 0.05;
    wait = jitter(wait);
    if (wait < j->idle.min_secs)
        wait = fmin(j->idle.min_secs, (double)S.conf->poll_interval_secs);
    j->next_claim = now + wait;
}

static void
fill(void)
{
    double now = time_mono(), next = INFINITY;

    for (;;) {
        struct job *j;
        struct claim cl;
        struct esd_err err;
        bool ahead = false;
        int r;

        /* No claims while the Ray head is down: the attempt would fail at
         * once as an infrastructure failure, and its lock would keep other
         * nodes, whose head is up, from the shard meanwhile. */
        if (S.draining || S.held || !ray_ready())
            break;
        /* a free slot, or (claim-ahead) a busy one about to end: its next
         * shard is claimed, read and connected to Ray before it does */
        if (runner_busy() + runner_gated() >= (size_t)S.conf->slots) {
            if (!S.conf->claim_ahead || runner_gated() >= (size_t)S.conf->slots ||
                runner_ahead_in(CLAIM_AHEAD_LEAD) > 0)
                break;
            ahead = true;
        }
        if (!(j = next_job(now)) || (ahead && !runner_can_start_ahead(j)))
            break;
        /* as the job's owner: the lock and attempt directory are its files */
        struct fsid prev = jobs_fs_owner(j);
        r = claim_acquire(jobs_claimer(j), &cl, &j->idle, &err);
        jobs_fs_restore(prev);
        /* an I/O error is the storage's, not the job's: the job stays
         * active and this node looks again at its next poll */
        if (r < 0) {
            log_warning(&(struct log_ctx){ .job = &j->log }, "%s; trying again later", err.msg);
            j->next_claim = now + jitter((double)S.conf->poll_interval_secs);
            continue;
        }
        if (r == 0) {
            j->idle_valid = true;
            if (j->idle.cancelled) {
                /* the marker of esctl cancel --everywhere: stop at once */
                j->next_claim = now + jitter((double)S.conf->poll_interval_secs);
                sched_check_cancelled();
                continue;
            }
            job_idle(j, now);
            continue;
        }
        S.rr = j;
        S.claims++;
        if (cl.took_over)
            metrics_takeover();
        if (cl.took_over)
            log_event(LOG_LVL_NOTICE,
                      &(struct log_ctx){
                          .job = &j->log, .shard = cl.shard_id, .attempt = cl.attempt_number },
                      MSGID_TAKEN_OVER,
                      "claimed (attempt %lld), taken over from node %s whose lease ran out",
                      cl.attempt_number, cl.taken_from);
        else
            log_event(LOG_LVL_INFO,
                      &(struct log_ctx){
                          .job = &j->log, .shard = cl.shard_id, .attempt = cl.attempt_number },
                      MSGID_CLAIMED, "claimed (attempt %lld)", cl.attempt_number);
        if (ahead)
            runner_start_ahead(j, &cl);
        else
            runner_start(j, &cl);
    }
    /* sleep until the earliest job may have something */
    for (struct job *j = jobs_first(); j; j = j->next)
        if (j->state == JOB_ACTIVE) {
            double at = j->next_claim > j->paused_until ? j->next_claim : j->paused_until;

            if (at < next)
                next = at;
        }
    /* claim-ahead: when a busy attempt may be about to end */
    if (S.conf->claim_ahead && runner_gated() < (size_t)S.conf->slots &&
        runner_busy() + runner_gated() >= (size_t)S.conf->slots) {
        double in = runner_ahead_in(CLAIM_AHEAD_LEAD);

        if (isfinite(in) && now + in < next)
            next = now + in;
    }
    ev_timer_stop(S.loop, &S.poll_w);
    /* (a job already due, while every slot is busy, say: 50 ms keeps it
     * from spinning the loop; a freed slot kicks at once anyway) */
    if (!S.draining && !S.held && isfinite(next)) {
        ev_timer_set(&S.poll_w, next > now ? next - now : 0.05, 0);
        ev_timer_start(S.loop, &S.poll_w);
    }
    status_line();
}

static void
sched_kick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    fill();
}

/* Asks for a fill from the loop, not now: callers are in the middle of
 * changing a job or a run (runner_set_freed calls it from a run's end),
 * and many kicks in one turn of the loop make one fill. */
void
sched_kick(void)
{
    if (!ev_is_active(&S.kick_w)) {
        ev_timer_set(&S.kick_w, 0, 0);
        ev_timer_start(S.loop, &S.kick_w);
    }
}

static void
sched_poll_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    fill();
}

static void
sched_rescan_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)revents;
    jobs_rescan();
    sched_check_cancelled();
    w->repeat = jitter((double)S.conf->poll_interval_secs);
    ev_timer_again(loop, w);
    sched_kick();
}

void
sched_check_cancelled(void)
{
    for (struct job *j = jobs_first(); j; j = j->next) {
        if (j->state != JOB_ACTIVE && j->state != JOB_DRAINING)
            continue;
        if (!jobs_cancelled_everywhere(j))
            continue;
        j->cancelled_everywhere = true;
        jobs_set_state(j, JOB_CANCELLED, "cancelled on every node (esctl cancel --everywhere)");
        if (j->running) {
            log_notice(&(struct log_ctx){ .job = &j->log },
                       "stopping %zu attempt(s) of the cancelled job; their claims are released",
                       j->running);
            runner_stop_job(j);
        }
    }
}

/* The hold is the file's existence, in the state directory: an esctl drain
 * before maintenance still holds after the reboot that maintenance needs. */
static void
write_held(bool held)
{
    struct esd_err err;
    int fd;

    if (!held) {
        if (unlink(S.held_path) < 0 && errno != ENOENT)
            log_warning(NULL, "cannot remove %s: %s; esd will start drained", S.held_path,
                        strerror(errno));
        return;
    }
    fd = open(S.held_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        err_sys(&err, -errno, "cannot create %s", S.held_path);
        log_warning(NULL, "%s; the drain is not kept across a restart", err.msg);
        return;
    }
    close(fd);
}

void
sched_hold(bool release)
{
    if (!S.held)
        log_notice(NULL, "drained by the operator: no new claims; %zu attempt(s) %s",
                   runner_count(), release ? "stopped and released" : "finish");
    S.held = true;
    write_held(true);
    ev_timer_stop(S.loop, &S.poll_w);
    if (release)
        runner_stop_all();
    else
        runner_stop_gated(); /* (claimed ahead: not started yet) */
    status_line();
    nodes_kick();
}

void
sched_resume(void)
{
    if (S.held)
        log_notice(NULL, "resumed by the operator: claiming again");
    S.held = false;
    write_held(false);
    sched_kick();
    nodes_kick();
}

bool
sched_held(void)
{
    return S.held;
}

/* Drained once no attempt and no merge runs: both end by releasing their
 * locks (or recording their result), so the node leaves nothing that other
 * nodes would have to wait a lease for. */
static void
check_drained(void)
{
    if (S.draining && S.drained && runner_count() == 0 && finalize_running() == 0) {
        void (*cb)(void) = S.drained;

        ev_timer_stop(S.loop, &S.drain_w);
        S.drained = NULL;
        cb();
    }
}

static void
attempt_done(struct job *j, const struct attempt_final *fin)
{
    if (fin->counted && !fin->shard_done && !fin->shard_failed && !fin->shard_left && j->loaded &&
        fin->index < jobs_manifest(j)->nshards) {
        double d = claim_backoff(jobs_claimer(j), fin->index);

        log_info(
            &(struct log_ctx){ .job = &j->log, .shard = jobs_manifest(j)->shards[fin->index].id },
            "not claimed again on this node for %.1f s (retries back off)", d);
    }
    if (!strcmp(fin->status, "done")) {
        j->fail_streak = 0;
    } else if (!strcmp(fin->status, "failed") && ++j->fail_streak >= FAIL_STREAK) {
        /* 1 s doubling; k is capped before the shift so a long streak
         * cannot overflow it */
        unsigned k = j->fail_streak - FAIL_STREAK;
        double pause = k >= 6 ? PAUSE_MAX : (double)(1u << k);

        if (pause > PAUSE_MAX)
            pause = PAUSE_MAX;
        j->paused_until = time_mono() + pause;
        log_warning(&(struct log_ctx){ .job = &j->log },
                    "%u attempts of job %s in a row "
                    "failed on this node: no claims of it for %.0f s",
                    j->fail_streak, j->job_dir, pause);
    }
    /* a slot is free: claim again at once (this job first if it has more) */
    j->next_claim = 0;
    status_line();
    nodes_kick();
    check_drained();
    sched_kick();
}

static void
job_finalized(struct job *j)
{
    (void)j;
    status_line();
    nodes_kick();
    check_drained();
    sched_kick();
}

static void
ray_changed(void)
{
    if (ray_ready())
        log_info(NULL, "claims resume: the Ray head is %s", ray_state_name());
    else if (!S.draining) /* (stopping it is the drain's last step) */
        log_warning(NULL, "no new claims while the Ray head is %s", ray_state_name());
    sched_kick();
}

static void
sched_drain_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    log_notice(NULL,
               "drain timeout: stopping %zu attempt(s), releasing their claims, and "
               "%zu merge(s)",
               runner_count(), finalize_running());
    runner_stop_all();
    finalize_stop_all();
}

void
sched_drain(void (*drained)(void))
{
    S.draining = true;
    S.drained = drained;
    ev_timer_stop(S.loop, &S.poll_w);
    runner_stop_gated(); /* (claimed ahead: not started yet) */
    log_notice(NULL, "draining: no new claims; %zu attempt(s) and %zu merge(s) running",
               runner_count(), finalize_running());
    if (runner_count() || finalize_running()) {
        if (S.conf->drain_timeout_secs > 0) {
            ev_timer_set(&S.drain_w, (double)S.conf->drain_timeout_secs, 0);
            ev_timer_start(S.loop, &S.drain_w);
        } else {
            runner_stop_all();
            finalize_stop_all();
        }
    }
    status_line();
    nodes_kick();
    check_drained();
}

void
sched_init(struct ev_loop *loop, const struct esd_conf *c)
{
    struct stat st;

    S.loop = loop;
    S.conf = c;
    S.started = time_mono();
    S.held_path = fs_join(c->state_dir, "drained");
    if (stat(S.held_path, &st) == 0) {
        S.held = true;
        log_notice(NULL, "drained (%s exists): no claims until esctl resume", S.held_path);
    }
    /* per process and time, so that nodes started together by one
     * scheduler do not jitter alike */
    srandom((unsigned)getpid() ^ (unsigned)time(NULL));
    ev_timer_init(&S.kick_w, sched_kick_cb, 0, 0);
    ev_timer_init(&S.poll_w, sched_poll_cb, 0, 0);
    ev_timer_init(&S.drain_w, sched_drain_cb, 0, 0);
    ev_init(&S.rescan_w, sched_rescan_cb);
    S.rescan_w.repeat = jitter((double)c->poll_interval_secs);
    ev_timer_again(loop, &S.rescan_w);
    jobs_set_changed(sched_kick);
    jobs_set_removed(sched_forget_job);
    jobview_set_refreshed(sched_status_refresh);
    nodes_set_status(sched_status_json);
    runner_set_done(attempt_done);
    runner_set_freed(sched_kick);
    warm_set_ready_cb(sched_kick);
    finalize_set_done(job_finalized);
    ray_set_listener(ray_changed);
    sched_kick();
}

void
sched_set_hooks(bool (*complete)(struct job *j), bool (*may_claim)(struct job *j))
{
    S.complete = complete;
    S.may_claim = may_claim;
}

void
sched_reconfigure(const struct esd_conf *c)
{
    S.conf = c;
    S.rescan_w.repeat = jitter((double)c->poll_interval_secs);
    ev_timer_again(S.loop, &S.rescan_w);
    sched_kick();
}

void
sched_fini(void)
{
    ev_timer_stop(S.loop, &S.kick_w);
    ev_timer_stop(S.loop, &S.poll_w);
    ev_timer_stop(S.loop, &S.rescan_w);
    ev_timer_stop(S.loop, &S.drain_w);
    free(S.held_path);
    S.held_path = NULL;
}

/* systemd's STATUS=: "1/2 slots busy; job a 340/1024 done; ray up". */
static void
status_line(void)
{
    struct buf b;
    size_t shown = 0;

    buf_init(&b);
    /* (a slot is busy while its processor runs: not while what it made is
     * validated and published beside the next) */
    buf_printf(&b, "%s%zu/%ld slots busy",
               S.draining ? "draining; "
               : S.held   ? "drained by the operator; "
                          : "",
               runner_busy(), S.conf->slots);
    for (struct job *j = jobs_first(); j; j = j->next) {
        size_t done, total;

        if (j->state != JOB_ACTIVE && j->state != JOB_FINALIZING)
            continue;
        /* STATUS= is one line of systemctl status: three jobs at most */
        if (shown++ == 3) {
            buf_puts(&b, ", ...");
            break;
        }
        jobs_progress(j, &done, &total);
        if (!j->loaded) {
            /* (its manifest, and so its id and size, not read yet; the name
             * escaped: a newline would start another assignment of sd_notify) */
            char *name = str_escape_dup(fs_basename(j->job_dir));

            buf_printf(&b, "%s job %s %s", shown == 1 ? ";" : ",", name,
                       j->load ? "loading" : "not loaded");
            free(name);
            continue;
        }
        /* the job directory's counts (jobview.h), the same on every node */
        const struct status_view *v = jobview_get(j);
        char age[48] = "";

        /* (what this node knows is never older: a job shorter than a
         * reading shows its end, not the reading's start) */
        if (v && v->counts[ST_DONE] >= done) {
            done = v->counts[ST_DONE];
            jobview_age_text(v, age);
        }
        buf_printf(&b, "%s job %s %zu/%zu done", shown == 1 ? ";" : ",", j->m.job_id, done, total);
        if (v && v->counts[ST_FAILED])
            buf_printf(&b, ", %zu failed", v->counts[ST_FAILED]);
        if (v && v->counts[ST_RUNNING])
            buf_printf(&b, ", %zu running", v->counts[ST_RUNNING]);
        buf_printf(&b, "%s%s", age,
                   j->state == JOB_FINALIZING ? " (merging)"
                   : j->gstage                ? " (global stage)"
                                              : "");
    }
    if (!shown)
        buf_puts(&b, "; no active job");
    for (struct job *j = jobs_first(); j; j = j->next)
        if (j->paused_until > time_mono()) {
            buf_puts(&b, "; claims of a job paused after failures in a row");
            break;
        }
    buf_printf(&b, "; ray %s", ray_state_name());
    notify_status("%s", b.p);
    buf_free(&b);
}

void
sched_status_refresh(void)
{
    if (S.conf)
        status_line();
}

cJSON *
sched_status_json(void)
{
    cJSON *o = cJSON_CreateObject(), *ray = cJSON_AddObjectToObject(o, "ray");
    const char *addr = ray_address();

    json_add_str(o, "version", ESD_VERSION);
    json_add_str(o, "node", S.conf->node_name);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "state", S.draining ? "draining" : S.held ? "drained" : "running");
    json_add_bool(o, "held", S.held);
    json_add_int(o, "merging", (long long)finalize_running());
    json_add_float(o, "uptime_secs", time_mono() - S.started);
    json_add_int(o, "slots", S.conf->slots);
    json_add_int(o, "busy", (long long)runner_busy());
    json_add_int(o, "ahead", (long long)runner_gated());
    /* every attempt in flight: busy, claimed ahead or finishing */
    json_add_int(o, "attempts", (long long)runner_count());
    json_add_int(o, "claims", (long long)S.claims);
    json_add_str(ray, "state", ray_state_name());
    if (addr)
        json_add_str(ray, "address", addr);
    json_add_int(ray, "restarts", (long long)ray_restarts());
    cJSON_AddItemToObject(o, "jobs", jobview_jobs_json());
    cJSON_AddItemToObject(o, "attempts", runner_status_json());
    return o;
}
